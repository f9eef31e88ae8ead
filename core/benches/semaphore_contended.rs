//! A contended semaphore on etcd (issue 29's figure): twice as many
//! contenders as slots on one semaphore, beside a baseline measured in the
//! same run: the same contenders on as many independent plain locks as
//! slots (contender `i` on lock `i mod slots`: the same holders at once,
//! two per lock). Figures only, never a gate. The default is the issue's:
//! 100 slots under 200 contenders.
//!
//! Each contender is a client of its own (its own lease) on a thread of its
//! own: acquire, release, again, until the round ends. Per round:
//! acquisitions per second, and engine round trips per acquisition: the
//! request messages the three members received (etcd's own
//! `grpc_server_msg_received_total`, read from each member's `/metrics`),
//! keepalives left out (they are per lease, not per acquisition). Rounds
//! alternate locks / semaphore, the order turning every round; the medians
//! and their ratios are printed.
//!
//! Run: with `DLOCK_TEST_MEMBERS` (scripts/etcd-cluster.sh's env),
//! `cargo bench -p dlock --bench semaphore_contended`
//! (`DLOCK_BENCH_ROUNDS`: 3, `DLOCK_BENCH_SECONDS`: 5,
//! `DLOCK_BENCH_SLOTS`: 100, `DLOCK_BENCH_CONTENDERS`: twice the slots).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use dlock::{Client, EtcdConfig, Options};
use dlock_testkit::bench::{median, setting};

/// Request messages the members received so far, keepalives left out.
fn requests(members: &[String]) -> u64 {
    members
        .iter()
        .map(|m| {
            let addr = m.trim_start_matches("http://");
            let mut s = TcpStream::connect(addr).expect("a member's client port");
            write!(
                s,
                "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )
            .expect("ask for /metrics");
            let mut body = String::new();
            s.read_to_string(&mut body).expect("read /metrics");
            body.lines()
                .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                .filter(|l| !l.contains("LeaseKeepAlive"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>() as u64
        })
        .sum()
}

/// What one round measured.
struct Round {
    per_sec: f64,
    trips_per_acq: f64,
}

/// One round: every contender acquires and releases with `acquire` (which
/// returns when it acquired, `None` if it gave up) until
/// `secs` have passed; acquisitions counted up to then, round trips over
/// the whole round (the last waits included) per acquisition made.
fn round(
    members: &[String],
    clients: &[Client],
    secs: Duration,
    acquire: &(dyn Fn(usize, Duration) -> Option<Instant> + Sync),
) -> Round {
    let start = Barrier::new(clients.len() + 1);
    let before = requests(members);
    let (in_time, all, elapsed) = std::thread::scope(|s| {
        let threads: Vec<_> = (0..clients.len())
            .map(|i| {
                let start = &start;
                s.spawn(move || {
                    start.wait();
                    let end = Instant::now() + secs;
                    let (mut in_time, mut all) = (0u64, 0u64);
                    while Instant::now() < end {
                        // Waiting past the end is allowed (the lock passes
                        // on as the others stop), not counted as in time.
                        let wait = end.saturating_duration_since(Instant::now()) + secs * 2;
                        let Some(at) = acquire(i, wait) else {
                            continue;
                        };
                        all += 1;
                        if at < end {
                            in_time += 1;
                        }
                    }
                    (in_time, all)
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        let counts: Vec<(u64, u64)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        let in_time: u64 = counts.iter().map(|c| c.0).sum();
        let all: u64 = counts.iter().map(|c| c.1).sum();
        (in_time, all, t.elapsed().min(secs))
    });
    let trips = requests(members) - before;
    Round {
        per_sec: in_time as f64 / elapsed.as_secs_f64(),
        trips_per_acq: trips as f64 / all.max(1) as f64,
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "semaphore_contended: benchmarks only (cargo bench -p dlock --bench semaphore_contended)"
        );
        return;
    }
    let Ok(m) = std::env::var("DLOCK_TEST_MEMBERS") else {
        eprintln!(
            "semaphore_contended: etcd only; set DLOCK_TEST_MEMBERS (scripts/etcd-cluster.sh)"
        );
        return;
    };
    let members: Vec<String> = m.split(',').map(|s| s.trim().to_owned()).collect();
    let rounds = setting("DLOCK_BENCH_ROUNDS", 3);
    let secs = Duration::from_secs(setting("DLOCK_BENCH_SECONDS", 5) as u64);
    let slots = setting("DLOCK_BENCH_SLOTS", 100);
    let n = setting("DLOCK_BENCH_CONTENDERS", 2 * slots);
    let tag = format!("bench/semc-{}", std::process::id());
    let clients: Vec<Client> = (0..n)
        .map(|_| {
            Client::etcd(EtcdConfig::new(members.clone()), Options::default())
                .expect("connect to etcd")
        })
        .collect();
    let sems: Vec<dlock::Semaphore> = clients
        .iter()
        .map(|c| c.semaphore(&format!("{tag}/sem"), slots as u32).unwrap())
        .collect();
    let locks: Vec<dlock::Lock> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| c.lock(&format!("{tag}/lock-{}", i % slots)).unwrap())
        .collect();
    let on_sem = |i: usize, wait: Duration| {
        let slot = sems[i].acquire(wait).ok()?;
        let at = Instant::now();
        slot.release().expect("release");
        Some(at)
    };
    let on_lock = |i: usize, wait: Duration| {
        locks[i].acquire(wait).ok()?;
        let at = Instant::now();
        locks[i].release().expect("release");
        Some(at)
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        if r % 2 == 0 {
            a.push(round(&members, &clients, secs, &on_lock));
            b.push(round(&members, &clients, secs, &on_sem));
        } else {
            b.push(round(&members, &clients, secs, &on_sem));
            a.push(round(&members, &clients, secs, &on_lock));
        }
    }
    let med = |v: &[Round], f: fn(&Round) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let (ra, rb) = (med(&a, |r| r.per_sec), med(&b, |r| r.per_sec));
    let (ta, tb) = (med(&a, |r| r.trips_per_acq), med(&b, |r| r.trips_per_acq));
    println!(
        "etcd, {n} contenders, medians of {rounds} rounds x {secs:?} (each a client of its own)"
    );
    println!("                               acquisitions/s  round trips/acquisition");
    println!("{slots} independent locks (baseline)  {ra:>14.1}  {ta:>23.1}");
    println!("one semaphore of {slots} slots      {rb:>14.1}  {tb:>23.1}");
    println!(
        "semaphore / baseline           {:>13.2}x  {:>22.2}x",
        rb / ra,
        tb / ta
    );
}
