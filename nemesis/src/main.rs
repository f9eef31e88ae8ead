//! `nemesis`: the nemesis run, the Rust holder, the checker, and a busy
//! loop for the CPU-starvation case. See `docs/nemesis.md`.
//!
//! ```text
//! nemesis run --dir DIR [--seconds 180] [--holders 4] [--seed N]
//!             [--faults a,b,..] [--flap-ms 10000] [--holder-cmds "rust;prog args"]
//!             [--locks 100] [--election 1] [--semaphore N] [--rwlock 1]
//!             [--backend etcd|postgres] [--pg-url URL]
//! nemesis check DIR
//! nemesis dump --dir DIR      (the etcd key's history, after a run cut short)
//! nemesis holder --id ID --endpoints URLS --lock NAME --key KEY --gate ADDR --history FILE ...
//! nemesis busy
//! nemesis bench-election [--runs 5] [--proclaims 200] [--gap-ms 20] [--only failover|observer]
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use dlock_nemesis::holder::Flags;
use dlock_nemesis::{Settings, check, driver, faces, history};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("holder") => dlock_nemesis::holder::main(&args[1..]).map(|()| ExitCode::SUCCESS),
        Some("run") => run(&args[1..]),
        Some("check") => match args.get(1) {
            Some(dir) => check_dir(&PathBuf::from(dir)),
            None => Err("usage: nemesis check DIR".into()),
        },
        Some("dump") => dump(&args[1..]),
        Some("bench-election") => std::env::current_exe()
            .map_err(|e| e.to_string())
            .and_then(|exe| dlock_nemesis::bench::main(&args[1..], &exe))
            .map(|()| ExitCode::SUCCESS),
        Some("busy") => loop {
            std::hint::black_box(0u64);
        },
        _ => {
            Err("usage: nemesis run|check|holder|busy|bench-election ... (docs/nemesis.md)".into())
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("nemesis: {e}");
        ExitCode::from(2)
    })
}

fn run(args: &[String]) -> Result<ExitCode, String> {
    let f = Flags::parse(args)?;
    let backend = match f.get("backend", "etcd").as_str() {
        "etcd" => driver::Backend::Etcd,
        "postgres" => {
            driver::Backend::postgres_from_env(Some(f.get("pg-url", "")).filter(|u| !u.is_empty()))?
        }
        other => return Err(format!("--backend is etcd or postgres, got {other:?}")),
    };
    let faults = f.get("faults", &backend.default_faults().join(","));
    let faults: Vec<String> = faults.split(',').map(str::to_owned).collect();
    if let Some(bad) = faults
        .iter()
        .find(|k| !backend.faults().contains(&k.as_str()))
    {
        return Err(format!(
            "unknown fault {bad:?} (one of {:?})",
            backend.faults()
        ));
    }
    let seed = f.num("seed", history::now())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let cfg = driver::Config {
        dir: PathBuf::from(f.need("dir")?),
        duration: Duration::from_secs(f.num("seconds", 180)?),
        holders: f.num("holders", 4)? as usize,
        seed,
        faults,
        settings: Settings::default(),
        flap: f.ms("flap-ms", Duration::from_secs(10))?,
        locks: f.num("locks", 1)?.max(1) as usize,
        election: f.num("election", 0)? == 1,
        semaphore: f
            .num("semaphore", 0)?
            .min(u64::from(dlock::MAX_SEMAPHORE_LIMIT)) as u32,
        rwlock: f.num("rwlock", 0)? == 1,
        holder: driver::holder_cmds(&f.get("holder-cmds", ""), &exe)?,
        backend,
    };
    if cfg.holders < 2 {
        return Err("--holders must be at least 2".into());
    }
    eprintln!(
        "nemesis: seed {seed}, {} holders, {:?}, {}",
        cfg.holders,
        cfg.duration,
        match cfg.backend {
            driver::Backend::Etcd => "etcd",
            driver::Backend::Postgres { .. } => "postgres",
        }
    );
    let dir = driver::run(cfg)?;
    check_dir(&dir)
}

/// `nemesis dump --dir DIR`: reads the etcd key of the run in DIR (its
/// `run` record) back into DIR/etcd.jsonl, for a run that ended early.
fn dump(args: &[String]) -> Result<ExitCode, String> {
    let f = Flags::parse(args)?;
    let dir = PathBuf::from(f.need("dir")?);
    let records = history::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let run = records
        .iter()
        .find(|v| v["ev"] == "run")
        .ok_or("no run record in the history")?;
    let key = run["key"].as_str().ok_or("the run record has no key")?;
    let cluster = dlock_nemesis::cluster::Cluster::from_env();
    driver::dump_etcd(&cluster, key, &dir.join("etcd.jsonl"))?;
    Ok(ExitCode::SUCCESS)
}

fn check_dir(dir: &std::path::Path) -> Result<ExitCode, String> {
    let records = history::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let report = check::check(&records);
    print!("{}", report.table());
    print!("\nby face\n{}", faces::table(&faces::faces(&records)));
    Ok(if report.violation_count() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
