//! The one Prometheus text renderer (exposition format 0.0.4, which
//! OpenMetrics parsers read as well) and the families every face renders:
//! the names, types and labels of docs/metrics.md are decided here.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::family::{DEFAULT_LOCK_SERIES, Family, HistogramSnapshot, Kind, Value};
use super::{FENCE_REASONS, OTHER, OUTCOMES, REFUSALS, STATES, Snapshot};
use crate::machine::State;

fn family(
    name: &'static str,
    help: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
) -> Family {
    Family {
        name,
        help,
        kind,
        labels,
        series: Vec::new(),
    }
}

fn number(f: &mut Family, labels: Vec<String>, v: f64) {
    f.series.push((labels, Value::Number(v)));
}

/// A lock's per-name figures, merged over sessions (and over the locks
/// folded into [`OTHER`]).
#[derive(Default)]
struct PerLock {
    held: u64,
    states: [u64; 7],
    token: u64,
    /// Some: an election's candidate handles, how many lead.
    leading: Option<u64>,
}

pub(super) fn families(snap: &Snapshot, max_locks: usize) -> Vec<Family> {
    let mut by_name: BTreeMap<&str, PerLock> = BTreeMap::new();
    let (mut acq, mut drains, mut resumes, mut in_flight, mut locks) = (0, 0, 0, 0, 0u64);
    let mut fences = [0u64; 3];
    let mut refused = [0u64; 4];
    let mut keepalives = [0u64; 3];
    let mut slack: Option<f64> = None;
    let mut rtt: Option<HistogramSnapshot> = None;
    let mut wait: Vec<Option<HistogramSnapshot>> = vec![None; OUTCOMES.len()];
    let mut lateness: Option<HistogramSnapshot> = None;
    let mut hold: Option<HistogramSnapshot> = None;
    // Per semaphore of a handle: (its limit, slots held).
    let mut semaphores: BTreeMap<&str, (u32, u64)> = BTreeMap::new();
    // Per read/write lock of a handle: (readers, writers) held.
    let mut rwlocks: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    let merge = |into: &mut Option<HistogramSnapshot>, h: &HistogramSnapshot| match into {
        Some(a) => a.add(h),
        None => *into = Some(h.clone()),
    };
    // The sessions gone count in the counters and histograms, not in the
    // gauges: a client's counters never go down (issue 32).
    for (i, s) in snap.sessions.iter().chain(&snap.ended).enumerate() {
        if i < snap.sessions.len() {
            locks += s.locks.len() as u64;
        }
        acq += s.gone.acquisitions;
        drains += s.gone.drains;
        resumes += s.gone.resumes;
        for (a, b) in fences.iter_mut().zip(s.gone.fences) {
            *a += b;
        }
        for (a, b) in refused.iter_mut().zip(s.gone.refused) {
            *a += b;
        }
        for (a, b) in keepalives.iter_mut().zip(s.keepalives) {
            *a += b;
        }
        merge(&mut rtt, &s.keepalive_rtt);
        for (w, h) in wait.iter_mut().zip(&s.acquire_wait) {
            merge(w, h);
        }
        merge(&mut lateness, &s.fence_lateness);
        merge(&mut hold, &s.hold);
        for l in &s.locks {
            acq += l.acquisitions;
            drains += l.drains;
            resumes += l.resumes;
            in_flight += l.in_flight;
            for (a, b) in fences.iter_mut().zip(l.fences) {
                *a += b;
            }
            for (a, b) in refused.iter_mut().zip(l.refused) {
                *a += b;
            }
            if let Some(d) = l.slack {
                let d = d.as_secs_f64();
                slack = Some(slack.map_or(d, |s| s.min(d)));
            }
            let p = by_name.entry(&l.name).or_default();
            let held = matches!(l.state, State::Holding | State::Draining);
            p.held += u64::from(held);
            if let Some(i) = STATES.iter().position(|(s, _)| *s == l.state) {
                p.states[i] += 1;
            }
            p.token = p.token.max(l.token.map_or(0, |t| t.0));
            if l.election {
                *p.leading.get_or_insert(0) += u64::from(held);
            }
            if let Some((name, limit)) = &l.semaphore {
                semaphores.entry(name).or_insert((*limit, 0)).1 += u64::from(held);
            }
            if let Some(mode) = l.mode {
                let rw = rwlocks.entry(&l.name).or_default();
                match mode {
                    crate::Mode::Read => rw.0 += u64::from(held),
                    crate::Mode::Write => rw.1 += u64::from(held),
                }
            }
        }
    }
    // Capped: the first `max_locks` names keep their series.
    let mut shown: Vec<(String, PerLock)> = Vec::new();
    let mut other: Option<PerLock> = None;
    for (i, (name, p)) in by_name.into_iter().enumerate() {
        if i < max_locks {
            shown.push((name.to_owned(), p));
        } else {
            let o = other.get_or_insert_with(PerLock::default);
            o.held += p.held;
            for (a, b) in o.states.iter_mut().zip(p.states) {
                *a += b;
            }
            o.token = o.token.max(p.token);
            if let Some(n) = p.leading {
                *o.leading.get_or_insert(0) += n;
            }
        }
    }
    if let Some(o) = other {
        shown.push((OTHER.to_owned(), o));
    }

    let mut out = Vec::new();
    let mut f = family(
        "dlock_lock_held",
        "Handles of the lock holding it (holding or draining).",
        Kind::Gauge,
        &["lock"],
    );
    for (n, p) in &shown {
        number(&mut f, vec![n.clone()], p.held as f64);
    }
    out.push(f);
    let mut f = family(
        "dlock_lock_state",
        "Handles of the lock in each state.",
        Kind::Gauge,
        &["lock", "state"],
    );
    for (n, p) in &shown {
        for ((_, s), c) in STATES.iter().zip(p.states) {
            number(&mut f, vec![n.clone(), (*s).to_owned()], c as f64);
        }
    }
    out.push(f);
    let mut f = family(
        "dlock_lock_token",
        "Fencing token held (0: none).",
        Kind::Gauge,
        &["lock"],
    );
    for (n, p) in &shown {
        number(&mut f, vec![n.clone()], p.token as f64);
    }
    out.push(f);
    for (name, help, v) in [
        (
            "dlock_acquisitions_total",
            "Acquisitions, first and after fences.",
            acq,
        ),
        (
            "dlock_drains_total",
            "Drains begun (a failed keepalive while holding).",
            drains,
        ),
        (
            "dlock_resumes_total",
            "Drains ended by a confirmed keepalive.",
            resumes,
        ),
    ] {
        let mut f = family(name, help, Kind::Counter, &[]);
        number(&mut f, vec![], v as f64);
        out.push(f);
    }
    let mut f = family(
        "dlock_fences_total",
        "Fences (the lock must be assumed lost), by reason.",
        Kind::Counter,
        &["reason"],
    );
    for (r, v) in FENCE_REASONS.iter().zip(fences) {
        number(&mut f, vec![(*r).to_owned()], v as f64);
    }
    out.push(f);
    let mut f = family(
        "dlock_permits_in_flight",
        "Permits granted and not yet ended.",
        Kind::Gauge,
        &[],
    );
    number(&mut f, vec![], in_flight as f64);
    out.push(f);
    let mut f = family(
        "dlock_permits_refused_total",
        "Permits refused, by reason.",
        Kind::Counter,
        &["reason"],
    );
    for (r, v) in REFUSALS.iter().zip(refused) {
        number(&mut f, vec![(*r).to_owned()], v as f64);
    }
    out.push(f);
    let mut f = family(
        "dlock_deadline_slack_seconds",
        "Smallest deadline - now over the locks held (absent when none is).",
        Kind::Gauge,
        &[],
    );
    if let Some(s) = slack {
        number(&mut f, vec![], s);
    }
    out.push(f);
    let mut f = family(
        "dlock_keepalives_total",
        "Keepalive answers, by result.",
        Kind::Counter,
        &["result"],
    );
    for (r, v) in ["ok", "failed", "lease_lost"].iter().zip(keepalives) {
        number(&mut f, vec![(*r).to_owned()], v as f64);
    }
    out.push(f);
    let empty = |b| HistogramSnapshot {
        bounds: b,
        cumulative: vec![0; b.len() + 1],
        count: 0,
        sum: 0.0,
    };
    let hist = |name, help, h: Option<HistogramSnapshot>, bounds| {
        let mut f = family(name, help, Kind::Histogram, &[]);
        f.series
            .push((vec![], Value::Histogram(h.unwrap_or_else(|| empty(bounds)))));
        f
    };
    out.push(hist(
        "dlock_keepalive_rtt_seconds",
        "Round trip of confirmed keepalives.",
        rtt,
        super::LATENCY_BOUNDS,
    ));
    let mut f = family(
        "dlock_acquire_wait_seconds",
        "Time an acquire call waited, by outcome.",
        Kind::Histogram,
        &["outcome"],
    );
    for (o, h) in OUTCOMES.iter().zip(wait) {
        let h = h.unwrap_or_else(|| empty(super::LATENCY_BOUNDS));
        f.series.push((vec![(*o).to_owned()], Value::Histogram(h)));
    }
    out.push(f);
    out.push(hist(
        "dlock_fence_lateness_seconds",
        "on_fence start - deadline (0 for a fence before the deadline).",
        lateness,
        super::LATENCY_BOUNDS,
    ));
    out.push(hist(
        "dlock_hold_duration_seconds",
        "Holds, from acquired until fenced or released.",
        hold,
        super::HOLD_BOUNDS,
    ));
    let mut f = family(
        "dlock_session_locks",
        "Locks of the client's sessions (handles not yet done).",
        Kind::Gauge,
        &[],
    );
    number(&mut f, vec![], locks as f64);
    out.push(f);
    let mut f = family(
        "dlock_sessions",
        "Sessions of the client.",
        Kind::Gauge,
        &[],
    );
    number(&mut f, vec![], snap.sessions.len() as f64);
    out.push(f);
    let mut f = family(
        "dlock_election_leader",
        "1 while this client's candidate leads the election (holding or draining), else 0.",
        Kind::Gauge,
        &["election"],
    );
    for (n, p) in &shown {
        if let Some(leading) = p.leading {
            number(&mut f, vec![n.clone()], leading as f64);
        }
    }
    out.push(f);
    // Semaphores: their series capped as the locks' are (the first
    // `max_locks` names; no `_other`: limits do not add up).
    let semaphores: Vec<_> = semaphores.into_iter().take(max_locks).collect();
    let mut f = family(
        "dlock_semaphore_limit",
        "Slots of each semaphore this client has a handle of (its recorded limit).",
        Kind::Gauge,
        &["semaphore"],
    );
    for (n, (limit, _)) in &semaphores {
        number(&mut f, vec![(*n).to_owned()], f64::from(*limit));
    }
    out.push(f);
    let mut f = family(
        "dlock_semaphore_held",
        "Slots of the semaphore this client holds (holding or draining).",
        Kind::Gauge,
        &["semaphore"],
    );
    for (n, (_, held)) in &semaphores {
        number(&mut f, vec![(*n).to_owned()], *held as f64);
    }
    out.push(f);
    // Read/write locks, capped as the semaphores are; both modes of each.
    let mut f = family(
        "dlock_rwlock_held",
        "Holders of each read/write lock this client holds (holding or draining), by mode: read or write (a downgraded writer counts as read).",
        Kind::Gauge,
        &["lock", "mode"],
    );
    for (n, (read, write)) in rwlocks.into_iter().take(max_locks) {
        number(&mut f, vec![n.to_owned(), "read".into()], read as f64);
        number(&mut f, vec![n.to_owned(), "write".into()], write as f64);
    }
    out.push(f);
    out
}

/// One lock as the engine has it (`dlock show NAME --metrics`), in the
/// names and labels of [`Snapshot::families`]: whether a key holds it, the holder's
/// token and, where the engine lists them, the keys waiting behind it. An
/// engine that keeps no row for a waiter (PostgreSQL) passes `None`: no
/// waiter count it does not know.
pub fn engine_view(lock: &str, token: Option<u64>, waiters: Option<usize>) -> Vec<Family> {
    let one = |name, help, v: f64| {
        let mut f = family(name, help, Kind::Gauge, &["lock"]);
        number(&mut f, vec![lock.to_owned()], v);
        f
    };
    let mut out = vec![
        one(
            "dlock_lock_held",
            "Whether a key holds the lock (the engine's view).",
            f64::from(u8::from(token.is_some())),
        ),
        one(
            "dlock_lock_token",
            "Fencing token of the holder (0: none).",
            token.unwrap_or(0) as f64,
        ),
    ];
    if let Some(n) = waiters {
        out.push(one(
            "dlock_lock_waiters",
            "Keys waiting behind the holder (the engine's view).",
            n as f64,
        ));
    }
    out
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn float(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

fn labels(names: &[&str], values: &[String], extra: Option<(&str, &str)>) -> String {
    let mut parts: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
        .collect();
    if let Some((n, v)) = extra {
        parts.push(format!("{n}=\"{v}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// Renders `families` in the Prometheus text exposition format.
pub fn render(families: &[Family]) -> String {
    let mut out = String::new();
    for f in families {
        let kind = f.kind.as_str();
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {kind}", f.name);
        for (values, v) in &f.series {
            match v {
                Value::Number(n) => {
                    let _ = writeln!(
                        out,
                        "{}{} {}",
                        f.name,
                        labels(f.labels, values, None),
                        float(*n)
                    );
                }
                Value::Histogram(h) => {
                    let bounds = h.bounds.iter().copied().chain([f64::INFINITY]);
                    for (b, c) in bounds.zip(&h.cumulative) {
                        // `1.0`, not `1`: the canonical `le` of OpenMetrics
                        // and of the Prometheus libraries.
                        let le = if b.is_finite() {
                            format!("{b:?}")
                        } else {
                            float(b)
                        };
                        let l = labels(f.labels, values, Some(("le", &le)));
                        let _ = writeln!(out, "{}_bucket{l} {c}", f.name);
                    }
                    let l = labels(f.labels, values, None);
                    let _ = writeln!(out, "{}_sum{l} {}", f.name, float(h.sum));
                    let _ = writeln!(out, "{}_count{l} {}", f.name, h.count);
                }
            }
        }
    }
    out
}

impl Snapshot {
    /// The families, per-lock series capped at [`DEFAULT_LOCK_SERIES`].
    pub fn families(&self) -> Vec<Family> {
        self.families_capped(DEFAULT_LOCK_SERIES)
    }

    /// The families with at most `max_locks` per-lock series (the rest
    /// folded into `lock="_other"`).
    pub fn families_capped(&self, max_locks: usize) -> Vec<Family> {
        families(self, max_locks)
    }

    /// The Prometheus text exposition format (0.0.4), per-lock series
    /// capped at [`DEFAULT_LOCK_SERIES`].
    pub fn to_text(&self) -> String {
        render(&self.families())
    }
}
