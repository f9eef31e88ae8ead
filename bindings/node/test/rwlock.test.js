// Read/write locks in the Node face (issue 30, docs/design.md §27): the
// face converts, the core decides. On the embedded engine: readers on two
// clients hold together, a writer excludes both ways, a downgrade keeps
// the token and lets a queued reader in, an upgrade and a plain lock's
// downgrade are InvalidArgumentError, the gate's two watermarks, and
// README.md's Node block under `## Read/write locks` as written. On the
// etcd test cluster (DLOCK_TEST_ETCD): the keys' values a writer, a
// downgrade and readers leave. Readers that share run on clients (or
// sessions) of their own: two holders on one session exclude each other
// whatever their modes.
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');
const dlock = require('..');

const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

/** `n` clients on one embedded service. */
function clients(n) {
  const service = new dlock.Service();
  return { service, all: Array.from({ length: n }, () => new dlock.Client({ service })) };
}

test('reader() and writer() are Locks with a mode; a plain lock has none', () => {
  const { all: [c] } = clients(1);
  const rw = c.rwlock('cfg');
  assert.ok(rw instanceof dlock.RwLock);
  assert.equal(rw.name, 'cfg');
  const r = rw.reader();
  const w = rw.writer();
  assert.ok(r instanceof dlock.Lock && w instanceof dlock.Lock);
  assert.deepEqual([r.mode, w.mode, r.name, w.name], ['read', 'write', 'cfg', 'cfg']);
  assert.equal(c.lock('cfg').mode, null);
  assert.equal(c.session().rwlock('cfg').reader().mode, 'read');
  assert.throws(() => c.rwlock(3), TypeError);
});

test('readers on two clients share; a writer waits for both', async () => {
  const { all: [a, b, c] } = clients(3);
  const r1 = a.rwlock('cfg').reader();
  const r2 = b.rwlock('cfg').reader();
  const t1 = await r1.acquire({ timeout: 5000 });
  const t2 = await r2.acquire({ timeout: 5000 });
  assert.ok(t2 > t1);
  assert.deepEqual([r1.state, r2.state], ['Holding', 'Holding']);
  const w = c.rwlock('cfg').writer();
  await assert.rejects(w.tryAcquire(), dlock.WouldBlockError);
  await assert.rejects(w.acquire({ timeout: 200 }), dlock.TimeoutError);
  await r1.release();
  await r2.release();
  assert.ok((await w.acquire({ timeout: 5000 })) > t2);
  await w.release();
});

test('a writer excludes readers, writers and plain locks', async () => {
  const { all: [a, b, c] } = clients(3);
  const w = a.rwlock('cfg').writer();
  const token = await w.acquire({ timeout: 5000 });
  const r = b.rwlock('cfg').reader();
  await assert.rejects(r.tryAcquire(), dlock.WouldBlockError);
  await assert.rejects(c.rwlock('cfg').writer().tryAcquire(), dlock.WouldBlockError);
  await assert.rejects(c.lock('cfg').tryAcquire(), dlock.WouldBlockError);
  await w.release();
  assert.ok((await r.tryAcquire()) > token);
  await r.release();
});

test('downgrade keeps the token and lets a queued reader in', async () => {
  const { all: [a, b] } = clients(2);
  const w = a.rwlock('cfg').writer();
  const token = await w.acquire({ timeout: 5000 });
  const r = b.rwlock('cfg').reader();
  let readerToken = null;
  const waiting = r.acquire({ timeout: 10_000 }).then((t) => (readerToken = t));
  await new Promise((res) => setTimeout(res, 200));
  assert.equal(readerToken, null, 'the reader waits behind the writer');
  await w.downgrade();
  await waiting;
  assert.ok(readerToken > token);
  assert.deepEqual([w.mode, w.token, w.state], ['read', token, 'Holding']);
  const p = w.permit();
  assert.equal(p.token, token);
  p.end();
  await w.downgrade(); // a reader's downgrade does nothing
  assert.equal(w.token, token);
  await r.release();
  await w.release();
});

test('upgrade and a plain lock downgrade are InvalidArgumentError; an unheld writer NotHeldError', async () => {
  const { all: [c] } = clients(1);
  const r = c.rwlock('cfg').reader();
  await r.acquire({ timeout: 5000 });
  assert.throws(() => r.upgrade(), (e) => e instanceof dlock.InvalidArgumentError && e.code === 'invalid_argument' && /release the reader/.test(e.message));
  assert.equal(r.mode, 'read');
  await r.release();
  const plain = c.lock('plain');
  await plain.acquire({ timeout: 5000 });
  await assert.rejects(plain.downgrade(), dlock.InvalidArgumentError);
  assert.throws(() => plain.upgrade(), dlock.InvalidArgumentError);
  await plain.release();
  await assert.rejects(c.rwlock('cfg').writer().downgrade(), dlock.NotHeldError);
});

test('FenceGate keeps two watermarks', () => {
  const gate = new dlock.FenceGate();
  assert.deepEqual(gate.watermarks('cfg'), [null, null]);
  gate.admitRead('cfg', 5n);
  gate.admitRead('cfg', 3); // readers never refuse each other
  assert.deepEqual(gate.watermarks('cfg'), [null, 5n]);
  assert.throws(() => gate.admitWrite('cfg', 4n), (e) => e instanceof dlock.StaleError && e.code === 'stale' && e.highest === 5n);
  gate.admitWrite('cfg', 7n);
  assert.deepEqual(gate.watermarks('cfg'), [7n, 5n]);
  assert.throws(() => gate.admitRead('cfg', 6n), dlock.StaleError); // older than the write admitted
  gate.admitRead('cfg', 8n);
  assert.deepEqual(gate.watermarks('cfg'), [7n, 8n]);
  assert.equal(gate.highest('cfg'), 8n);
  assert.throws(() => gate.admit('cfg', 7n), dlock.StaleError); // admit is a write
  assert.throws(() => gate.admitRead('cfg', -1n), RangeError);
  assert.throws(() => gate.admitWrite(1, 1n), TypeError);
});

// ------------------------------------------------------------------ README

test("README.md's Node block under `## Read/write locks` runs as written", async () => {
  let readme;
  for (let dir = path.join(__dirname, '..'); ; dir = path.dirname(dir)) {
    readme = path.join(dir, 'README.md');
    if (fs.existsSync(readme) && fs.readFileSync(readme, 'utf8').includes('\n## Read/write locks\n')) break;
    assert.notEqual(path.dirname(dir), dir, 'no README.md with a "## Read/write locks" heading');
  }
  const ts = require(path.join(__dirname, '..', 'node_modules', 'typescript'));
  const section = fs.readFileSync(readme, 'utf8').split('\n## Read/write locks\n')[1].split('\n## ')[0];
  const start = section.indexOf('```ts\n');
  assert.ok(start >= 0, "README.md's Read/write locks section has no ```ts block: update this test");
  const body = section.slice(start + 6);
  const code = body.slice(0, body.indexOf('```'));
  const out = ts.transpileModule(code, {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, strict: true },
  });
  const AsyncFunction = (async () => {}).constructor;
  const run = new AsyncFunction('client', 'gate', 'writeConfig', 'readConfig', out.outputText);
  const { service, all: [client] } = clients(1);
  const gate = new dlock.FenceGate();
  const seen = [];
  const writeConfig = async (token) => {
    assert.equal(service.holder('config'), token);
    seen.push(['write', token]);
  };
  const readConfig = async (token) => seen.push(['read', token]);
  await run(client, gate, writeConfig, readConfig);
  assert.deepEqual(seen.map(([m]) => m), ['write', 'read', 'read']);
  assert.ok(seen[0][1] === seen[1][1] && seen[1][1] < seen[2][1], String(seen));
  assert.deepEqual(gate.watermarks('config'), [seen[0][1], seen[2][1]]);
  assert.equal(service.holder('config'), null, 'the block left a holder');
});

// -------------------------------------------------------------------- etcd

const members = process.env.DLOCK_TEST_MEMBERS;
const skip = process.env.DLOCK_TEST_ETCD ? false : 'no etcd test cluster (DLOCK_TEST_ETCD unset)';

test('etcd: a downgrade puts the read marker in the writer key; readers share', { skip }, async () => {
  const client = new dlock.Client({ endpoints: members, ttl: 3000, keepaliveInterval: 1000, keepaliveTimeout: 500, retryInterval: 250, margin: 1000 });
  const name = `node-test/rw/${process.pid}/${Date.now()}`;
  /** The values of `name`'s lock keys, oldest first. */
  const values = () =>
    execFileSync('etcdctl', [`--endpoints=${members}`, 'get', '--prefix', '--print-value-only', `${name}/`], {
      encoding: 'utf8',
      env: { ...process.env, ETCDCTL_API: '3' },
      timeout: 10_000,
    })
      .split('\n')
      .filter((line, i, all) => i < all.length - 1 || line !== '');
  const w = client.session().rwlock(name).writer();
  const token = await w.acquire({ timeout: 10_000 });
  await assert.rejects(client.session().rwlock(name).reader().tryAcquire(), dlock.WouldBlockError);
  assert.deepEqual(values(), ['']); // a writer's key is empty, as etcdctl lock puts
  await w.downgrade();
  assert.deepEqual(values(), ['dlock:read']);
  assert.deepEqual([w.mode, w.token], ['read', token]);
  const other = client.session().rwlock(name).reader();
  assert.ok((await other.acquire({ timeout: 10_000 })) > token);
  assert.deepEqual(values(), ['dlock:read', 'dlock:read']);
  await assert.rejects(client.session().rwlock(name).writer().tryAcquire(), dlock.WouldBlockError);
  await other.release();
  await w.release();
});
