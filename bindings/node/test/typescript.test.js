// TypeScript: the package's typings type-check a strict example
// (examples/node/typed.ts) and this suite's `using` test with
// `tsc --noEmit --strict`; the `using` test is compiled by tsc and run, on
// Node 20, calling Symbol.dispose through TypeScript's helper. The
// JavaScript examples run too.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { execFileSync, spawnSync } = require('node:child_process');
const path = require('node:path');

const pkg = path.join(__dirname, '..');
const root = path.join(pkg, '..', '..');
const tsc = path.join(pkg, 'node_modules', 'typescript', 'bin', 'tsc');

function run(args, opts = {}) {
  const r = spawnSync(process.execPath, args, { encoding: 'utf8', timeout: 60_000, ...opts });
  assert.equal(r.error, undefined, String(r.error));
  assert.equal(r.status, 0, `${args.join(' ')}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

test('tsc --noEmit --strict: examples/node/typed.ts, test/ts/using.ts, election.ts and rwlock.ts', () => {
  run([tsc, '--noEmit', '--strict', '-p', path.join(root, 'examples', 'node')]);
  run([tsc, '--noEmit', '--strict', '-p', path.join(__dirname, 'ts')]);
});

test('a type error in user code is caught by the typings', () => {
  const r = spawnSync(
    process.execPath,
    [tsc, '--noEmit', '--strict', '--types', 'node', '--lib', 'ES2022,ESNext.Disposable', path.join(__dirname, 'ts', 'bad.ts')],
    { encoding: 'utf8' },
  );
  assert.notEqual(r.status, 0, 'tsc accepted a bad call');
  assert.match(r.stdout, /bad\.ts\(\d+,\d+\): error TS2322/);
});

test('the tsc-compiled `using` form ends permits on Node 20', () => {
  run([tsc, '-p', path.join(__dirname, 'ts')]);
  assert.match(run([path.join(__dirname, 'ts', 'using.js')], { env: { ...process.env, DLOCK_ENDPOINTS: '' } }), /using: ok/);
});

test('the tsc-compiled election and observer program runs', () => {
  run([tsc, '-p', path.join(__dirname, 'ts')]);
  assert.match(run([path.join(__dirname, 'ts', 'election.js')], { env: { ...process.env, DLOCK_ENDPOINTS: '' } }), /election: ok/);
});

test('examples/node: the worker and withLock cancelled by the fence', () => {
  const env = { ...process.env, DLOCK_ENDPOINTS: '' };
  assert.match(run([path.join(root, 'examples', 'node', 'worker.js'), '5'], { env }), /5 units done under token \d+/);
  const out = run([path.join(root, 'examples', 'node', 'with-lock.js')], { env });
  assert.match(out, /request cancelled at the fence/);
  assert.match(out, /the other holder acquired token 2/);
});
