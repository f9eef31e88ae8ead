/* A minimal harness for the C tests: count failures, say where. */
#ifndef DLOCK_TEST_CHECK_H
#define DLOCK_TEST_CHECK_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dlock.h"

static int failures;

#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__,      \
              #cond);                                                       \
      failures++;                                                           \
    }                                                                       \
  } while (0)

/* `call` must return `want`; prints the status word and message if not. */
#define EXPECT(call, want)                                                  \
  do {                                                                      \
    enum lk_status got_ = (call);                                           \
    if (got_ != (want)) {                                                   \
      fprintf(stderr, "%s:%d: %s gave %s (%s), expected %s\n", __FILE__,    \
              __LINE__, #call, lk_status_name((int)got_), lk_last_error(),  \
              lk_status_name((int)(want)));                                 \
      failures++;                                                           \
    }                                                                       \
  } while (0)

#define OK(call) EXPECT(call, LK_OK)

/* The last error must mention `word`. */
#define MESSAGE_HAS(word)                                                   \
  do {                                                                      \
    if (!strstr(lk_last_error(), (word))) {                                 \
      fprintf(stderr, "%s:%d: last error \"%s\" lacks \"%s\"\n", __FILE__,  \
              __LINE__, lk_last_error(), (word));                           \
      failures++;                                                           \
    }                                                                       \
  } while (0)

/* dlock's clock: CLOCK_BOOTTIME, in ns. */
static inline uint64_t boot_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_BOOTTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static inline void sleep_ms(uint64_t ms) {
  struct timespec t = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&t, &t) != 0) {
  }
}

/* Short settings (the scenarios'): TTL 2 s, keepalive every 500 ms, timeout
 * 200 ms, retry every 200 ms, margin 500 ms. */
static inline struct lk_client_options short_options(void) {
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.ttl_ms = 2000;
  o.keepalive_interval_ms = 500;
  o.keepalive_timeout_ms = 200;
  o.retry_interval_ms = 200;
  o.margin_ms = 500;
  return o;
}

/* A client of the embedded service `mem` with the short settings and
 * `reacquire` as given: a link of its own (its own faults, its own lease). */
static inline struct lk_client *client_in(struct lk_memory *mem, bool reacquire) {
  struct lk_client_options o = short_options();
  o.memory = mem;
  o.reacquire = reacquire;
  struct lk_client *c = NULL;
  OK(lk_client_new(&o, &c));
  return c;
}

/* A new embedded service in `*mem` and a client of it with the short
 * settings: the set-up most tests start with. */
static inline struct lk_client *memory_client(struct lk_memory **mem) {
  OK(lk_memory_new(mem));
  return client_in(*mem, true);
}

/* The lock's state (LK_STATE_IDLE if asking fails, which is a failure). */
static inline enum lk_state state_of(const struct lk_lock *l) {
  enum lk_state st = LK_STATE_IDLE;
  OK(lk_lock_state(l, &st));
  return st;
}

static inline int finish(const char *name) {
  if (failures) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
    return 1;
  }
  printf("%s: ok\n", name);
  return 0;
}

#endif
