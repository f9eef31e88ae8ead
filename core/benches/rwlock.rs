//! Read/write locks (issue 30): what a read and a write acquire + release
//! cost beside a plain lock's, same engine, same run; and 100 readers
//! sharing one name: the service's round trips per acquisition. Figures
//! only, never a gate.
//!
//! Part 1: rounds alternate lock / writer / reader (the order turns every
//! round), each `DLOCK_BENCH_CYCLES` (200) acquire+release on one client;
//! per-round ops/s, their medians and the time ratios to the lock's.
//!
//! Part 2: one client, 100 sessions (each its own lease, as 100 processes
//! would have; two holders on one session share a key, §27), one reader
//! each on one name: all acquire at once (they share: all hold together),
//! then all release. Round trips are the service's own count: on etcd the
//! KV requests every member handled (`grpc_server_handled_total` of
//! Range, Txn, Put, DeleteRange on each member's `/metrics`); on
//! PostgreSQL the transactions of the database (`pg_stat_database`, read
//! after PostgreSQL's 10 s stats flush; each dlock statement is one). The
//! sessions' keepalives are 50 s apart, so none falls in the count.
//!
//! Engines: the embedded one (part 1 only), etcd when
//! `DLOCK_TEST_MEMBERS` is set, PostgreSQL when `DLOCK_TEST_PG_URL` is.
//! Run: `cargo bench -p dlock --bench rwlock` (`DLOCK_BENCH_ROUNDS`: 7,
//! `DLOCK_BENCH_READERS`: 100).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, EtcdConfig, Options, PostgresConfig};
use dlock_testkit::bench::{median, setting};

const TIMEOUT: Duration = Duration::from_secs(30);

/// Keepalives far apart: none during a count.
fn quiet() -> Options {
    Options {
        ttl: Duration::from_secs(120),
        keepalive_interval: Duration::from_secs(50),
        keepalive_timeout: Duration::from_secs(2),
        retry_interval: Duration::from_secs(1),
        margin: Duration::from_secs(1),
        reacquire: true,
    }
}

/// How the service counts requests.
enum Counter {
    /// The etcd members' client URLs.
    Etcd(Vec<String>),
    /// The PostgreSQL URL.
    Postgres(String),
}

impl Counter {
    fn count(&self) -> f64 {
        match self {
            Counter::Etcd(members) => members.iter().map(|m| etcd_kv_requests(m)).sum(),
            Counter::Postgres(url) => pg_transactions(url),
        }
    }
}

/// The KV requests member `url` handled (its Prometheus `/metrics`).
fn etcd_kv_requests(url: &str) -> f64 {
    let hostport = url.trim_start_matches("http://").trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(hostport).expect("etcd member");
    write!(
        s,
        "GET /metrics HTTP/1.0\r\nHost: {hostport}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| l.starts_with("grpc_server_handled_total{"))
        .filter(|l| l.contains("grpc_service=\"etcdserverpb.KV\""))
        .filter(|l| {
            ["Range", "Txn", "Put", "DeleteRange"]
                .iter()
                .any(|m| l.contains(&format!("grpc_method=\"{m}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The transactions of the database, once every backend flushed its
/// statistics (at most 10 s after it went idle). Minus this query's own.
fn pg_transactions(url: &str) -> f64 {
    std::thread::sleep(Duration::from_secs(11));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (c, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL");
        tokio::spawn(conn);
        let row = c
            .query_one(
                "SELECT (xact_commit + xact_rollback)::float8 FROM pg_stat_database \
                 WHERE datname = current_database()",
                &[],
            )
            .await
            .unwrap();
        row.get::<_, f64>(0)
    })
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("rwlock: benchmarks only (cargo bench -p dlock --bench rwlock)");
        return;
    }
    let mut engines: Vec<(&str, Client, Option<Counter>)> =
        vec![("embedded", Client::memory(), None)];
    if let Ok(m) = std::env::var("DLOCK_TEST_MEMBERS") {
        let members: Vec<String> = m.split(',').map(|s| s.trim().to_owned()).collect();
        let c = Client::connect(
            ClientConfig::etcd(EtcdConfig::new(members.clone())).with_options(quiet()),
        );
        engines.push((
            "etcd",
            c.expect("connect to etcd"),
            Some(Counter::Etcd(members)),
        ));
    }
    if let Ok(url) = std::env::var("DLOCK_TEST_PG_URL") {
        let c = Client::connect(
            ClientConfig::postgres(PostgresConfig::parse(&url).unwrap()).with_options(quiet()),
        );
        engines.push((
            "postgres",
            c.expect("connect to PostgreSQL"),
            Some(Counter::Postgres(url)),
        ));
    }
    let rounds = setting("DLOCK_BENCH_ROUNDS", 7);
    let cycles = setting("DLOCK_BENCH_CYCLES", 200);
    let readers = setting("DLOCK_BENCH_READERS", 100);
    let tag = std::process::id();
    println!(
        "engine     lock ops/s  write ops/s  read ops/s  write/lock  read/lock  (time ratios; median of {rounds} rounds x {cycles}, free)"
    );
    for (engine, client, _) in &engines {
        let lock = client.lock(&format!("bench/rw-{tag}/plain")).unwrap();
        let rw = client.rwlock(&format!("bench/rw-{tag}/rw")).unwrap();
        let (writer, reader) = (rw.write().unwrap(), rw.read().unwrap());
        let cycle = |l: &dlock::Lock| {
            let t = Instant::now();
            for _ in 0..cycles {
                l.acquire(TIMEOUT).unwrap();
                l.release().unwrap();
            }
            cycles as f64 / t.elapsed().as_secs_f64()
        };
        let mut ops: [Vec<f64>; 3] = Default::default();
        let handles = [&lock, &writer, &reader];
        for r in 0..rounds {
            for k in 0..3 {
                let i = (k + r) % 3;
                ops[i].push(cycle(handles[i]));
            }
        }
        let [l, w, rd] = ops.map(|v| median(&v));
        println!(
            "{engine:<10} {l:>10.0}  {w:>11.0}  {rd:>10.0}  {:>9.2}x  {:>8.2}x",
            l / w,
            l / rd
        );
    }
    println!();
    println!(
        "engine     {readers} readers, one name: round trips per acquire / per release; wall time to all hold"
    );
    for (engine, client, counter) in &engines {
        let Some(counter) = counter else { continue };
        let name = format!("bench/rw-{tag}/shared");
        let sessions: Vec<dlock::Session> = (0..readers)
            .map(|_| client.session(quiet()).unwrap())
            .collect();
        let held: Vec<dlock::Lock> = sessions
            .iter()
            .map(|s| s.rwlock(&name).unwrap().read().unwrap())
            .collect();
        // Each session's lease granted first (a warm-up lock): not counted.
        for s in &sessions {
            let warm = s.lock(&format!("bench/rw-{tag}/warm")).unwrap();
            warm.acquire(TIMEOUT).unwrap();
            warm.release().unwrap();
        }
        let before = counter.count();
        let t = Instant::now();
        std::thread::scope(|scope| {
            for l in &held {
                scope.spawn(move || l.acquire(TIMEOUT).unwrap());
            }
        });
        let all_hold = t.elapsed();
        assert!(
            held.iter().all(|l| l.state() == dlock::State::Holding),
            "readers share"
        );
        let acquired = counter.count();
        for l in &held {
            l.release().unwrap();
        }
        let released = counter.count();
        let n = readers as f64;
        // The counter's own request (PostgreSQL: its query) is in the next count.
        let own = match counter {
            Counter::Etcd(_) => 0.0,
            Counter::Postgres(_) => 1.0,
        };
        println!(
            "{engine:<10} {:>6.2} / {:>6.2}  ({:.0} ms)",
            (acquired - before - own) / n,
            (released - acquired - own) / n,
            all_hold.as_secs_f64() * 1e3
        );
    }
}
