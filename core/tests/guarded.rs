//! Guarded writes and an operator deleting the lock key, on the embedded
//! service: the same rules as on etcd (a write commits only while its token
//! holds the lock; a deleted lock key fences at once with `lock_lost`).

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use dlock::{Client, Error, MemoryService, Options, Reason, State, Token};

use common::short;
use dlock_testkit as common;

const EVENT: Duration = Duration::from_secs(10);

fn fenced_reasons(lock: &dlock::Lock) -> Receiver<Reason> {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    lock.on_state_change(move |c| {
        if c.to == State::Fenced {
            let _ = tx.lock().unwrap().send(c.reason);
        }
    });
    rx
}

fn acquired(lock: &dlock::Lock) -> Receiver<Token> {
    let (tx, rx) = channel();
    let tx = Mutex::new(tx);
    lock.on_acquired(move |t| {
        let _ = tx.lock().unwrap().send(t);
    });
    rx
}

#[test]
fn guarded_writes_commit_only_under_the_holding_token() {
    let service = MemoryService::new();
    let link = service.link();
    let opts = Options {
        reacquire: false,
        ..short()
    };
    let a = Client::new(link.clone(), opts.clone())
        .unwrap()
        .lock("g")
        .unwrap();
    let b = Client::new(service.link(), opts)
        .unwrap()
        .lock("g")
        .unwrap();
    let ta = a.acquire(EVENT).unwrap();
    a.guarded_put(ta, b"total", b"100").unwrap();
    assert_eq!(service.get(b"total").as_deref(), Some(&b"100"[..]));
    a.guarded_delete(ta, b"total").unwrap();
    assert_eq!(service.get(b"total"), None);
    a.guarded_put(ta, b"total", b"100").unwrap();
    let other = Token(ta.get() + 7);
    assert_eq!(
        a.guarded_put(other, b"total", b"x"),
        Err(Error::Fenced(other.get()))
    );
    assert_eq!(
        a.guarded_put(ta, b"", b"x").unwrap_err().code(),
        "invalid_argument"
    );

    // A is cut off and fences; B takes the lock and writes; A's stale
    // token is refused once its link heals.
    let reasons = fenced_reasons(&a);
    link.partition();
    assert_eq!(reasons.recv_timeout(EVENT), Ok(Reason::Deadline));
    let tb = b.acquire(EVENT).unwrap();
    assert!(tb > ta);
    b.guarded_put(tb, b"total", b"200").unwrap();
    link.heal();
    assert_eq!(
        a.guarded_put(ta, b"total", b"150"),
        Err(Error::Fenced(ta.get()))
    );
    assert_eq!(a.guarded_delete(ta, b"total"), Err(Error::Fenced(ta.get())));
    assert_eq!(service.get(b"total").as_deref(), Some(&b"200"[..]));
    b.release().unwrap();
    assert_eq!(
        b.guarded_put(tb, b"total", b"after release"),
        Err(Error::Fenced(tb.get()))
    );
}

#[test]
fn a_deleted_lock_key_fences_at_once_and_reacquires_higher() {
    let service = MemoryService::new();
    let lock = Client::new(service.link(), short())
        .unwrap()
        .lock("k")
        .unwrap();
    let reasons = fenced_reasons(&lock);
    let again = acquired(&lock);
    let t1 = lock.acquire(EVENT).unwrap();
    assert_eq!(again.recv_timeout(EVENT), Ok(t1));
    assert!(!service.delete_lock_key("nobody"));
    let cut = dlock::clock::system_now();
    assert!(service.delete_lock_key("k"));
    assert_eq!(reasons.recv_timeout(EVENT), Ok(Reason::LockLost));
    let took = dlock::clock::system_now().saturating_since(cut);
    // Long before the deadline (TTL 2 s - margin): the watch, not a timer.
    assert!(took < Duration::from_millis(300), "fenced after {took:?}");
    assert_eq!(
        lock.guarded_put(t1, b"x", b"1"),
        Err(Error::Fenced(t1.get()))
    );
    let t2 = again.recv_timeout(EVENT).unwrap();
    assert!(t2 > t1, "{t2} > {t1}");
    assert_eq!(service.holder("k"), Some(t2));
    lock.guarded_put(t2, b"x", b"1").unwrap();
    lock.release().unwrap();
}
