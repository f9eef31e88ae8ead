// The Node player of scenarios/vectors/bad_input.json: every case gets the
// vector's code (the error's `.code`), decided by the core; the face only
// converts. Cases Node cannot express are skipped by the file itself
// ("skip": {"node": why}); every word of a case's `message_has` is in the
// error's message. Also: the constants Node exports are the
// vector's (read from the native module, the core's).
'use strict';

const { test } = require('node:test');
const assert = require('node:assert/strict');
const { readFileSync } = require('node:fs');
const { join } = require('node:path');
const dlock = require('..');
const dlockProm = require('../prometheus');

const vector = JSON.parse(
  readFileSync(join(__dirname, '..', '..', '..', 'scenarios', 'vectors', 'bad_input.json'), 'utf8'),
);

/** snake_case setting → the face's camelCase option key. */
const key = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** The vector's seconds (a number, "NaN" or "Infinity") in ms. */
const millis = (seconds) => Number(seconds) * 1000;

/** The code the face answers one case with ('ok' if nothing was refused). */
async function play(c) {
  const clients = [];
  const client = (options) => {
    const made = new dlock.Client(options);
    clients.push(made);
    return made;
  };
  try {
    switch (c.input) {
      case 'setting':
        client({ service: new dlock.Service(), [key(c.setting)]: millis(c.seconds) });
        break;
      case 'acquire_timeout': {
        const lock = client({ service: new dlock.Service() }).lock('bad-input/timeout');
        await lock.acquire({ timeout: millis(c.seconds) });
        break;
      }
      case 'without_endpoints':
        client({ [key(c.setting)]: c.value });
        break;
      case 'unknown_option':
        client({ service: new dlock.Service(), [c.setting]: 1 });
        break;
      case 'description':
        client({ service: new dlock.Service(), description: c.value ?? 'x'.repeat(c.value_len) });
        break;
      case 'lock_name':
        client({ service: new dlock.Service() }).lock(c.name ?? 'a'.repeat(c.name_len));
        break;
      case 'semaphore_limit': {
        const one = client({ service: new dlock.Service() });
        if (c.first_limit !== undefined) one.semaphore(c.name, c.first_limit);
        one.semaphore(c.name, c.limit);
        break;
      }
      default:
        throw new Error(`Node cannot play input ${c.input}, yet the vector does not skip it`);
    }
    return { code: 'ok' };
  } catch (e) {
    if (!(e instanceof dlock.DlockError)) throw e;
    return { code: e.code, message: e.message };
  } finally {
    for (const made of clients) made.shutdown();
  }
}

for (const c of vector.cases) {
  const why = c.skip?.node;
  test(`bad input ${c.id}: ${c.code}`, { skip: why }, async () => {
    const got = await play(c);
    assert.equal(got.code, c.code, `${c.id}: ${got.message ?? 'accepted'}`);
    for (const word of c.message_has ?? []) assert.ok(got.message.includes(word), `${c.id}: ${word} not in ${got.message}`);
  });
}

test('the constants are the core\'s, as the vector says', () => {
  const k = vector.constants;
  assert.equal(dlock.MAX_NAME_LEN, k.MAX_NAME_LEN);
  assert.equal(dlock.MAX_KEY_LEN, k.MAX_KEY_LEN);
  assert.equal(dlock.DEFAULT_MAX_OVERDUE_MS, k.DEFAULT_MAX_OVERDUE_MS);
  assert.equal(dlock.RESIGN_GRACE_MS, k.RESIGN_GRACE_MS);
  assert.equal(dlock.MAX_SEMAPHORE_LIMIT, k.MAX_SEMAPHORE_LIMIT);
  assert.equal(dlockProm.DEFAULT_LOCK_SERIES, k.DEFAULT_LOCK_SERIES);
});

// Every native call converts its error at the one point (index.ts `call`):
// stallDriver(NaN) threw a raw Error (`invalid_argument<US>...`), neither a
// DlockError nor a TypeError (found by props.test.js).
test('a bad duration to stallDriver is the core\'s invalid_argument, converted', () => {
  for (const bad of [Number.NaN, -1, Number.POSITIVE_INFINITY]) {
    assert.throws(() => dlock.stallDriver(bad), (e) => e instanceof dlock.DlockError && e.code === 'invalid_argument');
  }
});
