/* Benchmark (not a test): lk_permit + lk_permit_end beside a bare
 * clock_gettime(CLOCK_BOOTTIME), the clock lk_permit reads, in one program.
 * Prints the median ns per iteration over several rounds and the ratio
 * (target <= 1.5). Usage: bench [ITERATIONS_PER_ROUND [ROUNDS]] */
#define _GNU_SOURCE
#include <stdlib.h>

#include "check.h"

static uint64_t mono_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv) {
  long iters = argc > 1 ? atol(argv[1]) : 2000000;
  int rounds = argc > 2 ? atoi(argv[2]) : 15;
  if (iters <= 0 || rounds <= 0 || rounds > 1000) return 2;
  struct lk_client *c;
  struct lk_lock *l;
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT; /* 15 s TTL: no drain meanwhile */
  if (lk_client_new(&o, &c) != LK_OK || lk_lock_new(c, "bench", &l) != LK_OK ||
      lk_lock_acquire(l, 5000, NULL) != LK_OK) {
    fprintf(stderr, "bench: %s\n", lk_last_error());
    return 1;
  }
  double clock_ns[1000], permit_ns[1000];
  volatile uint64_t sink = 0;
  long refused = 0;
  for (int r = 0; r < rounds; r++) {
    uint64_t t0 = mono_ns();
    for (long i = 0; i < iters; i++) {
      struct timespec t;
      clock_gettime(CLOCK_BOOTTIME, &t);
      sink += (uint64_t)t.tv_nsec;
    }
    uint64_t t1 = mono_ns();
    for (long i = 0; i < iters; i++) {
      struct lk_permit p = LK_PERMIT_INIT;
      if (lk_permit(l, &p) != LK_OK) refused++;
      lk_permit_end(&p);
    }
    uint64_t t2 = mono_ns();
    clock_ns[r] = (double)(t1 - t0) / (double)iters;
    permit_ns[r] = (double)(t2 - t1) / (double)iters;
  }
  double mc = median(clock_ns, rounds), mp = median(permit_ns, rounds);
  printf("clock_gettime(CLOCK_BOOTTIME)  median %6.2f ns\n", mc);
  printf("lk_permit + lk_permit_end      median %6.2f ns  ratio %.2fx  (%d rounds of %ld)\n", mp,
         mp / mc, rounds, iters);
  lk_lock_release(l);
  lk_lock_free(l);
  lk_client_free(c);
  (void)sink;
  if (refused) {
    fprintf(stderr, "bench: %ld permits refused\n", refused);
    return 1;
  }
  return 0;
}
