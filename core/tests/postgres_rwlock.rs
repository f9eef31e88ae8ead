//! Read/write locks on PostgreSQL (`scripts/test-postgres.sh`; docs/design.md
//! §27), the same cases as on etcd (core/tests/etcd_rwlock.rs): readers
//! share and a plain lock is a writer; a queued writer blocks later
//! readers (rows queue at once, tokens from the one sequence); a downgrade
//! keeps the token and wakes queued readers (NOTIFY); `dlock.guard_read`
//! and `dlock.guard_write` in the application's own transaction (SQLSTATE
//! DL001), a guarded write from a read holder refused; a reader cut off
//! (through the fault proxy) fences before a waiting writer acquires, and a
//! writer cut off before waiting readers do (`DLOCK_FAULT_RUNS` runs); an
//! operator deleting a reader's row fences that reader alone; a reader's
//! wait that times out (or a try that does not hold) leaves no row.
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::time::Duration;

use dlock::rwlock::Mode;
use dlock::{Client, Error};
use dlock_testkit::pg;
use dlock_testkit::proxy::{self, Proxy};

mod rw_cases;
use rw_cases::{EVENT, until};

fn client(url: &str) -> Client {
    pg::client(url, dlock_testkit::backend_options())
}

fn name(test: &str) -> String {
    dlock_testkit::fresh(&format!("pg/rw-{test}"))
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn readers_share_and_a_plain_lock_is_a_writer() {
    let url = pg::servers().url;
    rw_cases::readers_share(&|| client(&url), &name("share"));
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_queued_writer_blocks_later_readers() {
    let url = pg::servers().url;
    rw_cases::a_queued_writer_blocks_later_readers(&|| client(&url), &name("fifo"));
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_downgrade_keeps_the_token_and_wakes_queued_readers() {
    let url = pg::servers().url;
    let name = name("downgrade");
    rw_cases::a_downgrade_keeps_the_token(&|| client(&url), &name);
    let sql = pg::Sql::connect(&url);
    let rows = sql
        .query("SELECT key FROM dlock.locks WHERE name = $1", &[&name])
        .unwrap();
    assert!(rows.is_empty(), "nothing left behind");
}

fn guard(sql: &pg::Sql, f: &str, name: &str, token: i64) -> Result<(), String> {
    match sql.query(&format!("SELECT dlock.{f}($1, $2)"), &[&name, &token]) {
        Ok(_) => Ok(()),
        Err(e) => {
            assert_eq!(
                e.code().map(|c| c.code()),
                Some(dlock::GUARD_SQLSTATE),
                "{e}"
            );
            Err(e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_owned()))
        }
    }
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn the_guards_admit_by_mode_and_refuse_a_readers_write() {
    let url = pg::servers().url;
    let name = name("guard");
    let sql = pg::Sql::connect(&url);
    let (a, b) = (client(&url), client(&url));
    let w = a.rwlock(&name).unwrap().write().unwrap();
    let tw = w.acquire(EVENT).unwrap().get() as i64;
    guard(&sql, "guard_write", &name, tw).expect("the writer writes");
    guard(&sql, "guard_read", &name, tw).expect("the writer reads");
    // A queued reader's row is there, but does not hold: refused.
    let r = std::sync::Arc::new(b.rwlock(&name).unwrap().read().unwrap());
    let read = rw_cases::in_background(r.clone());
    let queued: i64 = {
        let mut t = None;
        until("the reader's row is queued", || {
            let rows = sql
                .query(
                    "SELECT token FROM dlock.locks WHERE name = $1 AND token > $2",
                    &[&name, &tw],
                )
                .unwrap();
            t = rows.first().map(|r| r.get(0));
            t.is_some()
        });
        t.unwrap()
    };
    assert!(
        guard(&sql, "guard_read", &name, queued).is_err(),
        "queued, not holding"
    );
    w.downgrade().unwrap();
    let tr = read.recv_timeout(EVENT).unwrap().unwrap().get() as i64;
    assert_eq!(tr, queued, "the queued row's token is the holder's");
    guard(&sql, "guard_read", &name, tr).expect("the reader reads");
    guard(&sql, "guard_read", &name, tw).expect("the downgraded writer reads");
    let e = guard(&sql, "guard_write", &name, tw).unwrap_err();
    assert!(e.contains("reading"), "{e}");
    assert!(
        guard(&sql, "guard_write", &name, tr).is_err(),
        "a reader may not write"
    );
    assert_eq!(
        r.guarded_put(r.token().unwrap(), b"pg/rw-k", b"v")
            .unwrap_err()
            .code(),
        "invalid_argument"
    );
    // The guard holds the name's row in the application's transaction.
    sql.batch(&format!(
        "BEGIN; SELECT dlock.guard_read('{name}', {tr}); COMMIT;"
    ))
    .unwrap();
    r.release().unwrap();
    assert!(guard(&sql, "guard_read", &name, tr).is_err(), "released");
    w.release().unwrap();
    assert!(guard(&sql, "guard_read", &name, tw).is_err(), "released");
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn an_operator_deleting_a_readers_row_fences_that_reader_alone() {
    let url = pg::servers().url;
    let name = name("operator");
    let sql = pg::Sql::connect(&url);
    rw_cases::an_operator_deleting_a_readers_key_fences_that_reader_alone(
        &|| client(&url),
        &name,
        &|ta| {
            sql.query(
                "DELETE FROM dlock.locks WHERE name = $1 AND token = $2",
                &[&name, &(ta.get() as i64)],
            )
            .unwrap();
        },
        &|| {
            let w = client(&url).rwlock(&name).unwrap().write().unwrap();
            assert_eq!(w.try_acquire(), Err(Error::WouldBlock));
        },
    );
}

fn cut_off(held: Mode, waits: Mode) {
    let s = pg::servers();
    for run in 0..pg::fault_runs() {
        let proxy = Proxy::start(pg::addr(&s.url));
        let cut_client = client(&pg::via(&s.url, proxy.addr()));
        let m = rw_cases::cut_off(
            &|| client(&s.url),
            &cut_client,
            &|| proxy.set(proxy::Mode::Blackhole),
            &|| proxy.set(proxy::Mode::Pass),
            &name(&format!("cut-{held}-{waits}")),
            held,
            waits,
        );
        println!(
            "rwlock cut-off on PostgreSQL ({held} holder, {waits} waiters) run {run}: fenced {} ms before a waiter acquired",
            m.acquired.saturating_since(m.fenced).as_millis()
        );
    }
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_reader_cut_off_fences_before_a_waiting_writer_acquires() {
    cut_off(Mode::Read, Mode::Write);
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_writer_cut_off_fences_before_waiting_readers_acquire() {
    cut_off(Mode::Write, Mode::Read);
}

/// A reader's row queues at once; a wait that times out (or a try that
/// does not hold) leaves no row behind.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_timed_out_reader_leaves_no_row() {
    let url = pg::servers().url;
    let name = name("timeout");
    let sql = pg::Sql::connect(&url);
    let rows = || {
        sql.query("SELECT token FROM dlock.locks WHERE name = $1", &[&name])
            .unwrap()
            .len()
    };
    let w = client(&url).rwlock(&name).unwrap().write().unwrap();
    w.acquire(EVENT).unwrap();
    let r = client(&url).rwlock(&name).unwrap().read().unwrap();
    assert_eq!(r.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(rows(), 1, "a try that did not hold left no row");
    assert_eq!(r.acquire(Duration::from_secs(1)), Err(Error::Timeout));
    until("the timed-out wait left no row", || rows() == 1);
    w.release().unwrap();
    r.acquire(EVENT).unwrap();
    assert_eq!(rows(), 1);
}
