/* A worker that does units of work under lk_permit and stops cleanly when
 * its lock is fenced.
 *
 * Embedded backend by default: the worker's network is cut after 1.5 s, so
 * it drains, fences at its deadline and stops.
 *
 * With DLOCK_ENDPOINTS set it uses etcd (lk_client_from_env, with the other
 * DLOCK_* variables for TLS and auth) and commits every unit with a guarded
 * put of RESULT_KEY, which etcd accepts only while the worker's token still
 * holds the lock. It works 40 units, or until fenced: try
 *   etcdctl del --prefix examples/worker/
 * (the lock key, as an operator might): the worker fences at once
 * (lock_lost), stops, and shows etcd refusing a write with its old token.
 *
 * With DLOCK_STORY=json every event is also printed as one JSON object on a
 * line of its own, e.g. {"who":"worker","event":"fence","t_ms":3004,"token":1,
 * "in_flight":0}; core/tests/c_worker*.rs check the story that way.
 *
 * Build: scripts/install-c.sh PREFIX && PKG_CONFIG_PATH=PREFIX/lib/pkgconfig make -C examples/c */
#define _GNU_SOURCE
#include <dlock.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Where the etcd worker commits its units (not under the lock's prefix). */
#define RESULT_KEY "examples/worker-result"

static uint64_t start_ns;
static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
static atomic_int fenced; /* set by on_fence: stop taking work */
static int story_json;    /* DLOCK_STORY=json: also print events as JSON */

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_BOOTTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void say(const char *fmt, ...) {
  pthread_mutex_lock(&out);
  printf("%7.3fs  ", (double)(now_ns() - start_ns) / 1e9);
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
  pthread_mutex_unlock(&out);
}

/* With DLOCK_STORY=json, one event of the story as a JSON line:
 * {"who":"worker","event":NAME,"t_ms":N,FIELDS}, FIELDS (a printf format
 * and its arguments, or NULL) being the event's own. The values put in are
 * numbers and dlock's names (identifiers): there is nothing to escape. */
static void event(const char *name, const char *fields, ...) {
  if (!story_json) return;
  pthread_mutex_lock(&out);
  printf("{\"who\":\"worker\",\"event\":\"%s\",\"t_ms\":%" PRIu64, name,
         (now_ns() - start_ns) / 1000000u);
  if (fields) {
    va_list ap;
    va_start(ap, fields);
    putchar(',');
    vprintf(fields, ap);
    va_end(ap);
  }
  puts("}");
  fflush(stdout);
  pthread_mutex_unlock(&out);
}

static void sleep_ms(long ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Callbacks run on dlock's callback thread: keep them short, share by atomics. */
static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  (void)ud;
  say("FENCED token %" PRIu64 " with %" PRIu64 " unit(s) in flight: stopping", token, in_flight);
  event("fence", "\"token\":%" PRIu64 ",\"in_flight\":%" PRIu64, token, in_flight);
  atomic_store(&fenced, 1);
}

static void on_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  (void)ud;
  say("%s -> %s (%s)", lk_state_name((int)from), lk_state_name((int)to), lk_reason_name((int)why));
  event("state", "\"from\":\"%s\",\"to\":\"%s\",\"reason\":\"%s\"", lk_state_name((int)from),
        lk_state_name((int)to), lk_reason_name((int)why));
}

/* The unit's result, written only while `token` holds the lock. */
static enum lk_status commit(struct lk_lock *lock, uint64_t token, int unit) {
  char value[64];
  int n = snprintf(value, sizeof value, "unit %d token %" PRIu64, unit, token);
  return lk_lock_guarded_put(lock, token, (const uint8_t *)RESULT_KEY, strlen(RESULT_KEY),
                             (const uint8_t *)value, (size_t)n);
}

static int fail(const char *what, enum lk_status s) {
  fprintf(stderr, "worker: %s: %s: %s\n", what, lk_status_name((int)s), lk_last_error());
  return 1;
}

int main(void) {
  start_ns = now_ns();
  const char *story = getenv("DLOCK_STORY");
  story_json = story && strcmp(story, "json") == 0;
  const char *endpoints = getenv("DLOCK_ENDPOINTS");
  int embedded = !endpoints || !*endpoints;

  /* Short settings so the story takes seconds: keepalive every second,
   * deadline = send time of the last confirmed keepalive + 3 s - 1 s. */
  struct lk_client_options opts = LK_CLIENT_OPTIONS_INIT;
  opts.ttl_ms = 3000;
  opts.keepalive_interval_ms = 1000;
  opts.keepalive_timeout_ms = 300;
  opts.retry_interval_ms = 250;
  opts.margin_ms = 1000;
  opts.reacquire = false; /* this worker stops at the fence */

  struct lk_client *client;
  enum lk_status s = embedded ? lk_client_new(&opts, &client)  /* endpoints NULL: embedded */
                              : lk_client_from_env(&opts, &client);
  if (s != LK_OK) return fail("client", s);
  struct lk_lock *lock;
  if ((s = lk_lock_new(client, "examples/worker", &lock)) != LK_OK) return fail("lock", s);
  lk_set_on_fence(lock, on_fence, NULL);
  lk_set_on_state_change(lock, on_state, NULL);

  uint64_t token;
  if ((s = lk_lock_acquire(lock, 10000, &token)) != LK_OK) return fail("acquire", s);
  say("holds the lock, token %" PRIu64 " (%s backend)", token, embedded ? "embedded" : "etcd");
  event("holds", "\"token\":%" PRIu64 ",\"backend\":\"%s\"", token, embedded ? "embedded" : "etcd");

  int units = 0, cut = 0;
  enum lk_status last_refusal = LK_OK;
  while (!atomic_load(&fenced) && units < 40) {
    if (embedded && !cut && now_ns() - start_ns > 1500000000u) {
      say("fault: the worker's network is cut; keepalives get no reply");
      event("cut", NULL);
      lk_link_partition(client);
      cut = 1;
    }
    struct lk_permit permit = LK_PERMIT_INIT;
    s = lk_permit(lock, &permit);
    if (s != LK_OK) {
      if (s != last_refusal) {
        say("permit refused: %s", lk_status_name((int)s));
        event("permit_refused", "\"status\":\"%s\"", lk_status_name((int)s));
      }
      last_refusal = s;
      sleep_ms(50);
      continue;
    }
    last_refusal = LK_OK;
    uint64_t t;
    lk_permit_token(&permit, &t);
    units++;
    sleep_ms(200); /* one unit of work; its writes carry token t */
    if (!lk_permit_valid(&permit)) {
      say("unit %d is discarded: its permit is no longer valid", units);
      event("discard", "\"unit\":%d,\"token\":%" PRIu64, units, t);
    } else if (embedded) {
      say("unit %d commits under token %" PRIu64, units, t);
      event("commit", "\"unit\":%d,\"token\":%" PRIu64 ",\"guarded\":false", units, t);
    } else if ((s = commit(lock, t, units)) == LK_OK) {
      say("unit %d commits under token %" PRIu64 " (guarded put to etcd)", units, t);
      event("commit", "\"unit\":%d,\"token\":%" PRIu64 ",\"guarded\":true", units, t);
    } else {
      say("unit %d is refused by etcd: %s", units, lk_status_name((int)s));
      event("unit_refused", "\"unit\":%d,\"token\":%" PRIu64 ",\"status\":\"%s\"", units, t,
            lk_status_name((int)s));
    }
    lk_permit_end(&permit);
  }
  if (!embedded && atomic_load(&fenced)) {
    /* What a straggler with the old token would get: etcd refuses it. */
    s = commit(lock, token, units + 1);
    say("a late write under the old token %" PRIu64 ": %s", token,
        s == LK_FENCED ? "refused by etcd (fenced)" : lk_status_name((int)s));
    event("late_write", "\"token\":%" PRIu64 ",\"status\":\"%s\",\"refused\":%s", token,
          lk_status_name((int)s), s == LK_FENCED ? "true" : "false");
  }

  uint64_t in_flight = 0;
  lk_lock_in_flight(lock, &in_flight);
  say("worker stopped cleanly after %d unit(s); %" PRIu64 " in flight", units, in_flight);
  event("stopped", "\"units\":%d,\"in_flight\":%" PRIu64, units, in_flight);
  if (cut) lk_link_heal(client);
  lk_lock_release(lock);
  lk_lock_free(lock);
  lk_client_free(client);
  return 0;
}
