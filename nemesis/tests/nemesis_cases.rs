//! The nemesis and the fault cases the core's matrix lacked (issue 13), on
//! the 3-member test cluster (`scripts/test-nemesis.sh` starts it and runs
//! this `test = false` target by name). Every case runs holder processes
//! (`nemesis holder`, the holder protocol of docs/nemesis.md), reads their
//! history back and judges it with the independent checker
//! (`dlock_nemesis::check`) plus the case's own rules; each prints one
//! `NEMESIS|case|runs|figures` line before it asserts.
//!
//! Cases that disturb the cluster or measure time (the nemesis mix, quorum
//! loss, the wall-clock step, CPU starvation) run alone; the others
//! (paused past the TTL, flapping) share the cluster.
//!
//! Lengths (CI defaults; `scripts/nemesis.sh` sets the long ones):
//! `DLOCK_NEMESIS_SECONDS` (60) the mix, `DLOCK_NEMESIS_ELECTION_SECONDS` (60)
//! the election mode, `DLOCK_NEMESIS_MANY_SECONDS` (60)
//! the mix of the second mode (`DLOCK_NEMESIS_LOCKS`, 100, locks per holder), `DLOCK_NEMESIS_RUNS` (10) runs of
//! each case, `DLOCK_NEMESIS_FLAP_SECONDS` (60) the flapping case,
//! `DLOCK_NEMESIS_CPU_ROUNDS` (1) fence rounds of the CPU case,
//! `DLOCK_NEMESIS_CPU_BUSY` (2) its busy processes,
//! `DLOCK_NEMESIS_SEMAPHORE_SECONDS` (25) the semaphore mode
//! (`DLOCK_NEMESIS_SEMAPHORE`, 3 slots, 5 holders),
//! `DLOCK_NEMESIS_RWLOCK_SECONDS` (25) the read/write mode (6 holders at
//! least);
//! `DLOCK_NEMESIS_HOLDER_CMDS` (the holder commands of the mix, one holder
//! of each at least: scripts/test-nemesis.sh names the five faces), else
//! `DLOCK_NEMESIS_C_HOLDER` (the C holder's path) makes every other holder
//! of the mix a C one.

use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use dlock_nemesis::check::{Report, check};
use dlock_nemesis::cluster::Cluster;
use dlock_nemesis::gate::Gate;
use dlock_nemesis::history::{self, now};
use dlock_nemesis::holder::{Spawned, Spec};
use dlock_nemesis::proxy::Mode;
use dlock_nemesis::{Settings, driver, faces};
use serde_json::Value;

static CLUSTER: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    CLUSTER.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    let alone = CLUSTER.write().unwrap_or_else(|e| e.into_inner());
    heal();
    alone
}

/// Restarts a member that is still unhealthy 5 s into a case that runs
/// alone: a case that failed while a member was down must not fail the
/// next one too (a CI run once lost two cases to one restart).
fn heal() {
    let mut c = cluster();
    for m in 0..3 {
        let healthy = (0..10).any(|_| {
            c.member_healthy(m) || {
                std::thread::sleep(Duration::from_millis(500));
                false
            }
        });
        if !healthy {
            eprintln!(
                "nemesis: member m{} unhealthy before the case: restarting it",
                m + 1
            );
            c.restart_member(m);
        }
    }
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |s| {
        s.parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number"))
    })
}

fn runs() -> usize {
    env_num("DLOCK_NEMESIS_RUNS", 10) as usize
}

/// The test cluster; a missing one fails the case (run
/// scripts/test-nemesis.sh, or source target/etcd/env).
fn cluster() -> Cluster {
    dlock_nemesis::cluster::cluster()
}

/// A fresh history directory of `case`.
fn dir(case: &str) -> PathBuf {
    let base = std::env::var("DLOCK_NEMESIS_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("nemesis"),
        PathBuf::from,
    );
    let d = base.join(format!("{case}-{}", now()));
    std::fs::create_dir_all(&d).expect("history dir");
    d
}

fn holder_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nemesis"))
}

fn members(c: &Cluster) -> Vec<std::net::SocketAddr> {
    (0..3).map(|i| c.member_addr(i)).collect()
}

/// One lock, its resource key and gate, and a directory: what a run's
/// holders share.
struct Bench {
    dir: PathBuf,
    gate: Gate,
    spec: Spec,
    members: Vec<std::net::SocketAddr>,
}

impl Bench {
    fn new(cluster: &Cluster, dir: &Path, tag: &str, settings: Settings) -> Bench {
        let stamp = format!("{tag}-{}-{}", std::process::id(), now());
        let gate = Gate::start(&dir.join(format!("gate-{tag}.jsonl"))).expect("gate");
        let spec = Spec {
            id: String::new(),
            lock: format!("nemesis-case/{stamp}"),
            key: format!("nemesis-case-resource/{stamp}"),
            gate: gate.addr(),
            dir: dir.to_owned(),
            settings,
            extra: Vec::new(),
        };
        Bench {
            dir: dir.to_owned(),
            gate,
            spec,
            members: members(cluster),
        }
    }

    fn holder(&self, id: &str, extra: &[&str]) -> Spawned {
        self.holder_with(id, extra, &[])
    }

    fn holder_with(&self, id: &str, extra: &[&str], env: &[(String, String)]) -> Spawned {
        let mut spec = self.spec.clone();
        spec.id = id.to_owned();
        spec.extra = extra.iter().map(|s| s.to_string()).collect();
        Spawned::start(
            &holder_bin(),
            &["holder".into()],
            &self.members,
            spec,
            &[],
            env,
        )
        .expect("spawn holder")
    }
}

/// The records of `dir` now.
fn records(dir: &Path) -> Vec<Value> {
    history::read_dir(dir).expect("read history")
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// Waits up to `max` for a record of `dir` matching `f`; returns it.
fn wait_for(dir: &Path, max: Duration, f: impl Fn(&Value) -> bool) -> Option<Value> {
    let end = std::time::Instant::now() + max;
    loop {
        if let Some(v) = records(dir).into_iter().find(&f) {
            return Some(v);
        }
        if std::time::Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn by<'a>(p: &'a str, ev: &'a str) -> impl Fn(&Value) -> bool + 'a {
    move |v| s(v, "p") == p && s(v, "ev") == ev
}

/// Appends the history's `etcd_put` records of `key`.
fn dump(cluster: &Cluster, b: &Bench) {
    let tag = b.spec.key.replace('/', "_");
    driver::dump_etcd(
        cluster,
        &b.spec.key,
        &b.dir.join(format!("etcd-{tag}.jsonl")),
    )
    .expect("read the etcd key's history");
}

/// Percentile `p` (0..=100) of `v` (sorted here).
fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i]
}

fn ms(a: u64, b: u64) -> f64 {
    (b as f64 - a as f64) / 1e6
}

/// Prints the figures line, then the checker's table when it found
/// violations, and asserts there are none and no case rule broke.
fn verdict(case: &str, runs: usize, figures: &str, report: &Report, broken: &[String]) {
    println!("NEMESIS|{case}|{runs}|{figures}");
    assert_eq!(report.violation_count(), 0, "{case}: checker violations");
    assert!(broken.is_empty(), "{case}: {broken:#?}");
}

/// The holders of the mix: `DLOCK_NEMESIS_HOLDER_CMDS` (`--holder-cmds`'
/// list, `rust` for this binary's holder; scripts/test-nemesis.sh names the
/// five faces: Rust, C, Python, Node and `dlock run`), else Rust, and the C
/// holder in turn when `DLOCK_NEMESIS_C_HOLDER` names it.
fn mix_holders() -> Vec<(PathBuf, Vec<String>)> {
    if let Ok(cmds) = std::env::var("DLOCK_NEMESIS_HOLDER_CMDS") {
        return driver::holder_cmds(&cmds, &holder_bin()).expect("DLOCK_NEMESIS_HOLDER_CMDS");
    }
    let mut v = vec![(holder_bin(), vec!["holder".to_owned()])];
    if let Some(c) = std::env::var_os("DLOCK_NEMESIS_C_HOLDER").filter(|c| !c.is_empty()) {
        v.push((PathBuf::from(c), Vec::new()));
    }
    v
}

/// The nemesis: at least 4 holders, one per holder command at least
/// (scripts/test-nemesis.sh: one of each of the five faces), the random
/// mix of every fault for `DLOCK_NEMESIS_SECONDS` (60); the checker's
/// table and the table by face are printed, and every face must have run.
#[test]
fn nemesis_mix() {
    mix(
        "mix",
        env_num("DLOCK_NEMESIS_SECONDS", 60),
        1,
        mix_holders(),
        false,
        0,
        false,
    );
}

/// The election mode: candidates of one election, the holders of
/// `DLOCK_NEMESIS_HOLDER_CMDS` in turn, each given `--election 1` (every
/// face: Rust, C, Python and Node campaign, the `dlock run` holder runs
/// `dlock elect`; Rust alone without it), only the leader writes, an
/// observer records every event; the random mix of every fault for
/// `DLOCK_NEMESIS_ELECTION_SECONDS` (60).
/// The checker adds E1 (one leader at a time) and E2 (the observer's
/// leader tokens rise, and it names the last leader).
#[test]
fn nemesis_election() {
    mix(
        "election",
        env_num("DLOCK_NEMESIS_ELECTION_SECONDS", 60),
        1,
        mix_holders(),
        true,
        0,
        false,
    );
}

/// The second mode: 4 Rust holders, 100 locks on one session each, all
/// contending for the same 100; the mix for `DLOCK_NEMESIS_MANY_SECONDS`
/// (60).
#[test]
fn nemesis_many_locks() {
    let holder = vec![(holder_bin(), vec!["holder".to_owned()])];
    let locks = env_num("DLOCK_NEMESIS_LOCKS", 100) as usize;
    mix(
        "many_locks",
        env_num("DLOCK_NEMESIS_MANY_SECONDS", 60),
        locks,
        holder,
        false,
        0,
        false,
    );
}

/// The semaphore mode (issue 29): K = N + 2 holders on one semaphore of
/// N = 3 slots (`DLOCK_NEMESIS_SEMAPHORE`), the holders of the mix's
/// commands in turn (scripts/test-nemesis.sh: the five faces, Rust, C,
/// Python, Node and `dlock run -n`, one each), the random mix of every
/// fault for `DLOCK_NEMESIS_SEMAPHORE_SECONDS` (25). Each slot is checked
/// as a lock of its own (tokens rise per slot, a slot's resource never
/// accepts a lower token, no permit after a deadline), and S1: at no
/// instant more than N holders with valid permits.
#[test]
fn nemesis_semaphore() {
    mix(
        "semaphore",
        env_num("DLOCK_NEMESIS_SEMAPHORE_SECONDS", 25),
        1,
        mix_holders(),
        false,
        env_num("DLOCK_NEMESIS_SEMAPHORE", 3) as u32,
        false,
    );
}

/// The read/write mode (issue 30): holders of one read/write lock, the
/// holders of the mix's commands in turn (scripts/test-nemesis.sh: the
/// five faces, Rust, C, Python, Node and `dlock run --read` / plain
/// `dlock run`), odd ids writers and even ids readers (the driver's
/// `--rwlock w|r`), 6 at least, each unit a read or a write of the gate's
/// two-key register; the random mix of every fault for
/// `DLOCK_NEMESIS_RWLOCK_SECONDS` (25). The checker adds RW1 (no torn
/// read), RW2 (no read older than a lower write before it) and RW3 (the
/// watermarks never go back); the case fails when the register saw no
/// admitted read or no admitted write, or an operation of another mode
/// than its holder recorded (a face that sends the wrong line: the gate
/// contains a reader that writes, the checker cannot see it), and prints
/// the modes each face ran.
#[test]
fn nemesis_rwlock() {
    mix(
        "rwlock",
        env_num("DLOCK_NEMESIS_RWLOCK_SECONDS", 25),
        1,
        mix_holders(),
        false,
        0,
        true,
    );
}

/// The register modes (`r`, `w`) each face's holders ran, from their
/// `write` records of `res` `register`: "python r, rust rw, ...".
fn rw_modes_by_face(recs: &[Value]) -> String {
    rw_modes(recs)
        .iter()
        .map(|(f, m)| format!("{f} {}", m.iter().copied().collect::<String>()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The register modes each face's holders ran, by face.
fn rw_modes(recs: &[Value]) -> std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> {
    use std::collections::{BTreeMap, BTreeSet, HashMap};
    let face_of: HashMap<&str, &str> = recs
        .iter()
        .filter(|v| s(v, "ev") == "start")
        .map(|v| (s(v, "p"), s(v, "face")))
        .collect();
    let mut modes: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for v in recs
        .iter()
        .filter(|v| s(v, "ev") == "write" && s(v, "res") == "register")
    {
        let face = face_of.get(s(v, "p")).copied().unwrap_or("?");
        modes.entry(face).or_default().insert(s(v, "mode"));
    }
    modes
}

/// Register operations the gate saw (`rw_read`, `rw_write`, `rw_refuse`)
/// of another mode than the holder's own `write` record of that `seq`
/// says: "h2 seq 7: recorded r, the gate saw w".
fn rw_mode_mismatches(recs: &[Value]) -> Vec<String> {
    use std::collections::HashMap;
    let recorded: HashMap<(&str, u64), &str> = recs
        .iter()
        .filter(|v| s(v, "ev") == "write" && s(v, "res") == "register")
        .map(|v| ((s(v, "p"), u(v, "seq")), s(v, "mode")))
        .collect();
    recs.iter()
        .filter_map(|v| {
            let seen = match s(v, "ev") {
                "rw_read" => "r",
                "rw_write" => "w",
                "rw_refuse" => s(v, "mode"),
                _ => return None,
            };
            let (h, seq) = (s(v, "h"), u(v, "seq"));
            match recorded.get(&(h, seq)) {
                Some(&m) if m != seen => Some(format!(
                    "{h} seq {seq}: recorded {}, the gate saw {seen}",
                    if m.is_empty() { "no mode" } else { m }
                )),
                _ => None,
            }
        })
        .collect()
}

fn mix(
    case: &str,
    secs: u64,
    locks: usize,
    holder: Vec<(PathBuf, Vec<String>)>,
    election: bool,
    semaphore: u32,
    rwlock: bool,
) {
    let _x = exclusive();
    let d = dir(case);
    let n_faces = holder.len();
    let cfg = driver::Config {
        dir: d.clone(),
        duration: Duration::from_secs(secs),
        holders: if semaphore > 0 {
            semaphore as usize + 2
        } else if rwlock {
            // 6 at least: every face of the five a turn, readers and
            // writers both from the start (the driver alternates the first
            // mode by id; each holder switches at every handover: the
            // figures line lists the modes each face ran).
            (env_num("DLOCK_NEMESIS_HOLDERS", 4) as usize)
                .max(n_faces)
                .max(6)
        } else {
            (env_num("DLOCK_NEMESIS_HOLDERS", 4) as usize).max(n_faces)
        },
        seed: env_num("DLOCK_NEMESIS_SEED", now()),
        faults: driver::FAULTS.iter().map(|s| s.to_string()).collect(),
        settings: Settings::default(),
        flap: Duration::from_secs(env_num("DLOCK_NEMESIS_MIX_FLAP_SECONDS", 10)),
        holder,
        locks,
        election,
        semaphore,
        rwlock,
        backend: driver::Backend::Etcd,
    };
    println!(
        "nemesis {case}: seed {}, {locks} lock(s), history {}",
        cfg.seed,
        d.display()
    );
    driver::run(cfg).expect("nemesis run");
    let recs = records(&d);
    let report = check(&recs);
    let by_face = faces::faces(&recs);
    println!(
        "nemesis {case}, {secs} s: the checker's table\n{}\nby face\n{}",
        report.table(),
        faces::table(&by_face)
    );
    let kinds = report.faults.len();
    let mut broken = Vec::new();
    if by_face.len() < n_faces {
        broken.push(format!(
            "{n_faces} holder commands but records of only {} face(s): {:?}",
            by_face.len(),
            by_face.keys().collect::<Vec<_>>()
        ));
    }
    let leads: Vec<String> = by_face
        .iter()
        .map(|(f, v)| match v.min_lead_ms {
            Some(l) => format!("{f} {l:.1} ms"),
            None => format!("{f} -"),
        })
        .collect();
    let faults: u64 = report.faults.values().sum();
    if faults >= driver::FAULTS.len() as u64 && kinds < driver::FAULTS.len() {
        broken.push(format!("{faults} faults but only {kinds} kinds"));
    }
    if election && report.observed.1 == 0 {
        broken.push("the observer reported no leader".into());
    }
    if semaphore > 0 && report.semaphore != Some(u64::from(semaphore)) {
        broken.push(format!("the checker saw no semaphore of {semaphore} slots"));
    }
    if semaphore > 0 && report.max_valid_holders < 2 {
        broken.push(format!(
            "at most {} holder(s) with valid permits at once: the slots were never shared",
            report.max_valid_holders
        ));
    }
    if rwlock && report.rw_ops.0 == 0 {
        broken.push("the register saw no admitted read".into());
    }
    if rwlock && report.rw_ops.1 == 0 {
        broken.push("the register saw no admitted write".into());
    }
    if rwlock {
        // The holders switch mode at every handover: every face reads and
        // writes.
        let one: Vec<&str> = rw_modes(&recs)
            .into_iter()
            .filter(|(_, m)| m.len() < 2)
            .map(|(f, _)| f)
            .collect();
        if !one.is_empty() {
            broken.push(format!("face(s) that ran one mode only: {one:?}"));
        }
        let wrong = rw_mode_mismatches(&recs);
        if let Some(first) = wrong.first() {
            broken.push(format!(
                "{} register operation(s) of another mode than their holder's, first {first}",
                wrong.len()
            ));
        }
    }
    let elected = if election {
        format!(
            ", smallest handover (last permit deadline -> next election) {:.1} ms, observer {} events ({} leaders), {} proclaims",
            report.min_handover_ms.unwrap_or(f64::NAN),
            report.observed.0,
            report.observed.1,
            report.proclaims.0
        )
    } else if semaphore > 0 {
        format!(
            ", semaphore of {semaphore} slots, {} holders: at most {} with valid permits at once",
            semaphore + 2,
            report.max_valid_holders
        )
    } else if rwlock {
        format!(
            ", register reads / writes admitted / refused {} / {} / {}, modes by face: {}",
            report.rw_ops.0,
            report.rw_ops.1,
            report.rw_ops.2,
            rw_modes_by_face(&recs)
        )
    } else {
        String::new()
    };
    verdict(
        case,
        1,
        &format!(
            "{secs} s, {locks} lock(s): {faults} faults of {kinds} kinds, {} fences, {} writes accepted, {} stale refused, {} unknown, min G1 lead {:.1} ms (by face: {}){elected}",
            report.fences,
            report.accepted.0 + report.accepted.1,
            report.refused.0 + report.refused.1,
            report.unknown.0 + report.unknown.1,
            report.min_lead_ms.unwrap_or(f64::NAN),
            leads.join(", ")
        ),
        &report,
        &broken,
    );
}

/// The nemesis's records of a case (faults, heals) for the checker.
fn nemesis_log(dir: &Path) -> history::Writer {
    history::Writer::open(&dir.join("nemesis.jsonl"), "nemesis").expect("nemesis log")
}

/// Waits for a gate accept after `since` (up to `max`); its time.
fn work_after(b: &Bench, since: u64, max: Duration) -> Option<u64> {
    let end = std::time::Instant::now() + max;
    while std::time::Instant::now() < end {
        let t = b.gate.last_accept();
        if t > since {
            return Some(t);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Quorum lost: 2 of the 3 members stopped (SIGSTOP) past the holder's
/// deadline, then restarted. The holder drains and fences before its
/// deadline passes (no write accepted after), and after the restart the
/// lock is worked again within TTL + 2 s. Short settings (TTL 2 s).
#[test]
fn quorum_loss() {
    let _x = exclusive();
    let mut cluster = cluster();
    let settings = Settings::short();
    let (mut to_fence, mut to_work, mut broken) = (Vec::new(), Vec::new(), Vec::new());
    let mut report = Report::default();
    for run in 0..runs() {
        let d = dir(&format!("quorum-{run}"));
        let b = Bench::new(&cluster, &d, "quorum", settings);
        let holders = [b.holder("a", &[]), b.holder("b", &[])];
        assert!(
            work_after(&b, 0, Duration::from_secs(20)).is_some(),
            "no first write"
        );
        let log = nemesis_log(&d);
        let keep = run % 3;
        let stop: Vec<usize> = (0..3).filter(|&m| m != keep).collect();
        let who = b.gate.last_holder().unwrap_or_default();
        let cut = now();
        log.record(
            "fault",
            serde_json::json!({"kind": "quorum_lost", "members": stop}),
        );
        for &m in &stop {
            // SAFETY: kill(2) on a member of the test cluster.
            unsafe { libc::kill(cluster.pid(m), libc::SIGSTOP) };
        }
        std::thread::sleep(settings.ttl + Duration::from_millis(500));
        for &m in &stop {
            cluster.restart_member(m);
        }
        let healed = now();
        log.record("heal", serde_json::json!({"kind": "quorum_lost"}));
        match work_after(&b, healed, settings.ttl + Duration::from_secs(2)) {
            Some(t) => to_work.push(ms(healed, t)),
            None => broken.push(format!(
                "run {run}: no write accepted within TTL + 2 s of the heal"
            )),
        }
        for h in holders {
            h.finish(Duration::from_secs(5));
        }
        dump(&cluster, &b);
        let recs = records(&d);
        match recs
            .iter()
            .find(|v| s(v, "p") == who && s(v, "ev") == "fence" && u(v, "at") > cut)
        {
            Some(f) if u(f, "at") < healed => to_fence.push(ms(cut, u(f, "at"))),
            other => broken.push(format!(
                "run {run}: holder {who} fence {other:?} not during the outage"
            )),
        }
        merge(&mut report, check(&recs));
    }
    verdict(
        "quorum_loss",
        runs(),
        &format!(
            "cut->fence ms median {:.0} max {:.0}; heal->write ms median {:.0} max {:.0}",
            pct(&mut to_fence, 50.0),
            pct(&mut to_fence, 100.0),
            pct(&mut to_work, 50.0),
            pct(&mut to_work, 100.0)
        ),
        &report,
        &broken,
    );
}

/// Adds `r`'s violations to `into`.
fn merge(into: &mut Report, r: Report) {
    if r.violation_count() > 0 {
        print!("{}", r.table());
    }
    for (k, v) in r.violations {
        into.violations.entry(k).or_default().extend(v);
    }
}

/// A holder SIGSTOPs itself inside a unit of work (after its permit, before
/// its writes) and stays stopped past the TTL; a contender takes the lock
/// and writes. When it resumes, both resources refuse its writes and its
/// next `permit()` is refused at once. The runs go at the same time, each
/// on a lock of its own.
#[test]
fn paused_past_ttl() {
    let _s = shared();
    let cluster = cluster();
    let settings = Settings::default();
    let n = runs();
    let benches: Vec<Bench> = (0..n)
        .map(|i| Bench::new(&cluster, &dir(&format!("paused-{i}")), "paused", settings))
        .collect();
    let paused: Vec<Spawned> = benches
        .iter()
        .map(|b| b.holder("a", &["--pause-self-after", "20"]))
        .collect();
    let mut broken = Vec::new();
    let mut contenders = Vec::new();
    for b in &benches {
        assert!(
            wait_for(&b.dir, Duration::from_secs(20), by("a", "self_pause")).is_some(),
            "holder a never paused"
        );
        contenders.push(b.holder("b", &[]));
    }
    let mut to_refusal = Vec::new();
    for (i, (b, a)) in benches.iter().zip(&paused).enumerate() {
        // The contender's write is accepted only once a's lease expired.
        let took = wait_for(&b.dir, settings.ttl + Duration::from_secs(10), |v| {
            s(v, "ev") == "gate_accept" && s(v, "h") == "b"
        });
        if took.is_none() {
            broken.push(format!("run {i}: the contender never wrote"));
        }
        a.signal(libc::SIGCONT);
    }
    let mut report = Report::default();
    let mut refusals = Vec::new();
    for b in &benches {
        refusals.push(wait_for(&b.dir, Duration::from_secs(10), |v| {
            s(v, "p") == "a" && s(v, "ev") == "refused"
        }));
    }
    for (a, c) in paused.into_iter().zip(contenders) {
        a.finish(Duration::from_secs(5));
        c.finish(Duration::from_secs(5));
    }
    for (i, (b, refused)) in benches.iter().zip(refusals).enumerate() {
        dump(&cluster, b);
        let recs = records(&b.dir);
        let resume = recs.iter().find(|v| by("a", "self_resume")(v));
        let Some(resume) = resume else {
            broken.push(format!("run {i}: no self_resume record"));
            continue;
        };
        let old = u(resume, "token");
        let after: Vec<&Value> = recs
            .iter()
            .filter(|v| s(v, "p") == "a" && u(v, "t") >= u(resume, "t"))
            .collect();
        for res in ["etcd", "gate"] {
            let w = after
                .iter()
                .find(|v| s(v, "ev") == "write" && s(v, "res") == res);
            let want = if res == "etcd" { "fenced" } else { "refused" };
            if w.is_none_or(|w| s(w, "out") != want || u(w, "token") != old) {
                broken.push(format!(
                    "run {i}: a's {res} write after resuming: {w:?}, want {want}"
                ));
            }
        }
        let first = after
            .iter()
            .find(|v| matches!(s(v, "ev"), "permit" | "refused"));
        match first {
            Some(v) if s(v, "ev") == "refused" => {
                to_refusal.push(ms(u(resume, "t"), u(v, "t")));
            }
            other => broken.push(format!(
                "run {i}: a's first permit() after resuming: {other:?}"
            )),
        }
        if refused.is_none() {
            broken.push(format!("run {i}: no refused permit"));
        }
        merge(&mut report, check(&recs));
    }
    verdict(
        "paused_past_ttl",
        n,
        &format!(
            "resume->refused permit ms median {:.1} max {:.1}",
            pct(&mut to_refusal, 50.0),
            pct(&mut to_refusal, 100.0)
        ),
        &report,
        &broken,
    );
}

/// libfaketime's library (Debian `faketime`), or `DLOCK_NEMESIS_FAKETIME_LIB`.
fn faketime_lib() -> PathBuf {
    if let Ok(p) = std::env::var("DLOCK_NEMESIS_FAKETIME_LIB") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1");
    assert!(
        p.exists(),
        "{} missing: install Debian's faketime (scripts/test-nemesis.sh does), or set DLOCK_NEMESIS_FAKETIME_LIB",
        p.display()
    );
    p
}

/// The wall clock steps by +1 h (half the runs) or -1 h under libfaketime
/// while the holder drains, monotonic time left alone
/// (`FAKETIME_DONT_FAKE_MONOTONIC=1`): the fence comes at the deadline the
/// holder had before the step, within 50 ms, and the holder's clock agrees
/// with ours. The runs go at the same time, each on a lock of its own.
#[test]
fn wall_clock_step() {
    let _x = exclusive();
    let cluster = cluster();
    let settings = Settings::default();
    let lib = faketime_lib();
    let n = runs();
    let mut broken = Vec::new();
    let benches: Vec<Bench> = (0..n)
        .map(|i| {
            Bench::new(
                &cluster,
                &dir(&format!("faketime-{i}")),
                "faketime",
                settings,
            )
        })
        .collect();
    let files: Vec<PathBuf> = benches.iter().map(|b| b.dir.join("faketime")).collect();
    let holders: Vec<Spawned> = benches
        .iter()
        .zip(&files)
        .map(|(b, f)| {
            std::fs::write(f, "+0\n").expect("faketime file");
            let env = [
                ("LD_PRELOAD", lib.display().to_string()),
                ("FAKETIME_TIMESTAMP_FILE", f.display().to_string()),
                ("FAKETIME_NO_CACHE", "1".into()),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
            ]
            .map(|(k, v)| (k.to_owned(), v));
            b.holder_with("a", &[], &env)
        })
        .collect();
    for b in &benches {
        assert!(
            work_after(b, 0, Duration::from_secs(20)).is_some(),
            "no first write"
        );
    }
    let cut = now();
    set_all(&holders, Mode::Blackhole);
    let mut lateness = Vec::new();
    let mut report = Report::default();
    for (i, (b, f)) in benches.iter().zip(&files).enumerate() {
        let drain = wait_for(&b.dir, settings.ttl, |v| {
            s(v, "ev") == "state" && s(v, "to") == "draining"
        });
        if drain.is_none() {
            broken.push(format!("run {i}: no drain"));
        }
        let step = if i % 2 == 0 { "+3600\n" } else { "-3600\n" };
        std::fs::write(f, step).expect("step the wall clock");
    }
    for (i, b) in benches.iter().enumerate() {
        let fence = wait_for(
            &b.dir,
            settings.ttl + Duration::from_secs(2),
            by("a", "fence"),
        );
        let seen = now();
        let recs = records(&b.dir);
        let Some(fence) = fence else {
            broken.push(format!("run {i}: no fence"));
            continue;
        };
        // The deadline of the last permit granted before the drain.
        let drain_at = recs
            .iter()
            .find(|v| s(v, "ev") == "state" && s(v, "to") == "draining")
            .map_or(u64::MAX, |v| u(v, "at"));
        let deadline = recs
            .iter()
            .filter(|v| s(v, "ev") == "permit" && u(v, "t0") < drain_at)
            .map(|v| u(v, "deadline"))
            .max()
            .unwrap_or(0);
        let late = ms(deadline, u(&fence, "at"));
        lateness.push(late);
        if !(0.0..=50.0).contains(&late) {
            broken.push(format!(
                "run {i}: fence {late:.1} ms after the deadline before the step"
            ));
        }
        let t = u(&fence, "t");
        if !(cut < t && t <= seen) {
            broken.push(format!(
                "run {i}: the holder's clock disagrees: fence stamped {t}, cut {cut}, seen {seen}"
            ));
        }
        let wall = |v: Option<&Value>| v.and_then(|v| v["wall"].as_i64());
        let w0 = wall(recs.iter().find(|v| s(v, "ev") == "start"));
        let w1 = wall(
            recs.iter()
                .find(|v| s(v, "ev") == "state" && s(v, "to") == "fenced"),
        );
        let want = if i % 2 == 0 { 3600 } else { -3600 };
        match (w0, w1) {
            (Some(a), Some(b)) if ((b - a) - want).abs() < 60 => {}
            other => broken.push(format!(
                "run {i}: the wall clock did not step by {want} s: {other:?}"
            )),
        }
    }
    set_all(&holders, Mode::Pass);
    for (b, h) in benches.iter().zip(holders) {
        // A write of the new token (one in flight at the cut may still land
        // with the old one).
        let fenced = records(&b.dir)
            .iter()
            .find(|v| s(v, "ev") == "fence")
            .map_or(0, |v| u(v, "token"));
        let again = wait_for(&b.dir, settings.ttl + Duration::from_secs(10), |v| {
            s(v, "ev") == "gate_accept" && u(v, "token") > fenced
        });
        if again.is_none() {
            broken.push("no write after the heal".into());
        }
        h.finish(Duration::from_secs(5));
        dump(&cluster, b);
        merge(&mut report, check(&records(&b.dir)));
    }
    verdict(
        "wall_clock_step",
        n,
        &format!(
            "fence - deadline ms median {:.1} max {:.1}",
            pct(&mut lateness, 50.0),
            pct(&mut lateness, 100.0)
        ),
        &report,
        &broken,
    );
}

/// Switches every proxy of every holder to `mode`.
fn set_all(holders: &[Spawned], mode: Mode) {
    for p in holders.iter().flat_map(|h| &h.proxies) {
        p.set(mode);
    }
}

/// Processes killed when dropped.
struct Busy(Vec<std::process::Child>);

impl Drop for Busy {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Two busy processes beside the holders (`DLOCK_NEMESIS_CPU_BUSY`, 2; the
/// benchmark's baseline sets 0): the p99 interval between keepalive sends
/// stays within interval + 200 ms, and nobody fences.
/// Then `DLOCK_NEMESIS_CPU_ROUNDS` rounds cut every holder off to measure
/// how late `on_fence` runs after the deadline (a figure, not a rule).
/// The holders run at the same time, each on a lock of its own.
#[test]
fn cpu_starvation() {
    let _x = exclusive();
    let cluster = cluster();
    let settings = Settings::default();
    let n = runs();
    let rounds = env_num("DLOCK_NEMESIS_CPU_ROUNDS", 1);
    let hold = Duration::from_secs(env_num("DLOCK_NEMESIS_CPU_SECONDS", 12));
    let mut broken = Vec::new();
    let benches: Vec<Bench> = (0..n)
        .map(|i| Bench::new(&cluster, &dir(&format!("cpu-{i}")), "cpu", settings))
        .collect();
    let holders: Vec<Spawned> = benches
        .iter()
        .map(|b| {
            let quiet = [
                "--sample-keepalives",
                "1",
                "--writes",
                "0",
                "--unit-ms",
                "100",
            ];
            b.holder("a", &quiet)
        })
        .collect();
    for b in &benches {
        assert!(
            wait_for(&b.dir, Duration::from_secs(20), by("a", "permit")).is_some(),
            "holder never held"
        );
    }
    let busy = Busy(
        (0..env_num("DLOCK_NEMESIS_CPU_BUSY", 2))
            .map(|_| {
                std::process::Command::new(holder_bin())
                    .arg("busy")
                    .spawn()
                    .expect("busy process")
            })
            .collect(),
    );
    let from = now();
    std::thread::sleep(hold);
    let to = now();
    let mut intervals = Vec::new();
    for (i, b) in benches.iter().enumerate() {
        let recs = records(&b.dir);
        let sends: Vec<u64> = recs
            .iter()
            .filter(|v| s(v, "ev") == "keepalive" && u(v, "sent") >= from && u(v, "sent") <= to)
            .map(|v| u(v, "sent"))
            .collect();
        intervals.extend(sends.windows(2).map(|w| ms(w[0], w[1])));
        if recs.iter().any(|v| s(v, "ev") == "fence") {
            broken.push(format!("run {i}: fenced under CPU starvation"));
        }
    }
    let mut lateness = Vec::new();
    for _ in 0..rounds {
        let cut = now();
        set_all(&holders, Mode::Blackhole);
        for b in &benches {
            let f = wait_for(&b.dir, settings.ttl + Duration::from_secs(2), |v| {
                s(v, "ev") == "fence" && u(v, "t") > cut
            });
            let recs = records(&b.dir);
            let Some(f) = f else {
                broken.push("no fence after a cut".into());
                continue;
            };
            let deadline = recs
                .iter()
                .filter(|v| s(v, "ev") == "permit" && u(v, "token") == u(&f, "token"))
                .map(|v| u(v, "deadline"))
                .max()
                .unwrap_or(0);
            lateness.push(ms(deadline, u(&f, "t")));
        }
        set_all(&holders, Mode::Pass);
        let healed = now();
        for b in &benches {
            if wait_for(&b.dir, settings.ttl + Duration::from_secs(10), |v| {
                s(v, "ev") == "permit" && u(v, "t") > healed
            })
            .is_none()
            {
                broken.push("no permit after the heal".into());
            }
        }
    }
    drop(busy);
    let mut report = Report::default();
    for (b, h) in benches.iter().zip(holders) {
        h.finish(Duration::from_secs(5));
        merge(&mut report, check(&records(&b.dir)));
    }
    let bound = (settings.interval + Duration::from_millis(200)).as_secs_f64() * 1e3;
    let p99 = pct(&mut intervals, 99.0);
    if intervals.len() < 5 * n || p99 > bound {
        broken.push(format!(
            "keepalive interval p99 {p99:.1} ms over {} intervals, bound {bound:.0} ms",
            intervals.len()
        ));
    }
    verdict(
        "cpu_starvation",
        n,
        &format!(
            "keepalive interval ms p50 {:.1} p99 {p99:.1} max {:.1} ({} intervals); on_fence after deadline ms p50 {:.2} p99 {:.2} ({} fences)",
            pct(&mut intervals, 50.0),
            pct(&mut intervals, 100.0),
            intervals.len(),
            pct(&mut lateness, 50.0),
            pct(&mut lateness, 99.0),
            lateness.len()
        ),
        &report,
        &broken,
    );
}

/// File descriptors and resident memory of process `pid`.
fn fds_rss(pid: i32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0);
    (fds, rss)
}

/// Flapping: every connection of every holder reset every 300 ms for
/// `DLOCK_NEMESIS_FLAP_SECONDS` (60): file descriptors and RSS stay within
/// 5 % from 5 s into the flapping to 2 s after it. The holders flap at the
/// same time, each on a lock of its own.
#[test]
fn flapping() {
    let _s = shared();
    let cluster = cluster();
    let settings = Settings::default();
    let n = runs();
    let secs = env_num("DLOCK_NEMESIS_FLAP_SECONDS", 60);
    let mut broken = Vec::new();
    let benches: Vec<Bench> = (0..n)
        .map(|i| Bench::new(&cluster, &dir(&format!("flap-{i}")), "flap", settings))
        .collect();
    let holders: Vec<Spawned> = benches.iter().map(|b| b.holder("a", &[])).collect();
    for b in &benches {
        assert!(
            work_after(b, 0, Duration::from_secs(20)).is_some(),
            "no first write"
        );
    }
    let start = std::time::Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut before = None;
    while std::time::Instant::now() < end {
        for h in &holders {
            for p in &h.proxies {
                p.reset();
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        if before.is_none() && start.elapsed() >= Duration::from_secs(5) {
            before = Some(holders.iter().map(|h| fds_rss(h.pid())).collect::<Vec<_>>());
        }
    }
    std::thread::sleep(Duration::from_secs(2));
    let after: Vec<_> = holders.iter().map(|h| fds_rss(h.pid())).collect();
    let before = before.expect("sampled before");
    let mut fd_growth = Vec::new();
    let mut rss_growth = Vec::new();
    for (i, ((f0, r0), (f1, r1))) in before.iter().zip(&after).enumerate() {
        let fg = (*f1 as f64 - *f0 as f64) / *f0 as f64 * 100.0;
        let rg = (*r1 as f64 - *r0 as f64) / *r0 as f64 * 100.0;
        fd_growth.push(fg);
        rss_growth.push(rg);
        // 5 % of a few dozen descriptors is one or two: round up.
        if f1.abs_diff(*f0) > (*f0 as f64 * 0.05).ceil() as usize || rg.abs() > 5.0 {
            broken.push(format!("run {i}: fds {f0} -> {f1}, RSS {r0} -> {r1} kB"));
        }
    }
    let mut report = Report::default();
    for (b, h) in benches.iter().zip(holders) {
        h.finish(Duration::from_secs(5));
        dump(&cluster, b);
        merge(&mut report, check(&records(&b.dir)));
    }
    verdict(
        "flapping",
        n,
        &format!(
            "{secs} s; fd change % max {:.1}; RSS change % median {:.1} max {:.1}",
            pct(&mut fd_growth, 100.0),
            pct(&mut rss_growth, 50.0),
            pct(&mut rss_growth, 100.0)
        ),
        &report,
        &broken,
    );
}
