//! The nemesis on PostgreSQL (`nemesis run --backend postgres`): the
//! resource is a user table, `app.writes`, written by each holder's own
//! transactions under `dlock.guard(name, token)` over a direct connection
//! of its own; the primary of `scripts/pg-cluster.sh` is paused and
//! restarted; an operator deletes lease and lock rows. This module holds
//! the SQL of all that: the holder's guarded transaction
//! ([`GuardedWriter`]), the table's read-back ([`dump_rows`]), and the
//! driver's faults on the server.
//!
//! The read/write mode's resource is the two-key register `app.register`
//! (rows `a` and `b` of each run): a writer's transaction updates both
//! under `dlock.guard_write`, a reader's selects both under
//! `dlock.guard_read` ([`GuardedWriter::register`]), each key its own
//! statement, so only the guards keep a read from seeing a torn pair.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio_postgres::NoTls;

use crate::history::{Writer, now};

/// The user table: one row per committed guarded write (`run` tells the
/// runs apart; `id` is drawn inside the transaction, after the guard, so
/// the ids order the commits of one lock: see [`dump_rows`]).
pub const TABLE_SQL: &str = "CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.writes (
    id bigserial PRIMARY KEY,
    run text NOT NULL,
    h text NOT NULL,
    seq bigint NOT NULL,
    token bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS writes_run ON app.writes (run, id);
CREATE TABLE IF NOT EXISTS app.register (
    run text NOT NULL,
    k text NOT NULL,
    token bigint NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (run, k)
);";

/// The guard, the first statement of the holder's transaction.
pub const GUARD_SQL: &str = "SELECT dlock.guard($1, $2)";
/// The write, second.
pub const INSERT_SQL: &str = "INSERT INTO app.writes (run, h, seq, token) VALUES ($1, $2, $3, $4)";

/// The register's two rows of a run (`0.0`: unwritten), made by each
/// holder as it connects (the first one wins).
pub const REGISTER_ROWS_SQL: &str = "INSERT INTO app.register (run, k, token, seq) \
     VALUES ($1, 'a', 0, 0), ($1, 'b', 0, 0) ON CONFLICT DO NOTHING";
/// A writer's guard, the first statement of its transaction.
pub const GUARD_WRITE_SQL: &str = "SELECT dlock.guard_write($1, $2)";
/// A reader's.
pub const GUARD_READ_SQL: &str = "SELECT dlock.guard_read($1, $2)";
/// A write of one key (`$2`: `a`, then `b`).
pub const REGISTER_UPDATE_SQL: &str =
    "UPDATE app.register SET token = $3, seq = $4 WHERE run = $1 AND k = $2";
/// A read of one key.
pub const REGISTER_SELECT_SQL: &str =
    "SELECT token, seq FROM app.register WHERE run = $1 AND k = $2";

/// Whether `s` is a PostgreSQL URL (dlock selects the engine by it).
pub fn is_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The `host:port` of a URL `postgres[ql]://[user[:pw]@]host:port/...`.
fn host_span(url: &str) -> Result<(usize, usize), String> {
    let rest = url
        .find("://")
        .map(|i| i + 3)
        .ok_or_else(|| format!("not a URL: {url}"))?;
    let start = url[rest..].find('@').map_or(rest, |i| rest + i + 1);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    Ok((start, end))
}

/// The server address of `url` (one host, with a port).
pub fn addr_of(url: &str) -> Result<SocketAddr, String> {
    let (a, b) = host_span(url)?;
    url[a..b]
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}", &url[a..b]))?
        .next()
        .ok_or_else(|| format!("{}: no address", &url[a..b]))
}

/// `url` with its host and port replaced by `addr` (a holder's proxy).
pub fn via(url: &str, addr: SocketAddr) -> String {
    let (a, b) = host_span(url).expect("a PostgreSQL URL");
    format!("{}{addr}{}", &url[..a], &url[b..])
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs `f` on a fresh connection to `url` (up to `within`).
pub fn with_client<T>(
    url: &str,
    within: Duration,
    f: impl AsyncFnOnce(&tokio_postgres::Client) -> Result<T, tokio_postgres::Error>,
) -> Result<T, String> {
    runtime().block_on(async {
        let go = async {
            let (client, conn) = tokio_postgres::connect(url, NoTls)
                .await
                .map_err(|e| format!("connect: {e}"))?;
            tokio::spawn(conn);
            f(&client).await.map_err(|e| match e.as_db_error() {
                Some(d) => format!("{}: {}", d.code().code(), d.message()),
                None => e.to_string(),
            })
        };
        tokio::time::timeout(within, go)
            .await
            .map_err(|_| format!("no answer in {within:?}"))?
    })
}

/// Creates the user table (idempotent).
pub fn setup(url: &str) -> Result<(), String> {
    with_client(url, Duration::from_secs(10), async |c| {
        c.batch_execute(TABLE_SQL).await
    })
    .map_err(|e| format!("creating app.writes: {e}"))
}

/// The rows of run `run`, in id order, as `pg_row` records (`rev`: the
/// row's id, `h`, `seq`, `token`; `t` 0) in `path`. An id is drawn by the
/// INSERT, after the guard took the name's row `FOR SHARE`; a takeover
/// (which draws the next token under that row `FOR UPDATE`) waits for the
/// guarded transaction to end, so among committed rows a lower id is an
/// earlier write, and a lower token after a higher one is a stale write
/// the database accepted (G2).
pub fn dump_rows(url: &str, run: &str, path: &Path) -> Result<u64, String> {
    dump_rows_of(url, run, path, None)
}

/// [`dump_rows`], every record tagged `"li": li` (a semaphore's slot).
pub fn dump_rows_of(url: &str, run: &str, path: &Path, li: Option<usize>) -> Result<u64, String> {
    let log = Writer::open(path, "postgres").map_err(|e| e.to_string())?;
    let mut last = Err(String::new());
    for _ in 0..5 {
        last = with_client(url, Duration::from_secs(30), async |c| {
            c.query(
                "SELECT id, h, seq, token FROM app.writes WHERE run = $1 ORDER BY id",
                &[&run],
            )
            .await
        });
        if last.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let rows = last.map_err(|e| format!("reading app.writes back: {e}"))?;
    for r in &rows {
        let (id, h, seq, token): (i64, String, i64, i64) = (r.get(0), r.get(1), r.get(2), r.get(3));
        let mut rec = json!({"rev": id, "h": h, "seq": seq, "token": token});
        if let Some(li) = li {
            rec["li"] = li.into();
        }
        log.record_at(0, "pg_row", rec);
    }
    Ok(rows.len() as u64)
}

/// The holder of lock `name` now: (token, lease id).
pub fn holder_of(url: &str, name: &str) -> Option<(u64, i64)> {
    with_client(url, Duration::from_secs(5), async |c| {
        c.query(
            "SELECT token, lease FROM dlock.locks WHERE name = $1 ORDER BY token LIMIT 1",
            &[&name],
        )
        .await
    })
    .ok()?
    .first()
    .map(|r| (r.get::<_, i64>(0) as u64, r.get::<_, i64>(1)))
}

/// An operator's revoke: deletes the lease row (its locks go with it).
pub fn delete_lease(url: &str, lease: i64) -> Result<u64, String> {
    with_client(url, Duration::from_secs(5), async |c| {
        c.execute("DELETE FROM dlock.leases WHERE id = $1", &[&lease])
            .await
    })
}

/// An operator's delete of the lock row of token `token`.
pub fn delete_lock(url: &str, token: u64) -> Result<u64, String> {
    let token = token as i64;
    with_client(url, Duration::from_secs(5), async |c| {
        c.execute("DELETE FROM dlock.locks WHERE token = $1", &[&token])
            .await
    })
}

/// `url` as the superuser `postgres` (trusted on loopback by the test
/// cluster's `pg_hba.conf`): `pg_stat_replication` shows the sync state
/// to privileged roles only.
fn as_superuser(url: &str) -> String {
    let scheme = url.find("://").map_or(0, |i| i + 3);
    let (a, _) = host_span(url).expect("a PostgreSQL URL");
    format!("{}postgres@{}", &url[..scheme], &url[a..])
}

/// Whether the primary commits synchronously again (its standby streams
/// in `sync` state): the end of a restart.
pub fn synchronous(url: &str) -> bool {
    with_client(&as_superuser(url), Duration::from_secs(3), async |c| {
        c.query(
            "SELECT 1 FROM pg_stat_replication WHERE sync_state = 'sync'",
            &[],
        )
        .await
    })
    .is_ok_and(|rows| !rows.is_empty())
}

/// The primary and the standby of `scripts/pg-cluster.sh` (their data in
/// `dir`/primary and `dir`/standby).
#[derive(Clone, Debug)]
pub struct Primary {
    /// `DLOCK_TEST_PG_DIR`.
    pub dir: PathBuf,
}

const BIN: &str = "/usr/lib/postgresql/15/bin";

impl Primary {
    /// The postmaster's pid of `server` (`primary`, `standby`): the first
    /// line of its `postmaster.pid`.
    pub fn postmaster(&self, server: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(server).join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The postmaster and every process it forked (backends, walsender,
    /// checkpointer, ...), from /proc.
    fn tree(&self, server: &str) -> Vec<i32> {
        let Some(pm) = self.postmaster(server) else {
            return Vec::new();
        };
        let mut pids = vec![pm];
        if let Ok(rd) = std::fs::read_dir("/proc") {
            for e in rd.flatten() {
                let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                // pid (comm) state ppid ...: comm may hold spaces.
                let ppid = stat
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|p| p.parse::<i32>().ok());
                if ppid == Some(pm) {
                    pids.push(pid);
                }
            }
        }
        pids
    }

    /// SIGSTOPs the postmaster of `server` (first: it forks nothing more)
    /// and its children; returns them for [`Primary::resume`].
    pub fn pause(&self, server: &str) -> Vec<i32> {
        let mut stopped = Vec::new();
        for _ in 0..2 {
            // Twice: a child forked just before the postmaster stopped.
            for pid in self.tree(server) {
                if !stopped.contains(&pid) {
                    // SAFETY: kill(2) on a process of the test server.
                    unsafe { libc::kill(pid, libc::SIGSTOP) };
                    stopped.push(pid);
                }
            }
        }
        stopped
    }

    /// SIGCONTs what [`Primary::pause`] stopped.
    pub fn resume(&self, pids: &[i32]) {
        for &pid in pids.iter().rev() {
            // SAFETY: kill(2) on a process of the test server.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<(), String> {
        let data = self.dir.join("primary");
        let mut cmd = if unsafe { libc::geteuid() } == 0 {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(format!("{BIN}/pg_ctl"));
            c
        } else {
            Command::new(format!("{BIN}/pg_ctl"))
        };
        let st = cmd
            .arg("-D")
            .arg(&data)
            .args(["-w", "-t", "60"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("pg_ctl: {e}"))?;
        if st.success() {
            Ok(())
        } else {
            Err(format!("pg_ctl {args:?}: {st}"))
        }
    }

    /// Kills the primary (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, crash recovery at the start) and starts it again;
    /// returns once it commits synchronously again (up to 60 s).
    pub fn restart(&self, url: &str) -> Result<(), String> {
        // A retry after a failed start finds it stopped (or running):
        // either is fine here, the start and the wait decide.
        let _ = self.pg_ctl(&["-m", "immediate", "stop"]);
        let log = self.dir.join("primary.log");
        let log = log.to_string_lossy().into_owned();
        if let Err(e) = self.pg_ctl(&["-l", &log, "start"]) {
            if self.pg_ctl(&["status"]).is_err() {
                return Err(e);
            }
        }
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if synchronous(url) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("the restarted primary did not commit synchronously in 60 s".into())
    }
}

/// A holder's own connection for its guarded transactions (reopened after
/// an error), straight to the server: a fault between the holder and
/// dlock's connections (its proxy) leaves it alone, so a stale holder's
/// write does reach the database, which must refuse it.
pub struct GuardedWriter {
    url: String,
    /// Off: the control of the cases (`--guard 0`), writes without the
    /// guard, which the checker must catch.
    guard: bool,
    rt: tokio::runtime::Runtime,
    conn: Option<Conn>,
}

struct Conn {
    client: tokio_postgres::Client,
    guard: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
    /// The register's statements, prepared (and the run's rows made) on
    /// the first register transaction of the connection.
    rw: Option<RwStatements>,
}

struct RwStatements {
    guard_read: tokio_postgres::Statement,
    guard_write: tokio_postgres::Statement,
    update: tokio_postgres::Statement,
    select: tokio_postgres::Statement,
}

/// A key of the register as (token, seq).
pub type Cell = (u64, u64);

/// A transaction's fate: `out` (`ok`, `fenced`: the guard raised DL001,
/// `unknown`: the COMMIT went out and no answer came, `error`: nothing was
/// committed), the SQLSTATE or error `code`, a message.
pub struct Outcome {
    /// `ok`, `fenced`, `unknown` or `error`.
    pub out: &'static str,
    /// SQLSTATE, or `timeout` / `io`.
    pub code: String,
    /// The error's text.
    pub msg: String,
    /// When the last answer came ([`crate::history::now`]): on success the
    /// COMMIT's, on a refusal the guard's.
    pub at: u64,
}

impl GuardedWriter {
    /// A writer to `url` (connects on first use).
    pub fn new(url: &str, guard: bool) -> GuardedWriter {
        GuardedWriter {
            url: url.to_owned(),
            guard,
            rt: runtime(),
            conn: None,
        }
    }

    /// `BEGIN; SELECT dlock.guard(name, token); INSERT INTO app.writes
    /// (run, h, seq, token) ...; COMMIT`, four round trips (as an
    /// application's transaction: a pause may fall between them), all
    /// within `within`.
    pub fn write(
        &mut self,
        name: &str,
        token: u64,
        run: &str,
        h: &str,
        seq: u64,
        within: Duration,
    ) -> Outcome {
        let guarded = self.guard;
        let (tok, seq) = (token as i64, seq as i64);
        self.transact(within, None, async |c, stage| {
            if guarded {
                stage.set("guard");
                c.client.execute(&c.guard, &[&name, &tok]).await?;
            }
            stage.set("insert");
            c.client.execute(&c.insert, &[&run, &h, &seq, &tok]).await?;
            Ok(())
        })
        .0
    }

    /// One write (`write`) or read of the register's run `run`: `BEGIN;
    /// SELECT dlock.guard_write|guard_read(name, token);` then key `a`,
    /// then key `b`, each a statement of its own (an `UPDATE` to
    /// `token.seq`, or a `SELECT`); `COMMIT`. Five round trips in READ
    /// COMMITTED, all within `within`: a writer's commit between a
    /// reader's two selects is seen half, so only the guards (and the
    /// lock) keep a read whole. Returns the outcome and, when it is `ok`,
    /// the pair written or read. `--guard 0`: no guard.
    pub fn register(
        &mut self,
        name: &str,
        token: u64,
        run: &str,
        seq: u64,
        write: bool,
        within: Duration,
    ) -> (Outcome, Option<[Cell; 2]>) {
        let guarded = self.guard;
        let (tok, sq) = (token as i64, seq as i64);
        self.transact(within, Some(run), async |c, stage| {
            let rw = c.rw.as_ref().expect("prepared by transact");
            if guarded {
                stage.set("guard");
                let g = if write {
                    &rw.guard_write
                } else {
                    &rw.guard_read
                };
                c.client.execute(g, &[&name, &tok]).await?;
            }
            let mut pair = [(0, 0); 2];
            for (k, cell) in ["a", "b"].into_iter().zip(pair.iter_mut()) {
                stage.set(if write { "update" } else { "select" });
                *cell = if write {
                    c.client.execute(&rw.update, &[&run, &k, &tok, &sq]).await?;
                    (token, seq)
                } else {
                    let row = c.client.query_one(&rw.select, &[&run, &k]).await?;
                    (row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64)
                };
            }
            Ok(pair)
        })
    }

    /// Runs `body` between `BEGIN` and `COMMIT` on the connection (opened
    /// first if need be; `register`: the register's statements prepared
    /// and that run's rows made too), all within `within`; `stage` names
    /// the statement under way, for the outcome: DL001 is `fenced`, no
    /// answer to the COMMIT `unknown`, anything else `error`.
    fn transact<T>(
        &mut self,
        within: Duration,
        register: Option<&str>,
        body: impl AsyncFnOnce(
            &Conn,
            &std::cell::Cell<&'static str>,
        ) -> Result<T, tokio_postgres::Error>,
    ) -> (Outcome, Option<T>) {
        let stage = std::cell::Cell::new("connect");
        let mut conn = self.conn.take();
        let url = self.url.clone();
        let r = self.rt.block_on(async {
            tokio::time::timeout(within, async {
                if conn.is_none() {
                    let (client, c) = tokio_postgres::connect(&url, NoTls).await?;
                    tokio::spawn(c);
                    let guard = client.prepare(GUARD_SQL).await?;
                    let insert = client.prepare(INSERT_SQL).await?;
                    conn = Some(Conn {
                        client,
                        guard,
                        insert,
                        rw: None,
                    });
                }
                if let (Some(run), Some(c)) = (register, conn.as_mut()) {
                    if c.rw.is_none() {
                        stage.set("prepare");
                        c.client.execute(REGISTER_ROWS_SQL, &[&run]).await?;
                        c.rw = Some(RwStatements {
                            guard_read: c.client.prepare(GUARD_READ_SQL).await?,
                            guard_write: c.client.prepare(GUARD_WRITE_SQL).await?,
                            update: c.client.prepare(REGISTER_UPDATE_SQL).await?,
                            select: c.client.prepare(REGISTER_SELECT_SQL).await?,
                        });
                    }
                }
                let c = conn.as_ref().expect("connected");
                stage.set("begin");
                c.client.batch_execute("BEGIN").await?;
                let v = body(c, &stage).await?;
                stage.set("commit");
                c.client.batch_execute("COMMIT").await?;
                Ok::<T, tokio_postgres::Error>(v)
            })
            .await
        });
        let at = stage.get();
        let (outcome, value) = match r {
            Ok(Ok(v)) => (
                Outcome {
                    out: "ok",
                    code: String::new(),
                    msg: String::new(),
                    at: now(),
                },
                Some(v),
            ),
            Ok(Err(e)) => {
                let code = e
                    .as_db_error()
                    .map_or("io".to_owned(), |d| d.code().code().to_owned());
                let out = if code == dlock::GUARD_SQLSTATE {
                    "fenced"
                } else if at == "commit" && e.as_db_error().is_none() {
                    "unknown"
                } else {
                    "error"
                };
                let msg = format!("{at}: {e}");
                (
                    Outcome {
                        out,
                        code,
                        msg,
                        at: now(),
                    },
                    None,
                )
            }
            Err(_) => (
                Outcome {
                    out: if at == "commit" { "unknown" } else { "error" },
                    code: "timeout".into(),
                    msg: format!("{at}: no answer in {within:?}"),
                    at: now(),
                },
                None,
            ),
        };
        // After a refusal the transaction is aborted: roll it back and keep
        // the connection; after anything else but success, drop it (the
        // server rolls back an open transaction when it goes).
        match outcome.out {
            "ok" => self.conn = conn,
            "fenced" => {
                if let Some(c) = conn {
                    let back = self.rt.block_on(async {
                        tokio::time::timeout(within, c.client.batch_execute("ROLLBACK")).await
                    });
                    if matches!(back, Ok(Ok(()))) {
                        self.conn = Some(c);
                    }
                }
            }
            _ => {}
        }
        (outcome, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = "postgresql://dlock:pw@127.0.0.1:25430/dlock?sslmode=disable";
        assert_eq!(addr_of(u).unwrap(), "127.0.0.1:25430".parse().unwrap());
        assert_eq!(
            via(u, "127.0.0.1:4000".parse().unwrap()),
            "postgresql://dlock:pw@127.0.0.1:4000/dlock?sslmode=disable"
        );
        assert_eq!(
            as_superuser(u),
            "postgresql://postgres@127.0.0.1:25430/dlock?sslmode=disable"
        );
        assert!(is_url(u) && !is_url("http://127.0.0.1:2379"));
    }
}
