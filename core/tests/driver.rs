//! The driver with real time (and a manual clock) and short settings:
//! callbacks, contention, release, permits racing a fence.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dlock::{Client, Error, ManualClock, MemoryService, Options, Refused, State, Token};

const EVENT: Duration = Duration::from_secs(10);

use common::short;
use dlock_testkit as common;

fn fences(lock: &dlock::Lock) -> Receiver<(Token, u64)> {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    lock.on_fence(move |t, n| {
        let _ = tx.lock().unwrap().send((t, n));
    });
    rx
}

#[test]
fn contention_release_and_higher_tokens() {
    let service = MemoryService::new();
    let a = Client::new(service.link(), short())
        .unwrap()
        .lock("c")
        .unwrap();
    let b = Client::new(service.link(), short())
        .unwrap()
        .lock("c")
        .unwrap();
    let t1 = a.acquire(EVENT).unwrap();
    assert_eq!(b.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(b.state(), State::Idle);
    assert_eq!(b.permit().unwrap_err(), Refused::NotHeld);
    assert_eq!(b.acquire(Duration::from_millis(300)), Err(Error::Timeout));
    assert_eq!(a.acquire(EVENT), Err(Error::AlreadyHeld));
    a.release().unwrap();
    assert_eq!(a.permit().unwrap_err(), Refused::Released);
    let t2 = b.acquire(EVENT).unwrap();
    assert!(t2 > t1, "{t2} > {t1}");
    drop(b); // dropping the handle releases the lock
    let t3 = a.acquire(EVENT).unwrap();
    assert!(t3 > t2);
    assert_eq!(service.holder("c"), Some(t3));
}

#[test]
fn bad_settings_and_names_are_clear_errors() {
    let bad = Options {
        ttl: Duration::from_secs(1),
        ..short()
    };
    let err = Client::new(MemoryService::new().link(), bad).err().unwrap();
    assert_eq!(err.code(), "invalid_option");
    assert!(err.to_string().contains("ttl"), "{err}");
    let client = Client::new(MemoryService::new().link(), short()).unwrap();
    for name in ["", "a\0b", &"x".repeat(dlock::MAX_NAME_LEN + 1)] {
        assert_eq!(client.lock(name).unwrap_err().code(), "invalid_argument");
    }
}

#[test]
fn callbacks_may_call_back_into_the_lock() {
    let service = MemoryService::new();
    let link = service.link();
    let lock = Arc::new(
        Client::new(link.clone(), short())
            .unwrap()
            .lock("cb")
            .unwrap(),
    );
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    let weak = Arc::downgrade(&lock);
    lock.on_state_change(move |c| {
        let lock = weak.upgrade().unwrap();
        // Every call a callback may make, from inside the callback.
        let _ = (
            lock.state(),
            lock.token(),
            lock.time_left(),
            lock.permit().is_ok(),
        );
        if c.to == State::Draining {
            lock.release().unwrap();
            tx.lock().unwrap().send(lock.state()).unwrap();
        }
    });
    lock.acquire(EVENT).unwrap();
    link.partition();
    assert_eq!(rx.recv_timeout(EVENT).unwrap(), State::Released);
}

#[test]
fn a_panicking_callback_stops_nothing() {
    let service = MemoryService::new();
    let link = service.link();
    let lock = Client::new(link.clone(), short())
        .unwrap()
        .lock("panic")
        .unwrap();
    lock.on_acquired(|_| panic!("callback bug"));
    lock.on_state_change(|_| panic!("callback bug"));
    let t = lock.acquire(EVENT).unwrap();
    // Well past the first deadline (1.5 s): keepalives kept it.
    thread::sleep(Duration::from_millis(2500));
    assert_eq!(lock.permit().unwrap().token(), t);
    let fenced = fences(&lock);
    link.partition();
    assert_eq!(fenced.recv_timeout(EVENT).unwrap().0, t);
}

#[test]
fn a_blocked_callback_delays_no_fence() {
    let service = MemoryService::new();
    let (link_a, link_b) = (service.link(), service.link());
    let a = Client::new(link_a.clone(), short())
        .unwrap()
        .lock("slow-a")
        .unwrap();
    let b = Client::new(link_b, short())
        .unwrap()
        .lock("slow-b")
        .unwrap();
    let release_callbacks = Arc::new(AtomicBool::new(false));
    let r = release_callbacks.clone();
    // Blocks the callback thread from A's drain on.
    a.on_state_change(move |c| {
        if c.to == State::Draining {
            while !r.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(5));
            }
        }
    });
    a.acquire(EVENT).unwrap();
    let tb = b.acquire(EVENT).unwrap();
    let cut = dlock::clock::system_now();
    link_a.partition();
    // The fence is published on time although no callback can run...
    while !matches!(a.state(), State::Fenced | State::Reacquiring) {
        assert!(
            dlock::clock::system_now() - cut < Duration::from_secs(3),
            "no fence"
        );
        thread::sleep(Duration::from_millis(5));
    }
    let fenced_after = dlock::clock::system_now() - cut;
    // ... and B's keepalives go on: it is still holding well past its deadline.
    thread::sleep(Duration::from_millis(1500));
    assert_eq!(b.permit().map(|p| p.token()), Ok(tb));
    release_callbacks.store(true, Ordering::Relaxed);
    // The deadline was at most 1.5 s after the cut (last keepalive + 1.5 s).
    assert!(
        fenced_after <= Duration::from_millis(1800),
        "{fenced_after:?}"
    );
}

#[test]
fn manual_clock_jump_past_the_deadline() {
    let manual = ManualClock::default();
    let service = MemoryService::with_clock(manual.clock());
    let client = Client::with_clock(service.link(), short(), manual.clock()).unwrap();
    let lock = client.lock("manual").unwrap();
    let fenced = fences(&lock);
    let (atx, acquired) = channel();
    let atx = Mutex::new(atx);
    lock.on_acquired(move |t| {
        let _ = atx.lock().unwrap().send(t);
    });
    let t1 = lock.acquire(EVENT).unwrap();
    assert_eq!(acquired.recv_timeout(EVENT).unwrap(), t1);
    assert_eq!(lock.time_left(), Some(Duration::from_millis(1500)));
    let p = lock.permit().unwrap();
    // A suspend of 20 s: nothing runs, the clock jumps. The driver is held
    // meanwhile (queued before the jump wakes it), or it could fence and
    // reacquire before the next line reads the gate.
    dlock::memory::stall_driver(Duration::from_millis(300));
    manual.advance(Duration::from_secs(20));
    assert_eq!(
        lock.permit().unwrap_err(),
        Refused::Fenced,
        "the clock alone refuses"
    );
    assert!(!p.valid());
    let (t, in_flight) = fenced.recv_timeout(EVENT).unwrap();
    assert_eq!((t, in_flight), (t1, 1));
    drop(p);
    // The server expired the lease on the same clock: reacquired, higher.
    let t2 = acquired.recv_timeout(EVENT).unwrap();
    assert!(t2 > t1);
    assert_eq!(lock.token(), Some(t2));
}

#[test]
fn many_threads_take_permits_while_the_lock_fences() {
    let service = MemoryService::new();
    let link = service.link();
    let lock = Arc::new(
        Client::new(link.clone(), short())
            .unwrap()
            .lock("race")
            .unwrap(),
    );
    let fenced = fences(&lock);
    let (dtx, drained) = channel();
    let dtx = Mutex::new(dtx);
    lock.on_drained(move || {
        let _ = dtx.lock().unwrap().send(());
    });
    let t1 = lock.acquire(EVENT).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let tries = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (lock, stop, late, granted, tries) = (
                lock.clone(),
                stop.clone(),
                late.clone(),
                granted.clone(),
                tries.clone(),
            );
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    tries.fetch_add(1, Ordering::Relaxed);
                    if let Ok(p) = lock.permit() {
                        // Granted only before the deadline, by the clock.
                        if dlock::clock::system_now() >= p.deadline() && p.token() == t1 {
                            late.fetch_add(1, Ordering::Relaxed);
                        }
                        granted.fetch_add(1, Ordering::Relaxed);
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    // The workers are at work before the cut.
    while granted.load(Ordering::Relaxed) < 1000 {
        thread::yield_now();
    }
    link.partition();
    let (t, _) = fenced.recv_timeout(EVENT).unwrap();
    assert_eq!(t, t1);
    drained.recv_timeout(EVENT).unwrap();
    let at_fence = granted.load(Ordering::Relaxed);
    // Not a sleep: the workers try 10,000 more times after the fence.
    let tried = tries.load(Ordering::Relaxed);
    while tries.load(Ordering::Relaxed) < tried + 10_000 {
        thread::yield_now();
    }
    assert_eq!(
        granted.load(Ordering::Relaxed),
        at_fence,
        "no permit after the fence"
    );
    stop.store(true, Ordering::Relaxed);
    workers.into_iter().for_each(|w| w.join().unwrap());
    assert!(at_fence > 100, "the workers did take permits: {at_fence}");
    assert_eq!(late.load(Ordering::Relaxed), 0);
    assert_eq!(lock.in_flight(), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn async_acquire_and_release() {
    let service = MemoryService::new();
    let a = Client::new(service.link(), short())
        .unwrap()
        .lock("async")
        .unwrap();
    let t = a.acquire_async(Some(EVENT)).await.unwrap();
    assert_eq!(a.token(), Some(t));
    a.release_async().await.unwrap();
    assert_eq!(a.state(), State::Released);
    assert_eq!(service.holder("async"), None);
}

/// A fence's revoke waits for on_fence to return: while the callback runs,
/// the service still shows the fenced holder, so no contender can take the
/// lock through our revoke before the holder was told.
#[test]
fn the_revoke_after_a_fence_waits_for_on_fence() {
    let service = MemoryService::new();
    service.freeze_expiry(true); // only our revoke can free the lock
    let link = service.link();
    let lock = Client::new(link.clone(), short())
        .unwrap()
        .lock("rv")
        .unwrap();
    let (entered_tx, entered) = channel();
    let (leave_tx, leave) = channel::<()>();
    let (entered_tx, leave) = (Mutex::new(entered_tx), Mutex::new(leave));
    lock.on_fence(move |t, _| {
        entered_tx.lock().unwrap().send(t).unwrap();
        leave.lock().unwrap().recv_timeout(EVENT).unwrap();
    });
    let t1 = lock.acquire(EVENT).unwrap();
    link.fail_keepalives(Some("cut"));
    assert_eq!(entered.recv_timeout(EVENT).unwrap(), t1);
    // Time enough for a revoke to land were it not held back.
    thread::sleep(Duration::from_millis(300));
    assert_eq!(
        service.holder("rv"),
        Some(t1),
        "revoked before on_fence returned"
    );
    leave_tx.send(()).unwrap();
    let deadline = std::time::Instant::now() + EVENT;
    while service.holder("rv") == Some(t1) {
        assert!(std::time::Instant::now() < deadline, "never revoked");
        thread::sleep(Duration::from_millis(10));
    }
}
