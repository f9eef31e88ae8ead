//! The PostgreSQL test servers of `scripts/pg-cluster.sh`, read from the
//! environment (`target/pg/env`), and a blocking SQL connection for the
//! tests' own statements (an operator's, an application's transaction).
//!
//! The PostgreSQL tests are `#[ignore]`d (a plain `cargo test` does not
//! count them as passed); `scripts/test-postgres.sh` starts the servers and
//! runs them with `--ignored`, where a missing server fails.
// Shared by several test binaries; each uses a part.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// The running test servers.
#[derive(Clone, Debug)]
pub struct Servers {
    /// The primary, with a synchronous standby.
    pub url: String,
    /// The standby (read-only while the primary lives).
    pub standby_url: String,
    /// A server with no standby at all.
    pub lone_url: String,
    /// A role without CREATE on an empty database.
    pub nocreate_url: String,
    /// A role of the lone server that may connect over TLS only.
    pub tls_url: String,
    /// The CA of the lone server's certificate, and one that signed nothing.
    pub ca: String,
    pub other_ca: String,
    pub password: String,
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is unset: run scripts/test-postgres.sh (or source target/pg/env after scripts/pg-cluster.sh start)")
    })
}

/// The servers; panics when there are none (the tests only run under
/// `scripts/test-postgres.sh`).
pub fn servers() -> Servers {
    Servers {
        url: var("DLOCK_TEST_PG_URL"),
        standby_url: var("DLOCK_TEST_PG_STANDBY_URL"),
        lone_url: var("DLOCK_TEST_PG_LONE_URL"),
        nocreate_url: var("DLOCK_TEST_PG_NOCREATE_URL"),
        tls_url: var("DLOCK_TEST_PG_TLS_URL"),
        ca: var("DLOCK_TEST_PG_CA"),
        other_ca: var("DLOCK_TEST_PG_OTHER_CA"),
        password: var("DLOCK_TEST_PG_PASSWORD"),
    }
}

/// `host:port` of a URL of the env file (`postgresql://u:p@host:port/db`).
pub fn addr(url: &str) -> SocketAddr {
    let rest = url.rsplit_once('@').expect("URL with user").1;
    let hostport = rest.split('/').next().unwrap();
    hostport.parse().expect("host:port")
}

/// `url` with its `host:port` replaced (to go through a fault proxy).
pub fn via(url: &str, hostport: SocketAddr) -> String {
    let (auth, rest) = url.rsplit_once('@').unwrap();
    let db = rest.split_once('/').map_or("", |(_, d)| d);
    format!("{auth}@{hostport}/{db}")
}

/// A client of the server at `url` with `options`, or its error.
pub fn connect(url: &str, options: dlock::Options) -> Result<dlock::Client, dlock::Error> {
    let config = dlock::PostgresConfig::parse(url)?;
    dlock::Client::connect(dlock::ClientConfig::postgres(config).with_options(options))
}

/// [`connect`], failing the test with the error.
pub fn client(url: &str, options: dlock::Options) -> dlock::Client {
    connect(url, options).unwrap_or_else(|e| panic!("connect to the test server: {e}"))
}

/// A blocking connection for the tests' own statements.
pub struct Sql {
    rt: tokio::runtime::Runtime,
    pub client: tokio_postgres::Client,
}

impl Sql {
    pub fn connect(url: &str) -> Sql {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("test SQL connection");
            tokio::spawn(async move {
                let _ = conn.await;
            });
            client
        });
        Sql { rt, client }
    }

    /// Runs `sql` with `params`; the rows.
    pub fn query(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.rt.block_on(self.client.query(sql, params))
    }

    /// Runs statements without parameters.
    pub fn batch(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.rt.block_on(self.client.batch_execute(sql))
    }
}

/// The PgBouncer of the test servers (transaction pool mode, in front of
/// the primary): `DLOCK_TEST_PG_BOUNCER_URL`.
pub fn bouncer_url() -> String {
    var("DLOCK_TEST_PG_BOUNCER_URL")
}

/// A database of its own on the server of `url` (`{prefix}_{pid}`), new
/// and owned by dlock, dropped (its connections ended) when this goes.
pub struct ScratchDb {
    admin: Sql,
    name: String,
    /// `url` with this database in place of its own.
    pub url: String,
}

impl ScratchDb {
    pub fn new(url: &str, prefix: &str) -> ScratchDb {
        let name = format!("{prefix}_{}", std::process::id());
        let admin = superuser(url);
        admin
            .batch(&format!("DROP DATABASE IF EXISTS {name}"))
            .unwrap();
        admin
            .batch(&format!("CREATE DATABASE {name} OWNER dlock"))
            .unwrap();
        let (base, _) = url.rsplit_once('/').unwrap();
        let url = format!("{base}/{name}");
        ScratchDb { admin, name, url }
    }
}

impl Drop for ScratchDb {
    fn drop(&mut self) {
        let _ = self
            .admin
            .batch(&format!("DROP DATABASE {} WITH (FORCE)", self.name));
    }
}

/// The superuser on the server of `url` (trusted on loopback by the test
/// servers).
pub fn superuser(url: &str) -> Sql {
    Sql::connect(&format!("postgresql://postgres@{}/postgres", addr(url)))
}

/// `DLOCK_FAULT_RUNS` (default 3, as `scripts/test-postgres.sh`).
pub fn fault_runs() -> usize {
    std::env::var("DLOCK_FAULT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(3)
}

/// `waiter` queues for the lock `holder` holds with `token`, then `holder`
/// releases: the waiter acquires with a higher token within 400 ms of the
/// release (woken by the release's NOTIFY, not by its own timer). The
/// waiter, its token and how long after the release it woke.
pub fn woken_by_notify(
    holder: &dlock::Lock,
    token: dlock::Token,
    waiter: dlock::Lock,
    within: Duration,
) -> (dlock::Lock, dlock::Token, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = std::thread::spawn(move || {
        let r = waiter.acquire(within);
        tx.send(Instant::now()).unwrap();
        (r, waiter)
    });
    // Queued: its first look found the lock held.
    std::thread::sleep(Duration::from_millis(300));
    assert!(rx.try_recv().is_err(), "the waiter acquired a held lock");
    let released = Instant::now();
    holder.release().unwrap();
    let woke = rx.recv_timeout(within).expect("the waiter acquires");
    let (r, waiter) = waiting.join().unwrap();
    let t2 = r.unwrap();
    assert!(t2 > token, "{t2} after {token}");
    let took = woke - released;
    assert!(
        took < Duration::from_millis(400),
        "waiter woke {took:?} after the release: not by NOTIFY"
    );
    (waiter, t2, took)
}

/// Deletes the lock row of `name` as an operator would (exactly one row)
/// and waits up to `within` for the fence of `token` on `fenced` (the
/// holder's `on_fence` reports: when, which token); the time from the
/// delete to the fence, which must be under 250 ms: the key watch, not a
/// keepalive, noticed it.
pub fn operator_delete_fences(
    sql: &Sql,
    name: &str,
    fenced: &Receiver<(Instant, dlock::Token)>,
    token: dlock::Token,
    within: Duration,
) -> Duration {
    let deleted = Instant::now();
    let n = sql
        .query(
            "DELETE FROM dlock.locks WHERE name = $1 RETURNING token",
            &[&name],
        )
        .unwrap();
    assert_eq!(n.len(), 1);
    let (at, t) = fenced
        .recv_timeout(within)
        .expect("fenced by the key watch");
    assert_eq!(t, token);
    let took = at.saturating_duration_since(deleted);
    assert!(
        took < Duration::from_millis(250),
        "fenced {took:?} after the delete"
    );
    took
}
