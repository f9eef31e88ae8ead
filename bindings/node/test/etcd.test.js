// The etcd backend against the test cluster (scripts/etcd-cluster.sh):
// guarded writes, a fence on `etcdctl del` of the lock key, and a process
// that exits while holding releases its lock on the way out. Skipped
// (reported as skipped, never passed) unless DLOCK_TEST_ETCD says the
// cluster exists (target/etcd/env sets it); then a missing cluster fails.
// The exit tests print `EXIT|node-<mode>|<ms>`: from the start of a holding
// child's exit path to a waiting contender's acquisition.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { once } = require('node:events');
const { execFileSync, spawn, spawnSync } = require('node:child_process');
const readline = require('node:readline');
const path = require('node:path');
const dlock = require('..');

const members = process.env.DLOCK_TEST_MEMBERS;
const skip = process.env.DLOCK_TEST_ETCD ? false : 'no etcd test cluster (DLOCK_TEST_ETCD unset)';
if (!skip && !members) throw new Error('DLOCK_TEST_ETCD is set but DLOCK_TEST_MEMBERS is not: source target/etcd/env');

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

// Exit while holding, measured: a contender waits behind a child that
// holds; the child's exit path (the script's end, process.exit) runs the
// core's shutdown, so the contender acquires within one keepalive timeout
// (500 ms, + 500 ms of slack for a loaded machine). The baseline, in the
// same run: a SIGKILLed child runs no exit path, the lock passes at the
// lease's expiry (TTL 3 s).
const KEEPALIVE_TIMEOUT_MS = 500;
const SLACK_MS = 500;
for (const mode of ['end', 'exit', 'sigkill']) {
  test(`etcd: exit while holding (${mode}): ${mode === 'sigkill' ? 'the baseline waits out the lease' : 'a contender acquires within a keepalive timeout'}`, { skip }, async () => {
    const name = unique(`exit-measure-${mode}`);
    const child = spawn(process.execPath, [path.join(__dirname, 'fixtures', 'exit-holding.js'), name, mode === 'exit' ? 'exit' : 'end'], {
      env: { ...process.env, DLOCK_ENDPOINTS: members },
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const exited = once(child, 'exit');
    const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
    const line = async (prefix) => {
      for (;;) {
        const r = await lines.next();
        if (r.done) throw new Error(`no '${prefix}' line from the child`);
        if (r.value.startsWith(prefix)) return r.value.slice(prefix.length).trim();
      }
    };
    const held = BigInt(await line('held '));
    const client = new dlock.Client({ endpoints: members, ...FAST, reacquire: false });
    const lock = client.lock(name);
    const acquiring = lock.acquire({ timeout: 20_000 }).then((token) => ({ token, at: process.hrtime.bigint() }));
    // The contender's key is behind the child's: it waits.
    for (let i = 0; lockKeys(name).length < 2; i++) {
      assert.ok(i < 1000, 'the contender never queued');
      await new Promise((r) => setTimeout(r, 10));
    }
    let exitAt;
    if (mode === 'sigkill') {
      exitAt = process.hrtime.bigint();
      child.kill('SIGKILL');
    } else {
      child.stdin.end();
      exitAt = BigInt(await line('exit '));
    }
    const { token, at } = await acquiring;
    const ms = Number(at - exitAt) / 1e6;
    console.log(`EXIT|node-${mode}|${ms.toFixed(1)}`);
    const [code, signal] = await exited;
    assert.ok(token > held);
    if (mode === 'sigkill') {
      assert.equal(signal, 'SIGKILL');
      assert.ok(ms > KEEPALIVE_TIMEOUT_MS + SLACK_MS, `the baseline passed in ${ms} ms`);
    } else {
      assert.equal(code, 0);
      assert.ok(ms < KEEPALIVE_TIMEOUT_MS + SLACK_MS, `the contender acquired ${ms} ms after the exit`);
    }
    await lock.close();
  });
}

// Issue 32, 8: a stop signal (SIGTERM: systemd, Kubernetes, Docker;
// SIGINT: Ctrl-C) to a holder with no handler of its own releases within
// one keepalive timeout and the process still dies of the signal; with
// the application's handler installed, that handler runs and decides (it
// exits 4), and the lock is free as fast.
for (const sig of ['SIGTERM', 'SIGINT']) {
  for (const handler of [false, true]) {
    test(`etcd: ${sig} to a holder ${handler ? "with the application's handler" : 'with no handler'} frees the lock within a keepalive timeout`, { skip }, async () => {
      const name = unique(`signal-${sig}-${handler}`);
      const child = spawn(process.execPath, [path.join(__dirname, 'fixtures', 'exit-holding.js'), name, handler ? 'app-handler' : 'end'], {
        env: { ...process.env, DLOCK_ENDPOINTS: members },
        stdio: ['pipe', 'pipe', 'inherit'],
      });
      const exited = once(child, 'exit');
      const out = [];
      const lines = readline.createInterface({ input: child.stdout });
      const held = new Promise((resolve) =>
        lines.on('line', (l) => {
          out.push(l);
          if (l.startsWith('held ')) resolve(BigInt(l.slice(5)));
        }),
      );
      const token0 = await held;
      const client = new dlock.Client({ endpoints: members, ...FAST, reacquire: false });
      const lock = client.lock(name);
      const acquiring = lock.acquire({ timeout: 20_000 }).then((token) => ({ token, at: process.hrtime.bigint() }));
      for (let i = 0; lockKeys(name).length < 2; i++) {
        assert.ok(i < 1000, 'the contender never queued');
        await new Promise((r) => setTimeout(r, 10));
      }
      const sent = process.hrtime.bigint();
      child.kill(sig);
      const { token, at } = await acquiring;
      const ms = Number(at - sent) / 1e6;
      console.log(`EXIT|node-${sig}${handler ? '-handler' : ''}|${ms.toFixed(1)}`);
      const [code, signal] = await exited;
      assert.ok(token > token0);
      if (handler) {
        assert.equal(code, 4, out.join('\n'));
        assert.ok(out.includes(`handled ${sig}`), out.join('\n'));
      } else {
        assert.equal(signal, sig, `exit code ${code}, signal ${signal}: killed by ${sig} expected`);
      }
      assert.ok(ms < KEEPALIVE_TIMEOUT_MS + SLACK_MS, `the contender acquired ${ms} ms after ${sig}`);
      await lock.close();
    });
  }
}
