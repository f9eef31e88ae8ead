/* A child of ffi-c/tests/exit_etcd.rs: acquires NAME on etcd
 * (DLOCK_ENDPOINTS; TTL 3 s, keepalive every 1 s, timeout 500 ms), prints
 * `held TOKEN`, waits for a line on stdin, prints `exit NS` (CLOCK_MONOTONIC,
 * the start of its exit path), then leaves as MODE says while still
 * holding: `return` from main or `exit` from a function. It frees nothing
 * and never calls lk_shutdown: the handler dlock registered with atexit
 * deletes the key on the way out, so the parent's contender acquires at
 * once instead of a TTL later.
 *
 * Usage: exit_holding return|exit NAME */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dlock.h"

static unsigned long long mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void leave(void) {
  exit(0);
}

int main(int argc, char **argv) {
  if (argc != 3 || (strcmp(argv[1], "return") != 0 && strcmp(argv[1], "exit") != 0)) {
    fprintf(stderr, "usage: %s return|exit NAME\n", argv[0]);
    return 2;
  }
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.ttl_ms = 3000;
  o.keepalive_interval_ms = 1000;
  o.keepalive_timeout_ms = 500;
  o.retry_interval_ms = 250;
  o.margin_ms = 1000;
  struct lk_client *client;
  struct lk_lock *lock;
  uint64_t token = 0;
  if (lk_client_from_env(&o, &client) != LK_OK || lk_lock_new(client, argv[2], &lock) != LK_OK ||
      lk_lock_acquire(lock, 10000, &token) != LK_OK) {
    fprintf(stderr, "exit_holding: %s\n", lk_last_error());
    return 1;
  }
  printf("held %llu\n", (unsigned long long)token);
  fflush(stdout);
  char line[16];
  if (!fgets(line, sizeof line, stdin)) return 1;
  printf("exit %llu\n", mono_ns());
  fflush(stdout);
  if (strcmp(argv[1], "exit") == 0) leave();
  return 0;
}
