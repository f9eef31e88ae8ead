//! Semaphores on PostgreSQL (`scripts/test-postgres.sh`): the same rules
//! as on etcd (core/tests/etcd_semaphore.rs). The slots are ordinary lock
//! rows named `<name>/slot/<i>`; the limit is one dlock.kv row, `<name>/limit`,
//! put if absent, so first handles racing with different limits agree on
//! one; N+1 contenders and exactly N hold, the loser's timeout leaving no
//! row; a release wakes one waiter (NOTIFY); `dlock.guard(slot, token)`
//! admits the holder's transaction and refuses a stale token; a slot row
//! deleted by an operator fences that holder alone, which takes its slot
//! again, higher; a slot holder cut off by the fault proxy (blackhole, or
//! replies lost with a permit in flight) fences before its slot's next
//! holder acquires, and the other holders keep their permits
//! (sem_faults/mod.rs).
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::thread;
use std::time::Duration;

use dlock::{Client, Error, Options};
use dlock_testkit::pg;
use dlock_testkit::proxy::{Mode, Proxy};

mod sem_cases;
mod sem_faults;

const EVENT: Duration = Duration::from_secs(15);

fn client(url: &str) -> Client {
    pg::client(url, dlock_testkit::backend_options())
}

/// A client on the default timings, for a case about waking, not timing:
/// a 0.5 s keepalive timeout under CI's load (load 9) fenced a holder and
/// freed its slot for a waiter the case did not expect.
fn calm(url: &str) -> Client {
    pg::client(url, Options::default())
}

fn name(test: &str) -> String {
    dlock_testkit::fresh(&format!("pg/sem-{test}"))
}

fn until(what: &str, cond: impl FnMut() -> bool) {
    dlock_testkit::watch::until(what, EVENT, cond);
}

/// The lock rows of the semaphore `name`'s slots.
fn slot_rows(sql: &pg::Sql, name: &str) -> Vec<(String, i64)> {
    sql.query(
        "SELECT name, token FROM dlock.locks WHERE name LIKE $1 || '/slot/%' ORDER BY name",
        &[&name],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn first_handles_racing_with_different_limits_agree_on_one() {
    let url = pg::servers().url;
    let name = name("race");
    let threads: Vec<_> = (0..6u32)
        .map(|i| {
            let (url, name) = (url.clone(), name.clone());
            thread::spawn(move || {
                let limit = 2 + i % 2;
                (limit, client(&url).semaphore(&name, limit).map(|_| ()))
            })
        })
        .collect();
    let results: Vec<(u32, Result<(), Error>)> =
        threads.into_iter().map(|t| t.join().unwrap()).collect();
    let sql = pg::Sql::connect(&url);
    let stored: Vec<u8> = sql
        .query(
            "SELECT value FROM dlock.kv WHERE key = $1",
            &[&format!("{name}/limit").into_bytes()],
        )
        .unwrap()[0]
        .get(0);
    let winner: u32 = String::from_utf8(stored).unwrap().parse().unwrap();
    for (limit, r) in results {
        match r {
            Ok(()) => assert_eq!(limit, winner),
            Err(e) => {
                assert_ne!(limit, winner);
                assert_eq!(e.code(), "invalid_argument");
                let text = e.to_string();
                assert!(
                    text.contains(&format!("limit {winner}")) && text.contains(&limit.to_string()),
                    "{text}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn n_plus_one_contenders_exactly_n_hold() {
    let url = pg::servers().url;
    let name = name("n");
    let n = 3;
    let results =
        dlock_testkit::n_plus_one_contend(|| client(&url), &name, n, Duration::from_secs(3));
    let held = dlock_testkit::exactly_n_hold(&results, n);
    let sql = pg::Sql::connect(&url);
    let rows = slot_rows(&sql, &name);
    assert_eq!(rows.len(), n as usize, "one row per slot: {rows:?}");
    for l in &held {
        let row = rows.iter().find(|(n, _)| n == l.name()).expect("its row");
        assert_eq!(row.1 as u64, l.token().unwrap().get());
    }
    drop(results);
    until("every slot row gone", || slot_rows(&sql, &name).is_empty());
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_release_wakes_one_waiter_onto_that_slot() {
    let url = pg::servers().url;
    let name = name("wake");
    sem_cases::a_release_wakes_one_waiter_onto_that_slot(&|| calm(&url), &name, EVENT);
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn the_guard_takes_a_slot_name_and_token() {
    let url = pg::servers().url;
    let name = name("guard");
    let sem = client(&url).semaphore(&name, 2).unwrap();
    let held = sem.acquire(EVENT).unwrap();
    let token = held.token().unwrap().get() as i64;
    let sql = pg::Sql::connect(&url);
    sql.query("SELECT dlock.guard($1, $2)", &[&held.name(), &token])
        .expect("the holder's token passes the guard");
    let stale = sql
        .query("SELECT dlock.guard($1, $2)", &[&held.name(), &(token - 1)])
        .unwrap_err();
    assert_eq!(
        stale.code().map(|c| c.code()),
        Some(dlock::GUARD_SQLSTATE),
        "{stale}"
    );
    held.release().unwrap();
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_slot_row_deleted_by_an_operator_fences_that_holder_alone() {
    let url = pg::servers().url;
    let sql = pg::Sql::connect(&url);
    sem_cases::a_slot_deleted_by_an_operator_fences_that_holder_alone(
        &|| client(&url),
        &name("fence"),
        EVENT,
        &|cut| {
            sql.query("DELETE FROM dlock.locks WHERE name = $1", &[&cut.name()])
                .unwrap();
        },
    );
}

/// The engine of the fault cases: the cut-off holder reaches the primary
/// through the proxy; the contender is waited for until its row heads the
/// semaphore's queue (`<name>/queue`).
fn fault_engine(run: impl FnOnce(&sem_faults::Engine)) {
    let url = pg::servers().url;
    let cut_off = || {
        let proxy = Proxy::start(pg::addr(&url));
        (client(&pg::via(&url, proxy.addr())), vec![proxy])
    };
    let direct = || client(&url);
    let sql = pg::Sql::connect(&url);
    let queued = |name: &str| {
        let queue = format!("{name}/queue");
        until("the contender heads the semaphore's queue", || {
            !sql.query("SELECT 1 FROM dlock.locks WHERE name = $1", &[&queue])
                .unwrap()
                .is_empty()
        });
    };
    run(&sem_faults::Engine {
        label: "pg ",
        cut_off: &cut_off,
        direct: &direct,
        calm: &|| calm(&url),
        queued: &queued,
        reset_after_lost: true,
    });
}

/// Issue 29 (a) on PostgreSQL: one of N slot holders blackholed drains and
/// fences before the N + 1st contender gets its slot (the server expires
/// the lease a margin after the holder's deadline); the other N − 1 keep
/// their permits.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn fault_slot_holder_blackhole() {
    fault_engine(|e| {
        sem_faults::slot_holder_cut_off(e, "slot holder blackhole", Mode::Blackhole, false)
    });
}

/// Issue 29 (b) on PostgreSQL: replies lost with a permit in flight; the
/// slot passes on only through the revoke, after the permit ended.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn fault_slot_holder_replies_lost_with_work_in_flight() {
    fault_engine(|e| {
        sem_faults::slot_holder_cut_off(
            e,
            "slot holder replies lost, permit in flight",
            Mode::DropReplies,
            true,
        )
    });
}
