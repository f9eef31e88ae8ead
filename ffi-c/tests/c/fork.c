/* fork(): the child gets LK_FORKED from every status function, its frees
 * are safe, and the parent keeps its lock (and its lease on the service). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static void noop_fence(void *ud, uint64_t t, uint64_t n) {
  (void)ud;
  (void)t;
  (void)n;
}

static int child(struct lk_memory *mem, struct lk_client *c, struct lk_lock *l,
                 struct lk_permit *held) {
  alarm(10); /* a call that waited on the parent's driver would hang */
  uint64_t u = 5;
  enum lk_state st;
  struct lk_permit p = LK_PERMIT_INIT;
  struct lk_client_options o;
  struct lk_client *c2 = NULL;
  struct lk_lock *l2 = NULL;
  struct lk_memory *m2 = NULL;
  struct lk_fence_gate *g = NULL;
  EXPECT(lk_client_options_init(&o, LK_CLIENT_OPTIONS_VERSION), LK_FORKED);
  MESSAGE_HAS("fork");
  EXPECT(lk_client_new(NULL, &c2), LK_FORKED);
  EXPECT(lk_client_from_env(NULL, &c2), LK_FORKED);
  EXPECT(lk_memory_new(&m2), LK_FORKED);
  EXPECT(lk_memory_named("", &m2), LK_FORKED);
  EXPECT(lk_client_memory(c, &m2), LK_FORKED);
  EXPECT(lk_memory_freeze_expiry(mem, true), LK_FORKED);
  EXPECT(lk_memory_holder(mem, "fork", &u), LK_FORKED);
  EXPECT(lk_link_partition(c), LK_FORKED);
  EXPECT(lk_link_heal(c), LK_FORKED);
  EXPECT(lk_link_drop_keepalive_replies(c, true), LK_FORKED);
  EXPECT(lk_link_delay_keepalive_replies(c, 1), LK_FORKED);
  EXPECT(lk_link_fail_keepalives(c, "x"), LK_FORKED);
  EXPECT(lk_link_declare_lease_lost(c), LK_FORKED);
  EXPECT(lk_stall_driver(1), LK_FORKED);
  EXPECT(lk_fence_gate_new(&g), LK_FORKED);
  EXPECT(lk_fence_gate_admit(NULL, "x", 1), LK_FORKED);
  EXPECT(lk_fence_gate_highest(NULL, "x", &u), LK_FORKED);
  EXPECT(lk_lock_new(c, "other", &l2), LK_FORKED);
  EXPECT(lk_lock_acquire(l, 100, &u), LK_FORKED);
  EXPECT(lk_lock_try_acquire(l, &u), LK_FORKED);
  EXPECT(lk_lock_release(l), LK_FORKED);
  EXPECT(lk_lock_state(l, &st), LK_FORKED);
  EXPECT(lk_lock_token(l, &u), LK_FORKED);
  EXPECT(lk_lock_time_left(l, &u), LK_FORKED);
  EXPECT(lk_lock_deadline(l, &u), LK_FORKED);
  EXPECT(lk_lock_in_flight(l, &u), LK_FORKED);
  EXPECT(lk_set_on_fence(l, noop_fence, NULL), LK_FORKED);
  EXPECT(lk_set_on_state_change(l, NULL, NULL), LK_FORKED);
  EXPECT(lk_set_on_acquired(l, NULL, NULL), LK_FORKED);
  EXPECT(lk_set_on_drained(l, NULL, NULL), LK_FORKED);
  EXPECT(lk_permit(l, &p), LK_FORKED);
  EXPECT(lk_permit_token(held, &u), LK_FORKED);
  EXPECT(lk_lock_guarded_put(l, 1, (const uint8_t *)"k", 1, NULL, 0), LK_FORKED);
  EXPECT(lk_lock_guarded_delete(l, 1, (const uint8_t *)"k", 1), LK_FORKED);
  CHECK(!lk_permit_valid(held));
  CHECK(u == 5 && !c2 && !l2 && !m2 && !g);
  CHECK(!strcmp(lk_status_name(LK_FORKED), "forked")); /* pure functions still answer */
  /* Frees touch memory only: never the parent's lease. */
  lk_permit_end(held);
  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(mem);
  return failures;
}

int main(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_lock *l;
  OK(lk_lock_new(c, "fork", &l));
  uint64_t token = 0;
  OK(lk_lock_acquire(l, 5000, &token));
  struct lk_permit held = LK_PERMIT_INIT;
  OK(lk_permit(l, &held));

  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) _exit(child(mem, c, l, &held) ? 1 : 0);
  CHECK(pid > 0);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  /* Past the first deadline (1.5 s): keepalives went on in the parent. */
  sleep_ms(1800);
  enum lk_state st;
  OK(lk_lock_state(l, &st));
  CHECK(st == LK_STATE_HOLDING);
  CHECK(lk_permit_valid(&held));
  uint64_t seen = 0, in_flight = 0;
  OK(lk_memory_holder(mem, "fork", &seen));
  CHECK(seen == token);
  OK(lk_lock_in_flight(l, &in_flight));
  CHECK(in_flight == 1);
  lk_permit_end(&held);
  OK(lk_lock_release(l));
  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(mem);
  return finish("fork");
}
