/* Many threads take permits while the lock fences: no permit is granted
 * after the fence, every permit granted is ended, the counts agree. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"

#define THREADS 8

static struct lk_lock *lock;
static atomic_uint_fast64_t fence_at;   /* boot ns when on_fence ran; 0 before */
static atomic_int fences, stop;
static atomic_uint_fast64_t fence_in_flight;
static atomic_long granted, ended, late_grants, wrong_token, refused_draining,
    refused_fenced, refused_other, valid_after_fence;

static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  (void)ud;
  (void)token;
  atomic_store(&fence_in_flight, in_flight);
  atomic_fetch_add(&fences, 1);
  atomic_store(&fence_at, boot_ns());
}

static void *worker(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    uint64_t before = boot_ns();
    struct lk_permit p = LK_PERMIT_INIT;
    enum lk_status s = lk_permit(lock, &p);
    if (s == LK_OK) {
      atomic_fetch_add(&granted, 1);
      uint64_t fenced = atomic_load(&fence_at);
      if (fenced && before >= fenced) atomic_fetch_add(&late_grants, 1);
      uint64_t token = 0;
      if (lk_permit_token(&p, &token) != LK_OK || token != 1) atomic_fetch_add(&wrong_token, 1);
      for (volatile int i = 0; i < 2000; i++) {
      }
      uint64_t checked = boot_ns();
      fenced = atomic_load(&fence_at);
      if (lk_permit_valid(&p) && fenced && checked >= fenced)
        atomic_fetch_add(&valid_after_fence, 1);
      lk_permit_end(&p);
      lk_permit_end(&p); /* guarded: counted once */
      atomic_fetch_add(&ended, 1);
    } else if (s == LK_DRAINING) {
      atomic_fetch_add(&refused_draining, 1);
    } else if (s == LK_FENCED) {
      atomic_fetch_add(&refused_fenced, 1);
    } else {
      atomic_fetch_add(&refused_other, 1);
    }
  }
  return NULL;
}

int main(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *c = client_in(mem, false);
  OK(lk_lock_new(c, "threads", &lock));
  OK(lk_set_on_fence(lock, on_fence, NULL));
  OK(lk_lock_acquire(lock, 5000, NULL));

  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&t[i], NULL, worker, NULL) == 0);
  sleep_ms(300);
  OK(lk_link_partition(c)); /* drain at the next keepalive, fence at the deadline */
  for (int i = 0; i < 500 && !atomic_load(&fences); i++) sleep_ms(10);
  CHECK(atomic_load(&fences) == 1);
  sleep_ms(200); /* keep taking permits after the fence */
  atomic_store(&stop, 1);
  for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);

  uint64_t in_flight = 99;
  OK(lk_lock_in_flight(lock, &in_flight));
  printf("threads: granted %ld, refused draining %ld / fenced %ld, in flight at fence %" PRIu64
         "\n",
         atomic_load(&granted), atomic_load(&refused_draining), atomic_load(&refused_fenced),
         (uint64_t)atomic_load(&fence_in_flight));
  CHECK(atomic_load(&granted) > 0);
  CHECK(atomic_load(&granted) == atomic_load(&ended));
  CHECK(in_flight == 0);
  CHECK(atomic_load(&late_grants) == 0);
  CHECK(atomic_load(&valid_after_fence) == 0);
  CHECK(atomic_load(&wrong_token) == 0);
  /* Draining shows unless the driver is starved (valgrind): then the clock
   * alone refuses, as fenced. */
  CHECK(atomic_load(&refused_fenced) > 0);
  CHECK(atomic_load(&refused_other) == 0);
  CHECK(atomic_load(&fence_in_flight) <= THREADS);
  CHECK(atomic_load(&fences) == 1);

  OK(lk_link_heal(c));
  lk_lock_free(lock);
  lk_client_free(c);
  lk_memory_free(mem);
  return finish("threads");
}
