// permit() + end() on a held lock (embedded backend), in nanoseconds per
// pair, beside two baselines measured in the same run: an empty native
// call (a getter of the addon) and process.hrtime.bigint(). Batches of
// BATCH pairs; the median, min and max over the batches are printed.
//
//   node bench/permit.js [BATCHES] [BATCH]
'use strict';

const dlock = require('..');

const batches = Number(process.argv[2] ?? 200);
const batch = Number(process.argv[3] ?? 20_000);

function measure(label, f) {
  const per = [];
  for (let b = 0; b < batches; b++) {
    const t0 = process.hrtime.bigint();
    f(batch);
    per.push(Number(process.hrtime.bigint() - t0) / batch);
  }
  per.sort((x, y) => x - y);
  return { label, median: per[per.length >> 1], min: per[0], max: per[per.length - 1] };
}

async function main() {
  const client = new dlock.Client();
  const lock = client.lock(`bench/permit/${process.pid}`);
  await lock.acquire({ timeout: 5000 });
  const n = lock._n;
  let sink = 0;
  const cases = {
    'permit() + end()': (k) => {
      for (let i = 0; i < k; i++) {
        const p = lock.permit();
        p.end();
      }
    },
    'using-style: permit(), token, valid(), end()': (k) => {
      for (let i = 0; i < k; i++) {
        const p = lock.permit();
        if (p.token > 0n && p.valid()) sink++;
        p.end();
      }
    },
    'baseline: an empty native call (a getter)': (k) => {
      for (let i = 0; i < k; i++) sink += n.inFlight;
    },
    'baseline: process.hrtime.bigint()': (k) => {
      for (let i = 0; i < k; i++) if (process.hrtime.bigint() === 0n) sink++;
    },
  };
  // Warm up (JIT), then measure the cases interleaved round by round.
  for (const f of Object.values(cases)) f(batch * 5);
  const results = Object.entries(cases).map(([label, f]) => measure(label, f));
  const base = results[2].median;
  console.log(`permit bench: ${batches} batches of ${batch}, node ${process.version}`);
  for (const r of results) {
    console.log(
      `  ${r.label.padEnd(48)} median ${r.median.toFixed(1).padStart(7)} ns  (min ${r.min.toFixed(1)}, max ${r.max.toFixed(1)})  ${(r.median / base).toFixed(2)}x the empty native call`,
    );
  }
  const target = results[0].median <= 250 ? 'met' : 'NOT met';
  console.log(`  permit() + end() median ${results[0].median.toFixed(1)} ns: target <= 250 ns ${target}`);
  if (lock.inFlight !== 0 || sink < 0) throw new Error('permits left in flight');
  await lock.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
