// 10,000 permits and 1,000 locks created and dropped, round after round,
// with flat memory: after the first rounds (allocator and JIT warm-up) the
// RSS grows by less than 2 MB over five more rounds. A leak of one lock's
// state (its gate, session entry, callbacks: about a kilobyte) per lock
// would grow it by about 5 MB.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

test('10,000 permits and 1,000 locks per round, with flat memory', () => {
  const r = spawnSync(process.execPath, ['--expose-gc', path.join(__dirname, 'fixtures', 'churn.js'), '8'], {
    encoding: 'utf8',
    timeout: 120_000,
    env: { ...process.env, DLOCK_ENDPOINTS: '' },
  });
  assert.equal(r.status, 0, r.stderr);
  const { rss } = JSON.parse(r.stdout);
  const growth = rss[rss.length - 1] - rss[2];
  const mb = (b) => (b / 1048576).toFixed(1);
  assert.ok(growth < 2 * 1048576, `RSS grew ${mb(growth)} MB over five rounds: ${rss.map(mb).join(', ')} MB`);
});
