//! A clock step on the database host, measured (`scripts/test-postgres.sh`;
//! the stepped server of `scripts/pg-cluster.sh` runs under libfaketime, its
//! wall clock at the offset in `DLOCK_TEST_PG_STEPPED_OFFSET`).
//!
//! The server's clock decides a lease's expiry, the holder's own
//! `CLOCK_BOOTTIME` its deadline; the margin between them is all the room
//! there is. A forward step of the server's clock shortens every live
//! lease by the step. With the holder cut off right as the clock steps:
//! - a step under the margin only eats into the lead: `on_fence` still
//!   comes first, by about margin - step;
//! - a step over the margin lets a contender take the lock while the old
//!   holder still holds, by about step - margin. This is the documented
//!   limit (docs/postgres.md): the database host must slew its clock, never
//!   step it; the resource's token check (`dlock.guard`) is what still
//!   refuses the old holder's writes.
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use dlock::Client;
use dlock_testkit::{MARGIN, pg};
// Only the blackhole of the fault proxy is used here.
#[allow(dead_code)]
use dlock_testkit::proxy;

use proxy::{Mode, Proxy};

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(15);
/// Scheduling slack on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(400);

fn client(url: &str) -> Client {
    let url = format!("{url}?dlock_single_node=true");
    pg::client(&url, dlock_testkit::options(Duration::from_secs(4), false))
}

/// Sets the stepped server's wall clock `secs` ahead of the host's.
fn step(secs: f64) {
    let file = std::env::var("DLOCK_TEST_PG_STEPPED_OFFSET")
        .expect("DLOCK_TEST_PG_STEPPED_OFFSET: run scripts/test-postgres.sh");
    std::fs::write(&file, format!("+{secs}\n")).unwrap();
}

/// Puts the clock back on every way out of the test.
struct Unstep;

impl Drop for Unstep {
    fn drop(&mut self) {
        step(0.0);
    }
}

/// One run: the holder is cut off and the server's clock steps forward by
/// `by` at once. The time from the holder's `on_fence` to the contender's
/// acquisition (negative: the contender acquired first), in ms.
fn cut_and_step(url: &str, by: Duration) -> f64 {
    step(0.0);
    let p = Proxy::start(pg::addr(url));
    let holder = client(&pg::via(url, p.addr()));
    let name = format!("pg/clockstep-{}-{}", std::process::id(), by.as_millis());
    let h = holder.lock(&name).unwrap();
    let (ftx, frx) = mpsc::channel();
    h.on_fence(move |t, _| {
        let _ = ftx.send((Instant::now(), t));
    });
    let t1 = h.acquire(EVENT).unwrap();
    let (waiter, rx) = dlock_testkit::watch::contender(client(url), &name, EVENT);
    // Cut right after a confirmed keepalive (the deadline moved), a whole
    // keepalive interval before the next: the lease has its whole TTL on
    // both sides. (`stats().keepalives` counts sends: a cut after a send
    // may drop that keepalive, its request or only its reply, and the
    // measured lead then varies by the interval.)
    let before = h.deadline();
    let end = Instant::now() + EVENT;
    while h.deadline() == before && Instant::now() < end {
        thread::sleep(Duration::from_millis(2));
    }
    p.set(Mode::Blackhole);
    step(by.as_secs_f64());
    let (fenced, token) = frx.recv_timeout(EVENT).expect("on_fence");
    let (acquired, r) = rx.recv_timeout(EVENT).expect("the contender acquires");
    waiter.join().unwrap();
    step(0.0);
    p.set(Mode::Pass);
    assert_eq!(token, t1);
    assert!(r.expect("contender") > t1, "tokens rise");
    if acquired >= fenced {
        (acquired - fenced).as_secs_f64() * 1e3
    } else {
        -((fenced - acquired).as_secs_f64() * 1e3)
    }
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn a_clock_step_on_the_database_host_shortens_every_lease_by_the_step() {
    let url = std::env::var("DLOCK_TEST_PG_STEPPED_URL")
        .expect("DLOCK_TEST_PG_STEPPED_URL: run scripts/test-postgres.sh");
    let _unstep = Unstep;
    let mut lines = Vec::new();
    for by in [Duration::from_millis(500), Duration::from_secs(3)] {
        let lead = cut_and_step(&url, by);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        // Expected: on_fence leads by margin - step. The cut falls right
        // after a confirmed keepalive and the contender looks again exactly
        // when the server says the lease expires, so no pause widens it.
        let expected = ms(MARGIN) - ms(by);
        lines.push(format!(
            "FAULT|pg clock step +{:.1} s (margin 1 s)|1|-|-|{lead:.0}|expected {expected:.0}",
            by.as_secs_f64()
        ));
        assert!(
            (lead - expected).abs() <= ms(SLACK),
            "step {by:?}: on_fence led the contender by {lead:.0} ms, expected {expected:.0} ms"
        );
        if by < MARGIN {
            assert!(lead > 0.0, "a step under the margin: on_fence first");
        } else {
            assert!(lead < 0.0, "a step over the margin: the contender first");
        }
    }
    for l in lines {
        println!("{l}");
    }
}
