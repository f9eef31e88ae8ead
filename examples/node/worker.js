// A worker doing units of work under permits: every unit starts with
// lock.permit(), writes with the permit's token, and checks permit.valid()
// before it commits. Runs on the embedded backend, or on etcd when
// DLOCK_ENDPOINTS is set.
//
//   node examples/node/worker.js [UNITS]
'use strict';

const dlock = require('../../bindings/node');

const units = Number(process.argv[2] ?? 20);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  const client = new dlock.Client();
  const lock = client.lock('examples/node/worker');
  lock.on('fence', (token, inFlight) => console.log(`lost token ${token}; ${inFlight} unit(s) in flight`));
  lock.on('stateChange', (c) => console.log(`state ${c.from} -> ${c.to} (${c.reason})`));
  const token = await lock.acquire({ timeout: 10_000 });
  console.log(`acquired token ${token}`);

  let done = 0;
  while (done < units) {
    let permit;
    try {
      permit = lock.permit();
    } catch (e) {
      if (!(e instanceof dlock.DrainingError)) throw e; // fenced, released: stop
      await sleep(100); // a keepalive failed: wait for it to be confirmed
      continue;
    }
    try {
      await sleep(10); // one unit of work; every write carries permit.token
      if (permit.valid()) done++; // commit only while the token still holds
    } finally {
      permit.end();
    }
  }
  console.log(`${done} units done under token ${token}`);
  await lock.release();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
