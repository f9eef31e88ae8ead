// Every file of scenarios/ through the public JavaScript API, with the
// same traces as Rust: the shared runner (scenarios/runner) plays them,
// built into the test addon (`node build.mjs --features scenarios --out
// test/scenarios.node --addon-only`), which DLOCK_NODE_ADDON names.
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

process.env.DLOCK_NODE_ADDON ??= path.join(__dirname, 'scenarios.node');
const dlock = require('..');
const { Face } = require('./scenario-face');

test('every scenarios/ file gives the trace it expects', { timeout: 600_000 }, async () => {
  assert.ok(dlock._native.hasScenarioRunner(), 'the test addon is built with the scenarios feature');
  const face = new Face();
  const dir = path.join(__dirname, '..', '..', '..', 'scenarios');
  const summary = await dlock._native.playScenarios(dir, ([what, json]) => face.ask(what, json));
  assert.ok(summary.played >= 22 || process.env.DLOCK_SCENARIO, `played ${summary.played}`);
  assert.equal(summary.skipped, 0, "the Node face plays every file");
  assert.equal(summary.failed, 0, summary.failures.join('\n'));
});
