/* The API surface: names, options, NULL and bad arguments for every
 * function, out-parameters untouched on failure, the lock and permit life
 * cycle, double ends and NULL frees, the fence gate, the embedded service. */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "check.h"

#define SENTINEL ((void *)0x5e47)

static void names(void) {
  CHECK(!strcmp(lk_status_name(LK_OK), "ok"));
  CHECK(!strcmp(lk_status_name(LK_DRAINING), "draining"));
  CHECK(!strcmp(lk_status_name(LK_FENCED), "fenced"));
  CHECK(!strcmp(lk_status_name(LK_RELEASED), "released"));
  CHECK(!strcmp(lk_status_name(LK_NOT_HELD), "not_held"));
  CHECK(!strcmp(lk_status_name(LK_TIMEOUT), "timeout"));
  CHECK(!strcmp(lk_status_name(LK_WOULD_BLOCK), "would_block"));
  CHECK(!strcmp(lk_status_name(LK_ALREADY_HELD), "already_held"));
  CHECK(!strcmp(lk_status_name(LK_INVALID_OPTION), "invalid_option"));
  CHECK(!strcmp(lk_status_name(LK_INVALID_ARGUMENT), "invalid_argument"));
  CHECK(!strcmp(lk_status_name(LK_NULL_PARAMETER), "null_parameter"));
  CHECK(!strcmp(lk_status_name(LK_BACKEND), "backend"));
  CHECK(!strcmp(lk_status_name(LK_SHUTDOWN), "shutdown"));
  CHECK(!strcmp(lk_status_name(LK_FORKED), "forked"));
  CHECK(!strcmp(lk_status_name(LK_STALE), "stale"));
  CHECK(!strcmp(lk_status_name(LK_PANIC), "panic"));
  CHECK(!strcmp(lk_status_name(-1), "unknown"));
  CHECK(!strcmp(lk_status_name(16), "unknown"));
  CHECK(!strcmp(lk_status_name(1 << 30), "unknown"));
  CHECK(!strcmp(lk_state_name(LK_STATE_HOLDING), "Holding"));
  CHECK(!strcmp(lk_state_name(LK_STATE_REACQUIRING), "Reacquiring"));
  CHECK(!strcmp(lk_state_name(7), "unknown"));
  CHECK(!strcmp(lk_state_name(-3), "unknown"));
  CHECK(!strcmp(lk_reason_name(LK_REASON_KEEPALIVE_TIMEOUT), "keepalive_timeout"));
  CHECK(!strcmp(lk_reason_name(LK_REASON_ACQUIRE_FAILED), "acquire_failed"));
  CHECK(!strcmp(lk_reason_name(LK_REASON_LOCK_LOST), "lock_lost"));
  CHECK(LK_REASON_LOCK_LOST == 13);
  CHECK(!strcmp(lk_reason_name(14), "unknown"));
  CHECK(!strcmp(lk_reason_name(LK_REASON_OTHER), "unknown"));
  CHECK(!strcmp(lk_reason_name(-1), "unknown"));
  CHECK(lk_version() && strlen(lk_version()) > 0);
  CHECK(lk_last_error() != NULL);
}

static void options(void) {
  struct lk_client_options macro = LK_CLIENT_OPTIONS_INIT, fn;
  memset(&fn, 0xa5, sizeof fn);
  OK(lk_client_options_init(&fn, LK_CLIENT_OPTIONS_VERSION));
  CHECK(fn.version == macro.version && macro.version == LK_CLIENT_OPTIONS_VERSION);
  /* Timing left out: the core derives it (design §14). */
  CHECK(fn.ttl_ms == macro.ttl_ms && fn.ttl_ms == LK_UNSET_MS);
  CHECK(fn.keepalive_interval_ms == macro.keepalive_interval_ms);
  CHECK(fn.keepalive_timeout_ms == macro.keepalive_timeout_ms);
  CHECK(fn.retry_interval_ms == macro.retry_interval_ms);
  CHECK(fn.margin_ms == macro.margin_ms);
  CHECK(fn.reacquire == macro.reacquire && fn.reacquire);
  CHECK(!fn.endpoints && !fn.ca_file && !fn.cert_file && !fn.key_file && !fn.user &&
        !fn.password && !fn.memory && !fn.description && !fn.face);
  CHECK(fn.allow_plaintext_password == macro.allow_plaintext_password);
  CHECK(fn.connect_timeout_ms == macro.connect_timeout_ms);
  CHECK(fn.request_timeout_ms == macro.request_timeout_ms);

  /* Unknown versions: refused, the struct untouched. */
  struct lk_client_options untouched;
  memset(&untouched, 0x5a, sizeof untouched);
  struct lk_client_options copy = untouched;
  EXPECT(lk_client_options_init(&untouched, 0), LK_INVALID_ARGUMENT);
  EXPECT(lk_client_options_init(&untouched, LK_CLIENT_OPTIONS_VERSION + 1), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("version");
  CHECK(!memcmp(&untouched, &copy, sizeof copy));
  EXPECT(lk_client_options_init(NULL, LK_CLIENT_OPTIONS_VERSION), LK_NULL_PARAMETER);
  MESSAGE_HAS("opts");

  /* A bad setting names itself; the out-parameter stays as it was. */
  struct lk_client *client = SENTINEL;
  struct lk_client_options bad = LK_CLIENT_OPTIONS_INIT;
  bad.ttl_ms = 1000;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_OPTION);
  MESSAGE_HAS("ttl");
  CHECK(client == SENTINEL);
  bad = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  bad.keepalive_interval_ms = 2000;
  bad.keepalive_timeout_ms = 2000;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_OPTION);
  MESSAGE_HAS("keepalive_timeout");
  MESSAGE_HAS("keepalive_interval");
  bad = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  bad.retry_interval_ms = 0;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_OPTION);
  MESSAGE_HAS("retry_interval");
  bad = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  bad.version = 99;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_ARGUMENT);
  EXPECT(lk_client_from_env(&bad, &client), LK_INVALID_ARGUMENT);
  bad = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  bad.endpoints = "\xff\xfe";
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("endpoints");
  bad.endpoints = "127.0.0.1:1";
  bad.ca_file = "\xff";
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("ca_file");
  /* Nothing listens on port 1: no client, a backend error. */
  bad.ca_file = NULL;
  bad.connect_timeout_ms = 300;
  bad.request_timeout_ms = 300;
  EXPECT(lk_client_new(&bad, &client), LK_BACKEND);
  CHECK(client == SENTINEL);

  bad = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  bad.ttl_ms = UINT64_MAX - 1;
  bad.margin_ms = UINT64_MAX - 1;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_OPTION);
  bad = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  bad.keepalive_interval_ms = 0;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_OPTION);
  MESSAGE_HAS("keepalive_interval");
  CHECK(client == SENTINEL);

  /* NULL options: the embedded service with the defaults. */
  OK(lk_client_new(NULL, &client));
  CHECK(client != SENTINEL && client != NULL);
  lk_client_free(client);

  /* Settings left out follow the given ones: a 6 s TTL with a 2 s
   * interval needs no keepalive timeout of its own. */
  struct lk_client_options derived = LK_CLIENT_OPTIONS_INIT;
  derived.ttl_ms = 6000;
  derived.keepalive_interval_ms = 2000;
  client = SENTINEL;
  OK(lk_client_new(&derived, &client));
  CHECK(client != SENTINEL && client != NULL);
  lk_client_free(client);
}

/* Every function with a NULL for each required pointer. */
static void nulls(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_client_options o = short_options();
  struct lk_lock *l;
  OK(lk_lock_new(c, "nulls", &l));
  struct lk_fence_gate *g;
  OK(lk_fence_gate_new(&g));
  uint64_t u = 7;
  enum lk_state st;
  struct lk_permit p = LK_PERMIT_INIT;

  EXPECT(lk_client_new(&o, NULL), LK_NULL_PARAMETER);
  MESSAGE_HAS("client_out");
  EXPECT(lk_client_from_env(&o, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_memory_new(NULL), LK_NULL_PARAMETER);
  EXPECT(lk_memory_named(NULL, &mem), LK_NULL_PARAMETER);
  MESSAGE_HAS("name");
  EXPECT(lk_memory_named("x", NULL), LK_NULL_PARAMETER);
  EXPECT(lk_client_memory(NULL, &mem), LK_NULL_PARAMETER);
  EXPECT(lk_client_memory(c, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_memory_freeze_expiry(NULL, true), LK_NULL_PARAMETER);
  EXPECT(lk_memory_holder(NULL, "x", &u), LK_NULL_PARAMETER);
  EXPECT(lk_memory_holder(mem, NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_memory_holder(mem, "x", NULL), LK_NULL_PARAMETER);
  EXPECT(lk_link_partition(NULL), LK_NULL_PARAMETER);
  EXPECT(lk_link_heal(NULL), LK_NULL_PARAMETER);
  EXPECT(lk_link_drop_keepalive_replies(NULL, true), LK_NULL_PARAMETER);
  EXPECT(lk_link_delay_keepalive_replies(NULL, 1), LK_NULL_PARAMETER);
  EXPECT(lk_link_fail_keepalives(NULL, "x"), LK_NULL_PARAMETER);
  EXPECT(lk_link_declare_lease_lost(NULL), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_new(NULL), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_admit(NULL, "x", 1), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_admit(g, NULL, 1), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_highest(NULL, "x", &u), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_highest(g, NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_fence_gate_highest(g, "x", NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_new(NULL, "x", &l), LK_NULL_PARAMETER);
  EXPECT(lk_lock_new(c, NULL, &l), LK_NULL_PARAMETER);
  EXPECT(lk_lock_new(c, "x", NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_acquire(NULL, 10, &u), LK_NULL_PARAMETER);
  EXPECT(lk_lock_try_acquire(NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_lock_release(NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_state(NULL, &st), LK_NULL_PARAMETER);
  EXPECT(lk_lock_state(l, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_token(NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_lock_token(l, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_time_left(NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_lock_time_left(l, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_deadline(NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_lock_deadline(l, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_lock_in_flight(NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_lock_in_flight(l, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_set_on_fence(NULL, NULL, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_set_on_state_change(NULL, NULL, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_set_on_acquired(NULL, NULL, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_set_on_drained(NULL, NULL, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_permit(NULL, &p), LK_NULL_PARAMETER);
  EXPECT(lk_permit(l, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_permit_token(NULL, &u), LK_NULL_PARAMETER);
  EXPECT(lk_permit_token(&p, NULL), LK_NULL_PARAMETER);
  CHECK(!lk_permit_valid(NULL));
  EXPECT(lk_lock_guarded_put(NULL, 1, (const uint8_t *)"k", 1, NULL, 0), LK_NULL_PARAMETER);
  EXPECT(lk_lock_guarded_put(l, 1, NULL, 1, NULL, 0), LK_NULL_PARAMETER);
  EXPECT(lk_lock_guarded_put(l, 1, (const uint8_t *)"k", 1, NULL, 3), LK_NULL_PARAMETER);
  MESSAGE_HAS("value");
  EXPECT(lk_lock_guarded_delete(NULL, 1, (const uint8_t *)"k", 1), LK_NULL_PARAMETER);
  EXPECT(lk_lock_guarded_delete(l, 1, NULL, 1), LK_NULL_PARAMETER);
  EXPECT(lk_memory_delete_lock_key(NULL, "x"), LK_NULL_PARAMETER);
  EXPECT(lk_memory_delete_lock_key(mem, NULL), LK_NULL_PARAMETER);
  size_t len = 7;
  bool found = true;
  uint8_t buf[4];
  EXPECT(lk_memory_get(NULL, (const uint8_t *)"k", 1, buf, 4, &len, &found), LK_NULL_PARAMETER);
  EXPECT(lk_memory_get(mem, NULL, 1, buf, 4, &len, &found), LK_NULL_PARAMETER);
  EXPECT(lk_memory_get(mem, (const uint8_t *)"k", 1, NULL, 4, &len, &found), LK_NULL_PARAMETER);
  MESSAGE_HAS("buf");
  EXPECT(lk_memory_get(mem, (const uint8_t *)"k", 1, buf, 4, NULL, &found), LK_NULL_PARAMETER);
  EXPECT(lk_memory_get(mem, (const uint8_t *)"k", 1, buf, 4, &len, NULL), LK_NULL_PARAMETER);
  CHECK(len == 7 && found);
  CHECK(lk_lock_name(NULL) == NULL);
  CHECK(!strcmp(lk_lock_name(l), "nulls"));
  CHECK(u == 7); /* no out-parameter was written */

  /* NULL frees and ends do nothing. */
  lk_client_free(NULL);
  lk_lock_free(NULL);
  lk_memory_free(NULL);
  lk_fence_gate_free(NULL);
  lk_permit_end(NULL);

  lk_fence_gate_free(g);
  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(mem);
}

static void bad_arguments(void) {
  struct lk_client *c;
  OK(lk_client_new(NULL, &c));
  struct lk_lock *l = SENTINEL;
  EXPECT(lk_lock_new(c, "", &l), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("lock name");
  EXPECT(lk_lock_new(c, "bad \xc3\x28 utf8", &l), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("UTF-8");
  char *long_name = malloc(1026);
  memset(long_name, 'n', 1025);
  long_name[1025] = 0;
  EXPECT(lk_lock_new(c, long_name, &l), LK_INVALID_ARGUMENT);
  long_name[1024] = 0;
  CHECK(l == SENTINEL);
  OK(lk_lock_new(c, long_name, &l)); /* 1024 bytes is the limit */
  lk_lock_free(l);
  free(long_name);
  /* A client from the environment with DLOCK_ENDPOINTS unset is embedded,
   * and has the embedded link's fault switches like any other. */
  struct lk_memory *m = SENTINEL;
  unsetenv("DLOCK_ENDPOINTS");
  struct lk_client *env = NULL;
  OK(lk_client_from_env(NULL, &env));
  CHECK(env != NULL);
  OK(lk_link_partition(env));
  OK(lk_link_heal(env));
  OK(lk_client_memory(env, &m));
  CHECK(m != SENTINEL && m != NULL);
  lk_memory_free(m);
  lk_client_free(env);
  /* The environment's etcd settings are checked before any connection. */
  env = SENTINEL;
  setenv("DLOCK_ENDPOINTS", "nohost", 1);
  EXPECT(lk_client_from_env(NULL, &env), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("DLOCK_ENDPOINTS");
  setenv("DLOCK_ENDPOINTS", "127.0.0.1:1", 1);
  setenv("DLOCK_USER", "root", 1);
  setenv("DLOCK_PASSWORD", "secret", 1);
  EXPECT(lk_client_from_env(NULL, &env), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("plaintext");
  setenv("DLOCK_CONNECT_TIMEOUT_MS", "soon", 1);
  EXPECT(lk_client_from_env(NULL, &env), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("DLOCK_CONNECT_TIMEOUT_MS");
  CHECK(env == SENTINEL);
  unsetenv("DLOCK_CONNECT_TIMEOUT_MS");
  unsetenv("DLOCK_USER");
  unsetenv("DLOCK_PASSWORD");
  unsetenv("DLOCK_ENDPOINTS");
  EXPECT(lk_memory_named("\xff", &m), LK_INVALID_ARGUMENT);
  EXPECT(lk_link_fail_keepalives(c, "\xff"), LK_INVALID_ARGUMENT);
  lk_client_free(c);
}

static void life_cycle(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true);
  struct lk_lock *la, *lb;
  OK(lk_lock_new(a, "jobs", &la));
  OK(lk_lock_new(b, "jobs", &lb));

  enum lk_state st = LK_STATE_RELEASED;
  uint64_t u = 99;
  OK(lk_lock_state(la, &st));
  CHECK(st == LK_STATE_IDLE);
  EXPECT(lk_lock_token(la, &u), LK_NOT_HELD);
  EXPECT(lk_lock_time_left(la, &u), LK_NOT_HELD);
  EXPECT(lk_lock_deadline(la, &u), LK_NOT_HELD);
  CHECK(u == 99);
  struct lk_permit p = LK_PERMIT_INIT;
  EXPECT(lk_permit(la, &p), LK_NOT_HELD);
  EXPECT(lk_permit_token(&p, &u), LK_INVALID_ARGUMENT);
  CHECK(!lk_permit_valid(&p));
  lk_permit_end(&p); /* never granted: nothing */

  uint64_t token = 0;
  OK(lk_lock_acquire(la, UINT64_MAX, &token)); /* no overflow: waits "for ever" */
  CHECK(token == 1);
  OK(lk_lock_state(la, &st));
  CHECK(st == LK_STATE_HOLDING);
  OK(lk_lock_token(la, &u));
  CHECK(u == 1);
  OK(lk_lock_time_left(la, &u));
  CHECK(u > 0 && u <= 1500);
  OK(lk_lock_deadline(la, &u));
  CHECK(u > boot_ns() && u <= boot_ns() + 1500000000u);
  OK(lk_memory_holder(mem, "jobs", &u));
  CHECK(u == 1);
  EXPECT(lk_lock_acquire(la, 100, NULL), LK_ALREADY_HELD);
  EXPECT(lk_lock_try_acquire(lb, &u), LK_WOULD_BLOCK);
  EXPECT(lk_lock_acquire(lb, 100, &u), LK_TIMEOUT);
  CHECK(u == 1);

  OK(lk_permit(la, &p));
  struct lk_permit q = LK_PERMIT_INIT;
  OK(lk_permit(la, &q));
  OK(lk_lock_in_flight(la, &u));
  CHECK(u == 2);
  OK(lk_permit_token(&p, &u));
  CHECK(u == 1);
  CHECK(lk_permit_valid(&p));
  lk_permit_end(&p);
  lk_permit_end(&p); /* a double end is guarded */
  OK(lk_lock_in_flight(la, &u));
  CHECK(u == 1);
  CHECK(!lk_permit_valid(&p));
  EXPECT(lk_permit_token(&p, &u), LK_INVALID_ARGUMENT);

  OK(lk_lock_release(la));
  CHECK(!lk_permit_valid(&q)); /* release invalidates permits in flight */
  lk_permit_end(&q);
  EXPECT(lk_permit(la, &p), LK_RELEASED);
  OK(lk_lock_state(la, &st));
  CHECK(st == LK_STATE_RELEASED);
  EXPECT(lk_memory_holder(mem, "jobs", &u), LK_NOT_HELD);
  OK(lk_lock_try_acquire(lb, &u));
  /* Higher than a's; b's refused tries above took revisions of their own
   * (a key put and deleted, as on etcd). */
  CHECK(u > 1);
  const uint64_t b_token = u;
  EXPECT(lk_lock_acquire(la, 50, NULL), LK_TIMEOUT); /* b holds it now */

  /* A guarded write with a dead token (1; b holds a higher one) never commits. */
  EXPECT(lk_lock_guarded_put(lb, 1, (const uint8_t *)"k", 1, (const uint8_t *)"v", 1), LK_FENCED);
  MESSAGE_HAS("token 1");
  EXPECT(lk_lock_guarded_delete(lb, 1, (const uint8_t *)"k", 1), LK_FENCED);

  /* The client's service is the one given; its handle is a new one. */
  struct lk_memory *seen;
  OK(lk_client_memory(b, &seen));
  OK(lk_memory_holder(seen, "jobs", &u));
  CHECK(u == b_token);
  lk_memory_free(seen);

  lk_lock_free(la);
  lk_lock_free(lb);
  lk_client_free(a); /* clients after locks, or before: both are fine */
  lk_client_free(b);
  lk_memory_free(mem);
}

/* etcd settings that break a rule: refused before any connection, with a
 * message that names the rule; the out-parameter untouched. */
static void etcd_options(void) {
  struct lk_client *client = SENTINEL;
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  const char *bad_endpoints[] = {"", " , ", "nohost", "host:0", "host:70000", "ftp://h:1",
                                 "h:1/path", "::1:2379", "user@h:1", "a:1,,b:2"};
  for (size_t i = 0; i < sizeof bad_endpoints / sizeof *bad_endpoints; i++) {
    o.endpoints = bad_endpoints[i];
    EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
    MESSAGE_HAS("endpoint");
  }

  o = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  o.endpoints = "https://127.0.0.1:1";
  o.ca_file = "/ca.pem";
  o.cert_file = "/cert.pem"; /* a certificate without its key */
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("key file");
  o.cert_file = NULL;
  o.key_file = "/key.pem"; /* a key without its certificate */
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("certificate file");
  o.key_file = NULL;
  o.ca_file = NULL; /* https needs a CA file */
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("CA file");
  o.ca_file = "/ca.pem";
  o.endpoints = "https://127.0.0.1:1,http://127.0.0.1:2";
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("plain http");
  o.endpoints = "https://127.0.0.1:1";
  o.ca_file = "/nonexistent/ca.pem"; /* files are read when connecting */
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("/nonexistent/ca.pem");

  o = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  o.endpoints = "127.0.0.1:1";
  o.user = "root";
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("password");
  o.password = "secret"; /* over plaintext, not allowed */
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("plaintext");
  o.user = "\xff";
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("user");
  o.user = "root";

  o.allow_plaintext_password = true;
  o.connect_timeout_ms = 0;
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("connect_timeout");
  o.connect_timeout_ms = 300;
  o.request_timeout_ms = 0;
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("request_timeout");
  /* Allowed and well formed: nothing listens on port 1, a backend error
   * naming the endpoint. */
  o.request_timeout_ms = 300;
  EXPECT(lk_client_new(&o, &client), LK_BACKEND);
  MESSAGE_HAS("127.0.0.1:1");
  CHECK(client == SENTINEL);

  /* A PostgreSQL URL in `endpoints`: the core picks PostgreSQL (nothing
   * listens on port 1: a backend error naming PostgreSQL, not an etcd
   * scheme error); settings that do not fit it are refused first. */
  o = (struct lk_client_options)LK_CLIENT_OPTIONS_INIT;
  o.endpoints = "postgresql://dlock@127.0.0.1:1/db";
  o.connect_timeout_ms = 300;
  EXPECT(lk_client_new(&o, &client), LK_BACKEND);
  MESSAGE_HAS("PostgreSQL at 127.0.0.1:1");
  o.cert_file = "/cert.pem";
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("cert_file");
  o.cert_file = NULL;
  o.endpoints = "127.0.0.1:2379,postgres://h/db";
  EXPECT(lk_client_new(&o, &client), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("PostgreSQL URL");
  CHECK(client == SENTINEL);
}

/* Guarded writes on the embedded service: the live token commits (read back
 * with lk_memory_get), a dead one is refused with LK_FENCED. */
static void guarded_writes(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true);
  struct lk_lock *la, *lb;
  OK(lk_lock_new(a, "orders", &la));
  OK(lk_lock_new(b, "orders", &lb));
  uint64_t ta, tb;
  OK(lk_lock_acquire(la, 5000, &ta));

  const uint8_t *key = (const uint8_t *)"orders-data/last";
  size_t klen = strlen((const char *)key), len = 99;
  bool found = true;
  char buf[32];
  OK(lk_memory_get(mem, key, klen, NULL, 0, &len, &found));
  CHECK(!found && len == 0);
  OK(lk_lock_guarded_put(la, ta, key, klen, (const uint8_t *)"first", 5));
  memset(buf, 0, sizeof buf);
  OK(lk_memory_get(mem, key, klen, (uint8_t *)buf, sizeof buf, &len, &found));
  CHECK(found && len == 5 && !memcmp(buf, "first", 5));
  memset(buf, 0, sizeof buf);
  OK(lk_memory_get(mem, key, klen, (uint8_t *)buf, 3, &len, &found)); /* cut short */
  CHECK(found && len == 5 && !memcmp(buf, "fir", 3) && buf[3] == 0);
  OK(lk_lock_guarded_put(la, ta, key, klen, NULL, 0)); /* an empty value */
  OK(lk_memory_get(mem, key, klen, NULL, 0, &len, &found));
  CHECK(found && len == 0);
  OK(lk_lock_guarded_delete(la, ta, key, klen));
  OK(lk_memory_get(mem, key, klen, NULL, 0, &len, &found));
  CHECK(!found);
  OK(lk_lock_guarded_put(la, ta, key, klen, (const uint8_t *)"by a", 4));
  EXPECT(lk_lock_guarded_put(la, ta, key, 0, (const uint8_t *)"x", 1), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("empty key");
  EXPECT(lk_lock_guarded_put(la, ta + 1, key, klen, (const uint8_t *)"x", 1), LK_FENCED);
  /* The lock's own key prefix: a key there would wedge the lock. */
  EXPECT(lk_lock_guarded_put(la, ta, (const uint8_t *)"orders/x", 8, (const uint8_t *)"x", 1),
         LK_INVALID_ARGUMENT);
  MESSAGE_HAS("prefix");
  /* A live token through a handle that does not hold it. */
  EXPECT(lk_lock_guarded_put(lb, ta, key, klen, (const uint8_t *)"x", 1), LK_FENCED);

  /* a releases, b takes over: a's token is dead, b's commits. */
  OK(lk_lock_release(la));
  OK(lk_lock_acquire(lb, 5000, &tb));
  CHECK(tb > ta);
  EXPECT(lk_lock_guarded_put(la, ta, key, klen, (const uint8_t *)"stale", 5), LK_FENCED);
  MESSAGE_HAS("fenced");
  EXPECT(lk_lock_guarded_delete(la, ta, key, klen), LK_FENCED);
  OK(lk_memory_get(mem, key, klen, (uint8_t *)buf, sizeof buf, &len, &found));
  CHECK(found && len == 4 && !memcmp(buf, "by a", 4));
  OK(lk_lock_guarded_put(lb, tb, key, klen, (const uint8_t *)"by b", 4));
  OK(lk_memory_get(mem, key, klen, (uint8_t *)buf, sizeof buf, &len, &found));
  CHECK(found && len == 4 && !memcmp(buf, "by b", 4));

  lk_lock_free(la);
  lk_lock_free(lb);
  lk_client_free(a);
  lk_client_free(b);
  lk_memory_free(mem);
}

struct lost {
  atomic_uint_fast64_t fenced_token;
  atomic_int fence_reason; /* the reason of the transition to Fenced */
  atomic_uint_fast64_t reacquired_token;
};

static void lost_on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  (void)in_flight;
  atomic_store(&((struct lost *)ud)->fenced_token, token);
}

static void lost_on_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  (void)from;
  if (to == LK_STATE_FENCED) atomic_store(&((struct lost *)ud)->fence_reason, (int)why);
}

static void lost_on_acquired(void *ud, uint64_t token) {
  atomic_store(&((struct lost *)ud)->reacquired_token, token);
}

/* An operator deletes the lock key while the lease lives: the holder fences
 * at once with LK_REASON_LOCK_LOST (not at its deadline) and reacquires with
 * a higher token. */
static void lock_lost(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_lock *l;
  OK(lk_lock_new(c, "lost", &l));
  struct lost seen = {0, -1, 0};
  OK(lk_set_on_fence(l, lost_on_fence, &seen));
  OK(lk_set_on_state_change(l, lost_on_state, &seen));
  uint64_t token;
  OK(lk_set_on_acquired(l, lost_on_acquired, &seen));
  OK(lk_lock_acquire(l, 5000, &token));
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(l, &p));

  uint64_t cut = boot_ns();
  OK(lk_memory_delete_lock_key(mem, "lost"));
  while ((!atomic_load(&seen.fenced_token) || atomic_load(&seen.fence_reason) < 0) &&
         boot_ns() - cut < 3000000000u)
    sleep_ms(5);
  uint64_t took_ms = (boot_ns() - cut) / 1000000u;
  CHECK(atomic_load(&seen.fenced_token) == token);
  CHECK(atomic_load(&seen.fence_reason) == LK_REASON_LOCK_LOST);
  /* At once: well before the deadline (TTL 2 s - margin 0.5 s), which
   * keepalives would keep pushing back anyway. */
  CHECK(took_ms < 1000);
  CHECK(!lk_permit_valid(&p));
  lk_permit_end(&p);
  EXPECT(lk_lock_guarded_put(l, token, (const uint8_t *)"k", 1, (const uint8_t *)"v", 1), LK_FENCED);

  while (atomic_load(&seen.reacquired_token) <= token && boot_ns() - cut < 5000000000u) sleep_ms(5);
  uint64_t again = atomic_load(&seen.reacquired_token);
  CHECK(again > token);
  uint64_t held = 0;
  OK(lk_memory_holder(mem, "lost", &held));
  CHECK(held == again);
  OK(lk_lock_release(l));
  EXPECT(lk_memory_delete_lock_key(mem, "lost"), LK_NOT_HELD);
  MESSAGE_HAS("lost");

  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* The driver thread, where all network I/O runs, blocks SIGPIPE: a peer
 * closing a socket mid-write must not kill a C host, which (unlike a Rust
 * program) keeps SIGPIPE's default action. Read from /proc: the thread named
 * dlock-driver has SIGPIPE in its blocked set; this thread does not. */
static int sigpipe_blocked(const char *status_path) {
  FILE *f = fopen(status_path, "r");
  if (!f) return -1;
  char line[256];
  int blocked = -1;
  while (fgets(line, sizeof line, f)) {
    unsigned long long mask;
    if (sscanf(line, "SigBlk: %llx", &mask) == 1) blocked = (mask >> (SIGPIPE - 1)) & 1;
  }
  fclose(f);
  return blocked;
}

static void driver_blocks_sigpipe(void) {
  struct lk_client *c;
  OK(lk_client_new(NULL, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, "api/sigpipe", &l)); /* the driver thread runs from here on */
  int found = 0;
  DIR *tasks = opendir("/proc/self/task");
  CHECK(tasks != NULL);
  struct dirent *t;
  while (tasks && (t = readdir(tasks))) {
    if (t->d_name[0] == '.') continue;
    char path[300], comm[64] = "";
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", t->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    if (!fgets(comm, sizeof comm, f)) comm[0] = 0;
    fclose(f);
    if (strncmp(comm, "dlock-driver", 12)) continue;
    found = 1;
    snprintf(path, sizeof path, "/proc/self/task/%s/status", t->d_name);
    CHECK(sigpipe_blocked(path) == 1);
  }
  if (tasks) closedir(tasks);
  CHECK(found);
  CHECK(sigpipe_blocked("/proc/thread-self/status") == 0); /* the application's own thread */
  lk_lock_free(l);
  lk_client_free(c);
}

static void shared_service(void) {
  /* A client with no `memory` uses the process-wide service "". */
  struct lk_client *c;
  OK(lk_client_new(NULL, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, "api/shared", &l));
  uint64_t token, seen;
  OK(lk_lock_acquire(l, 5000, &token));
  struct lk_memory *shared;
  OK(lk_memory_named("", &shared));
  OK(lk_memory_holder(shared, "api/shared", &seen));
  CHECK(seen == token);
  OK(lk_memory_freeze_expiry(shared, true));
  OK(lk_memory_freeze_expiry(shared, false));
  OK(lk_lock_release(l));
  lk_memory_free(shared);
  lk_lock_free(l);
  lk_client_free(c);
}

/* Holder identity (issue 31): another client's lock names its holder
 * (pid, face "c", description); a version-1 struct (no description) still
 * works; a bad description is LK_INVALID_OPTION. */
static void holder_identity(void) {
  struct lk_memory *m;
  OK(lk_memory_new(&m));
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.memory = m;
  o.description = "nightly backup";
  struct lk_client *a, *b;
  OK(lk_client_new(&o, &a));
  o.description = NULL;
  o.version = 1;
  OK(lk_client_new(&o, &b));
  struct lk_lock *held, *seen;
  OK(lk_lock_new(a, "api/holder", &held));
  OK(lk_lock_new(b, "api/holder", &seen));
  struct lk_holder h = LK_HOLDER_INIT;
  OK(lk_lock_holder(seen, &h));
  CHECK(!h.held && !h.key);
  uint64_t token;
  OK(lk_lock_acquire(held, 5000, &token));
  OK(lk_lock_holder(seen, &h));
  CHECK(h.held && h.token == token && h.key && !strncmp(h.key, "api/holder/", 11));
  CHECK(h.has_identity && h.pid == (uint32_t)getpid() && h.started > 0 && h.host && *h.host);
  CHECK(!strcmp(h.face, "c") && h.face_version && !strcmp(h.description, "nightly backup"));
  OK(lk_lock_release(held));
  OK(lk_lock_holder(seen, &h));
  CHECK(!h.held && !h.description && h.version == LK_HOLDER_VERSION);
  lk_holder_clear(&h);
  lk_holder_clear(NULL);

  struct lk_client *bad = SENTINEL;
  o.version = LK_CLIENT_OPTIONS_VERSION;
  o.description = "two\nlines";
  EXPECT(lk_client_new(&o, &bad), LK_INVALID_OPTION);
  MESSAGE_HAS("description");
  CHECK(bad == SENTINEL);
  lk_lock_free(held);
  lk_lock_free(seen);
  lk_client_free(a);
  lk_client_free(b);
  lk_memory_free(m);
}

static void fence_gate(void) {
  struct lk_fence_gate *g;
  OK(lk_fence_gate_new(&g));
  uint64_t h = 42;
  OK(lk_fence_gate_highest(g, "orders", &h));
  CHECK(h == 0);
  OK(lk_fence_gate_admit(g, "orders", 5));
  OK(lk_fence_gate_admit(g, "orders", 5));
  EXPECT(lk_fence_gate_admit(g, "orders", 4), LK_STALE);
  MESSAGE_HAS("stale token 4");
  OK(lk_fence_gate_admit(g, "other", 1));
  OK(lk_fence_gate_admit(g, "orders", 7));
  OK(lk_fence_gate_highest(g, "orders", &h));
  CHECK(h == 7);
  EXPECT(lk_fence_gate_admit(g, "\xff", 1), LK_INVALID_ARGUMENT);
  lk_fence_gate_free(g);
}

static void faults(void) {
  /* Every switch answers OK on an embedded client; lease_lost fences. */
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *c = client_in(mem, false);
  struct lk_lock *l;
  OK(lk_lock_new(c, "faults", &l));
  OK(lk_lock_acquire(l, 5000, NULL));
  OK(lk_link_drop_keepalive_replies(c, true));
  OK(lk_link_drop_keepalive_replies(c, false));
  OK(lk_link_delay_keepalive_replies(c, 10));
  OK(lk_link_delay_keepalive_replies(c, 0));
  OK(lk_link_fail_keepalives(c, "injected"));
  OK(lk_link_fail_keepalives(c, NULL));
  OK(lk_link_partition(c));
  OK(lk_link_heal(c));
  OK(lk_stall_driver(1));
  OK(lk_link_declare_lease_lost(c));
  struct lk_permit p = LK_PERMIT_INIT;
  enum lk_status s = LK_OK;
  for (int i = 0; i < 200 && (s = lk_permit(l, &p)) == LK_OK; i++) {
    lk_permit_end(&p);
    sleep_ms(10);
  }
  EXPECT(s, LK_FENCED);
  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* A lock freed with a permit in flight is released at once; the permit
 * turns invalid and ending it later touches no freed memory (the permits in
 * flight keep the lock's state). */
static void free_with_permit_in_flight(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  /* The default timings: under valgrind a 0.2 s keepalive timeout could
   * drain the lock before its first permit (nothing here waits on one). */
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.memory = mem;
  struct lk_client *c;
  OK(lk_client_new(&o, &c));
  struct lk_lock *l;
  OK(lk_lock_new(c, "kept", &l));
  OK(lk_lock_acquire(l, 5000, NULL));
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(l, &p));
  lk_lock_free(l);
  uint64_t u;
  CHECK(!lk_permit_valid(&p));
  OK(lk_permit_token(&p, &u));
  CHECK(u == 1);
  lk_permit_end(&p);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* lk_lock_close: released, its callbacks over, the handle still valid;
 * lk_lock_stats: versioned counters. */
static int close_calls;
static void count_call(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  (void)ud;
  (void)from;
  (void)to;
  (void)why;
  close_calls++;
}

static void close_and_stats(void) {
  struct lk_memory *mem;
  struct lk_client *c = memory_client(&mem);
  struct lk_lock *l;
  OK(lk_lock_new(c, "closing", &l));
  OK(lk_set_on_state_change(l, count_call, NULL));
  struct lk_lock_stats st = LK_LOCK_STATS_INIT;
  OK(lk_lock_stats(l, &st));
  CHECK(st.acquisitions == 0 && st.slack_ms == -1 && st.in_flight == 0);
  OK(lk_lock_acquire(l, 5000, NULL));
  struct lk_permit p = LK_PERMIT_INIT;
  OK(lk_permit(l, &p));
  OK(lk_lock_stats(l, &st));
  CHECK(st.acquisitions == 1 && st.in_flight == 1);
  CHECK(st.slack_ms > 0 && st.slack_ms <= 1500);
  CHECK(st.fences_deadline == 0 && st.drains == 0);
  struct lk_lock_stats bad = LK_LOCK_STATS_INIT;
  bad.version = 0;
  EXPECT(lk_lock_stats(l, &bad), LK_INVALID_ARGUMENT);
  bad.version = LK_LOCK_STATS_VERSION + 1;
  EXPECT(lk_lock_stats(l, &bad), LK_INVALID_ARGUMENT);
  MESSAGE_HAS("version");

  OK(lk_lock_close(l));
  int calls = close_calls;
  CHECK(calls >= 3); /* Idle->Acquiring, Acquiring->Holding, Holding->Released */
  uint64_t u;
  EXPECT(lk_memory_holder(mem, "closing", &u), LK_NOT_HELD);
  CHECK(!lk_permit_valid(&p));
  struct lk_permit q = LK_PERMIT_INIT;
  EXPECT(lk_permit(l, &q), LK_RELEASED);
  OK(lk_lock_close(l)); /* twice: harmless */
  /* Closed: an acquire works on the lock, but no callback tells of it. */
  OK(lk_lock_acquire(l, 5000, NULL));
  OK(lk_lock_release(l));
  CHECK(close_calls == calls);
  lk_permit_end(&p);
  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(mem);
}

/* The outcome of one lk_lock_acquire_start, signalled to the test thread. */
struct done {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
  enum lk_status status;
  uint64_t token;
};
#define DONE_INIT {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, LK_OK, 0}

static void on_done(void *ud, enum lk_status status, uint64_t token) {
  struct done *d = ud;
  pthread_mutex_lock(&d->mu);
  d->calls++;
  d->status = status;
  d->token = token;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* A state change into Released, signalled like an outcome. */
static void on_released(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  (void)from;
  (void)why;
  if (to == LK_STATE_RELEASED) on_done(ud, LK_OK, 0);
}

/* Waits (at most 10 s) for the first call of `d`; how many calls came. */
static int wait_done(struct done *d) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  pthread_mutex_lock(&d->mu);
  while (d->calls == 0 && pthread_cond_timedwait(&d->cv, &d->mu, &until) == 0) {
  }
  int n = d->calls;
  pthread_mutex_unlock(&d->mu);
  return n;
}

/* The core's lifecycle through C: an acquisition cancelled while it waits
 * ends LK_RELEASED and leaves nothing held; one cancelled after it
 * succeeded releases; lk_client_shutdown lets a waiter in at once and
 * closes the client's handles; lk_shutdown ends every client, and a client
 * made afterwards works. Last in main: lk_shutdown is process-wide. */
static void exit_and_cancel(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client *a = client_in(mem, true), *b = client_in(mem, true);
  struct lk_lock *la, *lb;
  OK(lk_lock_new(a, "cancel", &la));
  OK(lk_lock_new(b, "cancel", &lb));
  uint64_t t = 0, u = 0;
  OK(lk_lock_acquire(la, 5000, &t));

  /* NULLs: refused, nothing started. */
  struct lk_acquisition *q = NULL;
  EXPECT(lk_lock_acquire_start(NULL, 10, on_done, NULL, &q), LK_NULL_PARAMETER);
  EXPECT(lk_lock_acquire_start(lb, 10, on_done, NULL, NULL), LK_NULL_PARAMETER);
  EXPECT(lk_acquisition_cancel(NULL), LK_NULL_PARAMETER);
  lk_acquisition_free(NULL);
  EXPECT(lk_client_shutdown(NULL), LK_NULL_PARAMETER);

  /* Waiting behind a, cancelled: done once with LK_RELEASED, and the lock
   * goes to Released; its key goes, so a's next acquire (after its
   * release) is not stuck behind it. */
  struct done d1 = DONE_INIT, released = DONE_INIT;
  OK(lk_set_on_state_change(lb, on_released, &released));
  OK(lk_lock_acquire_start(lb, 10000, on_done, &d1, &q));
  OK(lk_acquisition_cancel(q));
  CHECK(wait_done(&d1) == 1 && d1.status == LK_RELEASED);
  CHECK(wait_done(&released) == 1);
  OK(lk_acquisition_cancel(q)); /* again: nothing */
  lk_acquisition_free(q);
  enum lk_state st;
  OK(lk_lock_release(la));
  OK(lk_lock_acquire(la, 2000, &u));
  OK(lk_lock_release(la));

  /* Won, then cancelled: the lock is released, a gets it. */
  struct done d2 = DONE_INIT, released2 = DONE_INIT;
  OK(lk_set_on_state_change(lb, on_released, &released2));
  OK(lk_lock_acquire_start(lb, 10000, on_done, &d2, &q));
  CHECK(wait_done(&d2) == 1 && d2.status == LK_OK && d2.token > t);
  OK(lk_acquisition_cancel(q));
  lk_acquisition_free(q);
  CHECK(wait_done(&released2) == 1);
  OK(lk_lock_state(lb, &st));
  CHECK(st == LK_STATE_RELEASED);
  OK(lk_set_on_state_change(lb, NULL, NULL));
  OK(lk_lock_acquire(la, 2000, &u));

  /* a's client shut down while b waits: b gets the lock at once. */
  struct done d3 = DONE_INIT;
  OK(lk_lock_acquire_start(lb, 10000, on_done, &d3, &q));
  const uint64_t before = boot_ns();
  OK(lk_client_shutdown(a));
  CHECK(wait_done(&d3) == 1 && d3.status == LK_OK);
  CHECK(boot_ns() - before < 1500000000u); /* a keepalive timeout (200 ms), not the TTL */
  lk_acquisition_free(q);
  struct lk_permit p = LK_PERMIT_INIT;
  EXPECT(lk_permit(la, &p), LK_RELEASED);
  EXPECT(lk_lock_acquire(la, 100, NULL), LK_SHUTDOWN);
  OK(lk_client_shutdown(a)); /* again: nothing */

  /* Everything, b's held lock too; a client made afterwards works. */
  OK(lk_shutdown());
  EXPECT(lk_permit(lb, &p), LK_RELEASED);
  EXPECT(lk_memory_holder(mem, "cancel", &u), LK_NOT_HELD);
  OK(lk_shutdown()); /* again: nothing */
  struct lk_client *c = client_in(mem, true);
  struct lk_lock *lc;
  OK(lk_lock_new(c, "cancel", &lc));
  OK(lk_lock_acquire(lc, 2000, NULL));
  OK(lk_lock_release(lc));
  lk_lock_free(lc);
  lk_client_free(c);
  lk_lock_free(la);
  lk_lock_free(lb);
  lk_client_free(a);
  lk_client_free(b);
  lk_memory_free(mem);
}

int main(void) {
  names();
  free_with_permit_in_flight();
  close_and_stats();
  options();
  nulls();
  bad_arguments();
  etcd_options();
  life_cycle();
  guarded_writes();
  lock_lost();
  driver_blocks_sigpipe();
  shared_service();
  holder_identity();
  fence_gate();
  faults();
  exit_and_cancel();
  return finish("api");
}
