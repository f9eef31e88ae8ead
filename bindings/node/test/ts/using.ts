// Compiled by test/typescript.test.js with tsc (ES2022: `using` becomes
// TypeScript's helper calling Symbol.dispose) and run on Node 20: the
// permit is ended when its block is left, by return or by throw.
import * as assert from 'node:assert/strict';
import { Client, NotHeldError, type Permit } from '../..';

async function main(): Promise<void> {
  const client = new Client();
  const lock = client.lock(`node-test/using/${process.pid}`);
  assert.throws(() => lock.permit(), NotHeldError);
  const token: bigint = await lock.acquire({ timeout: 5000 });
  let kept: Permit | undefined;
  {
    using p = lock.permit();
    kept = p;
    assert.equal(p.token, token);
    assert.equal(lock.inFlight, 1);
  }
  assert.equal(lock.inFlight, 0, 'ended at the end of the block');
  assert.equal(kept.valid(), false);
  try {
    using q = lock.permit();
    assert.equal(q.valid(), true);
    throw new Error('unit failed');
  } catch (e) {
    assert.equal((e as Error).message, 'unit failed');
  }
  assert.equal(lock.inFlight, 0, 'ended when the block threw');
  await lock.close();
  console.log('using: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
