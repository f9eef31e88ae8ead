//! The one lifecycle of docs/design.md §19 on the embedded backend: shutdown
//! at exit lets a contender in at once, bounded by one keepalive timeout in
//! total; a cancelled acquisition leaves nothing held, whenever it is
//! cancelled; its completion runs exactly once; a dropped `acquire_async`
//! future is a cancel.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use dlock::{Client, Error, MemoryService, Refused, State, Token};

use dlock_testkit as common;
use dlock_testkit::embedded::{client, ms};

/// `dlock::shutdown()` ends every session of the process: the test that
/// calls it runs alone (write), the others share (read).
static PROCESS: RwLock<()> = RwLock::new(());

type Outcome = Result<Token, Error>;

/// A completion that reports on a channel and counts its runs.
fn completion() -> (
    impl FnOnce(Outcome) + Send + 'static,
    mpsc::Receiver<Outcome>,
    Arc<AtomicU32>,
) {
    let (tx, rx) = mpsc::channel();
    let runs = Arc::new(AtomicU32::new(0));
    let r = runs.clone();
    let done = move |out: Outcome| {
        r.fetch_add(1, SeqCst);
        let _ = tx.send(out);
    };
    (done, rx, runs)
}

/// Whether `client`'s default session has its lease: its lock request
/// goes out in the same step, and the embedded service puts the key before
/// the driver reads its next command.
fn has_lease(client: &Client) -> bool {
    client.default_session().lease().is_some()
}

/// Polls `f` every 2 ms for up to 2 s.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(ms(2));
    }
    f()
}

/// Everything the `done` of `runs` will ever do has happened once the
/// callback thread ran a job queued after it: a barrier, no sleep.
fn callbacks_flushed() {
    let (tx, rx) = mpsc::channel();
    dlock::spawn_then(async {}, move |()| {
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("callback thread");
}

#[test]
fn client_shutdown_while_holding_lets_a_contender_in_at_once() {
    let _shared = PROCESS.read().unwrap();
    let service = MemoryService::new();
    let (a, b) = (client(&service), client(&service));
    let held = a.lock("lifecycle/shutdown").unwrap();
    let other = a.session(common::short()).unwrap();
    let held2 = other.lock("lifecycle/shutdown2").unwrap();
    let t = held.acquire(ms(2000)).unwrap();
    held2.acquire(ms(2000)).unwrap();
    let contender = b.lock("lifecycle/shutdown").unwrap();
    let (done, rx, runs) = completion();
    let _pending = contender.acquire_then(true, None, done);
    // Queued behind the holder.
    assert!(rx.recv_timeout(ms(100)).is_err());

    let started = Instant::now();
    a.shutdown();
    let took = started.elapsed();
    let won = rx.recv_timeout(ms(1000)).expect("the contender's turn");
    let waited = started.elapsed();
    assert!(won.unwrap() > t);
    assert!(took < common::short().keepalive_timeout, "{took:?}");
    assert!(waited < ms(150), "the contender got in after {waited:?}");
    assert_eq!(service.holder("lifecycle/shutdown2"), None);

    // Every handle of the client behaves as closed.
    assert_eq!(held.permit().unwrap_err(), Refused::Released);
    assert_eq!(held.state(), State::Released);
    assert_eq!(held.acquire(ms(100)), Err(Error::Shutdown));
    assert_eq!(held2.try_acquire(), Err(Error::Shutdown));
    assert!(matches!(a.lock("lifecycle/new"), Err(Error::Shutdown)));
    held.release().unwrap();
    held.close().unwrap();
    a.shutdown();
    // The other client is untouched.
    assert_eq!(contender.state(), State::Holding);
    callbacks_flushed();
    assert_eq!(runs.load(SeqCst), 1);
}

#[test]
fn shutdown_is_bounded_by_one_keepalive_timeout_in_total() {
    let _shared = PROCESS.read().unwrap();
    let service = MemoryService::new();
    let a = client(&service);
    let sessions: Vec<_> = (0..5)
        .map(|_| a.session(common::short()).unwrap())
        .collect();
    let locks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| s.lock(&format!("lifecycle/bound/{i}")).unwrap())
        .collect();
    for l in &locks {
        l.acquire(ms(2000)).unwrap();
    }
    // The service answers nothing from now on: five revokes hang.
    a.link().unwrap().partition();
    let started = Instant::now();
    a.shutdown();
    let took = started.elapsed();
    let bound = common::short().keepalive_timeout;
    assert!(
        took >= bound - ms(20),
        "returned before the revokes: {took:?}"
    );
    assert!(took < bound + ms(150), "five sessions, one bound: {took:?}");
    for l in &locks {
        assert_eq!(l.permit().unwrap_err(), Refused::Released);
    }
    // The revokes go on: once healed, every key is gone.
    a.link().unwrap().heal();
    assert!(eventually(|| (0..5).all(|i| service
        .holder(&format!("lifecycle/bound/{i}"))
        .is_none())));
}

#[test]
fn process_shutdown_ends_every_client_and_new_clients_work() {
    let _alone = PROCESS.write().unwrap();
    let (s1, s2) = (MemoryService::new(), MemoryService::new());
    let (a, b) = (client(&s1), client(&s2));
    let (la, lb) = (
        a.lock("lifecycle/process").unwrap(),
        b.lock("lifecycle/process").unwrap(),
    );
    la.acquire(ms(2000)).unwrap();
    lb.acquire(ms(2000)).unwrap();
    let started = Instant::now();
    dlock::shutdown();
    assert!(started.elapsed() < common::short().keepalive_timeout);
    assert_eq!(s1.holder("lifecycle/process"), None);
    assert_eq!(s2.holder("lifecycle/process"), None);
    for l in [&la, &lb] {
        assert_eq!(l.permit().unwrap_err(), Refused::Released);
        assert_eq!(l.try_acquire(), Err(Error::Shutdown));
    }
    dlock::shutdown();
    // A client connected afterwards is a new one.
    let c = client(&s1);
    let lc = c.lock("lifecycle/process").unwrap();
    lc.try_acquire().unwrap();
    lc.release().unwrap();
}

#[test]
fn cancel_before_the_wait_leaves_nothing_held() {
    let _shared = PROCESS.read().unwrap();
    let service = MemoryService::new();
    let (a, b, c) = (client(&service), client(&service), client(&service));
    let holder = a.lock("lifecycle/before").unwrap();
    holder.acquire(ms(2000)).unwrap();
    let cancelled = b.lock("lifecycle/before").unwrap();
    let (done, rx, runs) = completion();
    // Cancelled at once: before any lease or key of its session.
    let acq = cancelled.acquire_then(true, None, done);
    acq.cancel();
    acq.cancel();
    assert_eq!(rx.recv_timeout(ms(1000)).unwrap(), Err(Error::Released));
    holder.release().unwrap();
    // Nothing of the cancelled acquisition blocks a third holder.
    c.lock("lifecycle/before").unwrap().try_acquire().unwrap();
    assert_eq!(cancelled.state(), State::Released);
    callbacks_flushed();
    assert_eq!(runs.load(SeqCst), 1, "done runs exactly once");
}

#[test]
fn cancel_during_the_wait_deletes_the_queued_key() {
    let _shared = PROCESS.read().unwrap();
    let service = MemoryService::new();
    let (a, b, c) = (client(&service), client(&service), client(&service));
    let holder = a.lock("lifecycle/during").unwrap();
    holder.acquire(ms(2000)).unwrap();
    let cancelled = b.lock("lifecycle/during").unwrap();
    let (done, rx, runs) = completion();
    let acq = cancelled.acquire_then(true, Some(Duration::from_secs(60)), done);
    // Its key is in the queue, before any later one.
    assert!(eventually(|| has_lease(&b)));
    let third = c.lock("lifecycle/during").unwrap();
    let (next, next_rx, _) = completion();
    let _queued = third.acquire_then(true, None, next);
    assert!(eventually(|| has_lease(&c)));
    acq.cancel();
    assert_eq!(rx.recv_timeout(ms(1000)).unwrap(), Err(Error::Released));
    // A key left behind would be next in the queue (it is older than the
    // third's): the third would wait for ever.
    holder.release().unwrap();
    next_rx.recv_timeout(ms(1000)).unwrap().unwrap();
    acq.cancel();
    callbacks_flushed();
    assert_eq!(runs.load(SeqCst), 1);
    assert_eq!(third.state(), State::Holding);
}

#[test]
fn cancel_after_success_releases_only_that_acquisition() {
    let _shared = PROCESS.read().unwrap();
    let service = MemoryService::new();
    let (b, c) = (client(&service), client(&service));
    let lock = b.lock("lifecycle/after").unwrap();
    let (done, rx, runs) = completion();
    let acq = lock.acquire_then(false, None, done);
    let t1 = rx.recv_timeout(ms(1000)).unwrap().unwrap();
    assert_eq!(service.holder("lifecycle/after"), Some(t1));
    acq.cancel();
    assert!(eventually(|| service.holder("lifecycle/after").is_none()));
    assert_eq!(lock.state(), State::Released);
    c.lock("lifecycle/after").unwrap().try_acquire().unwrap();
    callbacks_flushed();
    assert_eq!(runs.load(SeqCst), 1);

    // A later acquisition of the handle is not the cancelled one's.
    let lock = b.lock("lifecycle/after2").unwrap();
    let (done, rx, _) = completion();
    let first = lock.acquire_then(true, None, done);
    rx.recv_timeout(ms(1000)).unwrap().unwrap();
    lock.release().unwrap();
    let t2 = lock.acquire(ms(1000)).unwrap();
    first.cancel();
    callbacks_flushed();
    // The cancel went through the driver before this acquire's refusal.
    assert_eq!(lock.acquire(ms(10)), Err(Error::AlreadyHeld));
    assert_eq!(lock.token(), Some(t2));
    assert_eq!(service.holder("lifecycle/after2"), Some(t2));
}

/// Polls `fut` once, with a waker that does nothing.
fn poll_once<F: Future>(fut: &mut std::pin::Pin<Box<F>>) -> Poll<F::Output> {
    fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
}

#[test]
fn a_dropped_acquire_future_leaves_nothing_held() {
    let _shared = PROCESS.read().unwrap();
    let service = MemoryService::new();
    let (a, b, c) = (client(&service), client(&service), client(&service));
    let holder = a.lock("lifecycle/dropped").unwrap();
    holder.acquire(ms(2000)).unwrap();

    // Dropped while waiting its turn.
    let waiting = b.lock("lifecycle/dropped").unwrap();
    let mut fut = Box::pin(waiting.acquire_async(None));
    assert!(poll_once(&mut fut).is_pending());
    assert!(eventually(|| has_lease(&b)));
    drop(fut);
    assert!(eventually(|| waiting.state() == State::Released));
    // A key left behind would hold the lock once the holder lets go.
    holder.release().unwrap();
    assert!(eventually(|| service.holder("lifecycle/dropped").is_none()));

    // Dropped after it won, before anyone saw the token: released. The
    // lock is held while the future is first polled, so that poll cannot
    // already see the win (on a free lock the driver may win before it).
    holder.acquire(ms(2000)).unwrap();
    let mut fut = Box::pin(waiting.acquire_async(None));
    assert!(poll_once(&mut fut).is_pending());
    holder.release().unwrap();
    assert!(eventually(|| waiting.state() == State::Holding));
    drop(fut);
    assert!(eventually(|| waiting.state() == State::Released));
    assert_eq!(service.holder("lifecycle/dropped"), None);
    c.lock("lifecycle/dropped").unwrap().try_acquire().unwrap();

    // A future that completed is not a cancel.
    let mine = b.lock("lifecycle/dropped/kept").unwrap();
    let mut fut = Box::pin(mine.try_acquire_async());
    let t = loop {
        if let Poll::Ready(r) = poll_once(&mut fut) {
            break r.unwrap();
        }
        std::thread::sleep(ms(1));
    };
    drop(fut);
    callbacks_flushed();
    assert_eq!(mine.acquire(ms(10)), Err(Error::AlreadyHeld));
    assert_eq!(mine.token(), Some(t));
}

#[test]
fn spawn_then_runs_done_once_on_the_callback_thread() {
    let _shared = PROCESS.read().unwrap();
    let (tx, rx) = mpsc::channel();
    let service = MemoryService::new();
    let lock = client(&service).lock("lifecycle/spawn").unwrap();
    dlock::spawn_then(async move { lock.try_acquire_async().await }, move |r| {
        let _ = tx.send((r, std::thread::current().name().map(str::to_owned)));
    });
    let (r, thread) = rx.recv_timeout(ms(2000)).unwrap();
    assert!(r.is_ok());
    assert_eq!(thread.as_deref(), Some("dlock-callbacks"));
}

#[test]
fn an_acquisition_is_send_sync_and_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<dlock::Acquisition>();
}
