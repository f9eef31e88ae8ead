/* README.md's C worker loop as written (issue 32, item 9): the block
 * between the README markers is README.md's `## C` block, line for line
 * (core/tests/readme.rs holds them equal; its `#include <dlock.h>` is a
 * no-op there, the header being included above). Run on the embedded
 * backend 30 times, each fenced at its third unit (its lock key deleted,
 * the default reacquire): the loop stops as its comment says, no unit of
 * work under the new token, within 20 s (alarm). Prints
 * `c readme: N passed, N failed`; exits non-zero on a failure. */
#define _POSIX_C_SOURCE 200809L
#include <dlock.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "tally.h"

static uint64_t units[64];
static int n_units;
static int fences;
static int app;

static void die(const char *msg) {
  printf("FAIL: %s\n", msg ? msg : "(no message)");
  exit(1);
}

static void stop_everything(void *user_data, uint64_t token, uint64_t in_flight) {
  (void)token;
  (void)in_flight;
  if (user_data == &app) fences++;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* One unit of work; the third is fenced: an operator deletes the lock key
 * and the lock reacquires (the service's holder is then the new token). */
static void do_one_unit(uint64_t t) {
  if (n_units >= 50) die("the loop did not stop at the fence");
  units[n_units++] = t;
  if (n_units == 3) {
    struct lk_memory *memory;
    if (lk_memory_named("", &memory) != LK_OK) die(lk_last_error());
    if (lk_memory_delete_lock_key(memory, "orders") != LK_OK) die("delete_lock_key");
    for (int i = 0;; i++) {
      uint64_t holder = 0;
      if (lk_memory_holder(memory, "orders", &holder) == LK_OK && holder != t) break;
      if (i > 10000) die("no reacquisition after the fence");
      sleep_ms(1);
    }
    lk_memory_free(memory);
  }
}

static void commit(void) {}

static void readme(void) {
  /* README: begin (README.md, `## C`, the first ```c block) */
  #include <dlock.h>

  struct lk_client_options opts = LK_CLIENT_OPTIONS_INIT; /* endpoints NULL: embedded */
  struct lk_client *client;
  struct lk_lock *lock;
  uint64_t token;
  if (lk_client_new(&opts, &client) != LK_OK ||
      lk_lock_new(client, "orders", &lock) != LK_OK ||
      lk_set_on_fence(lock, stop_everything, &app) != LK_OK ||
      lk_lock_acquire(lock, 10000, &token) != LK_OK)
    die(lk_last_error());

  struct lk_permit permit = LK_PERMIT_INIT;
  while (lk_permit(lock, &permit) == LK_OK) {   /* LK_DRAINING, LK_FENCED, ...: stop */
    uint64_t t;
    lk_permit_token(&permit, &t);               /* every write carries t */
    if (t != token) {                           /* fenced and acquired again meanwhile: stop too */
      lk_permit_end(&permit);
      break;
    }
    do_one_unit(t);
    if (lk_permit_valid(&permit)) commit();     /* re-reads the clock */
    lk_permit_end(&permit);
  }
  lk_lock_free(lock);                           /* releases */
  lk_client_free(client);
  /* README: end */
}

int main(void) {
  alarm(20); /* the loop stops within the bound, or SIGALRM fails the run */
  for (int run = 0; run < 30; run++) {
    n_units = 0;
    fences = 0;
    readme();
    int same = 1;
    for (int i = 1; i < n_units; i++) same &= units[i] == units[0];
    if (n_units != 3 || !same) printf("run %d: %d units, first token %llu\n", run, n_units, (unsigned long long)units[0]);
    CHECK(n_units == 3); /* no unit after the fence */
    CHECK(same);         /* none under the new token */
    CHECK(fences == 1);  /* the fence handler ran, with &app */
  }
  printf("c readme: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
