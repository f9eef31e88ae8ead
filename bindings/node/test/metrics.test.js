// Metrics through the Node face (issue 22): `dlock/prometheus` registers
// the core's families in a real prom-client Registry; `registry.metrics()`
// is read back by a real parser (prom2javascript) and
// compared with the checked-in list of every face
// (core/tests/fixtures/metric-families.txt) and with the core's own text;
// lock.healthy().
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const prom = require('prom-client');
const { Readable } = require('node:stream');
const { getMetricsFromStream } = require('prom2javascript');
const dlock = require('..');
const dlockProm = require('../prometheus');

function fixture() {
  const file = path.join(__dirname, '..', '..', '..', 'core', 'tests', 'fixtures', 'metric-families.txt');
  const out = {};
  for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
    if (line.startsWith('#') || line.trim() === '') continue;
    const [name, type, ...labels] = line.trim().split(/\s+/);
    out[name] = { type, labels };
  }
  return out;
}

/** The text format read by prom2javascript: [{ name, type, data: [{ labels, value | buckets, count, sum }] }], in order. */
async function parse(text) {
  const m = await getMetricsFromStream(Readable.from([text]));
  return Object.entries(m).map(([name, f]) => ({ name, type: f.type, data: f.data }));
}

/** name -> { type, labels } as parsed (label names without `le`), or null labels when no sample. */
async function read(text) {
  const out = {};
  for (const f of await parse(text)) {
    const names = new Set(f.data.map((d) => JSON.stringify(Object.keys(d.labels).filter((l) => l !== 'le'))));
    assert.ok(names.size <= 1, `${f.name}: label names differ between series: ${[...names]}`);
    out[f.name] = { type: f.type, labels: names.size ? JSON.parse([...names][0]) : null };
  }
  return out;
}

function client() {
  return new dlock.Client({ service: new dlock.Service(), ttl: 2000 });
}

test('registry.metrics() has the families of core/tests/fixtures/metric-families.txt', async () => {
  const c = client();
  const lock = c.lock('node/fixture');
  await lock.acquire({ timeout: 2000 });
  // An election led: `dlock_election_leader` has a sample, its labels are read.
  const e = c.election('node/fixture-election');
  await e.campaign('me', { timeout: 2000 });
  // A semaphore's slot held: `dlock_semaphore_limit` and `_held` have samples.
  const slot = await c.semaphore('node/fixture-semaphore', 2).acquire({ timeout: 2000 });
  // A read/write lock's reader held: `dlock_rwlock_held` has samples.
  const reader = c.rwlock('node/fixture-rwlock').reader();
  await reader.acquire({ timeout: 2000 });
  const registry = new prom.Registry();
  dlockProm.register(c, registry);
  const got = await read(await registry.metrics());
  const want = fixture();
  assert.deepEqual(Object.keys(got).sort(), Object.keys(want).sort());
  for (const [name, f] of Object.entries(want)) {
    assert.equal(got[name].type, f.type, name);
    assert.ok(got[name].labels !== null, `${name} has no sample`);
    assert.deepEqual(got[name].labels, f.labels, name);
  }
  await reader.close();
  await slot.close();
  await e.close();
  await lock.close();
  c.shutdown();
});

test('the scraped values are the core snapshot`s', async () => {
  const c = client();
  const lock = c.lock('node/values');
  const token = await lock.acquire({ timeout: 2000 });
  const registry = new prom.Registry();
  const made = dlockProm.register(c, registry);
  assert.equal(made.length, Object.keys(fixture()).length);
  // One set per registry, for every client of the process (issue 32).
  assert.strictEqual(dlockProm.register(c, registry), made);
  assert.throws(() => dlockProm.register({}, registry), TypeError);
  assert.throws(() => dlockProm.register(c, {}), TypeError);
  assert.throws(() => dlockProm.register(c, new prom.Registry(), { maxLocks: -1 }), dlock.InvalidArgumentError);
  const scraped = await parse(await registry.metrics());
  const own = await parse(dlockProm.text());
  const byName = (fs) => Object.fromEntries(fs.map((f) => [f.name, f]));
  const s = byName(scraped);
  // Same families in the same order, same series; numbers equal (the
  // slack moves between the two reads; `le` is written 1 or 1.0).
  assert.deepEqual(scraped.map((f) => f.name), own.map((f) => f.name));
  for (const w of own) {
    const g = s[w.name];
    assert.equal(g.type, w.type, w.name);
    assert.equal(g.data.length, w.data.length, w.name);
    if (w.name === 'dlock_deadline_slack_seconds') continue;
    g.data.forEach((d, i) => {
      const e = w.data[i];
      assert.deepEqual(d.labels, e.labels, w.name);
      if (e.buckets) {
        assert.deepEqual(Object.values(d.buckets), Object.values(e.buckets), w.name);
        assert.deepEqual([d.count, d.sum], [e.count, e.sum], w.name);
      } else {
        assert.equal(d.value, e.value, w.name);
      }
    });
  }
  const value = (name, labels = {}) =>
    s[name].data.find((d) => JSON.stringify(d.labels) === JSON.stringify(labels)).value;
  assert.equal(value('dlock_lock_held', { lock: 'node/values' }), 1);
  assert.equal(value('dlock_lock_token', { lock: 'node/values' }), Number(token));
  const mine = await parse(dlockProm.text(c));
  assert.equal(valueIn(mine, 'dlock_acquisitions_total'), 1);
  const slack = value('dlock_deadline_slack_seconds');
  assert.ok(slack > 0 && slack <= 2, `slack ${slack}`);
  assert.equal(valueIn(mine, 'dlock_acquire_wait_seconds', { outcome: 'acquired' }), 1);

  // Released: the slack is absent (not 0), as in the core's text.
  await lock.release();
  const after = byName(await parse(await registry.metrics()));
  assert.equal(after.dlock_deadline_slack_seconds.data.length, 0);
  assert.equal(after.dlock_lock_held.data.find((d) => d.labels.lock === 'node/values').value, 0);
  assert.ok(!dlockProm.text(c).split('\n').some((l) => l.startsWith('dlock_deadline_slack_seconds ')));
  await lock.close();
  c.shutdown();
});

test('a blip and a deleted key move the counters; lock.healthy', async () => {
  const service = new dlock.Service();
  const c = new dlock.Client({ service, ttl: 2000 });
  const registry = new prom.Registry();
  dlockProm.register(c, registry);
  const value = async (name, labels = {}) => {
    const f = (await parse(await registry.metrics())).find((f) => f.name === name);
    const d = f.data.find((d) => JSON.stringify(d.labels) === JSON.stringify(labels));
    return d.value ?? d.count;
  };
  const until = async (f, what) => {
    const end = Date.now() + 5000;
    while (!(await f())) {
      if (Date.now() > end) assert.fail(what);
      await new Promise((r) => setTimeout(r, 10));
    }
  };
  const lock = c.lock('node/life');
  assert.equal(lock.healthy(), true, 'not held is no fault');
  await lock.acquire({ timeout: 2000 });
  assert.equal(lock.healthy(0), true);
  assert.throws(() => lock.healthy(-1), dlock.InvalidArgumentError);
  c.link.failKeepalives(true);
  await until(() => lock.state === 'Draining', 'drained');
  c.link.failKeepalives(false);
  await until(() => lock.state === 'Holding', 'resumed');
  assert.equal(await value('dlock_drains_total'), 1);
  assert.equal(await value('dlock_resumes_total'), 1);
  assert.ok(service.deleteLockKey('node/life'));
  await until(async () => (await value('dlock_fences_total', { reason: 'lock_lost' })) === 1, 'lock_lost');
  await until(async () => (await value('dlock_fence_lateness_seconds')) === 1, 'a lateness observed');
  await lock.close();
  c.shutdown();
});

/** The value of the series `name` with exactly `labels` in a parsed page. */
function valueIn(page, name, labels = {}) {
  const f = page.find((f) => f.name === name);
  assert.ok(f, `no family ${name}`);
  const d = f.data.find((d) => JSON.stringify(d.labels) === JSON.stringify(labels));
  assert.ok(d, `no series ${name}${JSON.stringify(labels)}`);
  return d.value ?? d.count;
}

test('counters never go down when lock handles are dropped and collected (issue 32, item 1)', async () => {
  const v8 = require('node:v8');
  const vm = require('node:vm');
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc');
  // Lock events never keep the process alive by themselves.
  const keep = setInterval(() => {}, 1000);
  const service = new dlock.Service();
  const c = new dlock.Client({ service, ttl: 2000 });
  let locks = [];
  for (let i = 0; i < 5; i++) locks.push(c.lock(`node/gone/${i}`));
  const again = new Promise((r) => {
    let n = 0;
    locks[0].on('acquired', () => ++n === 2 && r());
  });
  // Acquired in a function of its own: a frame of this one would keep the last lock.
  await (async (all) => {
    for (const l of all) await l.acquire({ timeout: 2000 });
  })(locks);
  assert.ok(service.deleteLockKey('node/gone/0'));
  await again;
  const before = await parse(dlockProm.text(c));
  assert.equal(valueIn(before, 'dlock_acquisitions_total'), 6);
  assert.equal(valueIn(before, 'dlock_fences_total', { reason: 'lock_lost' }), 1);
  locks = null;
  // No event says the core let go of a handle: wait for the gauge of live locks.
  const end = Date.now() + 10_000;
  for (;;) {
    gc();
    await new Promise((r) => setImmediate(r));
    if (valueIn(await parse(dlockProm.text(c)), 'dlock_session_locks') === 0) break;
    assert.ok(Date.now() < end, 'the dropped locks never went');
    await new Promise((r) => setTimeout(r, 10));
  }
  const after = await parse(dlockProm.text(c));
  assert.equal(valueIn(after, 'dlock_acquisitions_total'), 6);
  assert.equal(valueIn(after, 'dlock_fences_total', { reason: 'lock_lost' }), 1);
  c.shutdown();
  clearInterval(keep);
});

test('several clients export one valid page (issue 32, item 2)', async () => {
  const clients = [client(), client()];
  const registry = new prom.Registry();
  const locks = [];
  for (const [i, c] of clients.entries()) {
    const lock = c.lock(`node/page/${i}`);
    await lock.acquire({ timeout: 2000 });
    locks.push(lock);
    dlockProm.register(c, registry);
  }
  const page = await registry.metrics();
  const helps = page.split('\n').filter((l) => l.startsWith('# HELP '));
  assert.equal(helps.length, new Set(helps).size, 'a family twice');
  const parsed = await parse(page);
  assert.deepEqual(parsed.map((f) => f.name).sort(), Object.keys(fixture()).sort());
  for (let i = 0; i < 2; i++) assert.equal(valueIn(parsed, 'dlock_lock_held', { lock: `node/page/${i}` }), 1);
  for (const l of locks) await l.close();
  for (const c of clients) c.shutdown();
});

test('dlock.onLog gets the core`s log, levels named', async () => {
  const records = [];
  dlock.onLog((r) => records.push(r));
  try {
    const c = client();
    const lock = c.lock('node/log');
    await lock.acquire({ timeout: 2000 });
    const seen = async (level, word) => {
      const end = Date.now() + 5000;
      while (Date.now() < end) {
        if (records.some((r) => r.level === level && r.message.includes(word))) return true;
        await new Promise((r) => setTimeout(r, 10));
      }
      return false;
    };
    assert.ok(await seen('info', 'acquired'), JSON.stringify(records));
    assert.ok(await seen('info', 'node/log'));
    assert.ok(records.every((r) => r.target.startsWith('dlock')));
    c.link.failKeepalives(true);
    assert.ok(await seen('warn', 'draining'), JSON.stringify(records));
    c.link.failKeepalives(false);
    await lock.close();
    c.shutdown();
    assert.throws(() => dlock.onLog(42), TypeError);
  } finally {
    dlock.onLog(null);
  }
});
