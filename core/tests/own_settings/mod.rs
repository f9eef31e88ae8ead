//! The rules and figures of `fault_session_own_settings` (issue 28), played
//! on etcd (etcd_faults.rs) and PostgreSQL (postgres_faults.rs): a session
//! with the fault settings (TTL 4 s, keepalive every 1 s, timeout 0.5 s,
//! margin 1 s) on a client whose own bound on a keepalive is shorter, cut
//! off right after a confirmed keepalive.
//!
//! The last confirmed keepalive was sent at `deadline − (TTL − margin)`;
//! the next goes out an interval after that send, so the session drains no
//! earlier than its keepalive timeout after it (a timer never fires early:
//! only 1 ms of rounding below the rule) and within the slack, and fences
//! at its deadline, within the slack.

use std::time::Duration;

use dlock::Instant;
use dlock_testkit::faults::ms;
use dlock_testkit::{INTERVAL, MARGIN, TIMEOUT};

/// The session's TTL.
pub const TTL: Duration = Duration::from_secs(4);

/// What one run measured: ms from the cut, and the rules it broke.
pub struct Judged {
    pub drain: Option<f64>,
    pub fence: Option<f64>,
    pub broken: Vec<String>,
}

/// Prints the run's figures (`OWN|engine|run n|…`) and judges them.
pub fn judge(
    engine: &str,
    run: usize,
    slack: Duration,
    cut: Instant,
    deadline: Instant,
    drain: Option<Instant>,
    fence: Option<Instant>,
) -> Judged {
    let due = deadline - (TTL - MARGIN) + INTERVAL + TIMEOUT;
    let from = |x: Option<Instant>, origin: Instant| {
        x.map_or("-".into(), |x| format!("{:.0}", ms(origin, x)))
    };
    println!(
        "OWN|{engine}|run {run}|drain {} ms after the cut ({} ms after send + interval + 0.5 s)|fence {} ms after the cut ({} ms after the session's deadline)",
        from(drain, cut),
        from(drain, due),
        from(fence, cut),
        from(fence, deadline)
    );
    let slack_ms = slack.as_secs_f64() * 1e3;
    let mut broken = Vec::new();
    let early = Duration::from_millis(1);
    if !drain.is_some_and(|d| d >= due - early && d <= due + slack) {
        broken.push(format!(
            "drain {:?} ms from the keepalive timeout's instant (send + interval + 0.5 s), want 0..{slack_ms} ms",
            drain.map(|d| ms(due, d)),
        ));
    }
    if !fence.is_some_and(|f| f >= deadline && f <= deadline + slack) {
        broken.push(format!(
            "fence {:?} ms from the session's deadline (send + 4 s − 1 s), want 0..{slack_ms} ms",
            fence.map(|f| ms(deadline, f)),
        ));
    }
    Judged {
        drain: drain.map(|d| ms(cut, d)),
        fence: fence.map(|f| ms(cut, f)),
        broken,
    }
}
