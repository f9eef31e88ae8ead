// Writes to your own PostgreSQL table only while your dlock token still
// holds: `SELECT dlock.guard(name, token)` first in every transaction
// (docs/postgres.md), with node-postgres.
//
// Why: a holder paused past its TTL (a GC pause, swap, a frozen VM) resumes
// not knowing that the lock moved on; any check it made before the pause
// (lock.permit(), the fence) is stale by then. dlock.guard checks inside
// the write's own transaction: it holds the lock's row until COMMIT, so a
// takeover waits for this transaction, and it raises SQLSTATE DL001 when
// the token no longer holds, so the stale transaction rolls back instead of
// landing after the new holder's writes.
//
//   npm install dlock@npm:dlock-fence pg
//   export DLOCK_ENDPOINTS='postgresql://app:secret@db.internal:5432/app'
//   node examples/node/pg-guard.js [WHO] [UNITS]
//
// DATABASE_URL is the application's own connection (default
// DLOCK_ENDPOINTS; set it when that URL carries dlock's own parameters, such
// as dlock_single_node). It must be the database holding the dlock schema:
// the guard runs there, in your transaction. PG_GUARD_PAUSE_AT=N stops this
// process (SIGSTOP) before unit N, the pause the guard is for; resume it
// with `kill -CONT`.
'use strict';

const dlock = require('../../bindings/node'); // require('dlock') in your project
const { Client: PgClient } = require('pg');

const NAME = 'examples/pg-guard';
// dlock's own error code for "this token no longer holds the lock".
const GUARD_SQLSTATE = 'DL001';

async function main() {
  const who = process.argv[2] ?? `worker-${process.pid}`;
  const units = Number(process.argv[3] ?? 5);
  const pauseAt = Number(process.env.PG_GUARD_PAUSE_AT ?? -1);
  const dbUrl = process.env.DATABASE_URL || process.env.DLOCK_ENDPOINTS;

  // new dlock.Client() reads DLOCK_ENDPOINTS: a postgres:// URL selects
  // PostgreSQL. reacquire: false: once this worker loses the lock it stops.
  const client = new dlock.Client({ ttl: 3000, keepaliveInterval: 1000, keepaliveTimeout: 500, margin: 1000, reacquire: false });
  const lock = client.lock(NAME);
  const token = await lock.acquire({ timeout: 30_000 });
  console.log(`${who}: holds ${NAME}, token ${token}`);

  const db = new PgClient({ connectionString: dbUrl });
  await db.connect();
  try {
    await db.query(
      'CREATE TABLE IF NOT EXISTS pg_guard_units (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)',
    );
    for (let unit = 0; unit < units; unit++) {
      if (unit === pauseAt) {
        console.log(`${who}: pausing before unit ${unit}`);
        process.kill(process.pid, 'SIGSTOP');
        console.log(`${who}: resumed`);
      }
      try {
        await db.query('BEGIN');
        // First statement: from here to COMMIT no one else can take the
        // lock, or we get DL001 and write nothing. (A bigint goes as text.)
        await db.query('SELECT dlock.guard($1, $2)', [NAME, token.toString()]);
        await db.query('INSERT INTO pg_guard_units (who, unit, token) VALUES ($1, $2, $3)', [who, unit, token.toString()]);
        await db.query('COMMIT');
      } catch (e) {
        await db.query('ROLLBACK');
        if (e.code !== GUARD_SQLSTATE) throw e;
        // Rolled back: nothing of this transaction landed. Stop working.
        console.log(`${who}: refused by the database (SQLSTATE ${e.code}): token ${token} no longer holds ${NAME}; stopping`);
        return;
      }
      console.log(`${who}: unit ${unit} committed with token ${token}`);
    }
    console.log(`${who}: ${units} units done with token ${token}`);
  } finally {
    await db.end();
    await lock.release();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
