//! PostgreSQL: uncontended acquire + release per second on one live
//! session, beside the floor: the same two statements dlock sends
//! (`dlock.acquire`, then the delete of the lock row) through tokio-postgres
//! directly, from this process, to the same server. Rounds alternate dlock
//! and the floor; per-round ops/s, the medians and their ratio (target
//! >= 0.9). Figures only, never a gate.
//!
//! Run: `scripts/bench-postgres.sh` (starts the test servers), or
//! `cargo bench -p dlock --bench postgres` with `DLOCK_TEST_PG_URL` set.
//! Settings: `DLOCK_BENCH_ROUNDS` (7), `DLOCK_BENCH_CYCLES` (300).

use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, PostgresConfig};
use tokio_postgres::types::Type;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
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
    run_floor();
    let (mut d, mut f) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            d.push(run_dlock());
            f.push(run_floor());
        } else {
            f.push(run_floor());
            d.push(run_dlock());
        }
        println!(
            "round {round}: dlock {:.0}/s, floor {:.0}/s",
            d[round], f[round]
        );
    }
    let (md, mf) = (median(d), median(f));
    println!(
        "postgres acquire+release: dlock {md:.0}/s, floor (same statements through tokio-postgres) {mf:.0}/s, ratio {:.2} (target >= 0.9); {rounds} rounds of {cycles}",
        md / mf
    );
    rt.block_on(async {
        let _ = floor
            .query("DELETE FROM dlock.leases WHERE id = $1", &[&lease])
            .await;
    });
}
