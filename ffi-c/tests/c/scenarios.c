/* Plays every file in scenarios/ through the C API and compares the callback
 * trace with the file's, exactly as core/tests/scenarios.rs does: same steps,
 * same trace strings, same `@lo..hi` windows, same 10 s wait limit.
 *
 * Usage: scenarios DIR   (DLOCK_SCENARIO=part plays only matching files)
 *
 * DLOCK_SCENARIO_SLACK_MS=n widens the upper end of every window by n ms.
 * Only the valgrind run sets it: valgrind runs code 20-50x slower, and its
 * purpose there is memory checking; order, tokens and every step stay exact. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>

#include "check.h"

#define WAIT_LIMIT_MS 10000
#define MAX_EVENTS 256
#define MAX_HOLDERS 8
#define MAX_PERMITS 16
#define MAX_THREADS 16
#define EVENT_LEN 200
#define ERR_LEN 8192

struct event {
  uint64_t at;
  char text[EVENT_LEN];
};

/* The trace: callback events with their time since the scenario started. */
struct trace {
  uint64_t start;
  pthread_mutex_t mu;
  pthread_cond_t grew;
  struct event ev[MAX_EVENTS];
  int n;
};

static uint64_t slack_ms;

static uint64_t ms_since(uint64_t start) { return (boot_ns() - start) / 1000000u; }

static void trace_push(struct trace *t, const char *fmt, ...) {
  uint64_t at = ms_since(t->start);
  pthread_mutex_lock(&t->mu);
  if (t->n < MAX_EVENTS) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->ev[t->n].text, EVENT_LEN, fmt, ap);
    va_end(ap);
    t->ev[t->n].at = at;
    t->n++;
  }
  pthread_cond_broadcast(&t->grew);
  pthread_mutex_unlock(&t->mu);
}

static struct timespec wait_deadline(void) {
  struct timespec d;
  clock_gettime(CLOCK_MONOTONIC, &d);
  d.tv_sec += WAIT_LIMIT_MS / 1000;
  return d;
}

static int find_from(struct trace *t, const char *event, int from) {
  for (int i = from; i < t->n; i++)
    if (strcmp(t->ev[i].text, event) == 0) return i;
  return -1;
}

/* Waits until `event` appears at or after index `from`; its index or -1. */
static int trace_wait_for(struct trace *t, const char *event, int from) {
  struct timespec d = wait_deadline();
  pthread_mutex_lock(&t->mu);
  int i;
  while ((i = find_from(t, event, from)) < 0) {
    if (pthread_cond_timedwait(&t->grew, &t->mu, &d) == ETIMEDOUT) {
      i = find_from(t, event, from);
      break;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return i;
}

/* Waits until the trace has `n` events (or the limit passes); its length. */
static int trace_wait_len(struct trace *t, int n) {
  struct timespec d = wait_deadline();
  pthread_mutex_lock(&t->mu);
  while (t->n < n)
    if (pthread_cond_timedwait(&t->grew, &t->mu, &d) == ETIMEDOUT) break;
  int len = t->n;
  pthread_mutex_unlock(&t->mu);
  return len;
}

struct holder {
  char name[32];
  struct trace *trace;
  struct lk_client *client;
  struct lk_lock *lock;
};

static void on_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  struct holder *h = ud;
  trace_push(h->trace, "%s state %s->%s %s", h->name, lk_state_name((int)from),
             lk_state_name((int)to), lk_reason_name((int)why));
}

static void on_acquired(void *ud, uint64_t token) {
  struct holder *h = ud;
  trace_push(h->trace, "%s acquired token=%" PRIu64, h->name, token);
}

static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  struct holder *h = ud;
  trace_push(h->trace, "%s fence token=%" PRIu64 " in_flight=%" PRIu64, h->name, token,
             in_flight);
}

static void on_drained(void *ud) {
  struct holder *h = ud;
  trace_push(h->trace, "%s drained", h->name);
}

static void *acquire_thread(void *arg) {
  struct holder *h = arg;
  lk_lock_acquire(h->lock, WAIT_LIMIT_MS, NULL);
  return NULL;
}

struct labelled {
  char label[32];
  struct lk_permit permit;
  int used;
};

struct play {
  const char *path;
  struct trace trace;
  struct lk_memory *service;
  struct holder holders[MAX_HOLDERS];
  int n_holders;
  struct labelled permits[MAX_PERMITS];
  pthread_t threads[MAX_THREADS];
  int n_threads;
  char err[ERR_LEN];
};

static int fail(struct play *p, int step, const cJSON *s, const char *fmt, ...) {
  char *json = cJSON_PrintUnformatted(s);
  int k = snprintf(p->err, ERR_LEN, "step %d %s: ", step, json ? json : "?");
  cJSON_free(json);
  va_list ap;
  va_start(ap, fmt);
  if (k > 0 && k < ERR_LEN) vsnprintf(p->err + k, (size_t)(ERR_LEN - k), fmt, ap);
  va_end(ap);
  return -1;
}

static const char *str(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A number field (-1 when absent). */
static int64_t num(const cJSON *o, const char *key) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : -1;
}

static struct holder *holder_of(struct play *p, const cJSON *step) {
  const char *name = str(step, "holder");
  for (int i = 0; name && i < p->n_holders; i++)
    if (strcmp(p->holders[i].name, name) == 0) return &p->holders[i];
  return NULL;
}

static struct labelled *permit_of(struct play *p, const char *label) {
  for (int i = 0; label && i < MAX_PERMITS; i++)
    if (p->permits[i].used && strcmp(p->permits[i].label, label) == 0) return &p->permits[i];
  return NULL;
}

static void show(struct play *p, char *buf, size_t len) {
  size_t k = 0;
  buf[0] = 0;
  pthread_mutex_lock(&p->trace.mu);
  for (int i = 0; i < p->trace.n && k < len; i++) {
    int w = snprintf(buf + k, len - k, "  %5" PRIu64 " ms  %s\n", p->trace.ev[i].at,
                     p->trace.ev[i].text);
    if (w < 0) break;
    k += (size_t)w;
  }
  pthread_mutex_unlock(&p->trace.mu);
}

static int run_step(struct play *p, int i, const cJSON *step, int *cursor) {
  int64_t at = num(step, "at");
  if (at >= 0) {
    uint64_t elapsed = ms_since(p->trace.start);
    if ((uint64_t)at > elapsed) sleep_ms((uint64_t)at - elapsed);
  }
  struct holder *h = holder_of(p, step);
  const cJSON *expect = cJSON_GetObjectItemCaseSensitive(step, "expect");
  const char *what = str(step, "do");
  if (!what) return fail(p, i, step, "no `do`");
  int needs_holder = strcmp(what, "wait") && strcmp(what, "stall_driver") &&
                     strcmp(what, "end") && strcmp(what, "valid");
  if (needs_holder && !h) return fail(p, i, step, "no such holder");

  if (!strcmp(what, "acquire")) {
    if (p->n_threads == MAX_THREADS) return fail(p, i, step, "too many acquires");
    if (pthread_create(&p->threads[p->n_threads], NULL, acquire_thread, h) != 0)
      return fail(p, i, step, "pthread_create failed");
    p->n_threads++;
  } else if (!strcmp(what, "try_acquire")) {
    enum lk_status s = lk_lock_try_acquire(h->lock, NULL);
    const char *got = s == LK_OK ? "ok" : lk_status_name((int)s);
    if (!str(step, "expect") || strcmp(got, str(step, "expect")))
      return fail(p, i, step, "try_acquire gave %s", got);
  } else if (!strcmp(what, "permit")) {
    struct lk_permit permit = LK_PERMIT_INIT;
    enum lk_status s = lk_permit(h->lock, &permit);
    const char *word = s == LK_OK ? "granted" : lk_status_name((int)s);
    int rc = 0;
    int64_t want_token = num(step, "token");
    const char *label = str(step, "as");
    uint64_t token = 0;
    if (!str(step, "expect") || strcmp(word, str(step, "expect"))) {
      rc = fail(p, i, step, "permit gave %s", word);
    } else if (s == LK_OK && want_token >= 0 &&
               (lk_permit_token(&permit, &token) != LK_OK || token != (uint64_t)want_token)) {
      rc = fail(p, i, step, "permit token %" PRIu64, token);
    } else if (s == LK_OK && label) {
      for (int k = 0; k < MAX_PERMITS; k++) {
        if (!p->permits[k].used) {
          p->permits[k].used = 1;
          snprintf(p->permits[k].label, sizeof p->permits[k].label, "%s", label);
          p->permits[k].permit = permit; /* moved: this copy is the one ended */
          return 0;
        }
      }
      rc = fail(p, i, step, "too many labelled permits");
    }
    lk_permit_end(&permit);
    return rc;
  } else if (!strcmp(what, "end")) {
    struct labelled *l = permit_of(p, str(step, "permit"));
    if (!l) return fail(p, i, step, "no such permit");
    lk_permit_end(&l->permit);
    l->used = 0;
  } else if (!strcmp(what, "valid")) {
    struct labelled *l = permit_of(p, str(step, "permit"));
    if (!l) return fail(p, i, step, "no such permit");
    bool v = lk_permit_valid(&l->permit);
    if (!cJSON_IsBool(expect) || v != (bool)cJSON_IsTrue(expect))
      return fail(p, i, step, "valid() was %s", v ? "true" : "false");
  } else if (!strcmp(what, "state")) {
    enum lk_state st;
    if (lk_lock_state(h->lock, &st) != LK_OK) return fail(p, i, step, "%s", lk_last_error());
    if (!str(step, "expect") || strcmp(lk_state_name((int)st), str(step, "expect")))
      return fail(p, i, step, "state was %s", lk_state_name((int)st));
  } else if (!strcmp(what, "token")) {
    uint64_t token = 0;
    int held = lk_lock_token(h->lock, &token) == LK_OK;
    int ok = held ? cJSON_IsNumber(expect) && (uint64_t)expect->valuedouble == token
                  : !cJSON_IsNumber(expect);
    if (!ok) {
      if (held) return fail(p, i, step, "token was Some(%" PRIu64 ")", token);
      return fail(p, i, step, "token was None");
    }
  } else if (!strcmp(what, "release")) {
    if (lk_lock_release(h->lock) != LK_OK) return fail(p, i, step, "%s", lk_last_error());
  } else if (!strcmp(what, "wait")) {
    const char *event = str(step, "event");
    int found = event ? trace_wait_for(&p->trace, event, *cursor) : -1;
    if (found < 0)
      return fail(p, i, step, "no `%s` within 10s", event ? event : "(missing event)");
    *cursor = found;
  } else if (!strcmp(what, "stall_driver")) {
    if (lk_stall_driver((uint64_t)num(step, "ms")) != LK_OK)
      return fail(p, i, step, "%s", lk_last_error());
  } else if (!strcmp(what, "fault")) {
    const char *f = str(step, "fault");
    enum lk_status s;
    if (!f) return fail(p, i, step, "no fault");
    if (!strcmp(f, "partition")) s = lk_link_partition(h->client);
    else if (!strcmp(f, "heal")) s = lk_link_heal(h->client);
    else if (!strcmp(f, "drop_replies")) s = lk_link_drop_keepalive_replies(h->client, true);
    else if (!strcmp(f, "keep_replies")) s = lk_link_drop_keepalive_replies(h->client, false);
    else if (!strcmp(f, "delay_replies"))
      s = lk_link_delay_keepalive_replies(h->client, (uint64_t)num(step, "ms"));
    else if (!strcmp(f, "fail_keepalives")) s = lk_link_fail_keepalives(h->client, "injected failure");
    else if (!strcmp(f, "stop_failing")) s = lk_link_fail_keepalives(h->client, NULL);
    else if (!strcmp(f, "lease_lost")) s = lk_link_declare_lease_lost(h->client);
    else if (!strcmp(f, "freeze_expiry")) s = lk_memory_freeze_expiry(p->service, true);
    else if (!strcmp(f, "thaw_expiry")) s = lk_memory_freeze_expiry(p->service, false);
    else return fail(p, i, step, "unknown fault %s", f);
    if (s != LK_OK) return fail(p, i, step, "%s", lk_last_error());
  } else {
    return fail(p, i, step, "unknown step %s", what);
  }
  return 0;
}

/* Compares the trace with the file's; 0 when equal. */
static int compare(struct play *p, const cJSON *expected) {
  int n = cJSON_GetArraySize(expected);
  int len = trace_wait_len(&p->trace, n);
  static char shown[ERR_LEN / 2];
  show(p, shown, sizeof shown);
  if (len != n) {
    snprintf(p->err, ERR_LEN, "trace has %d events, expected %d:\n%s", len, n, shown);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    const cJSON *w = cJSON_GetArrayItem(expected, i);
    if (!cJSON_IsString(w)) {
      snprintf(p->err, ERR_LEN, "trace entry %d is not a string", i);
      return -1;
    }
    char want[EVENT_LEN];
    snprintf(want, sizeof want, "%s", w->valuestring);
    char *window = strstr(want, " @");
    unsigned long long lo = 0, hi = 0;
    if (window) {
      *window = 0;
      if (sscanf(window + 2, "%llu..%llu", &lo, &hi) != 2) {
        snprintf(p->err, ERR_LEN, "window is lo..hi: %s", w->valuestring);
        return -1;
      }
    }
    const struct event *got = &p->trace.ev[i];
    if (strcmp(want, got->text)) {
      snprintf(p->err, ERR_LEN, "trace event %d: expected `%s`, got `%s`:\n%s", i, want,
               got->text, shown);
      return -1;
    }
    if (window && (got->at < lo || got->at > hi + slack_ms)) {
      snprintf(p->err, ERR_LEN, "`%s` at %" PRIu64 " ms, expected %llu..%llu ms:\n%s", want,
               got->at, lo, hi, shown);
      return -1;
    }
  }
  printf("%s: ok\n%s", p->path, shown);
  return 0;
}

static int play(struct play *p, const cJSON *doc) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(doc, "settings");
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.ttl_ms = (uint64_t)num(s, "ttl_ms");
  o.keepalive_interval_ms = (uint64_t)num(s, "keepalive_interval_ms");
  o.keepalive_timeout_ms = (uint64_t)num(s, "keepalive_timeout_ms");
  o.retry_interval_ms = (uint64_t)num(s, "retry_interval_ms");
  o.margin_ms = (uint64_t)num(s, "margin_ms");
  o.reacquire = true;
  if (lk_memory_new(&p->service) != LK_OK) {
    snprintf(p->err, ERR_LEN, "lk_memory_new: %s", lk_last_error());
    return -1;
  }
  o.memory = p->service;
  p->trace.start = boot_ns();
  char name[256];
  snprintf(name, sizeof name, "scenario/\"%s\"", str(doc, "name") ? str(doc, "name") : "");
  const cJSON *hs = cJSON_GetObjectItemCaseSensitive(doc, "holders");
  const cJSON *hn;
  cJSON_ArrayForEach(hn, hs) {
    if (!cJSON_IsString(hn) || p->n_holders == MAX_HOLDERS) {
      snprintf(p->err, ERR_LEN, "bad holders");
      return -1;
    }
    struct holder *h = &p->holders[p->n_holders];
    snprintf(h->name, sizeof h->name, "%s", hn->valuestring);
    h->trace = &p->trace;
    if (lk_client_new(&o, &h->client) != LK_OK) {
      snprintf(p->err, ERR_LEN, "lk_client_new: %s", lk_last_error());
      return -1;
    }
    p->n_holders++;
    if (lk_lock_new(h->client, name, &h->lock) != LK_OK ||
        lk_set_on_state_change(h->lock, on_state, h) != LK_OK ||
        lk_set_on_acquired(h->lock, on_acquired, h) != LK_OK ||
        lk_set_on_fence(h->lock, on_fence, h) != LK_OK ||
        lk_set_on_drained(h->lock, on_drained, h) != LK_OK) {
      snprintf(p->err, ERR_LEN, "lock setup: %s", lk_last_error());
      return -1;
    }
  }
  int cursor = 0, i = 0;
  const cJSON *step;
  cJSON_ArrayForEach(step, cJSON_GetObjectItemCaseSensitive(doc, "steps")) {
    if (run_step(p, i++, step, &cursor) != 0) return -1;
  }
  return compare(p, cJSON_GetObjectItemCaseSensitive(doc, "trace"));
}

/* Releases (so a pending acquire returns), joins, frees. */
static void cleanup(struct play *p) {
  for (int i = 0; i < p->n_holders; i++)
    if (p->holders[i].lock) lk_lock_release(p->holders[i].lock);
  for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  for (int i = 0; i < MAX_PERMITS; i++) lk_permit_end(&p->permits[i].permit);
  for (int i = 0; i < p->n_holders; i++) {
    lk_lock_free(p->holders[i].lock);
    lk_client_free(p->holders[i].client);
  }
  lk_memory_free(p->service);
  pthread_mutex_destroy(&p->trace.mu);
  pthread_cond_destroy(&p->trace.grew);
}

/* Starts dlock's threads and runs every path once before any scenario's
 * clock starts, so first-use costs (thread creation; valgrind's translation
 * of code it has not run yet) fall outside the time windows. */
static void warm_up(void) {
  struct lk_memory *m = NULL;
  struct lk_client *c = NULL;
  struct lk_lock *l = NULL;
  struct lk_client_options o = short_options();
  struct lk_permit p = LK_PERMIT_INIT;
  if (lk_memory_new(&m) == LK_OK) o.memory = m;
  if (lk_client_new(&o, &c) == LK_OK && lk_lock_new(c, "warm-up", &l) == LK_OK &&
      lk_lock_acquire(l, WAIT_LIMIT_MS, NULL) == LK_OK && lk_permit(l, &p) == LK_OK) {
    lk_permit_end(&p);
    lk_lock_release(l);
  }
  lk_lock_free(l);
  lk_client_free(c);
  lk_memory_free(m);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
  if (buf && fread(buf, 1, (size_t)n, f) == (size_t)n) {
    buf[n] = 0;
  } else {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  return buf;
}

static int is_json(const struct dirent *e) {
  size_t n = strlen(e->d_name);
  return n > 5 && strcmp(e->d_name + n - 5, ".json") == 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCENARIO_DIR\n", argv[0]);
    return 2;
  }
  struct dirent **files;
  int n = scandir(argv[1], &files, is_json, alphasort);
  if (n < 8) {
    fprintf(stderr, "expected the eight scenarios in %s, found %d\n", argv[1], n);
    return 1;
  }
  const char *only = getenv("DLOCK_SCENARIO");
  const char *slack = getenv("DLOCK_SCENARIO_SLACK_MS");
  slack_ms = slack ? strtoull(slack, NULL, 10) : 0;
  if (slack_ms) printf("windows widened by %" PRIu64 " ms (DLOCK_SCENARIO_SLACK_MS)\n", slack_ms);
  warm_up();
  int played = 0, failed = 0;
  for (int k = 0; k < n; k++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", argv[1], files[k]->d_name);
    free(files[k]);
    if (only && !strstr(path, only)) continue;
    char *text = read_file(path);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    static struct play p;
    memset(&p, 0, sizeof p);
    p.path = path;
    pthread_mutex_init(&p.trace.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p.trace.grew, &ca);
    pthread_condattr_destroy(&ca);
    int rc = doc ? play(&p, doc) : (snprintf(p.err, ERR_LEN, "bad JSON"), -1);
    if (rc != 0) {
      fprintf(stderr, "FAILED %s: %s\n", path, p.err);
      failed++;
    }
    played++;
    cleanup(&p);
    cJSON_Delete(doc);
  }
  free(files);
  printf("scenarios: %d played, %d failed\n", played, failed);
  if (!played) fprintf(stderr, "no scenario matches DLOCK_SCENARIO=%s\n", only ? only : "");
  return failed || !played ? 1 : 0;
}
