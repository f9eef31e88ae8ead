//! Semaphores on the embedded engine (docs/design.md §26, issue 29): N+1
//! contenders and exactly N hold; a release wakes one waiter, onto the slot
//! released, with a higher token; the limit is recorded once and a mismatch,
//! 0 or over the maximum are refused; a timeout (on a manual clock) and a
//! dropped future leave nothing held; a fenced slot holder reacquires its
//! own slot with a higher token while the other holders are untouched; a
//! slot is an ordinary lock (a plain lock on its name excludes it, and the
//! slot's token admits guarded writes and `FenceGate` writes under its name).

use std::collections::{BTreeSet, HashMap};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use dlock::{
    Client, Error, FenceGate, Lock, MAX_SEMAPHORE_LIMIT, ManualClock, MemoryService, Options,
    State, Token,
};
use dlock_testkit::embedded::{client, ms};
use dlock_testkit::short;
use dlock_testkit::watch::{self, acquisitions, fences};

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(10);

fn until(what: &str, cond: impl FnMut() -> bool) {
    watch::until(what, EVENT, cond);
}

#[test]
fn n_plus_one_contenders_and_exactly_n_hold() {
    let service = MemoryService::new();
    let n = 3;
    let results = dlock_testkit::n_plus_one_contend(|| client(&service), "sem/n", n, ms(1500));
    let held = dlock_testkit::exactly_n_hold(&results, n);
    let slots: BTreeSet<u32> = held.iter().map(|l| l.slot().unwrap()).collect();
    assert_eq!(slots, (0..n).collect(), "one holder per slot");
    for l in &held {
        let slot = l.slot().unwrap();
        assert_eq!(l.name(), format!("sem/n/slot/{slot}"));
        assert_eq!(l.state(), State::Holding);
        assert_eq!(service.holder(l.name()), l.token(), "the engine agrees");
        assert_eq!(l.permit().unwrap().token(), l.token().unwrap());
    }
    // The loser's wait left nothing queued: with every holder gone, no
    // slot has a holder (a key left behind would own its slot now).
    drop(results);
    for slot in 0..n {
        until("the slot is free", || {
            service.holder(&format!("sem/n/slot/{slot}")).is_none()
        });
    }
}

#[test]
fn a_release_wakes_one_waiter_onto_that_slot_with_a_higher_token() {
    let service = MemoryService::new();
    let sem_a = client(&service).semaphore("sem/wake", 2).unwrap();
    let sem_b = client(&service).semaphore("sem/wake", 2).unwrap();
    let a = sem_a.acquire(EVENT).unwrap();
    let b = sem_b.acquire(EVENT).unwrap();
    assert_ne!(a.slot(), b.slot());
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = ["c", "d"]
        .into_iter()
        .map(|who| {
            let sem = client(&service).semaphore("sem/wake", 2).unwrap();
            let tx = tx.clone();
            thread::spawn(move || {
                let l = sem.acquire(EVENT).unwrap();
                tx.send((who, l.slot().unwrap(), l.token().unwrap()))
                    .unwrap();
                l
            })
        })
        .collect();
    thread::sleep(ms(300));
    assert!(rx.try_recv().is_err(), "both slots are held: nobody wakes");

    let (slot_a, token_a) = (a.slot().unwrap(), a.token().unwrap());
    a.release().unwrap();
    let (first, slot, token) = rx.recv_timeout(EVENT).expect("one waiter wakes");
    assert_eq!(slot, slot_a, "{first} woke onto the slot released");
    assert!(token > token_a, "tokens rise per slot: {token} > {token_a}");
    assert!(
        rx.recv_timeout(ms(500)).is_err(),
        "one release wakes one waiter"
    );
    assert_eq!(b.state(), State::Holding, "the other holder is untouched");

    let (slot_b, token_b) = (b.slot().unwrap(), b.token().unwrap());
    drop(b); // dropping the handle releases the slot
    let (second, slot, token) = rx.recv_timeout(EVENT).expect("the other waiter wakes");
    assert_ne!(second, first);
    assert_eq!(slot, slot_b);
    assert!(token > token_b);
    for w in waiters {
        let l = w.join().unwrap();
        assert_eq!(service.holder(l.name()), l.token());
    }
}

/// Waiting costs one queued key per waiter whatever the limit: waiters
/// queue in the semaphore's one queue (`<name>/queue`), and only its head
/// looks for a free slot. (Queued on every slot, each waiter kept one
/// handle and one key per slot: 16 here.)
#[test]
fn waiters_queue_once_whatever_the_limit_and_the_head_takes_a_freed_slot() {
    let service = MemoryService::new();
    let n = 16;
    let holder = client(&service);
    let sem = holder.semaphore("sem/queue", n).unwrap();
    let held: Vec<Lock> = (0..n).map(|_| sem.try_acquire().unwrap()).collect();
    assert!(matches!(sem.try_acquire(), Err(Error::WouldBlock)));

    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let c = client(&service);
            let tx = tx.clone();
            let w = c.clone();
            let t = thread::spawn(move || {
                let l = w.semaphore("sem/queue", n).unwrap().acquire(EVENT).unwrap();
                tx.send(i).unwrap();
                l
            });
            (c, t)
        })
        .collect();
    until("a head waits", || {
        service.holder("sem/queue/queue").is_some()
    });
    thread::sleep(ms(300));
    for (c, _) in &waiters {
        assert!(
            c.default_session().locks() <= 1,
            "a waiter keeps one handle (its queue key), not one per slot: {}",
            c.default_session().locks()
        );
    }
    assert!(rx.try_recv().is_err(), "every slot is held");

    // Each release lets one waiter in, onto the slot released.
    let mut held = held.into_iter();
    for _ in 0..3 {
        let l = held.next().unwrap();
        let (slot, token) = (l.slot().unwrap(), l.token().unwrap());
        drop(l);
        rx.recv_timeout(EVENT)
            .expect("one waiter takes the freed slot");
        let now = service.holder(&sem.slot_name(slot)).expect("retaken");
        assert!(now > token, "tokens rise per slot");
    }
    for (_, t) in waiters {
        t.join().unwrap();
    }
    until("the queue is empty", || {
        service.holder("sem/queue/queue").is_none()
    });
}

#[test]
fn the_limit_is_recorded_once_and_bad_limits_are_refused() {
    let service = MemoryService::new();
    let (c1, c2) = (client(&service), client(&service));
    let sem = c1.semaphore("sem/limit", 3).unwrap();
    assert_eq!((sem.name(), sem.limit()), ("sem/limit", 3));
    assert_eq!(sem.slot_name(2), "sem/limit/slot/2");
    assert_eq!(service.get(b"sem/limit/limit").as_deref(), Some(&b"3"[..]));

    let err = c2.semaphore("sem/limit", 4).unwrap_err();
    assert_eq!(err.code(), "invalid_argument", "{err}");
    let text = err.to_string();
    assert!(
        text.contains("limit 3") && text.contains('4'),
        "names both: {text}"
    );
    // The same limit from another client (and a session) is fine.
    c2.semaphore("sem/limit", 3).unwrap();
    c2.session(short())
        .unwrap()
        .semaphore("sem/limit", 3)
        .unwrap();

    assert_eq!(MAX_SEMAPHORE_LIMIT, 1024);
    for bad in [0, MAX_SEMAPHORE_LIMIT + 1] {
        let err = c1.semaphore("sem/limit-bad", bad).unwrap_err();
        assert_eq!(err.code(), "invalid_argument", "{err}");
        assert!(err.to_string().contains(&bad.to_string()), "{err}");
    }
    assert!(
        service.get(b"sem/limit-bad/limit").is_none(),
        "nothing sent"
    );
    c1.semaphore("sem/limit-max", MAX_SEMAPHORE_LIMIT).unwrap();
    assert_eq!(c1.semaphore("", 1).unwrap_err().code(), "invalid_argument");
}

#[test]
fn try_acquire_would_block_while_every_slot_is_held() {
    let service = MemoryService::new();
    let sem = client(&service).semaphore("sem/try", 2).unwrap();
    let other = client(&service).semaphore("sem/try", 2).unwrap();
    let a = sem.try_acquire().unwrap();
    let b = sem.try_acquire().unwrap();
    assert_eq!(
        [a.slot(), b.slot()],
        [Some(0), Some(1)],
        "two holders on one session"
    );
    assert_eq!(other.try_acquire().unwrap_err(), Error::WouldBlock);
    assert_eq!(
        other.acquire(Duration::ZERO).unwrap_err(),
        Error::WouldBlock
    );
    let t1 = b.token().unwrap();
    b.release().unwrap();
    let c = other.try_acquire().unwrap();
    assert_eq!(c.slot(), Some(1));
    assert!(c.token().unwrap() > t1);
    assert_eq!(a.state(), State::Holding);
}

/// The timeout is the machine's timer on the injected clock: a manual
/// clock moved past it ends the wait, and nothing stays held or queued.
#[test]
fn a_timeout_on_a_manual_clock_leaves_nothing_held() {
    let manual = ManualClock::default();
    let service = MemoryService::with_clock(manual.clock());
    // A long TTL: the jump past the timeout expires no lease.
    let options = Options {
        ttl: Duration::from_secs(60),
        keepalive_interval: Duration::from_secs(5),
        keepalive_timeout: Duration::from_secs(2),
        retry_interval: Duration::from_secs(1),
        margin: Duration::from_secs(1),
        reacquire: true,
    };
    let on_clock = || Client::with_clock(service.link(), options.clone(), manual.clock()).unwrap();
    let holder = on_clock();
    let sem = holder.semaphore("sem/timeout", 2).unwrap();
    let (a, b) = (sem.acquire(EVENT).unwrap(), sem.acquire(EVENT).unwrap());

    let waiter = on_clock();
    let (tx, rx) = mpsc::channel();
    let w = waiter.clone();
    let t = thread::spawn(move || {
        let sem = w.semaphore("sem/timeout", 2).unwrap();
        tx.send(sem.acquire(Duration::from_secs(5)).map(|l| l.slot()))
            .unwrap();
    });
    until("the waiter heads the semaphore's queue", || {
        service.holder("sem/timeout/queue").is_some()
    });
    assert!(rx.recv_timeout(ms(300)).is_err(), "no time passed");
    manual.advance(Duration::from_secs(4));
    assert!(rx.recv_timeout(ms(300)).is_err(), "4 s < 5 s");
    manual.advance(Duration::from_secs(2));
    assert_eq!(rx.recv_timeout(EVENT).unwrap(), Err(Error::Timeout));
    t.join().unwrap();
    until("the waiter's handles are done", || {
        waiter.default_session().locks() == 0
    });
    assert_eq!((a.state(), b.state()), (State::Holding, State::Holding));
    drop((a, b));
    for slot in 0..2 {
        until("the slot is free", || {
            service
                .holder(&format!("sem/timeout/slot/{slot}"))
                .is_none()
        });
    }
}

#[test]
fn a_dropped_acquire_future_leaves_nothing_held() {
    let service = MemoryService::new();
    let holder = client(&service).semaphore("sem/cancel", 1).unwrap();
    let held = holder.acquire(EVENT).unwrap();
    let waiter = client(&service);
    let sem = waiter.semaphore("sem/cancel", 1).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let r = rt.block_on(async { tokio::time::timeout(ms(300), sem.acquire_async(None)).await });
    assert!(r.is_err(), "the wait was cut off by dropping its future");
    held.release().unwrap();
    until("the dropped wait left no key behind", || {
        service.holder("sem/cancel/slot/0").is_none() && waiter.default_session().locks() == 0
    });
    // The async form holds as the blocking one does.
    let won = rt
        .block_on(sem.acquire_async(Some(EVENT)))
        .expect("a free slot");
    assert_eq!(won.slot(), Some(0));
    assert_eq!(service.holder("sem/cancel/slot/0"), won.token());
}

#[test]
fn a_fenced_slot_holder_reacquires_its_slot_and_the_others_are_untouched() {
    let service = MemoryService::new();
    let links: Vec<_> = (0..3).map(|_| service.link()).collect();
    let holders: Vec<(Client, Lock)> = links
        .iter()
        .map(|link| {
            let c = Client::new(link.clone(), short()).unwrap();
            let l = c.semaphore("sem/fence", 3).unwrap().acquire(EVENT).unwrap();
            (c, l)
        })
        .collect();
    let before: HashMap<u32, Token> = holders
        .iter()
        .map(|(_, l)| (l.slot().unwrap(), l.token().unwrap()))
        .collect();
    let fenced: Vec<_> = holders.iter().map(|(_, l)| fences(l)).collect();
    let acquired: Vec<_> = holders.iter().map(|(_, l)| acquisitions(l)).collect();

    // The middle holder's lease is lost: it alone fences, then takes its
    // own slot again with a higher token.
    let (_, cut) = &holders[1];
    let slot = cut.slot().unwrap();
    links[1].declare_lease_lost();
    assert_eq!(fenced[1].recv_timeout(EVENT).unwrap(), before[&slot]);
    let again = acquired[1].recv_timeout(EVENT).unwrap();
    assert!(again > before[&slot], "{again} > {}", before[&slot]);
    until("holding again", || cut.state() == State::Holding);
    assert_eq!(cut.slot(), Some(slot));
    assert_eq!(cut.token(), Some(again));
    assert_eq!(service.holder(cut.name()), Some(again));

    for i in [0, 2] {
        let (_, l) = &holders[i];
        assert!(fenced[i].try_recv().is_err(), "holder {i} was not fenced");
        assert_eq!(l.state(), State::Holding);
        assert_eq!(l.token(), Some(before[&l.slot().unwrap()]));
        assert_eq!(service.holder(l.name()), l.token());
    }
}

#[test]
fn a_slot_is_an_ordinary_lock_under_its_name() {
    let service = MemoryService::new();
    let c = client(&service);
    let sem = c.semaphore("sem/plain", 1).unwrap();
    // A plain lock on the slot's name excludes the semaphore's holder.
    let plain = client(&service).lock(&sem.slot_name(0)).unwrap();
    let t0 = plain.acquire(EVENT).unwrap();
    assert_eq!(sem.try_acquire().unwrap_err(), Error::WouldBlock);
    plain.release().unwrap();
    let held = sem.acquire(EVENT).unwrap();
    let t1 = held.token().unwrap();
    assert!(t1 > t0, "one token order per slot name");
    assert_eq!(plain.try_acquire().unwrap_err(), Error::WouldBlock);

    // Fenced writes take the slot's name and token unchanged.
    held.guarded_put(t1, b"sem/plain-data", b"v").unwrap();
    assert_eq!(service.get(b"sem/plain-data").as_deref(), Some(&b"v"[..]));
    let gate = FenceGate::new();
    gate.admit(held.name(), t1).unwrap();
    assert!(
        gate.admit(held.name(), t0).is_err(),
        "a lower token is stale"
    );
    assert_eq!(plain.slot(), None, "a plain lock has no slot");
}

/// The snapshot knows a slot's semaphore and limit, and the families say
/// them: `dlock_semaphore_limit` and `dlock_semaphore_held` per semaphore
/// (a waiting handle counts in the limit's series, not as held).
#[test]
fn the_snapshot_names_each_slots_semaphore_and_limit() {
    let service = MemoryService::new();
    let c = client(&service);
    let held = c
        .semaphore("sem/metrics", 3)
        .unwrap()
        .acquire(EVENT)
        .unwrap();
    let plain = c.lock("sem/metrics-plain").unwrap();
    let snap = c.snapshot();
    let locks: Vec<_> = snap.sessions.iter().flat_map(|s| &s.locks).collect();
    let slot = locks.iter().find(|l| l.name == held.name()).unwrap();
    assert_eq!(slot.semaphore, Some(("sem/metrics".to_owned(), 3)));
    assert_eq!(slot.token, held.token());
    let other = locks.iter().find(|l| l.name == plain.name()).unwrap();
    assert_eq!(other.semaphore, None);
    let text = snap.to_text();
    for line in [
        "dlock_semaphore_limit{semaphore=\"sem/metrics\"} 3",
        "dlock_semaphore_held{semaphore=\"sem/metrics\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
    held.release().unwrap();
    let text = c.snapshot().to_text();
    assert!(
        text.lines()
            .all(|l| !l.starts_with("dlock_semaphore_held{semaphore=\"sem/metrics\"} 1")),
        "released: {text}"
    );
}

/// The completion form the faces convert (`acquire_then`): a slot won
/// waits in the handle until taken; a cancel while waiting ends the wait
/// with `released` and queues nothing; a cancel after the win and before
/// the take releases the slot (nothing held, whenever the cancel comes).
#[test]
fn acquire_then_waits_wins_and_cancels_leaving_nothing_held() {
    let service = MemoryService::new();
    let (a, b) = (client(&service), client(&service));
    let sem = a.semaphore("sem/then", 1).unwrap();
    let theirs = b.semaphore("sem/then", 1).unwrap();
    let done = || {
        let (tx, rx) = mpsc::channel();
        (move |r: Result<(), Error>| tx.send(r).unwrap(), rx)
    };

    // Free: won, then taken once.
    let (then, rx) = done();
    let acq = sem.acquire_then(Some(EVENT), then);
    assert_eq!(rx.recv_timeout(EVENT).unwrap(), Ok(()));
    let held = acq.take().expect("the slot won");
    assert!(acq.take().is_none(), "taken once");
    assert_eq!((held.slot(), held.state()), (Some(0), State::Holding));

    // Held: the other client waits; its cancel ends the wait, nothing queued.
    let (then, rx) = done();
    let waiting = theirs.acquire_then(None, then);
    until("the waiter queued", || b.default_session().locks() >= 1);
    assert!(rx.recv_timeout(ms(200)).is_err(), "still waiting");
    waiting.cancel();
    assert_eq!(rx.recv_timeout(EVENT).unwrap(), Err(Error::Released));
    until("the waiter's handles are gone", || {
        b.default_session().locks() == 0
    });

    // Won and never taken: the cancel releases it, so `a` gets the slot back.
    held.release().unwrap();
    let (then, rx) = done();
    let won = theirs.acquire_then(Some(EVENT), then);
    assert_eq!(rx.recv_timeout(EVENT).unwrap(), Ok(()));
    won.cancel();
    assert!(won.take().is_none(), "cancelled: nothing to take");
    let again = sem
        .acquire(EVENT)
        .expect("the cancelled win let the slot go");
    assert_eq!(again.slot(), Some(0));
}

/// A wait through a service that does not answer for a while (issue 29:
/// `dlock run -n` gave up when its first request was delayed): the acquire
/// waits, as a lock's does, and takes a slot once the link heals, within
/// its own timeout. The one slot tried alone first (`first_try`) must not
/// end the wait when its try gets no answer.
#[test]
fn an_acquire_waits_through_a_silent_service_as_a_locks_does() {
    let service = MemoryService::new();
    let link = service.link();
    let c = Client::new(link.clone(), short()).unwrap();
    let sem = c.semaphore("sem/silent", 2).unwrap();
    link.partition();
    let (tx, rx) = mpsc::channel();
    let waiter = sem.clone();
    thread::spawn(move || {
        let _ = tx.send(waiter.acquire(EVENT));
    });
    // Longer than a try's bound (two keepalive timeouts, 400 ms): the
    // first try has failed by now.
    assert!(
        rx.recv_timeout(ms(1500)).is_err(),
        "the acquire ended while the service was silent"
    );
    link.heal();
    let held = rx.recv_timeout(EVENT).unwrap().expect("a slot once healed");
    assert!(held.slot().is_some());
    held.release().unwrap();
}

/// The limit's request at a handle's making is tried again through a
/// failure worth retrying, within its bound (the TTL): a service down for
/// a moment at start (half a second here, the TTL is 2 s) does not refuse
/// the handle (issue 29: `dlock run -n` gave up when its first request
/// failed). Down for longer than the bound, the handle is refused.
#[test]
fn a_handle_is_made_through_a_short_outage_and_refused_past_the_ttl() {
    let service = MemoryService::new();
    let c = client(&service);
    service.outage(true);
    let (tx, rx) = mpsc::channel();
    let maker = c.clone();
    thread::spawn(move || {
        let _ = tx.send(maker.semaphore("sem/blip", 2).map(|s| s.limit()));
    });
    thread::sleep(ms(500));
    service.outage(false);
    assert_eq!(rx.recv_timeout(EVENT).unwrap().unwrap(), 2);
    service.outage(true);
    let started = std::time::Instant::now();
    let refused = c.semaphore("sem/blip-long", 2).unwrap_err();
    assert!(matches!(refused, Error::Backend(_)), "{refused:?}");
    assert!(
        started.elapsed() >= ms(1500),
        "refused after {:?}, before the bound",
        started.elapsed()
    );
    service.outage(false);
}

/// Polls `f` on the calling thread, parking between wakes: an executor
/// with no tokio runtime, as a caller's own may be.
fn block_on_any_executor<F: std::future::Future>(f: F) -> F::Output {
    use std::sync::Arc;
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        thread::park();
    }
}

/// The async forms run on any executor: their waits (the head's timers,
/// the engine's own wait for a free slot) run on dlock's driver. (They ran
/// in the caller's task once: "there is no reactor running" in the
/// nemesis's Rust holder.)
#[test]
fn the_async_forms_work_on_an_executor_without_a_runtime() {
    let service = MemoryService::new();
    let sems: Vec<_> = (0..3)
        .map(|_| client(&service).semaphore("sem/any-executor", 2).unwrap())
        .collect();
    let (a, b) = block_on_any_executor(async {
        let a = sems[0].try_acquire_async().await.unwrap();
        let b = sems[1].acquire_async(Some(EVENT)).await.unwrap();
        (a, b)
    });
    assert_ne!(a.slot(), b.slot());
    block_on_any_executor(async {
        assert_eq!(
            sems[2].try_acquire_async().await.unwrap_err(),
            Error::WouldBlock
        );
        let waited = sems[2].acquire_async(Some(ms(300))).await;
        assert_eq!(waited.unwrap_err(), Error::Timeout);
    });
    let slot = a.slot();
    let releaser = thread::spawn(move || {
        thread::sleep(ms(200));
        drop(a);
    });
    let c = block_on_any_executor(sems[2].acquire_async(Some(EVENT))).unwrap();
    assert_eq!(c.slot(), slot, "the released slot");
    releaser.join().unwrap();
}
