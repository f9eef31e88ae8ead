// Type-checked by test/typescript.test.js (tsc --noEmit --strict): the
// read/write lock typings as a program uses them.
import { Client, FenceGate, type Lock, type RwLock } from '../..';

export async function readThenWrite(client: Client, gate: FenceGate): Promise<void> {
  const rw: RwLock = client.session().rwlock('config');
  const w: Lock = rw.writer();
  const mode: 'read' | 'write' | null = w.mode;
  const token: bigint = await w.acquire({ timeout: 5000 });
  gate.admitWrite(rw.name, token);
  await w.downgrade();
  gate.admitRead(rw.name, token);
  const [high, read]: [bigint | null, bigint | null] = gate.watermarks(rw.name);
  void [mode, high, read];
  await w.release();
}
