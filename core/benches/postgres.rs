//! PostgreSQL: uncontended acquire + release per second on one live
//! session, beside the floor: the same two statements dlock sends
//! (`dlock.acquire`, then the delete of the lock row) through tokio-postgres
//! directly, from this process, to the same server; and dlock's async API
//! on the bench thread's runtime (the blocking call's hop to the driver
//! thread left out). Rounds rotate the three; per-round ops/s, the medians,
//! their ratios (target >= 0.9) and a bare thread round trip of the same
//! run. Figures only, never a gate.
//!
//! Then, in a child process of its own (so no RSS freed by the first part
//! is counted): `DLOCK_BENCH_LOCKS` (10,000) locks held on one session,
//! acquired 64 at a time with `acquire_async`: the time, the client's RSS
//! per held lock (target <= 1 KiB), and over `DLOCK_BENCH_HOLD_INTERVALS`
//! (3) keepalive intervals the server's cost: transactions committed and
//! WAL bytes written per interval, beside the same window measured first
//! with nothing of this bench holding (the server's own background).
//!
//! Run: `scripts/bench-postgres.sh` (starts the test servers), or
//! `cargo bench -p dlock --bench postgres` with `DLOCK_TEST_PG_URL` set.
//! Settings: `DLOCK_BENCH_ROUNDS` (7), `DLOCK_BENCH_CYCLES` (300),
//! `DLOCK_BENCH_LOCKS`, `DLOCK_BENCH_HOLD_INTERVALS`.

use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, Lock, Options, PostgresConfig};
use dlock_testkit::bench::{median, rss_kib, thread_round_trip};
use tokio_postgres::types::Type;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("postgres: benchmarks only (cargo bench -p dlock --bench postgres)");
        return;
    }
    let Ok(url) = std::env::var("DLOCK_TEST_PG_URL") else {
        eprintln!("postgres: DLOCK_TEST_PG_URL unset (scripts/bench-postgres.sh)");
        return;
    };
    if std::env::args().any(|a| a == "--many") {
        many(&url);
        return;
    }
    let rounds = setting("DLOCK_BENCH_ROUNDS", 7);
    let cycles = setting("DLOCK_BENCH_CYCLES", 300);

    let client =
        Client::connect(ClientConfig::postgres(PostgresConfig::parse(&url).unwrap())).unwrap();
    let name = format!("bench/pg-{}", std::process::id());
    let lock = client.lock(&name).unwrap();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (floor, lease) = rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let lease: i64 = c
            .query_one(
                "INSERT INTO dlock.leases (ttl, expires_at) VALUES ('1 hour', clock_timestamp() + interval '1 hour') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        (c, lease)
    });
    let floor_name = format!("bench/floor-{}", std::process::id());
    let floor_key = format!("{floor_name}/{lease:x}");

    let run_dlock = || {
        let t = Instant::now();
        for _ in 0..cycles {
            lock.acquire(Duration::from_secs(5)).unwrap();
            lock.release().unwrap();
        }
        cycles as f64 / t.elapsed().as_secs_f64()
    };
    // The same through the async API on this thread's runtime: what the
    // blocking call's hop to the driver thread and back costs.
    let run_async = || {
        rt.block_on(async {
            let t = Instant::now();
            for _ in 0..cycles {
                lock.acquire_async(Some(Duration::from_secs(5)))
                    .await
                    .unwrap();
                lock.release_async().await.unwrap();
            }
            cycles as f64 / t.elapsed().as_secs_f64()
        })
    };
    let run_floor = || {
        rt.block_on(async {
            let t = Instant::now();
            for _ in 0..cycles {
                let rows = floor
                    .query_typed(
                        "SELECT token, retry_ms FROM dlock.acquire($1, $2, $3)",
                        &[(&floor_name, Type::TEXT), (&floor_key, Type::TEXT), (&lease, Type::INT8)],
                    )
                    .await
                    .unwrap();
                let token: Option<i64> = rows[0].get(0);
                floor
                    .query_typed(
                        "DELETE FROM dlock.locks WHERE key = $1 AND lease = $2 AND ($3::int8 IS NULL OR token = $3) RETURNING token",
                        &[(&floor_key, Type::TEXT), (&lease, Type::INT8), (&token, Type::INT8)],
                    )
                    .await
                    .unwrap();
            }
            cycles as f64 / t.elapsed().as_secs_f64()
        })
    };
    run_dlock();
    run_async();
    run_floor();
    let (mut d, mut a, mut f) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // The order turns every round.
        for k in 0..3 {
            match (round + k) % 3 {
                0 => d.push(run_dlock()),
                1 => a.push(run_async()),
                _ => f.push(run_floor()),
            }
        }
        println!(
            "round {round}: dlock {:.0}/s, dlock async {:.0}/s, floor {:.0}/s",
            d[round], a[round], f[round]
        );
    }
    let (md, ma, mf) = (median(&d), median(&a), median(&f));
    let hop_us = thread_round_trip().as_secs_f64() * 1e6;
    println!(
        "postgres acquire+release: dlock {md:.0}/s, floor (same statements through tokio-postgres) {mf:.0}/s, ratio {:.2} (target >= 0.9); async API {ma:.0}/s, ratio {:.2}; {rounds} rounds of {cycles}",
        md / mf,
        ma / mf
    );
    println!(
        "per cycle (2 calls): dlock {:.0} µs, async {:.0} µs, floor {:.0} µs; a bare thread round trip {hop_us:.1} µs in this run",
        1e6 / md,
        1e6 / ma,
        1e6 / mf
    );
    rt.block_on(async {
        let _ = floor
            .query("DELETE FROM dlock.leases WHERE id = $1", &[&lease])
            .await;
    });
    drop(lock);
    client.shutdown();

    let exe = std::env::current_exe().expect("bench binary");
    let status = std::process::Command::new(exe)
        .args(["--bench", "--many"])
        .status()
        .expect("the --many child");
    assert!(status.success(), "the --many child failed: {status}");
}

/// The server's next transaction id and WAL position in bytes: both move
/// at once (unlike the statistics, flushed up to seconds late), and a
/// read assigns no transaction id of its own.
async fn server_counts(c: &tokio_postgres::Client) -> (i64, i64) {
    let row = c
        .query_one(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::int8, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// The server's write transactions and WAL bytes per keepalive interval,
/// over `intervals` of them; with the session given, also its keepalives
/// sent per interval over the same window.
fn server_cost(
    rt: &tokio::runtime::Runtime,
    c: &tokio_postgres::Client,
    interval: Duration,
    intervals: u32,
    session: Option<&dlock::Session>,
) -> (f64, f64, f64) {
    let k0 = session.map_or(0, |s| s.stats().keepalives);
    let (x0, w0) = rt.block_on(server_counts(c));
    let t = Instant::now();
    std::thread::sleep(interval * intervals);
    let (x1, w1) = rt.block_on(server_counts(c));
    let k1 = session.map_or(0, |s| s.stats().keepalives);
    let per = t.elapsed().as_secs_f64() / interval.as_secs_f64();
    (
        (x1 - x0) as f64 / per,
        (w1 - w0) as f64 / per,
        (k1 - k0) as f64 / per,
    )
}

/// The child: many locks on one session, their cost to the client and to
/// the server.
fn many(url: &str) {
    let n = setting("DLOCK_BENCH_LOCKS", 10_000);
    let intervals = setting("DLOCK_BENCH_HOLD_INTERVALS", 3) as u32;
    let interval = Options::default().keepalive_interval;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let reader = rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        c
    });
    let (idle_x, idle_w, _) = server_cost(&rt, &reader, interval, intervals, None);
    println!(
        "postgres server, nothing of this bench holding: {idle_x:.2} write transactions and {idle_w:.0} WAL bytes per {interval:?}"
    );

    let client =
        Client::connect(ClientConfig::postgres(PostgresConfig::parse(url).unwrap())).unwrap();
    let session = client.session(Options::default()).unwrap();
    let tag = std::process::id();
    let warm = session.lock(&format!("bench/many-{tag}/warm")).unwrap();
    warm.acquire(Duration::from_secs(10)).unwrap();
    warm.release().unwrap();
    drop(warm);
    let rss_before = rss_kib();
    let locks: Vec<Lock> = (0..n)
        .map(|i| session.lock(&format!("bench/many-{tag}/{i}")).unwrap())
        .collect();
    let t = Instant::now();
    let locks = rt.block_on(async move {
        let mut set = tokio::task::JoinSet::new();
        let mut out = Vec::with_capacity(n);
        let mut todo = locks.into_iter();
        loop {
            while set.len() < 64 {
                let Some(l) = todo.next() else { break };
                set.spawn(async move {
                    l.acquire_async(Some(Duration::from_secs(60)))
                        .await
                        .unwrap();
                    l
                });
            }
            match set.join_next().await {
                Some(l) => out.push(l.unwrap()),
                None => break,
            }
        }
        out
    });
    let acquire_s = t.elapsed().as_secs_f64();
    let rss_after = rss_kib();
    let per_lock = (rss_after.saturating_sub(rss_before) * 1024) as f64 / n as f64;
    println!(
        "postgres: {n} locks on one session acquired in {acquire_s:.2} s ({:.0}/s, 64 in flight); VmRSS {rss_before} KiB before, {rss_after} KiB all held: {per_lock:.0} B per held lock (target <= 1024 B)",
        n as f64 / acquire_s
    );
    let (held_x, held_w, sent) = server_cost(&rt, &reader, interval, intervals, Some(&session));
    let holding = locks
        .iter()
        .filter(|l| l.state() == dlock::State::Holding)
        .count();
    println!(
        "postgres server, {holding}/{n} held on one session: {held_x:.2} write transactions and {held_w:.0} WAL bytes per {interval:?} (background above: {idle_x:.2} and {idle_w:.0}); the session sent {sent:.2} keepalives per interval"
    );
    println!(
        "postgres keepalive cost: {:.2} write transactions and {:.0} WAL bytes per session per interval, for {n} locks",
        held_x - idle_x,
        held_w - idle_w
    );
    let t = Instant::now();
    for l in &locks {
        l.release().unwrap();
    }
    println!(
        "postgres: released the {n} in {:.2} s, one by one",
        t.elapsed().as_secs_f64()
    );
    drop(locks);
    session.close().unwrap();
}
