// A lock never keeps the process alive by itself: a script that acquires
// and releases, or that still holds, ends on its own; process.exit while
// holding is quick too. (That the held lock is released on the way out is
// shown against etcd, from another process: test/etcd.test.js.)
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const hold = path.join(__dirname, 'fixtures', 'hold.js');

for (const mode of ['release', 'hold', 'exit']) {
  test(`a script that acquires and ${mode === 'release' ? 'releases' : mode === 'hold' ? 'still holds at its end' : 'calls process.exit while holding'} exits by itself`, () => {
    const started = performance.now();
    const r = spawnSync(process.execPath, [hold, `node-test/exit/${process.pid}/${mode}`, mode], {
      encoding: 'utf8',
      timeout: 10_000,
      env: { ...process.env, DLOCK_ENDPOINTS: '' },
    });
    const took = performance.now() - started;
    assert.equal(r.error, undefined, `the child did not exit within 10 s: ${r.error}`);
    assert.equal(r.status, 0, r.stderr);
    assert.match(r.stdout, /^held \d+$/m);
    // The TTL is 15 s and the keepalive interval 5 s: exiting well before
    // either shows no timer or callback of the lock held the loop.
    assert.ok(took < 4000, `took ${took} ms`);
  });
}
