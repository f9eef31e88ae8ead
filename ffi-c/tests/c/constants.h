/* The header's constants that scenarios/vectors/bad_input.json states too
 * (its "constants"): the C and C++ bad-input tests check them alike. */
#ifndef DLOCK_TEST_CONSTANTS_H
#define DLOCK_TEST_CONSTANTS_H

#include <stdio.h>

#include "dlock.h"
#include "json.h"

/* How many of the header's constants differ from the vector's `constants`
 * object (each one printed). */
static inline int constants_differ(const struct json *constants) {
  static const struct {
    const char *name;
    double value;
  } header[] = {
      {"MAX_NAME_LEN", LK_MAX_NAME_LEN},
      {"MAX_KEY_LEN", LK_MAX_KEY_LEN},
      {"DEFAULT_LOCK_SERIES", LK_DEFAULT_LOCK_SERIES},
      {"DEFAULT_MAX_OVERDUE_MS", LK_DEFAULT_MAX_OVERDUE_MS},
      {"RESIGN_GRACE_MS", LK_RESIGN_GRACE_MS},
      {"MAX_SEMAPHORE_LIMIT", LK_MAX_SEMAPHORE_LIMIT},
  };
  int differ = 0;
  for (size_t i = 0; i < sizeof header / sizeof header[0]; i++) {
    const struct json *v = json_get(constants, header[i].name);
    if (!v || v->kind != JSON_NUMBER || v->number != header[i].value) {
      fprintf(stderr, "FAIL constant %s: the header says %.0f, the vector %.0f\n", header[i].name,
              header[i].value, v ? v->number : -1.0);
      differ++;
    }
  }
  return differ;
}

#endif
