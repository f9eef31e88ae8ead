// The etcd backend against the test cluster (scripts/etcd-cluster.sh):
// guarded writes, a fence on `etcdctl del` of the lock key, and a process
// that exits while holding releases its lock on the way out. Skipped
// without a cluster (DLOCK_TEST_MEMBERS), failed instead when
// DLOCK_TEST_REQUIRE_ETCD=1.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { execFileSync, spawnSync } = require('node:child_process');
const path = require('node:path');
const dlock = require('..');

const members = process.env.DLOCK_TEST_MEMBERS;
const required = process.env.DLOCK_TEST_REQUIRE_ETCD === '1';
const skip = members ? false : 'no etcd test cluster (DLOCK_TEST_MEMBERS)';
if (!members && required) throw new Error('DLOCK_TEST_REQUIRE_ETCD=1 but DLOCK_TEST_MEMBERS is not set');

const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

const FAST = { ttl: 3000, keepaliveInterval: 1000, keepaliveTimeout: 500, retryInterval: 250, margin: 1000 };
const unique = (what) => `node-test/${what}/${process.pid}/${Date.now()}`;

function etcdctl(...args) {
  return execFileSync('etcdctl', [`--endpoints=${members}`, '--dial-timeout=2s', '--command-timeout=5s', ...args], {
    encoding: 'utf8',
    env: { ...process.env, ETCDCTL_API: '3' },
  });
}

const lockKeys = (name) =>
  etcdctl('get', '--prefix', `${name}/`, '--keys-only')
    .split('\n')
    .filter((l) => l.length > 0);

test('etcd: acquire, permit, guarded writes, release', { skip }, async () => {
  const client = new dlock.Client({ endpoints: members, ...FAST });
  assert.equal(client.link, null, 'no fault switches on etcd');
  const name = unique('basic');
  const lock = client.lock(name);
  const token = await lock.acquire({ timeout: 5000 });
  assert.equal(lockKeys(name).length, 1);
  const p = lock.permit();
  assert.equal(p.token, token);
  const key = `${name}-data`;
  await lock.guardedPut(p.token, key, 'v1');
  p.end();
  assert.equal(etcdctl('get', key, '--print-value-only').trim(), 'v1');
  await assert.rejects(lock.guardedPut(token + 1n, key, 'v2'), (e) => e instanceof dlock.FencedError && e.code === 'fenced');
  await lock.guardedDelete(token, key);
  assert.equal(etcdctl('get', key, '--print-value-only').trim(), '');
  await lock.release();
  assert.deepEqual(lockKeys(name), []);
  await lock.close();
});

test('etcd: `etcdctl del` of the lock key fences (lock_lost); the stale token cannot write', { skip }, async () => {
  const client = new dlock.Client({ endpoints: members.split(','), ...FAST });
  const name = unique('del');
  const lock = client.lock(name);
  const changes = [];
  lock.on('stateChange', (c) => changes.push(c));
  const t1 = await lock.acquire({ timeout: 5000 });
  const key = `${name}-data`;
  await lock.guardedPut(t1, key, 'first');
  const fenced = once(lock, 'fence');
  const reacquired = once(lock, 'acquired');
  // Past the session's short-hold window, so the key's watcher is on.
  await new Promise((r) => setTimeout(r, 100));
  const [held] = lockKeys(name);
  etcdctl('del', held);
  const [fencedToken] = await fenced;
  assert.equal(fencedToken, t1);
  assert.ok(
    changes.some((c) => c.to === 'Fenced' && c.reason === 'lock_lost'),
    JSON.stringify(changes),
  );
  // Refused, or granted only under a new token (the reacquire is quick).
  try {
    const p = lock.permit();
    assert.notEqual(p.token, t1);
    p.end();
  } catch (e) {
    assert.ok(e instanceof dlock.DlockError, String(e));
  }
  const [t2] = await reacquired;
  assert.ok(t2 > t1);
  await assert.rejects(lock.guardedPut(t1, key, 'stale'), (e) => e instanceof dlock.FencedError);
  assert.equal(etcdctl('get', key, '--print-value-only').trim(), 'first');
  lock.permit().end();
  await lock.guardedDelete(t2, key);
  await lock.close();
});

for (const mode of ['hold', 'exit']) {
  test(`etcd: a process that ${mode === 'hold' ? 'ends' : 'calls process.exit'} while holding releases on the way out`, { skip }, async () => {
    const name = unique(`exit-${mode}`);
    const r = spawnSync(process.execPath, [path.join(__dirname, 'fixtures', 'hold.js'), name, mode], {
      encoding: 'utf8',
      timeout: 20_000,
      env: { ...process.env, DLOCK_ENDPOINTS: members },
    });
    assert.equal(r.error, undefined, String(r.error));
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^held \d+$/m);
    // The child's TTL is 15 s: without the release on exit its key would
    // stand that long.
    assert.deepEqual(lockKeys(name), [], 'the lock key is gone once the child has exited');
    const client = new dlock.Client({ endpoints: members, ...FAST });
    const lock = client.lock(name);
    await lock.tryAcquire();
    await lock.close();
  });
}
