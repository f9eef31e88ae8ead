//! Read/write locks on the embedded engine (docs/design.md §27, issue 30):
//! readers share; a queued writer blocks later readers; a downgrade keeps
//! the key and its token and lets queued readers in; an upgrade is refused;
//! a plain lock is a writer; drain and fence are per holder (a cut-off
//! reader fences before a waiting writer acquires, and a cut-off writer
//! before waiting readers do; an operator deleting a reader's key fences
//! that reader alone). And the model test of the resource side: random
//! interleavings of grants, expiries and resource calls through
//! `FenceGate::admit_read` / `admit_write`, where no admitted write
//! overlaps another grant's admitted read or write (no grant's calls
//! straddle another's write), and a holder whose grant lives is never
//! refused.

use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use dlock::rwlock::{Mode, holds};
use dlock::{Client, Error, FenceGate, Lock, MemoryService, State, Token};
use dlock_testkit::embedded::{client, ms};
use dlock_testkit::short;
use dlock_testkit::watch::{self, fences};
use proptest::prelude::*;

mod rw_cases;

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(10);

/// Acquires `lock` on a thread of its own; the receiver gets the outcome.
fn acquire_in_background(lock: Arc<Lock>) -> Receiver<Result<Token, Error>> {
    watch::in_background(lock, EVENT)
}

fn until(what: &str, cond: impl FnMut() -> bool) {
    watch::until(what, EVENT, cond);
}

/// The cases every engine plays (rw_cases), on the embedded service.
#[test]
fn readers_share_and_each_holds_its_own_token() {
    let service = MemoryService::new();
    rw_cases::readers_share(&|| client(&service), "rw/share");
}

#[test]
fn a_plain_lock_holder_is_a_writer_to_readers() {
    let service = MemoryService::new();
    let plain = client(&service).lock("rw/plain").unwrap();
    let t = plain.try_acquire().unwrap();
    let r = client(&service).rwlock("rw/plain").unwrap().read().unwrap();
    assert_eq!(r.try_acquire(), Err(Error::WouldBlock));
    // A wait cut short leaves nothing queued: a writer after it is next.
    assert_eq!(r.acquire(ms(200)), Err(Error::Timeout));
    plain.release().unwrap();
    let w = client(&service)
        .rwlock("rw/plain")
        .unwrap()
        .write()
        .unwrap();
    assert!(w.try_acquire().unwrap() > t, "no reader's key left ahead");
    w.release().unwrap();
    r.try_acquire().unwrap();
}

#[test]
fn a_queued_writer_blocks_later_readers() {
    let service = MemoryService::new();
    rw_cases::a_queued_writer_blocks_later_readers(&|| client(&service), "rw/fifo");
}

#[test]
fn a_downgrade_keeps_the_token_and_lets_queued_readers_in() {
    let service = MemoryService::new();
    let name = "rw/downgrade";
    let w = client(&service).rwlock(name).unwrap().write().unwrap();
    let t = w.try_acquire().unwrap();
    let reader = Arc::new(client(&service).rwlock(name).unwrap().read().unwrap());
    let read = acquire_in_background(reader.clone());
    until("the reader queued", || reader.state() == State::Acquiring);
    assert!(read.recv_timeout(ms(200)).is_err(), "the writer holds");

    w.guarded_put(t, b"k", b"by the writer").unwrap();
    w.downgrade().unwrap();
    assert_eq!(w.mode(), Some(Mode::Read));
    assert_eq!(w.token(), Some(t), "the same key, the same token");
    assert_eq!(service.holder(name), Some(t));
    let tr = read.recv_timeout(EVENT).unwrap().unwrap();
    assert!(tr > t);
    // Both read now; a writer waits for both.
    let w2 = client(&service).rwlock(name).unwrap().write().unwrap();
    assert_eq!(w2.try_acquire(), Err(Error::WouldBlock));
    // A read holder's guarded write is refused; a reader's downgrade is
    // nothing to do.
    assert_eq!(
        w.guarded_put(t, b"k", b"v").unwrap_err().code(),
        "invalid_argument"
    );
    assert_eq!(service.get(b"k").as_deref(), Some(&b"by the writer"[..]));
    w.downgrade().unwrap();
    assert_eq!(w.token(), Some(t));
}

/// The snapshot knows each holder's mode, and `dlock_rwlock_held` counts
/// the holders by mode: a writer, then the same holder after its downgrade
/// (now a reader), a waiting reader not counted, a plain lock not listed.
#[test]
fn the_snapshot_counts_holders_by_mode_and_a_downgrade_moves_one() {
    let service = MemoryService::new();
    let (a, b) = (client(&service), client(&service));
    let name = "rw/metrics";
    let w = a.rwlock(name).unwrap().write().unwrap();
    w.acquire(EVENT).unwrap();
    let r = Arc::new(b.rwlock(name).unwrap().read().unwrap());
    let waiting = acquire_in_background(r.clone());
    let plain = a.lock("rw/metrics-plain").unwrap();
    let held = |c: &Client| {
        let text = c.snapshot().to_text();
        let get = |mode: &str| {
            let series = format!("dlock_rwlock_held{{lock=\"{name}\",mode=\"{mode}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&series))
                .map(|v| v.parse::<f64>().unwrap())
        };
        (get("read"), get("write"))
    };
    let snap = a.snapshot();
    let locks: Vec<_> = snap.sessions.iter().flat_map(|s| &s.locks).collect();
    let mode_of = |n: &str| locks.iter().find(|l| l.name == n).unwrap().mode;
    assert_eq!(mode_of(name), Some(Mode::Write));
    assert_eq!(mode_of(plain.name()), None, "a plain lock has no mode");
    assert_eq!(held(&a), (Some(0.0), Some(1.0)), "the writer holds");
    assert_eq!(
        held(&b),
        (Some(0.0), Some(0.0)),
        "the reader waits: not held"
    );
    w.downgrade().unwrap();
    assert_eq!(w.mode(), Some(Mode::Read));
    assert_eq!(held(&a), (Some(1.0), Some(0.0)), "downgraded: a reader");
    waiting.recv_timeout(EVENT).unwrap().unwrap();
    assert_eq!(held(&b), (Some(1.0), Some(0.0)), "the queued reader holds");
    w.release().unwrap();
    assert_eq!(held(&a), (Some(0.0), Some(0.0)), "released");
}

#[test]
fn an_upgrade_and_a_plain_locks_downgrade_are_refused() {
    let service = MemoryService::new();
    let c = client(&service);
    let r = c.rwlock("rw/upgrade").unwrap().read().unwrap();
    r.try_acquire().unwrap();
    let e = r.upgrade().unwrap_err();
    assert_eq!(e.code(), "invalid_argument", "{e}");
    assert_eq!(r.mode(), Some(Mode::Read));

    let plain = c.lock("rw/plain-downgrade").unwrap();
    plain.try_acquire().unwrap();
    assert_eq!(plain.downgrade().unwrap_err().code(), "invalid_argument");
    assert_eq!(plain.upgrade().unwrap_err().code(), "invalid_argument");

    let idle = c.rwlock("rw/idle").unwrap().write().unwrap();
    assert_eq!(idle.downgrade(), Err(Error::NotHeld));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(idle.downgrade_async()), Err(Error::NotHeld));

    assert_eq!(
        c.rwlock("").unwrap_err().code(),
        "invalid_argument",
        "names follow a lock's rules"
    );
    // The completion form answers too.
    let (tx, rx) = mpsc::channel();
    idle.downgrade_then(move |r| tx.send(r).unwrap());
    assert_eq!(rx.recv_timeout(EVENT).unwrap(), Err(Error::NotHeld));
}

#[test]
fn a_drain_is_per_holder() {
    let service = MemoryService::new();
    let (la, lb) = (service.link(), service.link());
    let a = Client::new(la.clone(), short()).unwrap();
    let b = Client::new(lb, short()).unwrap();
    let ra = a.rwlock("rw/drain").unwrap().read().unwrap();
    let rb = b.rwlock("rw/drain").unwrap().read().unwrap();
    ra.try_acquire().unwrap();
    rb.try_acquire().unwrap();
    la.fail_keepalives(Some("injected"));
    until("reader a drains", || ra.state() == State::Draining);
    assert!(ra.permit().is_err());
    assert_eq!(rb.state(), State::Holding);
    assert!(rb.permit().is_ok(), "the other reader works on");
    la.fail_keepalives(None);
    until("reader a resumes", || ra.state() == State::Holding);
}

#[test]
fn an_operator_deleting_a_readers_key_fences_that_reader_alone() {
    let service = MemoryService::new();
    let name = "rw/operator";
    let (a, b) = (client(&service), client(&service));
    let ra = a.rwlock(name).unwrap().read().unwrap();
    let rb = b.rwlock(name).unwrap().read().unwrap();
    let ta = ra.try_acquire().unwrap();
    let tb = rb.try_acquire().unwrap();
    let (fa, fb) = (fences(&ra), fences(&rb));
    // The oldest key is reader a's.
    assert!(service.delete_lock_key(name));
    assert_eq!(fa.recv_timeout(EVENT).unwrap(), ta);
    until("reader a reads again", || ra.state() == State::Holding);
    let again = ra.token().unwrap();
    assert!(again > tb, "a new key, a higher token: {again} > {tb}");
    assert_eq!(ra.mode(), Some(Mode::Read), "it came back as a reader");
    assert!(fb.try_recv().is_err(), "reader b was not fenced");
    assert_eq!(rb.token(), Some(tb));
}

/// One holder cut off (its link partitioned) while two others wait: the
/// cut-off holder's fence comes before any waiter's acquisition.
fn cut_off_fences_before_the_waiter_acquires(held: Mode, waits: Mode) {
    let service = MemoryService::new();
    let name = format!("rw/cut/{held}-{waits}");
    let cut = service.link();
    let holder_client = Client::new(cut.clone(), short()).unwrap();
    let holder = holder_client.rwlock(&name).unwrap().holder(held).unwrap();
    let t = holder.try_acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = order.clone();
    holder.on_fence(move |t, _| o.lock().unwrap().push(("fenced", t)));

    let clients: Vec<Client> = (0..2).map(|_| client(&service)).collect();
    let (tx, answers) = mpsc::channel();
    let waiting: Vec<Arc<Lock>> = clients
        .iter()
        .map(|c| {
            let w = Arc::new(c.rwlock(&name).unwrap().holder(waits).unwrap());
            let (o, w2, tx) = (order.clone(), w.clone(), tx.clone());
            thread::spawn(move || {
                let r = w2.acquire(EVENT);
                if let Ok(t) = r {
                    o.lock().unwrap().push(("acquired", t));
                }
                let _ = tx.send((w2, r));
            });
            w
        })
        .collect();
    until("both wait", || {
        waiting.iter().all(|w| w.state() == State::Acquiring)
    });
    cut.partition();
    // Readers share: both hold once the writer is gone. Writers hold one
    // after the other: the first is enough.
    let n = if waits == Mode::Read { 2 } else { 1 };
    let first: Vec<Arc<Lock>> = (0..n)
        .map(|_| {
            let (w, r) = answers.recv_timeout(EVENT).expect("an answer");
            r.expect("acquired");
            w
        })
        .collect();
    let log = order.lock().unwrap().clone();
    assert_eq!(log.first(), Some(&("fenced", t)), "{log:?}");
    assert!(
        log.iter()
            .skip(1)
            .all(|(what, tok)| *what == "acquired" && *tok > t),
        "{log:?}"
    );
    if waits == Mode::Read {
        assert_eq!(log.len(), 3, "both readers hold: {log:?}");
    }
    cut.heal();
    for w in &first {
        w.release().unwrap();
    }
}

#[test]
fn a_reader_cut_off_fences_before_a_waiting_writer_acquires() {
    cut_off_fences_before_the_waiter_acquires(Mode::Read, Mode::Write);
}

#[test]
fn a_writer_cut_off_fences_before_waiting_readers_acquire() {
    cut_off_fences_before_the_waiter_acquires(Mode::Write, Mode::Read);
}

// ---- the model test of the resource side ----

/// One step of the model: the lock service and the holders' calls to the
/// resource, in any interleaving.
#[derive(Clone, Debug)]
enum Step {
    /// A new holder queues in `mode`.
    Queue(Mode),
    /// The `i`-th live key (mod their number) goes: released or expired.
    /// Its holder may go on calling the resource (a pause it did not see).
    End(usize),
    /// The `i`-th holder ever granted (mod their number) calls the resource
    /// in its mode (a reader reads; a writer reads or writes).
    Call(usize, bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        prop_oneof![Just(Mode::Read), Just(Mode::Write)].prop_map(Step::Queue),
        any::<usize>().prop_map(Step::End),
        (any::<usize>(), any::<bool>()).prop_map(|(i, w)| Step::Call(i, w)),
        (any::<usize>(), any::<bool>()).prop_map(|(i, w)| Step::Call(i, w)),
    ]
}

/// A holder of the model: its token, its mode, whether its grant was made.
#[derive(Clone, Debug)]
struct Holder {
    token: u64,
    mode: Mode,
    granted: bool,
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    /// No admitted write overlaps another grant's admitted read or write
    /// (no grant's admitted calls straddle another grant's admitted write;
    /// readers' calls may interleave with each other's), and a holder
    /// whose grant lives is never refused (the grant rule and the gate
    /// agree).
    #[test]
    fn no_admitted_write_overlaps_another_grants_call(steps in proptest::collection::vec(step(), 1..120)) {
        let gate = FenceGate::new();
        let mut next = 0u64;
        let mut live: Vec<Holder> = Vec::new(); // keys on the service, in queue order
        let mut granted: Vec<Holder> = Vec::new(); // every grant ever made
        // The admitted calls, in order: (token, was a write).
        let mut admitted: Vec<(u64, bool)> = Vec::new();
        for s in steps {
            match s {
                Step::Queue(mode) => {
                    next += 1;
                    live.push(Holder { token: next, mode, granted: false });
                }
                Step::End(i) if !live.is_empty() => {
                    let i = i % live.len();
                    live.remove(i);
                }
                Step::End(_) => {}
                Step::Call(i, write) if !granted.is_empty() => {
                    let h = &granted[i % granted.len()];
                    let write = write && h.mode == Mode::Write;
                    let t = Token(h.token);
                    let ok = if write { gate.admit_write("r", t) } else { gate.admit_read("r", t) };
                    let holding = live.iter().any(|l| l.token == h.token);
                    prop_assert!(ok.is_ok() || !holding, "a live holder {} refused: {:?}", h.token, ok);
                    if ok.is_ok() {
                        admitted.push((h.token, write));
                    }
                }
                Step::Call(..) => {}
            }
            // The service grants by the one rule, in queue order.
            let keys: Vec<(u64, Mode)> = live.iter().map(|h| (h.token, h.mode)).collect();
            for h in live.iter_mut().filter(|h| !h.granted) {
                if holds(h.token, h.mode, keys.iter().copied()) {
                    h.granted = true;
                    granted.push(h.clone());
                }
            }
        }
        // No admitted write of one grant is straddled by another grant's
        // admitted calls: each other grant's calls all come before it or
        // all after it.
        for (p, (writer, _)) in admitted.iter().enumerate().filter(|(_, (_, w))| *w) {
            for (other, _) in admitted.iter().filter(|(t, _)| t != writer) {
                let before = admitted[..p].iter().any(|(t, _)| t == other);
                let after = admitted[p + 1..].iter().any(|(t, _)| t == other);
                prop_assert!(!(before && after), "grant {}'s calls straddle writer {}'s write: {:?}", other, writer, admitted);
            }
        }
    }
}
