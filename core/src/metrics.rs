//! Metrics (issue 22): counters, gauges and small fixed-bucket histograms
//! kept with atomics on paths that already exist (the driver's transitions,
//! keepalive replies, acquire answers, fence dispatch; a refused permit),
//! and [`Snapshot`], read at scrape time by [`crate::Client::snapshot`].
//! A granted permit touches nothing here. Every face renders the same
//! [`Family`] list: the text format through [`Snapshot::to_text`], the
//! Prometheus libraries from [`Snapshot::families`].
//!
//! Layout: the figures and their reading stand here; the families' types
//! (`family`) are a leaf that the renderer (`prometheus`, which also holds
//! [`Snapshot::families`]) and the collector read, so no file here reads
//! one that reads it back.

#[cfg(feature = "prometheus")]
mod collector;
mod family;
pub mod prometheus;

#[cfg(feature = "prometheus")]
pub use collector::Collector;
pub use family::{DEFAULT_LOCK_SERIES, Family, HistogramSnapshot, Kind, Value};

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::gate::{Counters, Gate};
use crate::machine::{State, Token};

/// The `lock` label of the folded series.
pub const OTHER: &str = "_other";

/// Bounds (seconds) of the round-trip, acquire-wait and lateness
/// histograms.
pub const LATENCY_BOUNDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Bounds (seconds) of the hold-duration histogram.
pub const HOLD_BOUNDS: &[f64] = &[1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0];
const MAX_BUCKETS: usize = 16;

/// A fixed-bucket histogram: one `fetch_add` per bucket hit, the count and
/// the sum in nanoseconds.
pub(crate) struct Histogram {
    bounds: &'static [f64],
    buckets: [AtomicU64; MAX_BUCKETS],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    pub(crate) const fn new(bounds: &'static [f64]) -> Histogram {
        assert!(bounds.len() < MAX_BUCKETS);
        Histogram {
            bounds,
            buckets: [const { AtomicU64::new(0) }; MAX_BUCKETS],
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub(crate) fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self
            .bounds
            .iter()
            .position(|b| s <= *b)
            .unwrap_or(self.bounds.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    fn read(&self) -> HistogramSnapshot {
        let mut cumulative = Vec::with_capacity(self.bounds.len() + 1);
        let mut total = 0;
        for b in &self.buckets[..=self.bounds.len()] {
            total += b.load(Relaxed);
            cumulative.push(total);
        }
        HistogramSnapshot {
            bounds: self.bounds,
            cumulative,
            count: total,
            sum: self.sum_ns.load(Relaxed) as f64 / 1e9,
        }
    }
}

/// How an acquire call ended, the `outcome` label of
/// `dlock_acquire_wait_seconds`.
pub const OUTCOMES: [&str; 4] = ["acquired", "timeout", "cancelled", "error"];

/// Refusal reasons, the `reason` label of `dlock_permits_refused_total`
/// (in [`Refused`](crate::Refused)'s order).
pub const REFUSALS: [&str; 4] = ["draining", "fenced", "released", "not_held"];

/// Per-session histograms and keepalive results, in the session's [`Shared`].
pub(crate) struct SessionMetrics {
    pub(crate) keepalive_rtt: Histogram,
    pub(crate) keepalives_ok: AtomicU64,
    pub(crate) keepalives_failed: AtomicU64,
    pub(crate) keepalives_lease_lost: AtomicU64,
    pub(crate) acquire_wait: [Histogram; 4],
    pub(crate) fence_lateness: Histogram,
    pub(crate) hold: Histogram,
    /// The session's locks, for the snapshot (a lock is added once, when
    /// its handle is made). The list holds each gate, counters and all: a
    /// lock that only the list still holds has its counts folded into
    /// `gone` and is dropped from the list, so the client's counters never
    /// go down (issue 32).
    pub(crate) locks: Mutex<Vec<LockEntry>>,
    /// The counts of the session's locks already gone (always locked after
    /// `locks`).
    gone: Mutex<Counts>,
}

/// What a session shares with its handles, beside the command channel:
/// the figures of `Session::stats` and its metrics. Kept here, where the
/// registry of sessions watches it, so that the driver and the client read
/// the metrics and the metrics read neither.
#[derive(Default)]
pub(crate) struct Shared {
    /// The current lease, 0 for none.
    pub(crate) lease: AtomicI64,
    /// Last confirmed keepalive's round trip in ns; 0: none yet.
    pub(crate) last_rtt_ns: AtomicU64,
    /// Keepalives sent.
    pub(crate) keepalives: AtomicU64,
    /// Locks of the session (handles not yet finished).
    pub(crate) locks: AtomicU64,
    /// Histograms and keepalive results for `Client::snapshot`.
    pub(crate) metrics: Arc<SessionMetrics>,
}

/// A lock of a session's list: its name and its gate (with its counters),
/// kept until the list is the gate's last holder.
pub(crate) type LockEntry = (Arc<str>, Arc<Gate>);

impl Default for SessionMetrics {
    fn default() -> SessionMetrics {
        SessionMetrics {
            keepalive_rtt: Histogram::new(LATENCY_BOUNDS),
            keepalives_ok: AtomicU64::new(0),
            keepalives_failed: AtomicU64::new(0),
            keepalives_lease_lost: AtomicU64::new(0),
            acquire_wait: [const { Histogram::new(LATENCY_BOUNDS) }; 4],
            fence_lateness: Histogram::new(LATENCY_BOUNDS),
            hold: Histogram::new(HOLD_BOUNDS),
            locks: Mutex::new(Vec::new()),
            gone: Mutex::new(Counts::default()),
        }
    }
}

impl SessionMetrics {
    /// An acquire call answered `r` after `waited`.
    pub(crate) fn acquire_answered(&self, r: &Result<Token, crate::Error>, waited: Duration) {
        let i = match r {
            Ok(_) => 0,
            Err(crate::Error::Timeout | crate::Error::WouldBlock) => 1,
            Err(crate::Error::Released) => 2,
            Err(_) => 3,
        };
        self.acquire_wait[i].observe(waited);
    }
}

/// The sessions of every client, for [`crate::Client::snapshot`]: weak,
/// so nothing here keeps a session alive; its metrics are held until the
/// session is gone and they are folded into its client's `ended`.
struct Registry {
    sessions: Vec<(u64, Weak<Shared>, Arc<SessionMetrics>)>,
    /// By client id: the sessions of the client already gone, summed; kept
    /// while the client has a live session (its default one lives as long
    /// as the client).
    ended: Vec<(u64, SessionSnapshot)>,
    /// The clients already gone, summed, for [`process_snapshot`].
    clients_ended: Option<SessionSnapshot>,
}

static SESSIONS: Mutex<Registry> = Mutex::new(Registry {
    sessions: Vec::new(),
    ended: Vec::new(),
    clients_ended: None,
});

fn add_into(into: &mut Option<SessionSnapshot>, s: &SessionSnapshot) {
    match into {
        Some(e) => e.add(s),
        None => *into = Some(s.clone()),
    }
}

impl Registry {
    /// Folds the sessions that are gone into their client's `ended` (and a
    /// client gone into `clients_ended`), and returns the live sessions of
    /// the clients `want`ed.
    fn sweep(&mut self, want: impl Fn(u64) -> bool) -> Vec<Arc<Shared>> {
        let mut live = Vec::new();
        let mut gone = Vec::new();
        self.sessions.retain(|(c, s, m)| match s.upgrade() {
            Some(s) => {
                if want(*c) {
                    live.push(s);
                }
                true
            }
            None => {
                gone.push((*c, read_session(m).retire()));
                false
            }
        });
        for (c, s) in gone {
            match self.ended.iter_mut().find(|(e, _)| *e == c) {
                Some((_, e)) => e.add(&s),
                None => self.ended.push((c, s)),
            }
        }
        let sessions = &self.sessions;
        let clients_ended = &mut self.clients_ended;
        self.ended.retain(|(c, e)| {
            let live = sessions.iter().any(|(s, _, _)| s == c);
            if !live {
                add_into(clients_ended, e);
            }
            live
        });
        live
    }
}

pub(crate) fn register(client: u64, shared: &Arc<Shared>) {
    let mut all = crate::sync::lock(&SESSIONS);
    all.sweep(|_| false);
    all.sessions
        .push((client, Arc::downgrade(shared), shared.metrics.clone()));
}

/// Counts of lock handles already gone (released, closed, dropped), summed:
/// they stay in the client's counters, which never go down for the
/// client's lifetime (Prometheus reads a drop as a reset).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Counts {
    /// Acquisitions, first and after fences.
    pub acquisitions: u64,
    /// Drains begun.
    pub drains: u64,
    /// Drains ended by a confirmed keepalive.
    pub resumes: u64,
    /// Fences by [`FENCE_REASONS`].
    pub fences: [u64; 3],
    /// Permits refused, by [`REFUSALS`].
    pub refused: [u64; 4],
}

impl Counts {
    fn read(c: &Counters) -> Counts {
        Counts {
            acquisitions: c.acquisitions.load(Relaxed),
            drains: c.drains.load(Relaxed),
            resumes: c.resumes.load(Relaxed),
            fences: [
                c.fences_deadline.load(Relaxed),
                c.fences_lease_lost.load(Relaxed),
                c.fences_lock_lost.load(Relaxed),
            ],
            refused: std::array::from_fn(|i| c.refused[i].load(Relaxed)),
        }
    }

    fn add(&mut self, o: &Counts) {
        self.acquisitions += o.acquisitions;
        self.drains += o.drains;
        self.resumes += o.resumes;
        for (a, b) in self.fences.iter_mut().zip(o.fences) {
            *a += b;
        }
        for (a, b) in self.refused.iter_mut().zip(o.refused) {
            *a += b;
        }
    }
}

/// One lock as read at scrape time.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LockSnapshot {
    /// The lock's name.
    pub name: String,
    /// Its state.
    pub state: State,
    /// The token held, while holding or draining.
    pub token: Option<Token>,
    /// Deadline − now, while holding or draining.
    pub slack: Option<Duration>,
    /// Permits in flight.
    pub in_flight: u64,
    /// Acquisitions, first and after fences.
    pub acquisitions: u64,
    /// Drains begun.
    pub drains: u64,
    /// Drains ended by a confirmed keepalive.
    pub resumes: u64,
    /// Fences by reason: deadline, lease_lost, lock_lost.
    pub fences: [u64; 3],
    /// Permits refused, by [`REFUSALS`].
    pub refused: [u64; 4],
    /// The handle is an election's candidate: holding or draining is
    /// leading.
    pub election: bool,
    /// The handle is a slot of a semaphore: its name and limit (holding or
    /// draining is holding one of its slots).
    pub semaphore: Option<(String, u32)>,
    /// The handle is a read/write lock's reader or writer: its mode now (a
    /// downgraded writer reads).
    pub mode: Option<crate::Mode>,
}

/// One session as read at scrape time.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SessionSnapshot {
    /// Its locks, in name order.
    pub locks: Vec<LockSnapshot>,
    /// The counts of its locks already gone.
    pub gone: Counts,
    /// Keepalives confirmed, failed, answered "lease not found".
    pub keepalives: [u64; 3],
    /// Keepalive round trips.
    pub keepalive_rtt: HistogramSnapshot,
    /// Acquire waits by [`OUTCOMES`].
    pub acquire_wait: Vec<HistogramSnapshot>,
    /// `on_fence` start − deadline (0 for a fence before the deadline).
    pub fence_lateness: HistogramSnapshot,
    /// Hold durations (acquired until fenced or released).
    pub hold: HistogramSnapshot,
}

/// Every session and lock of a client, from [`crate::Client::snapshot`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The client's sessions.
    pub sessions: Vec<SessionSnapshot>,
    /// The client's sessions already gone (closed, dropped), summed: their
    /// counters and histograms, no locks (their locks' counts are in
    /// [`SessionSnapshot::gone`]).
    pub ended: Option<SessionSnapshot>,
}

impl SessionSnapshot {
    /// The session once gone: its locks' counts moved into `gone`.
    fn retire(mut self) -> SessionSnapshot {
        for l in std::mem::take(&mut self.locks) {
            self.gone.add(&Counts {
                acquisitions: l.acquisitions,
                drains: l.drains,
                resumes: l.resumes,
                fences: l.fences,
                refused: l.refused,
            });
        }
        self
    }

    /// Adds a retired session's counts and histograms.
    fn add(&mut self, o: &SessionSnapshot) {
        self.gone.add(&o.gone);
        for (a, b) in self.keepalives.iter_mut().zip(o.keepalives) {
            *a += b;
        }
        self.keepalive_rtt.add(&o.keepalive_rtt);
        for (a, b) in self.acquire_wait.iter_mut().zip(&o.acquire_wait) {
            a.add(b);
        }
        self.fence_lateness.add(&o.fence_lateness);
        self.hold.add(&o.hold);
    }
}

pub(crate) fn snapshot(client: u64) -> Snapshot {
    // Sessions gone are folded under the registry's lock, the live ones
    // held (so none can go) while they are read: nothing is counted twice
    // or missed.
    let (shared, ended) = {
        let mut all = crate::sync::lock(&SESSIONS);
        let live = all.sweep(|c| c == client);
        let ended = all
            .ended
            .iter()
            .find(|(c, _)| *c == client)
            .map(|(_, e)| e.clone());
        (live, ended)
    };
    Snapshot {
        sessions: shared.iter().map(|s| read_session(&s.metrics)).collect(),
        ended,
    }
}

/// Every client of the process at once, as one client (issue 32: several
/// clients in one process export one page): every live session of every
/// client, and the sessions and clients already gone in `ended`, so its
/// counters never go down for the life of the process. What the Python
/// and Node collectors export.
pub fn process_snapshot() -> Snapshot {
    let (shared, ended) = {
        let mut all = crate::sync::lock(&SESSIONS);
        let live = all.sweep(|_| true);
        let mut ended = all.clients_ended.clone();
        for (_, e) in &all.ended {
            add_into(&mut ended, e);
        }
        (live, ended)
    };
    Snapshot {
        sessions: shared.iter().map(|s| read_session(&s.metrics)).collect(),
        ended,
    }
}

/// Adds a lock of the session for the snapshot. Dead entries are dropped
/// whenever the list has doubled since the last sweep, so a session that
/// makes and drops locks without ever being scraped keeps a list (and the
/// ended gates it holds) proportional to its live locks.
pub(crate) fn add_lock(m: &SessionMetrics, name: Arc<str>, gate: &Arc<Gate>) {
    let mut locks = crate::sync::lock(&m.locks);
    if locks.len() >= 64 && locks.len().is_power_of_two() {
        sweep_locks(m, &mut locks);
    }
    locks.push((name, gate.clone()));
}

/// Folds the counts of the locks whose gate only the list still holds
/// (handle, permits and driver all done with it) into `m.gone` and drops
/// them from `locks`; returns the live ones. No one can take a gate from
/// the list's last reference: there is no `Weak` to one.
fn sweep_locks(m: &SessionMetrics, locks: &mut Vec<LockEntry>) -> Vec<LockEntry> {
    let mut gone = crate::sync::lock(&m.gone);
    let mut live = Vec::with_capacity(locks.len());
    locks.retain(|(n, g)| {
        if Arc::strong_count(g) > 1 {
            live.push((n.clone(), g.clone()));
            true
        } else {
            gone.add(&Counts::read(&g.counters));
            false
        }
    });
    live
}

fn read_session(m: &SessionMetrics) -> SessionSnapshot {
    // The live gates are held while read and the gone ones folded under
    // the list's lock: a lock dropped during a scrape is counted once.
    let (gates, gone) = {
        let mut locks = crate::sync::lock(&m.locks);
        let live = sweep_locks(m, &mut locks);
        (live, crate::sync::lock(&m.gone).clone())
    };
    let mut locks: Vec<LockSnapshot> = gates.iter().map(|(n, g)| read_lock(n, g)).collect();
    locks.sort_by(|a, b| a.name.cmp(&b.name));
    SessionSnapshot {
        locks,
        gone,
        keepalives: [
            m.keepalives_ok.load(Relaxed),
            m.keepalives_failed.load(Relaxed),
            m.keepalives_lease_lost.load(Relaxed),
        ],
        keepalive_rtt: m.keepalive_rtt.read(),
        acquire_wait: m.acquire_wait.iter().map(Histogram::read).collect(),
        fence_lateness: m.fence_lateness.read(),
        hold: m.hold.read(),
    }
}

fn read_lock(name: &str, g: &Gate) -> LockSnapshot {
    let s = g.read();
    let c = Counts::read(&g.counters);
    let holding = matches!(s.state, State::Holding | State::Draining);
    LockSnapshot {
        name: name.to_owned(),
        state: s.state,
        token: holding.then_some(s.token),
        slack: g.time_left(),
        in_flight: g.in_flight(),
        acquisitions: c.acquisitions,
        drains: c.drains,
        resumes: c.resumes,
        fences: c.fences,
        refused: c.refused,
        election: g.metrics.election.load(Relaxed),
        semaphore: match g.metrics.semaphore_limit.load(Relaxed) {
            0 => None,
            limit => Some((
                name.rsplit_once("/slot/")
                    .map_or(name, |(s, _)| s)
                    .to_owned(),
                limit,
            )),
        },
        mode: g.metrics.mode(),
    }
}

/// The `reason` labels of `dlock_fences_total`, in [`LockSnapshot::fences`]'s
/// order.
pub const FENCE_REASONS: [&str; 3] = ["deadline", "lease_lost", "lock_lost"];

/// The `state` labels of `dlock_lock_state`.
pub const STATES: [(State, &str); 7] = [
    (State::Idle, "idle"),
    (State::Acquiring, "acquiring"),
    (State::Holding, "holding"),
    (State::Draining, "draining"),
    (State::Fenced, "fenced"),
    (State::Reacquiring, "reacquiring"),
    (State::Released, "released"),
];
