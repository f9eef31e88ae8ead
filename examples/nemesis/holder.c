/* The C holder of the nemesis (docs/nemesis.md, "A holder of another face"):
 * contends for one lock on etcd through the endpoints given, works under
 * permits as fast as it can (a guarded put of KEY = ID:SEQ:TOKEN, then one
 * line "ID TOKEN SEQ" to the gate), and appends the history records of the
 * holder protocol to FILE, stamped with CLOCK_BOOTTIME in nanoseconds. EOF
 * on stdin: records "final" and exits.
 *
 * --election 1: a candidate of the election NAME (lk_election_new) instead
 * of a lock holder, as the Rust holder: it campaigns (value ID) where it
 * would acquire, and as the leader proclaims ID:N every 100th permit (a
 * "proclaim" record). Only the leader writes: a permit is leadership.
 *
 * --semaphore N: a holder of the semaphore NAME of N slots
 * (lk_semaphore_new), as the Rust holder: it waits for any slot, then
 * works on that slot's lock (a fenced slot takes itself back), writing
 * KEY-<slot> (guarded by the slot's name on PostgreSQL) and "ID TOKEN SEQ
 * SLOT" to the gate; every record of the slot carries "li": slot, and its
 * first "acquired" is stamped when the acquire returned.
 *
 * --rwlock r|w: a reader or a writer of the read/write lock NAME
 * (lk_rwlock_new, then lk_rwlock_reader / lk_rwlock_writer), as the Rust
 * holder: its unit is a read or a write of the gate's two-key register,
 * the line "ID TOKEN SEQ r|w" to the gate, recorded as a write of
 * "res":"register" with its "mode"; no guarded put. A mode of its own (no
 * --election, no --semaphore). On PostgreSQL the register is the two rows
 * (run KEY, keys a and b) of app.register instead, read or written in the
 * holder's own transaction under dlock.guard_read / dlock.guard_write
 * (pg_register below), and the holder records the rw_read / rw_write /
 * rw_refuse that the gate records on etcd. After a number of units drawn
 * in [20, 200] (seeded from ID, the generator of the other faces) it
 * releases (a "release" record) and queues again in the other mode on a
 * new handle (a "mode" record), so readers and writers hand over without
 * a fault and every face plays both modes.
 *
 * On PostgreSQL (--endpoints postgres://..., the nemesis's --backend
 * postgres): the client comes from DLOCK_ENDPOINTS (lk_client_from_env),
 * and the write is the holder's own transaction through libpq on the
 * direct connection --db URL (default: the endpoint):
 *   BEGIN; SELECT dlock.guard(NAME, TOKEN);
 *   INSERT INTO app.writes (run, h, seq, token) VALUES (KEY, ID, SEQ, TOKEN);
 *   COMMIT;
 * recorded as a write of "res":"pg": "ok", "fenced" (the guard raised
 * SQLSTATE DL001), "unknown" (the COMMIT went out, the connection broke
 * before its answer) or "error" (nothing committed).
 *
 * usage: holder --id ID --endpoints URLS --lock NAME --key KEY --gate HOST:PORT
 *               --history FILE [--ttl-ms N --interval-ms N --timeout-ms N
 *               --retry-ms N --margin-ms N --unit-ms N --idle-ms N --writes 0|1
 *               --election 0|1 --semaphore N --rwlock r|w --db URL]
 *
 * Build (scripts/test-nemesis.sh does): gcc -std=c11 -Iinclude
 *   -I/usr/include/postgresql examples/nemesis/holder.c -Ltarget/release
 *   -ldlock -lpq -lpthread */
#define _GNU_SOURCE
#include <dlock.h>
#include <libpq-fe.h>
#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int hist = -1;
static const char *id = "";
/* Set once before the stdin watcher may read them (the semaphore's slot
 * is known only once acquired): atomics. */
static const struct lk_lock *lock;
static long li = -1;
/* The read/write mode's handovers: units drawn in [20, 200] by the
 * nemesis's generator (xorshift64*, seeded by FNV-1a of ID), as every
 * face draws them. */
static uint64_t rw_x;

static void rw_seed(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
  rw_x = h ? h : 0x9E3779B97F4A7C15ull;
}

static uint64_t rw_units(void) {
  rw_x ^= rw_x >> 12;
  rw_x ^= rw_x << 25;
  rw_x ^= rw_x >> 27;
  return 20 + (rw_x * 0x2545F4914F6CDD1Dull) % 181;
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_BOOTTIME, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Appends {"t":t,"p":id,"ev":ev,<fields>} as one write(2). */
static void vrecord(uint64_t t, const char *ev, const char *fmt, va_list ap) {
  char fields[768] = "";
  if (fmt) vsnprintf(fields, sizeof fields, fmt, ap);
  char tag[32] = "";
  long slot = __atomic_load_n(&li, __ATOMIC_ACQUIRE);
  if (slot >= 0) snprintf(tag, sizeof tag, ",\"li\":%ld", slot);
  char line[1024];
  int n = snprintf(line, sizeof line, "{\"t\":%" PRIu64 ",\"p\":\"%s\",\"ev\":\"%s\"%s%s%s}\n", t, id, ev,
                   fields[0] ? "," : "", fields, tag);
  if (n > 0 && (size_t)n < sizeof line && write(hist, line, (size_t)n) < 0) {
    /* A full disk loses the record; the checker never invents one. */
  }
}

/* A record stamped now. */
static void record(const char *ev, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrecord(now_ns(), ev, fmt, ap);
  va_end(ap);
}

/* A record stamped t (an instant taken earlier). */
static void record_at(uint64_t t, const char *ev, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vrecord(t, ev, fmt, ap);
  va_end(ap);
}

/* Lower-case state name, as the history wants it. */
static const char *state_word(int s, char *buf, size_t len) {
  snprintf(buf, len, "%s", lk_state_name(s));
  for (char *c = buf; *c; c++) *c = (char)tolower((unsigned char)*c);
  return buf;
}

static void on_state(void *u, enum lk_state from, enum lk_state to, enum lk_reason why) {
  (void)u;
  char a[32], b[32];
  record("state", "\"at\":%" PRIu64 ",\"from\":\"%s\",\"to\":\"%s\",\"reason\":\"%s\",\"wall\":%lld", now_ns(),
         state_word(from, a, sizeof a), state_word(to, b, sizeof b), lk_reason_name(why), (long long)time(NULL));
}

/* The C callbacks carry no instant: `at` is when the callback ran (later
 * than the core's decision, so G1 leads come out smaller, never larger). */
static void on_fence(void *u, uint64_t token, uint64_t in_flight) {
  (void)u;
  record("fence", "\"at\":%" PRIu64 ",\"token\":%" PRIu64 ",\"in_flight\":%" PRIu64, now_ns(), token, in_flight);
}

static void on_acquired(void *u, uint64_t token) {
  (void)u;
  record("acquired", "\"at\":%" PRIu64 ",\"token\":%" PRIu64, now_ns(), token);
}

/* The holder's records of a lock's events (its first lock, and each
 * handover's new one). */
static void watch_events(const struct lk_lock *l) {
  lk_set_on_state_change(l, on_state, NULL);
  lk_set_on_fence(l, on_fence, NULL);
  lk_set_on_acquired(l, on_acquired, NULL);
}

static void *watch_stdin(void *u) {
  (void)u;
  char buf[256];
  while (read(0, buf, sizeof buf) > 0) {
  }
  enum lk_state st = LK_STATE_IDLE;
  uint64_t token = 0;
  const struct lk_lock *l = __atomic_load_n(&lock, __ATOMIC_ACQUIRE);
  if (!l) {
    record("final", "\"state\":\"acquiring\",\"token\":null");
    _exit(0);
  }
  lk_lock_state(l, &st);
  char w[32];
  if (lk_lock_token(l, &token) == LK_OK)
    record("final", "\"state\":\"%s\",\"token\":%" PRIu64, state_word(st, w, sizeof w), token);
  else
    record("final", "\"state\":\"%s\",\"token\":null", state_word(st, w, sizeof w));
  _exit(0);
}

/* The gate: one line each way; "ok", "refused", "unknown" or "error".
 * mode 0: a write under the lock ("ID TOKEN SEQ [SLOT]"); 'r' / 'w': a
 * read or a write of the two-key register ("ID TOKEN SEQ r|w"). */
static int gate_fd = -1;
static struct sockaddr_in gate_addr;

static const char *gate_write(uint64_t token, uint64_t seq, char mode) {
  if (gate_fd < 0) {
    gate_fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(gate_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(gate_fd, (struct sockaddr *)&gate_addr, sizeof gate_addr) != 0) {
      close(gate_fd);
      gate_fd = -1;
      return "error";
    }
  }
  char req[128];
  int n = mode    ? snprintf(req, sizeof req, "%s %" PRIu64 " %" PRIu64 " %c\n", id, token, seq, mode)
          : li >= 0 ? snprintf(req, sizeof req, "%s %" PRIu64 " %" PRIu64 " %ld\n", id, token, seq, li)
                    : snprintf(req, sizeof req, "%s %" PRIu64 " %" PRIu64 "\n", id, token, seq);
  if (write(gate_fd, req, (size_t)n) != n) goto lost;
  char rep[64];
  size_t got = 0;
  while (got < sizeof rep - 1) {
    ssize_t r = read(gate_fd, rep + got, 1);
    if (r <= 0) goto lost;
    if (rep[got++] == '\n') break;
  }
  rep[got] = 0;
  if (strncmp(rep, "ok", 2) == 0) return "ok";
  if (strncmp(rep, "stale", 5) == 0) return "refused";
lost:
  close(gate_fd);
  gate_fd = -1;
  return "unknown";
}

/* The guarded transaction on app.writes (PostgreSQL), over a connection of
 * its own, reopened after an error; "ok", "fenced", "unknown" or "error",
 * the SQLSTATE (or "io") in code. */
static PGconn *db;
static const char *db_url;

/* libpq prints the server's notices (a WARNING as the primary shuts down)
 * on stderr by default: the history has what matters. */
static void quiet(void *u, const char *msg) {
  (void)u;
  (void)msg;
}

static int pg_ok(PGresult *r, ExecStatusType want, char *code, size_t len) {
  int ok = PQresultStatus(r) == want;
  if (!ok) {
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    snprintf(code, len, "%s", st ? st : "io");
  }
  PQclear(r);
  return ok;
}

/* The read/write mode's run on PostgreSQL: its two rows of app.register
 * are made on each new connection (the first holder's insert wins). */
static const char *register_run;

/* Opens the connection unless open; 0 (code "connect" or the SQLSTATE)
 * when it cannot. */
static int pg_connect(char *code, size_t len) {
  if (db) return 1;
  const char *keys[] = {"dbname", "connect_timeout", NULL};
  const char *vals[] = {db_url, "2", NULL};
  db = PQconnectdbParams(keys, vals, 1);
  if (PQstatus(db) != CONNECTION_OK) {
    snprintf(code, len, "connect");
    PQfinish(db);
    db = NULL;
    return 0;
  }
  PQsetNoticeProcessor(db, quiet, NULL);
  const char *run[] = {register_run};
  if (register_run &&
      !pg_ok(PQexecParams(db,
                          "INSERT INTO app.register (run, k, token, seq) VALUES ($1, 'a', 0, 0), ($1, 'b', 0, 0) "
                          "ON CONFLICT DO NOTHING",
                          1, NULL, run, NULL, NULL, 0),
             PGRES_COMMAND_OK, code, len)) {
    PQfinish(db);
    db = NULL;
    return 0;
  }
  return 1;
}

/* The guard refused (DL001): roll back, keep the connection. */
static const char *pg_fenced(void) {
  char ignored[8];
  if (!pg_ok(PQexec(db, "ROLLBACK"), PGRES_COMMAND_OK, ignored, sizeof ignored)) {
    PQfinish(db);
    db = NULL;
  }
  return "fenced";
}

static const char *pg_write(const char *name, uint64_t token, const char *run, uint64_t seq, char *code,
                            size_t len) {
  code[0] = 0;
  if (!pg_connect(code, len)) return "error";
  char tok[24], sq[24];
  snprintf(tok, sizeof tok, "%" PRIu64, token);
  snprintf(sq, sizeof sq, "%" PRIu64, seq);
  const char *guard[] = {name, tok};
  const char *row[] = {run, id, sq, tok};
  const char *out = "error";
  if (!pg_ok(PQexec(db, "BEGIN"), PGRES_COMMAND_OK, code, len)) goto drop;
  if (!pg_ok(PQexecParams(db, "SELECT dlock.guard($1, $2::bigint)", 2, NULL, guard, NULL, NULL, 0),
             PGRES_TUPLES_OK, code, len)) {
    if (strcmp(code, "DL001") != 0) goto drop;
    return pg_fenced();
  }
  if (!pg_ok(PQexecParams(db, "INSERT INTO app.writes (run, h, seq, token) VALUES ($1, $2, $3::bigint, $4::bigint)",
                          4, NULL, row, NULL, NULL, 0),
             PGRES_COMMAND_OK, code, len))
    goto drop;
  if (pg_ok(PQexec(db, "COMMIT"), PGRES_COMMAND_OK, code, len)) return "ok";
  /* No answer to the COMMIT: it may have committed. An error the server
   * sent (a SQLSTATE) means it did not. */
  out = strcmp(code, "io") == 0 ? "unknown" : "error";
drop:
  PQfinish(db);
  db = NULL;
  return out;
}

/* One read or write (mode 'r' / 'w') of the two-key register
 * (PostgreSQL), as the Rust holder's:
 *   BEGIN; SELECT dlock.guard_read|guard_write(NAME, TOKEN);
 *   key a, then key b, a statement each (UPDATE ... SET token, seq, or
 *   SELECT); COMMIT;
 * in READ COMMITTED: a writer's commit between a reader's two selects is
 * seen half, so only the guards keep a read whole. "ok" (val: the pair
 * written or read, "TOKEN.SEQ" each; *at: when the COMMIT's answer came),
 * "fenced" (DL001; *at: when the guard's came), "unknown" or "error". */
static const char *pg_register(const char *name, uint64_t token, const char *run, uint64_t seq, char mode,
                               char *code, size_t len, char val[2][48], uint64_t *at) {
  code[0] = 0;
  if (!pg_connect(code, len)) return "error";
  char tok[24], sq[24];
  snprintf(tok, sizeof tok, "%" PRIu64, token);
  snprintf(sq, sizeof sq, "%" PRIu64, seq);
  const char *guard[] = {name, tok};
  const char *out = "error";
  if (!pg_ok(PQexec(db, "BEGIN"), PGRES_COMMAND_OK, code, len)) goto drop;
  if (!pg_ok(PQexecParams(db, mode == 'w' ? "SELECT dlock.guard_write($1, $2::bigint)"
                                          : "SELECT dlock.guard_read($1, $2::bigint)",
                          2, NULL, guard, NULL, NULL, 0),
             PGRES_TUPLES_OK, code, len)) {
    *at = now_ns();
    if (strcmp(code, "DL001") != 0) goto drop;
    return pg_fenced();
  }
  static const char *const keys[] = {"a", "b"};
  for (int k = 0; k < 2; k++) {
    if (mode == 'w') {
      const char *set[] = {run, keys[k], tok, sq};
      if (!pg_ok(PQexecParams(db, "UPDATE app.register SET token = $3::bigint, seq = $4::bigint "
                                  "WHERE run = $1 AND k = $2",
                              4, NULL, set, NULL, NULL, 0),
                 PGRES_COMMAND_OK, code, len))
        goto drop;
      snprintf(val[k], 48, "%s.%s", tok, sq);
    } else {
      const char *get[] = {run, keys[k]};
      PGresult *r = PQexecParams(db, "SELECT token::text || '.' || seq::text FROM app.register "
                                     "WHERE run = $1 AND k = $2",
                                 2, NULL, get, NULL, NULL, 0);
      if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
        snprintf(val[k], 48, "%s", PQgetvalue(r, 0, 0));
        PQclear(r);
      } else if (!pg_ok(r, PGRES_TUPLES_OK, code, len)) {
        goto drop;
      } else {
        snprintf(code, len, "norow");
        goto drop;
      }
    }
  }
  if (pg_ok(PQexec(db, "COMMIT"), PGRES_COMMAND_OK, code, len)) {
    *at = now_ns();
    return "ok";
  }
  out = strcmp(code, "io") == 0 ? "unknown" : "error";
drop:
  PQfinish(db);
  db = NULL;
  return out;
}

static void sleep_ms(uint64_t ms) {
  struct timespec t = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

static void die(const char *what) {
  fprintf(stderr, "holder: %s\n", what);
  exit(2);
}

int main(int argc, char **argv) {
  const char *endpoints = NULL, *name = NULL, *key = NULL, *gate = NULL, *path = NULL;
  struct lk_client_options o;
  lk_client_options_init(&o, LK_CLIENT_OPTIONS_VERSION);
  o.ttl_ms = 4000, o.keepalive_interval_ms = 1000, o.keepalive_timeout_ms = 500;
  o.retry_interval_ms = 250, o.margin_ms = 1000, o.reacquire = true;
  uint64_t unit = 10, idle = 5, writes = 1, election = 0, semaphore = 0;
  char rw = 0; /* --rwlock: 'r', 'w', or 0 (a plain lock) */
  for (int i = 1; i < argc; i += 2) {
    if (strncmp(argv[i], "--", 2) != 0 || i + 1 >= argc) {
      fprintf(stderr, "holder: bad argument %s (flags are --key value)\n", argv[i]);
      return 2;
    }
    const char *k = argv[i] + 2, *v = argv[i + 1];
    char *end = NULL;
    uint64_t n = strtoull(v, &end, 10);
    int num = end && *end == 0;
#define NUM(dst)                                                                                        \
  do {                                                                                                  \
    if (!num) die("a number flag got a word");                                                          \
    dst = n;                                                                                            \
  } while (0)
    if (!strcmp(k, "id")) id = v;
    else if (!strcmp(k, "endpoints")) endpoints = v;
    else if (!strcmp(k, "lock")) name = v;
    else if (!strcmp(k, "key")) key = v;
    else if (!strcmp(k, "gate")) gate = v;
    else if (!strcmp(k, "history")) path = v;
    else if (!strcmp(k, "ttl-ms")) NUM(o.ttl_ms);
    else if (!strcmp(k, "interval-ms")) NUM(o.keepalive_interval_ms);
    else if (!strcmp(k, "timeout-ms")) NUM(o.keepalive_timeout_ms);
    else if (!strcmp(k, "retry-ms")) NUM(o.retry_interval_ms);
    else if (!strcmp(k, "margin-ms")) NUM(o.margin_ms);
    else if (!strcmp(k, "unit-ms")) NUM(unit);
    else if (!strcmp(k, "idle-ms")) NUM(idle);
    else if (!strcmp(k, "writes")) NUM(writes);
    else if (!strcmp(k, "election")) NUM(election);
    else if (!strcmp(k, "semaphore")) NUM(semaphore);
    else if (!strcmp(k, "db")) db_url = v;
    else if (!strcmp(k, "rwlock")) {
      if (strcmp(v, "r") != 0 && strcmp(v, "w") != 0) die("--rwlock takes r or w");
      rw = v[0];
    }
    else {
      fprintf(stderr, "holder: unknown flag --%s\n", k);
      return 2;
    }
  }
  if (!*id || !endpoints || !name || !key || !gate || !path)
    die("--id, --endpoints, --lock, --key, --gate and --history are required");
  hist = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (hist < 0) die("cannot open --history");
  char host[64];
  const char *colon = strrchr(gate, ':');
  if (!colon || (size_t)(colon - gate) >= sizeof host) die("--gate is HOST:PORT");
  memcpy(host, gate, (size_t)(colon - gate));
  host[colon - gate] = 0;
  gate_addr.sin_family = AF_INET;
  gate_addr.sin_port = htons((uint16_t)atoi(colon + 1));
  if (inet_pton(AF_INET, host, &gate_addr.sin_addr) != 1) die("--gate: not an IPv4 address");
  int pg = !strncmp(endpoints, "postgres://", 11) || !strncmp(endpoints, "postgresql://", 13);
  if (pg && election) die("on PostgreSQL the holder takes a lock (no --election)");
  if (pg && rw) register_run = key;
  if (semaphore && election) die("--semaphore N takes no --election");
  if (rw && (election || semaphore)) die("--rwlock r|w is a mode of its own (no --election, no --semaphore)");
  if (pg && !db_url) db_url = endpoints;
  record("start", "\"face\":\"c\",\"pid\":%d,\"lock\":\"%s\",\"wall\":%lld,\"election\":%s,\"ttl_ms\":%" PRIu64
         ",\"margin_ms\":%" PRIu64 ",\"interval_ms\":%" PRIu64 ",\"backend\":\"%s\",\"semaphore\":%" PRIu64 ",\"rwlock\":%s",
         (int)getpid(), name, (long long)time(NULL), election ? "true" : "false", o.ttl_ms, o.margin_ms,
         o.keepalive_interval_ms, pg ? "postgres" : "etcd", semaphore,
         rw == 'r' ? "\"r\"" : rw == 'w' ? "\"w\"" : "null");

  struct lk_client *client = NULL;
  if (pg) {
    /* The PostgreSQL URL through the environment, as any face's FromEnv. */
    setenv("DLOCK_ENDPOINTS", endpoints, 1);
    /* A holder starting while the server restarts or stalls tries again
     * for up to 60 s, as a real service would; bad input still ends it. */
    for (int tries = 0;; tries++) {
      enum lk_status st = lk_client_from_env(&o, &client);
      if (st == LK_OK) break;
      if (st != LK_BACKEND || tries >= 240) die(lk_last_error());
      record("connect_failed", "\"error\":\"backend\"");
      struct timespec pause = {0, 250 * 1000 * 1000};
      nanosleep(&pause, NULL);
    }
  } else {
    o.endpoints = endpoints;
    if (lk_client_new(&o, &client) != LK_OK) die(lk_last_error());
  }
  struct lk_election *candidate = NULL;
  struct lk_rwlock *rwl = NULL; /* --rwlock: makes each handover's handle */
  uint64_t rw_left = 0;         /* --rwlock: units before the handover */
  char slot_key[512];
  pthread_t t;
  if (semaphore) {
    /* The stdin watcher first: a holder waiting for a slot ends too. */
    pthread_create(&t, NULL, watch_stdin, NULL);
    struct lk_semaphore *sem = NULL;
    if (lk_semaphore_new(client, name, (uint32_t)semaphore, &sem) != LK_OK) die(lk_last_error());
    struct lk_lock *l = NULL;
    for (;;) {
      record("acquire", NULL);
      enum lk_status s = lk_semaphore_acquire(sem, 30000, &l);
      if (s == LK_OK) break;
      record("acquire_err", "\"code\":\"%s\"", lk_status_name(s));
      sleep_ms(o.retry_interval_ms);
    }
    uint32_t slot = 0;
    uint64_t token = 0;
    lk_lock_slot(l, &slot);
    lk_lock_token(l, &token);
    snprintf(slot_key, sizeof slot_key, "%s-%u", key, slot);
    key = slot_key;
    name = lk_lock_name(l);
    __atomic_store_n(&li, (long)slot, __ATOMIC_RELEASE);
    __atomic_store_n(&lock, l, __ATOMIC_RELEASE);
    record("acquired", "\"at\":%" PRIu64 ",\"token\":%" PRIu64, now_ns(), token);
    record("acquire_ok", "\"token\":%" PRIu64, token);
  } else if (election) {
    if (lk_election_new(client, name, &candidate) != LK_OK) die(lk_last_error());
    lock = lk_election_lock(candidate);
  } else if (rw) {
    struct lk_lock *l = NULL;
    if (lk_rwlock_new(client, name, &rwl) != LK_OK) die(lk_last_error());
    if ((rw == 'r' ? lk_rwlock_reader(rwl, &l) : lk_rwlock_writer(rwl, &l)) != LK_OK) die(lk_last_error());
    lock = l;
    rw_seed(id);
    rw_left = rw_units();
  } else {
    struct lk_lock *l = NULL;
    if (lk_lock_new(client, name, &l) != LK_OK) die(lk_last_error());
    lock = l;
  }
  watch_events(lock);
  if (!semaphore) pthread_create(&t, NULL, watch_stdin, NULL);

  uint64_t seq = 0, refused_n = 0, permits = 0;
  int last_refusal = -1;
  for (;;) {
    enum lk_state st = LK_STATE_IDLE;
    lk_lock_state(lock, &st);
    if (st == LK_STATE_IDLE || st == LK_STATE_RELEASED) {
      record("acquire", NULL);
      uint64_t token = 0;
      enum lk_status s = candidate ? lk_election_campaign(candidate, (const uint8_t *)id, strlen(id), 30000, &token)
                                   : lk_lock_acquire(lock, 30000, &token);
      if (s == LK_OK) {
        record("acquire_ok", "\"token\":%" PRIu64, token);
      } else {
        record("acquire_err", "\"code\":\"%s\"", lk_status_name(s));
        sleep_ms(o.retry_interval_ms);
      }
      continue;
    }
    uint64_t t0 = now_ns();
    struct lk_permit p;
    enum lk_status s = lk_permit(lock, &p);
    if (s != LK_OK) {
      refused_n++;
      if ((int)s != last_refusal) {
        char w[32];
        lk_lock_state(lock, &st);
        record("refused", "\"reason\":\"%s\",\"state\":\"%s\"", lk_status_name(s), state_word(st, w, sizeof w));
        last_refusal = (int)s;
      }
      sleep_ms(idle);
      continue;
    }
    if (last_refusal >= 0) {
      record("refusals", "\"n\":%" PRIu64, refused_n);
      refused_n = 0;
      last_refusal = -1;
    }
    uint64_t token = 0, deadline = 0;
    lk_permit_token(&p, &token);
    lk_lock_deadline(lock, &deadline);
    record("permit", "\"t0\":%" PRIu64 ",\"token\":%" PRIu64 ",\"deadline\":%" PRIu64, t0, token, deadline);
    if (candidate && ++permits % 100 == 0) {
      char value[128];
      int vn = snprintf(value, sizeof value, "%s:%" PRIu64, id, permits);
      s = lk_election_proclaim(candidate, (const uint8_t *)value, (size_t)vn);
      record("proclaim", "\"token\":%" PRIu64 ",\"value\":\"%s\",\"out\":\"%s\"", token, value,
             s == LK_OK ? "ok" : lk_status_name(s));
    }
    sleep_ms(unit / 2);
    if (writes && rw) {
      /* The register: the gate's (etcd), or app.register's two rows
       * (PostgreSQL), whose reads and writes this holder records as the
       * gate records its own: rw_read / rw_write stamped when the COMMIT's
       * answer came, t0 before the BEGIN; rw_refuse for DL001. */
      seq++;
      sleep_ms(unit / 2);
      uint64_t sent = now_ns();
      const char *out;
      char code[16] = "";
      if (pg) {
        char val[2][48] = {"", ""};
        uint64_t at = 0;
        out = pg_register(name, token, key, seq, rw, code, sizeof code, val, &at);
        if (!strcmp(out, "ok"))
          record_at(at, rw == 'w' ? "rw_write" : "rw_read",
                    "\"h\":\"%s\",\"token\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"a\":\"%s\",\"b\":\"%s\",\"t0\":%" PRIu64, id,
                    token, seq, val[0], val[1], sent);
        else if (!strcmp(out, "fenced"))
          record_at(at, "rw_refuse",
                    "\"h\":\"%s\",\"token\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"mode\":\"%c\",\"code\":\"%s\",\"t0\":%" PRIu64,
                    id, token, seq, rw, code, sent);
      } else {
        out = gate_write(token, seq, rw);
      }
      record("write", "\"res\":\"register\",\"mode\":\"%c\",\"token\":%" PRIu64 ",\"seq\":%" PRIu64
             ",\"sent\":%" PRIu64 ",\"out\":\"%s\",\"code\":\"%s\"",
             rw, token, seq, sent, out, code);
    } else if (writes) {
      seq++;
      char value[128];
      int vn = snprintf(value, sizeof value, "%s:%" PRIu64 ":%" PRIu64, id, seq, token);
      uint64_t sent = now_ns();
      const char *out;
      if (pg) {
        char code[16];
        out = pg_write(name, token, key, seq, code, sizeof code);
        record("write", "\"res\":\"pg\",\"token\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"sent\":%" PRIu64
               ",\"out\":\"%s\",\"code\":\"%s\"",
               token, seq, sent, out, code);
      } else {
        s = lk_lock_guarded_put(lock, token, (const uint8_t *)key, strlen(key), (const uint8_t *)value, (size_t)vn);
        out = s == LK_OK ? "ok" : s == LK_FENCED ? "fenced" : s == LK_BACKEND ? "unknown" : "error";
        record("write", "\"res\":\"etcd\",\"token\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"sent\":%" PRIu64
               ",\"out\":\"%s\",\"code\":\"%s\"",
               token, seq, sent, out, s == LK_OK ? "" : lk_status_name(s));
      }
      sleep_ms(unit / 2);
      sent = now_ns();
      out = gate_write(token, seq, 0);
      record("write", "\"res\":\"gate\",\"token\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"sent\":%" PRIu64 ",\"out\":\"%s\"",
             token, seq, sent, out);
    }
    lk_permit_end(&p);
    if (rw && --rw_left == 0) {
      /* The handover: let go, then queue again in the other mode on a new
       * handle of the same read/write lock (the loop acquires it). The old
       * handle is closed, not freed: the stdin watcher may still be reading
       * it for its `final` (a few closed handles a run). */
      struct lk_lock *old = (struct lk_lock *)lock, *l = NULL;
      s = lk_lock_close(old);
      record("release", "\"token\":%" PRIu64 ",\"mode\":\"%c\",\"out\":\"%s\"", token, rw,
             s == LK_OK ? "ok" : lk_status_name(s));
      rw = rw == 'r' ? 'w' : 'r';
      if ((rw == 'r' ? lk_rwlock_reader(rwl, &l) : lk_rwlock_writer(rwl, &l)) != LK_OK) die(lk_last_error());
      watch_events(l);
      __atomic_store_n(&lock, l, __ATOMIC_RELEASE);
      record("mode", "\"mode\":\"%c\"", rw);
      rw_left = rw_units();
    }
  }
}
