//! The nemesis on PostgreSQL (issue 19; docs/nemesis.md, "On PostgreSQL"),
//! on the primary + synchronous standby of `scripts/pg-cluster.sh`
//! (`scripts/test-nemesis.sh` starts it and runs this `test = false`
//! target by name; its env file gives `DLOCK_TEST_PG_URL` and
//! `DLOCK_TEST_PG_DIR`). The resource is the user table `app.writes`,
//! written by each holder's own transaction with `dlock.guard(name, token)`
//! first, over a direct connection; its rows are read back at the end and
//! are the ground truth the checker compares the history with.
//!
//! - `nemesis_postgres`: the random mix of every PostgreSQL fault for
//!   `DLOCK_NEMESIS_PG_SECONDS` (120), Rust and C holders in turn
//!   (`DLOCK_NEMESIS_PG_HOLDER_CMDS`, else Rust and `DLOCK_NEMESIS_C_HOLDER`
//!   when set);
//! - `nemesis_postgres_rwlock`: the read/write mode (issue 30), writers
//!   and readers of one read/write lock on the two-key register
//!   `app.register` under `dlock.guard_write` / `guard_read`, for
//!   `DLOCK_NEMESIS_PG_RWLOCK_SECONDS` (25); the checker adds RW1 and
//!   RW2;
//! - `postgres_paused_past_ttl`: a holder stops itself inside a unit past
//!   its TTL, a contender takes over, the holder resumes into its
//!   transaction: the database refuses it (DL001). Its control, the same
//!   with `--guard 0` (no guard), must be caught by the checker (G2 in
//!   `app.writes`): the check can fail.

use std::path::{Path, PathBuf};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use dlock_nemesis::check::check;
use dlock_nemesis::driver::{self, Backend};
use dlock_nemesis::gate::Gate;
use dlock_nemesis::history::{self, now};
use dlock_nemesis::holder::{Spawned, Spec};
use dlock_nemesis::{Settings, faces, pg};
use serde_json::Value;

static SERVER: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    SERVER.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    SERVER.write().unwrap_or_else(|e| e.into_inner())
}

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |s| {
        s.parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number"))
    })
}

/// The test server; a missing one fails the case.
fn backend() -> Backend {
    Backend::postgres_from_env(None)
        .unwrap_or_else(|e| panic!("{e} (scripts/test-nemesis.sh starts scripts/pg-cluster.sh)"))
}

fn url() -> String {
    match backend() {
        Backend::Postgres { url, .. } => url,
        Backend::Etcd => unreachable!(),
    }
}

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

fn records(dir: &Path) -> Vec<Value> {
    history::read_dir(dir).expect("read history")
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

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

/// The holders of the mix: `DLOCK_NEMESIS_PG_HOLDER_CMDS` (`rust` for this
/// binary's holder), else Rust, and the C holder in turn when
/// `DLOCK_NEMESIS_C_HOLDER` names it.
fn mix_holders() -> Vec<(PathBuf, Vec<String>)> {
    if let Ok(cmds) = std::env::var("DLOCK_NEMESIS_PG_HOLDER_CMDS") {
        return driver::holder_cmds(&cmds, &holder_bin()).expect("DLOCK_NEMESIS_PG_HOLDER_CMDS");
    }
    let mut v = vec![(holder_bin(), vec!["holder".to_owned()])];
    if let Some(c) = std::env::var_os("DLOCK_NEMESIS_C_HOLDER").filter(|c| !c.is_empty()) {
        v.push((PathBuf::from(c), Vec::new()));
    }
    v
}

/// The nemesis on PostgreSQL: 4 holders (the holder commands in turn),
/// every PostgreSQL fault in a shuffled bag for `DLOCK_NEMESIS_PG_SECONDS`
/// (120); the checker on the history with the table's rows read back.
#[test]
fn nemesis_postgres() {
    pg_mix(
        "postgres",
        env_num("DLOCK_NEMESIS_PG_SECONDS", 120),
        mix_holders(),
        0,
        false,
    );
}

/// The semaphore mode on PostgreSQL (issue 29): K = N + 2 holders of the
/// mix's commands in turn (Rust and C) on one semaphore of N = 2 slots,
/// every PostgreSQL fault for
/// `DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS` (25); each slot's rows of
/// `app.writes` read back on their own; the checker adds S1 (at no
/// instant more than N holders with valid permits).
#[test]
fn nemesis_postgres_semaphore() {
    let secs = env_num("DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS", 25);
    if secs == 0 {
        // 0 skips the mode (a quick local run of the others).
        println!("nemesis postgres_semaphore: not run (DLOCK_NEMESIS_PG_SEMAPHORE_SECONDS=0)");
        return;
    }
    pg_mix("postgres_semaphore", secs, mix_holders(), 2, false);
}

/// The read/write mode on PostgreSQL (issue 30): at least 4 holders of
/// one read/write lock, odd ones starting as writers and even ones as
/// readers, each switching mode at every handover (the mix's commands in
/// the order 1..n, n..1, so with Rust and C each face starts in both
/// modes), every PostgreSQL fault for
/// `DLOCK_NEMESIS_PG_RWLOCK_SECONDS` (25). A writer's transaction updates
/// the two keys of `app.register` under `dlock.guard_write`, a reader's
/// selects them under `dlock.guard_read`, one statement per key: the
/// checker's RW1 (no torn read) and RW2 (no read older than a lower write
/// before it) judge the holders' records. Fails on any violation, or when
/// no read or no write was admitted.
#[test]
fn nemesis_postgres_rwlock() {
    let secs = env_num("DLOCK_NEMESIS_PG_RWLOCK_SECONDS", 25);
    if secs == 0 {
        println!("nemesis postgres_rwlock: not run (DLOCK_NEMESIS_PG_RWLOCK_SECONDS=0)");
        return;
    }
    let mut holder = mix_holders();
    let back: Vec<_> = holder.iter().rev().cloned().collect();
    holder.extend(back);
    pg_mix("postgres_rwlock", secs, holder, 0, true);
}

fn pg_mix(
    case: &str,
    secs: u64,
    holder: Vec<(PathBuf, Vec<String>)>,
    semaphore: u32,
    rwlock: bool,
) {
    let _x = exclusive();
    let backend = backend();
    let d = dir(case);
    // The faces: the read/write mode lists each command twice.
    let n_faces = if rwlock {
        holder.len() / 2
    } else {
        holder.len()
    };
    let faults = backend.default_faults();
    let cfg = driver::Config {
        dir: d.clone(),
        duration: Duration::from_secs(secs),
        holders: if semaphore > 0 {
            semaphore as usize + 2
        } else {
            (env_num("DLOCK_NEMESIS_HOLDERS", 4) as usize).max(n_faces)
        },
        seed: env_num("DLOCK_NEMESIS_SEED", now()),
        faults: faults.clone(),
        settings: Settings::default(),
        flap: Duration::from_secs(env_num("DLOCK_NEMESIS_MIX_FLAP_SECONDS", 10)),
        holder,
        locks: 1,
        election: false,
        semaphore,
        rwlock,
        backend,
    };
    println!("nemesis {case}: seed {}, history {}", cfg.seed, d.display());
    driver::run(cfg).expect("nemesis run");
    let recs = records(&d);
    let report = check(&recs);
    let by_face = faces::faces(&recs);
    println!(
        "nemesis {case}, {secs} s: the checker's table\n{}\nby face\n{}",
        report.table(),
        faces::table(&by_face)
    );
    let mut broken = Vec::new();
    if by_face.len() < n_faces {
        broken.push(format!(
            "{n_faces} holder commands but records of only {} face(s): {:?}",
            by_face.len(),
            by_face.keys().collect::<Vec<_>>()
        ));
    }
    let total: u64 = report.faults.values().sum();
    let kinds = report.faults.len();
    if total >= faults.len() as u64 && kinds < faults.len() {
        broken.push(format!(
            "{total} faults but only {kinds} of {} kinds",
            faults.len()
        ));
    }
    // Every holder ran until it was killed or the run ended.
    let exited: Vec<&str> = recs
        .iter()
        .filter(|v| s(v, "ev") == "holder_exited")
        .map(|v| s(v, "id"))
        .collect();
    if !exited.is_empty() {
        broken.push(format!("holders exited by themselves: {exited:?}"));
    }
    // The ground truth was read and compared: rows, and acknowledged
    // writes found among them (the checker's "acknowledged writes kept").
    let rows = recs.iter().filter(|v| s(v, "ev") == "pg_row").count();
    if rwlock {
        // The register: reads and writes admitted.
        let (reads, writes, _) = report.rw_ops;
        if reads == 0 || writes == 0 {
            broken.push(format!(
                "register: {reads} reads and {writes} writes admitted (want both)"
            ));
        }
    } else if rows == 0 || report.accepted.0 == 0 {
        broken.push(format!(
            "{rows} rows of app.writes read back, {} acknowledged",
            report.accepted.0
        ));
    }
    if semaphore > 0
        && (report.semaphore != Some(u64::from(semaphore)) || report.max_valid_holders < 2)
    {
        broken.push(format!(
            "semaphore of {semaphore} slots: the checker saw {:?}, at most {} holders with valid permits at once",
            report.semaphore, report.max_valid_holders
        ));
    }
    let rw = if rwlock {
        // Admitted reads and writes by face (the holders' own records).
        let face_of: std::collections::HashMap<&str, &str> = recs
            .iter()
            .filter(|v| s(v, "ev") == "start")
            .map(|v| (s(v, "p"), s(v, "face")))
            .collect();
        let mut per: std::collections::BTreeMap<&str, (u64, u64)> = Default::default();
        for v in &recs {
            let f = face_of.get(s(v, "p")).copied().unwrap_or("?");
            match s(v, "ev") {
                "rw_read" => per.entry(f).or_default().0 += 1,
                "rw_write" => per.entry(f).or_default().1 += 1,
                _ => {}
            }
        }
        let per: Vec<String> = per
            .iter()
            .map(|(f, (r, w))| format!("{f} {r} / {w}"))
            .collect();
        format!(
            ", register reads / writes admitted / refused {} / {} / {} (reads / writes by face: {})",
            report.rw_ops.0,
            report.rw_ops.1,
            report.rw_ops.2,
            per.join(", ")
        )
    } else {
        String::new()
    };
    let sem = if semaphore > 0 {
        format!(
            ", semaphore of {semaphore} slots, {} holders: at most {} with valid permits at once",
            semaphore + 2,
            report.max_valid_holders
        )
    } else {
        String::new()
    };
    let leads: Vec<String> = by_face
        .iter()
        .map(|(f, v)| match v.min_lead_ms {
            Some(l) => format!("{f} {l:.1} ms"),
            None => format!("{f} -"),
        })
        .collect();
    println!(
        "NEMESIS|{case}|1|{secs} s: {total} faults of {kinds} kinds, {} fences, {} rows, writes accepted {} / {} (app.writes / gate), stale refused {} / {}, unknown {} (committed {}), min G1 lead {:.1} ms (by face: {}){sem}{rw}",
        report.fences,
        rows,
        report.accepted.0,
        report.accepted.1,
        report.refused.0,
        report.refused.1,
        report.unknown.0,
        report.unknown_committed.0,
        report.min_lead_ms.unwrap_or(f64::NAN),
        leads.join(", ")
    );
    assert_eq!(report.violation_count(), 0, "{case}: checker violations");
    assert!(broken.is_empty(), "{case}: {broken:#?}");
}

/// One run of the paused case: a holder `a` that stops itself after its
/// 20th permit (inside the unit, before its write) and a contender `b`;
/// `guard` passed to both (`--guard 0`: the control).
struct Paused {
    dir: PathBuf,
    key: String,
    a: Spawned,
    b: Option<Spawned>,
    spec: Spec,
    _gate: Gate,
    guard: bool,
}

fn start(spec: &Spec, id: &str, extra: &[&str]) -> Spawned {
    let url = url();
    let mut spec = spec.clone();
    spec.id = id.to_owned();
    spec.extra.extend(extra.iter().map(|s| s.to_string()));
    let upstream = pg::addr_of(&url).expect("server address");
    let via = move |a| pg::via(&url, a);
    Spawned::start_via(
        &holder_bin(),
        &["holder".into()],
        &[upstream],
        &via,
        spec,
        &[],
        &[],
    )
    .expect("spawn holder")
}

/// Paused past the TTL inside a unit: the database refuses the resumed
/// holder's write (`fenced`: DL001, the row absent), the gate refuses it,
/// and the checker finds nothing; without the guard (the control) the
/// stale row lands and the checker reports it (G2 in app.writes).
#[test]
fn postgres_paused_past_ttl() {
    let _s = shared();
    let url = url();
    pg::setup(&url).expect("app.writes");
    let settings = Settings::default();
    let runs: Vec<Paused> = [true, true, false]
        .into_iter()
        .enumerate()
        .map(|(i, guard)| {
            let dir = dir(&format!("pg-paused-{i}"));
            let gate = Gate::start(&dir.join("gate.jsonl")).expect("gate");
            let stamp = format!("{i}-{}-{}", std::process::id(), now());
            let g = if guard { "1" } else { "0" };
            let spec = Spec {
                id: String::new(),
                lock: format!("nemesis-pg-case/{stamp}"),
                key: format!("nemesis-pg-case-rows/{stamp}"),
                gate: gate.addr(),
                dir: dir.clone(),
                settings,
                extra: vec!["--db".into(), url.clone(), "--guard".into(), g.into()],
            };
            let a = start(&spec, "a", &["--pause-self-after", "20"]);
            Paused {
                dir,
                key: spec.key.clone(),
                a,
                b: None,
                spec,
                _gate: gate,
                guard,
            }
        })
        .collect();
    let mut runs = runs;
    for r in &mut runs {
        assert!(
            wait_for(&r.dir, Duration::from_secs(30), |v| s(v, "p") == "a"
                && s(v, "ev") == "self_pause")
            .is_some(),
            "holder a never paused"
        );
        r.b = Some(start(&r.spec, "b", &[]));
    }
    let mut broken = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        // b's first row is written once a's lease expired on the server.
        let took = wait_for(&r.dir, settings.ttl + Duration::from_secs(15), |v| {
            s(v, "p") == "b" && s(v, "ev") == "write" && s(v, "res") == "pg" && s(v, "out") == "ok"
        });
        if took.is_none() {
            broken.push(format!("run {i}: the contender never wrote"));
        }
        r.a.signal(libc::SIGCONT);
    }
    let mut figures = Vec::new();
    for (i, r) in runs.into_iter().enumerate() {
        // a's first unit after it resumed: both its writes recorded.
        let resumed = wait_for(&r.dir, Duration::from_secs(15), |v| {
            s(v, "p") == "a" && s(v, "ev") == "self_resume"
        });
        let since = resumed.as_ref().map_or(u64::MAX, |v| u(v, "t"));
        let wrote = wait_for(&r.dir, Duration::from_secs(15), |v| {
            s(v, "p") == "a" && s(v, "ev") == "write" && s(v, "res") == "gate" && u(v, "t") >= since
        });
        if wrote.is_none() {
            broken.push(format!("run {i}: a wrote nothing after resuming"));
        }
        r.a.finish(Duration::from_secs(5));
        if let Some(b) = r.b {
            b.finish(Duration::from_secs(5));
        }
        pg::dump_rows(&url, &r.key, &r.dir.join("postgres.jsonl")).expect("read rows");
        let recs = records(&r.dir);
        let report = check(&recs);
        let Some(resume) = recs
            .iter()
            .find(|v| s(v, "p") == "a" && s(v, "ev") == "self_resume")
        else {
            broken.push(format!("run {i}: no self_resume record"));
            continue;
        };
        let old = u(resume, "token");
        let first = |res: &str| {
            recs.iter()
                .find(|v| {
                    s(v, "p") == "a"
                        && s(v, "ev") == "write"
                        && s(v, "res") == res
                        && u(v, "t") >= u(resume, "t")
                })
                .map(|v| {
                    (
                        s(v, "out").to_owned(),
                        u(v, "token"),
                        s(v, "code").to_owned(),
                    )
                })
        };
        let (pg_w, gate_w) = (first("pg"), first("gate"));
        let g2 = report
            .violations
            .get("G2 no lower token accepted")
            .map_or(0, Vec::len);
        if r.guard {
            if pg_w != Some(("fenced".into(), old, dlock::GUARD_SQLSTATE.into())) {
                broken.push(format!(
                    "run {i}: a's write to app.writes after resuming: {pg_w:?}, want fenced (DL001) with {old}"
                ));
            }
            if report.violation_count() != 0 {
                broken.push(format!("run {i}: the checker:\n{}", report.table()));
            }
            figures.push(format!(
                "guarded: refused {}",
                pg_w.map_or("-".into(), |w| w.2)
            ));
        } else {
            // The control: no guard, so the stale write commits after b's
            // rows; the checker must say so.
            if pg_w.as_ref().map(|w| w.0.as_str()) != Some("ok") || g2 == 0 {
                broken.push(format!(
                    "run {i} (no guard): a's write {pg_w:?}, checker G2 violations {g2}: the control must be caught"
                ));
            }
            figures.push(format!(
                "unguarded: stale row committed, G2 violations {g2}"
            ));
        }
        if gate_w.as_ref().map(|w| w.0.as_str()) != Some("refused") {
            broken.push(format!(
                "run {i}: a's gate write after resuming: {gate_w:?}"
            ));
        }
    }
    println!("NEMESIS|pg_paused_past_ttl|3|{}", figures.join("; "));
    assert!(broken.is_empty(), "{broken:#?}");
}
