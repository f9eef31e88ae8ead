//! Sessions (docs/design.md §9): many locks on one lease, on the embedded
//! backend in real time. One lease for every lock of a session; acquire and
//! release without a grant or a revoke; the two-stage rule for the whole
//! session; a deleted key fences one lock; sessions do not share fate.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use dlock::{Client, ClientConfig, Error, MemoryService, Options, Refused, State};

use dlock_testkit as common;
use dlock_testkit::embedded::{client, eventually, ms};

fn fence_counter(lock: &dlock::Lock) -> Arc<AtomicU32> {
    let n = Arc::new(AtomicU32::new(0));
    let c = n.clone();
    lock.on_fence(move |_, _| {
        c.fetch_add(1, Ordering::SeqCst);
    });
    n
}

#[test]
fn the_locks_of_a_session_share_one_lease_and_release_costs_no_revoke() {
    let service = MemoryService::new();
    let c = client(&service);
    let session = c.default_session().clone();
    assert_eq!(session.lease(), None, "no lease before the first acquire");
    let locks: Vec<_> = (0..50)
        .map(|i| c.lock(&format!("sessions/one-lease/{i}")).unwrap())
        .collect();
    let mut tokens = Vec::new();
    for l in &locks {
        tokens.push(l.acquire(ms(2000)).unwrap());
    }
    let lease = session.lease().expect("a lease once acquired");
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    for (i, l) in locks.iter().enumerate() {
        assert_eq!(
            service.holder(&format!("sessions/one-lease/{i}")),
            Some(tokens[i])
        );
        assert_eq!(l.permit().unwrap().token(), tokens[i]);
    }
    // Release one: its name is free at once, the others hold, same lease.
    locks[7].release().unwrap();
    assert_eq!(service.holder("sessions/one-lease/7"), None);
    assert_eq!(locks[7].permit().unwrap_err(), Refused::Released);
    assert_eq!(locks[8].state(), State::Holding);
    // Acquire it again on the live lease: a new token, no new lease.
    let again = locks[7].acquire(ms(2000)).unwrap();
    assert!(again > tokens[49]);
    assert_eq!(session.lease(), Some(lease));
    // Across several keepalive intervals: one keepalive per interval for
    // all 50 locks, none fenced.
    let before = session.stats().keepalives;
    std::thread::sleep(ms(1600));
    let sent = session.stats().keepalives - before;
    assert!(
        (2..=5).contains(&sent),
        "{sent} keepalives in 1.6 s at 500 ms"
    );
    assert!(locks.iter().all(|l| l.state() == State::Holding));
    assert_eq!(session.lease(), Some(lease));
    assert_eq!(session.stats().locks, 50);
    let extra = c.lock("sessions/one-lease/extra").unwrap();
    assert_eq!(session.stats().locks, 51, "counted at once");
    drop(extra);
}

#[test]
fn a_partition_drains_and_fences_every_lock_of_the_session_and_they_reacquire_higher() {
    let service = MemoryService::new();
    let c = client(&service);
    let link = c.link().unwrap().clone();
    let locks: Vec<_> = (0..5)
        .map(|i| c.lock(&format!("sessions/partition/{i}")).unwrap())
        .collect();
    let fences: Vec<_> = locks.iter().map(fence_counter).collect();
    let first: Vec<_> = locks.iter().map(|l| l.acquire(ms(2000)).unwrap()).collect();
    let lease = c.default_session().lease().unwrap();
    link.partition();
    assert!(eventually(ms(1000), || locks
        .iter()
        .all(|l| l.state() == State::Draining)));
    assert!(eventually(ms(3000), || fences
        .iter()
        .all(|f| f.load(Ordering::SeqCst) == 1)));
    assert!(locks.iter().all(|l| l.permit().is_err()));
    link.heal();
    assert!(eventually(ms(5000), || locks
        .iter()
        .all(|l| l.state() == State::Holding)));
    for (l, t) in locks.iter().zip(&first) {
        assert!(l.token().unwrap() > *t, "reacquired higher");
    }
    assert_ne!(c.default_session().lease(), Some(lease), "a new lease");
    assert!(
        fences.iter().all(|f| f.load(Ordering::SeqCst) == 1),
        "once each"
    );
}

#[test]
fn a_deleted_key_fences_its_lock_alone() {
    let service = MemoryService::new();
    let c = client(&service);
    let a = c.lock("sessions/deleted/a").unwrap();
    let b = c.lock("sessions/deleted/b").unwrap();
    let (fa, fb) = (fence_counter(&a), fence_counter(&b));
    let ta = a.acquire(ms(2000)).unwrap();
    let tb = b.acquire(ms(2000)).unwrap();
    let lease = c.default_session().lease().unwrap();
    assert!(service.delete_lock_key("sessions/deleted/a"));
    assert!(eventually(ms(2000), || fa.load(Ordering::SeqCst) == 1));
    assert!(eventually(ms(2000), || a.token().is_some_and(|t| t > ta)));
    assert_eq!(fb.load(Ordering::SeqCst), 0);
    assert_eq!(b.token(), Some(tb));
    assert_eq!(b.state(), State::Holding);
    assert_eq!(a.stats().fences_lock_lost, 1);
    assert_eq!(c.default_session().lease(), Some(lease), "same lease");
}

#[test]
fn two_sessions_of_one_client_do_not_share_fate() {
    let service = MemoryService::new();
    let c = client(&service);
    let other = c.session(common::short()).unwrap();
    let a = c.lock("sessions/fate/a").unwrap();
    let b = other.lock("sessions/fate/b").unwrap();
    let (fa, fb) = (fence_counter(&a), fence_counter(&b));
    a.acquire(ms(2000)).unwrap();
    let tb = b.acquire(ms(2000)).unwrap();
    let (la, lb) = (c.default_session().lease().unwrap(), other.lease().unwrap());
    assert_ne!(la, lb);
    assert!(service.revoke_lease(la));
    assert!(eventually(ms(2000), || fa.load(Ordering::SeqCst) == 1));
    // The other session goes on: two more of its keepalives (the second
    // sent only after the first's round) and still no fence.
    let sent = other.stats().keepalives;
    assert!(eventually(ms(5000), || other.stats().keepalives >= sent + 2));
    assert_eq!(fb.load(Ordering::SeqCst), 0);
    assert_eq!(b.token(), Some(tb));
    assert_eq!(other.lease(), Some(lb));
}

#[test]
fn two_handles_of_one_name_on_one_session_exclude_each_other() {
    let service = MemoryService::new();
    let c = client(&service);
    let first = c.lock("sessions/same-name").unwrap();
    let second = Arc::new(c.lock("sessions/same-name").unwrap());
    let t1 = first.acquire(ms(2000)).unwrap();
    assert_eq!(second.try_acquire().unwrap_err(), Error::WouldBlock);
    assert_eq!(second.acquire(ms(300)).unwrap_err(), Error::Timeout);
    let waiter = {
        let second = second.clone();
        std::thread::spawn(move || second.acquire(ms(5000)))
    };
    // Once the second is waiting (not before: a thread not yet started
    // proves nothing), it has not acquired.
    assert!(eventually(ms(2000), || second.state() == State::Acquiring));
    assert!(!waiter.is_finished(), "the second waits for the first");
    assert_eq!(second.token(), None);
    first.release().unwrap();
    let t2 = waiter.join().unwrap().unwrap();
    assert!(t2 > t1);
    assert_eq!(service.holder("sessions/same-name"), Some(t2));
    assert_eq!(first.state(), State::Released);
}

#[test]
fn closing_a_session_releases_its_locks_and_revokes_its_lease() {
    let service = MemoryService::new();
    let c = client(&service);
    let s = c.session(common::short()).unwrap();
    let locks: Vec<_> = (0..10)
        .map(|i| s.lock(&format!("sessions/close/{i}")).unwrap())
        .collect();
    for l in &locks {
        l.acquire(ms(2000)).unwrap();
    }
    let lease = s.lease().unwrap();
    s.close().unwrap();
    assert!(locks.iter().all(|l| l.state() == State::Released));
    assert!((0..10).all(|i| service.holder(&format!("sessions/close/{i}")).is_none()));
    assert!(!service.lease_alive(lease), "revoked before close returned");
    assert_eq!(locks[0].acquire(ms(500)).unwrap_err(), Error::Released);
    assert_eq!(s.lock("sessions/close/late").unwrap_err(), Error::Released);
    s.close().unwrap(); // twice: harmless
    // The default session closes only with its client.
    match c.default_session().close() {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("default session"), "{m}"),
        other => panic!("expected invalid_argument, got {other:?}"),
    }
    // The client's default session is untouched.
    let d = c.lock("sessions/close/0").unwrap();
    d.acquire(ms(2000)).unwrap();
}

#[test]
fn dropping_a_session_and_its_locks_revokes_its_lease() {
    let service = MemoryService::new();
    let c = client(&service);
    let s = c.session(common::short()).unwrap();
    let l = s.lock("sessions/drop").unwrap();
    l.acquire(ms(2000)).unwrap();
    let lease = s.lease().unwrap();
    drop(s);
    assert!(eventually(ms(100), || service
        .holder("sessions/drop")
        .is_some()));
    drop(l);
    // The key goes with the drop, the lease with the session's task once
    // nothing is left. (No check that the lease outlives the drop: the
    // task may revoke it before this thread looks, as it did in a CI run.)
    assert!(eventually(ms(2000), || service
        .holder("sessions/drop")
        .is_none()));
    assert!(eventually(ms(2000), || !service.lease_alive(lease)));
}

#[test]
fn a_session_with_bad_options_is_refused() {
    let c = Client::connect(ClientConfig::embedded_in(MemoryService::new())).unwrap();
    let bad = Options {
        ttl: ms(1000),
        ..Options::default()
    };
    match c.session(bad) {
        Err(Error::InvalidOption { setting, .. }) => assert_eq!(setting, "ttl"),
        other => panic!("expected an invalid option, got {other:?}"),
    }
}

#[test]
fn many_locks_acquire_and_release_quickly_on_one_lease() {
    let service = MemoryService::new();
    let c = client(&service);
    let l = c.lock("sessions/cycle").unwrap();
    l.acquire(ms(2000)).unwrap();
    l.release().unwrap();
    let lease = c.default_session().lease().unwrap();
    let start = Instant::now();
    let mut last = None;
    for _ in 0..200 {
        let t = l.acquire(ms(2000)).unwrap();
        assert!(last.is_none_or(|p| t > p));
        last = Some(t);
        l.release().unwrap();
    }
    assert_eq!(c.default_session().lease(), Some(lease), "no new lease");
    eprintln!("200 acquire+release cycles: {:?}", start.elapsed());
}

/// A fenced lease is revoked once its last permit ends (§11 a). A
/// `Session::close` right after the fence finds no lease of its own, and
/// returns only once that revoke was answered (within a keepalive timeout
/// or two), whether the permit ended before the close or during it: so a
/// process that exits once closed (the `dlock` command after a fence) does
/// not cut the revoke off and leave the lock blocked until the lease
/// expires.
#[test]
fn closing_right_after_a_fence_waits_for_the_fenced_leases_revoke() {
    close_after_fence(false);
}

#[test]
fn closing_before_the_fenced_work_ends_waits_for_the_revoke_too() {
    close_after_fence(true);
}

fn close_after_fence(close_first: bool) {
    let service = MemoryService::new();
    service.freeze_expiry(true); // the lease lives until revoked
    let c = client(&service);
    let s = c
        .session(Options {
            ttl: ms(4000),
            keepalive_interval: ms(1000),
            keepalive_timeout: ms(900),
            retry_interval: ms(200),
            margin: ms(1000),
            reacquire: false,
        })
        .unwrap();
    let l = s.lock("sessions/close-after-fence").unwrap();
    l.acquire(ms(2000)).unwrap();
    let lease = s.lease().unwrap();
    let mut permit = Some(l.permit_owned().unwrap());
    let link = c.link().expect("embedded").clone();
    // Keepalives reach the service, their replies are lost: the holder
    // fences at its deadline while the service keeps the lease.
    link.drop_keepalive_replies(true);
    assert!(eventually(ms(6000), || l.state() == State::Fenced));
    assert!(service.lease_alive(lease));
    // The revoke, sent once the permit ends, waits in the partition.
    link.partition();
    if !close_first {
        drop(permit.take());
    }
    let closing = std::thread::spawn(move || {
        s.close().unwrap();
        Instant::now()
    });
    std::thread::sleep(ms(50));
    if close_first {
        // The work ends while close waits: the revoke goes then.
        drop(permit.take());
    }
    std::thread::sleep(ms(50));
    let healed = Instant::now();
    link.heal();
    let closed = closing.join().unwrap();
    assert!(
        closed >= healed,
        "close returned {:?} before the fenced lease's revoke could be answered",
        healed - closed
    );
    assert!(!service.lease_alive(lease), "revoked when close returned");
}
