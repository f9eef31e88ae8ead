//! `nemesis bench-election`: the election's figures (a benchmark, not a
//! test; `scripts/bench-election.sh`, docs/elections.md).
//!
//! - Fail-over: a leader (a Rust holder process, `--election 1`, behind
//!   fault proxies) and a waiting candidate; the leader is killed
//!   (SIGKILL) or cut off (its proxies blackhole); from that instant to the
//!   next leader's first permit (its `permit` record), beside the TTL; for
//!   the cut-off one also the old leader's `on_fence`.
//! - Observer latency: from the start of a proclaim to the report of its
//!   value by `client.observe` and by `etcdctl elect -l` in the same run,
//!   back to back (the next proclaim once both reported) and spaced (a
//!   pause between proclaims).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Settings;
use crate::cluster::Cluster;
use crate::gate::Gate;
use crate::history::{self, now};
use crate::holder::{Flags, Spawned, Spec};
use crate::proxy::Mode;

/// `nemesis bench-election [--runs 5] [--proclaims 200] [--gap-ms 20]
/// [--dir DIR] [--only failover|observer]`.
pub fn main(args: &[String], exe: &Path) -> Result<(), String> {
    let f = Flags::parse(args)?;
    let runs = f.num("runs", 5)? as usize;
    let proclaims = f.num("proclaims", 200)? as usize;
    let gap = f.ms("gap-ms", Duration::from_millis(20))?;
    let only = f.get("only", "");
    let dir = PathBuf::from(f.get("dir", "target/nemesis/bench-election"));
    let cluster = Cluster::from_env();
    let stamp = format!("{}-{}", std::process::id(), now());
    if only.is_empty() || only == "failover" {
        failover(&cluster, exe, &dir.join(&stamp), runs)?;
    }
    if only.is_empty() || only == "observer" {
        observer(&cluster, &format!("bench-observe/{stamp}"), proclaims, gap)?;
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: usize) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[(v.len() * p / 100).min(v.len() - 1)]
}

/// The records of holder `id` in `dir`.
fn records(dir: &Path, id: &str) -> Vec<Value> {
    history::read_dir(dir)
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v["p"] == id)
        .collect()
}

/// Waits up to `max` for a record of `id` that `pick` accepts; its value.
fn wait_record(
    dir: &Path,
    id: &str,
    max: Duration,
    pick: impl Fn(&Value) -> Option<u64>,
) -> Option<u64> {
    let end = Instant::now() + max;
    while Instant::now() < end {
        if let Some(x) = records(dir, id).iter().find_map(&pick) {
            return Some(x);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn failover(cluster: &Cluster, exe: &Path, dir: &Path, runs: usize) -> Result<(), String> {
    let settings = Settings::default();
    let members: Vec<_> = (0..3).map(|i| cluster.member_addr(i)).collect();
    let mut figures: [(Vec<f64>, Vec<f64>); 2] = Default::default();
    for run in 0..runs * 2 {
        let cut = run % 2 == 1;
        let d = dir.join(format!("run-{run}"));
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let gate = Gate::start(&d.join("gate.jsonl")).map_err(|e| e.to_string())?;
        let spec = |id: &str| Spec {
            id: id.into(),
            lock: format!("bench-failover/{}/{run}", d.display()),
            key: format!("bench-failover-resource/{}/{run}", d.display()),
            gate: gate.addr(),
            dir: d.clone(),
            settings,
            extra: vec!["--election".into(), "1".into()],
        };
        let prefix = vec!["holder".to_owned()];
        let start = |id: &str| {
            Spawned::start(exe, &prefix, &members, spec(id), &[], &[]).map_err(|e| e.to_string())
        };
        let leader = start("a")?;
        let token = wait_record(&d, "a", Duration::from_secs(20), |v| {
            (v["ev"] == "permit").then(|| v["token"].as_u64()).flatten()
        })
        .ok_or("the first leader never got a permit")?;
        let next = start("b")?;
        // b's key is in place (it campaigns) before the leader goes.
        wait_record(&d, "b", Duration::from_secs(10), |v| {
            (v["ev"] == "acquire").then_some(1)
        })
        .ok_or("the candidate never campaigned")?;
        std::thread::sleep(Duration::from_millis(500));
        let t0 = now();
        if cut {
            for p in &leader.proxies {
                p.set(Mode::Blackhole);
            }
        } else {
            leader.signal(libc::SIGKILL);
        }
        let first = wait_record(&d, "b", settings.ttl * 3, |v| {
            (v["ev"] == "permit" && v["token"].as_u64() > Some(token))
                .then(|| v["t"].as_u64())
                .flatten()
        })
        .ok_or("the next leader never got a permit")?;
        let took = (first - t0) as f64 / 1e6;
        let fence = if cut {
            records(&d, "a")
                .iter()
                .find(|v| v["ev"] == "fence")
                .and_then(|v| v["at"].as_u64())
                .map(|at| (at as f64 - t0 as f64) / 1e6)
        } else {
            None
        };
        let (what, i) = if cut { ("cut off", 1) } else { ("SIGKILL", 0) };
        figures[i].0.push(took);
        if let Some(fe) = fence {
            figures[i].1.push(took - fe);
        }
        println!(
            "run {run}: leader {what} -> next leader's first permit {took:.0} ms{}",
            fence.map_or(String::new(), |fe| format!(
                " (the old leader's on_fence at {fe:.0} ms)"
            ))
        );
        next.kill();
        leader.kill();
    }
    let ttl = settings.ttl.as_millis();
    let [(mut kill, _), (mut cut, mut lead)] = figures;
    println!(
        "ELECTION|fail-over, {runs} runs each, TTL {ttl} ms (keepalive every {} ms, margin {} ms): SIGKILL -> next leader's first permit median {:.0} ms ({:.2}x TTL), range {:.0}..{:.0} ms; cut off -> next leader's first permit median {:.0} ms ({:.2}x TTL), range {:.0}..{:.0} ms, the old leader's on_fence ahead of it by median {:.0} ms",
        settings.interval.as_millis(),
        settings.margin.as_millis(),
        median(&mut kill),
        median(&mut kill) / ttl as f64,
        kill.first().copied().unwrap_or(f64::NAN),
        kill.last().copied().unwrap_or(f64::NAN),
        median(&mut cut),
        median(&mut cut) / ttl as f64,
        cut.first().copied().unwrap_or(f64::NAN),
        cut.last().copied().unwrap_or(f64::NAN),
        median(&mut lead),
    );
    Ok(())
}

/// `etcdctl elect -l NAME`: its lines with the instant each was read.
fn listen(cluster: &Cluster, name: &str) -> Result<mpsc::Receiver<(Instant, String)>, String> {
    let mut child = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", cluster.members.join(",")))
        .args(["elect", "-l", name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("etcdctl: {e}"))?;
    let out = child.stdout.take().ok_or("etcdctl: no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send((Instant::now(), line)).is_err() {
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    });
    Ok(rx)
}

/// The instant etcdctl printed `value` (its lines: key, value, ...).
fn etcdctl_saw(rx: &mpsc::Receiver<(Instant, String)>, value: &str) -> Result<Instant, String> {
    loop {
        let (at, line) = rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| format!("etcdctl elect -l never printed {value}"))?;
        if line == value {
            return Ok(at);
        }
    }
}

fn observer(cluster: &Cluster, name: &str, n: usize, gap: Duration) -> Result<(), String> {
    let config = dlock::EtcdConfig::parse(&cluster.members.join(",")).map_err(|e| e.to_string())?;
    let options = Settings::default().options();
    let c = dlock::Client::etcd(config.clone(), options.clone()).map_err(|e| e.to_string())?;
    let e = c.election(name).map_err(|e| e.to_string())?;
    e.campaign(b"v0", Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let oc = dlock::Client::etcd(config, options).map_err(|e| e.to_string())?;
    let obs = oc.observe(name).map_err(|e| e.to_string())?;
    // The observer is read by a thread of its own that stamps each event
    // as it comes, as `listen` stamps etcdctl's lines: read after the
    // proclaim returned, an event that came first would be stamped late.
    let (tx, ours_rx) = mpsc::channel();
    std::thread::spawn(move || {
        while let Ok(Some(ev)) = obs.recv_blocking(Some(Duration::from_secs(30))) {
            let value = ev
                .leader()
                .map(|l| String::from_utf8_lossy(&l.value).into_owned());
            if tx
                .send((Instant::now(), value.unwrap_or_default()))
                .is_err()
            {
                break;
            }
        }
    });
    let seen = |value: &str| -> Result<Instant, String> {
        loop {
            let (at, v) = ours_rx
                .recv_timeout(Duration::from_secs(10))
                .map_err(|_| format!("observer: no event for {value}"))?;
            if v == value {
                return Ok(at);
            }
        }
    };
    seen("v0")?;
    let rx = listen(cluster, name)?;
    etcdctl_saw(&rx, "v0")?;
    for (mode, pause) in [("back to back", Duration::ZERO), ("spaced", gap)] {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for i in 1..=n {
            std::thread::sleep(pause);
            let value = format!("{mode}-{i}");
            let start = Instant::now();
            e.proclaim(value.as_bytes()).map_err(|e| e.to_string())?;
            ours.push(seen(&value)?.duration_since(start).as_secs_f64() * 1e3);
            theirs.push(
                etcdctl_saw(&rx, &value)?
                    .duration_since(start)
                    .as_secs_f64()
                    * 1e3,
            );
        }
        println!(
            "ELECTION|observer latency, {mode} ({n} proclaims{}, proclaim start -> event): dlock observe p50 {:.2} ms p99 {:.2} ms; etcdctl elect -l p50 {:.2} ms p99 {:.2} ms (same run)",
            if pause.is_zero() {
                String::new()
            } else {
                format!(", {} ms apart", pause.as_millis())
            },
            pct(&mut ours, 50),
            pct(&mut ours, 99),
            pct(&mut theirs, 50),
            pct(&mut theirs, 99),
        );
    }
    e.resign(Duration::ZERO).map_err(|e| e.to_string())?;
    Ok(())
}
