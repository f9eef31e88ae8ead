//! What the fault tests share (core/tests/etcd_faults.rs,
//! postgres_faults.rs, sem_faults/, own_settings/, etcd_sessions.rs,
//! postgres.rs): times in milliseconds on dlock's clock, a random phase
//! of the keepalive cycle to cut at, and one run's figures and broken
//! rules, summed up over the runs of a case.

use std::time::Duration;

use std::sync::mpsc::{self, Receiver};

use dlock::clock::system_now;
use dlock::{Instant, Lock, State, StateChange, Token};

/// What a lock's callbacks reported.
#[derive(Clone, Copy, Debug)]
pub enum Ev {
    Change(StateChange),
    Fence(Token, u64),
    Acquired(Token),
}

/// A change to Draining.
pub fn draining(e: &Ev) -> bool {
    matches!(e, Ev::Change(c) if c.to == State::Draining)
}

/// A fence.
pub fn fenced(e: &Ev) -> bool {
    matches!(e, Ev::Fence(..))
}

/// `lock`'s state changes, fences and acquisitions from now on, each
/// stamped with dlock's clock when its callback ran.
pub fn record(lock: &Lock) -> Receiver<(Instant, Ev)> {
    let (tx, rx) = mpsc::channel();
    let t = tx.clone();
    lock.on_state_change(move |c| {
        let _ = t.send((system_now(), Ev::Change(c)));
    });
    let t = tx.clone();
    lock.on_fence(move |token, n| {
        let _ = t.send((system_now(), Ev::Fence(token, n)));
    });
    lock.on_acquired(move |token| {
        let _ = tx.send((system_now(), Ev::Acquired(token)));
    });
    rx
}

/// `b − a` in milliseconds, negative when `b` is earlier.
pub fn ms(a: Instant, b: Instant) -> f64 {
    (b.as_nanos() as f64 - a.as_nanos() as f64) / 1e6
}

/// `d` in milliseconds.
pub fn ms_of(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A pseudo-random point in the keepalive cycle ([`crate::INTERVAL`]), so
/// cuts do not always fall at the same phase.
pub fn random_phase() -> Duration {
    Duration::from_nanos(system_now().as_nanos() % crate::INTERVAL.as_nanos() as u64)
}

/// One run of a case: its figures (ms) and the rules it broke.
#[derive(Debug, Default)]
pub struct Run {
    /// Figures: cut→drain, the on_fence lead over the contender, and one
    /// case-specific duration.
    pub drain: Option<f64>,
    pub lead: Option<f64>,
    pub other: Option<f64>,
    /// Broken rules, with the evidence.
    pub broken: Vec<String>,
}

impl Run {
    /// Records `what` as broken unless `ok`.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.broken.push(what.into());
        }
    }

    /// The rules of every cut-off holder's run: its drain (`self.drain`,
    /// ms after the cut) began within a keepalive interval and timeout
    /// (plus `slack`) of the cut, and its fence, if any, came no earlier
    /// than its `deadline`.
    pub fn drained_then_fenced_on_time(
        &mut self,
        fence: Option<Instant>,
        deadline: Instant,
        slack: Duration,
    ) {
        let bound = crate::INTERVAL + crate::TIMEOUT + slack;
        self.check(
            self.drain.is_some_and(|d| d <= ms_of(bound)),
            format!("drain {:?} ms after the cut, bound {bound:?}", self.drain),
        );
        self.check(
            fence.is_none_or(|f| f >= deadline),
            format!("fenced before the deadline {deadline:?}: {fence:?}"),
        );
    }
}

/// `min/median/max` of `xs` in whole ms; `-` for none.
pub fn spread(mut xs: Vec<f64>) -> String {
    if xs.is_empty() {
        return "-".into();
    }
    xs.sort_by(f64::total_cmp);
    format!(
        "{:.0}/{:.0}/{:.0}",
        xs[0],
        xs[xs.len() / 2],
        xs[xs.len() - 1]
    )
}

/// One figure of every run that has it.
pub fn each(results: &[Run], figure: impl Fn(&Run) -> Option<f64>) -> Vec<f64> {
    results.iter().filter_map(figure).collect()
}

/// Fails `case` with every broken rule of every run (printed after its
/// `FAULT|` line, so a failing case still shows what it measured).
pub fn assert_unbroken(case: &str, results: &[Run]) {
    let broken: Vec<String> = results
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.broken.iter().map(move |b| format!("run {i}: {b}")))
        .collect();
    assert!(broken.is_empty(), "{case}: {}", broken.join("\n"));
}

/// Runs a case `n` times, prints its `FAULT|{prefix}{case}|…` line (the
/// figures table of scripts/test-etcd.sh and test-postgres.sh: runs,
/// drain spread, drained runs, the least on_fence lead, and the case's
/// `other` figure), then fails with every broken rule of every run.
pub fn repeat(prefix: &str, case: &str, n: usize, other: &str, run: impl FnMut(usize) -> Run) {
    let results: Vec<Run> = (0..n).map(run).collect();
    let drains = each(&results, |r| r.drain);
    let others = each(&results, |r| r.other);
    let lead = each(&results, |r| r.lead)
        .into_iter()
        .min_by(f64::total_cmp)
        .map_or("n/a (no fence)".into(), |l| format!("{l:.0}"));
    let other = if others.is_empty() {
        String::new()
    } else {
        format!("{other} {}", spread(others))
    };
    println!(
        "FAULT|{prefix}{case}|{n}|{}|{}/{n}|{lead}|{other}",
        spread(drains.clone()),
        drains.len()
    );
    assert_unbroken(case, &results);
}
