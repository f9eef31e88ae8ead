/* Semaphores (docs/design.md §26) through the C API, on the embedded
 * backend: N slots on one name, each an ordinary lk_lock named
 * `<name>/slot/<i>`; N + 1 contenders, exactly N hold; a release wakes the
 * waiter onto that slot; the limit recorded once and a mismatch refused;
 * a fenced slot passes on while the other holder is untouched; bad input. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

#define LIMIT 2
#define SENTINEL ((void *)0x5e47)

static uint32_t slot_of(struct lk_lock *l) {
  uint32_t slot = 999;
  OK(lk_lock_slot(l, &slot));
  return slot;
}

/* Whether `lock`'s name is "<name>/slot/<its slot>". */
static int named_by_slot(struct lk_lock *l, const char *name) {
  char want[256];
  snprintf(want, sizeof want, "%s/slot/%u", name, slot_of(l));
  return strcmp(lk_lock_name(l), want) == 0;
}

struct waiter {
  struct lk_semaphore *sem;
  struct lk_lock *got;
  enum lk_status status;
  atomic_int done;
};

static void *wait_for_slot(void *arg) {
  struct waiter *w = arg;
  w->status = lk_semaphore_acquire(w->sem, 10000, &w->got);
  atomic_store(&w->done, 1);
  return NULL;
}

/* A session of `c` that does not reacquire after a fence. */
static struct lk_session *session_of(struct lk_client *c) {
  struct lk_client_options o = short_options();
  o.reacquire = false;
  struct lk_session *s = NULL;
  OK(lk_session_new(c, &o, &s));
  return s;
}

static void n_hold_and_one_waits(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_session *sa = session_of(c), *sb = session_of(c), *sw = session_of(c);

  /* One handle per contender; the first records the limit. */
  struct lk_semaphore *a, *b, *w;
  OK(lk_semaphore_new(c, "gpu", LIMIT, &a));
  OK(lk_session_semaphore_new(sb, "gpu", LIMIT, &b));
  OK(lk_session_semaphore_new(sw, "gpu", LIMIT, &w));
  lk_semaphore_free(a);
  OK(lk_session_semaphore_new(sa, "gpu", LIMIT, &a));
  uint32_t limit = 0;
  OK(lk_semaphore_limit(a, &limit));
  CHECK(limit == LIMIT);
  CHECK(strcmp(lk_semaphore_name(a), "gpu") == 0);

  /* Another limit on the same name: refused, naming both. */
  struct lk_semaphore *other = SENTINEL;
  EXPECT(lk_semaphore_new(c, "gpu", LIMIT + 1, &other), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("limit 2");
  MESSAGE_HAS("not 3");
  CHECK(other == SENTINEL);

  /* Two holders, on two distinct slots, each an ordinary held lock. */
  struct lk_lock *la = NULL, *lb = NULL;
  OK(lk_semaphore_acquire(a, 5000, &la));
  OK(lk_semaphore_try_acquire(b, &lb));
  CHECK(la && lb);
  if (!la || !lb) return;
  uint32_t slot_a = slot_of(la), slot_b = slot_of(lb);
  CHECK(slot_a < LIMIT && slot_b < LIMIT && slot_a != slot_b);
  CHECK(named_by_slot(la, "gpu") && named_by_slot(lb, "gpu"));
  CHECK(state_of(la) == LK_STATE_HOLDING && state_of(lb) == LK_STATE_HOLDING);
  uint64_t token_a = 0, token_b = 0;
  OK(lk_lock_token(la, &token_a));
  OK(lk_lock_token(lb, &token_b));
  CHECK(token_a > 0 && token_b > 0);
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(la, &p));
  uint64_t pt = 0;
  OK(lk_permit_token(&p, &pt));
  CHECK(pt == token_a);
  lk_permit_end(&p);

  /* The third: would block, then times out with nothing held. */
  struct lk_lock *lw = SENTINEL;
  EXPECT(lk_semaphore_try_acquire(w, &lw), LK_WOULD_BLOCK);
  EXPECT(lk_semaphore_acquire(w, 0, &lw), LK_WOULD_BLOCK);
  EXPECT(lk_semaphore_acquire(w, 200, &lw), LK_TIMEOUT);
  CHECK(lw == SENTINEL);

  /* A release wakes the waiter, onto the slot released. */
  struct waiter wt = {w, NULL, LK_PANIC, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, wait_for_slot, &wt) == 0);
  sleep_ms(300);
  CHECK(!atomic_load(&wt.done));
  OK(lk_lock_release(la));
  CHECK(pthread_join(th, NULL) == 0);
  OK(wt.status);
  if (wt.got) {
    CHECK(slot_of(wt.got) == slot_a);
    uint64_t token_w = 0;
    OK(lk_lock_token(wt.got, &token_w));
    CHECK(token_w > token_a); /* tokens rise per slot */
  }

  /* Slot b's key deleted (an operator): b fences, the waiter's slot is
   * untouched, and slot b passes on to the next try. */
  OK(lk_memory_delete_lock_key(mem, lk_lock_name(lb)));
  for (int i = 0; i < 500 && state_of(lb) != LK_STATE_FENCED; i++) sleep_ms(10);
  CHECK(state_of(lb) == LK_STATE_FENCED);
  if (wt.got) CHECK(state_of(wt.got) == LK_STATE_HOLDING);
  struct lk_lock *again = NULL;
  OK(lk_semaphore_try_acquire(a, &again));
  if (again) {
    CHECK(slot_of(again) == slot_b);
    uint64_t token_again = 0;
    OK(lk_lock_token(again, &token_again));
    CHECK(token_again > token_b);
  }

  lk_lock_free(again);
  lk_lock_free(wt.got);
  lk_lock_free(lb);
  lk_lock_free(la);
  lk_semaphore_free(a);
  lk_semaphore_free(b);
  lk_semaphore_free(w);
  lk_session_free(sa);
  lk_session_free(sb);
  lk_session_free(sw);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* Bad input: refused with the core's status, out-parameters untouched. */
static void bad_input(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);

  struct lk_semaphore *s = SENTINEL;
  EXPECT(lk_semaphore_new(c, "s", 0, &s), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("limit");
  EXPECT(lk_semaphore_new(c, "s", LK_MAX_SEMAPHORE_LIMIT + 1, &s), LK_INVALID_ARGUMENT);
  EXPECT(lk_semaphore_new(c, "", 1, &s), LK_INVALID_ARGUMENT);
  EXPECT(lk_semaphore_new(NULL, "s", 1, &s), LK_NULL_PARAMETER);
  EXPECT(lk_semaphore_new(c, NULL, 1, &s), LK_NULL_PARAMETER);
  EXPECT(lk_semaphore_new(c, "s", 1, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_session_semaphore_new(NULL, "s", 1, &s), LK_NULL_PARAMETER);
  CHECK(s == SENTINEL);

  OK(lk_semaphore_new(c, "s", LK_MAX_SEMAPHORE_LIMIT, &s));
  struct lk_lock *l = SENTINEL;
  EXPECT(lk_semaphore_acquire(NULL, 10, &l), LK_NULL_PARAMETER);
  EXPECT(lk_semaphore_acquire(s, 10, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_semaphore_try_acquire(NULL, &l), LK_NULL_PARAMETER);
  EXPECT(lk_semaphore_limit(s, NULL), LK_NULL_PARAMETER);
  CHECK(l == SENTINEL);
  CHECK(lk_semaphore_name(NULL) == NULL);

  /* A plain lock is no semaphore's slot. */
  struct lk_lock *plain;
  OK(lk_lock_new(c, "plain", &plain));
  uint32_t slot = 7;
  EXPECT(lk_lock_slot(plain, &slot), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("not a semaphore");
  CHECK(slot == 7);
  EXPECT(lk_lock_slot(NULL, &slot), LK_NULL_PARAMETER);
  EXPECT(lk_lock_slot(plain, NULL), LK_NULL_PARAMETER);

  /* The slot of a lock stays known after its release. */
  OK(lk_semaphore_acquire(s, 1000, &l));
  if (l != SENTINEL) {
    OK(lk_lock_release(l));
    CHECK(slot_of(l) < LK_MAX_SEMAPHORE_LIMIT);
    lk_lock_free(l);
  }

  lk_lock_free(plain);
  lk_semaphore_free(s);
  lk_semaphore_free(NULL);
  lk_client_free(c);
  lk_memory_free(mem);
}

int main(void) {
  bad_input();
  n_hold_and_one_waits();
  return finish("semaphore");
}
