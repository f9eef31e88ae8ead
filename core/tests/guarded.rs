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

/// Issue 32, item 6: a guarded write's key over `MAX_KEY_LEN` or value over
/// `MAX_VALUE_LEN` is refused before anything is sent (`InvalidArgument`
/// naming the limit), on every engine: here with the link cut, a request
/// sent would wait about a TTL and fail as `Backend`, and with it whole,
/// nothing is written. At the limits the write commits.
#[test]
fn guarded_writes_over_the_size_limits_are_refused_before_anything_is_sent() {
    use dlock::MAX_KEY_LEN;
    use dlock::election::MAX_VALUE_LEN;
    let service = MemoryService::new();
    let link = service.link();
    let client = Client::new(link.clone(), Options::default()).unwrap();
    let lock = client.lock("sized").unwrap();
    let token = lock.acquire(EVENT).unwrap();
    let long_key = vec![b'k'; MAX_KEY_LEN + 1];
    let big_value = vec![0u8; MAX_VALUE_LEN + 1];
    let refused = |r: Result<(), Error>, limit: &str| match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(limit), "{m}"),
        other => panic!("expected InvalidArgument naming {limit}, got {other:?}"),
    };

    link.partition();
    let start = std::time::Instant::now();
    refused(lock.guarded_put(token, &long_key, b"v"), "MAX_KEY_LEN");
    refused(lock.guarded_delete(token, &long_key), "MAX_KEY_LEN");
    refused(lock.guarded_put(token, b"k", &big_value), "MAX_VALUE_LEN");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "a refused write was sent"
    );
    link.heal();

    refused(lock.guarded_put(token, &long_key, b"v"), "MAX_KEY_LEN");
    refused(lock.guarded_put(token, b"k", &big_value), "MAX_VALUE_LEN");
    assert_eq!(service.get(&long_key), None);
    assert_eq!(service.get(b"k"), None);

    // At the limits: written.
    let key = vec![b'k'; MAX_KEY_LEN];
    let value = vec![7u8; MAX_VALUE_LEN];
    lock.guarded_put(token, &key, &value).unwrap();
    assert_eq!(service.get(&key).map(|v| v.len()), Some(MAX_VALUE_LEN));
    lock.guarded_delete(token, &key).unwrap();
    lock.release().unwrap();
}
