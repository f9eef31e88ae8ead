// Semaphores in the Node face (issue 29, docs/design.md §26): the face
// converts, the core decides. On the embedded engine: N + 1 contenders and
// exactly N hold, on distinct slots; tryAcquire; the limit's rules; a
// timeout or an aborted signal leave nothing held; README.md's Node block
// under `## Semaphores` as written. One case on the etcd test cluster when
// DLOCK_TEST_ETCD says it exists.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const dlock = require('..');

const FAST = { ttl: 2000, keepaliveInterval: 500, keepaliveTimeout: 200, retryInterval: 200, margin: 500 };

const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

let n = 0;
const unique = (what) => `node-test/sem-${what}/${process.pid}/${n++}`;

function embedded() {
  const service = new dlock.Service();
  const client = new dlock.Client({ service, ...FAST });
  return { service, client };
}

/** The token holding each slot of `name` on the service (null: free). */
const holders = (service, name, limit) => Array.from({ length: limit }, (_, i) => service.holder(`${name}/slot/${i}`));

test('acquire resolves with a held Lock of a slot; release frees it', async () => {
  const { service, client } = embedded();
  const name = unique('basic');
  const sem = client.semaphore(name, 2);
  assert.ok(sem instanceof dlock.Semaphore);
  assert.equal(sem.name, name);
  assert.equal(sem.limit, 2);
  assert.equal(dlock.MAX_SEMAPHORE_LIMIT, 1024);
  const held = await sem.acquire({ timeout: 5000 });
  assert.ok(held instanceof dlock.Lock);
  assert.ok(held.slot === 0 || held.slot === 1);
  assert.equal(held.name, `${name}/slot/${held.slot}`);
  assert.equal(held.state, 'Holding');
  const p = held.permit();
  assert.equal(p.token, held.token);
  p.end();
  assert.equal(service.holder(held.name), held.token);
  await held.release();
  assert.equal(held.state, 'Released');
  assert.deepEqual(holders(service, name, 2), [null, null]);
  assert.equal(client.lock(unique('plain')).slot, null);
});

test('N + 1 contenders: exactly N hold, on distinct slots; a release passes a slot on', async () => {
  const { service, client } = embedded();
  const name = unique('n1');
  const N = 3;
  const sems = Array.from({ length: N + 1 }, () => client.session().semaphore(name, N));
  const results = await Promise.allSettled(sems.map((s) => s.acquire({ timeout: 1000 })));
  const won = results.filter((r) => r.status === 'fulfilled').map((r) => r.value);
  const lost = results.map((r, i) => [r, i]).filter(([r]) => r.status === 'rejected');
  assert.equal(won.length, N);
  assert.equal(lost.length, 1);
  assert.ok(lost[0][0].reason instanceof dlock.TimeoutError, String(lost[0][0].reason));
  assert.deepEqual(won.map((l) => l.slot).sort(), [0, 1, 2]);
  const bySlot = [...won].sort((a, b) => a.slot - b.slot);
  assert.deepEqual(holders(service, name, N), bySlot.map((l) => l.token));
  const freed = won[0];
  const slot = freed.slot;
  await freed.release();
  const again = await sems[lost[0][1]].acquire({ timeout: 5000 });
  assert.equal(again.slot, slot);
  for (const l of [again, ...won.slice(1)]) await l.release();
  assert.deepEqual(holders(service, name, N), [null, null, null]);
});

test('tryAcquire rejects with WouldBlockError when every slot is held', async () => {
  const { client } = embedded();
  const name = unique('try');
  const a = await client.semaphore(name, 2).tryAcquire();
  const b = await client.session().semaphore(name, 2).tryAcquire();
  assert.deepEqual([a.slot, b.slot].sort(), [0, 1]);
  await assert.rejects(client.session().semaphore(name, 2).tryAcquire(), { name: 'WouldBlockError', code: 'would_block' });
  await assert.rejects(client.session().semaphore(name, 2).acquire({ timeout: 0 }), dlock.WouldBlockError);
  await b.release();
  const c = await client.session().semaphore(name, 2).tryAcquire();
  assert.equal(c.slot, b.slot);
  await a.release();
  await c.release();
});

test('the limit: recorded once, a mismatch and 0 are invalid_argument', () => {
  const { client } = embedded();
  const name = unique('limit');
  client.semaphore(name, 3);
  assert.throws(() => client.session().semaphore(name, 4), (e) => {
    assert.ok(e instanceof dlock.InvalidArgumentError);
    assert.equal(e.code, 'invalid_argument');
    assert.match(e.message, /3/);
    assert.match(e.message, /4/);
    return true;
  });
  for (const bad of [0, dlock.MAX_SEMAPHORE_LIMIT + 1, 2 ** 40, -1, 1.5, NaN, Infinity]) {
    assert.throws(() => client.semaphore(unique('bad'), bad), { code: 'invalid_argument' }, String(bad));
  }
  assert.throws(() => client.semaphore('', 1), { code: 'invalid_argument' });
  assert.throws(() => client.semaphore(5, 1), TypeError);
  assert.throws(() => client.semaphore('x', '2'), TypeError);
  assert.equal(client.session().semaphore(name, 3).limit, 3);
});

test('a timeout leaves nothing held', async () => {
  const { service, client } = embedded();
  const name = unique('timeout');
  const sem = client.semaphore(name, 2);
  const a = await sem.acquire();
  const b = await sem.acquire();
  const before = holders(service, name, 2);
  const started = Date.now();
  await assert.rejects(client.session().semaphore(name, 2).acquire({ timeout: 300 }), dlock.TimeoutError);
  assert.ok(Date.now() - started >= 250);
  assert.deepEqual(holders(service, name, 2), before);
  await a.release();
  await b.release();
  assert.deepEqual(holders(service, name, 2), [null, null]);
});

test('AbortSignal: aborted before, during, and just as a slot is won: nothing held', async () => {
  const { service, client } = embedded();
  const name = unique('abort');
  const sem = client.semaphore(name, 1);
  const reason = new Error('stop');
  await assert.rejects(sem.acquire({ signal: AbortSignal.abort(reason) }), (e) => e === reason);
  const held = await sem.acquire();
  const ac = new AbortController();
  const waiting = client.session().semaphore(name, 1).acquire({ signal: ac.signal });
  setTimeout(() => ac.abort(), 100);
  await assert.rejects(waiting, { name: 'AbortError' });
  await held.release();
  // aborted just as the free slot is won: let go
  for (let i = 0; i < 20; i++) {
    const c = new AbortController();
    const p = client.session().semaphore(name, 1).acquire({ signal: c.signal });
    c.abort();
    await assert.rejects(p);
  }
  // the slot is free: another handle gets it at once
  const next = await client.session().semaphore(name, 1).acquire({ timeout: 2000 });
  assert.equal(next.slot, 0);
  assert.equal(service.holder(`${name}/slot/0`), next.token);
  await next.release();
  // an abort once acquired changes nothing
  const late = new AbortController();
  const kept = await sem.acquire({ signal: late.signal });
  late.abort();
  assert.equal(kept.state, 'Holding');
  await kept.release();
});

test('session.semaphore holds its slots on that session', async () => {
  const { client } = embedded();
  const s = client.session();
  const held = await s.semaphore(unique('session'), 2).acquire({ timeout: 5000 });
  assert.equal(held.session.lease, s.lease);
  await s.close();
  assert.equal(held.state, 'Released');
});

// ------------------------------------------------------------------ README

const readmePath = (() => {
  for (let dir = path.join(__dirname, '..'); ; dir = path.dirname(dir)) {
    const p = path.join(dir, 'README.md');
    if (fs.existsSync(p) && fs.readFileSync(p, 'utf8').includes('\n## Semaphores\n')) return p;
    assert.notEqual(path.dirname(dir), dir, 'no README.md with a "## Semaphores" heading');
  }
})();

test("README.md's Node block under `## Semaphores` runs as written", async () => {
  const ts = require(path.join(__dirname, '..', 'node_modules', 'typescript'));
  const section = fs.readFileSync(readmePath, 'utf8').split('\n## Semaphores\n')[1].split('\n## ')[0];
  const start = section.indexOf('```ts\n');
  assert.ok(start >= 0, "README.md's Semaphores section has no ```ts block: update this test");
  const body = section.slice(start + 6);
  const code = body.slice(0, body.indexOf('```'));
  const out = ts.transpileModule(code, {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, strict: true },
  });
  const AsyncFunction = (async () => {}).constructor;
  const run = new AsyncFunction('client', 'signal', 'useGpu', out.outputText);
  const { service, client } = embedded();
  const seen = [];
  const useGpu = async (slot, lockName, token) => {
    assert.equal(service.holder(lockName), token);
    seen.push([slot, lockName, token]);
  };
  await Promise.all([0, 1].map(() => run(client, new AbortController().signal, useGpu)));
  assert.equal(seen.length, 2);
  for (const [slot, lockName] of seen) assert.equal(lockName, `gpu/slot/${slot}`);
  assert.notEqual(seen[0][0], seen[1][0], 'two holders at once, on distinct slots');
  assert.deepEqual(holders(service, 'gpu', 4), [null, null, null, null], 'the block left a slot held');
});

// -------------------------------------------------------------------- etcd

const members = process.env.DLOCK_TEST_MEMBERS;
const skip = process.env.DLOCK_TEST_ETCD ? false : 'no etcd test cluster (DLOCK_TEST_ETCD unset)';

test('etcd: N + 1 contenders, the limit, the slots are etcd lock keys', { skip }, async () => {
  const client = new dlock.Client({ endpoints: members, ttl: 3000, keepaliveInterval: 1000, keepaliveTimeout: 500, retryInterval: 250, margin: 1000 });
  const name = `node-test/sem/${process.pid}/${Date.now()}`;
  const sems = [0, 1, 2].map(() => client.session().semaphore(name, 2));
  const a = await sems[0].acquire({ timeout: 10_000 });
  const b = await sems[1].acquire({ timeout: 10_000 });
  assert.deepEqual([a.slot, b.slot].sort(), [0, 1]);
  await assert.rejects(sems[2].tryAcquire(), dlock.WouldBlockError);
  await assert.rejects(sems[2].acquire({ timeout: 500 }), dlock.TimeoutError);
  assert.throws(() => client.semaphore(name, 3), { code: 'invalid_argument', message: /2[\s\S]*3|3[\s\S]*2/ });
  const keys = execFileSync('etcdctl', [`--endpoints=${members}`, 'get', '--prefix', '--keys-only', `${name}/slot/`], {
    encoding: 'utf8',
    env: { ...process.env, ETCDCTL_API: '3' },
  })
    .split('\n')
    .filter((l) => l.length > 0)
    .map((k) => k.slice(0, k.lastIndexOf('/')))
    .sort();
  assert.deepEqual(keys, [`${name}/slot/0`, `${name}/slot/1`]);
  const freed = b.slot;
  await b.release();
  const c = await sems[2].acquire({ timeout: 10_000 });
  assert.equal(c.slot, freed);
  await c.release();
  await a.release();
  client.shutdown();
});
