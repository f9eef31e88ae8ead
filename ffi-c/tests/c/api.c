/* The API surface: names, options, NULL and bad arguments for every
 * function, out-parameters untouched on failure, the lock and permit life
 * cycle, double ends and NULL frees, the fence gate, the embedded service. */
#define _GNU_SOURCE
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
  CHECK(fn.ttl_ms == macro.ttl_ms && fn.ttl_ms == 15000);
  CHECK(fn.keepalive_interval_ms == macro.keepalive_interval_ms);
  CHECK(fn.keepalive_timeout_ms == macro.keepalive_timeout_ms);
  CHECK(fn.retry_interval_ms == macro.retry_interval_ms);
  CHECK(fn.margin_ms == macro.margin_ms);
  CHECK(fn.reacquire == macro.reacquire && fn.reacquire);
  CHECK(!fn.endpoints && !fn.ca_file && !fn.cert_file && !fn.key_file && !fn.user &&
        !fn.password && !fn.memory);
  CHECK(fn.allow_plaintext_password == macro.allow_plaintext_password);
  CHECK(fn.connect_timeout_ms == macro.connect_timeout_ms);
  CHECK(fn.request_timeout_ms == macro.request_timeout_ms);

  /* Unknown versions: refused, the struct untouched. */
  struct lk_client_options untouched;
  memset(&untouched, 0x5a, sizeof untouched);
  struct lk_client_options copy = untouched;
  EXPECT(lk_client_options_init(&untouched, 0), LK_INVALID_ARGUMENT);
  EXPECT(lk_client_options_init(&untouched, 2), LK_INVALID_ARGUMENT);
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
  bad.keepalive_timeout_ms = bad.keepalive_interval_ms;
  EXPECT(lk_client_new(&bad, &client), LK_INVALID_OPTION);
  MESSAGE_HAS("keepalive_timeout");
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
  bad.ttl_ms = UINT64_MAX;
  bad.margin_ms = UINT64_MAX;
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
}

/* Every function with a NULL for each required pointer. */
static void nulls(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client_options o = short_options();
  o.memory = mem;
  struct lk_client *c;
  OK(lk_client_new(&o, &c));
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
  /* Fault switches need an embedded link: no client from the environment has one. */
  struct lk_memory *m = SENTINEL;
  unsetenv("DLOCK_ENDPOINTS");
  struct lk_client *env = NULL;
  enum lk_status s = lk_client_from_env(NULL, &env);
  /* LK_BACKEND only while the etcd backend is a stub. */
  CHECK(s == LK_OK || (s == LK_BACKEND && strstr(lk_last_error(), "not built")));
  if (s == LK_OK) {
    EXPECT(lk_link_partition(env), LK_INVALID_ARGUMENT);
    MESSAGE_HAS("embedded");
    EXPECT(lk_client_memory(env, &m), LK_INVALID_ARGUMENT);
    CHECK(m == SENTINEL);
    lk_client_free(env);
  }
  EXPECT(lk_memory_named("\xff", &m), LK_INVALID_ARGUMENT);
  EXPECT(lk_link_fail_keepalives(c, "\xff"), LK_INVALID_ARGUMENT);
  lk_client_free(c);
}

static void life_cycle(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client_options o = short_options();
  o.memory = mem;
  struct lk_client *a, *b;
  OK(lk_client_new(&o, &a));
  OK(lk_client_new(&o, &b));
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
  CHECK(u == 2);
  EXPECT(lk_lock_acquire(la, 50, NULL), LK_TIMEOUT); /* b holds it now */

  /* A guarded write with a dead token (1; b holds 2) never commits, on any
   * backend (etcd: LK_FENCED). */
  CHECK(lk_lock_guarded_put(lb, 1, (const uint8_t *)"k", 1, (const uint8_t *)"v", 1) != LK_OK);
  CHECK(lk_lock_guarded_delete(lb, 1, (const uint8_t *)"k", 1) != LK_OK);

  /* The client's service is the one given; its handle is a new one. */
  struct lk_memory *seen;
  OK(lk_client_memory(b, &seen));
  OK(lk_memory_holder(seen, "jobs", &u));
  CHECK(u == 2);
  lk_memory_free(seen);

  lk_lock_free(la);
  lk_lock_free(lb);
  lk_client_free(a); /* clients after locks, or before: both are fine */
  lk_client_free(b);
  lk_memory_free(mem);
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
  struct lk_client_options o = short_options();
  o.memory = mem;
  o.reacquire = false;
  struct lk_client *c;
  OK(lk_client_new(&o, &c));
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

/* Misuse made safe: a lock freed with a permit in flight is released at
 * once; the permit turns invalid and ending it later touches no freed memory. */
static void free_with_permit_in_flight(void) {
  struct lk_memory *mem;
  OK(lk_memory_new(&mem));
  struct lk_client_options o = short_options();
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
  EXPECT(lk_memory_holder(mem, "kept", &u), LK_NOT_HELD);
  CHECK(!lk_permit_valid(&p));
  OK(lk_permit_token(&p, &u));
  CHECK(u == 1);
  lk_permit_end(&p);
  lk_client_free(c);
  lk_memory_free(mem);
}

int main(void) {
  names();
  free_with_permit_in_flight();
  options();
  nulls();
  bad_arguments();
  life_cycle();
  shared_service();
  fence_gate();
  faults();
  return finish("api");
}
