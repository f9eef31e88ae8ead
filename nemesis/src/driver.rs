//! The nemesis run: the gate, N holder processes (each behind one fault
//! proxy per member), and a nemesis that every few seconds picks a fault,
//! records it, heals it, and waits for the lock to be worked again; at the
//! end the etcd key's history is read back into the history directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::gate::Gate;
use crate::history::{Writer, now};
use crate::holder::{Spawned, Spec};
use crate::proxy::Mode;
use crate::{Rng, Settings};

/// The faults the nemesis picks from.
pub const FAULTS: &[&str] = &[
    "blackhole",
    "replies_lost",
    "delay_short",
    "delay_long",
    "tcp_reset",
    "flapping",
    "pause_short",
    "pause_long",
    "holder_killed",
    "member_paused",
    "leader_restarted",
    "quorum_lost",
    "lease_revoked",
    "key_deleted",
];

/// The faults of the PostgreSQL mode: the holder's network and process
/// faults, the primary paused and restarted, an operator's deletes. (No
/// member kills or quorum loss: one primary, a synchronous standby that is
/// never promoted here; `core/tests/postgres_failover.rs` covers promotion.)
pub const PG_FAULTS: &[&str] = &[
    "blackhole",
    "replies_lost",
    "delay_short",
    "delay_long",
    "tcp_reset",
    "flapping",
    "pause_short",
    "pause_long",
    "holder_killed",
    "primary_paused",
    "primary_restarted",
    "standby_paused",
    "lease_revoked",
    "key_deleted",
];

/// The lock service under test.
#[derive(Clone, Debug, Default)]
pub enum Backend {
    /// The 3-member cluster of `scripts/etcd-cluster.sh` (its env).
    #[default]
    Etcd,
    /// A PostgreSQL primary (with a synchronous standby): holders reach it
    /// for dlock through a proxy each, and write `app.writes` straight.
    Postgres {
        /// The server's URL (`DLOCK_TEST_PG_URL`).
        url: String,
        /// The primary's data of `scripts/pg-cluster.sh`, for the faults
        /// `primary_paused` and `primary_restarted` (none: not injected).
        primary: Option<crate::pg::Primary>,
    },
}

impl Backend {
    /// The fault kinds of this backend.
    pub fn faults(&self) -> &'static [&'static str] {
        match self {
            Backend::Etcd => FAULTS,
            Backend::Postgres { .. } => PG_FAULTS,
        }
    }

    /// The fault kinds this backend can inject here (without the primary's
    /// directory, not its pause and restart).
    pub fn default_faults(&self) -> Vec<String> {
        self.faults()
            .iter()
            .filter(|k| {
                !matches!(self, Backend::Postgres { primary: None, .. })
                    || !(k.starts_with("primary_") || k.starts_with("standby_"))
            })
            .map(|k| k.to_string())
            .collect()
    }

    /// The PostgreSQL mode of the environment of `scripts/pg-cluster.sh`
    /// (`DLOCK_TEST_PG_URL`, `DLOCK_TEST_PG_DIR`), `url` instead of its
    /// URL when given.
    pub fn postgres_from_env(url: Option<String>) -> Result<Backend, String> {
        let primary = std::env::var("DLOCK_TEST_PG_DIR")
            .ok()
            .filter(|d| !d.is_empty())
            .map(|d| crate::pg::Primary { dir: d.into() });
        let url = match url.filter(|u| !u.is_empty()) {
            Some(u) => u,
            None => std::env::var("DLOCK_TEST_PG_URL").map_err(|_| {
                "no PostgreSQL: give --pg-url, or `scripts/pg-cluster.sh start` and source its env file"
                    .to_owned()
            })?,
        };
        if !crate::pg::is_url(&url) {
            return Err(format!("not a PostgreSQL URL: {url}"));
        }
        Ok(Backend::Postgres { url, primary })
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// History directory (created; must not hold an older history).
    pub dir: PathBuf,
    /// How long the nemesis injects faults.
    pub duration: Duration,
    /// Holder processes.
    pub holders: usize,
    /// Seed of the fault sequence.
    pub seed: u64,
    /// The faults to pick from (names of [`FAULTS`]).
    pub faults: Vec<String>,
    /// Holder settings.
    pub settings: Settings,
    /// How long a flapping connection flaps.
    pub flap: Duration,
    /// Locks per holder: 1, or the second mode (N locks on one session of
    /// each holder, all holders contending for the same N).
    pub locks: usize,
    /// The election mode: holders are candidates of an election (each
    /// given `--election 1`: the holder of every face takes it, the `dlock
    /// run` one as `dlock elect`), and an observer (`client.observe`, straight to the members)
    /// records every event it reports in `observer.jsonl`.
    pub election: bool,
    /// The semaphore mode (0: off): holders contend for one semaphore of
    /// this many slots (each given `--semaphore N`), every record of a
    /// slot tagged `li` (its slot), each slot's resource `KEY-<slot>`.
    pub semaphore: u32,
    /// The read/write mode: holders of one read/write lock, odd ones
    /// (`h1`, `h3`, ...) starting as writers and even ones as readers
    /// (`--rwlock w|r`; each holder then switches mode at every handover),
    /// each unit a write or a read of the gate's two-key register.
    pub rwlock: bool,
    /// Holder programs with their leading arguments (the Rust holder: this
    /// binary, `holder`), taken in turn: the first holders run entries 0,
    /// 1, ... (mod len), so faces mix; a killed holder's replacement runs
    /// the killed one's entry, so the mix stays as started.
    pub holder: Vec<(PathBuf, Vec<String>)>,
    /// etcd, or PostgreSQL.
    pub backend: Backend,
}

/// `"prog arg..;prog arg.."` (`--holder-cmds`): holder commands taken in
/// turn; `rust` (or an empty list) is the Rust holder, `exe holder`.
pub fn holder_cmds(cmds: &str, exe: &Path) -> Result<Vec<(PathBuf, Vec<String>)>, String> {
    if cmds.trim().is_empty() {
        return Ok(vec![(exe.to_owned(), vec!["holder".into()])]);
    }
    cmds.split(';')
        .map(|c| {
            let mut w = c.split_whitespace().map(str::to_owned);
            let prog = w.next().ok_or("--holder-cmds: an empty command")?;
            let prog = if prog == "rust" {
                exe.to_owned()
            } else {
                PathBuf::from(prog)
            };
            let mut args: Vec<String> = w.collect();
            if prog == exe && args.is_empty() {
                args.push("holder".into());
            }
            Ok((prog, args))
        })
        .collect()
}

/// The run's own records: faults, heals.
struct Nemesis {
    /// The etcd cluster (none on PostgreSQL).
    cluster: Option<Cluster>,
    gate: Gate,
    holders: Vec<Spawned>,
    /// The `cfg.holder` entry each of `holders` runs.
    faces: Vec<usize>,
    members: Vec<SocketAddr>,
    next_id: usize,
    spec: Spec,
    cfg: Config,
    log: Writer,
    rng: Rng,
}

/// Runs the nemesis; returns the history directory.
pub fn run(cfg: Config) -> Result<PathBuf, String> {
    let pg_url = match &cfg.backend {
        Backend::Postgres { url, .. } => Some(url.clone()),
        Backend::Etcd => None,
    };
    if pg_url.is_some() && (cfg.locks > 1 || cfg.election) {
        return Err("on PostgreSQL the nemesis runs one lock (no --locks, no --election)".into());
    }
    if cfg.semaphore > 0 && (cfg.locks > 1 || cfg.election) {
        return Err("--semaphore N is a mode of its own (no --locks, no --election)".into());
    }
    if cfg.rwlock && (cfg.locks > 1 || cfg.election || cfg.semaphore > 0) {
        return Err("--rwlock is a mode of its own (no --locks, --election, --semaphore)".into());
    }
    let cluster = pg_url.is_none().then(Cluster::from_env);
    std::fs::create_dir_all(&cfg.dir).map_err(|e| format!("{}: {e}", cfg.dir.display()))?;
    let stamp = format!("{}-{}", std::process::id(), now());
    let gate = Gate::start(&cfg.dir.join("gate.jsonl")).map_err(|e| e.to_string())?;
    let log = Writer::open(&cfg.dir.join("nemesis.jsonl"), "nemesis").map_err(|e| e.to_string())?;
    let spec = Spec {
        id: String::new(),
        lock: format!("nemesis/{stamp}"),
        key: format!("nemesis-resource/{stamp}"),
        gate: gate.addr(),
        dir: cfg.dir.clone(),
        settings: cfg.settings,
        extra: if cfg.semaphore > 0 {
            let mut e = vec!["--semaphore".into(), cfg.semaphore.to_string()];
            if let Some(url) = &pg_url {
                e.extend(["--db".into(), url.clone()]);
            }
            e
        } else if let Some(url) = &pg_url {
            vec!["--db".into(), url.clone()]
        } else if cfg.locks > 1 {
            vec!["--locks".into(), cfg.locks.to_string()]
        } else if cfg.election {
            vec!["--election".into(), "1".into()]
        } else {
            Vec::new()
        },
    };
    log.record(
        "run",
        json!({"seed": cfg.seed, "holders": cfg.holders, "lock": spec.lock, "key": spec.key,
               "seconds": cfg.duration.as_secs(), "faults": cfg.faults, "election": cfg.election,
               "semaphore": (cfg.semaphore > 0).then_some(cfg.semaphore),
               "rwlock": cfg.rwlock,
               "ttl_ms": cfg.settings.ttl.as_millis() as u64,
               "backend": if pg_url.is_some() { "postgres" } else { "etcd" }}),
    );
    let members = match (&cluster, &pg_url) {
        (Some(c), _) => (0..3).map(|i| c.member_addr(i)).collect(),
        (None, Some(url)) => {
            crate::pg::setup(url)?;
            vec![crate::pg::addr_of(url)?]
        }
        (None, None) => unreachable!("etcd has a cluster"),
    };
    let mut n = Nemesis {
        cluster,
        gate,
        holders: Vec::new(),
        faces: Vec::new(),
        members,
        next_id: 1,
        spec,
        rng: Rng::new(cfg.seed),
        cfg,
        log,
    };
    let observer = if n.cfg.election {
        let c = n.cluster.as_ref().expect("the election mode runs on etcd");
        Some(Observing::start(c, &n.spec.lock, &n.cfg)?)
    } else {
        None
    };
    for i in 0..n.cfg.holders {
        n.spawn(i % n.cfg.holder.len())?;
    }
    // First work before the first fault.
    n.wait_for_work(now(), Duration::from_secs(20));
    let end = Instant::now() + n.cfg.duration;
    // A shuffled bag of every fault, refilled when empty: each kind comes
    // up as often as the others, in a random order.
    let mut bag: Vec<String> = Vec::new();
    while Instant::now() < end {
        if bag.is_empty() {
            bag = n.cfg.faults.clone();
            for i in (1..bag.len()).rev() {
                bag.swap(i, n.rng.below(i as u64 + 1) as usize);
            }
        }
        let kind = bag.pop().unwrap_or_default();
        n.replace_exited()?;
        if !n.fault(&kind)? {
            // Skipped (an operator fault when nobody held): it comes up
            // again at the bottom of this bag, so every kind still runs.
            bag.insert(0, kind);
        }
        let gap = n
            .rng
            .between(Duration::from_millis(500), Duration::from_millis(2000));
        std::thread::sleep(gap);
    }
    // Settle: a healthy cluster and network for two TTLs.
    let settle = now();
    n.log.record("settle", json!({}));
    n.wait_for_work(settle, n.cfg.settings.ttl + Duration::from_secs(2));
    std::thread::sleep(n.cfg.settings.ttl * 2);
    if let Some(o) = observer {
        o.stop();
    }
    n.log.record("end", json!({}));
    // Every holder's stdin closed at once, then each waited for: the
    // `final` records are taken together, before a holder that releases on
    // its way out (Node, Python's atexit, `dlock run`) hands the lock on.
    for h in &mut n.holders {
        h.end_input();
    }
    for h in n.holders.drain(..) {
        h.finish(Duration::from_secs(5));
    }
    if let (Some(url), true) = (&pg_url, n.cfg.semaphore > 0) {
        let mut rows = 0;
        for i in 0..n.cfg.semaphore {
            let key = format!("{}-{i}", n.spec.key);
            let path = n.cfg.dir.join(format!("postgres-{i}.jsonl"));
            rows += crate::pg::dump_rows_of(url, &key, &path, Some(i as usize))?;
        }
        eprintln!("nemesis: {rows} rows of app.writes read back");
    } else if let Some(url) = &pg_url {
        let rows = crate::pg::dump_rows(url, &n.spec.key, &n.cfg.dir.join("postgres.jsonl"))?;
        eprintln!("nemesis: {rows} rows of app.writes read back");
    } else if n.cfg.semaphore > 0 || n.cfg.locks > 1 {
        let cluster = n.cluster.as_ref().expect("etcd");
        for i in 0..n.cfg.locks.max(n.cfg.semaphore as usize) {
            let key = format!("{}-{i}", n.spec.key);
            dump_etcd_lock(
                cluster,
                &key,
                &n.cfg.dir.join(format!("etcd-{i}.jsonl")),
                Some(i),
            )?;
        }
    } else {
        let cluster = n.cluster.as_ref().expect("etcd");
        dump_etcd(cluster, &n.spec.key, &n.cfg.dir.join("etcd.jsonl"))?;
    }
    Ok(n.cfg.dir.clone())
}

/// The election mode's observer: a thread that records each event of
/// `client.observe(name)` (`observed`, `kind` and the leader's `token`,
/// `key`, `value`) as `p` `observer`, until stopped.
struct Observing {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Observing {
    fn start(cluster: &Cluster, name: &str, cfg: &Config) -> Result<Observing, String> {
        let log =
            Writer::open(&cfg.dir.join("observer.jsonl"), "observer").map_err(|e| e.to_string())?;
        let config =
            dlock::EtcdConfig::parse(&cluster.members.join(",")).map_err(|e| e.to_string())?;
        let client =
            dlock::Client::etcd(config, cfg.settings.options()).map_err(|e| e.to_string())?;
        let obs = client.observe(name).map_err(|e| e.to_string())?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            let _client = client;
            while !halt.load(std::sync::atomic::Ordering::Acquire) {
                let e = match obs.recv_blocking(Some(Duration::from_millis(100))) {
                    Ok(Some(e)) => e,
                    Ok(None) => break,
                    Err(_) => continue,
                };
                let kind = match &e {
                    dlock::Observed::Leader(_) => "leader",
                    dlock::Observed::Proclaimed(_) => "proclaimed",
                    dlock::Observed::NoLeader => "no_leader",
                    dlock::Observed::Reconnecting => "reconnecting",
                    _ => "other",
                };
                let mut f = json!({"kind": kind});
                if let Some(l) = e.leader() {
                    f["token"] = l.token.get().into();
                    f["key"] = l.key.clone().into();
                    f["value"] = String::from_utf8_lossy(&l.value).into_owned().into();
                }
                log.record("observed", f);
            }
        });
        Ok(Observing { stop, thread })
    }

    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = self.thread.join();
    }
}

impl Nemesis {
    /// Restarts member `m` (0-based), trying again when the cluster script
    /// fails (once a killed member's port was still taken under load): a
    /// harness hiccup is recorded, it does not end the run.
    fn restart(&mut self, m: usize) {
        for attempt in 1..=5 {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.etcd().restart_member(m)
            }));
            match r {
                Ok(()) => return,
                Err(_) => {
                    self.log.record(
                        "restart_retry",
                        json!({"member": m + 1, "attempt": attempt}),
                    );
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
        panic!("member m{} did not restart in 5 attempts", m + 1);
    }

    /// Starts a holder of `cfg.holder[face]`.
    fn spawn(&mut self, face: usize) -> Result<(), String> {
        let mut spec = self.spec.clone();
        spec.id = format!("h{}", self.next_id);
        if self.cfg.rwlock {
            // The first mode (the holders switch at every handover): h1 a
            // writer, so the register is written before it is read.
            let mode = if self.next_id % 2 == 1 { "w" } else { "r" };
            spec.extra.extend(["--rwlock".into(), mode.into()]);
        }
        self.next_id += 1;
        let (prog, prefix) = &self.cfg.holder[face];
        let h = match &self.cfg.backend {
            Backend::Postgres { url, .. } => {
                let url = url.clone();
                let via = move |a: SocketAddr| crate::pg::via(&url, a);
                Spawned::start_via(prog, prefix, &self.members, &via, spec, &[], &[])
            }
            Backend::Etcd => Spawned::start(prog, prefix, &self.members, spec, &[], &[]),
        }
        .map_err(|e| format!("{}: {e}", prog.display()))?;
        self.log
            .record("holder", json!({"id": h.spec.id, "pid": h.pid()}));
        self.holders.push(h);
        self.faces.push(face);
        Ok(())
    }

    /// A holder that exited by itself (it failed: no fault kills but
    /// `holder_killed`, which replaces it at once) is recorded as
    /// `holder_exited` and replaced by one of its face, so the run goes on
    /// with as many holders; the cases count these records.
    fn replace_exited(&mut self) -> Result<(), String> {
        let mut i = 0;
        while i < self.holders.len() {
            if self.holders[i].exited() {
                let h = self.holders.remove(i);
                self.log.record("holder_exited", json!({"id": h.spec.id}));
                let face = self.faces.remove(i);
                self.spawn(face)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// The etcd cluster (etcd faults only come up on etcd).
    fn etcd(&mut self) -> &mut Cluster {
        self.cluster.as_mut().expect("an etcd fault on etcd")
    }

    /// Waits until the gate accepts a write after `since` (or `max`).
    fn wait_for_work(&self, since: u64, max: Duration) -> bool {
        let end = Instant::now() + max;
        while Instant::now() < end {
            if self.gate.last_accept() > since {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// A holder to hit: the one the gate heard from last half the time
    /// (whose faults matter most), else any.
    fn target(&mut self) -> usize {
        let last = self.gate.last_holder();
        if self.rng.below(2) == 0 {
            if let Some(i) = self
                .holders
                .iter()
                .position(|h| Some(&h.spec.id) == last.as_ref())
            {
                return i;
            }
        }
        self.rng.below(self.holders.len() as u64) as usize
    }

    fn record(&self, ev: &str, kind: &str, extra: Value) {
        let mut v = json!({"kind": kind});
        if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
            m.extend(e);
        }
        self.log.record(ev, v);
    }

    /// Injects `kind`, then waits for the heal; `false`: skipped (an
    /// operator fault with nobody holding), nothing injected.
    fn fault(&mut self, kind: &str) -> Result<bool, String> {
        let s = self.cfg.settings;
        let i = self.target();
        let who = self.holders[i].spec.id.clone();
        let pg = matches!(self.cfg.backend, Backend::Postgres { .. });
        let mode_for = |m: Mode, d: Duration, this: &mut Nemesis| {
            this.record(
                "fault",
                kind,
                json!({"target": who, "ms": d.as_millis() as u64}),
            );
            for p in &this.holders[i].proxies {
                p.set(m);
            }
            std::thread::sleep(d);
            for p in &this.holders[i].proxies {
                // A TCP connection never carries bytes again after losing
                // some: lost replies end in a reset, as a real link's
                // would. Without it PostgreSQL's wire protocol (no framing
                // check) reads a later reply as an earlier request's: two
                // grants answered with one lease, the stray one revoked,
                // the reacquisition looping (docs/nemesis.md). etcd's
                // HTTP/2 framing notices the gap and reconnects by itself.
                if m == Mode::DropReplies && pg {
                    p.reset();
                }
                p.set(Mode::Pass);
            }
        };
        match kind {
            "blackhole" => {
                let d = self
                    .rng
                    .between(Duration::from_secs(1), s.ttl + Duration::from_secs(2));
                mode_for(Mode::Blackhole, d, self)
            }
            "replies_lost" => {
                let d = self
                    .rng
                    .between(Duration::from_secs(1), s.ttl + Duration::from_secs(2));
                mode_for(Mode::DropReplies, d, self)
            }
            "delay_short" => mode_for(Mode::Delay(s.timeout * 3 / 5), Duration::from_secs(3), self),
            "delay_long" => mode_for(Mode::Delay(s.timeout * 3), Duration::from_secs(4), self),
            "tcp_reset" => {
                self.record("fault", kind, json!({"target": who}));
                for p in &self.holders[i].proxies {
                    p.reset();
                }
            }
            "flapping" => {
                self.record(
                    "fault",
                    kind,
                    json!({"target": who, "ms": self.cfg.flap.as_millis() as u64}),
                );
                let end = Instant::now() + self.cfg.flap;
                while Instant::now() < end {
                    for p in &self.holders[i].proxies {
                        p.reset();
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            }
            "pause_short" | "pause_long" => {
                let d = if kind == "pause_short" {
                    Duration::from_millis(300)
                } else {
                    s.ttl + Duration::from_secs(1)
                };
                self.record(
                    "fault",
                    kind,
                    json!({"target": who, "ms": d.as_millis() as u64}),
                );
                self.holders[i].signal(libc::SIGSTOP);
                std::thread::sleep(d);
                self.holders[i].signal(libc::SIGCONT);
                self.record("resume", kind, json!({"target": who}));
            }
            "holder_killed" => {
                self.record("fault", kind, json!({"target": who}));
                self.holders.remove(i).kill();
                let face = self.faces.remove(i);
                self.spawn(face)?;
            }
            "primary_paused" | "primary_restarted" | "standby_paused" | "lease_revoked"
            | "key_deleted"
                if matches!(self.cfg.backend, Backend::Postgres { .. }) =>
            {
                if !self.pg_fault(kind)? {
                    return Ok(false);
                }
            }
            "member_paused" => {
                let m = self.rng.below(3) as usize;
                let pid = self.etcd().pid(m);
                self.record("fault", kind, json!({"member": m + 1}));
                // SAFETY: kill(2) on a member of the test cluster.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_secs(2));
                unsafe { libc::kill(pid, libc::SIGCONT) };
            }
            "leader_restarted" => {
                let m = self.etcd().leader();
                self.record("fault", kind, json!({"member": m + 1}));
                self.restart(m);
            }
            "quorum_lost" => {
                let keep = self.rng.below(3) as usize;
                let stop: Vec<usize> = (0..3).filter(|&m| m != keep).collect();
                self.record(
                    "fault",
                    kind,
                    json!({"members": stop.iter().map(|m| m + 1).collect::<Vec<_>>()}),
                );
                for &m in &stop {
                    // SAFETY: kill(2) on a member of the test cluster.
                    unsafe { libc::kill(self.etcd().pid(m), libc::SIGSTOP) };
                }
                std::thread::sleep(self.rng.between(Duration::from_secs(1), s.ttl));
                for &m in &stop {
                    self.restart(m);
                }
            }
            "lease_revoked" | "key_deleted" => {
                // Many locks: lock 0's (a revoke fences the whole session).
                // A semaphore: slot 0's (its holder's one slot).
                let name = if self.cfg.semaphore > 0 {
                    format!("{}/slot/0", self.spec.lock)
                } else if self.cfg.locks > 1 {
                    format!("{}-0", self.spec.lock)
                } else {
                    self.spec.lock.clone()
                };
                let Some((token, lease, key)) = lock_key(self.etcd(), &name) else {
                    self.record("fault_skipped", kind, json!({"why": "nobody holds"}));
                    return Ok(false);
                };
                let mut f = json!({"token": token, "lease": lease});
                if self.cfg.locks > 1 {
                    f["li"] = 0.into();
                    f["session"] = (kind == "lease_revoked").into();
                } else if self.cfg.semaphore > 0 {
                    f["li"] = 0.into();
                }
                self.record("fault", kind, f);
                let lease = format!("{lease:x}");
                let args: Vec<&str> = if kind == "lease_revoked" {
                    vec!["lease", "revoke", &lease]
                } else {
                    vec!["del", &key]
                };
                let _ = etcdctl(self.etcd(), &args);
            }
            other => return Err(format!("unknown fault {other:?} (one of {FAULTS:?})")),
        }
        self.healed(kind);
        Ok(true)
    }

    /// Records the heal of `kind` and waits for the lock to be worked again.
    fn healed(&mut self, kind: &str) {
        let s = self.cfg.settings;
        let healed = now();
        self.record("heal", kind, json!({}));
        if !self.wait_for_work(healed, s.ttl + Duration::from_secs(4)) {
            self.record("no_work_after_heal", kind, json!({}));
        }
    }

    /// The faults on the PostgreSQL server (before the heal); `false`:
    /// skipped.
    fn pg_fault(&mut self, kind: &str) -> Result<bool, String> {
        let s = self.cfg.settings;
        let Backend::Postgres { url, primary } = self.cfg.backend.clone() else {
            unreachable!("PostgreSQL faults on PostgreSQL");
        };
        let need_primary = || {
            primary
                .clone()
                .ok_or_else(|| format!("{kind} needs the primary's directory (DLOCK_TEST_PG_DIR)"))
        };
        match kind {
            "primary_paused" | "standby_paused" => {
                // primary: every process of it stopped: no statement, no
                // keepalive, no connection is answered; its clock goes on,
                // so a pause past the TTL expires every lease. standby:
                // every commit on the primary waits for it (synchronous
                // replication): keepalives, acquisitions and the guarded
                // transactions' COMMITs hang, their locks held.
                let primary = need_primary()?;
                let server = kind.trim_end_matches("_paused");
                let d = self
                    .rng
                    .between(Duration::from_secs(1), s.ttl + Duration::from_secs(1));
                self.record("fault", kind, json!({"ms": d.as_millis() as u64}));
                let pids = primary.pause(server);
                std::thread::sleep(d);
                primary.resume(&pids);
            }
            "primary_restarted" => {
                // Killed (immediate stop: crash recovery) and started; the
                // heal is when it commits synchronously again.
                let primary = need_primary()?;
                self.record("fault", kind, json!({}));
                let mut attempt = 0;
                while let Err(e) = primary.restart(&url) {
                    attempt += 1;
                    self.log.record(
                        "restart_retry",
                        json!({"attempt": attempt, "error": e.clone()}),
                    );
                    if attempt == 5 {
                        return Err(format!("the primary did not restart: {e}"));
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
            "lease_revoked" | "key_deleted" => {
                // A semaphore: slot 0's holder.
                let name = if self.cfg.semaphore > 0 {
                    format!("{}/slot/0", self.spec.lock)
                } else {
                    self.spec.lock.clone()
                };
                let Some((token, lease)) = crate::pg::holder_of(&url, &name) else {
                    self.record("fault_skipped", kind, json!({"why": "nobody holds"}));
                    return Ok(false);
                };
                let mut f = json!({"token": token, "lease": lease});
                if self.cfg.semaphore > 0 {
                    f["li"] = 0.into();
                }
                self.record("fault", kind, f);
                let r = if kind == "lease_revoked" {
                    crate::pg::delete_lease(&url, lease)
                } else {
                    crate::pg::delete_lock(&url, token)
                };
                if let Err(e) = r {
                    self.log
                        .record("operator_error", json!({"kind": kind, "error": e}));
                }
            }
            other => return Err(format!("unknown PostgreSQL fault {other:?}")),
        }
        Ok(true)
    }
}

/// The holder of `name` now: (token, lease, key) of the lowest
/// create_revision under `name/`.
fn lock_key(cluster: &Cluster, name: &str) -> Option<(u64, i64, String)> {
    let out = etcdctl(
        cluster,
        &["get", "--prefix", &format!("{name}/"), "-w", "json"],
    )?;
    let v: Value = serde_json::from_str(&out).ok()?;
    let kv = v["kvs"]
        .as_array()?
        .iter()
        .min_by_key(|kv| kv["create_revision"].as_u64().unwrap_or(u64::MAX))?;
    let key = kv["key"].as_str()?;
    let key = String::from_utf8(b64(key)?).ok()?;
    Some((kv["create_revision"].as_u64()?, kv["lease"].as_i64()?, key))
}

/// etcdctl's stdout, or `None` when it fails (a fault may be on).
fn etcdctl(cluster: &Cluster, args: &[&str]) -> Option<String> {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .arg(format!("--endpoints={}", cluster.members.join(",")))
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Standard base64 (etcdctl's JSON keys).
fn b64(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::new();
    for chunk in s.trim_end_matches('=').as_bytes().chunks(4) {
        let mut n = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * k);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// Reads every put of `key` since revision 1 (a watch from the start of
/// the cluster's history; the test cluster is never compacted) into
/// `path`, one `etcd_put` record per revision, `t` 0 (order: `rev`).
pub fn dump_etcd(cluster: &Cluster, key: &str, path: &Path) -> Result<(), String> {
    dump_etcd_lock(cluster, key, path, None)
}

/// [`dump_etcd`], each record tagged `"li": li` when given.
pub fn dump_etcd_lock(
    cluster: &Cluster,
    key: &str,
    path: &Path,
    li: Option<usize>,
) -> Result<(), String> {
    let log = Writer::open(path, "etcd").map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut c = etcd_client::Client::connect(&cluster.members, None)
            .await
            .map_err(|e| format!("etcd: {e}"))?;
        // A loaded cluster may time a request out just after the run
        // (seen once in CI's mix): a read-back hiccup is tried again.
        let mut tries = 0;
        let now = loop {
            match c.get(key, None).await {
                Ok(r) => break r,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("nemesis: etcd get: {e}; again ({tries})");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                Err(e) => return Err(format!("etcd get: {e}")),
            }
        };
        let Some(last) = now.kvs().first().map(|kv| kv.mod_revision()) else {
            return Ok(()); // never written
        };
        let opts = etcd_client::WatchOptions::new().with_start_revision(1);
        let mut w = c.watch(key, Some(opts)).await.map_err(|e| format!("etcd watch: {e}"))?;
        loop {
            let Some(resp) = w.message().await.map_err(|e| format!("etcd watch: {e}"))? else {
                return Err("etcd watch ended early".into());
            };
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                if ev.event_type() != etcd_client::EventType::Put {
                    continue;
                }
                let value = kv.value_str().unwrap_or("");
                let f: Vec<&str> = value.split(':').collect();
                let num = |i: usize| f.get(i).and_then(|s| s.parse::<u64>().ok());
                let mut rec = json!({"rev": kv.mod_revision(), "h": f.first(), "seq": num(1), "token": num(2)});
                if let Some(i) = li {
                    rec["li"] = i.into();
                }
                log.record_at(0, "etcd_put", rec);
                if kv.mod_revision() >= last {
                    return Ok(());
                }
            }
        }
    })
}
