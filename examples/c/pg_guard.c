/* Writes to your own PostgreSQL table only while your dlock token still
 * holds: SELECT dlock.guard(name, token) first in every transaction
 * (docs/postgres.md), with libpq.
 *
 * Why: a holder paused past its TTL (a GC pause, swap, a frozen VM) resumes
 * not knowing that the lock moved on; any check it made before the pause
 * (lk_permit, the fence) is stale by then. dlock.guard checks inside the
 * write's own transaction: it holds the lock's row until COMMIT, so a
 * takeover waits for this transaction, and it raises SQLSTATE DL001 when
 * the token no longer holds, so the stale transaction rolls back instead of
 * landing after the new holder's writes.
 *
 *   DLOCK_ENDPOINTS='postgresql://app:secret@db.internal:5432/app' ./pg_guard [WHO] [UNITS]
 *
 * DATABASE_URL is the application's own connection (default
 * DLOCK_ENDPOINTS; set it when that URL carries dlock's own parameters, such
 * as dlock_single_node). It must be the database holding the dlock schema:
 * the guard runs there, in your transaction. PG_GUARD_PAUSE_AT=N stops this
 * process (SIGSTOP) before unit N, the pause the guard is for; resume it
 * with `kill -CONT`.
 *
 * Build: scripts/install-c.sh PREFIX && PKG_CONFIG_PATH=PREFIX/lib/pkgconfig
 *   make -C examples/c pg_guard   (needs libpq: Debian's libpq-dev) */
#define _GNU_SOURCE
#include <dlock.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME "examples/pg-guard"
/* dlock's own error code for "this token no longer holds the lock". */
#define GUARD_SQLSTATE "DL001"

/* Runs `sql` with `n` text parameters; 0 if it returned `want`, else -1
 * with the error's SQLSTATE in `state` (6 bytes) and its message printed. */
static int run(PGconn *db, const char *sql, int n, const char *const *params,
               ExecStatusType want, char state[6]) {
  PGresult *r = PQexecParams(db, sql, n, NULL, params, NULL, NULL, 0);
  int ok = PQresultStatus(r) == want;
  if (!ok) {
    const char *s = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    snprintf(state, 6, "%s", s ? s : "");
    if (strcmp(state, GUARD_SQLSTATE) != 0) fprintf(stderr, "%s: %s", sql, PQerrorMessage(db));
  }
  PQclear(r);
  return ok ? 0 : -1;
}

/* One unit of work in one transaction, the guard first: 0 committed, else
 * -1 with the SQLSTATE in `state` (the transaction rolled back). */
static int write_unit(PGconn *db, const char *who, const char *unit, const char *token, char state[6]) {
  const char *guard[] = {NAME, token};
  const char *row[] = {who, unit, token};
  char ignored[6];
  if (run(db, "BEGIN", 0, NULL, PGRES_COMMAND_OK, state) != 0) return -1;
  /* From here to COMMIT no one else can take the lock, or DL001. */
  if (run(db, "SELECT dlock.guard($1, $2)", 2, guard, PGRES_TUPLES_OK, state) == 0 &&
      run(db, "INSERT INTO pg_guard_units (who, unit, token) VALUES ($1, $2, $3)", 3, row,
          PGRES_COMMAND_OK, state) == 0 &&
      run(db, "COMMIT", 0, NULL, PGRES_COMMAND_OK, state) == 0)
    return 0;
  run(db, "ROLLBACK", 0, NULL, PGRES_COMMAND_OK, ignored);
  return -1;
}

static int dlock_failed(const char *what, int status) {
  fprintf(stderr, "%s: %s: %s\n", what, lk_status_name(status), lk_last_error());
  return 1;
}

int main(int argc, char **argv) {
  char who[64];
  snprintf(who, sizeof who, "%s", argc > 1 ? argv[1] : "");
  if (!who[0]) snprintf(who, sizeof who, "worker-%d", (int)getpid());
  int units = argc > 2 ? atoi(argv[2]) : 5;
  const char *pause = getenv("PG_GUARD_PAUSE_AT");
  int pause_at = pause ? atoi(pause) : -1;
  const char *db_url = getenv("DATABASE_URL");
  if (!db_url || !*db_url) db_url = getenv("DLOCK_ENDPOINTS");
  if (!db_url || !*db_url) {
    fprintf(stderr, "set DLOCK_ENDPOINTS to a postgres:// URL\n");
    return 2;
  }

  /* lk_client_from_env reads DLOCK_ENDPOINTS: a postgres:// URL selects
   * PostgreSQL. No reacquire: once this worker loses the lock it stops. */
  struct lk_client_options opts = LK_CLIENT_OPTIONS_INIT;
  opts.ttl_ms = 3000;
  opts.keepalive_interval_ms = 1000;
  opts.keepalive_timeout_ms = 500;
  opts.margin_ms = 1000;
  opts.reacquire = false;
  struct lk_client *client;
  struct lk_lock *lock;
  uint64_t token;
  int st = lk_client_from_env(&opts, &client);
  if (st != LK_OK) return dlock_failed("connect", st);
  if ((st = lk_lock_new(client, NAME, &lock)) != LK_OK) return dlock_failed("lock", st);
  if ((st = lk_lock_acquire(lock, 30000, &token)) != LK_OK) return dlock_failed("acquire", st);
  printf("%s: holds %s, token %" PRIu64 "\n", who, NAME, token);
  fflush(stdout);

  PGconn *db = PQconnectdb(db_url);
  if (PQstatus(db) != CONNECTION_OK) {
    fprintf(stderr, "connect: %s", PQerrorMessage(db));
    return 1;
  }
  char state[6], tok[24], unit_text[16];
  snprintf(tok, sizeof tok, "%" PRIu64, token); /* parameters go as text */
  int rc = run(db,
               "CREATE TABLE IF NOT EXISTS pg_guard_units"
               " (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)",
               0, NULL, PGRES_COMMAND_OK, state) == 0
               ? 0
               : 1;
  for (int unit = 0; rc == 0 && unit < units; unit++) {
    if (unit == pause_at) {
      printf("%s: pausing before unit %d\n", who, unit);
      fflush(stdout);
      raise(SIGSTOP);
      printf("%s: resumed\n", who);
    }
    snprintf(unit_text, sizeof unit_text, "%d", unit);
    if (write_unit(db, who, unit_text, tok, state) == 0) {
      printf("%s: unit %d committed with token %s\n", who, unit, tok);
    } else if (strcmp(state, GUARD_SQLSTATE) == 0) {
      /* Rolled back: nothing of this transaction landed. Stop working. */
      printf("%s: refused by the database (SQLSTATE %s): token %s no longer holds %s; stopping\n",
             who, state, tok, NAME);
      break;
    } else {
      rc = 1;
    }
    if (unit + 1 == units) printf("%s: %d units done with token %s\n", who, units, tok);
    fflush(stdout);
  }
  fflush(stdout);
  PQfinish(db);
  lk_lock_release(lock);
  lk_lock_free(lock);
  lk_client_free(client);
  return rc;
}
