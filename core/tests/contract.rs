//! The core contract every face relies on (docs/design.md §10, §11, §13,
//! §16, §17), on the embedded backend in real time: the ordering of the
//! revoke after a fence, close and drop, the backend choice, the errors of
//! an acquire, events, stats and the async forms.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use dlock::{
    Client, ClientConfig, Error, LockEvent, MAX_TTL, MemoryBackend, MemoryService, Options, State,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// TTL 2 s, keepalive every 500 ms, timeout 200 ms, retry 200 ms, margin
/// 500 ms: a cut fences about 1.5 s after the last confirmed keepalive.
fn options() -> Options {
    Options {
        ttl: ms(2000),
        keepalive_interval: ms(500),
        keepalive_timeout: ms(200),
        retry_interval: ms(200),
        margin: ms(500),
        reacquire: true,
    }
}

fn client(service: &MemoryService) -> (Client, MemoryBackend) {
    let c = Client::connect(ClientConfig::embedded_in(service.clone()).with_options(options()))
        .expect("embedded client");
    let link = c.link().expect("embedded clients have a link").clone();
    (c, link)
}

/// Replies lost: etcd (and the embedded service) keep renewing the lease,
/// so the lock passes on only through the fenced holder's revoke. That
/// revoke waits for the last permit in flight: the contender acquires after
/// the permit ends, never at the fence.
#[test]
fn the_revoke_after_a_fence_waits_for_the_last_permit() {
    let service = MemoryService::new();
    let (ca, link_a) = client(&service);
    let (cb, _) = client(&service);
    let a = ca.lock("contract/last-permit").unwrap();
    let b = Arc::new(cb.lock("contract/last-permit").unwrap());
    let (fenced_tx, fenced) = mpsc::channel();
    a.on_fence(move |_, in_flight| fenced_tx.send(in_flight).unwrap());
    a.acquire(ms(2000)).unwrap();
    let permit = a.permit_owned().unwrap();
    let contender = {
        let b = b.clone();
        std::thread::spawn(move || {
            let t = b.acquire(ms(10_000));
            (t, Instant::now())
        })
    };
    link_a.drop_keepalive_replies(true);
    assert_eq!(fenced.recv_timeout(ms(5000)).unwrap(), 1, "one in flight");
    let fenced_at = Instant::now();
    std::thread::sleep(ms(700)); // work of the old holder still running
    assert!(!contender.is_finished(), "acquired while the permit ran");
    assert!(!permit.valid());
    let ended_at = Instant::now();
    permit.end();
    let (token, acquired_at) = contender.join().unwrap();
    assert!(token.is_ok(), "{token:?}");
    assert!(acquired_at >= ended_at);
    assert!(
        acquired_at - ended_at < ms(500),
        "the revoke follows the last permit: {:?} after it",
        acquired_at - ended_at
    );
    eprintln!(
        "fence → permit end {:?}, permit end → contender {:?}",
        ended_at - fenced_at,
        acquired_at - ended_at
    );
    b.release().unwrap();
}

/// A service that goes down and comes back restores leases with a fresh
/// TTL (etcd does). A holder fenced during the outage must not wait behind
/// its own dead lease: its revoke is tried again until the service answers.
#[test]
fn reacquire_after_an_outage_does_not_wait_behind_its_own_dead_lease() {
    let service = MemoryService::new();
    let (ca, _) = client(&service);
    let a = ca.lock("contract/outage").unwrap();
    let (acq_tx, acquired) = mpsc::channel();
    a.on_acquired(move |t| acq_tx.send(t).unwrap());
    let t1 = a.acquire(ms(2000)).unwrap();
    assert_eq!(acquired.recv_timeout(ms(1000)).unwrap(), t1);
    service.outage(true);
    // Fenced at the deadline (≤ 1.5 s); the revoke fails while down.
    let deadline = Instant::now() + ms(5000);
    while a.state() != State::Reacquiring {
        assert!(Instant::now() < deadline, "no fence during the outage");
        std::thread::sleep(ms(20));
    }
    std::thread::sleep(ms(2500)); // longer than the TTL
    service.outage(false);
    let back = Instant::now();
    let t2 = acquired.recv_timeout(ms(5000)).expect("reacquired");
    let took = back.elapsed();
    assert!(t2 > t1);
    // A revoke retried every 200 ms, a grant, a lock: well under the TTL
    // (2 s) it would wait behind the restored lease.
    assert!(took < ms(1200), "reacquired {took:?} after the outage");
    eprintln!("reacquired {took:?} after the outage ended");
    a.release().unwrap();
}

#[test]
fn an_unreachable_service_is_a_backend_error_not_a_timeout() {
    let service = MemoryService::new();
    let (c, _) = client(&service);
    let lock = c.lock("contract/unreachable").unwrap();
    service.outage(true);
    match lock.acquire(ms(800)) {
        Err(Error::Backend(m)) => assert!(m.contains("down"), "{m}"),
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert!(matches!(lock.try_acquire(), Err(Error::Backend(_))));
    service.outage(false);
    lock.acquire(ms(2000)).unwrap();
    lock.release().unwrap();
}

#[test]
fn a_ttl_no_service_can_grant_is_an_invalid_option_up_front() {
    let mut o = options();
    o.ttl = MAX_TTL + ms(1000);
    let e = Client::connect(ClientConfig::embedded().with_options(o)).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidOption { setting: "ttl", .. }),
        "{e}"
    );
}

/// close(): every event up to the release is delivered, then no callback
/// runs again; a running callback is waited for; the streams end.
#[test]
fn close_waits_for_a_running_callback_and_ends_every_callback() {
    let service = MemoryService::new();
    let (c, _) = client(&service);
    let lock = Arc::new(c.lock("contract/close").unwrap());
    let slow_done = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU32::new(0));
    let (started_tx, started) = mpsc::channel();
    {
        let (slow_done, calls) = (slow_done.clone(), calls.clone());
        let started_tx = Mutex::new(started_tx);
        lock.on_acquired(move |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            started_tx.lock().unwrap().send(()).unwrap();
            std::thread::sleep(ms(400));
            slow_done.store(true, Ordering::SeqCst);
        });
    }
    let mut events = lock.events();
    lock.acquire(ms(2000)).unwrap();
    started.recv_timeout(ms(2000)).unwrap();
    let permit = lock.permit_owned().unwrap();
    lock.close().unwrap();
    assert!(
        slow_done.load(Ordering::SeqCst),
        "close returned while the callback ran"
    );
    assert!(!permit.valid());
    assert_eq!(lock.state(), State::Released);
    // Events up to the release, then the stream ends.
    let mut seen = Vec::new();
    while let Ok(Some(e)) = events.recv_blocking(Some(ms(1000))) {
        seen.push(e.to_string());
    }
    assert_eq!(
        seen.last().map(String::as_str),
        Some("state Holding->Released release")
    );
    // Closed: the lock still works, its callbacks do not.
    lock.acquire(ms(2000)).unwrap();
    lock.release().unwrap();
    // Every event of that acquire and release is on the callback thread
    // before this barrier: none ran.
    callbacks_flushed();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    drop(permit); // after the close: safe
    assert!(lock.events().recv_blocking(Some(ms(10))) == Ok(None));
}

/// A callback may close (or drop) its own lock without a deadlock.
#[test]
fn a_callback_may_close_its_own_lock() {
    let service = MemoryService::new();
    let (c, _) = client(&service);
    let lock = Arc::new(c.lock("contract/close-inside").unwrap());
    let (done_tx, done) = mpsc::channel();
    {
        let weak = Arc::downgrade(&lock);
        let done_tx = Mutex::new(done_tx);
        lock.on_acquired(move |_| {
            if let Some(l) = weak.upgrade() {
                let r = l.close();
                done_tx.lock().unwrap().send(r).unwrap();
            }
        });
    }
    lock.acquire(ms(2000)).unwrap();
    assert_eq!(done.recv_timeout(ms(3000)).unwrap(), Ok(()));
    assert_eq!(lock.state(), State::Released);
    assert!(lock.is_closed());
}

/// Dropping a lock: released before the drop returns (permits in flight
/// turn invalid), no callback after, and its permits stay safe to end.
#[test]
fn a_dropped_lock_leaves_its_permits_safe_and_invalid() {
    let service = MemoryService::new();
    let (c, _) = client(&service);
    let lock = c.lock("contract/drop").unwrap();
    let calls = Arc::new(AtomicU32::new(0));
    let n = calls.clone();
    lock.on_event(move |_| {
        n.fetch_add(1, Ordering::SeqCst);
    });
    lock.acquire(ms(2000)).unwrap();
    let permits: Vec<_> = (0..3).map(|_| lock.permit_owned().unwrap()).collect();
    drop(lock);
    let after_drop = calls.load(Ordering::SeqCst);
    for p in &permits {
        assert!(!p.valid());
    }
    // Ended on other threads, after the handle is gone.
    let ends: Vec<_> = permits
        .into_iter()
        .map(|p| std::thread::spawn(move || p.end()))
        .collect();
    for e in ends {
        e.join().unwrap();
    }
    callbacks_flushed();
    assert_eq!(calls.load(Ordering::SeqCst), after_drop);
    assert_eq!(service.holder("contract/drop"), None);
}

/// One subscription gives every event, in order, with the core's
/// timestamp; `Display` is the scenario trace line.
#[test]
fn on_event_and_the_stream_agree_and_carry_the_cores_time() {
    let service = MemoryService::new();
    let (c, link) = client(&service);
    let lock = c.lock("contract/events").unwrap();
    let pushed = Arc::new(Mutex::new(Vec::<LockEvent>::new()));
    let p = pushed.clone();
    lock.on_event(move |e| p.lock().unwrap().push(*e));
    let mut stream = lock.events();
    let before = c.clock().now();
    lock.acquire(ms(2000)).unwrap();
    link.partition();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let pulled = rt.block_on(async {
        let mut v = Vec::new();
        while let Some(e) = stream.recv().await {
            let fence = matches!(e, LockEvent::Fence { .. });
            v.push(e);
            if fence {
                break;
            }
        }
        v
    });
    let lines: Vec<String> = pulled.iter().map(ToString::to_string).collect();
    assert_eq!(
        lines,
        [
            "state Idle->Acquiring acquire",
            "state Acquiring->Holding acquired",
            "acquired token=1",
            "state Holding->Draining keepalive_timeout",
            "drained",
            "state Draining->Fenced deadline",
            "fence token=1 in_flight=0",
        ]
    );
    assert!(pulled.windows(2).all(|w| w[0].at() <= w[1].at()));
    assert!(pulled[0].at() >= before);
    let fence = pulled.last().unwrap();
    let late = c.clock().now().saturating_since(fence.at());
    assert!(late < ms(1000), "{late:?}");
    // The stream and the callback got the fence in one job.
    callbacks_flushed();
    let pushed = pushed.lock().unwrap();
    assert_eq!(&pushed[..pulled.len()], &pulled[..]);
    link.heal();
}

#[test]
fn stats_count_drains_resumes_fences_and_read_the_slack() {
    let service = MemoryService::new();
    let (c, link) = client(&service);
    let lock = c.lock("contract/stats").unwrap();
    let s = lock.stats();
    assert_eq!((s.acquisitions, s.slack, s.in_flight), (0, None, 0));
    lock.acquire(ms(2000)).unwrap();
    let p = lock.permit_owned().unwrap();
    let s = lock.stats();
    assert_eq!(s.acquisitions, 1);
    assert_eq!(s.in_flight, 1);
    assert!(s.slack.is_some_and(|d| d > Duration::ZERO && d <= ms(1500)));
    assert!(s.last_keepalive_rtt.is_none());
    drop(p);
    std::thread::sleep(ms(700));
    assert!(lock.stats().last_keepalive_rtt.is_some());
    // A blip: one drain, one resume.
    link.fail_keepalives(Some("blip"));
    let deadline = Instant::now() + ms(3000);
    while lock.state() != State::Draining {
        assert!(Instant::now() < deadline);
        std::thread::sleep(ms(10));
    }
    link.fail_keepalives(None);
    while lock.state() != State::Holding {
        assert!(Instant::now() < deadline);
        std::thread::sleep(ms(10));
    }
    let s = lock.stats();
    assert_eq!((s.drains, s.resumes), (1, 1));
    link.declare_lease_lost();
    while lock.stats().acquisitions < 2 {
        assert!(Instant::now() < deadline + ms(3000));
        std::thread::sleep(ms(10));
    }
    let s = lock.stats();
    assert_eq!((s.fences_lease_lost, s.fences_deadline), (1, 0));
    lock.release().unwrap();
}

/// The async forms share the blocking forms' code path and complete from
/// the core's driver on any executor.
#[test]
fn async_forms_work_on_a_callers_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let service = MemoryService::new();
        let config = ClientConfig::embedded_in(service.clone()).with_options(options());
        let c1 = Client::connect_async(config.clone()).await.unwrap();
        let c2 = Client::connect_async(config).await.unwrap();
        let a = c1.lock("contract/async").unwrap();
        let b = c2.lock("contract/async").unwrap();
        let t = a.try_acquire_async().await.unwrap();
        assert_eq!(b.try_acquire_async().await.unwrap_err(), Error::WouldBlock);
        a.guarded_put_async(t, b"contract-async-key", b"v")
            .await
            .unwrap();
        assert_eq!(
            service.get(b"contract-async-key").as_deref(),
            Some(&b"v"[..])
        );
        a.guarded_delete_async(t, b"contract-async-key")
            .await
            .unwrap();
        a.release_async().await.unwrap();
        let t2 = b.acquire_async(Some(ms(2000))).await.unwrap();
        assert!(t2 > t);
        assert_eq!(
            a.guarded_put_async(t, b"contract-async-key", b"late")
                .await
                .unwrap_err(),
            Error::Fenced(t.get())
        );
        b.release_async().await.unwrap();
        b.close_async().await.unwrap();
        assert!(b.is_closed());
    });
}

/// A barrier, not a sleep: returns once the callback thread ran every job
/// queued before it (a job queued through the driver, which delivered every
/// event decided before it was asked).
fn callbacks_flushed() {
    let (tx, rx) = mpsc::channel();
    dlock::spawn_then(async {}, move |()| {
        let _ = tx.send(());
    });
    rx.recv_timeout(ms(5000)).expect("the callback thread");
}
