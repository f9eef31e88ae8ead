// Uncontended acquire + release per second against the test etcd, beside
// two floors (one put with a lease + one delete through the `etcd3` npm
// package's connection; and one guarded put + one guarded delete, two
// transactions, through dlock's own connection: the same Rust client and
// the same promise path as acquire + release) and the `etcd3` package's
// own lock (lease grant, put, delete, lease revoke: it takes a lease per
// lock), all in the same run. Rounds
// alternate the three (the order turns each round); per-round ops/s, and
// their medians, are printed.
//
//   DLOCK_TEST_MEMBERS=... ETCD3_DIR=<folder with node_modules/etcd3> node bench/etcd.js [ROUNDS] [OPS]
'use strict';

const path = require('node:path');
const dlock = require('..');

const { Etcd3 } = require(path.join(process.env.ETCD3_DIR, 'node_modules', 'etcd3'));
const members = process.env.DLOCK_TEST_MEMBERS.split(',');
const rounds = Number(process.argv[2] ?? 7);
const ops = Number(process.argv[3] ?? 200);

const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];

async function main() {
  const client = new dlock.Client({ endpoints: members });
  const lock = client.lock(`bench/node/dlock/${process.pid}`);
  const etcd = new Etcd3({ hosts: members });
  const lease = etcd.lease(15);
  await lease.grant();
  const floorKey = `bench/node/floor/${process.pid}`;
  const etcd3Name = `bench/node/etcd3/${process.pid}`;
  const writer = client.lock(`bench/node/writer/${process.pid}`);
  const writerToken = await writer.acquire({ timeout: 5000 });
  const txnKey = `bench/node/txn/${process.pid}`;

  const cases = {
    dlock: async () => {
      await lock.acquire({ timeout: 5000 });
      await lock.release();
    },
    floor: async () => {
      await lease.put(floorKey).value('x');
      await etcd.delete().key(floorKey);
    },
    'txn floor': async () => {
      await writer.guardedPut(writerToken, txnKey, 'x');
      await writer.guardedDelete(writerToken, txnKey);
    },
    etcd3: async () => {
      const l = await etcd.lock(etcd3Name).ttl(15).acquire();
      await l.release();
    },
  };
  const names = Object.keys(cases);
  for (const f of Object.values(cases)) for (let i = 0; i < 20; i++) await f(); // warm up
  const perRound = Object.fromEntries(names.map((n) => [n, []]));
  for (let r = 0; r < rounds; r++) {
    const order = names.map((_, i) => names[(i + r) % names.length]);
    for (const n of order) {
      const t0 = performance.now();
      for (let i = 0; i < ops; i++) await cases[n]();
      perRound[n].push((ops * 1000) / (performance.now() - t0));
    }
  }
  console.log(`etcd bench: ${rounds} rounds of ${ops} uncontended acquire+release each, members ${members.join(',')}`);
  for (const n of names) {
    console.log(`  ${n.padEnd(9)} median ${median(perRound[n]).toFixed(0).padStart(6)} ops/s  rounds: ${perRound[n].map((x) => x.toFixed(0)).join(' ')}`);
  }
  const ratio = median(perRound.dlock) / median(perRound.floor);
  const txn = median(perRound.dlock) / median(perRound['txn floor']);
  const vs = median(perRound.dlock) / median(perRound.etcd3);
  console.log(
    `  dlock / floor ${ratio.toFixed(3)} (target >= 0.9); dlock / txn floor ${txn.toFixed(3)}; dlock / etcd3 lock ${vs.toFixed(2)}`,
  );
  await lock.close();
  await writer.close();
  await lease.revoke();
  etcd.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
