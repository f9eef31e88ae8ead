// Type-checked by test/typescript.test.js (tsc --noEmit --strict), then
// compiled and run: the election and observer typings as a program uses
// them.
import * as assert from 'node:assert/strict';
import { Client, Election, FencedError, type Leader, type ObservedKind, type Observer } from '../..';

async function main(): Promise<void> {
  const client = new Client();
  const name = `node-test/ts-election/${process.pid}`;
  const observer: Observer = client.observe(name);
  const kinds: ObservedKind[] = [];
  observer.on('change', (leader: Leader | undefined, kind: ObservedKind) => {
    kinds.push(kind);
  });
  const election: Election = client.election(name);
  election.on('fence', (token: bigint) => assert.ok(token > 0n));
  const ac = new AbortController();
  const token: bigint = await election.campaign('ts', { timeout: 5000, signal: ac.signal });
  await election.proclaim(Buffer.from('ts-2'));
  const leader: Leader | undefined = await election.leader();
  assert.equal(leader?.token, token);
  assert.equal(String(leader?.value), 'ts-2');
  for await (const l of observer) {
    if (l !== undefined && String(l.value) === 'ts-2') break;
  }
  await election.resign({ grace: 100 });
  assert.ok(kinds.includes('leader'), kinds.join());
  const e: unknown = new FencedError('fenced', 'x');
  assert.ok(e instanceof Error);
  await election.close();
  console.log('election: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
