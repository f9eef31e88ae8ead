// The JavaScript API on the embedded backend: arguments, permits and
// typed errors, AbortSignal, events and throwing listeners, withLock at a
// fence, the blocked event loop, guarded writes and the FenceGate.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const dlock = require('..');

// Short timings: a fence within about 1.5 s of a cut.
const FAST = { ttl: 2000, keepaliveInterval: 500, keepaliveTimeout: 200, retryInterval: 200, margin: 500 };

// The locks' events never keep the process alive (weak threadsafe
// functions): a test that only awaits an event needs something that does,
// as a real program's own I/O would.
const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

let n = 0;
const unique = (what) => `node-test/${what}/${process.pid}/${n++}`;

function embedded(extra = {}) {
  const service = new dlock.Service();
  const client = new dlock.Client({ service, ...FAST, ...extra });
  return { service, client };
}

/** Resolves with the first stateChange into `to`. */
function stateInto(lock, to) {
  return new Promise((resolve) => {
    const f = (c) => {
      if (c.to === to) {
        lock.off('stateChange', f);
        resolve(c);
      }
    };
    lock.on('stateChange', f);
  });
}

test('bad arguments are TypeError (wrong type) or the core error (bad value) with clear messages', () => {
  assert.throws(() => new dlock.Client({ ttl: '2000' }), {
    name: 'TypeError',
    message: 'options.ttl must be a number of milliseconds, got string',
  });
  // A bad value is the core's error, as in every face (scenarios/vectors/bad_input.json).
  assert.throws(() => new dlock.Client({ ttl: -1 }), { name: 'InvalidOptionError', code: 'invalid_option', message: /ttl/ });
  assert.throws(() => new dlock.Client({ ttl: Infinity }), dlock.InvalidOptionError);
  assert.throws(() => new dlock.Client({ tll: 2000 }), { code: 'invalid_option', message: /`options.tll` is not a setting/ });
  assert.throws(() => new dlock.Client('x'), TypeError);
  assert.throws(() => new dlock.Client({ reacquire: 'yes' }), TypeError);
  assert.throws(() => new dlock.Client({ endpoints: 5 }), TypeError);
  assert.throws(() => new dlock.Client({ service: {} }), TypeError);
  const { client } = embedded();
  assert.throws(() => client.lock(5), { name: 'TypeError', message: 'name must be a string, got number' });
  assert.throws(() => client.session({ margin: 'x' }), TypeError);
  const lock = client.lock(unique('args'));
  return Promise.all([
    assert.rejects(lock.acquire({ timeout: '1' }), TypeError),
    assert.rejects(lock.acquire({ timeout: -5 }), { code: 'invalid_argument', message: /timeout must be >= 0/ }),
    assert.rejects(lock.acquire({ signal: {} }), { name: 'TypeError', message: 'signal must be an AbortSignal' }),
    assert.rejects(lock.acquire({ wait: 1 }), dlock.InvalidOptionError),
    assert.rejects(lock.guardedPut('1', 'k', 'v'), TypeError),
    assert.rejects(lock.guardedPut(-1n, 'k', 'v'), RangeError),
    assert.rejects(lock.guardedPut(1n, 5, 'v'), TypeError),
  ]);
});

test('a rule the core enforces is an InvalidOptionError / InvalidArgumentError with its code', () => {
  assert.throws(
    () => new dlock.Client({ ttl: 1000 }),
    (e) => e instanceof dlock.InvalidOptionError && e instanceof dlock.DlockError && e.code === 'invalid_option' && /ttl/.test(e.message),
  );
  assert.throws(
    () => new dlock.Client({ keepaliveInterval: 2000, keepaliveTimeout: 2000 }),
    (e) => e instanceof dlock.InvalidOptionError && /keepalive_timeout/.test(e.message) && /keepalive_interval/.test(e.message),
  );
  // A setting left out follows the given ones (design §14): no error.
  assert.equal(new dlock.Client({ service: new dlock.Service(), ttl: 6000, keepaliveInterval: 2000 }).options.keepaliveTimeout, 800);
  const { client } = embedded();
  assert.throws(() => client.lock(''), (e) => e instanceof dlock.InvalidArgumentError && e.code === 'invalid_argument');
  assert.throws(() => client.lock('a\u0000b'), (e) => e.code === 'invalid_argument');
  assert.throws(() => client.lock('x'.repeat(1025)), (e) => e.code === 'invalid_argument');
});

test('a postgres URL as endpoints: the core decides, settings that do not fit are refused', () => {
  // Nothing listens on port 1: the error names PostgreSQL, so the core took
  // the URL as PostgreSQL (an etcd list would refuse its scheme). The URL
  // is passed whole: a multi-host URL holds commas.
  assert.throws(
    () => new dlock.Client({ endpoints: 'postgresql://dlock@127.0.0.1:1,127.0.0.1:2/db', connectTimeout: 500 }),
    (e) => e instanceof dlock.BackendError && /PostgreSQL at 127\.0\.0\.1:1/.test(e.message),
  );
  assert.throws(
    () => new dlock.Client({ endpoints: 'postgres://h/db', certFile: '/tmp/c.pem' }),
    (e) => e instanceof dlock.InvalidArgumentError && /cert_file/.test(e.message),
  );
  assert.throws(
    () => new dlock.Client({ endpoints: ['postgres://h/db', '127.0.0.1:2379'] }),
    (e) => e instanceof dlock.InvalidArgumentError && /only endpoint/.test(e.message),
  );
  assert.throws(
    () => new dlock.Client({ endpoints: 'postgres://h/db?sslmode=disable', caFile: '/tmp/ca.pem' }),
    (e) => e instanceof dlock.InvalidArgumentError && /sslmode/.test(e.message),
  );
});

test('acquire, permit, release: tokens, state and typed refusals', async () => {
  const { client } = embedded();
  const lock = client.lock(unique('basic'));
  assert.equal(lock.state, 'Idle');
  assert.equal(lock.token, null);
  // The message is the core's own text for the refusal.
  assert.throws(() => lock.permit(), (e) => e instanceof dlock.NotHeldError && e instanceof dlock.DlockError && e.code === 'not_held' && e.message === 'not held');
  const token = await lock.acquire({ timeout: 5000 });
  assert.equal(typeof token, 'bigint');
  assert.equal(lock.state, 'Holding');
  assert.equal(lock.token, token);
  assert.ok(lock.timeLeft > 0 && lock.timeLeft <= FAST.ttl, `timeLeft ${lock.timeLeft}`);
  await assert.rejects(lock.acquire(), (e) => e instanceof dlock.AlreadyHeldError && e.code === 'already_held');

  const p = lock.permit();
  assert.equal(p.token, token);
  assert.equal(p.valid(), true);
  assert.ok(p.remaining > 0);
  assert.equal(lock.inFlight, 1);
  assert.equal(lock.stats().inFlight, 1);
  p.end();
  p.end(); // twice is harmless
  assert.equal(lock.inFlight, 0);
  assert.equal(p.valid(), false);

  const q = lock.permit();
  assert.equal(typeof q[Symbol.dispose], 'function');
  q[Symbol.dispose]();
  assert.equal(lock.inFlight, 0);

  const across = lock.permit();
  await lock.release();
  assert.equal(lock.state, 'Released');
  assert.equal(across.valid(), false, 'a permit across the release is invalid at once');
  across.end();
  assert.throws(() => lock.permit(), (e) => e instanceof dlock.ReleasedError && e.code === 'released' && e.message === 'released');
  const stats = lock.stats();
  assert.equal(stats.acquisitions, 1);
  assert.equal(stats.inFlight, 0);
  await lock.close();
  await lock.close(); // twice is harmless
  assert.equal(lock.closed, true);
});

test('tryAcquire: WouldBlockError while another client holds the name', async () => {
  const { service, client } = embedded();
  const other = new dlock.Client({ service, ...FAST });
  const name = unique('try');
  const a = client.lock(name);
  const b = other.lock(name);
  const t1 = await a.tryAcquire();
  await assert.rejects(b.tryAcquire(), (e) => e instanceof dlock.WouldBlockError && e.code === 'would_block');
  await assert.rejects(b.acquire({ timeout: 100 }), (e) => e instanceof dlock.TimeoutError && e.code === 'timeout');
  assert.equal(service.holder(name), t1);
  await a.release();
  const t2 = await b.tryAcquire();
  assert.ok(t2 > t1, 'a later acquisition has a higher token');
  await Promise.all([a.close(), b.close()]);
});

test('AbortSignal: aborted before, during and after the acquire', async () => {
  const { service, client } = embedded();
  const other = new dlock.Client({ service, ...FAST });
  const name = unique('abort');

  // Before: rejects with the reason; nothing was started.
  const before = client.lock(name);
  const reason = new Error('not wanted');
  await assert.rejects(before.acquire({ signal: AbortSignal.abort(reason) }), (e) => e === reason);
  assert.equal(before.state, 'Idle');

  // During: a waiter behind a holder gives up; it never acquires later.
  const holder = other.lock(name);
  await holder.acquire();
  const waiter = client.lock(name);
  const ac = new AbortController();
  const acquiring = stateInto(waiter, 'Acquiring');
  const pending = waiter.acquire({ signal: ac.signal });
  await acquiring;
  ac.abort();
  await assert.rejects(pending, (e) => e.name === 'AbortError');
  await holder.release();
  const third = other.lock(`${name}`);
  // The name is free again: the aborted waiter left nothing behind.
  const t = await third.acquire({ timeout: 2000 });
  assert.ok(t > 0n);
  assert.notEqual(waiter.state, 'Holding');
  await third.release();

  // After: an abort once acquired changes nothing.
  const after = client.lock(name);
  const late = new AbortController();
  await after.acquire({ signal: late.signal });
  late.abort();
  await new Promise((r) => setImmediate(r));
  assert.equal(after.state, 'Holding');
  after.permit().end();
  await Promise.all([before, holder, waiter, third, after].map((l) => l.close()));
});

test('events: acquired, stateChange, drained, fence, reacquired; in order', async () => {
  const { client } = embedded();
  const lock = client.lock(unique('events'));
  const seen = [];
  lock.on('stateChange', (c) => seen.push(`state ${c.from}->${c.to} ${c.reason}`));
  lock.on('acquired', (t) => seen.push(`acquired ${t}`));
  lock.on('drained', () => seen.push('drained'));
  lock.on('fence', (t, inFlight) => seen.push(`fence ${t} ${inFlight}`));
  const t1 = await lock.acquire();
  const fenced = once(lock, 'fence');
  client.link.partition();
  await fenced;
  const reacquired = once(lock, 'acquired');
  client.link.heal();
  const [t2] = await reacquired;
  assert.ok(t2 > t1);
  assert.deepEqual(seen, [
    'state Idle->Acquiring acquire',
    'state Acquiring->Holding acquired',
    `acquired ${t1}`,
    'state Holding->Draining keepalive_timeout',
    'drained',
    'state Draining->Fenced deadline',
    `fence ${t1} 0`,
    'state Fenced->Reacquiring reacquire',
    'state Reacquiring->Holding reacquired',
    `acquired ${t2}`,
  ]);
  const s = lock.stats();
  assert.equal(s.acquisitions, 2);
  assert.equal(s.fencesDeadline, 1);
  await lock.close();
});

test("a throwing listener goes to 'error' if there is one, else process.emitWarning; the keepalive goes on", async () => {
  const { client } = embedded();
  const lock = client.lock(unique('throwing'));
  const boom = new Error('listener bug');
  lock.on('acquired', () => {
    throw boom;
  });
  const later = [];
  lock.on('acquired', (t) => later.push(t)); // still called
  const errors = once(lock, 'error');
  const t = await lock.acquire();
  const [e] = await errors;
  assert.equal(e, boom);
  assert.deepEqual(await new Promise((r) => setImmediate(() => r(later))), [t]);

  // Without an 'error' listener: a warning.
  const quiet = client.lock(unique('throwing-warn'));
  quiet.on('acquired', () => {
    throw new Error('second bug');
  });
  const warned = once(process, 'warning');
  await quiet.acquire();
  const [w] = await warned;
  assert.equal(w.message, 'second bug');

  // Keepalives were confirmed past several intervals: still holding, no drain.
  await new Promise((r) => setTimeout(r, FAST.keepaliveInterval * 3));
  assert.equal(lock.state, 'Holding');
  assert.equal(quiet.state, 'Holding');
  assert.equal(lock.stats().drains, 0);
  lock.permit().end();
  await Promise.all([lock.close(), quiet.close()]);
});

test('withLock: runs under the lock, releases after, passes the token', async () => {
  const { service, client } = embedded();
  const name = unique('with');
  const out = await client.withLock(name, { timeout: 1000 }, async ({ token, signal, lock }) => {
    assert.equal(service.holder(name), token);
    assert.equal(signal.aborted, false);
    lock.permit().end();
    return 42;
  });
  assert.equal(out, 42);
  assert.equal(service.holder(name), null, 'released after the function');
  // A function that throws: released, the error passed on.
  await assert.rejects(
    client.withLock(name, async () => {
      throw new Error('task failed');
    }),
    /task failed/,
  );
  assert.equal(service.holder(name), null);
});

test('withLock: the signal aborts at the fence, before the contender acquires', async () => {
  const { service, client } = embedded();
  const other = new dlock.Client({ service, ...FAST });
  const name = unique('with-fence');
  const contender = other.lock(name);
  let contenderAt = null;
  contender.on('acquired', () => {
    contenderAt ??= performance.now();
  });
  let abortedAt = null;
  const work = client.withLock(name, {}, async ({ signal }) => {
    contender.acquire({ timeout: 10_000 }).catch(() => {});
    client.link.partition();
    // A fetch-like task: never resolves by itself, stops on its signal.
    await new Promise((resolve, reject) => {
      signal.addEventListener('abort', () => {
        abortedAt = performance.now();
        reject(signal.reason);
      });
    });
  });
  await assert.rejects(work, (e) => e instanceof dlock.FencedError && e.code === 'fenced');
  assert.ok(abortedAt !== null);
  await once(contender, 'acquired');
  assert.ok(contenderAt > abortedAt, `aborted at ${abortedAt}, contender acquired at ${contenderAt}`);
  client.link.heal();
  await contender.close();
});

test('a blocked event loop: permit() is refused by the clock; the fence event comes once the loop is free', async () => {
  const { client } = embedded();
  const lock = client.lock(unique('blocked'));
  let fenceSeen = false;
  lock.on('fence', () => {
    fenceSeen = true;
  });
  await lock.acquire();
  lock.permit().end();
  client.link.partition();
  // Busy past any deadline: the last confirmed keepalive was sent at most
  // a keepalive interval ago, so the deadline is at most ttl - margin away.
  const until = performance.now() + FAST.ttl - FAST.margin + 500;
  while (performance.now() < until) {
    // blocking the loop on purpose
  }
  assert.throws(() => lock.permit(), (e) => e instanceof dlock.FencedError && e.code === 'fenced');
  assert.equal(fenceSeen, false, 'no event can run while the loop is blocked');
  await once(lock, 'fence');
  assert.equal(fenceSeen, true);
  client.link.heal();
  await lock.close();
});

test('guarded writes on the embedded service: a stale token is refused', async () => {
  const { service, client } = embedded();
  const name = unique('guarded');
  const lock = client.lock(name);
  const t1 = await lock.acquire();
  await lock.guardedPut(t1, 'node-test/value', 'one');
  assert.equal(service.get('node-test/value').toString(), 'one');
  await assert.rejects(lock.guardedPut(t1, `${name}/inside`, 'x'), (e) => e.code === 'invalid_argument');
  await assert.rejects(lock.guardedPut(t1 + 1000n, 'node-test/value', 'x'), (e) => e instanceof dlock.FencedError);
  // Deleted key: fenced and reacquired; the old token's write is refused.
  const reacquired = once(lock, 'acquired');
  assert.equal(service.deleteLockKey(name), true);
  const [t2] = await reacquired;
  assert.ok(t2 > t1);
  await assert.rejects(lock.guardedPut(t1, 'node-test/value', 'stale'), (e) => e instanceof dlock.FencedError && e.code === 'fenced');
  assert.equal(service.get('node-test/value').toString(), 'one');
  await lock.guardedDelete(t2, 'node-test/value');
  assert.equal(service.get('node-test/value'), null);
  await lock.close();
});

test('client.shutdown(): the key goes at once, a waiter acquires; the handles behave as closed', async () => {
  const { service, client } = embedded();
  const other = new dlock.Client({ service, ...FAST });
  const name = unique('shutdown');
  const held = client.lock(name);
  await held.acquire({ timeout: 2000 });
  const waiter = other.lock(name);
  const acquiring = stateInto(waiter, 'Acquiring');
  const waiting = waiter.acquire({ timeout: 5000 });
  await acquiring;
  const started = performance.now();
  client.shutdown();
  const t = await waiting;
  // One keepalive timeout at most (200 ms), not the TTL (2 s).
  assert.ok(performance.now() - started < FAST.keepaliveTimeout + 300, `${performance.now() - started} ms`);
  assert.ok(t > 0n);
  assert.equal(held.state, 'Released');
  assert.throws(() => held.permit(), (e) => e instanceof dlock.ReleasedError);
  await assert.rejects(held.acquire({ timeout: 100 }), (e) => e instanceof dlock.ShutdownError && e.code === 'shutdown');
  await held.release(); // harmless
  client.shutdown(); // twice is harmless
  await Promise.all([held.close(), waiter.close()]);
});

test('FenceGate: a lower token is a StaleError', () => {
  const gate = new dlock.FenceGate();
  gate.admit('orders', 5n);
  gate.admit('orders', 5);
  gate.admit('orders', 7n);
  assert.throws(
    () => gate.admit('orders', 6n),
    (e) =>
      e instanceof dlock.StaleError &&
      e instanceof dlock.DlockError &&
      e.code === 'stale' &&
      e.highest === 7n &&
      e.token === 6n &&
      e.message === 'stale token 6: token 7 was already seen',
  );
  assert.equal(gate.highest('orders'), 7n);
  assert.equal(gate.highest('other'), null);
  assert.throws(() => gate.admit('orders', 1.5), RangeError);
});

test('sessions: locks of one session share its lease; close releases them all', async () => {
  const { service, client } = embedded();
  const session = client.session(FAST);
  assert.equal(session.isDefault, false);
  const a = session.lock(unique('s-a'));
  const b = session.lock(unique('s-b'));
  await Promise.all([a.acquire(), b.acquire()]);
  assert.equal(session.stats().locks, 2);
  assert.notEqual(session.lease, null);
  assert.equal(a.session.lease, session.lease);
  await session.close();
  assert.equal(service.holder(a.name), null);
  assert.equal(service.holder(b.name), null);
  assert.equal(client.defaultSession.isDefault, true);
});

test('events(): the same events pulled, in order; the stream ends with the close', async () => {
  const { client } = embedded();
  const lock = client.lock(unique('stream'));
  const stream = lock.events();
  const early = lock.events();
  const t = await lock.acquire();
  await early.return(); // a stream given back gets nothing more
  await lock.close();
  const got = [];
  for await (const e of stream) got.push(e);
  assert.deepEqual(got, [
    { kind: 'state', from: 'Idle', to: 'Acquiring', reason: 'acquire' },
    { kind: 'state', from: 'Acquiring', to: 'Holding', reason: 'acquired' },
    { kind: 'acquired', token: t },
    { kind: 'state', from: 'Holding', to: 'Released', reason: 'release' },
  ]);
  assert.deepEqual(await early.next(), { value: undefined, done: true });
  const after = lock.events();
  assert.deepEqual(await after.next(), { value: undefined, done: true }, 'a closed lock has an ended stream');
});

test("withLock: the caller's signal aborts the task's signal too, and the lock is released", async () => {
  const { service, client } = embedded();
  const name = unique('with-outer');
  const ac = new AbortController();
  const reason = new Error('shutting down');
  const work = client.withLock(name, { signal: ac.signal }, ({ signal }) => {
    setImmediate(() => ac.abort(reason));
    return new Promise((_, reject) => signal.addEventListener('abort', () => reject(signal.reason)));
  });
  await assert.rejects(work, (e) => e === reason);
  assert.equal(service.holder(name), null);
  await assert.rejects(client.withLock(name, { signal: AbortSignal.abort(reason) }, () => 1), (e) => e === reason);
  assert.equal(service.holder(name), null);
});

test('holder() names another client\'s identity (issue 31)', async () => {
  const service = new dlock.Service();
  const a = new dlock.Client({ service, description: 'nightly backup' });
  const b = new dlock.Client({ service });
  const name = unique('holder');
  const seen = b.lock(name);
  assert.equal(await seen.holder(), undefined);
  const held = a.lock(name);
  const token = await held.acquire();
  const h = await seen.holder();
  assert.equal(h.token, token);
  assert.ok(h.key.startsWith(`${name}/`));
  assert.equal(h.identity.description, 'nightly backup');
  assert.equal(h.identity.pid, process.pid);
  assert.equal(h.identity.face, 'node');
  assert.ok(h.identity.host && h.identity.started > 0);
  assert.deepEqual(Object.keys(h.identity).sort(), ['description', 'face', 'host', 'pid', 'started', 'version']);
  await held.release();
  assert.equal(await seen.holder(), undefined);
  assert.throws(() => new dlock.Client({ service, description: 'a\0b' }), (e) => e.code === 'invalid_option');
  a.shutdown();
  b.shutdown();
});
