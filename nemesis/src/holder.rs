//! A holder: one process that contends for the lock, writes to both fenced
//! resources under permits as fast as it can, and records everything (the
//! holder protocol of `docs/nemesis.md`). [`main`] is the Rust holder
//! (`nemesis holder ...`); [`Spawned`] starts any face's holder process.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dlock::{Client, Error, LockEvent, Refused, State};
use serde_json::json;

use crate::Settings;
use crate::history::{Writer, now};
use crate::proxy::Proxy;

/// Command-line flags as `--key value` pairs.
pub struct Flags(HashMap<String, String>);

impl Flags {
    /// Parses `--key value ...`; a flag without a value or a stray word is
    /// an error naming it.
    pub fn parse(args: &[String]) -> Result<Flags, String> {
        let mut m = HashMap::new();
        let mut it = args.iter();
        while let Some(k) = it.next() {
            let Some(key) = k.strip_prefix("--") else {
                return Err(format!("unexpected argument {k:?} (flags are --key value)"));
            };
            let v = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            m.insert(key.to_owned(), v.clone());
        }
        Ok(Flags(m))
    }

    /// The value of `--key`, or an error naming it.
    pub fn need(&self, key: &str) -> Result<String, String> {
        self.0
            .get(key)
            .cloned()
            .ok_or_else(|| format!("--{key} is required"))
    }

    /// `--key` as a number, `default` when absent.
    pub fn num(&self, key: &str, default: u64) -> Result<u64, String> {
        self.0.get(key).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{key} must be a whole number, got {v:?}"))
        })
    }

    /// `--key` in milliseconds.
    pub fn ms(&self, key: &str, default: Duration) -> Result<Duration, String> {
        self.num(key, default.as_millis() as u64)
            .map(Duration::from_millis)
    }

    /// `--key` as a string, `default` when absent.
    pub fn get(&self, key: &str, default: &str) -> String {
        self.0
            .get(key)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }
}

/// `nemesis holder --id ID --endpoints URL,.. --lock NAME --key KEY --gate
/// ADDR --history FILE [--unit-ms 10] [--idle-ms 5] [--sample-keepalives 1]
/// [--pause-self-after N] [--writes 0|1] [--locks N] [--election 0|1]
/// [--rwlock r|w] [--db URL] [--guard 0|1] [settings:
/// --ttl-ms ...]`.
///
/// A `postgres://` endpoint (the PostgreSQL mode): the write beside the
/// gate is a transaction on the user table `app.writes` over the direct
/// connection `--db` (default: the endpoint), `dlock.guard(NAME, TOKEN)`
/// its first statement (`--guard 0`: none, the cases' control), `run` =
/// `KEY`; recorded as a write of `res` `pg`.
///
/// `--election 1`: a candidate of the election NAME (`session.election`)
/// instead of a lock holder: it campaigns (value `ID`) where it would
/// acquire, and as the leader proclaims `ID:N` every 100th permit (a
/// `proclaim` record). Only the leader writes: a permit is leadership.
///
/// `--locks N` (N > 1): the second mode, N locks `NAME-0` .. `NAME-<N-1>`
/// on one session of this holder, written at `KEY-<i>`; every record of
/// lock i carries `"li": i`.
///
/// `--semaphore N`: a holder of the semaphore NAME of N slots
/// (`session.semaphore`): it waits for any slot, then works as a lock
/// holder on that slot (a fenced slot reacquires itself), written at
/// `KEY-<slot>`, guarded by the slot's name; every record of the slot
/// carries `"li": slot`. Its first `acquired` is stamped when the acquire
/// returned (the slot's events are watched from then on).
///
/// `--rwlock r|w`: a reader or a writer of the read/write lock NAME
/// (`session.rwlock(NAME).read()` / `.write()`); its unit is a read or a
/// write of the gate's two-key register (`<id> <token> <seq> r|w`, the
/// gate's `admit_read` / `admit_write`), recorded `res` `register`; no
/// etcd or `app.writes` write. On PostgreSQL the register is
/// `app.register`'s two rows of run `KEY` instead, read or written by the
/// holder's own transaction under `dlock.guard_read` / `guard_write`
/// (`crate::pg::GuardedWriter::register`), and the holder records the
/// `rw_read` / `rw_write` / `rw_refuse` the gate records on etcd. After a
/// number of units drawn in [20, 200] (seeded from `ID`) it releases (a
/// `release` record) and queues again in the other mode on a new handle
/// (a `mode` record), and so on.
pub fn main(args: &[String]) -> Result<(), String> {
    let f = Flags::parse(args)?;
    let id = f.need("id")?;
    let d = Settings::default();
    let settings = Settings {
        ttl: f.ms("ttl-ms", d.ttl)?,
        interval: f.ms("interval-ms", d.interval)?,
        timeout: f.ms("timeout-ms", d.timeout)?,
        retry: f.ms("retry-ms", d.retry)?,
        margin: f.ms("margin-ms", d.margin)?,
    };
    let endpoints = f.need("endpoints")?;
    let name = f.need("lock")?;
    let key = f.need("key")?;
    let gate_addr: SocketAddr = f
        .need("gate")?
        .parse()
        .map_err(|e| format!("--gate: {e}"))?;
    let unit = f.ms("unit-ms", Duration::from_millis(10))?;
    let idle = f.ms("idle-ms", Duration::from_millis(5))?;
    let pause_after = f.num("pause-self-after", 0)?;
    let writes = f.num("writes", 1)? == 1;
    let n_locks = f.num("locks", 1)?.clamp(1, 10_000) as usize;
    let election = f.num("election", 0)? == 1;
    if election && n_locks > 1 {
        return Err("--election 1 takes one lock (no --locks)".into());
    }
    let semaphore = f.num("semaphore", 0)? as u32;
    if semaphore > 0 && (election || n_locks > 1) {
        return Err("--semaphore N takes no --locks and no --election".into());
    }
    let mut rw_mode = match f.get("rwlock", "").as_str() {
        "" => None,
        "r" => Some('r'),
        "w" => Some('w'),
        m => return Err(format!("--rwlock takes r or w, not {m}")),
    };
    if rw_mode.is_some() && (election || n_locks > 1 || semaphore > 0) {
        return Err("--rwlock r|w is a mode of its own".into());
    }
    // PostgreSQL (a `postgres://` URL): the write is a guarded transaction
    // on `app.writes` over the direct connection `--db` (default: the
    // endpoint itself), its `run` column `KEY`.
    // The engine is the one the endpoints name, chosen by the core
    // (`Endpoints`), as an application does.
    let backend = dlock::Endpoints::new([endpoints.as_str()])
        .backend()
        .map_err(|e| e.to_string())?;
    let pg_mode = matches!(backend, dlock::BackendConfig::Postgres(_));
    if pg_mode && (election || n_locks > 1) {
        return Err("on PostgreSQL the holder takes one lock (no --locks, no --election)".into());
    }
    // `--guard 0`: the cases' control, writes without the guard.
    let guard = f.num("guard", 1)? == 1;
    let mut pg_writer = pg_mode.then(|| {
        let db = f.get("db", "");
        crate::pg::GuardedWriter::new(if db.is_empty() { &endpoints } else { &db }, guard)
    });
    let h = Arc::new(
        Writer::open(Path::new(&f.need("history")?), &id).map_err(|e| format!("--history: {e}"))?,
    );
    h.record(
        "start",
        json!({"face": "rust", "pid": std::process::id(), "lock": name, "wall": wall(),
               "locks": n_locks, "election": election,
               "semaphore": (semaphore > 0).then_some(semaphore),
               "rwlock": rw_mode.map(String::from),
               "backend": if pg_mode { "postgres" } else { "etcd" },
               "ttl_ms": settings.ttl.as_millis() as u64,
               "margin_ms": settings.margin.as_millis() as u64,
               "interval_ms": settings.interval.as_millis() as u64}),
    );
    let config = dlock::ClientConfig {
        options: settings.options(),
        backend,
        clock: None,
        identity: Default::default(),
    };
    // A service starting while the server restarts or stalls (a
    // replacement holder during primary_restarted, primary_paused) tries
    // again, as a real one would; bad input still ends it.
    let until = std::time::Instant::now() + Duration::from_secs(60);
    let client = loop {
        match Client::connect(config.clone()) {
            Ok(c) => break c,
            Err(e @ dlock::Error::Backend(_)) if pg_mode && std::time::Instant::now() < until => {
                h.record("connect_failed", json!({"error": e.to_string()}));
                std::thread::sleep(Duration::from_millis(250));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let multi = n_locks > 1;
    let session = if multi {
        client
            .session(settings.options())
            .map_err(|e| e.to_string())?
    } else {
        client.default_session().clone()
    };
    // The driver closes stdin to end the run: the last records are the
    // states (of no lock yet: a semaphore holder still waiting).
    let finals: Arc<std::sync::Mutex<Vec<Held>>> = Arc::default();
    {
        let (h, finals) = (h.clone(), finals.clone());
        std::thread::spawn(move || {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            let locks = finals.lock().unwrap_or_else(|e| e.into_inner());
            for (lock, li) in locks.iter() {
                record(
                    &h,
                    "final",
                    *li,
                    json!({"state": lock.state().as_str().to_lowercase(),
                           "token": lock.token().map(|t| t.get())}),
                );
            }
            if locks.is_empty() {
                h.record("final", json!({"state": "acquiring", "token": null}));
            }
            std::process::exit(0);
        });
    }
    let mut slots = Vec::new();
    if semaphore > 0 {
        let sem = session
            .semaphore(&name, semaphore)
            .map_err(|e| e.to_string())?;
        let lock = loop {
            h.record("acquire", json!({}));
            match sem.acquire(Duration::from_secs(30)) {
                Ok(l) => break l,
                Err(e) => {
                    h.record(
                        "acquire_err",
                        json!({"code": e.code(), "msg": e.to_string()}),
                    );
                    std::thread::sleep(settings.retry);
                }
            }
        };
        let slot = lock.slot().expect("a semaphore's lock has a slot") as usize;
        let token = lock.token().map(|t| t.get());
        let li = Some(slot);
        let lock = Arc::new(Handle::Lock(lock));
        watch_events(&lock, &h, li);
        record(&h, "acquired", li, json!({"at": now(), "token": token}));
        record(&h, "acquire_ok", li, json!({"token": token}));
        slots.push(Slot {
            lock,
            name: sem.slot_name(slot as u32),
            key: format!("{key}-{slot}"),
            li,
            seq: 0,
            last_refusal: None,
            refused_n: 0,
            acquiring: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        });
    }
    for i in (0..n_locks).filter(|_| semaphore == 0) {
        let li = multi.then_some(i);
        let (lname, lkey) = match li {
            Some(i) => (format!("{name}-{i}"), format!("{key}-{i}")),
            None => (name.clone(), key.clone()),
        };
        let lock = Arc::new(if election {
            Handle::Election(session.election(&lname).map_err(|e| e.to_string())?)
        } else if let Some(m) = rw_mode {
            let rw = session.rwlock(&lname).map_err(|e| e.to_string())?;
            Handle::Lock(if m == 'r' { rw.read() } else { rw.write() }.map_err(|e| e.to_string())?)
        } else {
            Handle::Lock(session.lock(&lname).map_err(|e| e.to_string())?)
        });
        watch_events(&lock, &h, li);
        slots.push(Slot {
            lock,
            name: lname,
            key: lkey,
            li,
            seq: 0,
            last_refusal: None,
            refused_n: 0,
            acquiring: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        });
    }
    *finals.lock().unwrap_or_else(|e| e.into_inner()) =
        slots.iter().map(|s| (s.lock.clone(), s.li)).collect();
    if f.num("sample-keepalives", 0)? == 1 {
        // The deadline is the send time of the last confirmed keepalive +
        // TTL - margin: each new deadline dates one keepalive send, on the
        // core's own clock, however late this sampler runs.
        let (h, lock) = (h.clone(), slots[0].lock.clone());
        let back = settings.ttl - settings.margin;
        std::thread::spawn(move || {
            let mut last = None;
            loop {
                let d = lock.deadline();
                if d != last {
                    if let Some(d) = d {
                        h.record("keepalive", json!({"sent": (d - back).as_nanos()}));
                    }
                    last = d;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }
    let mut gate = GateConn::new(gate_addr);
    let mut permits = 0u64;
    // --rwlock: units left before the handover (release, then the other mode).
    let mut rw_rng = rw_rng(&id);
    let mut rw_left = rw_units(&mut rw_rng);
    loop {
        let mut worked = false;
        for slot in &mut slots {
            let lock = &slot.lock;
            let li = slot.li;
            if matches!(lock.state(), State::Idle | State::Released) {
                if multi {
                    // Many locks: each free one waits for its turn on a
                    // thread of its own (a fenced lock reacquires by itself).
                    if !slot
                        .acquiring
                        .swap(true, std::sync::atomic::Ordering::AcqRel)
                    {
                        let (lock, h, busy) = (lock.clone(), h.clone(), slot.acquiring.clone());
                        std::thread::spawn(move || {
                            record(&h, "acquire", li, json!({}));
                            match lock.acquire(Duration::from_secs(30)) {
                                Ok(t) => record(&h, "acquire_ok", li, json!({"token": t.get()})),
                                Err(e) => record(
                                    &h,
                                    "acquire_err",
                                    li,
                                    json!({"code": e.code(), "msg": e.to_string()}),
                                ),
                            }
                            busy.store(false, std::sync::atomic::Ordering::Release);
                        });
                    }
                    continue;
                }
                h.record("acquire", json!({}));
                let won = match &**lock {
                    Handle::Election(e) => e.campaign(id.as_bytes(), Duration::from_secs(30)),
                    Handle::Lock(l) => l.acquire(Duration::from_secs(30)),
                };
                match won {
                    Ok(t) => h.record("acquire_ok", json!({"token": t.get()})),
                    Err(e) => {
                        h.record(
                            "acquire_err",
                            json!({"code": e.code(), "msg": e.to_string()}),
                        );
                        std::thread::sleep(settings.retry);
                    }
                }
                worked = true;
                continue;
            }
            let t0 = now();
            let permit = match lock.permit() {
                Ok(p) => p,
                Err(r) => {
                    slot.refused_n += 1;
                    if slot.last_refusal != Some(r) {
                        record(
                            &h,
                            "refused",
                            li,
                            json!({"reason": r.as_str(), "state": lock.state().as_str().to_lowercase()}),
                        );
                        slot.last_refusal = Some(r);
                    }
                    continue;
                }
            };
            worked = true;
            if slot.last_refusal.take().is_some() {
                record(&h, "refusals", li, json!({"n": slot.refused_n}));
                slot.refused_n = 0;
            }
            let token = permit.token().get();
            permits += 1;
            record(
                &h,
                "permit",
                li,
                json!({"t0": t0, "token": token, "deadline": permit.deadline().as_nanos()}),
            );
            if pause_after > 0 && permits == pause_after {
                h.record("self_pause", json!({"token": token}));
                // SAFETY: kill(2) on this process; the test sends SIGCONT.
                unsafe { libc::kill(libc::getpid(), libc::SIGSTOP) };
                h.record("self_resume", json!({"token": token}));
            }
            if let (Handle::Election(e), true) = (&**lock, permits % 100 == 0) {
                let value = format!("{id}:{permits}");
                let r = e.proclaim(value.as_bytes());
                h.record(
                    "proclaim",
                    json!({"token": token, "value": value,
                           "out": r.as_ref().map_or_else(|e| e.code(), |()| "ok")}),
                );
            }
            std::thread::sleep(unit / 2);
            if let (Some(m), true) = (rw_mode, writes) {
                slot.seq += 1;
                let seq = slot.seq;
                std::thread::sleep(unit / 2);
                let sent = now();
                let mut rec = json!({"res": "register", "mode": m.to_string(), "token": token,
                                     "seq": seq, "sent": sent});
                if let Some(w) = pg_writer.as_mut() {
                    let o = pg_register(w, &h, &id, &slot.name, &slot.key, token, seq, m, sent);
                    rec["out"] = o.out.into();
                    rec["code"] = o.code.into();
                    rec["msg"] = o.msg.into();
                } else {
                    rec["out"] = gate.register(&id, token, seq, m).into();
                }
                record(&h, "write", li, rec);
            } else if writes {
                slot.seq += 1;
                let seq = slot.seq;
                let value = format!("{id}:{seq}:{token}");
                let sent = now();
                let (res, out, code, msg) = if let Some(w) = pg_writer.as_mut() {
                    let o = w.write(
                        &slot.name,
                        token,
                        &slot.key,
                        &id,
                        seq,
                        Duration::from_secs(10),
                    );
                    ("pg", o.out, o.code, o.msg)
                } else {
                    let r = lock.guarded_put(permit.token(), slot.key.as_bytes(), value.as_bytes());
                    let (out, code, msg) = match &r {
                        Ok(()) => ("ok", "", String::new()),
                        Err(Error::Fenced(_)) => ("fenced", "fenced", String::new()),
                        Err(e @ Error::Backend(_)) => ("unknown", e.code(), e.to_string()),
                        Err(e) => ("error", e.code(), e.to_string()),
                    };
                    ("etcd", out, code.to_owned(), msg)
                };
                record(
                    &h,
                    "write",
                    li,
                    json!({"res": res, "token": token, "seq": seq, "sent": sent, "out": out,
                           "code": code, "msg": msg}),
                );
                std::thread::sleep(unit / 2);
                let sent = now();
                let out = gate.write(&id, token, seq, li);
                record(
                    &h,
                    "write",
                    li,
                    json!({"res": "gate", "token": token, "seq": seq, "sent": sent, "out": out}),
                );
            }
            drop(permit);
            // --rwlock: after its units the holder lets go and queues again
            // in the other mode, a new handle of the same read/write lock.
            if let Some(m) = rw_mode {
                rw_left -= 1;
                if rw_left == 0 {
                    let r = slot.lock.close();
                    h.record(
                        "release",
                        json!({"token": token, "mode": m.to_string(),
                               "out": r.as_ref().map_or_else(|e| e.code(), |()| "ok")}),
                    );
                    let next = if m == 'r' { 'w' } else { 'r' };
                    let rw = session.rwlock(&slot.name).map_err(|e| e.to_string())?;
                    let lock = if next == 'r' { rw.read() } else { rw.write() };
                    slot.lock = Arc::new(Handle::Lock(lock.map_err(|e| e.to_string())?));
                    watch_events(&slot.lock, &h, li);
                    *finals.lock().unwrap_or_else(|e| e.into_inner()) =
                        vec![(slot.lock.clone(), li)];
                    h.record("mode", json!({"mode": next.to_string()}));
                    rw_mode = Some(next);
                    rw_left = rw_units(&mut rw_rng);
                }
            }
        }
        if !worked {
            std::thread::sleep(idle);
        }
    }
}

/// One read or write (`m`) of PostgreSQL's register ([`crate::pg::GuardedWriter::register`]),
/// recorded here as the gate records its own: `rw_write` / `rw_read` with
/// the pair (`a`, `b` as `token.seq`), `t0` = `sent` (before the BEGIN),
/// stamped when the COMMIT's answer came; `rw_refuse` when the guard
/// raised DL001; nothing for a transaction that failed otherwise. No `dn`:
/// the database keeps no watermarks (RW3 is the gate's).
#[allow(clippy::too_many_arguments)]
fn pg_register(
    w: &mut crate::pg::GuardedWriter,
    h: &Writer,
    id: &str,
    name: &str,
    run: &str,
    token: u64,
    seq: u64,
    m: char,
    sent: u64,
) -> crate::pg::Outcome {
    let (o, pair) = w.register(name, token, run, seq, m == 'w', Duration::from_secs(10));
    let val = |(t, q): (u64, u64)| format!("{t}.{q}");
    let mut rec = json!({"h": id, "token": token, "seq": seq, "t0": sent});
    match (o.out, pair) {
        ("ok", Some([a, b])) => {
            rec["a"] = val(a).into();
            rec["b"] = val(b).into();
            h.record_at(o.at, if m == 'w' { "rw_write" } else { "rw_read" }, rec);
        }
        ("fenced", _) => {
            rec["mode"] = m.to_string().into();
            rec["code"] = o.code.clone().into();
            h.record_at(o.at, "rw_refuse", rec);
        }
        _ => {}
    }
    o
}

/// A lock, or an election's candidate (whose lock is the same API).
enum Handle {
    Lock(dlock::Lock),
    Election(dlock::Election),
}

impl std::ops::Deref for Handle {
    type Target = dlock::Lock;
    fn deref(&self) -> &dlock::Lock {
        match self {
            Handle::Lock(l) => l,
            Handle::Election(e) => e.lock(),
        }
    }
}

/// A lock held (or wanted), and its `li` tag.
type Held = (Arc<Handle>, Option<usize>);

/// One lock of the holder and its bookkeeping.
struct Slot {
    lock: Arc<Handle>,
    /// The lock's name (a semaphore's: its slot's), for `dlock.guard`.
    name: String,
    key: String,
    li: Option<usize>,
    seq: u64,
    last_refusal: Option<Refused>,
    refused_n: u64,
    /// An acquisition thread runs (many-locks mode).
    acquiring: Arc<std::sync::atomic::AtomicBool>,
}

/// `h.record(ev, fields)` with `"li": li` added in the many-locks mode.
fn record(h: &Writer, ev: &str, li: Option<usize>, mut fields: serde_json::Value) {
    if let (Some(i), Some(m)) = (li, fields.as_object_mut()) {
        m.insert("li".into(), i.into());
    }
    h.record(ev, fields);
}

/// Records the lock's events (state changes, fences, acquisitions).
fn watch_events(lock: &dlock::Lock, h: &Arc<Writer>, li: Option<usize>) {
    let hh = h.clone();
    lock.on_event(move |e| {
        let at = e.at().as_nanos();
        match *e {
            LockEvent::State { change, .. } => record(
                &hh,
                "state",
                li,
                json!({"at": at, "wall": wall(), "from": change.from.as_str().to_lowercase(),
                       "to": change.to.as_str().to_lowercase(), "reason": change.reason.to_string()}),
            ),
            LockEvent::Fence {
                token, in_flight, ..
            } => record(
                &hh,
                "fence",
                li,
                json!({"at": at, "token": token.get(), "in_flight": in_flight}),
            ),
            LockEvent::Acquired { token, .. } => {
                record(&hh, "acquired", li, json!({"at": at, "token": token.get()}))
            }
            LockEvent::Drained { .. } => record(&hh, "drained", li, json!({"at": at})),
            _ => {}
        }
    });
}

/// `--rwlock`: the generator of a holder's hold lengths, seeded from its
/// id (FNV-1a): a holder's sequence is the same from run to run (the
/// Python, Node and `dlock run` holders draw the same one).
fn rw_rng(id: &str) -> crate::Rng {
    crate::Rng::new(id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }))
}

/// `--rwlock`: how many units the holder holds for before it hands over,
/// in [20, 200].
fn rw_units(rng: &mut crate::Rng) -> u64 {
    20 + rng.below(181)
}

/// Seconds of the wall clock (`CLOCK_REALTIME`, which libfaketime may
/// step), to show a step happened.
fn wall() -> i64 {
    match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

/// The holder's connection to the gate, reopened after an error.
struct GateConn {
    addr: SocketAddr,
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
}

impl GateConn {
    fn new(addr: SocketAddr) -> GateConn {
        GateConn { addr, conn: None }
    }

    /// A read (`r`) or write (`w`) of the two-key register: as
    /// [`GateConn::write`].
    fn register(&mut self, id: &str, token: u64, seq: u64, mode: char) -> &'static str {
        self.send(&format!("{id} {token} {seq} {mode}\n"))
    }

    /// `ok`, `refused`, or `unknown` (no answer after the request went out).
    fn write(&mut self, id: &str, token: u64, seq: u64, li: Option<usize>) -> &'static str {
        self.send(&match li {
            Some(i) => format!("{id} {token} {seq} {i}\n"),
            None => format!("{id} {token} {seq}\n"),
        })
    }

    fn send(&mut self, line: &str) -> &'static str {
        if self.conn.is_none() {
            let Ok(s) = TcpStream::connect(self.addr) else {
                return "error";
            };
            let _ = s.set_nodelay(true);
            let Ok(r) = s.try_clone() else { return "error" };
            self.conn = Some((s, BufReader::new(r)));
        }
        let Some((w, r)) = self.conn.as_mut() else {
            return "error";
        };
        if w.write_all(line.as_bytes()).is_err() {
            self.conn = None;
            return "unknown";
        }
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(n) if n > 0 && line.starts_with("ok") => "ok",
            Ok(n) if n > 0 && line.starts_with("stale") => "refused",
            _ => {
                self.conn = None;
                "unknown"
            }
        }
    }
}

/// What a holder process is given: who it is and where things are.
#[derive(Clone, Debug)]
pub struct Spec {
    /// The holder's id (`h1`, ...): its records' `p`.
    pub id: String,
    /// The lock name.
    pub lock: String,
    /// The etcd key written only by guarded writes.
    pub key: String,
    /// The gate.
    pub gate: SocketAddr,
    /// The history directory (the holder writes `<dir>/<id>.jsonl`).
    pub dir: PathBuf,
    /// Settings.
    pub settings: Settings,
    /// More flags (`--unit-ms`, `--pause-self-after`, ...).
    pub extra: Vec<String>,
}

/// A running holder process behind one fault proxy per member.
pub struct Spawned {
    /// The spec it was started with.
    pub spec: Spec,
    /// One proxy per member, in member order.
    pub proxies: Vec<Proxy>,
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Spawned {
    /// Starts `program prefix... --id ...` (the holder protocol) with a
    /// fresh proxy to each of `members`. `wrap` runs before the program
    /// (e.g. `faketime`), `env` is added to its environment.
    pub fn start(
        program: &Path,
        prefix: &[String],
        members: &[SocketAddr],
        spec: Spec,
        wrap: &[String],
        env: &[(String, String)],
    ) -> std::io::Result<Spawned> {
        Spawned::start_via(
            program,
            prefix,
            members,
            &|a| format!("http://{a}"),
            spec,
            wrap,
            env,
        )
    }

    /// [`Spawned::start`] with the holder's endpoint of each proxy made by
    /// `endpoint` from the proxy's address (PostgreSQL: the server's URL
    /// with the proxy's host and port).
    pub fn start_via(
        program: &Path,
        prefix: &[String],
        members: &[SocketAddr],
        endpoint: &dyn Fn(SocketAddr) -> String,
        spec: Spec,
        wrap: &[String],
        env: &[(String, String)],
    ) -> std::io::Result<Spawned> {
        let proxies: Vec<Proxy> = members.iter().map(|&m| Proxy::start(m)).collect();
        let urls: Vec<String> = proxies.iter().map(|p| endpoint(p.addr())).collect();
        let mut cmd = if let Some((first, rest)) = wrap.split_first() {
            let mut c = Command::new(first);
            c.args(rest).arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.args(prefix)
            .args(["--id", &spec.id, "--endpoints", &urls.join(",")])
            .args(["--lock", &spec.lock, "--key", &spec.key])
            .args(["--gate", &spec.gate.to_string()])
            .arg("--history")
            .arg(spec.dir.join(format!("{}.jsonl", spec.id)))
            .args(spec.settings.args())
            .args(&spec.extra)
            // cargo test's library path lists target/debug/deps first: a C
            // holder must load the release libdlock.so it was linked with.
            .env_remove("LD_LIBRARY_PATH")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            // A process group of its own, which the nemesis signals: a
            // holder of several processes (the `dlock run` one in the
            // read/write mode: dlock under run_holder.py) is paused or
            // killed whole.
            .process_group(0);
        let mut child = cmd.spawn()?;
        let stdin = child.stdin.take();
        Ok(Spawned {
            spec,
            proxies,
            child,
            stdin,
        })
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the holder's process group.
    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's group.
        unsafe { libc::kill(-self.pid(), sig) };
    }

    /// Closes stdin (the holder records `final` and exits), after a SIGCONT
    /// in case it was stopped.
    pub fn end_input(&mut self) {
        self.signal(libc::SIGCONT);
        drop(self.stdin.take());
    }

    /// [`Spawned::end_input`], then waits up to `wait` for the holder to
    /// exit, then kills it.
    pub fn finish(mut self, wait: Duration) {
        self.end_input();
        let end = std::time::Instant::now() + wait;
        while std::time::Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal(libc::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILL (the group), and reap.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
