//! Semaphores: what a free slot costs beside a plain lock (issue 29's
//! target: acquire + release of a free slot at most 1.3x a lock's, same
//! engine, same run). Figures only, never a gate.
//!
//! Rounds alternate lock / semaphore (the order turns every round), each
//! `DLOCK_BENCH_CYCLES` (200) acquire+release on one client; per-round
//! ops/s, their medians and the ratio. Engines: the embedded one always,
//! etcd when `DLOCK_TEST_MEMBERS` is set, PostgreSQL when
//! `DLOCK_TEST_PG_URL` is (what scripts/etcd-cluster.sh and
//! scripts/pg-cluster.sh export).
//!
//! Run: `cargo bench -p dlock --bench semaphore` (`DLOCK_BENCH_ROUNDS`: 7).

use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, EtcdConfig, Options, PostgresConfig};
use dlock_testkit::bench::{median, setting};

const TIMEOUT: Duration = Duration::from_secs(30);
const LIMIT: u32 = 4;

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("semaphore: benchmarks only (cargo bench -p dlock --bench semaphore)");
        return;
    }
    let mut engines: Vec<(&str, Client)> = vec![("embedded", Client::memory())];
    if let Ok(m) = std::env::var("DLOCK_TEST_MEMBERS") {
        let members: Vec<String> = m.split(',').map(|s| s.trim().to_owned()).collect();
        let c = Client::connect(
            ClientConfig::etcd(EtcdConfig::new(members)).with_options(Options::default()),
        );
        engines.push(("etcd", c.expect("connect to etcd")));
    }
    if let Ok(url) = std::env::var("DLOCK_TEST_PG_URL") {
        let c = Client::connect(ClientConfig::postgres(PostgresConfig::parse(&url).unwrap()));
        engines.push(("postgres", c.expect("connect to PostgreSQL")));
    }
    let rounds = setting("DLOCK_BENCH_ROUNDS", 7);
    let cycles = setting("DLOCK_BENCH_CYCLES", 200);
    let tag = std::process::id();
    println!(
        "engine     lock ops/s  slot ops/s  slot/lock (median of {rounds} rounds x {cycles}; limit {LIMIT}, free)"
    );
    for (engine, client) in &engines {
        let lock = client.lock(&format!("bench/sem-{tag}/plain")).unwrap();
        let sem = client
            .semaphore(&format!("bench/sem-{tag}/sem"), LIMIT)
            .unwrap();
        let plain = || {
            let t = Instant::now();
            for _ in 0..cycles {
                lock.acquire(TIMEOUT).unwrap();
                lock.release().unwrap();
            }
            cycles as f64 / t.elapsed().as_secs_f64()
        };
        let slot = || {
            let t = Instant::now();
            for _ in 0..cycles {
                sem.acquire(TIMEOUT).unwrap().release().unwrap();
            }
            cycles as f64 / t.elapsed().as_secs_f64()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            if r % 2 == 0 {
                a.push(plain());
                b.push(slot());
            } else {
                b.push(slot());
                a.push(plain());
            }
        }
        let (ma, mb) = (median(&a), median(&b));
        println!(
            "{engine:<10} {ma:>10.0}  {mb:>10.0}  {:>9.2}x the lock's time",
            ma / mb
        );
    }
}
