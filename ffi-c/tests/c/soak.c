// Soak of the C face (issue 23; scripts/soak.sh, docs/testing.md "Soak"),
// the same run as core/tests/soak.rs through the lk_ functions:
// DLOCK_SOAK_CYCLES acquire/release cycles (default 100,000), each on a lock
// of its own name (lk_lock_new, lk_lock_acquire, one permit,
// lk_lock_release, lk_lock_free), and DLOCK_SOAK_PERMITS permits (default
// 1,000,000) on one held lock; embedded, or etcd with DLOCK_ENDPOINTS set
// (lk_client_from_env). A tenth of each warms up, then ten slices, each
// followed by a sample of the RSS, open descriptors and threads. Exit 1
// unless the RSS stays under DLOCK_SOAK_RSS_MIB (default 4) above the
// warm-up's and the descriptors and threads equal the warm-up's. Prints
// one SOAK|... line first. Built without sanitizers (ASan's quarantine
// would be the RSS measured).
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dlock.h"

typedef struct {
  uint64_t rss_kib, fds, threads;
} sample_t;

static void die(const char *what, enum lk_status st) {
  fprintf(stderr, "soak.c: %s: %s (%s)\n", what, lk_status_name(st), lk_last_error());
  exit(1);
}

static uint64_t status_field(const char *name) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  uint64_t v = UINT64_MAX;
  size_t n = strlen(name);
  if (!f) {
    perror("/proc/self/status");
    exit(1);
  }
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, name, n) == 0) {
      v = strtoull(line + n, NULL, 10);
      break;
    }
  }
  fclose(f);
  if (v == UINT64_MAX) {
    fprintf(stderr, "soak.c: no %s in /proc/self/status\n", name);
    exit(1);
  }
  return v;
}

static sample_t sample(void) {
  sample_t s;
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  s.fds = 0;
  if (!d) {
    perror("/proc/self/fd");
    exit(1);
  }
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.') s.fds++;
  }
  closedir(d);
  s.fds--;  // the listing's own descriptor
  s.rss_kib = status_field("VmRSS:");
  s.threads = status_field("Threads:");
  return s;
}

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *v = getenv(name);
  char *end;
  uint64_t n;
  if (!v || !*v) return dflt;
  n = strtoull(v, &end, 10);
  if (*end) {
    fprintf(stderr, "soak.c: %s must be a whole number, got '%s'\n", name, v);
    exit(2);
  }
  return n;
}

static struct lk_client *client;
static struct lk_lock *held;
static uint64_t next_name;

static void on_fence(void *user, uint64_t token, uint64_t in_flight) {
  (void)user;
  (void)token;
  (void)in_flight;
}

static void run(uint64_t cycles, uint64_t permits) {
  char name[96];
  uint64_t i, token, ptoken;
  enum lk_status st;
  for (i = 0; i < cycles; i++) {
    struct lk_lock *lock = NULL;
    struct lk_permit p;
    snprintf(name, sizeof name, "soak/c/%ld/%" PRIu64, (long)getpid(), next_name++);
    if ((st = lk_lock_new(client, name, &lock)) != LK_OK) die("lk_lock_new", st);
    if ((st = lk_lock_acquire(lock, 10000, &token)) != LK_OK) die("lk_lock_acquire", st);
    if ((st = lk_permit(lock, &p)) != LK_OK) die("lk_permit", st);
    if ((st = lk_permit_token(&p, &ptoken)) != LK_OK || ptoken != token) die("lk_permit_token", st);
    lk_permit_end(&p);
    if ((st = lk_lock_release(lock)) != LK_OK) die("lk_lock_release", st);
    lk_lock_free(lock);
  }
  for (i = 0; i < permits; i++) {
    struct lk_permit p;
    if ((st = lk_permit(held, &p)) != LK_OK) die("lk_permit (held)", st);
    lk_permit_end(&p);
  }
}

int main(void) {
  uint64_t cycles = env_u64("DLOCK_SOAK_CYCLES", 100000) / 10;
  uint64_t permits = env_u64("DLOCK_SOAK_PERMITS", 1000000) / 10;
  uint64_t bound_mib = env_u64("DLOCK_SOAK_RSS_MIB", 4);
  const char *ep = getenv("DLOCK_ENDPOINTS");
  const char *backend = ep && *ep ? "etcd" : "memory";
  sample_t warm, s[10];
  uint64_t growth = 0, in_flight = 1;
  struct timespec t0, t1;
  enum lk_status st;
  int i, ok = 1;
  char name[64];

  if ((st = lk_client_from_env(NULL, &client)) != LK_OK) die("lk_client_from_env", st);
  snprintf(name, sizeof name, "soak/c/%ld/held", (long)getpid());
  if ((st = lk_lock_new(client, name, &held)) != LK_OK) die("lk_lock_new (held)", st);
  if ((st = lk_set_on_fence(held, on_fence, NULL)) != LK_OK) die("lk_set_on_fence", st);
  if ((st = lk_lock_acquire(held, 10000, NULL)) != LK_OK) die("lk_lock_acquire (held)", st);

  run(cycles, permits);
  warm = sample();
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (i = 0; i < 10; i++) {
    run(cycles, permits);
    s[i] = sample();
    if (s[i].rss_kib > warm.rss_kib && s[i].rss_kib - warm.rss_kib > growth) growth = s[i].rss_kib - warm.rss_kib;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  printf("SOAK|c|%s|%" PRIu64 "|%" PRIu64 "|%.1f|%" PRIu64 "|%" PRIu64 "|%" PRIu64 "|%" PRIu64 "|%" PRIu64 "|%" PRIu64
         "|%" PRIu64 "|%" PRIu64 "\n",
         backend, cycles * 10, permits * 10, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
         warm.rss_kib, s[9].rss_kib, growth, warm.fds, s[9].fds, warm.threads, s[9].threads, bound_mib);
  fflush(stdout);
  if (growth >= bound_mib * 1024) {
    fprintf(stderr, "soak.c: RSS grew %" PRIu64 " KiB after the warm-up (bound %" PRIu64 " MiB)\n", growth, bound_mib);
    ok = 0;
  }
  for (i = 0; i < 10; i++) {
    if (s[i].fds != warm.fds || s[i].threads != warm.threads) {
      fprintf(stderr, "soak.c: slice %d: %" PRIu64 " descriptors, %" PRIu64 " threads; warm-up %" PRIu64 ", %" PRIu64 "\n",
              i, s[i].fds, s[i].threads, warm.fds, warm.threads);
      ok = 0;
    }
  }
  if ((st = lk_lock_in_flight(held, &in_flight)) != LK_OK || in_flight != 0) {
    fprintf(stderr, "soak.c: %" PRIu64 " permits in flight\n", in_flight);
    ok = 0;
  }
  if ((st = lk_lock_release(held)) != LK_OK) die("lk_lock_release (held)", st);
  lk_lock_free(held);
  lk_client_free(client);
  return ok ? 0 : 1;
}
