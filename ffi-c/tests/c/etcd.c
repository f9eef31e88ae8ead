/* The C face against a real etcd: the 3-member plaintext cluster and the TLS
 * member (mutual TLS + user/password, auth tokens that expire) of
 * scripts/etcd-cluster.sh, whose env file must be exported
 * (DLOCK_TEST_MEMBERS, DLOCK_TEST_TLS_ENDPOINT, DLOCK_TEST_CA, ...).
 * Run only by scripts/test-c-etcd.sh: without DLOCK_TEST_ETCD (the env
 * file's switch that says the cluster exists) it fails.
 *
 * Prints `etcd: written members|tls KEY VALUE` for the last guarded write on
 * each cluster; scripts/test-c-etcd.sh reads them back with etcdctl. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include "check.h"

/* The fault tests' settings, a little looser so a valgrind run keeps up. */
static struct lk_client_options etcd_options(const char *endpoints) {
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.ttl_ms = 6000;
  o.keepalive_interval_ms = 1000;
  o.keepalive_timeout_ms = 800;
  o.retry_interval_ms = 250;
  o.margin_ms = 1000;
  o.endpoints = endpoints;
  o.connect_timeout_ms = 2000;
  o.request_timeout_ms = 3000;
  return o;
}

static const char *need(const char *name) {
  const char *v = getenv(name);
  if (!v || !*v) {
    fprintf(stderr, "etcd: %s is not set (source target/etcd/env)\n", name);
    exit(1);
  }
  return v;
}

static char lock_name[96], data_key[112];

static int put(struct lk_lock *l, uint64_t token, const char *value) {
  return lk_lock_guarded_put(l, token, (const uint8_t *)data_key, strlen(data_key),
                             (const uint8_t *)value, strlen(value));
}

/* Two clients of the 3-member cluster on one name: tokens, waiting, and
 * guarded writes that only the live token gets through etcd. */
static void plaintext(const char *members) {
  struct lk_client_options o = etcd_options(members);
  struct lk_client *a, *b;
  OK(lk_client_new(&o, &a));
  OK(lk_client_new(&o, &b));
  struct lk_memory *m = NULL;
  EXPECT(lk_client_memory(a, &m), LK_INVALID_ARGUMENT); /* not embedded */
  EXPECT(lk_link_partition(a), LK_INVALID_ARGUMENT);
  struct lk_lock *la, *lb;
  OK(lk_lock_new(a, lock_name, &la));
  OK(lk_lock_new(b, lock_name, &lb));

  uint64_t ta = 0, tb = 0, u = 0;
  OK(lk_lock_acquire(la, 10000, &ta));
  CHECK(ta > 0); /* the lock key's create_revision */
  OK(lk_lock_token(la, &u));
  CHECK(u == ta);
  enum lk_state st;
  OK(lk_lock_state(la, &st));
  CHECK(st == LK_STATE_HOLDING);
  OK(lk_lock_time_left(la, &u));
  CHECK(u > 0 && u <= 6000);
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(la, &p));
  OK(lk_permit_token(&p, &u));
  CHECK(u == ta && lk_permit_valid(&p));
  OK(put(la, u, "by a"));
  lk_permit_end(&p);
  printf("etcd: a holds %s with token %" PRIu64 "; its guarded put committed\n", lock_name, ta);

  EXPECT(lk_lock_try_acquire(lb, &u), LK_WOULD_BLOCK);
  EXPECT(lk_lock_acquire(lb, 300, &u), LK_TIMEOUT);
  EXPECT(put(la, ta + 1000000, "not the token"), LK_FENCED);

  /* a releases; b, queued, takes over with a higher token. */
  OK(lk_lock_release(la));
  OK(lk_lock_acquire(lb, 10000, &tb));
  CHECK(tb > ta);
  EXPECT(put(la, ta, "stale"), LK_FENCED);
  MESSAGE_HAS("fenced");
  EXPECT(lk_lock_guarded_delete(la, ta, (const uint8_t *)data_key, strlen(data_key)), LK_FENCED);
  OK(put(lb, tb, "scratch"));
  OK(lk_lock_guarded_delete(lb, tb, (const uint8_t *)data_key, strlen(data_key)));
  OK(put(lb, tb, "by b"));
  printf("etcd: written members %s by b\n", data_key);
  printf("etcd: b holds it with token %" PRIu64 "; a's stale token %" PRIu64 " was refused\n", tb,
         ta);
  OK(lk_lock_release(lb));
  lk_lock_free(la);
  lk_lock_free(lb);
  lk_client_free(a);
  lk_client_free(b);
}

/* The TLS member: CA, client certificate and key, user and password. The
 * auth token expires every DLOCK_TEST_AUTH_TOKEN_TTL s: holding across it
 * and writing afterwards needs re-authentication. */
static void tls(void) {
  struct lk_client_options o = etcd_options(need("DLOCK_TEST_TLS_ENDPOINT"));
  o.ca_file = need("DLOCK_TEST_CA");
  o.cert_file = need("DLOCK_TEST_CERT");
  o.key_file = need("DLOCK_TEST_KEY");
  o.user = need("DLOCK_TEST_USER");
  o.password = need("DLOCK_TEST_PASSWORD");
  struct lk_client *c = (struct lk_client *)0x5e47;

  /* A wrong password, or no client certificate where the member asks for
   * one: no client, a message that names the endpoint (and the reason). */
  o.password = "wrong";
  EXPECT(lk_client_new(&o, &c), LK_BACKEND);
  MESSAGE_HAS("authentication failed");
  o.password = need("DLOCK_TEST_PASSWORD");
  o.cert_file = o.key_file = NULL;
  for (int i = 0; i < 5; i++) {
    /* TLS 1.3: the refusal shows as a bad-certificate alert or a broken
     * pipe, which must not raise SIGPIPE in this C process. */
    EXPECT(lk_client_new(&o, &c), LK_BACKEND);
    MESSAGE_HAS(need("DLOCK_TEST_TLS_ENDPOINT"));
  }
  CHECK(c == (struct lk_client *)0x5e47);
  o.cert_file = need("DLOCK_TEST_CERT");
  o.key_file = need("DLOCK_TEST_KEY");

  OK(lk_client_new(&o, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, lock_name, &l));
  uint64_t t = 0, u = 0;
  OK(lk_lock_acquire(l, 10000, &t));
  CHECK(t > 0);
  OK(put(l, t, "over tls"));
  long ttl = atol(getenv("DLOCK_TEST_AUTH_TOKEN_TTL") ? getenv("DLOCK_TEST_AUTH_TOKEN_TTL") : "3");
  sleep_ms((uint64_t)(ttl > 0 && ttl < 10 ? ttl : 3) * 1000 + 500);
  enum lk_state st;
  OK(lk_lock_state(l, &st));
  CHECK(st == LK_STATE_HOLDING);
  OK(lk_lock_token(l, &u));
  CHECK(u == t);
  OK(put(l, t, "after the auth token expired"));
  printf("etcd: written tls %s after the auth token expired\n", data_key);
  printf("etcd: the TLS member (mTLS + password) granted token %" PRIu64
         " and kept it past the auth token's expiry\n",
         t);
  OK(lk_lock_release(l));
  lk_lock_free(l);
  lk_client_free(c);
}

/* Read/write locks on the 3-member cluster: a writer excludes a reader;
 * its downgrade keeps the token and lets the reader share; a writer then
 * waits for both. */
static void rwlock(const char *members) {
  char name[128];
  snprintf(name, sizeof name, "%s-rw", lock_name);
  struct lk_client_options o = etcd_options(members);
  struct lk_client *a, *b;
  OK(lk_client_new(&o, &a));
  OK(lk_client_new(&o, &b));
  struct lk_rwlock *ra, *rb;
  OK(lk_rwlock_new(a, name, &ra));
  OK(lk_rwlock_new(b, name, &rb));
  struct lk_lock *w, *r, *w2;
  OK(lk_rwlock_writer(ra, &w));
  OK(lk_rwlock_reader(rb, &r));
  uint64_t tw = 0, tr = 0, u = 0;
  OK(lk_lock_acquire(w, 10000, &tw));
  EXPECT(lk_lock_try_acquire(r, NULL), LK_WOULD_BLOCK);
  OK(lk_lock_downgrade(w));
  enum lk_mode m = LK_MODE_NONE;
  OK(lk_lock_mode(w, &m));
  CHECK(m == LK_MODE_READ);
  OK(lk_lock_token(w, &u));
  CHECK(u == tw);
  OK(lk_lock_acquire(r, 10000, &tr));
  CHECK(tr > tw);
  struct lk_session *s;
  struct lk_rwlock *rs;
  OK(lk_session_new(a, &o, &s)); /* a session of its own: waits for the readers alone */
  OK(lk_session_rwlock_new(s, name, &rs));
  OK(lk_rwlock_writer(rs, &w2));
  EXPECT(lk_lock_try_acquire(w2, NULL), LK_WOULD_BLOCK);
  printf("etcd: rwlock %s: writer %" PRIu64 " downgraded, reader %" PRIu64 " shares\n", name, tw, tr);
  OK(lk_lock_release(r));
  OK(lk_lock_release(w));
  OK(lk_lock_try_acquire(w2, NULL)); /* both readers gone */
  OK(lk_lock_release(w2));
  lk_lock_free(w2);
  lk_lock_free(r);
  lk_lock_free(w);
  lk_rwlock_free(rs);
  lk_session_free(s);
  lk_rwlock_free(rb);
  lk_rwlock_free(ra);
  lk_client_free(a);
  lk_client_free(b);
}

/* DLOCK_ENDPOINTS switches lk_client_from_env to etcd. */
static void from_env(const char *members) {
  setenv("DLOCK_ENDPOINTS", members, 1);
  struct lk_client_options o = etcd_options(NULL);
  struct lk_client *c;
  OK(lk_client_from_env(&o, &c));
  struct lk_memory *m = NULL;
  EXPECT(lk_client_memory(c, &m), LK_INVALID_ARGUMENT); /* etcd, not embedded */
  struct lk_lock *l;
  OK(lk_lock_new(c, lock_name, &l));
  uint64_t t = 0;
  OK(lk_lock_acquire(l, 10000, &t));
  CHECK(t > 0);
  OK(lk_lock_release(l));
  lk_lock_free(l);
  lk_client_free(c);
  unsetenv("DLOCK_ENDPOINTS");
}

int main(void) {
  const char *present = getenv("DLOCK_TEST_ETCD");
  const char *members = getenv("DLOCK_TEST_MEMBERS");
  if (!present || !*present || !members || !*members) {
    fprintf(stderr, "etcd: no etcd test cluster (DLOCK_TEST_ETCD or DLOCK_TEST_MEMBERS unset: source target/etcd/env)\n");
    return 1;
  }
  /* A fresh name per run: the cluster outlives this process. */
  snprintf(lock_name, sizeof lock_name, "dlock-c-test/%ld-%" PRIu64, (long)getpid(), boot_ns());
  snprintf(data_key, sizeof data_key, "%s-data", lock_name);
  plaintext(members);
  rwlock(members);
  from_env(members);
  tls();
  return finish("etcd");
}
