//! Elections on the embedded backend (docs/elections.md): campaign,
//! proclaim, resign with work in flight, observers (first event, every
//! change, an explicit no-leader), recampaign after a fence, bad input.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::{Error, MemoryService, Observed, Observer, Refused, State};

use dlock_testkit as common;
use dlock_testkit::embedded::{client, client_no_reacquire, ms};
use dlock_testkit::watch;

/// The observer's next event, within 5 s.
fn next(o: &mut Observer) -> Observed {
    o.recv_blocking(Some(Duration::from_secs(5)))
        .expect("an observer event within 5 s")
        .expect("the observer is live")
}

fn leader_of(e: Observed) -> dlock::Leader {
    match e {
        Observed::Leader(l) => l,
        other => panic!("expected a new leader, got {other:?}"),
    }
}

#[test]
fn campaign_proclaim_resign_as_an_observer_sees_them() {
    let service = MemoryService::new();
    let a = client(&service);
    let b = client(&service);
    let watcher = client(&service);
    let mut obs = watcher.observe("el/basic").unwrap();
    assert_eq!(
        next(&mut obs),
        Observed::NoLeader,
        "first: the current state"
    );

    let ea = a.election("el/basic").unwrap();
    let t1 = ea.campaign(b"alpha", ms(2000)).unwrap();
    let l = leader_of(next(&mut obs));
    assert_eq!((l.value.as_slice(), l.token), (&b"alpha"[..], t1));
    assert_eq!(l.key, dlock::lock_key("el/basic", l.lease));
    assert_eq!(ea.permit().unwrap().token(), t1);

    // A second candidate waits; with a short timeout it gives up holding
    // nothing, and the observer sees no change.
    let eb = b.election("el/basic").unwrap();
    assert_eq!(eb.campaign(b"beta", ms(100)).unwrap_err(), Error::Timeout);
    assert_eq!(eb.state(), State::Idle);
    assert_eq!(service.holder("el/basic"), Some(t1));

    // Proclaim: the same token, a new value.
    ea.proclaim(b"alpha-2").unwrap();
    match next(&mut obs) {
        Observed::Proclaimed(l) => {
            assert_eq!((l.value.as_slice(), l.token), (&b"alpha-2"[..], t1))
        }
        other => panic!("expected a proclaim, got {other:?}"),
    }
    let seen = eb.leader().unwrap().expect("a leader");
    assert_eq!((seen.value.as_slice(), seen.token), (&b"alpha-2"[..], t1));

    // Resign with nobody else campaigning: no leader.
    ea.resign(ms(1000)).unwrap();
    assert_eq!(next(&mut obs), Observed::NoLeader);
    assert_eq!(ea.permit().unwrap_err(), Refused::Released);
    assert_eq!(ea.proclaim(b"late").unwrap_err(), Error::NotHeld);
    assert_eq!(eb.leader().unwrap(), None);

    // b campaigns now: elected with a higher token.
    let t2 = eb.campaign(b"beta", ms(2000)).unwrap();
    assert!(t2 > t1);
    let l = leader_of(next(&mut obs));
    assert_eq!((l.value.as_slice(), l.token), (&b"beta"[..], t2));
}

#[test]
fn resign_waits_for_the_unit_in_flight_before_the_next_leader() {
    let service = MemoryService::new();
    let a = client(&service);
    let b = client(&service);
    let ea = a.election("el/resign").unwrap();
    let t1 = ea.campaign(b"a", ms(2000)).unwrap();
    let unit = ea.permit_owned().unwrap();

    let (won_tx, won_rx) = mpsc::channel();
    let eb = b.election("el/resign").unwrap();
    let waiter = std::thread::spawn(move || {
        let t = eb.campaign(b"b", Duration::from_secs(10));
        won_tx.send((Instant::now(), t)).unwrap();
        eb
    });
    let (resigned_tx, resigned_rx) = mpsc::channel();
    let resigner = std::thread::spawn(move || {
        ea.resign(Duration::from_secs(30)).unwrap();
        resigned_tx.send(Instant::now()).unwrap();
        ea
    });
    // The unit runs: the resignation holds the key, nobody else leads.
    assert!(
        resigned_rx.recv_timeout(ms(400)).is_err(),
        "resign returned while a unit was in flight"
    );
    assert!(won_rx.try_recv().is_err());
    assert_eq!(service.holder("el/resign"), Some(t1));
    let ended = Instant::now();
    unit.end();
    let resigned = resigned_rx.recv_timeout(ms(5000)).expect("resign returns");
    let (won, t2) = won_rx.recv_timeout(ms(5000)).expect("b elected");
    let t2 = t2.unwrap();
    assert!(resigned >= ended && won >= ended);
    assert!(t2 > t1);
    let ea = resigner.join().unwrap();
    let _eb = waiter.join().unwrap();
    assert_eq!(ea.state(), State::Released);
}

#[test]
fn resign_deletes_the_key_at_the_grace_with_a_unit_still_in_flight() {
    let service = MemoryService::new();
    let a = client(&service);
    let ea = a.election("el/grace").unwrap();
    let t1 = ea.campaign(b"a", ms(2000)).unwrap();
    let unit = ea.permit_owned().unwrap();
    let start = Instant::now();
    ea.resign(ms(300)).unwrap();
    let took = start.elapsed();
    assert!(took >= ms(300), "the key went before the grace: {took:?}");
    assert!(took < ms(2000), "{took:?}");
    assert_eq!(service.holder("el/grace"), None);
    assert!(!unit.valid());
    let _ = t1;
}

#[test]
fn a_fenced_leader_refuses_proclaim_and_recampaigns_with_its_value() {
    // No recampaign: the fenced leader stays fenced and refuses.
    let service = MemoryService::new();
    let a = client_no_reacquire(&service);
    let ea = a.election("el/fenced").unwrap();
    let t1 = ea.campaign(b"v1", ms(2000)).unwrap();
    a.link().unwrap().declare_lease_lost();
    watch::until("fenced", ms(3000), || ea.state() == State::Fenced);
    assert_eq!(ea.state(), State::Fenced);
    assert_eq!(ea.proclaim(b"v2").unwrap_err(), Error::Fenced(t1.get()));

    // Recampaign (the default): elected again with a higher token and the
    // last proclaimed value.
    let b = client(&service);
    let eb = b.election("el/recampaign").unwrap();
    let t1 = eb.campaign(b"first", ms(2000)).unwrap();
    eb.proclaim(b"second").unwrap();
    let (tx, rx) = mpsc::channel();
    eb.on_acquired(move |t| {
        let _ = tx.send(t);
    });
    b.link().unwrap().declare_lease_lost();
    let t2 = rx.recv_timeout(ms(5000)).expect("recampaigned");
    assert!(t2 > t1);
    let l = eb.leader().unwrap().expect("a leader");
    assert_eq!((l.value.as_slice(), l.token), (&b"second"[..], t2));
}

#[test]
fn an_observer_reports_no_leader_once_the_leaders_lease_expires() {
    let service = MemoryService::new();
    let a = client(&service);
    let watcher = client(&service);
    let ea = a.election("el/expire").unwrap();
    let t1 = ea.campaign(b"a", ms(2000)).unwrap();
    let mut obs = watcher.observe("el/expire").unwrap();
    assert_eq!(leader_of(next(&mut obs)).token, t1);
    // Cut off: the leader fences at its deadline; the service expires the
    // lease a TTL after its last keepalive and the key goes with it.
    a.link().unwrap().partition();
    let cut = Instant::now();
    let e = obs.recv_blocking(Some(ms(5000))).unwrap().unwrap();
    assert_eq!(e, Observed::NoLeader);
    assert!(cut.elapsed() <= ms(2600), "{:?}", cut.elapsed());
    assert_ne!(ea.state(), State::Holding, "fenced before the key expired");
    a.link().unwrap().heal();
}

/// Issue 32, 6: the documented limits are the same on every engine: the
/// embedded one refuses a value over 1 MiB, naming the limit, before
/// anything is sent, as etcd would have to; the longest name with the
/// longest value is taken.
#[test]
fn the_size_limits_are_every_engines() {
    assert_eq!(dlock::election::MAX_VALUE_LEN, 1024 * 1024);
    assert_eq!(dlock::MAX_NAME_LEN, 1024);
    let service = MemoryService::new();
    let c = client(&service);
    let e = c.election(&"n".repeat(dlock::MAX_NAME_LEN)).unwrap();
    let over = vec![b'x'; 1024 * 1024 + 1];
    let err = e.campaign(&over, ms(1000)).unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    assert!(err.to_string().contains("1048576"), "{err}");
    assert_eq!(e.state(), State::Idle, "nothing sent");
    let max = vec![b'x'; dlock::election::MAX_VALUE_LEN];
    e.campaign(&max, ms(5000)).unwrap();
    assert_eq!(e.proclaim(&over).unwrap_err().code(), "invalid_argument");
    e.proclaim(&max).unwrap();
    e.resign(ms(0)).unwrap();
}

#[test]
fn bad_input_is_one_clear_error_and_holds_nothing() {
    let service = MemoryService::new();
    let c = client(&service);
    assert_eq!(c.election("").unwrap_err().code(), "invalid_argument");
    assert_eq!(c.observe("").unwrap_err().code(), "invalid_argument");
    let e = c.election("el/bad").unwrap();
    let big = vec![b'x'; dlock::election::MAX_VALUE_LEN + 1];
    let err = e.campaign(&big, ms(1000)).unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    assert!(err.to_string().contains("MAX_VALUE_LEN"), "{err}");
    assert_eq!(service.holder("el/bad"), None);
    assert_eq!(e.state(), State::Idle);

    let session = c.session(common::short()).unwrap();
    let closed = session.election("el/bad").unwrap();
    session.close().unwrap();
    assert_eq!(
        closed.campaign(b"v", ms(1000)).unwrap_err(),
        Error::Released
    );
    assert_eq!(service.holder("el/bad"), None);

    let gone = client(&service);
    gone.shutdown();
    assert_eq!(gone.observe("el/bad").unwrap_err(), Error::Shutdown);
}

#[test]
fn an_observer_says_reconnecting_through_an_outage_then_the_state() {
    let service = MemoryService::new();
    let a = client(&service);
    let watcher = client(&service);
    let mut obs = watcher.observe("el/outage").unwrap();
    assert_eq!(next(&mut obs), Observed::NoLeader);
    let ea = a.election("el/outage").unwrap();
    let t = ea.campaign(b"a", ms(2000)).unwrap();
    let l = leader_of(next(&mut obs));
    assert_eq!(l.token, t);
    service.outage(true);
    assert_eq!(next(&mut obs), Observed::Reconnecting);
    service.outage(false);
    // The state after the reconnect, repeated although unchanged.
    let l = leader_of(next(&mut obs));
    assert_eq!((l.token, l.value.as_slice()), (t, &b"a"[..]));
}

#[test]
fn a_refused_proclaim_names_the_token_won_by_campaign_then() {
    // The faces' completion form records the token as `campaign` does.
    let service = MemoryService::new();
    let a = client_no_reacquire(&service);
    let ea = a.election("el/then").unwrap();
    let (tx, rx) = mpsc::channel();
    let _acquisition = ea
        .campaign_then(b"v1", Some(ms(2000)), move |r| {
            let _ = tx.send(r);
        })
        .unwrap();
    let t1 = rx.recv_timeout(ms(5000)).unwrap().unwrap();
    a.link().unwrap().declare_lease_lost();
    watch::until("fenced", ms(3000), || ea.state() == State::Fenced);
    assert_eq!(ea.proclaim(b"v2").unwrap_err(), Error::Fenced(t1.get()));
}

/// Issue 32, item 3: an observer nobody reads keeps a bounded backlog, not
/// every change: after 3,000 proclaims unread, the reader gets a handful
/// of events (the first one a new leader, as it never read that leader),
/// ending at the newest value.
#[test]
fn an_observer_nobody_reads_keeps_a_bounded_backlog() {
    let service = MemoryService::new();
    let a = client(&service);
    let watcher = client(&service);
    let mut obs = watcher.observe("el/backlog").unwrap();
    assert_eq!(next(&mut obs), Observed::NoLeader);
    let ea = a.election("el/backlog").unwrap();
    ea.campaign(b"first", ms(2000)).unwrap();
    for i in 0..3000 {
        ea.proclaim(format!("value {i}").as_bytes()).unwrap();
    }
    let mut read = vec![next(&mut obs)];
    assert!(
        matches!(read[0], Observed::Leader(_)),
        "the first event names the leader the reader never saw: {:?}",
        read[0]
    );
    while read.last().unwrap().leader().unwrap().value != b"value 2999" {
        read.push(next(&mut obs));
        assert!(read.len() <= 200, "{} events kept", read.len());
    }
    ea.resign(ms(1000)).unwrap();
}

/// The callback form (`observe_with`): every event in order on the
/// observer's own thread; once `close` returns, the callback runs no more;
/// the observer's reads are refused (its events are the callback's).
#[test]
fn an_observer_with_a_callback_gets_every_change_and_nothing_after_close() {
    let service = MemoryService::new();
    let a = client(&service);
    let watcher = client(&service);
    let (tx, rx) = mpsc::channel();
    let obs = watcher
        .observe_with("el/callback", move |e| {
            let _ = tx.send((e, std::thread::current().name().map(String::from)));
        })
        .unwrap();
    let event = || rx.recv_timeout(Duration::from_secs(5)).expect("an event");
    let (first, thread) = event();
    assert_eq!(first, Observed::NoLeader, "first: the current state");
    assert_eq!(thread.as_deref(), Some("dlock-observer"));
    assert_eq!(
        obs.recv_blocking(Some(ms(10))).unwrap_err().code(),
        "invalid_argument"
    );
    let ea = a.election("el/callback").unwrap();
    let t1 = ea.campaign(b"alpha", ms(2000)).unwrap();
    assert_eq!(leader_of(event().0).token, t1);
    ea.proclaim(b"beta").unwrap();
    assert!(matches!(event().0, Observed::Proclaimed(l) if l.value == b"beta"));
    obs.close();
    ea.resign(Duration::ZERO).unwrap();
    // The sender went with the callback: the channel ends, nothing more.
    assert!(matches!(
        rx.recv_timeout(Duration::from_secs(2)),
        Err(mpsc::RecvTimeoutError::Disconnected)
    ));
}

/// The pull form is closeable from another thread: a read waiting with no
/// limit returns the end at the close, and every later read too.
#[test]
fn a_close_from_another_thread_ends_a_waiting_read() {
    let service = MemoryService::new();
    let watcher = client(&service);
    let obs = std::sync::Arc::new(watcher.observe("el/close").unwrap());
    assert_eq!(
        obs.recv_blocking(Some(Duration::from_secs(5))).unwrap(),
        Some(Observed::NoLeader)
    );
    let (tx, rx) = mpsc::channel();
    let reader = {
        let obs = obs.clone();
        std::thread::spawn(move || {
            tx.send(()).unwrap();
            obs.recv_blocking(None)
        })
    };
    rx.recv().unwrap();
    // The reader is in (or about to enter) its wait; either way the close
    // ends it.
    std::thread::sleep(ms(20));
    obs.close();
    assert_eq!(reader.join().unwrap(), Ok(None));
    assert_eq!(obs.recv_blocking(Some(ms(0))), Ok(None));
    assert!(obs.is_closed());
}
