/* Plays every file in scenarios/ through the C API: the C face of the shared
 * scenario runner (scenario_runner.h, libdlock_scenarios.so), which parses
 * the files, times the steps, waits on the trace, judges every `expect` and
 * compares the trace, exactly as for core/tests/scenarios.rs. This file is
 * only the step dispatch over dlock.h.
 *
 * Usage: scenarios DIR   (DLOCK_SCENARIO=part plays only matching files;
 * DLOCK_SCENARIO_SLACK_MS=n widens every window's upper end by n ms, which
 * only the valgrind run sets: order, tokens and every step stay exact). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>

#include "check.h"
#include "scenario_runner.h"

#define WAIT_LIMIT_MS 10000
#define MAX_HOLDERS 8
#define MAX_PERMITS 16
#define MAX_THREADS 16
#define LINE_LEN 200
#define WORD_LEN 64
#define NAME_LEN 256

/* One client per client word of the layout (its own link). */
struct client {
  char word[WORD_LEN];
  struct lk_client *client;
};

/* One session per client and session word ("default": the client's). */
struct session {
  const struct client *client;
  char word[WORD_LEN];
  struct lk_session *session;
};

struct holder {
  char name[32];
  const struct lks_sink *sink;
  const struct client *client;   /* shared by the holders of its word */
  const struct session *session; /* shared likewise; NULL for an observer */
  char lock_name[NAME_LEN];      /* the lock's or election's name */
  const struct lk_lock *lock;    /* the lock, or the election's; NULL for an observer */
  struct lk_lock *owned;         /* a lock holder's lock (freed at teardown) */
  struct lk_election *election;  /* an election holder's */
  struct lk_observer *observer;  /* an observer holder's, once started */
  struct lk_acquisition *acquisition; /* the last acquire_start's */
  struct lk_semaphore *semaphore;     /* a semaphore holder's */
  struct lk_lock *won;                /* the slot it won (under won_mutex) */
};

/* A semaphore holder's slot is won on its acquire's thread and read by
 * the steps: under this mutex. */
static pthread_mutex_t won_mutex = PTHREAD_MUTEX_INITIALIZER;

struct labelled {
  char label[32];
  struct lk_permit permit;
  int used;
};

/* A blocking call on a thread of its own: acquire, campaign, resign. */
struct acquirer {
  pthread_t thread;
  struct holder *holder;
  int joined;
  char value[NAME_LEN]; /* campaign's */
  uint64_t grace_ms;    /* resign's */
};

/* The face's state for the scenario being played. */
struct face {
  struct lk_memory *service;
  struct client clients[MAX_HOLDERS];
  int n_clients;
  struct session sessions[MAX_HOLDERS];
  int n_sessions;
  struct holder holders[MAX_HOLDERS];
  int n_holders;
  struct labelled permits[MAX_PERMITS];
  struct acquirer threads[MAX_THREADS];
  int n_threads;
  char err[512];
  char word[NAME_LEN]; /* a leader's value, for the runner to copy */
};

static void trace(const struct holder *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(const struct holder *h, const char *fmt, ...) {
  char line[LINE_LEN];
  int k = snprintf(line, sizeof line, "%s ", h->name);
  va_list ap;
  va_start(ap, fmt);
  if (k > 0 && (size_t)k < sizeof line) vsnprintf(line + k, sizeof line - (size_t)k, fmt, ap);
  va_end(ap);
  lks_trace(h->sink, line);
}

static void on_state(void *ud, enum lk_state from, enum lk_state to, enum lk_reason why) {
  trace(ud, "state %s->%s %s", lk_state_name((int)from), lk_state_name((int)to),
        lk_reason_name((int)why));
}

static void on_acquired(void *ud, uint64_t token) { trace(ud, "acquired token=%" PRIu64, token); }

static void on_fence(void *ud, uint64_t token, uint64_t in_flight) {
  trace(ud, "fence token=%" PRIu64 " in_flight=%" PRIu64, token, in_flight);
}

static void on_drained(void *ud) { trace(ud, "drained"); }

/* An observer's events, as the other faces print them. */
static void on_observed(void *ud, enum lk_observed what, const struct lk_leader *l) {
  switch (what) {
    case LK_OBSERVED_LEADER:
    case LK_OBSERVED_PROCLAIMED:
      trace(ud, "observed %s value=%.*s token=%" PRIu64,
            what == LK_OBSERVED_LEADER ? "leader" : "proclaimed", (int)l->value_len,
            l->value ? (const char *)l->value : "", l->token);
      return;
    case LK_OBSERVED_NO_LEADER: trace(ud, "observed no-leader"); return;
    case LK_OBSERVED_RECONNECTING: trace(ud, "observed reconnecting"); return;
  }
}

/* A semaphore holder's slot won: kept (a step on it may follow a `wait` on
 * the line at once), traced "took slot=I lock=NAME", then its callbacks
 * set. A failed acquire traces "acquire failed: STATUS". */
static enum lk_status took(struct holder *h, enum lk_status s, struct lk_lock *lock) {
  if (s != LK_OK) {
    trace(h, "acquire failed: %s", lk_status_name((int)s));
    return s;
  }
  uint32_t slot = 0;
  lk_lock_slot(lock, &slot);
  pthread_mutex_lock(&won_mutex);
  int second = h->won != NULL;
  if (!second) h->won = lock;
  pthread_mutex_unlock(&won_mutex);
  if (second) { /* one slot per holder in a file */
    lk_lock_free(lock);
    return LK_INVALID_ARGUMENT;
  }
  trace(h, "took slot=%" PRIu32 " lock=%s", slot, lk_lock_name(lock));
  lk_set_on_state_change(lock, on_state, h);
  lk_set_on_acquired(lock, on_acquired, h);
  lk_set_on_fence(lock, on_fence, h);
  lk_set_on_drained(lock, on_drained, h);
  return LK_OK;
}

/* The slot a semaphore holder won, NULL before. */
static struct lk_lock *won(struct holder *h) {
  pthread_mutex_lock(&won_mutex);
  struct lk_lock *lock = h->won;
  pthread_mutex_unlock(&won_mutex);
  return lock;
}

static void *semaphore_thread(void *arg) {
  struct acquirer *a = arg;
  struct lk_lock *lock = NULL;
  enum lk_status s = lk_semaphore_acquire(a->holder->semaphore, WAIT_LIMIT_MS, &lock);
  took(a->holder, s, lock);
  return NULL;
}

static void *acquire_thread(void *arg) {
  struct acquirer *a = arg;
  lk_lock_acquire(a->holder->lock, WAIT_LIMIT_MS, NULL);
  return NULL;
}

static void *campaign_thread(void *arg) {
  struct acquirer *a = arg;
  lk_election_campaign(a->holder->election, (const uint8_t *)a->value, strlen(a->value),
                       WAIT_LIMIT_MS, NULL);
  return NULL;
}

static void *resign_thread(void *arg) {
  struct acquirer *a = arg;
  lk_election_resign(a->holder->election, a->grace_ms);
  return NULL;
}

/* Joins the pending acquires of `h` (NULL: of every holder). */
static void join_acquires(struct face *f, const struct holder *h) {
  for (int i = 0; i < f->n_threads; i++) {
    if (f->threads[i].joined || (h && f->threads[i].holder != h)) continue;
    pthread_join(f->threads[i].thread, NULL);
    f->threads[i].joined = 1;
  }
}

static int failed(struct face *f, struct lks_observed *out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Runs `run` on a thread of its own for `h` (its value and grace copied). */
static int in_background(struct face *f, struct holder *h, void *(*run)(void *),
                         const char *value, uint64_t grace_ms, struct lks_observed *out) {
  if (f->n_threads == MAX_THREADS) return failed(f, out, "too many background calls");
  struct acquirer *a = &f->threads[f->n_threads];
  memset(a, 0, sizeof *a);
  a->holder = h;
  snprintf(a->value, sizeof a->value, "%s", value ? value : "");
  a->grace_ms = grace_ms;
  if (pthread_create(&a->thread, NULL, run, a) != 0) return failed(f, out, "pthread_create failed");
  f->n_threads++;
  return 0;
}
static int failed(struct face *f, struct lks_observed *out, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(f->err, sizeof f->err, fmt, ap);
  va_end(ap);
  out->error = f->err;
  return -1;
}

static struct holder *holder_of(struct face *f, const char *name) {
  for (int i = 0; name && i < f->n_holders; i++)
    if (strcmp(f->holders[i].name, name) == 0) return &f->holders[i];
  return NULL;
}

static struct labelled *permit_of(struct face *f, const char *label) {
  for (int i = 0; label && i < MAX_PERMITS; i++)
    if (f->permits[i].used && strcmp(f->permits[i].label, label) == 0) return &f->permits[i];
  return NULL;
}

static void teardown(void *ctx);

static int setup_failed(struct face *f, const char *what) {
  snprintf(f->err, sizeof f->err, "%s: %s", what, lk_last_error());
  return -1;
}

/* The client of `word`, made on first use. */
static const struct client *client_of(struct face *f, const struct lk_client_options *o,
                                      const char *word) {
  for (int i = 0; i < f->n_clients; i++)
    if (strcmp(f->clients[i].word, word) == 0) return &f->clients[i];
  struct client *c = &f->clients[f->n_clients];
  if (lk_client_new(o, &c->client) != LK_OK) return NULL;
  snprintf(c->word, sizeof c->word, "%s", word);
  f->n_clients++;
  return c;
}

/* The session of `word` on client `c`, made on first use: the client's
 * own for "default", else a new one with the client's options (the
 * scenario's settings). */
static const struct session *session_of(struct face *f, const struct client *c, const char *word) {
  for (int i = 0; i < f->n_sessions; i++)
    if (f->sessions[i].client == c && strcmp(f->sessions[i].word, word) == 0)
      return &f->sessions[i];
  struct session *s = &f->sessions[f->n_sessions];
  enum lk_status st = strcmp(word, "default") == 0 ? lk_client_session(c->client, &s->session)
                                                   : lk_session_new(c->client, NULL, &s->session);
  if (st != LK_OK) return NULL;
  s->client = c;
  snprintf(s->word, sizeof s->word, "%s", word);
  f->n_sessions++;
  return s;
}

static int setup(void *ctx, const struct lks_scenario *s, const struct lks_sink *sink,
                 const char **error) {
  struct face *f = ctx;
  memset(f, 0, sizeof *f);
  *error = f->err;
  struct lk_client_options o = LK_CLIENT_OPTIONS_INIT;
  o.ttl_ms = s->settings.ttl_ms;
  o.keepalive_interval_ms = s->settings.keepalive_interval_ms;
  o.keepalive_timeout_ms = s->settings.keepalive_timeout_ms;
  o.retry_interval_ms = s->settings.retry_interval_ms;
  o.margin_ms = s->settings.margin_ms;
  o.reacquire = true;
  if (lk_memory_new(&f->service) != LK_OK) return setup_failed(f, "lk_memory_new");
  o.memory = f->service;
  if (s->n_holders > MAX_HOLDERS) {
    snprintf(f->err, sizeof f->err, "more than %d holders", MAX_HOLDERS);
    return -1;
  }
  /* In holder order: clients, sessions and locks as the layout says. */
  for (size_t i = 0; i < s->n_holders; i++) {
    if (strlen(s->holders[i]) >= sizeof f->holders[0].name ||
        strlen(s->holder_client[i]) >= WORD_LEN || strlen(s->holder_session[i]) >= WORD_LEN ||
        strlen(s->holder_lock[i]) >= NAME_LEN) {
      snprintf(f->err, sizeof f->err, "holder %s: a name or word too long for this face",
               s->holders[i]);
      return -1;
    }
    struct holder *h = &f->holders[f->n_holders];
    snprintf(h->name, sizeof h->name, "%s", s->holders[i]);
    snprintf(h->lock_name, sizeof h->lock_name, "%s", s->holder_lock[i]);
    h->sink = sink;
    if (!(h->client = client_of(f, &o, s->holder_client[i])))
      return setup_failed(f, "lk_client_new");
    f->n_holders++;
    const char *role = s->holder_role[i];
    if (strcmp(role, "observe") == 0) continue; /* started by `observe` */
    if (!(h->session = session_of(f, h->client, s->holder_session[i])))
      return setup_failed(f, "session");
    if (strcmp(role, "election") == 0) {
      if (lk_session_election_new(h->session->session, h->lock_name, &h->election) != LK_OK)
        return setup_failed(f, "lk_session_election_new");
      h->lock = lk_election_lock(h->election);
    } else if (strcmp(role, "read") == 0 || strcmp(role, "write") == 0) {
      /* A read/write lock's reader or writer: an lk_lock like any other. */
      struct lk_rwlock *rw = NULL;
      if (lk_session_rwlock_new(h->session->session, h->lock_name, &rw) != LK_OK)
        return setup_failed(f, "lk_session_rwlock_new");
      enum lk_status st = role[0] == 'r' ? lk_rwlock_reader(rw, &h->owned)
                                         : lk_rwlock_writer(rw, &h->owned);
      lk_rwlock_free(rw); /* the lock outlives its rwlock handle */
      if (st != LK_OK) return setup_failed(f, "lk_rwlock_reader/writer");
      h->lock = h->owned;
    } else if (strcmp(role, "semaphore") == 0) {
      /* No lock until its acquire wins a slot (took): nothing to listen to. */
      if (lk_session_semaphore_new(h->session->session, h->lock_name, s->holder_limit[i],
                                   &h->semaphore) != LK_OK)
        return setup_failed(f, "lk_session_semaphore_new");
      continue;
    } else {
      if (lk_session_lock_new(h->session->session, h->lock_name, &h->owned) != LK_OK)
        return setup_failed(f, "lk_session_lock_new");
      h->lock = h->owned;
    }
    if (lk_set_on_state_change(h->lock, on_state, h) != LK_OK ||
        lk_set_on_acquired(h->lock, on_acquired, h) != LK_OK ||
        lk_set_on_fence(h->lock, on_fence, h) != LK_OK ||
        lk_set_on_drained(h->lock, on_drained, h) != LK_OK)
      return setup_failed(f, "lock setup");
  }
  return 0;
}

/* The service revokes the current lease of the holder's session. */
static int revoke_lease(struct face *f, const struct holder *h, struct lks_observed *out) {
  int64_t lease = 0;
  bool found = false;
  enum lk_status s = lk_session_lease(h->session->session, &lease);
  if (s != LK_OK)
    return failed(f, out, "revoke_lease: the session of %s has no lease (%s)", h->name,
                  lk_status_name((int)s));
  if (lk_memory_revoke_lease(f->service, lease, &found) != LK_OK)
    return failed(f, out, "revoke_lease: %s", lk_last_error());
  return found ? 0 : failed(f, out, "revoke_lease: no lease %" PRId64 " on the service", lease);
}

/* Link faults act on the link of the holder's client (every session of it). */
static int fault(struct face *f, const struct lks_step *step, struct holder *h,
                 struct lks_observed *out) {
  const struct lk_client *c = h->client->client;
  enum lk_status s;
  switch ((enum lks_fault)step->fault) {
    case LKS_FAULT_PARTITION: s = lk_link_partition(c); break;
    case LKS_FAULT_HEAL: s = lk_link_heal(c); break;
    case LKS_FAULT_DROP_REPLIES: s = lk_link_drop_keepalive_replies(c, true); break;
    case LKS_FAULT_KEEP_REPLIES: s = lk_link_drop_keepalive_replies(c, false); break;
    case LKS_FAULT_DELAY_REPLIES: s = lk_link_delay_keepalive_replies(c, step->ms); break;
    case LKS_FAULT_FAIL_KEEPALIVES: s = lk_link_fail_keepalives(c, "injected failure"); break;
    case LKS_FAULT_STOP_FAILING: s = lk_link_fail_keepalives(c, NULL); break;
    case LKS_FAULT_LEASE_LOST: s = lk_link_declare_lease_lost(c); break;
    case LKS_FAULT_FREEZE_EXPIRY: s = lk_memory_freeze_expiry(f->service, true); break;
    case LKS_FAULT_THAW_EXPIRY: s = lk_memory_freeze_expiry(f->service, false); break;
    /* LK_NOT_HELD when nobody holds the name. */
    case LKS_FAULT_DELETE_KEY: s = lk_memory_delete_lock_key(f->service, h->lock_name); break;
    case LKS_FAULT_REVOKE_LEASE: return revoke_lease(f, h, out);
    default: return failed(f, out, "unknown fault %s", step->fault_name);
  }
  return s == LK_OK ? 0 : failed(f, out, "%s: %s", step->fault_name, lk_last_error());
}

static int perform(void *ctx, const struct lks_step *step, struct lks_observed *out) {
  struct face *f = ctx;
  struct holder *h = holder_of(f, step->holder);
  if (step->holder && !h) return failed(f, out, "no holder %s", step->holder);
  /* The runner checks each step's holder kind: a lock step has a lock, an
   * election step an election, `observe` an observer. A semaphore holder's
   * lock steps act on the slot it won. */
  if (h && h->semaphore) {
    h->lock = won(h);
    switch ((enum lks_do)step->what) {
      case LKS_DO_ACQUIRE:
        return in_background(f, h, semaphore_thread, NULL, 0, out);
      case LKS_DO_TRY_ACQUIRE: {
        struct lk_lock *lock = NULL;
        enum lk_status s = lk_semaphore_try_acquire(h->semaphore, &lock);
        /* A refusal is no acquire that failed: not traced. */
        if (s == LK_OK) s = took(h, s, lock);
        out->kind = LKS_SAW_WORD;
        out->word = s == LK_OK ? "ok" : lk_status_name((int)s);
        return 0;
      }
      case LKS_DO_SLOT: {
        uint32_t slot = 0;
        out->kind = LKS_SAW_SLOT;
        if (!h->lock) return 0; /* none won yet */
        if (lk_lock_slot(h->lock, &slot) != LK_OK) return failed(f, out, "%s", lk_last_error());
        out->has_token = true;
        out->token = slot;
        out->word = lk_lock_name(h->lock);
        return 0;
      }
      case LKS_DO_SEMAPHORE: {
        /* Another handle of the name on the holder's session, asking for `ms`. */
        struct lk_semaphore *other = NULL;
        enum lk_status s = lk_session_semaphore_new(h->session->session, h->lock_name,
                                                    (uint32_t)step->ms, &other);
        lk_semaphore_free(other);
        out->kind = LKS_SAW_WORD;
        out->word = s == LK_OK ? "ok" : lk_status_name((int)s);
        return 0;
      }
      case LKS_DO_FAULT: /* the link of its client */
      case LKS_DO_SHUTDOWN:
        break;
      default:
        if (!h->lock) return failed(f, out, "%s has won no slot yet", h->name);
    }
  }
  switch ((enum lks_do)step->what) {
    case LKS_DO_ACQUIRE:
      return in_background(f, h, acquire_thread, NULL, 0, out);
    case LKS_DO_TRY_ACQUIRE: {
      enum lk_status s = lk_lock_try_acquire(h->lock, NULL);
      out->kind = LKS_SAW_WORD;
      out->word = s == LK_OK ? "ok" : lk_status_name((int)s);
      return 0;
    }
    case LKS_DO_PERMIT: {
      struct lk_permit permit = LK_PERMIT_INIT;
      enum lk_status s = lk_permit(h->lock, &permit);
      out->kind = LKS_SAW_PERMIT;
      out->word = s == LK_OK ? "granted" : lk_status_name((int)s);
      if (s != LK_OK) return 0;
      out->has_token = lk_permit_token(&permit, &out->token) == LK_OK;
      if (step->label) {
        for (int k = 0; k < MAX_PERMITS; k++) {
          if (!f->permits[k].used) {
            f->permits[k].used = 1;
            snprintf(f->permits[k].label, sizeof f->permits[k].label, "%s", step->label);
            f->permits[k].permit = permit; /* moved: this copy is the one ended */
            return 0;
          }
        }
        lk_permit_end(&permit);
        return failed(f, out, "too many labelled permits");
      }
      lk_permit_end(&permit);
      return 0;
    }
    case LKS_DO_END: {
      struct labelled *l = permit_of(f, step->label);
      if (!l) return failed(f, out, "no such permit");
      lk_permit_end(&l->permit);
      l->used = 0;
      return 0;
    }
    case LKS_DO_VALID: {
      struct labelled *l = permit_of(f, step->label);
      if (!l) return failed(f, out, "no such permit");
      out->kind = LKS_SAW_BOOL;
      out->flag = lk_permit_valid(&l->permit);
      return 0;
    }
    case LKS_DO_STATE: {
      enum lk_state st;
      if (lk_lock_state(h->lock, &st) != LK_OK) return failed(f, out, "%s", lk_last_error());
      out->kind = LKS_SAW_WORD;
      out->word = lk_state_name((int)st);
      return 0;
    }
    case LKS_DO_TOKEN:
      out->kind = LKS_SAW_TOKEN;
      out->has_token = lk_lock_token(h->lock, &out->token) == LK_OK;
      return 0;
    case LKS_DO_RELEASE:
      return lk_lock_release(h->lock) == LK_OK ? 0 : failed(f, out, "%s", lk_last_error());
    case LKS_DO_FAULT:
      return fault(f, step, h, out);
    case LKS_DO_STALL_DRIVER:
      return lk_stall_driver(step->ms) == LK_OK ? 0 : failed(f, out, "%s", lk_last_error());
    case LKS_DO_CLOSE:
      /* Releases (a pending acquire returns) and ends the callbacks; the
       * handle stays for the steps that follow (freed at teardown). */
      if (lk_lock_close(h->lock) != LK_OK) return failed(f, out, "%s", lk_last_error());
      join_acquires(f, h);
      return 0;
    case LKS_DO_EVENTS: /* no pull-style event stream in the C API yet */
      out->kind = LKS_SAW_UNSUPPORTED;
      return 0;
    case LKS_DO_ACQUIRE_START: /* the outcome shows in the trace: no done callback */
      lk_acquisition_free(h->acquisition);
      h->acquisition = NULL;
      return lk_lock_acquire_start(h->lock, WAIT_LIMIT_MS, NULL, NULL, &h->acquisition) == LK_OK
                 ? 0
                 : failed(f, out, "%s", lk_last_error());
    case LKS_DO_CANCEL:
      if (!h->acquisition) return failed(f, out, "no acquire_start of %s", h->name);
      return lk_acquisition_cancel(h->acquisition) == LK_OK ? 0 : failed(f, out, "%s", lk_last_error());
    case LKS_DO_SHUTDOWN:
      return lk_client_shutdown(h->client->client) == LK_OK ? 0
                                                             : failed(f, out, "%s", lk_last_error());
    case LKS_DO_CAMPAIGN:
      return in_background(f, h, campaign_thread, step->value, 0, out);
    case LKS_DO_RESIGN:
      return in_background(f, h, resign_thread, NULL, step->ms, out);
    case LKS_DO_PROCLAIM: {
      const char *v = step->value ? step->value : "";
      enum lk_status s = lk_election_proclaim(h->election, (const uint8_t *)v, strlen(v));
      out->kind = LKS_SAW_WORD;
      out->word = s == LK_OK ? "ok" : lk_status_name((int)s);
      return 0;
    }
    case LKS_DO_LEADER: {
      struct lk_leader l = LK_LEADER_INIT;
      if (lk_election_leader(h->election, &l) != LK_OK) return failed(f, out, "%s", lk_last_error());
      out->kind = LKS_SAW_LEADER;
      if (l.has_leader) {
        snprintf(f->word, sizeof f->word, "%.*s", (int)l.value_len,
                 l.value ? (const char *)l.value : "");
        out->word = f->word; /* NULL: nobody leads */
        out->has_token = true;
        out->token = l.token;
      }
      lk_leader_clear(&l);
      return 0;
    }
    case LKS_DO_OBSERVE:
      if (h->observer) return failed(f, out, "%s observes already", h->name);
      return lk_observer_start(h->client->client, h->lock_name, on_observed, h, &h->observer) ==
                     LK_OK
                 ? 0
                 : failed(f, out, "%s", lk_last_error());
    case LKS_DO_DOWNGRADE: {
      enum lk_status s = lk_lock_downgrade(h->lock);
      out->kind = LKS_SAW_WORD;
      out->word = s == LK_OK ? "ok" : lk_status_name((int)s);
      return 0;
    }
    case LKS_DO_MODE: {
      enum lk_mode m = LK_MODE_NONE;
      if (lk_lock_mode(h->lock, &m) != LK_OK) return failed(f, out, "%s", lk_last_error());
      if (m == LK_MODE_NONE) return failed(f, out, "%s is not a read/write lock holder", h->name);
      out->kind = LKS_SAW_WORD;
      out->word = m == LK_MODE_READ ? "read" : "write";
      return 0;
    }
    case LKS_DO_SLOT:
    case LKS_DO_SEMAPHORE:
      break; /* a semaphore holder's, above */
  }
  return failed(f, out, "unknown step %s", step->do_name);
}

/* Releases (so a pending acquire returns), joins, frees. */
static void teardown(void *ctx) {
  struct face *f = ctx;
  for (int i = 0; i < f->n_holders; i++)
    if (f->holders[i].lock) lk_lock_release(f->holders[i].lock);
  /* A semaphore holder's acquire still waiting ends at its timeout. */
  join_acquires(f, NULL);
  for (int i = 0; i < f->n_holders; i++) {
    lk_lock_free(f->holders[i].won); /* releases */
    lk_semaphore_free(f->holders[i].semaphore);
  }
  for (int i = 0; i < MAX_PERMITS; i++) lk_permit_end(&f->permits[i].permit);
  for (int i = 0; i < f->n_holders; i++) {
    lk_acquisition_free(f->holders[i].acquisition);
    lk_observer_free(f->holders[i].observer); /* no callback after it */
    lk_election_free(f->holders[i].election);
    lk_lock_free(f->holders[i].owned);
  }
  for (int i = 0; i < f->n_sessions; i++) lk_session_free(f->sessions[i].session);
  for (int i = 0; i < f->n_clients; i++) lk_client_free(f->clients[i].client);
  lk_memory_free(f->service);
  memset(f, 0, sizeof *f);
}

/* Starts dlock's threads and runs every path once before any scenario's
 * clock starts, so first-use costs (thread creation; valgrind's translation
 * of code it has not run yet) fall outside the time windows. */
static void warm_up(void *ctx) {
  (void)ctx;
  struct lk_memory *m = NULL;
  struct lk_client *c = NULL;
  struct lk_session *s = NULL;
  struct lk_lock *l = NULL;
  struct lk_client_options o = short_options();
  struct lk_permit p = LK_PERMIT_INIT;
  int64_t lease = 0;
  bool found = false;
  if (lk_memory_new(&m) == LK_OK) o.memory = m;
  if (lk_client_new(&o, &c) == LK_OK && lk_session_new(c, NULL, &s) == LK_OK &&
      lk_session_lock_new(s, "warm-up", &l) == LK_OK &&
      lk_lock_acquire(l, WAIT_LIMIT_MS, NULL) == LK_OK && lk_permit(l, &p) == LK_OK) {
    lk_permit_end(&p);
    lk_lock_release(l);
    if (lk_session_lease(s, &lease) == LK_OK) lk_memory_revoke_lease(m, lease, &found);
  }
  lk_lock_free(l);
  /* The election paths too: campaign, leader, proclaim, an observer, resign. */
  struct lk_election *e = NULL;
  struct lk_observer *obs = NULL;
  struct lk_leader leader = LK_LEADER_INIT;
  enum lk_observed what;
  if (c && s && lk_session_election_new(s, "warm-up/e", &e) == LK_OK &&
      lk_observer_new(c, "warm-up/e", &obs) == LK_OK &&
      lk_election_campaign(e, (const uint8_t *)"v", 1, WAIT_LIMIT_MS, NULL) == LK_OK) {
    lk_election_leader(e, &leader);
    lk_election_proclaim(e, (const uint8_t *)"w", 1);
    lk_observer_next(obs, WAIT_LIMIT_MS, &what, &leader);
    lk_election_resign(e, 0);
  }
  lk_leader_clear(&leader);
  lk_observer_free(obs);
  lk_election_free(e);
  /* And a read/write lock's: a writer acquires, downgrades, releases. */
  struct lk_rwlock *rw = NULL;
  struct lk_lock *w = NULL;
  enum lk_mode mode;
  if (s && lk_session_rwlock_new(s, "warm-up/rw", &rw) == LK_OK &&
      lk_rwlock_writer(rw, &w) == LK_OK && lk_lock_acquire(w, WAIT_LIMIT_MS, NULL) == LK_OK) {
    lk_lock_downgrade(w);
    lk_lock_mode(w, &mode);
    lk_lock_release(w);
  }
  lk_lock_free(w);
  lk_rwlock_free(rw);
  /* And a semaphore's: a try, a second handle's limit refused, an acquire. */
  struct lk_semaphore *sem = NULL, *other = NULL;
  struct lk_lock *slot = NULL, *second = NULL;
  uint32_t n = 0;
  if (s && lk_session_semaphore_new(s, "warm-up/sem", 2, &sem) == LK_OK &&
      lk_semaphore_try_acquire(sem, &slot) == LK_OK &&
      lk_semaphore_acquire(sem, WAIT_LIMIT_MS, &second) == LK_OK) {
    lk_lock_slot(slot, &n);
    lk_session_semaphore_new(s, "warm-up/sem", 3, &other);
    lk_lock_release(second);
    lk_lock_release(slot);
  }
  lk_lock_free(second);
  lk_lock_free(slot);
  lk_semaphore_free(other);
  lk_semaphore_free(sem);
  lk_session_free(s);
  lk_client_free(c);
  lk_memory_free(m);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCENARIO_DIR\n", argv[0]);
    return 2;
  }
  int n = lks_count_files(argv[1]);
  if (n < 22) {
    fprintf(stderr, "expected the twenty-two scenarios in %s, found %d\n", argv[1], n);
    return 1;
  }
  static struct face f;
  const struct lks_face face = {&f, warm_up, setup, perform, teardown};
  return lks_play_dir_with(argv[1], &face, LKS_PLAYS_ELECTIONS | LKS_PLAYS_RWLOCKS |
                                                LKS_PLAYS_SEMAPHORES)
             ? 1
             : 0;
}
