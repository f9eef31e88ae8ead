// Must NOT type-check (test/typescript.test.js): a token is a bigint.
import { Client } from '../..';

async function wrong(): Promise<void> {
  const token: string = await new Client().lock('x').acquire();
  console.log(token);
}
wrong();
