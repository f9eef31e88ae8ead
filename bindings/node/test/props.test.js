// Bad input through the public API, by property (fast-check): every call
// returns, resolves, throws or rejects with the face's documented errors
// (TypeError, RangeError, DlockError) -- never a crash, a hang, another
// error, or a lock left in a state another call disagrees with. Embedded
// backend; a few thousand cases in CI (DLOCK_PROPS_RUNS per property,
// default 400; more for a longer run).
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const fc = require('fast-check');
const dlock = require('..');

const RUNS = Number(process.env.DLOCK_PROPS_RUNS ?? 400);
const FAST = { ttl: 2000, keepaliveInterval: 500, keepaliveTimeout: 200, retryInterval: 200, margin: 500 };
const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

const CODES = new Set(dlock.codeWords ? dlock.codeWords() : []);
function documented(e) {
  if (e instanceof dlock.DlockError) {
    assert.ok(CODES.size === 0 || CODES.has(e.code), `unknown code ${e.code}`);
    return true;
  }
  return e instanceof TypeError || e instanceof RangeError;
}

/** f() or its documented error; anything else fails the property. */
function call(f) {
  try {
    return f();
  } catch (e) {
    if (!documented(e)) throw e;
    return e;
  }
}

async function callAsync(f) {
  try {
    return await f();
  } catch (e) {
    if (!documented(e)) throw e;
    return e;
  }
}

const numbers = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.constantFrom(0, -0, -1, NaN, Infinity, -Infinity, 2 ** 53, 2 ** 64, Number.MAX_VALUE, 1e-300, 0.5),
  fc.bigInt({ min: -(2n ** 70n), max: 2n ** 70n }),
  fc.constantFrom(0n, 2n ** 64n - 1n, 2n ** 64n, -1n),
);
const texts = fc.oneof(
  fc.string({ maxLength: 40 }),
  fc.fullUnicodeString({ maxLength: 300 }),
  fc.constantFrom('', '\u0000', 'a\u0000b', '\ud800', 'x'.repeat(1025), 'é'.repeat(600)),
);
const anything = fc.oneof(
  numbers,
  texts,
  fc.uint8Array({ maxLength: 64 }),
  fc.constantFrom(null, undefined, true, false, {}, [], () => 1, Symbol('s'), new Date(0)),
  fc.object({ maxDepth: 1 }),
);

function embedded(extra = {}) {
  const service = new dlock.Service();
  return { service, client: new dlock.Client({ service, ...FAST, ...extra }) };
}

test('Client options: any value is a client or a documented error', () => {
  const keys = ['ttl', 'keepaliveInterval', 'keepaliveTimeout', 'retryInterval', 'margin', 'reacquire',
    'connectTimeout', 'requestTimeout', 'endpoints', 'bogus'];
  fc.assert(fc.property(fc.dictionary(fc.constantFrom(...keys), anything, { maxKeys: 4 }), (o) => {
    const c = call(() => new dlock.Client({ service: new dlock.Service(), ...o }));
    if (c instanceof dlock.Client) {
      const t = c.options;
      assert.ok(t.ttl > t.keepaliveInterval && t.ttl > t.margin);
    }
  }), { numRuns: RUNS });
});

test('lock names: a lock or a documented error', () => {
  const { client } = embedded();
  fc.assert(fc.property(anything, (name) => {
    const l = call(() => client.lock(name));
    if (l instanceof dlock.Lock) {
      assert.equal(typeof name, 'string');
      assert.equal(l.state, 'Idle');
    }
  }), { numRuns: RUNS });
});

test('acquire options: a token with the lock held, or a documented error with it free', async () => {
  const { client, service } = embedded();
  const name = 'props-acquire';
  await fc.assert(fc.asyncProperty(fc.oneof(anything, fc.record({ timeout: anything }, { requiredKeys: [] })),
    async (opts) => {
      const lock = client.lock(name);
      const r = await callAsync(() => lock.acquire(opts));
      if (typeof r === 'bigint') {
        assert.equal(lock.state, 'Holding');
        assert.equal(lock.token, r);
        assert.equal(service.holder(name), r);
      } else {
        assert.ok(['Idle', 'Released'].includes(lock.state), lock.state);
        assert.equal(lock.token, null);
      }
      await lock.close();
      assert.equal(lock.state, 'Released');
      assert.equal(service.holder(name), null);
    }), { numRuns: RUNS });
});

test('guarded writes: committed only with the holding token and a usable key', async () => {
  const { client, service } = embedded();
  const lock = client.lock('props-guarded');
  const held = await lock.acquire({ timeout: 5000 });
  await fc.assert(fc.asyncProperty(fc.oneof(anything, fc.constant(held)), anything, anything,
    fc.constantFrom('put', 'delete'), async (token, key, value, op) => {
      const r = await callAsync(() => (op === 'put' ? lock.guardedPut(token, key, value) : lock.guardedDelete(token, key)));
      if (r === undefined) {
        assert.equal(BigInt(token), held);
        const got = service.get(key);
        if (op === 'put') assert.deepEqual(got, Buffer.from(typeof value === 'string' ? value : value));
        else assert.equal(got, null);
      } else if (r instanceof dlock.FencedError) {
        assert.notEqual(BigInt(token), held);
      }
      assert.equal(lock.state, 'Holding');
      assert.equal(lock.token, held);
    }), { numRuns: RUNS });
  await lock.close();
});

test('FenceGate: admit refuses below the highest, documented errors for bad input', () => {
  fc.assert(fc.property(anything, anything, (name, token) => {
    const g = new dlock.FenceGate();
    const r = call(() => g.admit(name, token));
    if (r === undefined) {
      assert.equal(g.highest(name), BigInt(token));
      if (BigInt(token) > 0n) {
        assert.ok(call(() => g.admit(name, BigInt(token) - 1n)) instanceof dlock.StaleError);
      }
    }
  }), { numRuns: RUNS });
});

test('link and service switches: documented errors, and the service still works', async () => {
  await fc.assert(fc.asyncProperty(anything, anything, async (a, b) => {
    const { client, service } = embedded();
    const link = client.link;
    for (const f of [() => link.delayKeepaliveReplies(a), () => link.dropKeepaliveReplies(a),
      () => link.failKeepalives(a), () => service.holder(a), () => service.get(a),
      () => service.revokeLease(a), () => service.deleteLockKey(a), () => service.freezeExpiry(b),
      () => service.outage(b), () => dlock.stallDriver(typeof a === 'number' ? Math.min(Math.abs(a), 5) : a)]) {
      call(f);
    }
    link.heal();
    link.delayKeepaliveReplies(0);
    link.dropKeepaliveReplies(false);
    link.failKeepalives(false);
    service.freezeExpiry(false);
    service.outage(false);
    const lock = client.lock('after-switches');
    assert.equal(typeof (await lock.acquire({ timeout: 5000 })), 'bigint');
    await lock.close();
  }), { numRuns: Math.max(RUNS / 4, 10) });
});

// Two locks of one name on one service; any call in any order, also after
// close and from listeners: at most one holds, its token is the
// service's, and every refusal is documented.
test('contenders: any sequence of calls, the locks and the service agree', async () => {
  const op = fc.record({
    i: fc.integer({ min: 0, max: 1 }),
    what: fc.constantFrom('acquire', 'tryAcquire', 'release', 'close', 'permit', 'endPermit', 'guardedPut',
      'deleteKey', 'useAfterClose'),
    token: numbers,
  });
  await fc.assert(fc.asyncProperty(fc.array(op, { maxLength: 25 }), async (ops) => {
    const { client, service } = embedded({ reacquire: false });
    const name = 'contended';
    const locks = [client.lock(name), client.lock(name)];
    const permits = [null, null];
    const bad = [];
    for (const l of locks) {
      for (const ev of ['stateChange', 'fence', 'acquired', 'drained']) {
        l.on(ev, () => {
          // Calls from a listener: reads, and a permit taken and ended.
          try {
            void [l.state, l.token, l.timeLeft, l.inFlight, l.stats()];
            l.permit().end();
          } catch (e) {
            if (!documented(e)) bad.push(e);
          }
        });
      }
    }
    for (const { i, what, token } of ops) {
      const l = locks[i];
      switch (what) {
        case 'acquire': await callAsync(() => l.acquire({ timeout: 20 })); break;
        case 'tryAcquire': await callAsync(() => l.tryAcquire()); break;
        case 'release': await callAsync(() => l.release()); break;
        case 'close': await callAsync(() => l.close()); break;
        case 'permit': {
          const p = call(() => l.permit());
          if (p instanceof dlock.Permit) {
            assert.equal(l.state, 'Holding');
            assert.equal(p.token, l.token);
            if (permits[i]) permits[i].end();
            permits[i] = p;
          }
          break;
        }
        case 'endPermit':
          if (permits[i]) {
            permits[i].end();
            permits[i].end();
            assert.equal(permits[i].valid(), false);
            permits[i] = null;
          }
          break;
        case 'guardedPut': await callAsync(() => l.guardedPut(token, 'k', 'v')); break;
        case 'deleteKey': {
          service.deleteLockKey(name);
          // The holder hears of it on the driver thread: wait for its fence.
          const end = Date.now() + 5000;
          while (locks.some((x) => x.state === 'Holding' || x.state === 'Draining')) {
            assert.ok(Date.now() < end, 'no fence 5 s after the lock key was deleted');
            await new Promise((r) => setTimeout(r, 1));
          }
          break;
        }
        case 'useAfterClose':
          if (l.closed) {
            await callAsync(() => l.acquire({ timeout: 0 }));
            call(() => l.permit());
            await callAsync(() => l.release());
            assert.equal(l.token, null);
          }
          break;
        default: throw new Error(what);
      }
      const holding = locks.filter((x) => x.state === 'Holding' || x.state === 'Draining');
      assert.ok(holding.length <= 1, locks.map((x) => x.state).join(','));
      for (const x of locks) assert.equal(x.token !== null, holding.includes(x), `${x.state} ${x.token}`);
      if (holding.length) assert.ok([holding[0].token, null].includes(service.holder(name)));
    }
    for (const p of permits) if (p) p.end();
    await Promise.all(locks.map((l) => l.close()));
    assert.deepEqual(bad, []);
  }), { numRuns: Math.max(RUNS / 4, 10) });
});
