/* Elections and observers through the C API (docs/elections.md): campaign,
 * proclaim and resign as an observer (pull form) sees them; resign waits
 * for the unit in flight before the next leader; the callback form (every
 * event in order, none after close or free, close from the callback); a
 * pull waiting across a close; a fenced leader refuses to proclaim; bad
 * input is one clear error each, nothing held. Embedded backend; every
 * wait is an event or a bounded poll of what the service reports. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

/* The default grace is the core's, as Python's RESIGN_GRACE and Node's RESIGN_GRACE_MS. */
_Static_assert(LK_RESIGN_GRACE_MS == 5000, "LK_RESIGN_GRACE_MS is the core's RESIGN_GRACE");

#define LIMIT_MS 15000

static const uint8_t *bytes(const char *s) { return (const uint8_t *)s; }

/* The observer's next event within LIMIT_MS; `l` (may be NULL) gets the leader. */
static enum lk_observed next(struct lk_observer *o, struct lk_leader *l) {
  enum lk_observed what = LK_OBSERVED_RECONNECTING;
  OK(lk_observer_next(o, LIMIT_MS, &what, l));
  return what;
}

static int value_is(const struct lk_leader *l, const char *v) {
  return l->has_leader && l->value_len == strlen(v) && memcmp(l->value, v, l->value_len) == 0;
}

static void campaign_proclaim_resign_as_observed(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true), *w = client_in(mem, true);
  struct lk_observer *obs;
  OK(lk_observer_new(w, "el/basic", &obs));
  struct lk_leader l = LK_LEADER_INIT;
  CHECK(next(obs, &l) == LK_OBSERVED_NO_LEADER); /* first: the current state */
  CHECK(!l.has_leader && l.value == NULL && l.key == NULL);

  struct lk_election *ea, *eb;
  OK(lk_election_new(a, "el/basic", &ea));
  OK(lk_election_new(b, "el/basic", &eb));
  const struct lk_lock *la = lk_election_lock(ea);
  CHECK(la != NULL && strcmp(lk_lock_name(la), "el/basic") == 0);
  uint64_t t1 = 0;
  OK(lk_election_campaign(ea, bytes("alpha"), 5, 5000, &t1));
  CHECK(t1 > 0);
  CHECK(next(obs, &l) == LK_OBSERVED_LEADER);
  CHECK(value_is(&l, "alpha") && l.token == t1 && l.lease != 0);
  char key[64];
  snprintf(key, sizeof key, "el/basic/%" PRIx64, (uint64_t)l.lease);
  CHECK(l.key != NULL && strcmp(l.key, key) == 0);

  /* The election's lock is a lock: permits carry the leader's token. */
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(la, &p));
  uint64_t pt = 0;
  OK(lk_permit_token(&p, &pt));
  CHECK(pt == t1);
  lk_permit_end(&p);
  uint64_t held = 0;
  OK(lk_lock_token(la, &held));
  CHECK(held == t1);

  /* A second candidate gives up after its timeout, holding nothing. */
  uint64_t u = 7;
  EXPECT(lk_election_campaign(eb, bytes("beta"), 4, 100, &u), LK_TIMEOUT);
  CHECK(u == 7);
  CHECK(state_of(lk_election_lock(eb)) == LK_STATE_IDLE);
  OK(lk_memory_holder(mem, "el/basic", &held));
  CHECK(held == t1);
  EXPECT(lk_election_proclaim(eb, bytes("beta"), 4), LK_NOT_HELD);

  /* Proclaim: the same token, a new value, seen by the observer and by a
   * read from the other candidate. */
  OK(lk_election_proclaim(ea, bytes("alpha-2"), 7));
  CHECK(next(obs, &l) == LK_OBSERVED_PROCLAIMED);
  CHECK(value_is(&l, "alpha-2") && l.token == t1);
  struct lk_leader r = LK_LEADER_INIT;
  OK(lk_election_leader(eb, &r));
  CHECK(value_is(&r, "alpha-2") && r.token == t1);

  /* Resign with nobody else campaigning: no leader; the resigned one is
   * refused permits and proclaims. */
  OK(lk_election_resign(ea, 1000));
  CHECK(next(obs, &l) == LK_OBSERVED_NO_LEADER);
  CHECK(!l.has_leader);
  EXPECT(lk_permit(la, &p), LK_RELEASED);
  EXPECT(lk_election_proclaim(ea, bytes("late"), 4), LK_NOT_HELD);
  OK(lk_election_leader(eb, &r)); /* filling again frees the last one */
  CHECK(!r.has_leader);

  /* b campaigns now: elected with a higher token. */
  uint64_t t2 = 0;
  OK(lk_election_campaign(eb, bytes("beta"), 4, 5000, &t2));
  CHECK(t2 > t1);
  CHECK(next(obs, &l) == LK_OBSERVED_LEADER);
  CHECK(value_is(&l, "beta") && l.token == t2);
  /* Empty values are fine (NULL with 0). */
  OK(lk_election_proclaim(eb, NULL, 0));
  CHECK(next(obs, &l) == LK_OBSERVED_PROCLAIMED);
  CHECK(l.has_leader && l.value_len == 0 && l.value == NULL && l.token == t2);

  /* Nothing waiting: a timeout, the leader struct untouched. */
  enum lk_observed what = LK_OBSERVED_LEADER;
  EXPECT(lk_observer_next(obs, 0, &what, &l), LK_TIMEOUT);
  CHECK(what == LK_OBSERVED_LEADER && l.has_leader && l.token == t2);
  lk_leader_clear(&l);
  lk_leader_clear(&r);
  CHECK(!l.has_leader && l.version == LK_LEADER_VERSION);

  lk_observer_free(obs);
  lk_election_free(ea);
  lk_election_free(eb);
  lk_client_free(a);
  lk_client_free(b);
  lk_client_free(w);
  lk_memory_free(mem);
}

/* The next candidate's campaign_start outcome. */
struct won {
  atomic_int done;
  atomic_int status;
  atomic_uint_fast64_t token;
  atomic_uint_fast64_t at_ns;
};

static void on_won(void *ud, enum lk_status status, uint64_t token) {
  struct won *w = ud;
  atomic_store(&w->status, (int)status);
  atomic_store(&w->token, token);
  atomic_store(&w->at_ns, boot_ns());
  atomic_store(&w->done, 1);
}

struct resigner {
  struct lk_election *e;
  uint64_t grace_ms;
  enum lk_status status;
  uint64_t at_ns;
};

static void *resign_thread(void *arg) {
  struct resigner *r = arg;
  r->status = lk_election_resign(r->e, r->grace_ms);
  r->at_ns = boot_ns();
  return NULL;
}

static void resign_waits_for_the_unit_in_flight(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true);
  struct lk_election *ea, *eb;
  OK(lk_election_new(a, "el/resign", &ea));
  OK(lk_election_new(b, "el/resign", &eb));
  uint64_t t1 = 0;
  OK(lk_election_campaign(ea, bytes("a"), 1, 5000, &t1));
  struct lk_permit unit = LK_PERMIT_INIT;
  OK(lk_permit(lk_election_lock(ea), &unit));

  static struct won won;
  atomic_init(&won.done, 0);
  atomic_init(&won.status, -1);
  atomic_init(&won.token, 0);
  atomic_init(&won.at_ns, 0);
  struct lk_acquisition *acq;
  OK(lk_election_campaign_start(eb, bytes("b"), 1, LIMIT_MS, on_won, &won, &acq));

  struct resigner r = {ea, 30000, LK_PANIC, 0};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, resign_thread, &r) == 0);
  /* The unit runs: the key stays, nobody else leads. */
  sleep_ms(400);
  CHECK(atomic_load(&won.done) == 0);
  uint64_t held = 0;
  OK(lk_memory_holder(mem, "el/resign", &held));
  CHECK(held == t1);
  const uint64_t ended = boot_ns();
  lk_permit_end(&unit);
  pthread_join(th, NULL);
  CHECK(r.status == LK_OK && r.at_ns >= ended);
  uint64_t until = boot_ns() + (uint64_t)LIMIT_MS * 1000000u;
  while (!atomic_load(&won.done) && boot_ns() < until) sleep_ms(5);
  CHECK(atomic_load(&won.status) == LK_OK);
  CHECK(atomic_load(&won.token) > t1);
  CHECK(atomic_load(&won.at_ns) >= ended);
  CHECK(state_of(lk_election_lock(ea)) == LK_STATE_RELEASED);

  /* The grace: the key goes at it with the unit still in flight. */
  OK(lk_permit(lk_election_lock(eb), &unit));
  const uint64_t start = boot_ns();
  OK(lk_election_resign(eb, 300));
  const uint64_t took_ms = (boot_ns() - start) / 1000000u;
  CHECK(took_ms >= 300);
  EXPECT(lk_memory_holder(mem, "el/resign", &held), LK_NOT_HELD);
  CHECK(!lk_permit_valid(&unit));
  lk_permit_end(&unit);

  lk_acquisition_free(acq);
  lk_election_free(ea);
  lk_election_free(eb);
  lk_client_free(a);
  lk_client_free(b);
  lk_memory_free(mem);
}

/* What a callback observer saw. */
#define MAX_SEEN 16
struct seen {
  pthread_mutex_t mu;
  int n;
  enum lk_observed what[MAX_SEEN];
  uint64_t token[MAX_SEEN];
  char value[MAX_SEEN][16];
  struct lk_observer *self; /* closes itself at event `close_at` (0: never) */
  int close_at;
};

static void on_observed(void *ud, enum lk_observed what, const struct lk_leader *l) {
  struct seen *s = ud;
  pthread_mutex_lock(&s->mu);
  int i = s->n < MAX_SEEN ? s->n++ : MAX_SEEN - 1;
  s->what[i] = what;
  s->token[i] = l ? l->token : 0;
  snprintf(s->value[i], sizeof s->value[i], "%.*s", l ? (int)l->value_len : 0,
           l && l->value ? (const char *)l->value : "");
  struct lk_observer *self = s->close_at && s->n == s->close_at ? s->self : NULL;
  pthread_mutex_unlock(&s->mu);
  if ((what == LK_OBSERVED_LEADER || what == LK_OBSERVED_PROCLAIMED) != (l != NULL)) {
    fprintf(stderr, "on_observed: event %d with leader %p\n", (int)what, (const void *)l);
    abort();
  }
  if (self) OK(lk_observer_close(self)); /* from its own callback */
}

static int seen_count(struct seen *s) {
  pthread_mutex_lock(&s->mu);
  int n = s->n;
  pthread_mutex_unlock(&s->mu);
  return n;
}

static int await_seen(struct seen *s, int n) {
  uint64_t until = boot_ns() + (uint64_t)LIMIT_MS * 1000000u;
  while (seen_count(s) < n) {
    if (boot_ns() > until) return 0;
    sleep_ms(5);
  }
  return 1;
}

static void callback_observers(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *w = client_in(mem, true);
  static struct seen s, t;
  pthread_mutex_init(&s.mu, NULL);
  pthread_mutex_init(&t.mu, NULL);
  struct lk_observer *obs, *closer;
  OK(lk_observer_start(w, "el/cb", on_observed, &s, &obs));
  t.close_at = 2;
  OK(lk_observer_start(w, "el/cb", on_observed, &t, &closer));
  pthread_mutex_lock(&t.mu);
  t.self = closer; /* used by the callback at its second event */
  pthread_mutex_unlock(&t.mu);
  CHECK(await_seen(&s, 1) && await_seen(&t, 1));

  struct lk_election *e;
  OK(lk_election_new(a, "el/cb", &e));
  uint64_t t1 = 0;
  OK(lk_election_campaign(e, bytes("one"), 3, 5000, &t1));
  CHECK(await_seen(&s, 2));
  OK(lk_election_proclaim(e, bytes("two"), 3));
  CHECK(await_seen(&s, 3));
  OK(lk_election_resign(e, 1000));
  CHECK(await_seen(&s, 4));
  pthread_mutex_lock(&s.mu);
  CHECK(s.n == 4);
  CHECK(s.what[0] == LK_OBSERVED_NO_LEADER);
  CHECK(s.what[1] == LK_OBSERVED_LEADER && s.token[1] == t1 && strcmp(s.value[1], "one") == 0);
  CHECK(s.what[2] == LK_OBSERVED_PROCLAIMED && s.token[2] == t1 &&
        strcmp(s.value[2], "two") == 0);
  CHECK(s.what[3] == LK_OBSERVED_NO_LEADER);
  pthread_mutex_unlock(&s.mu);
  /* The one that closed itself at its second event saw no third. (Each
   * observer delivers on its own: wait for its second, do not assume it
   * came before the other's fourth.) */
  CHECK(await_seen(&t, 2));
  CHECK(seen_count(&t) == 2);

  /* No pull on a callback observer. */
  enum lk_observed what;
  EXPECT(lk_observer_next(obs, 0, &what, NULL), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("callback");

  /* After free returns no callback runs: a campaign now is not seen. */
  lk_observer_free(obs);
  lk_observer_free(closer);
  OK(lk_election_campaign(e, bytes("three"), 5, 5000, NULL));
  sleep_ms(100);
  CHECK(seen_count(&s) == 4 && seen_count(&t) == 2);

  lk_election_free(e);
  lk_client_free(a);
  lk_client_free(w);
  lk_memory_free(mem);
  pthread_mutex_destroy(&s.mu);
  pthread_mutex_destroy(&t.mu);
}

struct puller {
  struct lk_observer *o;
  enum lk_status status;
};

static void *pull_thread(void *arg) {
  struct puller *p = arg;
  enum lk_observed what;
  p->status = lk_observer_next(p->o, UINT64_MAX, &what, NULL);
  return NULL;
}

/* A pull waiting with no limit returns LK_RELEASED at the close. */
static void close_ends_a_waiting_pull(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *w = client_in(mem, true);
  struct lk_observer *o;
  OK(lk_observer_new(w, "el/close", &o));
  CHECK(next(o, NULL) == LK_OBSERVED_NO_LEADER);
  struct puller p = {o, LK_PANIC};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, pull_thread, &p) == 0);
  sleep_ms(50);
  OK(lk_observer_close(o));
  pthread_join(th, NULL);
  CHECK(p.status == LK_RELEASED);
  enum lk_observed what;
  EXPECT(lk_observer_next(o, 0, &what, NULL), LK_RELEASED);
  OK(lk_observer_close(o)); /* twice: harmless */
  lk_observer_free(o);
  lk_client_free(w);
  lk_memory_free(mem);
}

static atomic_int fences;

static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  (void)ud;
  (void)token;
  (void)in_flight;
  atomic_fetch_add(&fences, 1);
}

/* Without recampaign a fenced leader stays fenced: proclaim refused. */
static void a_fenced_leader_cannot_proclaim(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, false);
  struct lk_election *e;
  OK(lk_election_new(a, "el/fenced", &e));
  atomic_init(&fences, 0);
  OK(lk_set_on_fence(lk_election_lock(e), on_fence, NULL));
  OK(lk_election_campaign(e, bytes("v1"), 2, 5000, NULL));
  OK(lk_link_declare_lease_lost(a));
  uint64_t until = boot_ns() + (uint64_t)LIMIT_MS * 1000000u;
  while (atomic_load(&fences) == 0 && boot_ns() < until) sleep_ms(5);
  CHECK(atomic_load(&fences) == 1);
  CHECK(state_of(lk_election_lock(e)) == LK_STATE_FENCED);
  EXPECT(lk_election_proclaim(e, bytes("v2"), 2), LK_FENCED);
  lk_election_free(e);
  lk_client_free(a);
  lk_memory_free(mem);
}

static void bad_input(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *c = client_in(mem, true);
  struct lk_election *e = NULL;
  EXPECT(lk_election_new(c, "", &e), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("name");
  CHECK(e == NULL);
  EXPECT(lk_election_new(NULL, "x", &e), LK_NULL_PARAMETER);
  EXPECT(lk_election_new(c, NULL, &e), LK_NULL_PARAMETER);
  EXPECT(lk_election_new(c, "x", NULL), LK_NULL_PARAMETER);
  struct lk_observer *o = NULL;
  EXPECT(lk_observer_new(c, "", &o), LK_INVALID_ARGUMENT);
  EXPECT(lk_observer_start(c, "x", NULL, NULL, &o), LK_NULL_PARAMETER);
  MESSAGE_HAS("cb");
  CHECK(o == NULL);
  CHECK(lk_election_lock(NULL) == NULL);
  lk_election_free(NULL);
  lk_observer_free(NULL);
  lk_leader_clear(NULL);

  OK(lk_election_new(c, "el/bad", &e));
  /* Over the core's limit (1 MiB: with the longest name it still fits
     etcd's request limit): refused before anything is put. */
  size_t big = 1536 * 1024;
  uint8_t *v = calloc(big, 1);
  CHECK(v != NULL);
  EXPECT(lk_election_campaign(e, v, big, 1000, NULL), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("at most 1048576 bytes");
  free(v);
  EXPECT(lk_election_campaign(e, NULL, 3, 1000, NULL), LK_NULL_PARAMETER);
  uint64_t held = 0;
  EXPECT(lk_memory_holder(mem, "el/bad", &held), LK_NOT_HELD);
  CHECK(state_of(lk_election_lock(e)) == LK_STATE_IDLE);
  EXPECT(lk_election_proclaim(e, bytes("v"), 1), LK_NOT_HELD);
  struct lk_leader l = LK_LEADER_INIT;
  l.version = 0;
  EXPECT(lk_election_leader(e, &l), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("LK_LEADER_INIT");
  EXPECT(lk_election_leader(e, NULL), LK_NULL_PARAMETER);
  lk_election_free(e);

  /* Campaign on a closed session; observe on a shut-down client. */
  struct lk_session *s;
  OK(lk_session_new(c, NULL, &s));
  OK(lk_session_election_new(s, "el/bad", &e));
  OK(lk_session_close(s));
  EXPECT(lk_election_campaign(e, bytes("v"), 1, 1000, NULL), LK_RELEASED);
  EXPECT(lk_memory_holder(mem, "el/bad", &held), LK_NOT_HELD);
  lk_election_free(e);
  lk_session_free(s);
  struct lk_client *gone = client_in(mem, true);
  OK(lk_client_shutdown(gone));
  EXPECT(lk_observer_new(gone, "el/bad", &o), LK_SHUTDOWN);
  lk_client_free(gone);
  lk_client_free(c);
  lk_memory_free(mem);
}

int main(void) {
  bad_input();
  campaign_proclaim_resign_as_observed();
  resign_waits_for_the_unit_in_flight();
  callback_observers();
  close_ends_a_waiting_pull();
  a_fenced_leader_cannot_proclaim();
  return finish("election");
}
