// README.md's Node example as written (issue 32, item 9): the first ```ts
// block under `## Node`, compiled by TypeScript's transpiler (its `using`
// through TypeScript's helper on Node 20) and run on the embedded backend
// with the smallest harness (`signal`, `stopEverything`, `doOneUnit`,
// `commit`, `url`, `fetch`; a Client of a service of its own with short
// timings). The block takes one permit, not a loop; each test checks what
// its comments say: the unit runs under the acquisition's token (a
// bigint) and the permit ends at the block's end; a refused permit
// (draining) throws a typed error with its `code` and no unit runs; the
// withLock task's signal aborts at the fence, while the service still
// has the lock held (before another holder can get in).
'use strict';

const { test, after } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const dlock = require('..');

const pkg = path.join(__dirname, '..');
// README.md: the repository's, found upwards (the installed-package run
// copies test/ under target/node-installed/, inside the repository).
const readmePath = (() => {
  for (let dir = pkg; ; dir = path.dirname(dir)) {
    const p = path.join(dir, 'README.md');
    if (fs.existsSync(p) && fs.readFileSync(p, 'utf8').includes('\n## Node\n')) return p;
    assert.notEqual(path.dirname(dir), dir, `no README.md with a "## Node" heading above ${pkg}`);
  }
})();
const ts = require(path.join(pkg, 'node_modules', 'typescript'));

const FAST = { ttl: 2000, keepaliveInterval: 500, keepaliveTimeout: 200, retryInterval: 200, margin: 500 };

// The locks' events never keep the process alive; this does while a test
// awaits one.
const keepAlive = setInterval(() => {}, 60_000);
after(() => clearInterval(keepAlive));

/** The first ```LANG block under README.md's `## FACE` heading; throws when it moved. */
function readmeBlock(face, lang) {
  const text = fs.readFileSync(readmePath, 'utf8');
  const parts = text.split(`\n## ${face}\n`);
  assert.ok(parts.length > 1, `README.md has no "## ${face}" heading: update ${__filename}`);
  const section = parts[1].split('\n## ')[0];
  const start = section.indexOf('```' + lang + '\n');
  assert.ok(start >= 0, `README.md's "## ${face}" has no \`\`\`${lang} block: update ${__filename}`);
  const body = section.slice(start + lang.length + 4);
  const end = body.indexOf('```');
  assert.ok(end >= 0, `README.md's "## ${face}" block is not closed`);
  return body.slice(0, end);
}

const AsyncFunction = (async () => {}).constructor;

/** The README block compiled once: an async function of the harness. */
const readme = (() => {
  const code = readmeBlock('Node', 'ts');
  assert.match(code, /from '\.\/bindings\/node'/, 'the README block imports ./bindings/node: update this test');
  const out = ts.transpileModule(code, {
    compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.CommonJS, strict: true },
    reportDiagnostics: true,
  });
  assert.deepEqual(out.diagnostics.map((d) => ts.flattenDiagnosticMessageText(d.messageText, '\n')), []);
  return new AsyncFunction('require', 'exports', 'signal', 'stopEverything', 'doOneUnit', 'commit', 'url', 'fetch', out.outputText);
})();

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

/**
 * Runs the block. `afterAcquire(lock, client)` runs once the first lock
 * is acquired (before the block takes its permit); `fetch` is the task's.
 */
async function runReadme({ afterAcquire = async () => {}, fetch }) {
  const service = new dlock.Service();
  const seen = { units: [], commits: 0, fences: 0, clients: [], locks: [], tokens: [] };
  class Client extends dlock.Client {
    constructor(options = {}) {
      super({ service, ...FAST, ...options });
      seen.clients.push(this);
    }
    lock(name) {
      const lock = super.lock(name);
      seen.locks.push(lock);
      const acquire = lock.acquire.bind(lock);
      lock.acquire = async (options) => {
        const token = await acquire(options);
        seen.tokens.push(token);
        if (seen.tokens.length === 1) await afterAcquire(lock, this);
        return token;
      };
      return lock;
    }
  }
  const mod = { ...dlock, Client };
  const requireHere = (id) => {
    assert.equal(id, './bindings/node');
    return mod;
  };
  const h = {
    signal: new AbortController().signal,
    stopEverything: () => {
      seen.fences++;
    },
    doOneUnit: async (token) => {
      seen.units.push({ token, inFlight: seen.locks[0].inFlight });
    },
    commit: () => {
      seen.commits++;
    },
    url: 'http://example.invalid/report',
    fetch: (u, init) => fetch(u, init, seen, service),
  };
  let error = null;
  try {
    await readme(requireHere, {}, h.signal, h.stopEverything, h.doOneUnit, h.commit, h.url, h.fetch);
  } catch (e) {
    error = e;
  }
  for (const c of seen.clients) c.link?.heal();
  for (const l of seen.locks) await l.close().catch(() => {});
  return { seen, error, service };
}

test('README Node block: the unit runs under the acquisition token, the permit ends at the block end, the task signal aborts at the fence before another holder can get in', async () => {
  let atFetch = null;
  const { seen, error } = await runReadme({
    fetch: (u, { signal }, seen, service) => {
      const report = seen.locks[1];
      atFetch = { ordersInFlight: seen.locks[0].inFlight, reportToken: report.token };
      seen.clients[0].link.partition(); // keepalives fail: drain, then the fence
      return new Promise((resolve, reject) => {
        signal.addEventListener('abort', () => {
          atFetch.holderAtAbort = service.holder('report');
          reject(signal.reason);
        });
      });
    },
  });
  // `await lock.acquire(...)`: the token, a bigint; the unit carries it.
  assert.equal(typeof seen.tokens[0], 'bigint');
  assert.equal(seen.units.length, 1);
  assert.equal(seen.units[0].token, seen.tokens[0]);
  assert.equal(seen.units[0].inFlight, 1); // counted while the unit runs
  assert.equal(seen.commits, 1); // valid: commits
  assert.ok(atFetch, 'the withLock task did not run');
  assert.equal(atFetch.ordersInFlight, 0, 'the permit did not end at the end of its block');
  // The task's signal aborted at the fence, the lock still the holder's on
  // the service: before another holder could get in.
  assert.equal(typeof atFetch.reportToken, 'bigint');
  assert.equal(atFetch.holderAtAbort, atFetch.reportToken, 'the signal aborted only after the lock was free');
  assert.ok(error instanceof dlock.FencedError && error.code === 'fenced', `withLock: ${error}`);
  assert.equal(seen.fences, 1, 'the fence listener did not run once');
});

test('README Node block: a refused permit (draining) throws with its code and no unit runs', async () => {
  let fetched = false;
  const { seen, error } = await runReadme({
    afterAcquire: async (lock, client) => {
      const draining = stateInto(lock, 'Draining');
      client.link.partition();
      await draining;
    },
    fetch: () => {
      fetched = true;
      return Promise.resolve();
    },
  });
  assert.ok(error instanceof dlock.DrainingError && error.code === 'draining', `permit(): ${error}`);
  assert.equal(seen.units.length, 0, 'a unit ran on a refused permit');
  assert.equal(seen.commits, 0);
  assert.equal(fetched, false, 'the code after the refusal ran: it did not stop');
});
