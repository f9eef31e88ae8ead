//! How the lock tests of every engine watch a lock: its fences and its
//! acquisitions on channels, an acquire on a thread of its own, and
//! polling the test's own view until something holds.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use dlock::{Client, Error, Lock, Token};

/// The tokens `lock` fences with, from now on.
pub fn fences(lock: &Lock) -> Receiver<Token> {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    lock.on_fence(move |t, _| {
        let _ = tx.lock().unwrap().send(t);
    });
    rx
}

/// The tokens `lock` is granted (reacquisitions too), from now on.
pub fn acquisitions(lock: &Lock) -> Receiver<Token> {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    lock.on_acquired(move |t| {
        let _ = tx.lock().unwrap().send(t);
    });
    rx
}

/// Acquires `lock` (waiting up to `wait`) on a thread of its own; the
/// receiver gets the outcome.
pub fn in_background(lock: Arc<Lock>, wait: Duration) -> Receiver<Result<Token, Error>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(lock.acquire(wait));
    });
    rx
}

/// When a contender's acquire returned, and what it returned.
pub type Outcome = Receiver<(Instant, Result<Token, Error>)>;

/// A contender for `name` on `client`, on a thread of its own (waiting up
/// to `wait`, releasing at once if it acquires): the receiver gets when
/// its acquire returned and what it returned; join the thread after.
pub fn contender(client: Client, name: &str, wait: Duration) -> (thread::JoinHandle<()>, Outcome) {
    let (tx, rx) = mpsc::channel();
    let name = name.to_owned();
    let waiter = thread::spawn(move || {
        let l = client.lock(&name).unwrap();
        let r = l.acquire(wait);
        tx.send((Instant::now(), r.clone())).unwrap();
        if r.is_ok() {
            l.release().unwrap();
        }
    });
    (waiter, rx)
}

/// Waits up to `limit` for `cond`, polling every 10 ms (the test's own
/// view, not the library's); fails naming `what`.
pub fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < end, "never: {what}");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Waits up to `limit` for `lock` to hold again with a token above
/// `token` (reacquired after a fence); fails if it does not.
pub fn reacquired_above(lock: &Lock, token: Token, limit: Duration) {
    until(&format!("a reacquisition above {token}"), limit, || {
        lock.token().is_some_and(|t| t > token)
    });
}
