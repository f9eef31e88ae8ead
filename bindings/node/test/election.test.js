// Elections and observers (docs/elections.md) through the Node face: the
// embedded backend (campaign, proclaim, resign with a permit in flight,
// observer events including `undefined`, abort and timeout, bad input,
// the process left free to exit), then the etcd test cluster (interop
// with `etcdctl elect`), skipped unless DLOCK_TEST_ETCD says it exists.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { execFileSync, spawn, spawnSync } = require('node:child_process');
const readline = require('node:readline');
const path = require('node:path');
const dlock = require('..');

// Short timings (the core's test settings): a fence within about 1.5 s of
// a cut, the lease gone 2 s after the last keepalive.
const FAST = { ttl: 2000, keepaliveInterval: 500, keepaliveTimeout: 200, retryInterval: 200, margin: 500 };
const { MAX_VALUE_LEN } = dlock;

// Observers and events never keep the process alive by themselves: a test
// that only awaits an event needs something that does.
const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

let n = 0;
const unique = (what) => `node-test/election/${what}/${process.pid}/${n++}`;

function embedded(extra = {}) {
  const service = new dlock.Service();
  const client = (more = {}) => new dlock.Client({ service, ...FAST, ...extra, ...more });
  return { service, client };
}

/** The observer's next state within `ms`, as `{ leader, kind }`. */
function nextChange(observer, ms = 5000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      observer.off('change', f);
      reject(new Error(`no observer change within ${ms} ms`));
    }, ms);
    const f = (leader, kind) => {
      clearTimeout(timer);
      observer.off('change', f);
      resolve({ leader, kind });
    };
    observer.on('change', f);
  });
}

/** Whether `promise` settles within `ms` (false: still pending). */
async function settlesWithin(promise, ms) {
  let timer;
  const late = new Promise((r) => (timer = setTimeout(() => r(false), ms)));
  const r = await Promise.race([promise.then(() => true, () => true), late]);
  clearTimeout(timer);
  return r;
}

test('campaign, permit, proclaim, leader(), resign: an observer sees each, undefined included', async () => {
  const { service, client } = embedded();
  const name = unique('basic');
  const watcher = client();
  const observer = watcher.observe(name);
  const it = observer[Symbol.asyncIterator]();
  assert.deepEqual(await it.next(), { value: undefined, done: false }, 'first: nobody leads');

  const a = client();
  const election = a.election(name);
  assert.ok(election instanceof dlock.Lock, 'an election has the lock API');
  const acquired = once(election, 'acquired');
  const changed = nextChange(observer);
  const t1 = await election.campaign('alpha', { timeout: 2000 });
  assert.equal(typeof t1, 'bigint');
  assert.deepEqual(await acquired, [t1]);
  assert.equal(election.state, 'Holding');
  assert.equal(election.token, t1);
  assert.equal(service.holder(name), t1);

  const { leader, kind } = await changed;
  assert.equal(kind, 'leader');
  assert.equal(String(leader.value), 'alpha');
  assert.ok(Buffer.isBuffer(leader.value));
  assert.equal(leader.token, t1);
  assert.equal(leader.lease, election.session.lease);
  assert.equal(leader.key, `${name}/${leader.lease.toString(16)}`);
  const fromIterator = await it.next();
  assert.deepEqual(fromIterator.value, leader, 'the iterator yields the same state');
  assert.deepEqual(await election.leader(), leader);

  const p = election.permit();
  assert.equal(p.token, t1);
  p.end();

  // Bytes in, bytes out; the token does not change.
  const proclaimed = nextChange(observer);
  await election.proclaim(Buffer.from([0, 1, 2, 255]));
  const pr = await proclaimed;
  assert.equal(pr.kind, 'proclaimed');
  assert.deepEqual(pr.leader.value, Buffer.from([0, 1, 2, 255]));
  assert.equal(pr.leader.token, t1);
  assert.deepEqual((await it.next()).value.value, Buffer.from([0, 1, 2, 255]));
  assert.equal(election.token, t1);

  const gone = nextChange(observer);
  await election.resign();
  const g = await gone;
  assert.deepEqual(g, { leader: undefined, kind: 'no-leader' });
  assert.deepEqual(await it.next(), { value: undefined, done: false });
  assert.equal(await election.leader(), undefined);
  assert.equal(service.holder(name), null);
  assert.throws(() => election.permit(), dlock.DlockError);
  await assert.rejects(election.proclaim('after'), (e) => e instanceof dlock.NotHeldError && e.code === 'not_held');

  // Leaving a for await closes the observer.
  const t2 = await election.campaign('again', { timeout: 2000 });
  assert.ok(t2 > t1, 'a new campaign has a higher token');
  for await (const l of observer) {
    if (l && l.token === t2) break;
  }
  assert.equal(observer.closed, true);
  assert.deepEqual(await it.next(), { value: undefined, done: true });
  await election.close();
});

test('resign with a permit in flight: the next candidate is elected only after the permit ends, with a higher token', async () => {
  const { service, client } = embedded();
  const name = unique('resign');
  const a = client().election(name);
  const b = client().election(name);
  const t1 = await a.campaign('a', { timeout: 2000 });
  const unit = a.permit();
  let wonAt;
  const won = b.campaign('b', { timeout: 10_000 }).then((t) => ((wonAt = performance.now()), t));
  let resignedAt;
  const resigned = a.resign({ grace: 30_000 }).then(() => (resignedAt = performance.now()));
  // The unit runs: the resignation keeps the key, nobody else leads. (A
  // window to show something does not happen.)
  assert.equal(await settlesWithin(resigned, 400), false, 'resign resolved while a unit was in flight');
  assert.equal(await settlesWithin(won, 0), false);
  assert.equal(service.holder(name), t1);
  assert.throws(() => a.permit(), dlock.DlockError, 'no new unit once resigning');
  const endedAt = performance.now();
  unit.end();
  const t2 = await won;
  await resigned;
  assert.ok(t2 > t1);
  assert.ok(resignedAt >= endedAt && wonAt >= endedAt);
  assert.equal(service.holder(name), t2);
  assert.equal(a.state, 'Released');
  await Promise.all([a.close(), b.close()]);
});

test('resign() without a grace waits for the unit in flight: the core\'s RESIGN_GRACE_MS, as in every face', async () => {
  assert.equal(dlock.RESIGN_GRACE_MS, 5000);
  const { service, client } = embedded();
  const name = unique('default-grace');
  const a = client().election(name);
  const t1 = await a.campaign('a', { timeout: 2000 });
  const unit = a.permit();
  const resigned = a.resign();
  // A window to show something does not happen: the key stays while the unit runs.
  assert.equal(await settlesWithin(resigned, 300), false, 'resign() resolved with a unit in flight');
  assert.equal(service.holder(name), t1);
  unit.end();
  await resigned;
  assert.equal(service.holder(name), null);
  await a.close();
});

test('resign deletes the key at the grace with a unit still in flight', async () => {
  const { service, client } = embedded();
  const name = unique('grace');
  const a = client().election(name);
  await a.campaign('a', { timeout: 2000 });
  const unit = a.permit();
  const start = performance.now();
  await a.resign({ grace: 300 });
  const took = performance.now() - start;
  assert.ok(took >= 290, `the key went before the grace: ${took} ms`);
  assert.ok(took < 2000, `${took} ms`);
  assert.equal(service.holder(name), null);
  assert.equal(unit.valid(), false);
  unit.end();
  await a.close();
});

test('campaign: timeout rejects with TimeoutError, abort with an AbortError; nothing held either way', async () => {
  const { service, client } = embedded();
  const name = unique('abort');
  const a = client().election(name);
  const t1 = await a.campaign('a', { timeout: 2000 });
  const b = client().election(name);

  await assert.rejects(b.campaign('b', { timeout: 200 }), (e) => e instanceof dlock.TimeoutError && e.code === 'timeout');
  assert.equal(b.state, 'Idle');

  const ac = new AbortController();
  const pending = b.campaign('b', { signal: ac.signal });
  assert.equal(await settlesWithin(pending, 100), false, 'b waits behind a');
  ac.abort();
  await assert.rejects(pending, (e) => e.name === 'AbortError');
  // An aborted signal before the call: refused at once.
  await assert.rejects(b.campaign('b', { signal: ac.signal }), (e) => e.name === 'AbortError');

  // b's key is gone: a resigns and nobody leads (b never resolves).
  await a.resign();
  assert.equal(service.holder(name), null);
  assert.equal(await a.leader(), undefined);
  assert.notEqual(b.state, 'Holding');
  assert.equal(b.token, null);
  const t2 = await b.campaign('b2', { timeout: 2000 });
  assert.ok(t2 > t1);
  await Promise.all([a.close(), b.close()]);
});

test('proclaim is refused once fenced and after a resign; the fence reaches the election like a lock', async () => {
  const { client } = embedded();
  const name = unique('fenced');
  const c = client({ reacquire: false });
  const e = c.election(name);
  await assert.rejects(e.proclaim('never'), dlock.NotHeldError);
  const t1 = await e.campaign('v1', { timeout: 2000 });
  const fenced = once(e, 'fence');
  c.link.declareLeaseLost();
  const [token] = await fenced;
  assert.equal(token, t1);
  assert.equal(e.state, 'Fenced');
  await assert.rejects(e.proclaim('v2'), (err) => err instanceof dlock.FencedError && err.message.includes(String(t1)));
  await e.close();
});

test('recampaign after a fence (the default): elected again with a higher token and the last value', async () => {
  const { client } = embedded();
  const name = unique('recampaign');
  const c = client();
  const e = c.election(name);
  const t1 = await e.campaign('first', { timeout: 2000 });
  await e.proclaim('second');
  const again = new Promise((resolve) => e.on('acquired', (t) => t > t1 && resolve(t)));
  c.link.declareLeaseLost();
  const t2 = await again;
  assert.ok(t2 > t1);
  const l = await e.leader();
  assert.equal(String(l.value), 'second');
  assert.equal(l.token, t2);
  await e.close();
});

test('an observer reports undefined (no leader) once the leader is cut off and its lease expires; never the old leader after', async () => {
  const { client } = embedded();
  const name = unique('expire');
  const c = client();
  const e = c.election(name);
  const t1 = await e.campaign('a', { timeout: 2000 });
  const observer = client().observe(name);
  const first = await nextChange(observer);
  assert.equal(first.leader.token, t1);
  const seen = [];
  observer.on('change', (l) => seen.push(l));
  const fenced = once(e, 'fence');
  c.link.partition();
  const cut = performance.now();
  const none = await nextChange(observer, 5000);
  const took = performance.now() - cut;
  assert.deepEqual(none, { leader: undefined, kind: 'no-leader' });
  assert.ok(took <= 2600, `${took} ms`);
  await fenced; // the fence came first: it had been delivered before
  assert.notEqual(e.state, 'Holding');
  assert.deepEqual(seen, [undefined]);
  observer.close();
  c.link.heal();
  await e.close();
});

test('an observer says reconnecting through an outage, then the state again', async () => {
  const { service, client } = embedded();
  const name = unique('outage');
  const e = client().election(name);
  const observer = client().observe(name);
  assert.deepEqual(await nextChange(observer), { leader: undefined, kind: 'no-leader' });
  // Listening before the campaign: its event may come before its promise.
  const elected = nextChange(observer);
  const t = await e.campaign('a', { timeout: 2000 });
  assert.equal((await elected).leader.token, t);
  const reconnecting = once(observer, 'reconnecting');
  service.outage(true);
  await reconnecting;
  const back = nextChange(observer);
  service.outage(false);
  const { leader, kind } = await back;
  assert.equal(kind, 'leader');
  assert.equal(leader.token, t);
  observer.close();
  await e.close();
});

test('close() ends a waiting next() and drops later events; a throwing listener changes nothing', async () => {
  const { client } = embedded();
  const name = unique('close');
  const c = client();
  const observer = c.observe(name);
  const warnings = [];
  const onWarning = (w) => warnings.push(w.message);
  process.on('warning', onWarning);
  observer.on('change', () => {
    throw new Error('listener failed');
  });
  const second = [];
  observer.on('change', (l) => second.push(l));
  assert.deepEqual(await observer.next(), { value: undefined, done: false });
  const waiting = observer.next();
  observer.close();
  observer.close();
  assert.deepEqual(await waiting, { value: undefined, done: true });
  const e = c.election(name);
  await e.campaign('late', { timeout: 2000 });
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(second, [undefined], 'nothing after the close');
  await new Promise((r) => setImmediate(r));
  process.off('warning', onWarning);
  assert.ok(warnings.includes('listener failed'), JSON.stringify(warnings));
  await e.close();
});

test('bad input: one clear error each, nothing held', async () => {
  const { service, client } = embedded();
  const c = client();
  assert.equal(MAX_VALUE_LEN, 1024 * 1024, "the core's limit: 1 MiB, so that with the longest name it fits etcd's request limit");
  assert.throws(() => c.election(''), (e) => e instanceof dlock.InvalidArgumentError && e.code === 'invalid_argument');
  assert.throws(() => c.observe(''), dlock.InvalidArgumentError);
  assert.throws(() => c.election(42), TypeError);
  assert.throws(() => c.observe(null), TypeError);

  const name = unique('bad');
  const e = c.election(name);
  await assert.rejects(
    e.campaign(Buffer.alloc(MAX_VALUE_LEN + 1, 'x'), { timeout: 1000 }),
    (err) => err instanceof dlock.InvalidArgumentError && /at most 1048576 bytes/.test(err.message),
  );
  assert.equal(service.holder(name), null);
  assert.equal(e.state, 'Idle');
  await assert.rejects(e.campaign(42), TypeError);
  await assert.rejects(e.campaign('v', { timeout: -1 }), dlock.InvalidArgumentError);
  await assert.rejects(e.campaign('v', { timeoutMs: 5 }), /`options.timeoutMs` is not a setting/);
  await assert.rejects(e.resign({ grace: Number.NaN }), dlock.InvalidArgumentError);

  // The largest value is accepted, and proclaiming one too large is refused.
  const t = await e.campaign(Buffer.alloc(MAX_VALUE_LEN, 'y'), { timeout: 2000 });
  await assert.rejects(e.proclaim(Buffer.alloc(MAX_VALUE_LEN + 1)), dlock.InvalidArgumentError);
  assert.equal((await e.leader()).value.length, MAX_VALUE_LEN);
  assert.equal(service.holder(name), t);
  await e.close();

  const session = c.session(FAST);
  const closed = session.election(name);
  await session.close();
  await assert.rejects(closed.campaign('v', { timeout: 1000 }), (err) => err instanceof dlock.ReleasedError && err.code === 'released');
  assert.equal(service.holder(name), null);

  const gone = client();
  gone.shutdown();
  assert.throws(() => gone.observe(name), (err) => err instanceof dlock.ShutdownError && err.code === 'shutdown');
});

for (const [mode, expect] of [
  ['idle', /^idle$/m],
  ['listen', /^change no-leader -$/m],
  // The campaign's own `elected` line may come before or after the
  // observer's: two events of their own.
  ['iterate', /^observed -\n(?:elected \d+\n)?observed v$/m],
]) {
  test(`an observer never keeps the process alive by itself (${mode})`, () => {
    const started = performance.now();
    const r = spawnSync(process.execPath, [path.join(__dirname, 'fixtures', 'observe.js'), unique(mode), mode], {
      encoding: 'utf8',
      timeout: 10_000,
      env: { ...process.env, DLOCK_ENDPOINTS: '' },
    });
    const took = performance.now() - started;
    assert.equal(r.error, undefined, `the child did not exit within 10 s: ${r.error}`);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, expect);
    if (mode === 'iterate') assert.match(r.stdout, /^closed true$/m);
    // The watch stays open in 'idle' and 'listen': exiting well before the
    // TTL (15 s) shows it held nothing.
    assert.ok(took < 4000, `took ${took} ms`);
  });
}

// ------------------------------------------------------------------ etcd

const members = process.env.DLOCK_TEST_MEMBERS;
const skip = process.env.DLOCK_TEST_ETCD ? false : 'no etcd test cluster (DLOCK_TEST_ETCD unset)';
if (!skip && !members) throw new Error('DLOCK_TEST_ETCD is set but DLOCK_TEST_MEMBERS is not: source target/etcd/env');
const ETCD_FAST = { ttl: 3000, keepaliveInterval: 1000, keepaliveTimeout: 500, retryInterval: 250, margin: 1000 };
const etcdEnv = { ...process.env, ETCDCTL_API: '3' };
const etcdctlArgs = (...args) => [`--endpoints=${members}`, '--dial-timeout=2s', '--command-timeout=5s', ...args];

/** `etcdctl elect ...` in the background, with its stdout as lines. */
function etcdctlElect(...args) {
  const child = spawn('etcdctl', etcdctlArgs('elect', ...args), { env: etcdEnv, stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  return { child, next: async () => (await lines.next()).value };
}

test('etcd: `etcdctl elect -l` sees the Node leader and its proclaimed value', { skip }, async () => {
  const client = new dlock.Client({ endpoints: members, ...ETCD_FAST });
  const name = `node-test/elect-l/${process.pid}/${Date.now()}`;
  const e = client.election(name);
  const token = await e.campaign('node-leader', { timeout: 5000 });
  const l = await e.leader();
  assert.equal(l.token, token);
  const listener = etcdctlElect('-l', name);
  try {
    // etcdctl prints the leader's key, then its value.
    assert.equal(await listener.next(), l.key);
    assert.equal(await listener.next(), 'node-leader');
    await e.proclaim('node-proclaimed');
    assert.equal(await listener.next(), l.key);
    assert.equal(await listener.next(), 'node-proclaimed');
  } finally {
    listener.child.kill('SIGTERM');
  }
  await e.resign();
  const keys = execFileSync('etcdctl', etcdctlArgs('get', '--prefix', `${name}/`, '--keys-only'), { env: etcdEnv, encoding: 'utf8' });
  assert.equal(keys.trim(), '', 'the key is gone after resign');
  await e.close();
});

test('etcd: a Node observer sees `etcdctl elect`\'s leader, then undefined once it resigns', { skip }, async () => {
  const client = new dlock.Client({ endpoints: members, ...ETCD_FAST });
  const name = `node-test/elect-obs/${process.pid}/${Date.now()}`;
  const observer = client.observe(name);
  const it = observer[Symbol.asyncIterator]();
  assert.deepEqual(await it.next(), { value: undefined, done: false });
  const candidate = etcdctlElect(name, 'from-etcdctl');
  let leader;
  try {
    leader = (await it.next()).value;
    assert.equal(String(leader.value), 'from-etcdctl');
    assert.ok(leader.key.startsWith(`${name}/`));
    // A dlock candidate waits behind etcdctl's key.
    const e = client.election(name);
    await assert.rejects(e.campaign('node', { timeout: 300 }), dlock.TimeoutError);
    await e.close();
  } finally {
    // etcdctl elect resigns (revokes its lease) on SIGINT.
    candidate.child.kill('SIGINT');
  }
  const after = await it.next();
  assert.deepEqual(after, { value: undefined, done: false }, 'no leader once etcdctl resigned');
  observer.close();
});

test('an observer used only through on(\'change\') keeps a bounded backlog, also after close() (issue 32, item 3)', async () => {
  const v8 = require('node:v8');
  const vm = require('node:vm');
  v8.setFlagsFromString('--expose-gc');
  const gc = vm.runInNewContext('gc');
  const { client } = embedded();
  const name = unique('backlog');
  const c = client();
  const observer = c.observe(name);
  let last;
  let reached;
  const done = new Promise((r) => (reached = r));
  observer.on('change', (l) => {
    last = l;
    if (l && String(l.value).startsWith('2999:')) reached();
  });
  const e = c.election(name);
  await e.campaign('first', { timeout: 2000 });
  const pad = 'x'.repeat(32 * 1024);
  gc();
  const before = process.memoryUsage();
  for (let i = 0; i < 3000; i++) await e.proclaim(`${i}:${pad}`);
  await done;
  assert.ok(String(last.value).startsWith('2999:'));
  observer.close();
  gc();
  const after = process.memoryUsage();
  const grown = after.external + after.heapUsed - before.external - before.heapUsed;
  // All 3,000 values kept would be about 94 MiB.
  assert.ok(grown < 40 * 1024 * 1024, `grew ${grown >> 20} MiB`);
  let queued = 0;
  while (!(await observer.next()).done) queued++;
  assert.ok(queued <= 100, `${queued} states kept for next()`);
  await e.close();
});
