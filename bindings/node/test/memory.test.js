// 10,000 permits and 1,000 locks created and dropped, round after round,
// with flat memory. The RSS settles after about eight rounds (malloc's
// arenas of the core's threads warm up: measured 51 -> 58 MB, then within
// about 1 MB over twelve more); from round 8 to 16 it must grow by less
// than 2 MB, where a leak of 500 bytes per lock (far less than a lock's
// state: gate, session entry, callbacks) would add 4 MB. The JavaScript heap (Maps of locks, slots)
// must stay within 0.5 MB from round 2 on.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { spawnSync } = require('node:child_process');
const path = require('node:path');

test('10,000 permits and 1,000 locks per round, with flat memory', () => {
  const r = spawnSync(process.execPath, ['--expose-gc', path.join(__dirname, 'fixtures', 'churn.js'), '16'], {
    encoding: 'utf8',
    timeout: 120_000,
    env: { ...process.env, DLOCK_ENDPOINTS: '' },
  });
  assert.equal(r.status, 0, r.stderr);
  const { rss, heap } = JSON.parse(r.stdout);
  const mb = (b) => (b / 1048576).toFixed(2);
  const growth = rss[rss.length - 1] - rss[7];
  assert.ok(growth < 2 * 1048576, `RSS grew ${mb(growth)} MB over eight rounds: ${rss.map(mb).join(', ')} MB`);
  const heapGrowth = heap[heap.length - 1] - heap[1];
  assert.ok(heapGrowth < 0.5 * 1048576, `JS heap grew ${mb(heapGrowth)} MB: ${heap.map(mb).join(', ')} MB`);
});
