//! Issue 29's fault cases of a semaphore, played on etcd
//! (etcd_semaphore.rs) and PostgreSQL (postgres_semaphore.rs): N + 1
//! contenders on a semaphore of limit N. One slot holder reaches the
//! engine through the fault proxy, the N − 1 other holders and the waiting
//! contender directly. When the proxy cuts the holder off:
//!
//! - it drains within interval + timeout and fences (`on_fence`) at its
//!   deadline, strictly before the contender acquires its slot;
//! - the contender gets that slot (the only one freed) with a higher token,
//!   and after the heal the fenced holder takes the same slot again, higher
//!   still: tokens rise per slot;
//! - the other N − 1 holders are untouched: no fence, no state change, and
//!   every permit they ask for (every 10 ms) is granted.
//!
//! With replies lost (requests pass) and a permit in flight, the engine
//! keeps renewing the lease: the slot passes on only through the fenced
//! holder's revoke, after its last permit ended, so the permit intervals
//! on that slot never overlap (the contender's first permit starts after
//! the old one ended). Each case runs `DLOCK_FAULT_RUNS` times and prints
//! one `FAULT|` line for the table before it checks its rules.
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use dlock::clock::system_now;
use dlock::{Client, Error, Instant, Lock, State, Token};
use dlock_testkit::faults::{self, Ev, Run, ms, random_phase};
use dlock_testkit::proxy::{Mode, Proxy};

/// The semaphore's limit: N.
pub const LIMIT: u32 = 3;
/// Scheduling slack of a timing bound on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(300);
/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(20);
/// How long the fenced holder's work goes on after its fence (less than
/// the margin, so the server's own expiry cannot hand the slot over first).
const WORK_AFTER_FENCE: Duration = Duration::from_millis(600);
/// How often the untouched holders ask for a permit.
const PERMIT_EVERY: Duration = Duration::from_millis(10);

/// How an engine's test reaches it.
pub struct Engine<'a> {
    /// Prefix of the `FAULT|` case name (`""` on etcd, `"pg "`).
    pub label: &'static str,
    /// A client whose every connection goes through the returned proxies.
    pub cut_off: &'a dyn Fn() -> (Client, Vec<Proxy>),
    /// A client connected directly.
    pub direct: &'a dyn Fn() -> Client,
    /// A client connected directly on the default timings: an untouched
    /// holder's, whose own timing the case is not about (a 0.5 s
    /// keepalive timeout under load drained one on PostgreSQL once, a
    /// sync-standby commit being slower than that).
    pub calm: &'a dyn Fn() -> Client,
    /// Returns once the contender waits for a slot of `name` (etcd: its key
    /// heads the semaphore's queue), or at once where the engine shows no
    /// queue.
    pub queued: &'a dyn Fn(&str),
    /// Reset the proxy's connections before passing again after lost
    /// replies (PostgreSQL's protocol cannot resume mid-stream).
    pub reset_after_lost: bool,
}

/// A slot holder's callbacks, on one clock.
struct Recorder {
    rx: Receiver<(Instant, Ev)>,
    log: Vec<(Instant, Ev)>,
}

impl Recorder {
    fn on(lock: &Lock) -> Recorder {
        let rx = faults::record(lock);
        Recorder {
            rx,
            log: Vec::new(),
        }
    }

    fn collect(&mut self) -> &[(Instant, Ev)] {
        self.log.extend(self.rx.try_iter());
        &self.log
    }

    /// Waits up to `within` for a report matching `f`; returns its time.
    fn wait(&mut self, within: Duration, f: impl Fn(&Ev) -> bool) -> Option<Instant> {
        if let Some((t, _)) = self.collect().iter().find(|(_, e)| f(e)) {
            return Some(*t);
        }
        let end = system_now() + within;
        loop {
            let (t, e) = self
                .rx
                .recv_timeout(end.saturating_since(system_now()))
                .ok()?;
            self.log.push((t, e));
            if f(&e) {
                return Some(t);
            }
        }
    }

    fn story(&mut self, origin: Instant) -> String {
        self.collect()
            .iter()
            .map(|(t, e)| format!("\n  {:+9.1} ms  {e:?}", ms(origin, *t)))
            .collect()
    }
}

/// One of the N − 1 holders the fault must not touch: it asks for a
/// permit every [`PERMIT_EVERY`] until stopped.
struct Untouched {
    lock: Arc<Lock>,
    rec: Recorder,
    stop: Sender<()>,
    asking: JoinHandle<(usize, Vec<String>)>,
    _client: Client,
}

impl Untouched {
    fn start(client: Client, name: &str) -> Untouched {
        let lock = Arc::new(
            client
                .semaphore(name, LIMIT)
                .expect("semaphore")
                .acquire(EVENT)
                .expect("an untouched holder acquires"),
        );
        let rec = Recorder::on(&lock);
        let (stop, stopped) = mpsc::channel::<()>();
        let l = lock.clone();
        let asking = thread::spawn(move || {
            let (mut granted, mut refused) = (0, Vec::new());
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(PERMIT_EVERY) {
                match l.permit() {
                    Ok(p) => {
                        granted += 1;
                        p.end();
                    }
                    Err(e) => refused.push(format!("{e} at {:?}", system_now())),
                }
            }
            (granted, refused)
        });
        Untouched {
            lock,
            rec,
            stop,
            asking,
            _client: client,
        }
    }
}

/// The N + 1st contender: acquires in a thread of its own, takes one
/// permit at once, and holds the slot until [`Contender::release`].
struct Contender {
    /// The slot won, its token, when the acquire returned and when its
    /// first permit was granted.
    acquired: Receiver<Result<(u32, Token, Instant, Instant), Error>>,
    release: Sender<()>,
    thread: JoinHandle<()>,
}

impl Contender {
    fn start(client: Client, name: &str) -> Contender {
        let sem = client.semaphore(name, LIMIT).expect("semaphore");
        let (tx, acquired) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let thread = thread::spawn(move || match sem.acquire(EVENT) {
            Ok(lock) => {
                let at = system_now();
                let permit = lock.permit().expect("a fresh holder's permit");
                let first = system_now();
                drop(permit);
                let _ = tx.send(Ok((lock.slot().unwrap(), lock.token().unwrap(), at, first)));
                let _ = released.recv();
                let _ = lock.release();
                drop(client);
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
        Contender {
            acquired,
            release,
            thread,
        }
    }

    fn release(self) {
        drop(self.release);
        self.thread.join().expect("contender thread");
    }
}

/// Case (a) with `Mode::Blackhole` and no permit in flight, case (b) with
/// `Mode::DropReplies` and one.
pub fn slot_holder_cut_off(engine: &Engine, case: &str, mode: Mode, in_flight: bool) {
    let runs = dlock_testkit::etcd::fault_runs();
    let results: Vec<Run> = (0..runs)
        .map(|_| one_run(engine, mode, in_flight))
        .collect();
    let drains = faults::each(&results, |r| r.drain);
    let lead = faults::each(&results, |r| r.lead)
        .into_iter()
        .min_by(f64::total_cmp)
        .map_or("-".into(), |l| format!("{l:.0}"));
    let others = faults::each(&results, |r| r.other);
    let other = if in_flight {
        "work end->contender"
    } else {
        "cut->fence"
    };
    println!(
        "FAULT|{}semaphore {case}|{runs}|{}|{}/{runs}|{lead}|{other} {}",
        engine.label,
        faults::spread(drains.clone()),
        drains.len(),
        faults::spread(others)
    );
    faults::assert_unbroken(case, &results);
}

fn one_run(engine: &Engine, mode: Mode, in_flight: bool) -> Run {
    let name = dlock_testkit::fresh("dlock-fault/sem");
    let (client, proxies) = (engine.cut_off)();
    let lock = client
        .semaphore(&name, LIMIT)
        .expect("semaphore")
        .acquire(EVENT)
        .expect("the cut-off holder acquires");
    let mut rec = Recorder::on(&lock);
    let (slot, t1) = (lock.slot().unwrap(), lock.token().unwrap());
    let mut untouched: Vec<Untouched> = (1..LIMIT)
        .map(|_| Untouched::start((engine.calm)(), &name))
        .collect();
    let contender = Contender::start((engine.direct)(), &name);
    (engine.queued)(&name);
    thread::sleep(random_phase());
    let permit = in_flight.then(|| lock.permit_owned().expect("holding"));
    let deadline = lock.deadline().expect("holding");
    let cut = system_now();
    for p in &proxies {
        p.set(mode);
    }
    let mut r = Run::default();
    let fence = rec.wait(
        EVENT,
        |e| matches!(e, Ev::Fence(t, n) if *t == t1 && *n == u64::from(in_flight)),
    );
    r.drain = rec
        .collect()
        .iter()
        .find(|(t, e)| *t >= cut && matches!(e, Ev::Change(c) if c.to == State::Draining))
        .map(|(t, _)| ms(cut, *t));
    let mut ended = None;
    if let Some(p) = permit {
        thread::sleep(WORK_AFTER_FENCE);
        let early = contender.acquired.try_recv().ok();
        r.check(
            early.is_none(),
            format!("the contender acquired while the old holder's work ran: {early:?}"),
        );
        r.check(!p.valid(), "a fenced permit still valid");
        ended = Some(system_now());
        p.end();
    }
    let won = contender.acquired.recv_timeout(EVENT);
    for u in &untouched {
        let _ = u.stop.send(());
    }
    match (fence, &won) {
        (Some(f), Ok(Ok((s2, t2, tc, first)))) => {
            r.lead = Some(ms(f, *tc));
            r.other = Some(match ended {
                Some(e) => ms(e, *tc),
                None => ms(cut, f),
            });
            r.check(
                *tc > f,
                format!("on_fence did not lead the contender: {:?} ms", r.lead),
            );
            r.check(
                *s2 == slot,
                format!("the contender won slot {s2}, the freed one is {slot}"),
            );
            r.check(*t2 > t1, format!("slot {slot}: token {t2} after {t1}"));
            if let Some(e) = ended {
                r.check(
                    *tc >= e,
                    format!("acquired {:.1} ms before the last permit ended", ms(*tc, e)),
                );
                r.check(*first >= e, "the slot's permit intervals overlap");
            }
        }
        _ => r.check(false, format!("fence {fence:?}, contender {won:?}")),
    }
    r.drained_then_fenced_on_time(fence, deadline, SLACK);
    for (i, u) in untouched.drain(..).enumerate() {
        let Untouched {
            lock: l,
            mut rec,
            asking,
            ..
        } = u;
        let (granted, refused) = asking.join().expect("permit thread");
        let seen = rec.story(cut);
        r.check(
            seen.is_empty(),
            format!("untouched holder {i} (slot {:?}) saw:{seen}", l.slot()),
        );
        r.check(
            refused.is_empty(),
            format!("untouched holder {i} refused: {refused:?}"),
        );
        r.check(
            granted >= 10,
            format!("untouched holder {i}: {granted} permits only"),
        );
        r.check(
            l.state() == State::Holding,
            format!("untouched holder {i}: {:?}", l.state()),
        );
        let _ = l.release();
    }
    if mode == Mode::DropReplies && engine.reset_after_lost {
        for p in &proxies {
            p.reset();
        }
    }
    for p in &proxies {
        p.set(Mode::Pass);
    }
    // Healed, the fenced holder waits for its own slot, behind the contender.
    let t2 = match won {
        Ok(Ok((_, t2, ..))) => t2,
        _ => t1,
    };
    contender.release();
    let again = rec.wait(EVENT, |e| matches!(e, Ev::Acquired(t) if *t > t2));
    r.check(
        again.is_some(),
        format!("no reacquisition of slot {slot} above {t2}"),
    );
    r.check(
        lock.slot() == Some(slot),
        format!("reacquired slot {:?}, not {slot}", lock.slot()),
    );
    if !r.broken.is_empty() {
        r.broken
            .push(format!("events (ms from the cut):{}", rec.story(cut)));
    }
    let _ = lock.release();
    drop(client);
    r
}
