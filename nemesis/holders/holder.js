// The Node holder of the nemesis (docs/nemesis.md, "A holder of another
// face"), on the public API of the dlock package only (`require` of the
// built bindings/node, or DLOCK_NODE_PACKAGE): contends for one lock on
// etcd through the endpoints given, works under permits as fast as it can
// (an awaited guarded put of KEY = ID:SEQ:TOKEN, then one line
// "ID TOKEN SEQ" to the gate), and appends the holder protocol's records
// to FILE, stamped with CLOCK_BOOTTIME in nanoseconds. EOF on stdin:
// records "final" and exits.
//
// --election 1: a candidate of the election NAME (`client.election`)
// instead of a lock holder, as the Rust holder: it campaigns (value ID)
// where it would acquire, and as the leader proclaims ID:N every 100th
// permit (a "proclaim" record). Only the leader writes.
//
// --semaphore N: a holder of the semaphore NAME of N slots
// (`client.semaphore`), as the Rust holder: it waits for any slot, then
// works on that slot's lock (a fenced slot takes itself back), writing
// KEY-<slot> and "ID TOKEN SEQ SLOT" to the gate; every record of the slot
// carries "li": slot, and its first "acquired" is stamped when the
// acquire returned.
//
// --rwlock r|w: a reader or a writer of the read/write lock NAME
// (`client.rwlock(NAME).reader()` / `.writer()`), as the Rust holder: its
// unit is a read or a write of the gate's two-key register (the line
// "ID TOKEN SEQ r|w", answered "ok ..." or "stale HIGHEST"), recorded as
// a "write" of res "register" with its "mode"; no etcd write. A mode of
// its own (no --election, no --semaphore). After a number of units drawn
// in [20, 200] (the Rust holder's generator, seeded from ID) it releases
// (a "release" record), and acquires again in the other mode on a new
// handle (a "mode" record), and so on.
//
// Node reads no CLOCK_BOOTTIME and the face's events carry no instant:
// the clock is process.hrtime (CLOCK_MONOTONIC) plus BOOTTIME - MONOTONIC
// read once at start (constant while the machine does not suspend), and
// an event's `at` is when its listener ran (after the core's decision and
// the trip through the event loop: G1 leads come out smaller, never
// larger), as in the C holder.
//
// usage: node holder.js --id ID --endpoints URLS --lock NAME --key KEY
//          --gate HOST:PORT --history FILE [--ttl-ms N --interval-ms N
//          --timeout-ms N --retry-ms N --margin-ms N --unit-ms N --idle-ms N
//          --writes 0|1 --election 0|1 --semaphore N --rwlock r|w]
'use strict';
const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const { execFileSync } = require('node:child_process');

const dlock = require(process.env.DLOCK_NODE_PACKAGE || path.join(__dirname, '..', '..', 'bindings', 'node'));

const NUMBERS = {
  'ttl-ms': 4000, 'interval-ms': 1000, 'timeout-ms': 500, 'retry-ms': 250,
  'margin-ms': 1000, 'unit-ms': 10, 'idle-ms': 5, writes: 1, election: 0, semaphore: 0,
};
const WORDS = ['id', 'endpoints', 'lock', 'key', 'gate', 'history'];
// Words that may be left out, with their defaults.
const OPTIONAL = { rwlock: '' };

function die(msg) {
  process.stderr.write(`holder: ${msg}\n`);
  process.exit(2);
}

function flags(argv) {
  const f = { ...NUMBERS, ...OPTIONAL };
  if (argv.length % 2) die(`flags are --key value, got ${argv.join(' ')}`);
  for (let i = 0; i < argv.length; i += 2) {
    const k = argv[i].replace(/^--/, '');
    if (!argv[i].startsWith('--') || !(k in NUMBERS || k in OPTIONAL || WORDS.includes(k))) die(`unknown flag ${argv[i]}`);
    if (k in NUMBERS) {
      if (!/^\d+$/.test(argv[i + 1])) die(`--${k} must be a whole number`);
      f[k] = Number(argv[i + 1]);
    } else {
      f[k] = argv[i + 1];
    }
  }
  const missing = WORDS.filter((w) => !(w in f));
  if (missing.length) die(`--${missing.join(', --')} required`);
  return f;
}

// BOOTTIME - MONOTONIC, read in one process that has both clocks.
const offset = BigInt(
  execFileSync('python3', ['-c',
    'import time; m = time.clock_gettime_ns(time.CLOCK_MONOTONIC); '
    + 'b = time.clock_gettime_ns(time.CLOCK_BOOTTIME); print(b - m)']).toString().trim(),
);
const now = () => process.hrtime.bigint() + offset;

const f = flags(process.argv.slice(2));
const who = f.id;
const fd = fs.openSync(f.history, 'a');
// The semaphore's slot once one is held: every record of it is tagged.
let li = null;
function record(ev, fields = {}) {
  const tagged = li === null ? fields : { ...fields, li };
  const line = JSON.stringify({ t: now(), p: who, ev, ...tagged }, (_, v) => (typeof v === 'bigint' ? `@${v}@` : v))
    .replace(/"@(\d+)@"/g, '$1');
  fs.writeSync(fd, `${line}\n`);
}

// The gate: one line each way; "ok", "refused", "unknown" or "error".
class Gate {
  constructor(addr) {
    const i = addr.lastIndexOf(':');
    this.host = addr.slice(0, i);
    this.port = Number(addr.slice(i + 1));
    this.sock = null;
    this.buf = '';
    this.waiter = null;
  }

  connect() {
    return new Promise((resolve) => {
      const s = net.createConnection({ host: this.host, port: this.port, noDelay: true });
      s.once('connect', () => { this.sock = s; resolve(true); });
      s.on('data', (d) => {
        this.buf += d.toString();
        const i = this.buf.indexOf('\n');
        if (i >= 0 && this.waiter) {
          const line = this.buf.slice(0, i);
          this.buf = this.buf.slice(i + 1);
          const w = this.waiter;
          this.waiter = null;
          w(line);
        }
      });
      const lost = () => {
        if (this.sock === s) this.sock = null;
        if (this.waiter) { const w = this.waiter; this.waiter = null; w(null); }
        resolve(false);
      };
      s.on('error', lost);
      s.on('close', lost);
    });
  }

  write(token, seq) {
    return this.send(li === null ? `${who} ${token} ${seq}\n` : `${who} ${token} ${seq} ${li}\n`);
  }

  // A read ('r') or write ('w') of the two-key register.
  register(token, seq, mode) {
    return this.send(`${who} ${token} ${seq} ${mode}\n`);
  }

  async send(request) {
    if (!this.sock && !(await this.connect())) return 'error';
    const line = await new Promise((resolve) => {
      this.waiter = resolve;
      this.sock.write(request);
    });
    if (line === null) return 'unknown';
    if (line.startsWith('ok')) return 'ok';
    if (line.startsWith('stale')) return 'refused';
    this.sock.destroy();
    this.sock = null;
    return 'unknown';
  }
}

const M64 = (1n << 64n) - 1n;

// The Rust holder's generator of hold lengths (xorshift64*), seeded with
// FNV-1a of the id: the same sequence for the same id.
function rwRng(id) {
  let h = 0xcbf29ce484222325n;
  for (const b of Buffer.from(id)) h = ((h ^ BigInt(b)) * 0x100000001b3n) & M64;
  return { x: h || 0x9e3779b97f4a7c15n };
}

// Units to hold for before the handover, in [20, 200].
function rwUnits(st) {
  let { x } = st;
  x ^= x >> 12n;
  x ^= (x << 25n) & M64;
  x ^= x >> 27n;
  st.x = x;
  return 20 + Number(((x * 0x2545f4914f6cdd1dn) & M64) % 181n);
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function main() {
  let rwMode = f.rwlock || null;
  if (rwMode !== null && rwMode !== 'r' && rwMode !== 'w') die(`--rwlock takes r or w, not ${rwMode}`);
  if (rwMode && (f.election === 1 || f.semaphore)) die('--rwlock r|w is a mode of its own (no --election, no --semaphore)');
  record('start', {
    face: 'node', pid: process.pid, lock: f.lock, wall: Math.floor(Date.now() / 1000), election: f.election === 1,
    semaphore: f.semaphore || null, rwlock: rwMode,
    ttl_ms: f['ttl-ms'], margin_ms: f['margin-ms'], interval_ms: f['interval-ms'],
  });
  const client = new dlock.Client({
    endpoints: f.endpoints, ttl: f['ttl-ms'], keepaliveInterval: f['interval-ms'],
    keepaliveTimeout: f['timeout-ms'], retryInterval: f['retry-ms'], margin: f['margin-ms'], reacquire: true,
  });
  const election = f.election === 1;
  let lock = null;
  process.stdin.on('data', () => {});
  process.stdin.on('end', () => {
    if (lock === null) record('final', { state: 'acquiring', token: null });
    else record('final', { state: lock.state.toLowerCase(), token: lock.token });
    fs.closeSync(fd);
    process.exit(0);
  });
  process.stdin.resume();
  let key = f.key;
  let rw = null;
  if (f.semaphore) {
    const sem = client.semaphore(f.lock, f.semaphore);
    while (lock === null) {
      record('acquire');
      try {
        lock = await sem.acquire({ timeout: 30000 });
      } catch (e) {
        record('acquire_err', { code: e.code ?? String(e), msg: String(e.message ?? e) });
        await sleep(f['retry-ms']);
      }
    }
    li = lock.slot;
    key = `${f.key}-${li}`;
    record('acquired', { at: now(), token: lock.token });
    record('acquire_ok', { token: lock.token });
  } else if (rwMode) {
    rw = client.rwlock(f.lock);
    lock = rwMode === 'r' ? rw.reader() : rw.writer();
  } else {
    lock = election ? client.election(f.lock) : client.lock(f.lock);
  }
  const watch = (l) => {
    l.on('stateChange', ({ from, to, reason }) => record('state', {
      at: now(), wall: Math.floor(Date.now() / 1000), from: from.toLowerCase(), to: to.toLowerCase(), reason,
    }));
    l.on('fence', (token, inFlight) => record('fence', { at: now(), token, in_flight: inFlight }));
    l.on('acquired', (token) => record('acquired', { at: now(), token }));
    l.on('drained', () => record('drained', { at: now() }));
  };
  watch(lock);

  const gate = new Gate(f.gate);
  const unit = f['unit-ms'];
  let seq = 0;
  let refusedN = 0;
  let lastRefusal = null;
  let permits = 0;
  // --rwlock: units left before the handover (release, then the other mode).
  const rng = rwRng(who);
  let rwLeft = rwUnits(rng);
  for (;;) {
    if (lock.state === 'Idle' || lock.state === 'Released') {
      record('acquire');
      try {
        const won = election ? lock.campaign(who, { timeout: 30000 }) : lock.acquire({ timeout: 30000 });
        record('acquire_ok', { token: await won });
      } catch (e) {
        record('acquire_err', { code: e.code ?? String(e), msg: String(e.message ?? e) });
        await sleep(f['retry-ms']);
      }
      continue;
    }
    const t0 = now();
    let p;
    try {
      p = lock.permit();
    } catch (e) {
      if (!(e instanceof dlock.DlockError)) throw e;
      refusedN += 1;
      if (e.code !== lastRefusal) {
        record('refused', { reason: e.code, state: lock.state.toLowerCase() });
        lastRefusal = e.code;
      }
      await sleep(f['idle-ms']);
      continue;
    }
    if (lastRefusal !== null) {
      record('refusals', { n: refusedN });
      refusedN = 0;
      lastRefusal = null;
    }
    const token = p.token;
    // The clock before `remaining`, plus `remaining`: at most the permit's
    // own deadline (stricter for G4).
    const t1 = now();
    record('permit', { t0, token, deadline: t1 + BigInt(Math.floor(p.remaining * 1e6)) });
    permits += 1;
    if (election && permits % 100 === 0) {
      const value = `${who}:${permits}`;
      let out = 'ok';
      try {
        await lock.proclaim(value);
      } catch (e) {
        if (!(e instanceof dlock.DlockError)) throw e;
        out = e.code;
      }
      record('proclaim', { token, value, out });
    }
    await sleep(unit / 2);
    if (rwMode && f.writes) {
      seq += 1;
      await sleep(unit / 2);
      const sent = now();
      const out = await gate.register(token, seq, rwMode);
      record('write', { res: 'register', mode: rwMode, token, seq, sent, out });
    } else if (f.writes) {
      seq += 1;
      let sent = now();
      let out = 'ok';
      let code = '';
      let msg = '';
      try {
        await lock.guardedPut(token, key, `${who}:${seq}:${token}`);
      } catch (e) {
        if (e instanceof dlock.FencedError) [out, code] = ['fenced', 'fenced'];
        else if (e instanceof dlock.BackendError) [out, code, msg] = ['unknown', e.code, e.message];
        else [out, code, msg] = ['error', e.code ?? 'other', String(e.message ?? e)];
      }
      record('write', { res: 'etcd', token, seq, sent, out, code, msg });
      await sleep(unit / 2);
      sent = now();
      out = await gate.write(token, seq);
      record('write', { res: 'gate', token, seq, sent, out });
    }
    p.end();
    if (rwMode) {
      rwLeft -= 1;
      if (rwLeft === 0) {
        let out = 'ok';
        try {
          await lock.close();
        } catch (e) {
          if (!(e instanceof dlock.DlockError)) throw e;
          out = e.code;
        }
        record('release', { token, mode: rwMode, out });
        rwMode = rwMode === 'r' ? 'w' : 'r';
        lock = rwMode === 'r' ? rw.reader() : rw.writer();
        watch(lock);
        record('mode', { mode: rwMode });
        rwLeft = rwUnits(rng);
      }
    }
  }
}

main().catch((e) => {
  process.stderr.write(`holder: ${e.stack ?? e}\n`);
  process.exit(1);
});
