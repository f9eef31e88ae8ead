// dlock.guard against a real pause (issue 19): examples/node/pg-guard.js
// holds the lock, commits a unit of work to the user's own table, and stops
// itself with SIGSTOP before the next; its lease runs out on the server; a
// contender here takes the lock and writes in its own guarded transaction
// (node-postgres); the holder resumes (SIGCONT) into its next transaction,
// which the database refuses with SQLSTATE DL001. The table then holds the
// holder's one unit and the contender's write, nothing after it.
//
// Skipped (reported as skipped, never passed) unless DLOCK_TEST_PG_URL names
// a test server (scripts/test-node.sh starts one and sets it).
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const dlock = require('..');

const url = process.env.DLOCK_TEST_PG_URL;
const skip = url ? false : 'no PostgreSQL test server (DLOCK_TEST_PG_URL unset)';
const root = path.join(__dirname, '..', '..', '..');
const example = path.join(root, 'examples', 'node', 'pg-guard.js');
const NAME = 'examples/pg-guard'; // the example's lock
const TABLE =
  'CREATE TABLE IF NOT EXISTS pg_guard_units (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)';
const EVENT = 20_000; // the longest wait for something that must happen (the example's TTL is 3 s)
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The process's state letter in /proc/PID/stat ('T': stopped).
function procState(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 1).trim()[0];
  } catch {
    return 'gone';
  }
}

async function until(what, cond) {
  const end = Date.now() + EVENT;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}

async function sql(text, params) {
  const { Client } = require('pg');
  const db = new Client({ connectionString: url });
  await db.connect();
  try {
    return await db.query(text, params);
  } finally {
    await db.end();
  }
}

test('examples/node/pg-guard.js paused past its TTL is refused by dlock.guard', { skip }, async () => {
  const { Client: PgClient } = require('pg');
  const stamp = `${process.pid}-${Date.now()}`;
  const [oldWho, newWho] = [`node-holder-${stamp}`, `node-contender-${stamp}`];
  await sql(TABLE);

  // 1. The holder: one unit committed, then stopped before the next. It
  // finds `pg` where this suite does.
  const env = {
    ...process.env,
    DLOCK_ENDPOINTS: url,
    DATABASE_URL: url,
    PG_GUARD_PAUSE_AT: '1',
    NODE_PATH: path.join(__dirname, '..', 'node_modules'),
  };
  const holder = spawn(process.execPath, [example, oldWho, '3'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise((resolve) => holder.on('exit', (code, signal) => resolve({ code, signal })));
  const seen = [];
  let ended = false;
  const rl = readline.createInterface({ input: holder.stdout });
  rl.on('line', (line) => seen.push(line));
  rl.on('close', () => (ended = true));
  const line = async (part) => {
    await until(`'${part}' from the holder (its output: ${JSON.stringify(seen)})`, () => seen.some((l) => l.includes(part)));
    return seen.find((l) => l.includes(part));
  };

  let lock;
  try {
    const t1 = BigInt((await line(' holds ')).split(' ').pop());
    await line('pausing before unit 1');
    await until('the holder to stop', () => procState(holder.pid) === 'T');

    // 2. A contender: it gets the lock once the stopped holder's lease runs
    // out on the server, and writes in its own guarded transaction.
    // new dlock.Client() reads DLOCK_ENDPOINTS (this file runs alone in its
    // own process).
    process.env.DLOCK_ENDPOINTS = url;
    const client = new dlock.Client({ ttl: 4000, keepaliveInterval: 1000, keepaliveTimeout: 500, margin: 1000, reacquire: false });
    lock = client.lock(NAME);
    const t2 = await lock.acquire({ timeout: EVENT });
    assert.ok(t2 > t1, `token ${t2} after ${t1}`);
    assert.equal(procState(holder.pid), 'T', "the holder ran before the contender's write");
    const app = new PgClient({ connectionString: url });
    await app.connect();
    try {
      await app.query('BEGIN');
      await app.query('SELECT dlock.guard($1, $2)', [NAME, t2.toString()]);
      await app.query('INSERT INTO pg_guard_units (who, unit, token) VALUES ($1, 0, $2)', [newWho, t2.toString()]);
      await app.query('COMMIT');
    } finally {
      await app.end();
    }

    // 3. The holder resumes into its next transaction: refused.
    process.kill(holder.pid, 'SIGCONT');
    let timer;
    const timeout = new Promise((resolve) => (timer = setTimeout(() => resolve('timeout'), EVENT)));
    const end = await Promise.race([exited, timeout]);
    clearTimeout(timer);
    assert.deepEqual(end, { code: 0, signal: null }, JSON.stringify(seen));
    await until('the end of the holder output', () => ended);
    const refused = `${oldWho}: refused by the database (SQLSTATE DL001): token ${t1} no longer holds ${NAME}; stopping`;
    assert.ok(seen.includes(refused), JSON.stringify(seen));
    assert.ok(!seen.some((l) => l.includes('unit 1 committed')), JSON.stringify(seen));

    // 4. The table: the holder's unit 0, then the contender's write, nothing
    // of the old holder after it.
    const { rows } = await sql('SELECT who, unit, token::text FROM pg_guard_units WHERE who IN ($1, $2) ORDER BY id', [oldWho, newWho]);
    assert.deepEqual(rows, [
      { who: oldWho, unit: 0, token: t1.toString() },
      { who: newWho, unit: 0, token: t2.toString() },
    ]);
  } finally {
    if (holder.exitCode === null && holder.signalCode === null) {
      process.kill(holder.pid, 'SIGCONT');
      holder.kill('SIGKILL');
    }
    if (lock) await lock.release();
  }
});
