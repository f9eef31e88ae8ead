/* Callbacks calling back into the library: every kind of call from inside a
 * callback returns (no deadlock), including a release and freeing the
 * callback's own lock; no callback runs after lk_lock_free returns. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>

#include "check.h"

#define LIMIT_MS 10000

struct flags {
  pthread_mutex_t mu;
  pthread_cond_t changed;
  int acquired_ok, fence_ok, released_in_fence, state_calls_ok, freed_self, drained;
  uint64_t fenced_token;
  struct lk_lock *lock;
  struct lk_client *client;
};

static struct flags f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0,
                         0, NULL, NULL};

static void set(int *field) {
  pthread_mutex_lock(&f.mu);
  *field = 1;
  pthread_cond_broadcast(&f.changed);
  pthread_mutex_unlock(&f.mu);
}

/* Waits (up to 10 s) until *field is set: a deadlock shows as a timeout. */
static int await(int *field) {
  struct timespec d;
  clock_gettime(CLOCK_REALTIME, &d);
  d.tv_sec += LIMIT_MS / 1000;
  pthread_mutex_lock(&f.mu);
  while (!*field)
    if (pthread_cond_timedwait(&f.changed, &f.mu, &d) != 0) break;
  int v = *field;
  pthread_mutex_unlock(&f.mu);
  return v;
}

static void on_acquired(void *ud, uint64_t token) {
  struct lk_lock *lock = ud;
  uint64_t t = 0, left = 0;
  struct lk_permit p = LK_PERMIT_INIT;
  enum lk_state st;
  /* The state is published before the callback runs. */
  if (lk_lock_token(lock, &t) == LK_OK && t == token && lk_lock_time_left(lock, &left) == LK_OK &&
      lk_lock_state(lock, &st) == LK_OK && st == LK_STATE_HOLDING && lk_permit(lock, &p) == LK_OK &&
      lk_permit_valid(&p)) {
    lk_permit_end(&p);
    set(&f.acquired_ok);
  }
}

static void on_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  struct lk_lock *lock = ud;
  uint64_t n = 1;
  enum lk_state now;
  (void)from;
  (void)why;
  /* Setting another callback from inside one is fine too. */
  if (lk_lock_in_flight(lock, &n) == LK_OK && lk_lock_state(lock, &now) == LK_OK &&
      lk_set_on_drained(lock, NULL, NULL) == LK_OK && to != LK_STATE_IDLE)
    set(&f.state_calls_ok);
}

static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  struct lk_lock *lock = ud;
  (void)in_flight;
  f.fenced_token = token;
  set(&f.fence_ok);
  /* A release from inside the fence callback: must return. */
  if (lk_lock_release(lock) == LK_OK) set(&f.released_in_fence);
}

static void callbacks_call_back(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client_options o = short_options();
  o.memory = mem;
  OK(lk_client_new(&o, &f.client));
  OK(lk_lock_new(f.client, "cb", &f.lock));
  OK(lk_set_on_acquired(f.lock, on_acquired, f.lock));
  OK(lk_set_on_state_change(f.lock, on_state, f.lock));
  OK(lk_set_on_fence(f.lock, on_fence, f.lock));
  OK(lk_lock_acquire(f.lock, 5000, NULL));
  CHECK(await(&f.acquired_ok));
  CHECK(await(&f.state_calls_ok));
  OK(lk_link_declare_lease_lost(f.client));
  CHECK(await(&f.fence_ok));
  CHECK(f.fenced_token == 1);
  CHECK(await(&f.released_in_fence));
  enum lk_state st;
  OK(lk_lock_state(f.lock, &st));
  CHECK(st == LK_STATE_RELEASED);
  lk_lock_free(f.lock);
  lk_client_free(f.client);
  lk_memory_free(mem);
}

/* A lock whose on_acquired frees the lock itself. */
static atomic_int calls_after_free;
static atomic_int self_freed;

static void free_self(void *ud, uint64_t token) {
  (void)token;
  if (atomic_load(&self_freed)) {
    atomic_fetch_add(&calls_after_free, 1);
    return;
  }
  atomic_store(&self_freed, 1);
  lk_lock_free(ud);
  set(&f.freed_self);
}

static void count_after_free(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  (void)ud;
  (void)from;
  (void)to;
  (void)why;
  if (atomic_load(&self_freed)) atomic_fetch_add(&calls_after_free, 1);
}

static void free_from_own_callback(void) {
  struct lk_client *c;
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client_options o = short_options();
  o.memory = mem;
  OK(lk_client_new(&o, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, "self", &l));
  OK(lk_set_on_acquired(l, free_self, l));
  OK(lk_set_on_state_change(l, count_after_free, NULL));
  OK(lk_lock_acquire(l, 5000, NULL));
  CHECK(await(&f.freed_self));
  /* The release that the free caused reports nothing. */
  sleep_ms(300);
  CHECK(atomic_load(&calls_after_free) == 0);
  uint64_t u;
  EXPECT(lk_memory_holder(mem, "self", &u), LK_NOT_HELD);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* lk_lock_free waits for a callback running on the callback thread. */
static atomic_int entered, left_cb, ran_after;

static void slow_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  atomic_int *freed = ud;
  (void)from;
  (void)why;
  if (atomic_load(freed)) atomic_fetch_add(&ran_after, 1);
  if (to == LK_STATE_HOLDING && !atomic_load(&entered)) {
    atomic_store(&entered, 1);
    sleep_ms(300);
    atomic_store(&left_cb, 1);
  }
}

static void free_waits_for_running_callback(void) {
  static atomic_int freed;
  struct lk_client *c;
  OK(lk_client_new(NULL, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, "callbacks/slow", &l));
  OK(lk_set_on_state_change(l, slow_state, &freed));
  OK(lk_lock_acquire(l, 5000, NULL));
  while (!atomic_load(&entered)) sleep_ms(1);
  lk_lock_free(l); /* returns only once slow_state has returned */
  atomic_store(&freed, 1);
  CHECK(atomic_load(&left_cb) == 1);
  sleep_ms(200);
  CHECK(atomic_load(&ran_after) == 0);
  lk_client_free(c);
}

/* A NULL callback removes the one set. */
static atomic_int removed_calls;
static void counting(void *ud, uint64_t token) {
  (void)ud;
  (void)token;
  atomic_fetch_add(&removed_calls, 1);
}

static void null_removes(void) {
  struct lk_client *c;
  OK(lk_client_new(NULL, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, "callbacks/removed", &l));
  OK(lk_set_on_acquired(l, counting, NULL));
  OK(lk_set_on_acquired(l, NULL, NULL));
  OK(lk_lock_acquire(l, 5000, NULL));
  OK(lk_lock_release(l));
  sleep_ms(100);
  CHECK(atomic_load(&removed_calls) == 0);
  lk_lock_free(l);
  lk_client_free(c);
}

int main(void) {
  callbacks_call_back();
  free_from_own_callback();
  free_waits_for_running_callback();
  null_removes();
  return finish("callbacks");
}
