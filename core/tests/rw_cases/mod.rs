//! The read/write lock cases every engine's test plays (docs/design.md
//! §27): readers share, a queued writer blocks later readers, a downgrade
//! keeps the token and lets queued readers in, and a holder cut off fences
//! before a waiter of the other mode acquires. Each takes a maker of
//! clients on the engine (each client its own session, so readers on two
//! of them contend through the service).

#![allow(dead_code)]

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dlock::clock::system_now;
use dlock::rwlock::Mode;
use dlock::{Client, Error, Instant, Lock, State, Token};
use dlock_testkit::watch;

/// The longest wait for something that must happen.
pub const EVENT: Duration = Duration::from_secs(20);

pub fn until(what: &str, cond: impl FnMut() -> bool) {
    watch::until(what, EVENT, cond);
}

/// Acquires `lock` on a thread of its own; the receiver gets the outcome.
pub fn in_background(lock: Arc<Lock>) -> mpsc::Receiver<Result<Token, Error>> {
    watch::in_background(lock, EVENT)
}

/// Two readers share; a writer and a plain lock wait for both; the writer's
/// token is above both readers' (one order).
pub fn readers_share(mk: &dyn Fn() -> Client, name: &str) {
    let (a, b) = (mk(), mk());
    let ra = a.rwlock(name).unwrap().read().unwrap();
    let rb = b.rwlock(name).unwrap().read().unwrap();
    let ta = ra.try_acquire().unwrap();
    let tb = rb.try_acquire().expect("a second reader shares");
    assert!(tb > ta);
    assert_eq!((ra.mode(), rb.mode()), (Some(Mode::Read), Some(Mode::Read)));
    assert!(ra.permit().is_ok() && rb.permit().is_ok());
    let (wc, pc) = (mk(), mk());
    let w = wc.rwlock(name).unwrap().write().unwrap();
    assert_eq!(w.mode(), Some(Mode::Write));
    assert_eq!(w.try_acquire(), Err(Error::WouldBlock));
    let plain = pc.lock(name).unwrap();
    assert_eq!(
        plain.try_acquire(),
        Err(Error::WouldBlock),
        "a plain lock is a writer"
    );
    assert_eq!(plain.mode(), None);
    ra.release().unwrap();
    assert_eq!(w.try_acquire(), Err(Error::WouldBlock), "reader b holds");
    rb.release().unwrap();
    let tw = w.try_acquire().unwrap();
    assert!(tw > tb, "one order for both modes: {tw} > {tb}");
    // A plain lock's holder is a writer to readers.
    let r = a.rwlock(name).unwrap().read().unwrap();
    assert_eq!(r.try_acquire(), Err(Error::WouldBlock));
    w.release().unwrap();
    r.try_acquire().unwrap();
    r.release().unwrap();
}

/// A reader holds; a writer queues; a later reader waits behind the writer
/// and holds only after it, with the later token.
pub fn a_queued_writer_blocks_later_readers(mk: &dyn Fn() -> Client, name: &str) {
    let (c1, c2, c3) = (mk(), mk(), mk());
    let first = c1.rwlock(name).unwrap().read().unwrap();
    let t1 = first.try_acquire().unwrap();
    let writer = Arc::new(c2.rwlock(name).unwrap().write().unwrap());
    let wrote = in_background(writer.clone());
    let later = c3.rwlock(name).unwrap().read().unwrap();
    // Once the writer's key is put, a later reader's try is refused.
    until(
        "a later reader is blocked by the queued writer",
        || match later.try_acquire() {
            Err(Error::WouldBlock) => true,
            Ok(_) => {
                later.release().unwrap();
                false
            }
            Err(e) => panic!("{e}"),
        },
    );
    assert!(wrote.recv_timeout(Duration::from_millis(300)).is_err());
    let later = Arc::new(later);
    let read = in_background(later.clone());
    thread::sleep(Duration::from_millis(300));
    first.release().unwrap();
    let tw = wrote.recv_timeout(EVENT).unwrap().unwrap();
    assert!(tw > t1);
    assert!(
        read.recv_timeout(Duration::from_millis(300)).is_err(),
        "the writer holds"
    );
    writer.release().unwrap();
    let tr = read.recv_timeout(EVENT).unwrap().unwrap();
    assert!(tr > tw, "the later reader's token is the later one");
    later.release().unwrap();
}

/// A writer downgrades while a reader waits: same token, mode read, the
/// reader holds; a new writer waits for both.
pub fn a_downgrade_keeps_the_token(mk: &dyn Fn() -> Client, name: &str) {
    let (c1, c2, c3) = (mk(), mk(), mk());
    let w = c1.rwlock(name).unwrap().write().unwrap();
    let t = w.try_acquire().unwrap();
    let reader = Arc::new(c2.rwlock(name).unwrap().read().unwrap());
    let read = in_background(reader.clone());
    until("the reader queued", || reader.state() == State::Acquiring);
    assert!(read.recv_timeout(Duration::from_millis(500)).is_err());
    w.downgrade().unwrap();
    assert_eq!(w.mode(), Some(Mode::Read));
    assert_eq!(w.token(), Some(t), "the same key, the same token");
    let tr = read.recv_timeout(EVENT).unwrap().unwrap();
    assert!(tr > t);
    let w2 = c3.rwlock(name).unwrap().write().unwrap();
    assert_eq!(w2.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(w.upgrade().unwrap_err().code(), "invalid_argument");
    w.release().unwrap();
    reader.release().unwrap();
}

/// What a cut-off case measured: when the holder fenced and when the first
/// waiter acquired (dlock's clock).
pub struct CutOff {
    pub fenced: Instant,
    pub acquired: Instant,
}

/// A holder in `held` mode, on `cut_client` (whose link `cut` severs),
/// while two waiters in `waits` mode queue: the holder fences before any
/// waiter acquires, every waiter's token is above the holder's, and
/// readers both hold. `heal` restores the link.
pub fn cut_off(
    mk: &dyn Fn() -> Client,
    cut_client: &Client,
    cut: &dyn Fn(),
    heal: &dyn Fn(),
    name: &str,
    held: Mode,
    waits: Mode,
) -> CutOff {
    let holder = cut_client.rwlock(name).unwrap().holder(held).unwrap();
    let t = holder.acquire(EVENT).unwrap();
    let fenced = Arc::new(Mutex::new(None));
    let f = fenced.clone();
    holder.on_fence(move |tok, _| {
        f.lock().unwrap().get_or_insert((system_now(), tok));
    });
    let clients: Vec<Client> = (0..2).map(|_| mk()).collect();
    let (tx, answers) = mpsc::channel();
    let waiting: Vec<Arc<Lock>> = clients
        .iter()
        .map(|c| {
            let w = Arc::new(c.rwlock(name).unwrap().holder(waits).unwrap());
            let (w2, tx) = (w.clone(), tx.clone());
            thread::spawn(move || {
                let r = w2.acquire(EVENT);
                let _ = tx.send((system_now(), w2, r));
            });
            w
        })
        .collect();
    until("both wait", || {
        waiting.iter().all(|w| w.state() == State::Acquiring)
    });
    // Their keys are put (a moment after the state says so).
    thread::sleep(Duration::from_millis(300));
    cut();
    let n = if waits == Mode::Read { 2 } else { 1 };
    let mut won = Vec::new();
    for _ in 0..n {
        let (at, w, r) = answers.recv_timeout(EVENT).expect("a waiter's answer");
        let tok = r.expect("the waiter acquired");
        assert!(tok > t, "{tok} > {t}");
        won.push((at, w));
    }
    let (fence_at, fence_token) = fenced.lock().unwrap().expect("the holder fenced");
    assert_eq!(fence_token, t);
    let acquired = won.iter().map(|(at, _)| *at).min().unwrap();
    assert!(
        fence_at < acquired,
        "the holder fenced ({fence_at:?}) before a waiter acquired ({acquired:?})"
    );
    heal();
    for (_, w) in &won {
        w.release().unwrap();
    }
    drop(holder);
    CutOff {
        fenced: fence_at,
        acquired,
    }
}

/// Two readers on clients of their own; an operator deletes reader a's key
/// (`delete`, given a's token): a fences, reads again with a higher
/// token, and reader b is untouched. `then` runs with both still held.
pub fn an_operator_deleting_a_readers_key_fences_that_reader_alone(
    client: &dyn Fn() -> Client,
    name: &str,
    delete: &dyn Fn(Token),
    then: &dyn Fn(),
) {
    let (a, b) = (client(), client());
    let ra = a.rwlock(name).unwrap().read().unwrap();
    let rb = b.rwlock(name).unwrap().read().unwrap();
    let ta = ra.try_acquire().unwrap();
    let tb = rb.try_acquire().unwrap();
    let (tx, fa) = mpsc::channel();
    let tx = Mutex::new(tx);
    ra.on_fence(move |t, _| {
        let _ = tx.lock().unwrap().send(t);
    });
    let (tx, fb) = mpsc::channel();
    let tx = Mutex::new(tx);
    rb.on_fence(move |t, _| {
        let _ = tx.lock().unwrap().send(t);
    });
    delete(ta);
    assert_eq!(fa.recv_timeout(EVENT).unwrap(), ta);
    until("reader a reads again", || ra.state() == State::Holding);
    assert!(ra.token().unwrap() > tb);
    assert_eq!(ra.mode(), Some(Mode::Read));
    assert!(fb.try_recv().is_err(), "reader b was not fenced");
    assert_eq!(rb.token(), Some(tb));
    then();
}
