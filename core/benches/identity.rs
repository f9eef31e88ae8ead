//! Holder identity (issue 31): what it costs an acquire, with and without
//! it, same engine, same run. Identity is written once per session (with
//! its lease), never per acquire, so two cases: a long-lived session
//! (acquire+release on it: the identity is already there) and a fresh
//! session per acquire (grant, identity, acquire, release, revoke: it pays
//! the write). The baseline records none (`IdentityOptions::record`).
//! Figures only, never a gate.
//!
//! A control compares two clients that both record none: the spread of
//! two equal clients in the same run, to read the other ratios against.
//!
//! Rounds alternate with / without (the order turns every round), each
//! `DLOCK_BENCH_CYCLES` (100) cycles; per-round mean ms per cycle, their
//! medians and the ratio. Engines: etcd when `DLOCK_TEST_MEMBERS` is set,
//! PostgreSQL when `DLOCK_TEST_PG_URL` is, the embedded one always.
//!
//! Run: `cargo bench -p dlock --bench identity` (`DLOCK_BENCH_ROUNDS`: 7;
//! `DLOCK_BENCH_VERBOSE`: every round's figure on stderr).

use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, EtcdConfig, Options, PostgresConfig};
use dlock_testkit::bench::{median, setting};

const TIMEOUT: Duration = Duration::from_secs(30);

/// The engines the environment names, each as (with identity, without).
fn engines() -> Vec<(&'static str, ClientConfig)> {
    let mut e = vec![("embedded", ClientConfig::embedded())];
    if let Ok(m) = std::env::var("DLOCK_TEST_MEMBERS") {
        let members: Vec<String> = m.split(',').map(|s| s.trim().to_owned()).collect();
        e.push(("etcd", ClientConfig::etcd(EtcdConfig::new(members))));
    }
    if let Ok(url) = std::env::var("DLOCK_TEST_PG_URL") {
        e.push((
            "postgres",
            ClientConfig::postgres(PostgresConfig::parse(&url).unwrap()),
        ));
    }
    e
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("identity: benchmarks only (cargo bench -p dlock --bench identity)");
        return;
    }
    let rounds = setting("DLOCK_BENCH_ROUNDS", 7);
    let cycles = setting("DLOCK_BENCH_CYCLES", 100);
    let tag = std::process::id();
    println!(
        "engine    case                     with ms   without ms  with/without (median of {rounds} rounds x {cycles})"
    );
    for (engine, config) in engines() {
        let with = Client::connect(
            config
                .clone()
                .with_options(Options::default())
                .with_description("bench"),
        )
        .expect("connect");
        let mut quiet = config.with_options(Options::default());
        quiet.identity.record = false;
        let without = Client::connect(quiet.clone()).expect("connect");
        // The control: a second client without identity against the first,
        // the spread two equal clients show in this run.
        let control = Client::connect(quiet).expect("connect");
        // A long-lived session: its lease (and identity) made once.
        let long = |c: &Client, name: &str| {
            let lock = c.lock(name).unwrap();
            lock.acquire(TIMEOUT).unwrap();
            lock.release().unwrap();
            let t = Instant::now();
            for _ in 0..cycles {
                lock.acquire(TIMEOUT).unwrap();
                lock.release().unwrap();
            }
            t.elapsed().as_secs_f64() * 1000.0 / cycles as f64
        };
        // A fresh session per acquire: grant (and identity), acquire,
        // release, close (revoke).
        let fresh = |c: &Client, name: &str| {
            let t = Instant::now();
            for _ in 0..cycles {
                let s = c.session(Options::default()).unwrap();
                let lock = s.lock(name).unwrap();
                lock.acquire(TIMEOUT).unwrap();
                lock.release().unwrap();
                drop(lock);
                s.close().unwrap();
            }
            t.elapsed().as_secs_f64() * 1000.0 / cycles as f64
        };
        type Case<'a> = &'a dyn Fn(&Client, &str) -> f64;
        let cases: [(&str, Case, &Client); 4] = [
            ("long-lived session", &long, &with),
            ("fresh session per acquire", &fresh, &with),
            ("long-lived (control)", &long, &control),
            ("fresh (control)", &fresh, &control),
        ];
        for (case, run, with) in cases {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for r in 0..rounds {
                let n1 = format!("bench/identity-{tag}/{engine}/with");
                let n2 = format!("bench/identity-{tag}/{engine}/without");
                if r % 2 == 0 {
                    a.push(run(with, &n1));
                    b.push(run(&without, &n2));
                } else {
                    b.push(run(&without, &n2));
                    a.push(run(with, &n1));
                }
            }
            if std::env::var_os("DLOCK_BENCH_VERBOSE").is_some() {
                eprintln!("{engine} {case}: with {a:.3?} without {b:.3?}");
            }
            let (ma, mb) = (median(&a), median(&b));
            println!(
                "{engine:<9} {case:<25} {ma:>8.3} {mb:>11.3}  {:>6.2}",
                ma / mb
            );
        }
    }
}
