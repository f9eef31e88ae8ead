// Soak of the Node face (issue 23; scripts/soak.sh, docs/testing.md
// "Soak"), run with --expose-gc: the run of core/tests/soak.rs through
// require('dlock'): DLOCK_SOAK_CYCLES acquire/release cycles (default
// 100,000), each on a lock of its own name (client.lock, await acquire, one
// permit, await release, await close), and DLOCK_SOAK_PERMITS permits
// (default 1,000,000) on one held lock; embedded, or etcd with
// DLOCK_ENDPOINTS set. A tenth of each warms up, then ten slices, each
// followed by a full GC and a sample of the RSS, open descriptors and
// threads (/proc/self). Exit 1 unless the RSS less V8's committed heap
// (heapTotal: V8 grows its young generation up to its limit and keeps the
// pages, 5 -> 20 MiB here while heapUsed stays flat) stays under
// DLOCK_SOAK_RSS_MIB (default 4) above the warm-up's, heapUsed within
// 1 MiB of it, and the descriptors and threads equal the warm-up's. Prints
// one SOAK|... line first (its growth column is the native one).
// (test/memory.test.js is CI's short version: 16 rounds of 1,000 locks.)
'use strict';

const fs = require('node:fs');
// DLOCK_NODE_PACKAGE: the installed package (scripts/soak.sh under
// scripts/test.sh --full, whose packages come from scripts/dist.sh).
const dlock = require(process.env.DLOCK_NODE_PACKAGE || '..');

const envInt = (name, dflt) => (process.env[name] ? Number(process.env[name]) : dflt);

function statusField(name) {
  const line = fs
    .readFileSync('/proc/self/status', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(name));
  if (!line) throw new Error(`no ${name} in /proc/self/status`);
  return Number(line.split(/\s+/)[1]);
}

async function sample() {
  for (let i = 0; i < 3; i++) {
    global.gc();
    await new Promise((r) => setImmediate(r));
  }
  // readdirSync holds one descriptor of its own while it reads.
  const m = process.memoryUsage();
  return {
    rss_kib: statusField('VmRSS:'),
    heap_total_kib: Math.round(m.heapTotal / 1024),
    heap_used_kib: Math.round(m.heapUsed / 1024),
    fds: fs.readdirSync('/proc/self/fd').length - 1,
    threads: statusField('Threads:'),
  };
}

async function main() {
  const cycles = Math.floor(envInt('DLOCK_SOAK_CYCLES', 100_000) / 10);
  const permits = Math.floor(envInt('DLOCK_SOAK_PERMITS', 1_000_000) / 10);
  const boundMib = envInt('DLOCK_SOAK_RSS_MIB', 4);
  const backend = process.env.DLOCK_ENDPOINTS ? 'etcd' : 'memory';
  const client = new dlock.Client();
  const held = client.lock(`soak/node/${process.pid}/held`);
  held.on('fence', () => {});
  await held.acquire({ timeout: 10_000 });
  let next = 0;
  const run = async () => {
    for (let i = 0; i < cycles; i++) {
      const lock = client.lock(`soak/node/${process.pid}/${next++}`);
      const token = await lock.acquire({ timeout: 10_000 });
      const p = lock.permit();
      if (p.token !== token) throw new Error(`permit token ${p.token}, acquired ${token}`);
      p.end();
      await lock.release();
      await lock.close();
    }
    for (let i = 0; i < permits; i++) held.permit().end();
  };

  await run();
  const warm = await sample();
  const t0 = process.hrtime.bigint();
  const samples = [];
  for (let s = 0; s < 10; s++) {
    await run();
    samples.push(await sample());
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const end = samples[samples.length - 1];
  const native = (s) => s.rss_kib - s.heap_total_kib;
  const growth = Math.max(0, ...samples.map((s) => native(s) - native(warm)));
  const heapGrowth = Math.max(0, ...samples.map((s) => s.heap_used_kib - warm.heap_used_kib));
  console.log(
    `SOAK|node|${backend}|${cycles * 10}|${permits * 10}|${seconds.toFixed(1)}|${warm.rss_kib}|${end.rss_kib}` +
      `|${growth}|${warm.fds}|${end.fds}|${warm.threads}|${end.threads}|${boundMib}`,
  );
  console.error(
    `soak.js: KiB at the warm-up and each slice: RSS ${[warm, ...samples].map((s) => s.rss_kib).join(' ')}; ` +
      `RSS - heapTotal ${[warm, ...samples].map(native).join(' ')}; heapUsed ${[warm, ...samples].map((s) => s.heap_used_kib).join(' ')}`,
  );
  let ok = true;
  if (growth >= boundMib * 1024) {
    console.error(`soak.js: RSS less the V8 heap grew ${growth} KiB after the warm-up (bound ${boundMib} MiB)`);
    ok = false;
  }
  if (heapGrowth >= 1024) {
    console.error(`soak.js: the JavaScript heap grew ${heapGrowth} KiB after the warm-up (bound 1 MiB)`);
    ok = false;
  }
  samples.forEach((s, i) => {
    if (s.fds !== warm.fds || s.threads !== warm.threads) {
      console.error(`soak.js: slice ${i}: ${JSON.stringify(s)}; warm-up ${JSON.stringify(warm)}`);
      ok = false;
    }
  });
  if (held.inFlight !== 0) {
    console.error(`soak.js: ${held.inFlight} permits in flight`);
    ok = false;
  }
  await held.close();
  process.exitCode = ok ? 0 : 1;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
