/* Sessions: many locks on one lease. One lease for all (acquire, release
 * of one), a partition drains and a heal resumes them all, a deleted key
 * fences one lock alone, a revoked lease fences its session's locks and no
 * other's, close releases all and refuses acquires, both free orders clean
 * up, bad input is refused with a message. Embedded backend; every wait is
 * a bounded poll of what the callbacks or the service report. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

#define SENTINEL ((void *)0x5e47)
#define N 100
#define LIMIT_MS 15000

/* What the callbacks saw of one lock. */
struct seen {
  atomic_int fences, acquired, drains, resumes, released;
  atomic_int last_reason, fence_reason;
  atomic_uint_fast64_t token;
};

static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  struct seen *s = ud;
  (void)token;
  (void)in_flight;
  atomic_fetch_add(&s->fences, 1);
}

static void on_acquired(void *ud, uint64_t token) {
  struct seen *s = ud;
  atomic_store(&s->token, token);
  atomic_fetch_add(&s->acquired, 1);
}

static void on_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  struct seen *s = ud;
  atomic_store(&s->last_reason, (int)why);
  if (to == LK_STATE_DRAINING) atomic_fetch_add(&s->drains, 1);
  if (from == LK_STATE_DRAINING && to == LK_STATE_HOLDING) atomic_fetch_add(&s->resumes, 1);
  if (to == LK_STATE_FENCED) atomic_store(&s->fence_reason, (int)why);
  if (to == LK_STATE_RELEASED) atomic_fetch_add(&s->released, 1);
}

static void watch(struct lk_lock *l, struct seen *s) {
  atomic_init(&s->fences, 0);
  atomic_init(&s->acquired, 0);
  atomic_init(&s->drains, 0);
  atomic_init(&s->resumes, 0);
  atomic_init(&s->released, 0);
  atomic_init(&s->last_reason, -1);
  atomic_init(&s->fence_reason, -1);
  atomic_init(&s->token, 0);
  OK(lk_set_on_fence(l, on_fence, s));
  OK(lk_set_on_acquired(l, on_acquired, s));
  OK(lk_set_on_state_change(l, on_state, s));
}

/* Polls `done(ctx)` every 5 ms for up to LIMIT_MS. */
static int eventually(int (*done)(void *), void *ctx) {
  uint64_t until = boot_ns() + (uint64_t)LIMIT_MS * 1000000u;
  while (!done(ctx)) {
    if (boot_ns() > until) return 0;
    sleep_ms(5);
  }
  return 1;
}

struct key_of {
  struct lk_memory *mem;
  const char *name;
};

/* Whether nobody holds the lock `name` on the embedded service. */
static int key_gone(void *ctx) {
  struct key_of *k = ctx;
  uint64_t u = 0;
  return lk_memory_holder(k->mem, k->name, &u) == LK_NOT_HELD;
}


static int64_t lease_of(struct lk_session *s) {
  int64_t lease = 0;
  OK(lk_session_lease(s, &lease));
  return lease;
}

static struct lk_session_stats stats_of(struct lk_session *s) {
  struct lk_session_stats st = LK_SESSION_STATS_INIT;
  OK(lk_session_stats(s, &st));
  return st;
}

/* A set of locks to poll. */
struct group {
  struct lk_lock **locks;
  struct seen *seen;
  int from, to; /* [from, to) */
  enum lk_state state;
  int count; /* for the counters below */
};

static int all_in_state(void *ctx) {
  struct group *g = ctx;
  for (int i = g->from; i < g->to; i++)
    if (state_of(g->locks[i]) != g->state) return 0;
  return 1;
}

static int all_drained(void *ctx) {
  struct group *g = ctx;
  for (int i = g->from; i < g->to; i++)
    if (atomic_load(&g->seen[i].drains) < g->count) return 0;
  return 1;
}

static int all_resumed(void *ctx) {
  struct group *g = ctx;
  for (int i = g->from; i < g->to; i++)
    if (atomic_load(&g->seen[i].resumes) < g->count || state_of(g->locks[i]) != LK_STATE_HOLDING)
      return 0;
  return 1;
}

static int all_acquired(void *ctx) {
  struct group *g = ctx;
  for (int i = g->from; i < g->to; i++)
    if (atomic_load(&g->seen[i].acquired) < g->count || state_of(g->locks[i]) != LK_STATE_HOLDING)
      return 0;
  return 1;
}

struct keepalives {
  struct lk_session *session;
  uint64_t after;
};

static int keepalive_confirmed(void *ctx) {
  struct keepalives *k = ctx;
  struct lk_session_stats st = stats_of(k->session);
  return st.keepalives > k->after && st.last_keepalive_rtt_us > 0;
}

/* Waits for a keepalive sent after now to be counted (its round trip set). */
static void await_keepalive(struct lk_session *s) {
  struct keepalives k = {s, stats_of(s).keepalives};
  CHECK(eventually(keepalive_confirmed, &k));
}

struct count {
  struct lk_session *session;
  uint64_t locks;
};

static int locks_counted(void *ctx) {
  struct count *c = ctx;
  return stats_of(c->session).locks == c->locks;
}

static struct lk_client_options long_ttl(void) {
  struct lk_client_options o = short_options();
  o.ttl_ms = 8000; /* a deadline far past the drain, even under valgrind */
  return o;
}

static void new_locks(struct lk_session *s, const char *prefix, struct lk_lock **locks,
                      struct seen *seen, int n) {
  char name[64];
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "%s/%d", prefix, i);
    OK(lk_session_lock_new(s, name, &locks[i]));
    watch(locks[i], &seen[i]);
  }
}

static void free_locks(struct lk_lock **locks, int n) {
  for (int i = 0; i < n; i++) lk_lock_free(locks[i]);
}

/* N locks, one lease: acquired, released one by one, drained and resumed
 * together, one fenced alone by a deleted key. */
static void one_lease_for_many(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_client_options so = long_ttl();
  struct lk_session *s;
  OK(lk_session_new(c, &so, &s));

  int64_t lease = 42;
  EXPECT(lk_session_lease(s, &lease), LK_NOT_HELD); /* granted on the first acquire */
  MESSAGE_HAS("lease");
  CHECK(lease == 42);
  struct lk_session_stats st = stats_of(s);
  CHECK(st.version == LK_SESSION_STATS_VERSION && st.lease == 0 && st.locks == 0);
  CHECK(st.last_keepalive_rtt_us == 0);

  static struct lk_lock *locks[N];
  static struct seen seen[N];
  new_locks(s, "many", locks, seen, N);
  /* Counted by the session's task, so shortly after lk_session_lock_new. */
  struct count want = {s, N};
  CHECK(eventually(locks_counted, &want));

  uint64_t tokens[N];
  OK(lk_lock_acquire(locks[0], 5000, &tokens[0]));
  const int64_t l0 = lease_of(s);
  CHECK(l0 != 0);
  for (int i = 1; i < N; i++) OK(lk_lock_acquire(locks[i], 5000, &tokens[i]));
  CHECK(lease_of(s) == l0); /* one lease for all */
  st = stats_of(s);
  CHECK(st.lease == l0 && st.locks == N);
  for (int i = 0; i < N; i++) {
    uint64_t held = 0;
    char name[64];
    snprintf(name, sizeof name, "many/%d", i);
    OK(lk_memory_holder(mem, name, &held));
    CHECK(held == tokens[i]);
    for (int j = 0; j < i; j++) CHECK(tokens[j] != tokens[i]);
  }
  await_keepalive(s);
  CHECK(lease_of(s) == l0);

  /* Releasing one deletes its key only: the lease and the others go on. */
  OK(lk_lock_release(locks[0]));
  CHECK(state_of(locks[0]) == LK_STATE_RELEASED);
  /* Deleted before the release returns, unless the delete took longer
   * than keepalive_timeout (valgrind on a loaded machine: it went on then,
   * design.md §10): the key is gone at once or soon after. */
  struct key_of k0 = {mem, "many/0"};
  CHECK(eventually(key_gone, &k0));
  uint64_t u = 0;
  await_keepalive(s);
  CHECK(lease_of(s) == l0);
  struct group rest = {locks, seen, 1, N, LK_STATE_HOLDING, 1};
  CHECK(all_in_state(&rest));

  /* A partition drains every lock of the session; the heal resumes all. */
  OK(lk_link_partition(c));
  CHECK(eventually(all_drained, &rest));
  OK(lk_link_heal(c));
  CHECK(eventually(all_resumed, &rest));
  CHECK(lease_of(s) == l0);
  for (int i = 1; i < N; i++) {
    CHECK(atomic_load(&seen[i].fences) == 0);
    struct lk_lock_stats ls = LK_LOCK_STATS_INIT;
    OK(lk_lock_stats(locks[i], &ls));
    CHECK(ls.drains == 1 && ls.resumes == 1 && ls.acquisitions == 1);
  }
  CHECK(atomic_load(&seen[0].drains) == 0); /* released before: not drained */

  /* A deleted key fences its lock alone, which reacquires higher. */
  const int k = 7;
  OK(lk_memory_delete_lock_key(mem, "many/7"));
  struct group one = {locks, seen, k, k + 1, LK_STATE_HOLDING, 2};
  CHECK(eventually(all_acquired, &one));
  CHECK(atomic_load(&seen[k].fences) == 1);
  CHECK(atomic_load(&seen[k].fence_reason) == LK_REASON_LOCK_LOST);
  CHECK(atomic_load(&seen[k].token) > tokens[k]);
  OK(lk_memory_holder(mem, "many/7", &u));
  CHECK(u == atomic_load(&seen[k].token));
  for (int i = 1; i < N; i++) {
    if (i == k) continue;
    CHECK(atomic_load(&seen[i].fences) == 0);
    CHECK(state_of(locks[i]) == LK_STATE_HOLDING);
    OK(lk_lock_token(locks[i], &u));
    CHECK(u == tokens[i]);
  }
  CHECK(lease_of(s) == l0); /* the lease was never lost */

  free_locks(locks, N);
  lk_session_free(s);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* The lease of one session revoked on the service: its locks fence and
 * reacquire on a new lease; another session of the same client goes on. */
static void revoke_fences_one_session(void) {
  enum { M = 10 };
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_client_options o = short_options();
  struct lk_session *a, *b;
  OK(lk_session_new(c, NULL, &a)); /* the client's timing */
  OK(lk_session_new(c, &o, &b));
  struct lk_lock *la[M], *lb[M];
  struct seen sa[M], sb[M];
  new_locks(a, "rev-a", la, sa, M);
  new_locks(b, "rev-b", lb, sb, M);
  uint64_t ta[M], tb[M];
  for (int i = 0; i < M; i++) {
    OK(lk_lock_acquire(la[i], 5000, &ta[i]));
    OK(lk_lock_acquire(lb[i], 5000, &tb[i]));
  }
  const int64_t lease_a = lease_of(a), lease_b = lease_of(b);
  CHECK(lease_a != 0 && lease_b != 0 && lease_a != lease_b);

  bool found = false;
  OK(lk_memory_revoke_lease(mem, lease_a, &found));
  CHECK(found);
  struct group ga = {la, sa, 0, M, LK_STATE_HOLDING, 2};
  CHECK(eventually(all_acquired, &ga));
  for (int i = 0; i < M; i++) {
    CHECK(atomic_load(&sa[i].fences) == 1);
    CHECK(atomic_load(&sa[i].fence_reason) == LK_REASON_LEASE_LOST);
    CHECK(atomic_load(&sa[i].token) > ta[i]);
    struct lk_lock_stats ls = LK_LOCK_STATS_INIT;
    OK(lk_lock_stats(la[i], &ls));
    CHECK(ls.fences_lease_lost == 1 && ls.acquisitions == 2);
  }
  const int64_t lease_a2 = lease_of(a);
  CHECK(lease_a2 != 0 && lease_a2 != lease_a); /* one new lease for all */
  CHECK(stats_of(a).lease == lease_a2);
  for (int i = 0; i < M; i++) {
    uint64_t u = 0;
    CHECK(atomic_load(&sb[i].fences) == 0);
    CHECK(state_of(lb[i]) == LK_STATE_HOLDING);
    OK(lk_lock_token(lb[i], &u));
    CHECK(u == tb[i]);
  }
  await_keepalive(b);
  CHECK(lease_of(b) == lease_b);

  /* Unknown leases: not found; found_out may be NULL. */
  found = true;
  OK(lk_memory_revoke_lease(mem, lease_a, &found));
  CHECK(!found);
  OK(lk_memory_revoke_lease(mem, -1, NULL));
  OK(lk_memory_revoke_lease(mem, 0, &found));
  CHECK(!found);

  free_locks(la, M);
  free_locks(lb, M);
  lk_session_free(a);
  lk_session_free(b);
  lk_client_free(c);
  lk_memory_free(mem);
}

struct waiter {
  struct lk_lock *lock;
  atomic_int started;
  enum lk_status status;
};

static void *acquire_in_thread(void *arg) {
  struct waiter *w = arg;
  atomic_store(&w->started, 1);
  w->status = lk_lock_acquire(w->lock, LIMIT_MS, NULL);
  return NULL;
}

static int acquiring(void *ctx) {
  struct waiter *w = ctx;
  return atomic_load(&w->started) && state_of(w->lock) == LK_STATE_ACQUIRING;
}

/* Close releases every lock (held, idle, waiting), revokes the lease and
 * makes every lock of the session refuse to acquire. */
static void close_releases_all(void) {
  enum { M = 10 };
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_client_options o = short_options();
  struct lk_session *s, *other;
  OK(lk_session_new(c, &o, &s));
  OK(lk_session_new(c, &o, &other));
  struct lk_lock *locks[M + 2];
  struct seen seen[M + 2];
  new_locks(s, "close", locks, seen, M + 1); /* the last one stays idle */
  for (int i = 0; i < M; i++) OK(lk_lock_acquire(locks[i], 5000, NULL));
  /* One more lock of the session waits behind another session's holder. */
  struct lk_lock *blocker;
  OK(lk_session_lock_new(other, "close-busy", &blocker));
  OK(lk_lock_acquire(blocker, 5000, NULL));
  OK(lk_session_lock_new(s, "close-busy", &locks[M + 1]));
  watch(locks[M + 1], &seen[M + 1]);
  struct waiter w = {locks[M + 1], 0, LK_OK};
  pthread_t t;
  CHECK(pthread_create(&t, NULL, acquire_in_thread, &w) == 0);
  CHECK(eventually(acquiring, &w));

  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(locks[0], &p));
  const int64_t lease = lease_of(s);
  OK(lk_session_close(s));
  pthread_join(t, NULL);
  EXPECT(w.status, LK_RELEASED); /* the waiting acquire is answered */
  CHECK(!lk_permit_valid(&p));   /* the permit in flight is dead at once */
  lk_permit_end(&p);

  for (int i = 0; i < M + 2; i++) {
    CHECK(state_of(locks[i]) == LK_STATE_RELEASED);
    EXPECT(lk_lock_acquire(locks[i], 100, NULL), LK_RELEASED);
    EXPECT(lk_lock_try_acquire(locks[i], NULL), LK_RELEASED);
    CHECK(atomic_load(&seen[i].fences) == 0); /* a release, not a fence */
  }
  uint64_t u;
  EXPECT(lk_memory_holder(mem, "close/0", &u), LK_NOT_HELD);
  bool found = true;
  OK(lk_memory_revoke_lease(mem, lease, &found));
  CHECK(!found); /* close returned once the lease was revoked */
  int64_t l = 5;
  EXPECT(lk_session_lease(s, &l), LK_NOT_HELD);
  CHECK(l == 5 && stats_of(s).lease == 0);

  OK(lk_session_close(s)); /* twice: harmless */
  /* A closed session makes no new lock. */
  struct lk_lock *late = NULL;
  EXPECT(lk_session_lock_new(s, "close-late", &late), LK_RELEASED);
  CHECK(late == NULL);

  /* The other session goes on. */
  CHECK(state_of(blocker) == LK_STATE_HOLDING);
  lk_lock_free(blocker);
  free_locks(locks, M + 2);
  lk_session_free(s);
  lk_session_free(other);
  lk_client_free(c);
  lk_memory_free(mem);
}

struct holders {
  struct lk_memory *mem;
  const char *prefix;
  int n;
};

static int none_held(void *ctx) {
  struct holders *h = ctx;
  char name[64];
  uint64_t u;
  for (int i = 0; i < h->n; i++) {
    snprintf(name, sizeof name, "%s/%d", h->prefix, i);
    if (lk_memory_holder(h->mem, name, &u) != LK_NOT_HELD) return 0;
  }
  return 1;
}

struct later {
  struct lk_lock *lock;
  uint64_t than;
};

static int deadline_moved(void *ctx) {
  struct later *l = ctx;
  uint64_t ns = 0;
  return lk_lock_deadline(l->lock, &ns) == LK_OK && ns > l->than;
}

/* The session handle freed before its locks, and the locks before it: the
 * locks work on while the handle is gone; both orders clean up. The default
 * session is reachable from the client and shared with lk_lock_new. */
static void free_orders(void) {
  enum { M = 5 };
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_client_options o = short_options();

  /* Handle first: the locks keep the session. */
  struct lk_session *s;
  OK(lk_session_new(c, &o, &s));
  struct lk_lock *locks[M];
  struct seen seen[M];
  new_locks(s, "handle-first", locks, seen, M);
  for (int i = 0; i < M; i++) OK(lk_lock_acquire(locks[i], 5000, NULL));
  uint64_t first = 0;
  OK(lk_lock_deadline(locks[1], &first));
  lk_session_free(s);
  OK(lk_lock_release(locks[0]));
  OK(lk_lock_acquire(locks[0], 5000, NULL));
  struct later moved = {locks[1], first};
  CHECK(eventually(deadline_moved, &moved)); /* the session still renews */
  for (int i = 0; i < M; i++) CHECK(state_of(locks[i]) == LK_STATE_HOLDING);
  free_locks(locks, M);
  struct holders h = {mem, "handle-first", M};
  CHECK(eventually(none_held, &h));

  /* Locks first, the handle still usable, then freed. */
  OK(lk_session_new(c, &o, &s));
  new_locks(s, "locks-first", locks, seen, M);
  for (int i = 0; i < M; i++) OK(lk_lock_acquire(locks[i], 5000, NULL));
  free_locks(locks, M);
  h.prefix = "locks-first";
  CHECK(eventually(none_held, &h));
  OK(lk_session_lock_new(s, "locks-first/again", &locks[0]));
  OK(lk_lock_acquire(locks[0], 5000, NULL));
  lk_lock_free(locks[0]);
  lk_session_free(s);

  /* The default session: lk_lock_new's locks and the handle's share it. */
  struct lk_session *d, *d2;
  OK(lk_client_session(c, &d));
  OK(lk_client_session(c, &d2));
  struct lk_lock *x, *y;
  OK(lk_lock_new(c, "default/x", &x));
  OK(lk_session_lock_new(d, "default/y", &y));
  OK(lk_lock_acquire(x, 5000, NULL));
  OK(lk_lock_acquire(y, 5000, NULL));
  const int64_t dl = lease_of(d);
  CHECK(lease_of(d2) == dl);
  CHECK(stats_of(d2).locks == 2);
  /* The default session closes only with its client. */
  EXPECT(lk_session_close(d2), LK_INVALID_ARGUMENT);
  CHECK(strstr(lk_last_error(), "default session") != NULL);
  CHECK(state_of(x) == LK_STATE_HOLDING);
  lk_session_free(d2);
  lk_client_free(c); /* the handle and the locks keep the session */
  struct lk_lock *z;
  OK(lk_session_lock_new(d, "default/z", &z));
  OK(lk_lock_acquire(z, 5000, NULL));
  CHECK(lease_of(d) == dl);
  lk_session_free(d);
  CHECK(state_of(x) == LK_STATE_HOLDING && state_of(z) == LK_STATE_HOLDING);
  lk_lock_free(x);
  lk_lock_free(y);
  lk_lock_free(z);
  lk_memory_free(mem);
}

/* NULLs, unknown versions, bad options, bad names: refused with a
 * message, out-parameters untouched. */
static void bad_input(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_client_options o = short_options();
  struct lk_session *s = SENTINEL, *good;
  OK(lk_session_new(c, NULL, &good));
  struct lk_lock *l = SENTINEL;
  int64_t lease = 3;
  struct lk_session_stats st = LK_SESSION_STATS_INIT;

  EXPECT(lk_session_new(NULL, &o, &s), LK_NULL_PARAMETER);
  MESSAGE_HAS("client");
  EXPECT(lk_session_new(c, &o, NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("session_out");
  EXPECT(lk_client_session(NULL, &s), LK_NULL_PARAMETER);
  MESSAGE_HAS("client");
  EXPECT(lk_client_session(c, NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("session_out");
  EXPECT(lk_session_lock_new(NULL, "x", &l), LK_NULL_PARAMETER);
  MESSAGE_HAS("session");
  EXPECT(lk_session_lock_new(good, NULL, &l), LK_NULL_PARAMETER);
  MESSAGE_HAS("name");
  EXPECT(lk_session_lock_new(good, "x", NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("lock_out");
  EXPECT(lk_session_close(NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("session");
  EXPECT(lk_session_lease(NULL, &lease), LK_NULL_PARAMETER);
  EXPECT(lk_session_lease(good, NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("lease_out");
  EXPECT(lk_session_stats(NULL, &st), LK_NULL_PARAMETER);
  EXPECT(lk_session_stats(good, NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("stats_out");
  EXPECT(lk_memory_revoke_lease(NULL, 1, NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("memory");
  lk_session_free(NULL);

  /* Unknown options versions, broken timing rules. */
  struct lk_client_options bad = short_options();
  bad.version = 0;
  EXPECT(lk_session_new(c, &bad, &s), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("version");
  bad.version = LK_CLIENT_OPTIONS_VERSION + 1;
  EXPECT(lk_session_new(c, &bad, &s), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("version");
  bad = short_options();
  bad.ttl_ms = 1000;
  EXPECT(lk_session_new(c, &bad, &s), LK_INVALID_OPTION);
  MESSAGE_HAS("ttl");
  bad = short_options();
  bad.keepalive_timeout_ms = bad.keepalive_interval_ms;
  EXPECT(lk_session_new(c, &bad, &s), LK_INVALID_OPTION);
  MESSAGE_HAS("keepalive_timeout");
  bad = short_options();
  bad.retry_interval_ms = 0;
  EXPECT(lk_session_new(c, &bad, &s), LK_INVALID_OPTION);
  MESSAGE_HAS("retry_interval");
  /* The client's fields of the options are ignored: an etcd endpoint does
   * not make an embedded client's session an etcd one. */
  bad = short_options();
  bad.endpoints = "127.0.0.1:1";
  struct lk_session *ignored;
  OK(lk_session_new(c, &bad, &ignored));
  lk_session_free(ignored);

  /* Bad names, as lk_lock_new. */
  EXPECT(lk_session_lock_new(good, "", &l), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("lock name");
  EXPECT(lk_session_lock_new(good, "bad \xc3\x28 utf8", &l), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("UTF-8");

  /* Stats versions this library does not know: the struct untouched. */
  struct lk_session_stats untouched;
  memset(&untouched, 0x5a, sizeof untouched);
  untouched.version = 0;
  struct lk_session_stats copy = untouched;
  EXPECT(lk_session_stats(good, &untouched), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("version");
  CHECK(!memcmp(&untouched, &copy, sizeof copy));
  untouched.version = LK_SESSION_STATS_VERSION + 1;
  EXPECT(lk_session_stats(good, &untouched), LK_INVALID_ARGUMENT);

  EXPECT(lk_session_lease(good, &lease), LK_NOT_HELD);
  CHECK(s == SENTINEL && l == SENTINEL && lease == 3);

  lk_session_free(good);
  lk_client_free(c);
  lk_memory_free(mem);
}

int main(void) {
  bad_input();
  one_lease_for_many();
  revoke_fences_one_session();
  close_releases_all();
  free_orders();
  return finish("sessions");
}
