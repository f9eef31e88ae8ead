/* Read/write locks (docs/design.md §27) through the C API, on the
 * embedded backend: readers on two clients hold together and a writer
 * waits; a writer excludes readers, writers and plain locks; a downgrade
 * keeps the token and lets a queued reader in; a plain lock's downgrade is
 * refused; the gate's two watermarks; bad input. Readers that share run
 * on clients of their own: two holders on one session exclude each other
 * whatever their modes. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

#define SENTINEL ((void *)0x5e47)

static enum lk_mode mode_of(const struct lk_lock *l) {
  enum lk_mode m = (enum lk_mode)99;
  OK(lk_lock_mode(l, &m));
  return m;
}

/* A new holder of `name` on `c`: a reader or a writer. */
static struct lk_lock *holder(struct lk_client *c, const char *name, int write) {
  struct lk_rwlock *rw = NULL;
  OK(lk_rwlock_new(c, name, &rw));
  struct lk_lock *l = NULL;
  OK(write ? lk_rwlock_writer(rw, &l) : lk_rwlock_reader(rw, &l));
  lk_rwlock_free(rw); /* the lock outlives its rwlock handle */
  return l;
}

static void readers_share_a_writer_waits(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true), *c = client_in(mem, true);

  struct lk_rwlock *rw;
  OK(lk_rwlock_new(a, "cfg", &rw));
  CHECK(strcmp(lk_rwlock_name(rw), "cfg") == 0);
  struct lk_lock *r1, *w0;
  OK(lk_rwlock_reader(rw, &r1));
  OK(lk_rwlock_writer(rw, &w0));
  CHECK(mode_of(r1) == LK_MODE_READ);
  CHECK(mode_of(w0) == LK_MODE_WRITE);
  CHECK(strcmp(lk_lock_name(r1), "cfg") == 0);
  lk_lock_free(w0);

  struct lk_lock *r2 = holder(b, "cfg", 0), *w = holder(c, "cfg", 1);
  uint64_t t1 = 0, t2 = 0, tw = 0;
  OK(lk_lock_acquire(r1, 5000, &t1));
  OK(lk_lock_acquire(r2, 5000, &t2));
  CHECK(t1 > 0 && t2 > t1);
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(r2, &p));
  lk_permit_end(&p);
  EXPECT(lk_lock_try_acquire(w, NULL), LK_WOULD_BLOCK);
  EXPECT(lk_lock_acquire(w, 200, NULL), LK_TIMEOUT);
  OK(lk_lock_release(r1));
  EXPECT(lk_lock_try_acquire(w, NULL), LK_WOULD_BLOCK); /* r2 still reads */
  OK(lk_lock_release(r2));
  OK(lk_lock_acquire(w, 5000, &tw));
  CHECK(tw > t2);

  /* The writer excludes a reader, a writer and a plain lock. */
  struct lk_lock *r3 = holder(a, "cfg", 0), *w2 = holder(b, "cfg", 1), *plain;
  OK(lk_lock_new(a, "cfg", &plain));
  CHECK(mode_of(plain) == LK_MODE_NONE);
  EXPECT(lk_lock_try_acquire(r3, NULL), LK_WOULD_BLOCK);
  EXPECT(lk_lock_try_acquire(w2, NULL), LK_WOULD_BLOCK);
  EXPECT(lk_lock_try_acquire(plain, NULL), LK_WOULD_BLOCK);
  OK(lk_lock_release(w));
  OK(lk_lock_try_acquire(r3, NULL));

  lk_lock_free(plain);
  lk_lock_free(w2);
  lk_lock_free(r3);
  lk_lock_free(w);
  lk_lock_free(r2);
  lk_lock_free(r1);
  lk_rwlock_free(rw);
  lk_client_free(c);
  lk_client_free(b);
  lk_client_free(a);
  lk_memory_free(mem);
}

struct waiter {
  struct lk_lock *lock;
  uint64_t token;
  enum lk_status status;
  atomic_int done;
};

static void *wait_to_read(void *arg) {
  struct waiter *w = arg;
  w->status = lk_lock_acquire(w->lock, 10000, &w->token);
  atomic_store(&w->done, 1);
  return NULL;
}

static void downgrade_keeps_the_token(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true);
  struct lk_session *s;
  struct lk_client_options o = short_options();
  OK(lk_session_new(b, &o, &s));

  struct lk_lock *w = holder(a, "cfg", 1);
  uint64_t token = 0;
  OK(lk_lock_acquire(w, 5000, &token));

  struct lk_rwlock *rw;
  OK(lk_session_rwlock_new(s, "cfg", &rw));
  struct waiter r = {.lock = NULL};
  OK(lk_rwlock_reader(rw, &r.lock));
  pthread_t th;
  CHECK(pthread_create(&th, NULL, wait_to_read, &r) == 0);
  sleep_ms(200);
  CHECK(atomic_load(&r.done) == 0); /* waits behind the writer */

  OK(lk_lock_downgrade(w));
  pthread_join(th, NULL);
  OK(r.status);
  CHECK(r.token > token);
  CHECK(mode_of(w) == LK_MODE_READ);
  uint64_t now = 0;
  OK(lk_lock_token(w, &now));
  CHECK(now == token);
  enum lk_state st = LK_STATE_IDLE;
  OK(lk_lock_state(w, &st));
  CHECK(st == LK_STATE_HOLDING);
  OK(lk_lock_downgrade(w)); /* a reader's downgrade does nothing */
  OK(lk_lock_token(w, &now));
  CHECK(now == token);

  /* A plain lock has no downgrade; a writer not held has nothing to
   * downgrade. */
  struct lk_lock *plain, *idle;
  OK(lk_lock_new(a, "plain", &plain));
  OK(lk_lock_acquire(plain, 5000, NULL));
  EXPECT(lk_lock_downgrade(plain), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("not a read/write lock");
  OK(lk_rwlock_writer(rw, &idle));
  EXPECT(lk_lock_downgrade(idle), LK_NOT_HELD);

  lk_lock_free(idle);
  lk_lock_free(plain);
  lk_lock_free(r.lock);
  lk_lock_free(w);
  lk_rwlock_free(rw);
  lk_session_free(s);
  lk_client_free(b);
  lk_client_free(a);
  lk_memory_free(mem);
}

static void gate_watermarks(void) {
  struct lk_fence_gate *g;
  OK(lk_fence_gate_new(&g));
  uint64_t wm = 9, rm = 9;
  OK(lk_fence_gate_watermarks(g, "cfg", &wm, &rm));
  CHECK(wm == 0 && rm == 0);
  OK(lk_fence_gate_admit_read(g, "cfg", 5));
  OK(lk_fence_gate_admit_read(g, "cfg", 3)); /* readers never refuse each other */
  OK(lk_fence_gate_watermarks(g, "cfg", &wm, &rm));
  CHECK(wm == 0 && rm == 5);
  EXPECT(lk_fence_gate_admit_write(g, "cfg", 4), LK_STALE);
  OK(lk_fence_gate_admit_write(g, "cfg", 7));
  EXPECT(lk_fence_gate_admit_read(g, "cfg", 6), LK_STALE);
  OK(lk_fence_gate_admit_read(g, "cfg", 8));
  OK(lk_fence_gate_watermarks(g, "cfg", &wm, &rm));
  CHECK(wm == 7 && rm == 8);
  EXPECT(lk_fence_gate_admit(g, "cfg", 7), LK_STALE); /* admit is a write */
  uint64_t high = 0;
  OK(lk_fence_gate_highest(g, "cfg", &high));
  CHECK(high == 8);
  lk_fence_gate_free(g);
}

/* Bad input: refused with the core's status, out-parameters untouched. */
static void bad_input(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *c = client_in(mem, true);

  struct lk_rwlock *rw = SENTINEL;
  EXPECT(lk_rwlock_new(c, "", &rw), LK_INVALID_ARGUMENT);
  EXPECT(lk_rwlock_new(NULL, "x", &rw), LK_NULL_PARAMETER);
  EXPECT(lk_rwlock_new(c, NULL, &rw), LK_NULL_PARAMETER);
  EXPECT(lk_rwlock_new(c, "x", NULL), LK_NULL_PARAMETER);
  EXPECT(lk_session_rwlock_new(NULL, "x", &rw), LK_NULL_PARAMETER);
  CHECK(rw == SENTINEL);
  CHECK(lk_rwlock_name(NULL) == NULL);

  OK(lk_rwlock_new(c, "x", &rw));
  struct lk_lock *l = SENTINEL;
  EXPECT(lk_rwlock_reader(NULL, &l), LK_NULL_PARAMETER);
  EXPECT(lk_rwlock_writer(NULL, &l), LK_NULL_PARAMETER);
  EXPECT(lk_rwlock_reader(rw, NULL), LK_NULL_PARAMETER);
  CHECK(l == SENTINEL);
  enum lk_mode m = LK_MODE_WRITE;
  EXPECT(lk_lock_mode(NULL, &m), LK_NULL_PARAMETER);
  CHECK(m == LK_MODE_WRITE);
  EXPECT(lk_lock_downgrade(NULL), LK_NULL_PARAMETER);

  struct lk_fence_gate *g;
  OK(lk_fence_gate_new(&g));
  uint64_t wm = 0;
  EXPECT(lk_fence_gate_admit_read(NULL, "x", 1), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_admit_write(g, NULL, 1), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_watermarks(g, "x", &wm, NULL), LK_NULL_PARAMETER);
  lk_fence_gate_free(g);

  lk_rwlock_free(rw);
  lk_rwlock_free(NULL);
  lk_client_free(c);
  lk_memory_free(mem);
}

int main(void) {
  bad_input();
  gate_watermarks();
  readers_share_a_writer_waits();
  downgrade_keeps_the_token();
  return finish("rwlock");
}
