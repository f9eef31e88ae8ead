/* The pass/fail tally of the tests that print `N passed, N failed` (the
 * C README test and the C++ tests): CHECK counts each check and says
 * where one failed. C and C++ alike. */
#ifndef DLOCK_TEST_TALLY_H
#define DLOCK_TEST_TALLY_H

#include <stdio.h>

static int passed, failed;

#define CHECK(cond)                                                \
  do {                                                             \
    if (cond) {                                                    \
      ++passed;                                                    \
    } else {                                                       \
      ++failed;                                                    \
      printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);       \
    }                                                              \
  } while (0)

#endif
