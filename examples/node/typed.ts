// The API in TypeScript: `using` ends a permit at the end of its block
// (TypeScript >= 5.2, Symbol.dispose: Node 20). Type-checked by the test
// suite with `tsc --noEmit --strict`; compile and run it with
//   npx --prefix bindings/node tsc -p examples/node && node examples/node/typed.js
import { Client, DlockError, FencedError, type Lock, type StateChange } from '../../bindings/node';

async function unitOfWork(lock: Lock): Promise<bigint> {
  using permit = lock.permit(); // ended however the block is left
  if (!permit.valid()) throw new FencedError('fenced', 'deadline passed');
  return permit.token;
}

async function main(): Promise<void> {
  const client = new Client({ ttl: 15_000 });
  const lock = client.lock('examples/node/typed');
  lock.on('fence', (token: bigint, inFlight: number) => console.log(`lost ${token} (${inFlight} in flight)`));
  lock.on('stateChange', (c: StateChange) => console.log(`${c.from} -> ${c.to} ${c.reason}`));
  const token: bigint = await lock.acquire({ timeout: 5000, signal: AbortSignal.timeout(10_000) });
  const used = await unitOfWork(lock);
  console.log(`unit done with token ${used} (acquired ${token}); in flight now ${lock.inFlight}`);
  await lock.release();
  try {
    lock.permit();
  } catch (e) {
    if (e instanceof DlockError) console.log(`after release: ${e.code}`);
  }
  const n: number = await client.withLock('examples/node/typed-2', { timeout: 1000 }, async ({ token, signal }) => {
    signal.throwIfAborted();
    return Number(token);
  });
  console.log(`withLock returned ${n}`);
  await lock.close();
}

main();
