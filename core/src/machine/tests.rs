//! Tests of the holder state machine against docs/design.md §2–§11.
//!
//! Unit tests drive every transition on hand-made instants (no sleeping, no
//! real clock). The property tests run random operation sequences against a
//! small model of the lock service and check the safety rules after every
//! step.

use super::*;

/// `n` milliseconds.
const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The instant `n` milliseconds after the clock's origin.
const fn at(n: u64) -> Instant {
    Instant::from_nanos(n * 1_000_000)
}

/// Short options: ttl 4 s, keepalive every 1 s, timeout 500 ms, retry every
/// 250 ms, margin 1 s.
fn opts() -> Options {
    let o = Options {
        ttl: ms(4000),
        keepalive_interval: ms(1000),
        keepalive_timeout: ms(500),
        retry_interval: ms(250),
        margin: ms(1000),
        reacquire: true,
    };
    o.validate().expect("test options are valid");
    o
}

fn tr(from: State, to: State, reason: Reason) -> Action {
    Action::Transition(StateChange { from, to, reason })
}

fn grant_req(actions: &[Action]) -> ReqId {
    let reqs: Vec<ReqId> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Grant { req, .. } => Some(*req),
            _ => None,
        })
        .collect();
    assert_eq!(reqs.len(), 1, "expected one Grant in {actions:?}");
    reqs[0]
}

fn lock_req(actions: &[Action]) -> ReqId {
    let reqs: Vec<ReqId> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Lock { req, .. } => Some(*req),
            _ => None,
        })
        .collect();
    assert_eq!(reqs.len(), 1, "expected one Lock in {actions:?}");
    reqs[0]
}

/// The keepalives among timed actions, with their send instants.
fn keepalives(actions: &[(Instant, Action)]) -> Vec<(Instant, ReqId)> {
    actions
        .iter()
        .filter_map(|(t, a)| match a {
            Action::Keepalive { req, .. } => Some((*t, *req)),
            _ => None,
        })
        .collect()
}

/// Timed actions without the keepalives.
fn without_keepalives(actions: Vec<(Instant, Action)>) -> Vec<(Instant, Action)> {
    actions
        .into_iter()
        .filter(|(_, a)| !matches!(a, Action::Keepalive { .. }))
        .collect()
}

fn fences(actions: &[(Instant, Action)]) -> usize {
    actions
        .iter()
        .filter(|(_, a)| matches!(a, Action::Fence { .. }))
        .count()
}

/// A holder plus a tiny driver: feeds events at given instants, runs the
/// timer loop the way the real driver does, and checks after every `handle`
/// that no timer is left due (no busy loop) and that transitions chain.
struct Sim {
    m: Holder,
    now: Instant,
    state: State,
    wakeups: usize,
}

impl Sim {
    fn new(opts: Options) -> Sim {
        Sim {
            m: Holder::new(opts),
            now: Instant::ZERO,
            state: State::Idle,
            wakeups: 0,
        }
    }

    fn handle_at(&mut self, now: Instant, ev: Event) -> Vec<Action> {
        assert!(now >= self.now, "time went backwards");
        self.now = now;
        self.m.handle(now, ev);
        let mut out = Vec::new();
        while let Some(a) = self.m.poll_action() {
            if let Action::Transition(c) = &a {
                assert_eq!(
                    c.from, self.state,
                    "transition {c} does not start where we are"
                );
                self.state = c.to;
            }
            out.push(a);
        }
        assert_eq!(self.state, self.m.state());
        if let Some(t) = self.m.poll_timeout() {
            assert!(
                t > now,
                "poll_timeout {t:?} is not after now {now:?}: busy loop"
            );
        }
        if matches!(self.m.state(), State::Holding | State::Draining) {
            assert!(self.m.deadline().is_some_and(|d| d > now));
            assert!(self.m.token().is_some());
        }
        out
    }

    /// Feeds `ev` at `t` ms.
    fn ev(&mut self, t: u64, ev: Event) -> Vec<Action> {
        self.handle_at(at(t), ev)
    }

    /// Runs the driver's timer loop up to and including `t` ms: wakes at every
    /// `poll_timeout()` that is due. Returns the actions with their instants.
    fn run_to(&mut self, t: u64) -> Vec<(Instant, Action)> {
        let end = at(t);
        let mut out = Vec::new();
        let mut n = 0;
        while let Some(next) = self.m.poll_timeout().filter(|&w| w <= end) {
            n += 1;
            assert!(n < 100_000, "timer loop does not make progress");
            self.wakeups += 1;
            for a in self.handle_at(next, Event::Timer) {
                out.push((next, a));
            }
        }
        if matches!(self.m.state(), State::Holding | State::Draining) {
            // poll_timeout() includes the deadline: a driver that woke at
            // every timer fenced in time.
            assert!(self.m.deadline().is_some_and(|d| d > end));
        }
        self.now = self.now.max(end);
        out
    }
}

const LEASE: LeaseId = 7;
const TOKEN: Token = Token(100);

/// Acquires at 1000 ms (grant sent then), lease granted at 1100 ms, locked at
/// 1200 ms with [`TOKEN`]: deadline 1000 + 4000 - 1000 = 4000 ms, first
/// keepalive due at 2000 ms.
fn holding_with(opts: Options) -> Sim {
    let mut s = Sim::new(opts);
    let a = s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    );
    let g = grant_req(&a);
    let a = s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    );
    let l = lock_req(&a);
    s.ev(
        1200,
        Event::Locked {
            req: l,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(s.m.state(), State::Holding);
    assert_eq!(s.m.deadline(), Some(at(4000)));
    s
}

fn holding() -> Sim {
    holding_with(opts())
}

/// Holding, then the first keepalive (sent at 2000 ms) fails at 2100 ms:
/// draining, retries due at 2350, 2600, ... ms.
fn draining() -> Sim {
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    assert_eq!(k.len(), 1);
    let a = s.ev(2100, Event::KeepaliveFailed { req: k[0].1 });
    assert_eq!(
        a,
        vec![tr(State::Holding, State::Draining, Reason::KeepaliveFailed)]
    );
    s
}

/// Like [`draining`], with other options.
fn draining_with(o: Options) -> Sim {
    let mut s = holding_with(o);
    let k = keepalives(&s.run_to(2000));
    s.ev(2100, Event::KeepaliveFailed { req: k[0].1 });
    assert_eq!(s.m.state(), State::Draining);
    s
}

/// The actions of a fence of [`TOKEN`] under [`LEASE`] followed by
/// reacquisition (with the grant's request id taken from `actions`). The
/// fenced lease's revoke is held back (see the ordering tests).
fn fence_and_reacquire(from: State, reason: Reason, actions: &[Action]) -> Vec<Action> {
    vec![
        tr(from, State::Fenced, reason),
        Action::Fence { token: TOKEN },
        tr(State::Fenced, State::Reacquiring, Reason::Reacquire),
        Action::Grant {
            req: grant_req(actions),
            ttl: ms(4000),
        },
    ]
}

// ---------------------------------------------------------------- acquiring

#[test]
fn idle_acquire_sends_grant() {
    let mut s = Sim::new(opts());
    assert_eq!(s.m.state(), State::Idle);
    assert_eq!(s.m.poll_timeout(), None);
    assert_eq!(s.m.permit(at(0)), Err(Refused::NotHeld));
    let a = s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    );
    let g = grant_req(&a);
    assert_eq!(
        a,
        vec![
            tr(State::Idle, State::Acquiring, Reason::Acquire),
            Action::Grant {
                req: g,
                ttl: ms(4000)
            },
        ]
    );
    assert_eq!(s.m.permit(at(1000)), Err(Refused::NotHeld));
    // The grant request times out after keepalive_timeout.
    assert_eq!(s.m.poll_timeout(), Some(at(1500)));
}

#[test]
fn grant_reply_sends_lock_and_locked_holds() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    // The reply arrives 300 ms after the request was sent.
    let a = s.ev(
        1300,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    );
    let l = lock_req(&a);
    assert_eq!(
        a,
        vec![Action::Lock {
            req: l,
            lease: LEASE,
            wait: true
        }]
    );
    assert_eq!(s.m.state(), State::Acquiring);
    assert_eq!(s.m.lease(), Some(LEASE));
    assert_eq!(s.m.permit(at(1300)), Err(Refused::NotHeld));
    // First deadline: the grant's *send* time + ttl - margin, not 1300 + 3000.
    assert_eq!(s.m.deadline(), Some(at(4000)));

    let a = s.ev(
        1800,
        Event::Locked {
            req: l,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(
        a,
        vec![
            tr(State::Acquiring, State::Holding, Reason::Acquired),
            Action::Acquired { token: TOKEN },
        ]
    );
    assert_eq!(s.m.token(), Some(TOKEN));
    assert_eq!(s.m.deadline(), Some(at(4000)));
    assert_eq!(s.m.permit(at(1800)), Ok((TOKEN, at(4000))));
    assert_eq!(s.m.permit(at(3999)), Ok((TOKEN, at(4000))));
}

#[test]
fn acquire_timeout_returns_to_idle() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: Some(at(2200)),
        },
    ));
    let l = lock_req(&s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    ));
    // The lock request waits behind another holder; the lease is kept alive.
    let a = s.run_to(2000);
    let k = keepalives(&a);
    assert_eq!(k, vec![(at(2000), k[0].1)]);
    assert!(
        s.ev(
            2100,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert!(s.run_to(2199).is_empty());
    assert_eq!(s.m.state(), State::Acquiring);
    let a = s.run_to(2200);
    assert_eq!(
        a,
        vec![
            (at(2200), Action::Revoke { lease: LEASE }),
            (
                at(2200),
                tr(State::Acquiring, State::Idle, Reason::AcquireTimeout)
            ),
            (
                at(2200),
                Action::AcquireFailed {
                    error: AcquireError::Timeout
                }
            ),
        ]
    );
    assert_eq!(s.m.permit(at(2200)), Err(Refused::NotHeld));
    assert_eq!(s.m.poll_timeout(), None);
    assert_eq!(s.m.lease(), None);
    // The lock arrives too late: its lease is revoked, nothing is acquired.
    let a = s.ev(
        2300,
        Event::Locked {
            req: l,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: LEASE }]);
    assert_eq!(s.m.state(), State::Idle);
    assert_eq!(s.m.token(), None);
}

#[test]
fn acquire_timeout_while_grant_retries() {
    // The service is unreachable: grants time out and are retried until the
    // acquisition gives up.
    let mut s = Sim::new(opts());
    s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: Some(at(3000)),
        },
    );
    let a = s.run_to(3000);
    let grants: Vec<Instant> = a
        .iter()
        .filter(|(_, a)| matches!(a, Action::Grant { .. }))
        .map(|(t, _)| *t)
        .collect();
    // Sent at 1000, times out at 1500, retried at 1750, 2500.
    assert_eq!(grants, vec![at(1750), at(2500)]);
    // No lock request was ever queued: a backend failure, not a timeout.
    assert_eq!(
        a.last().map(|(_, a)| a.clone()),
        Some(Action::AcquireFailed {
            error: AcquireError::Backend
        })
    );
    assert_eq!(s.m.state(), State::Idle);
    assert_eq!(s.m.poll_timeout(), None);
}

#[test]
fn try_acquire_busy_would_block() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: false,
            until: None,
        },
    ));
    let a = s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    );
    let l = lock_req(&a);
    assert_eq!(
        a,
        vec![Action::Lock {
            req: l,
            lease: LEASE,
            wait: false
        }]
    );
    let a = s.ev(1200, Event::LockFailed { req: l, busy: true });
    assert_eq!(
        a,
        vec![
            Action::Revoke { lease: LEASE },
            tr(State::Acquiring, State::Idle, Reason::WouldBlock),
            Action::AcquireFailed {
                error: AcquireError::WouldBlock
            },
        ]
    );
    assert_eq!(s.m.permit(at(1200)), Err(Refused::NotHeld));
    assert_eq!(s.m.poll_timeout(), None);
}

#[test]
fn try_acquire_backend_failure() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: false,
            until: None,
        },
    ));
    let a = s.ev(1100, Event::GrantFailed { req: g });
    assert_eq!(
        a,
        vec![
            tr(State::Acquiring, State::Idle, Reason::AcquireFailed),
            Action::AcquireFailed {
                error: AcquireError::Backend
            },
        ]
    );
    assert_eq!(s.m.poll_timeout(), None);
}

#[test]
fn waiting_acquire_retries_busy_lock_and_failed_grant() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    // A failed grant is retried after retry_interval.
    assert!(s.ev(1100, Event::GrantFailed { req: g }).is_empty());
    assert_eq!(s.m.state(), State::Acquiring);
    let a = s.run_to(1350);
    assert_eq!(a.len(), 1);
    let g2 = grant_req(&[a[0].1.clone()]);
    assert_eq!(a[0].0, at(1350));
    let l = lock_req(&s.ev(
        1400,
        Event::LeaseGranted {
            req: g2,
            lease: LEASE,
            ttl: ms(4000),
        },
    ));
    // Busy while waiting: the lock is asked again, under the same lease.
    assert!(
        s.ev(1500, Event::LockFailed { req: l, busy: true })
            .is_empty()
    );
    let a = s.run_to(1750);
    assert_eq!(a.len(), 1);
    let l2 = lock_req(&[a[0].1.clone()]);
    assert_eq!(
        a,
        vec![(
            at(1750),
            Action::Lock {
                req: l2,
                lease: LEASE,
                wait: true
            }
        )]
    );
    let a = s.ev(
        1800,
        Event::Locked {
            req: l2,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(a[1], Action::Acquired { token: TOKEN });
    // The deadline still comes from the grant's send time (1350 ms).
    assert_eq!(s.m.deadline(), Some(at(4350)));
}

#[test]
fn acquire_while_holding_or_draining_is_already_held() {
    let mut s = holding();
    let a = s.ev(
        1500,
        Event::Acquire {
            wait: true,
            until: None,
        },
    );
    assert_eq!(
        a,
        vec![Action::AcquireRefused {
            error: AcquireError::AlreadyHeld
        }]
    );
    assert_eq!(s.m.state(), State::Holding);
    assert_eq!(s.m.token(), Some(TOKEN));
    assert_eq!(s.m.deadline(), Some(at(4000)));

    let mut s = draining();
    let a = s.ev(
        2200,
        Event::Acquire {
            wait: false,
            until: None,
        },
    );
    assert_eq!(
        a,
        vec![Action::AcquireRefused {
            error: AcquireError::AlreadyHeld
        }]
    );
    assert_eq!(s.m.state(), State::Draining);
}

#[test]
fn second_acquire_while_acquiring_is_already_held() {
    // One acquire at a time per handle, whatever the backend's speed: the
    // second caller is refused at once, the first goes on unchanged.
    let mut s = Sim::new(opts());
    let a = s.ev(
        1000,
        Event::Acquire {
            wait: false,
            until: Some(at(2000)),
        },
    );
    let g = grant_req(&a);
    let a = s.ev(
        1100,
        Event::Acquire {
            wait: true,
            until: None,
        },
    );
    assert_eq!(
        a,
        vec![Action::AcquireRefused {
            error: AcquireError::AlreadyHeld
        }]
    );
    assert_eq!(s.m.state(), State::Acquiring);
    let a = s.ev(
        1200,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    );
    // Still the first caller's try: no wait.
    assert!(
        a.contains(&Action::Lock {
            req: lock_req(&a),
            lease: LEASE,
            wait: false
        }),
        "{a:?}"
    );
}

#[test]
fn stale_grant_reply_is_revoked() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    // The grant times out at 1500 ms; its reply arrives later.
    assert!(s.run_to(1500).is_empty());
    let a = s.ev(
        1600,
        Event::LeaseGranted {
            req: g,
            lease: 5,
            ttl: ms(4000),
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: 5 }]);
    assert_eq!(s.m.lease(), None);
    assert_eq!(s.m.deadline(), None);
    // A grant for a request never made is revoked too.
    let a = s.ev(
        1650,
        Event::LeaseGranted {
            req: 999,
            lease: 6,
            ttl: ms(4000),
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: 6 }]);
    // The acquisition goes on with a new grant after retry_interval.
    let a = s.run_to(1750);
    assert_eq!(a.len(), 1, "{a:?}");
    assert!(matches!(a[0], (t, Action::Grant { .. }) if t == at(1750)));
}

#[test]
fn zero_ttl_grant_is_revoked_and_retried() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let a = s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: 5,
            ttl: Duration::ZERO,
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: 5 }]);
    assert_eq!(s.m.lease(), None);
    let a = s.run_to(1350);
    assert!(matches!(a[..], [(_, Action::Grant { .. })]), "{a:?}");
}

#[test]
fn stale_lock_reply_is_revoked() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let l = lock_req(&s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: 5,
            ttl: ms(4000),
        },
    ));
    // The lease is lost while the lock is pending: a fresh session starts,
    // with no fence (no token was held).
    let a = s.ev(1200, Event::LeaseLost { lease: 5 });
    let g2 = grant_req(&a);
    assert_eq!(
        a,
        vec![
            Action::Revoke { lease: 5 },
            Action::Grant {
                req: g2,
                ttl: ms(4000)
            },
        ]
    );
    assert_eq!(s.m.state(), State::Acquiring);
    // The old lock request's reply: its lease is revoked, no token taken.
    let a = s.ev(
        1300,
        Event::Locked {
            req: l,
            lease: 5,
            token: Token(50),
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: 5 }]);
    assert_eq!(s.m.state(), State::Acquiring);
    assert_eq!(s.m.token(), None);
    // The new session completes.
    let l2 = lock_req(&s.ev(
        1400,
        Event::LeaseGranted {
            req: g2,
            lease: LEASE,
            ttl: ms(4000),
        },
    ));
    let a = s.ev(
        1500,
        Event::Locked {
            req: l2,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(a[1], Action::Acquired { token: TOKEN });
    assert_eq!(s.m.deadline(), Some(at(4200)));
    // A duplicate reply to the lock request that made us hold is ignored (its
    // lease is ours: never revoked).
    let a = s.ev(
        1600,
        Event::Locked {
            req: l2,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(s.m.state(), State::Holding);
}

// ---------------------------------------------------------------- keepalive

#[test]
fn keepalive_at_interval_and_confirmation_uses_send_time() {
    let mut s = holding();
    assert_eq!(s.m.poll_timeout(), Some(at(2000)));
    assert!(s.run_to(1999).is_empty());
    let a = s.run_to(2000);
    let k = keepalives(&a);
    assert_eq!(
        a,
        vec![(
            at(2000),
            Action::Keepalive {
                req: k[0].1,
                lease: LEASE
            }
        )]
    );
    // Confirmed 300 ms later: deadline = send time 2000 + 4000 - 1000.
    assert!(
        s.ev(
            2300,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.deadline(), Some(at(5000)));
    assert_eq!(s.m.permit(at(4999)), Ok((TOKEN, at(5000))));
    // Next keepalive one interval after the previous one was sent.
    assert!(s.run_to(2999).is_empty());
    let a = s.run_to(3000);
    let k = keepalives(&a);
    assert_eq!(k.len(), 1);
    assert_eq!(a.len(), 1);
    assert_eq!(k[0].0, at(3000));
    // Steady state: one keepalive a second, each confirmed.
    let mut sent = vec![k[0]];
    for i in 0..5 {
        let (t, req) = *sent.last().unwrap();
        let reply = t.as_nanos() / 1_000_000 + 100;
        assert!(
            s.ev(reply, Event::KeepaliveConfirmed { req, ttl: ms(4000) })
                .is_empty()
        );
        assert_eq!(s.m.deadline(), Some(t + ms(3000)));
        let k = keepalives(&s.run_to(4000 + 1000 * i));
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].0, at(4000 + 1000 * i));
        sent.push(k[0]);
    }
    assert_eq!(s.m.state(), State::Holding);
}

#[test]
fn late_reply_within_timeout_uses_its_own_send_time() {
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    // 499 ms after sending: still within keepalive_timeout.
    assert!(
        s.ev(
            2499,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.deadline(), Some(at(5000)), "not 2499 + 3000");
    assert_eq!(s.m.state(), State::Holding);
}

#[test]
fn confirmation_never_shortens_the_deadline() {
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    // The server grants only 1.5 s: 2000 + 1500 - 1000 = 2500 < 4000.
    assert!(
        s.ev(
            2100,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(1500)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.deadline(), Some(at(4000)));
    // A longer grant extends it, from the send time.
    let k = keepalives(&s.run_to(3000));
    s.ev(
        3100,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(10_000),
        },
    );
    assert_eq!(s.m.deadline(), Some(at(12_000)));
}

#[test]
fn reply_to_older_keepalive_uses_its_own_send_time() {
    // Retries overlap while draining (retry 250 ms < timeout 500 ms), so two
    // keepalives are outstanding: r1 sent at 2350, r2 at 2600.
    let mut s = draining();
    let k = keepalives(&s.run_to(2600));
    assert_eq!(
        k.iter().map(|k| k.0).collect::<Vec<_>>(),
        vec![at(2350), at(2600)]
    );
    let (r1, r2) = (k[0].1, k[1].1);

    // r1's reply arrives after r2 was sent: it uses r1's send time.
    let a = s.ev(
        2700,
        Event::KeepaliveConfirmed {
            req: r1,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        vec![tr(State::Draining, State::Holding, Reason::Resumed)]
    );
    assert_eq!(s.m.deadline(), Some(at(5350)), "not r2's 2600 + 3000");
    // Then r2's reply: its own send time.
    assert!(
        s.ev(
            2800,
            Event::KeepaliveConfirmed {
                req: r2,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.deadline(), Some(at(5600)));

    // The other order: r2 first, then the older r1 never lowers the deadline.
    let mut s = draining();
    let k = keepalives(&s.run_to(2600));
    let (r1, r2) = (k[0].1, k[1].1);
    let a = s.ev(
        2700,
        Event::KeepaliveConfirmed {
            req: r2,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        vec![tr(State::Draining, State::Holding, Reason::Resumed)]
    );
    assert_eq!(s.m.deadline(), Some(at(5600)));
    assert!(
        s.ev(
            2800,
            Event::KeepaliveConfirmed {
                req: r1,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.deadline(), Some(at(5600)));
}

#[test]
fn keepalive_timeout_drains() {
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    assert_eq!(k.len(), 1);
    assert_eq!(s.m.poll_timeout(), Some(at(2500)));
    assert!(s.run_to(2499).is_empty());
    assert_eq!(s.m.permit(at(2499)), Ok((TOKEN, at(4000))));
    let a = s.run_to(2500);
    assert_eq!(
        a,
        vec![(
            at(2500),
            tr(State::Holding, State::Draining, Reason::KeepaliveTimeout)
        )]
    );
    assert_eq!(s.m.permit(at(2500)), Err(Refused::Draining));
    assert_eq!(s.m.deadline(), Some(at(4000)));
    // First retry one retry_interval after the failure.
    assert_eq!(s.m.poll_timeout(), Some(at(2750)));
}

#[test]
fn transport_failure_drains() {
    let s = draining();
    assert_eq!(s.m.permit(at(2100)), Err(Refused::Draining));
    assert_eq!(s.m.token(), Some(TOKEN));
    assert_eq!(s.m.deadline(), Some(at(4000)));
    assert_eq!(s.m.poll_timeout(), Some(at(2350)));
}

#[test]
fn failure_of_unknown_keepalive_is_ignored() {
    let mut s = holding();
    assert!(s.ev(1500, Event::KeepaliveFailed { req: 999 }).is_empty());
    assert!(
        s.ev(
            1500,
            Event::KeepaliveConfirmed {
                req: 999,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.state(), State::Holding);
    assert_eq!(s.m.deadline(), Some(at(4000)));
}

#[test]
fn retries_every_retry_interval_while_draining() {
    let mut s = draining();
    let a = s.run_to(3999);
    // Only keepalives: no further transition while the retries fail silently.
    assert!(
        a.iter().all(|(_, a)| matches!(a, Action::Keepalive { .. })),
        "{a:?}"
    );
    let times: Vec<Instant> = keepalives(&a).iter().map(|k| k.0).collect();
    let want: Vec<Instant> = (0..7).map(|i| at(2350 + 250 * i)).collect();
    assert_eq!(times, want);
    assert_eq!(s.m.state(), State::Draining);
    assert_eq!(s.m.permit(at(3999)), Err(Refused::Draining));
}

#[test]
fn confirmed_retry_resumes() {
    let mut s = draining();
    let k = keepalives(&s.run_to(2350));
    assert_eq!(k.len(), 1);
    let a = s.ev(
        2400,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        vec![tr(State::Draining, State::Holding, Reason::Resumed)]
    );
    assert_eq!(s.m.deadline(), Some(at(5350)));
    assert_eq!(s.m.permit(at(2400)), Ok((TOKEN, at(5350))));
    // Back to the regular schedule: no more retries, next keepalive at
    // 2350 + 1000.
    assert!(s.run_to(3349).is_empty());
    let a = s.run_to(3350);
    assert_eq!(keepalives(&a).len(), 1);
    assert_eq!(a.len(), 1);
}

#[test]
fn a_confirmed_retry_supersedes_older_ones() {
    let mut s = draining();
    // Retries at 2350 and 2600, both unanswered so far.
    let k = keepalives(&s.run_to(2600));
    assert_eq!(k.len(), 2);
    let a = s.ev(
        2700,
        Event::KeepaliveConfirmed {
            req: k[1].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        vec![tr(State::Draining, State::Holding, Reason::Resumed)]
    );
    // The older retry would time out at 2850: superseded, it drains nothing.
    let a = s.run_to(3000);
    assert!(
        a.iter().all(|(_, a)| !matches!(a, Action::Transition(_))),
        "{a:?}"
    );
    assert_eq!(s.m.state(), State::Holding);
    // And its late reply is ignored.
    s.ev(
        3000,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(s.m.deadline(), Some(at(5600)));
}

// ---------------------------------------------------------------- fencing

#[test]
fn deadline_fences_once_and_reacquires() {
    let mut s = holding();
    // Nothing is ever answered: the keepalive at 2000 times out at 2500.
    let a = without_keepalives(s.run_to(3999));
    assert_eq!(
        a,
        vec![(
            at(2500),
            tr(State::Holding, State::Draining, Reason::KeepaliveTimeout)
        )]
    );
    assert_eq!(s.m.permit(at(3999)), Err(Refused::Draining));
    let a: Vec<Action> = s.run_to(4000).into_iter().map(|(_, a)| a).collect();
    assert_eq!(
        a,
        fence_and_reacquire(State::Draining, Reason::Deadline, &a)
    );
    assert_eq!(s.m.permit(at(4000)), Err(Refused::Fenced));
    assert_eq!(s.m.state(), State::Reacquiring);
    assert_eq!(s.m.token(), None);
    assert_eq!(s.m.lease(), None);
    assert_eq!(s.m.deadline(), None);
    // A minute of silence: grants time out and are retried; never a second
    // fence, never a permit.
    let a = s.run_to(64_000);
    assert_eq!(fences(&a), 0);
    // The fenced lease is revoked once it has run out anyway (last retry
    // sent at 3750 + TTL): nobody said on_fence returned.
    let (revokes, grants): (Vec<_>, Vec<_>) = a
        .iter()
        .partition(|(_, a)| matches!(a, Action::Revoke { .. }));
    assert_eq!(revokes, vec![&(at(7750), Action::Revoke { lease: LEASE })]);
    assert!(
        grants
            .iter()
            .all(|(_, a)| matches!(a, Action::Grant { .. })),
        "{a:?}"
    );
    // Sent at 4000, timed out at 4500, retried at 4750: one per 750 ms.
    assert_eq!(grants.len(), 80);
    assert_eq!(s.m.state(), State::Reacquiring);
    assert_eq!(s.m.permit(at(64_000)), Err(Refused::Fenced));
}

#[test]
fn deadline_is_a_timer_of_its_own() {
    // Retries far apart: nothing else is due at the deadline.
    let mut s = draining_with(Options {
        retry_interval: ms(5000),
        ..opts()
    });
    assert_eq!(s.m.poll_timeout(), Some(at(4000)));
    let a: Vec<Action> = s.run_to(4000).into_iter().map(|(_, a)| a).collect();
    assert_eq!(
        a,
        fence_and_reacquire(State::Draining, Reason::Deadline, &a)
    );
}

#[test]
fn late_timer_fences_from_holding() {
    // The driver was starved past the deadline: permit() already refuses by
    // the clock, and the next wake-up fences straight from Holding.
    let mut s = holding();
    assert_eq!(s.m.state(), State::Holding);
    assert_eq!(s.m.permit(at(4000)), Err(Refused::Fenced));
    assert_eq!(s.m.permit(at(9000)), Err(Refused::Fenced));
    let a = s.ev(9000, Event::Timer);
    // So late that the lease has run out anyway (grant sent at 1000 + TTL
    // 4000): its revoke is not held back.
    let mut want = fence_and_reacquire(State::Holding, Reason::Deadline, &a);
    want.push(Action::Revoke { lease: LEASE });
    assert_eq!(a, want);
}

#[test]
fn reacquired_holds_with_higher_token() {
    let mut s = holding();
    let a: Vec<Action> = s.run_to(4000).into_iter().map(|(_, a)| a).collect();
    let g = grant_req(&a);
    let l = lock_req(&s.ev(
        4100,
        Event::LeaseGranted {
            req: g,
            lease: 8,
            ttl: ms(4000),
        },
    ));
    assert_eq!(s.m.state(), State::Reacquiring);
    assert_eq!(s.m.permit(at(4100)), Err(Refused::Fenced));
    let a = s.ev(
        4200,
        Event::Locked {
            req: l,
            lease: 8,
            token: Token(101),
        },
    );
    assert_eq!(
        a,
        vec![
            tr(State::Reacquiring, State::Holding, Reason::Reacquired),
            Action::Acquired { token: Token(101) },
        ]
    );
    assert_eq!(s.m.deadline(), Some(at(7000)));
    assert_eq!(s.m.permit(at(4200)), Ok((Token(101), at(7000))));
}

#[test]
fn reacquire_never_accepts_a_non_increasing_token() {
    let mut s = holding();
    let mut a: Vec<Action> = s.run_to(4000).into_iter().map(|(_, a)| a).collect();
    let mut t = 4000;
    let mut lease = 10;
    // Same token, then a lower one: each is refused, its lease revoked, and a
    // fresh session started.
    for bad in [TOKEN, Token(99), Token(0)] {
        let g = grant_req(&a);
        let l = lock_req(&s.ev(
            t + 100,
            Event::LeaseGranted {
                req: g,
                lease,
                ttl: ms(4000),
            },
        ));
        a = s.ev(
            t + 200,
            Event::Locked {
                req: l,
                lease,
                token: bad,
            },
        );
        assert_eq!(
            a,
            vec![
                Action::Revoke { lease },
                Action::Grant {
                    req: grant_req(&a),
                    ttl: ms(4000)
                },
            ]
        );
        assert_eq!(s.m.state(), State::Reacquiring);
        assert_eq!(s.m.token(), None);
        assert_eq!(s.m.permit(at(t + 200)), Err(Refused::Fenced));
        t += 200;
        lease += 1;
    }
    let g = grant_req(&a);
    let l = lock_req(&s.ev(
        t + 100,
        Event::LeaseGranted {
            req: g,
            lease,
            ttl: ms(4000),
        },
    ));
    let a = s.ev(
        t + 200,
        Event::Locked {
            req: l,
            lease,
            token: Token(101),
        },
    );
    assert_eq!(a[1], Action::Acquired { token: Token(101) });
}

#[test]
fn acquire_after_release_never_accepts_an_old_token() {
    let mut s = holding();
    s.ev(1500, Event::Release);
    let g = grant_req(&s.ev(
        1600,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let l = lock_req(&s.ev(
        1700,
        Event::LeaseGranted {
            req: g,
            lease: 8,
            ttl: ms(4000),
        },
    ));
    let a = s.ev(
        1800,
        Event::Locked {
            req: l,
            lease: 8,
            token: TOKEN,
        },
    );
    assert!(
        !a.iter().any(|a| matches!(a, Action::Acquired { .. })),
        "{a:?}"
    );
    assert_eq!(s.m.state(), State::Acquiring);
}

#[test]
fn zero_ttl_keepalive_fences_at_once() {
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    let a = s.ev(
        2100,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: Duration::ZERO,
        },
    );
    assert_eq!(
        a,
        fence_and_reacquire(State::Holding, Reason::LeaseLost, &a)
    );
    assert_eq!(s.m.permit(at(2100)), Err(Refused::Fenced));
    // The old deadline (4000) is gone with the lease: no second fence.
    assert_eq!(fences(&s.run_to(10_000)), 0);
}

#[test]
fn lease_lost_fences_at_once() {
    let mut s = holding();
    // Another lease: not ours, ignored.
    assert!(s.ev(1500, Event::LeaseLost { lease: 99 }).is_empty());
    assert_eq!(s.m.state(), State::Holding);
    let a = s.ev(1600, Event::LeaseLost { lease: LEASE });
    assert_eq!(
        a,
        fence_and_reacquire(State::Holding, Reason::LeaseLost, &a)
    );
    assert_eq!(s.m.permit(at(1600)), Err(Refused::Fenced));
    // Said again: the lease is not ours any more.
    assert!(s.ev(1700, Event::LeaseLost { lease: LEASE }).is_empty());

    // From Draining too.
    let mut s = draining();
    let a = s.ev(2200, Event::LeaseLost { lease: LEASE });
    assert_eq!(
        a,
        fence_and_reacquire(State::Draining, Reason::LeaseLost, &a)
    );
}

#[test]
fn lock_lost_fences_at_once_and_reacquires_with_a_new_lease() {
    let mut s = holding();
    // Another lease's lock: ignored.
    assert!(s.ev(1500, Event::LockLost { lease: 99 }).is_empty());
    assert_eq!(s.m.permit(at(1500)), Ok((TOKEN, at(4000))));
    // The key is gone although the lease lives: fence now, long before the
    // deadline, revoke the old lease, take a new one.
    let a = s.ev(1600, Event::LockLost { lease: LEASE });
    assert_eq!(a, fence_and_reacquire(State::Holding, Reason::LockLost, &a));
    assert_eq!(Reason::LockLost.as_str(), "lock_lost");
    assert_eq!(s.m.permit(at(1600)), Err(Refused::Fenced));
    assert!(s.ev(1700, Event::LockLost { lease: LEASE }).is_empty());
    // The new acquisition holds with a higher token.
    let g = grant_req(&a);
    let a = s.ev(
        1800,
        Event::LeaseGranted {
            req: g,
            lease: LEASE + 1,
            ttl: ms(4000),
        },
    );
    let l = lock_req(&a);
    let a = s.ev(
        1900,
        Event::Locked {
            req: l,
            lease: LEASE + 1,
            token: Token(TOKEN.0 + 1),
        },
    );
    assert!(a.contains(&tr(State::Reacquiring, State::Holding, Reason::Reacquired)));

    // From Draining too.
    let mut s = draining();
    let a = s.ev(2200, Event::LockLost { lease: LEASE });
    assert_eq!(
        a,
        fence_and_reacquire(State::Draining, Reason::LockLost, &a)
    );
}

#[test]
fn reply_after_deadline_does_not_revive_the_token() {
    let mut s = draining();
    let k = keepalives(&s.run_to(3999));
    let (sent, last) = *k.last().unwrap();
    assert_eq!(sent, at(3850));
    // The retry's reply races the deadline timer: it arrives at 4000 (within
    // its timeout, and it would extend to 6850), but timers run first.
    let a = s.ev(
        4000,
        Event::KeepaliveConfirmed {
            req: last,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        fence_and_reacquire(State::Draining, Reason::Deadline, &a)
    );
    assert_eq!(s.m.state(), State::Reacquiring);
    assert_eq!(s.m.token(), None);
    assert_eq!(s.m.deadline(), None);
    assert_eq!(s.m.permit(at(4000)), Err(Refused::Fenced));

    // Same without reacquiring: it stays fenced.
    let mut s = draining_with(Options {
        reacquire: false,
        ..opts()
    });
    let k = keepalives(&s.run_to(3999));
    let a = s.ev(
        4001,
        Event::KeepaliveConfirmed {
            req: k.last().unwrap().1,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        vec![
            tr(State::Draining, State::Fenced, Reason::Deadline),
            Action::Fence { token: TOKEN },
        ]
    );
    assert_eq!(s.m.state(), State::Fenced);
    assert_eq!(s.m.permit(at(4001)), Err(Refused::Fenced));
}

#[test]
fn reply_after_keepalive_timeout_is_ignored() {
    for reply in [2500, 2600, 2999] {
        let mut s = holding();
        let k = keepalives(&s.run_to(2000));
        // Not run_to(reply): the reply and the timeout are due at once.
        let a = s.ev(
            reply,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000),
            },
        );
        assert_eq!(
            a,
            vec![tr(
                State::Holding,
                State::Draining,
                Reason::KeepaliveTimeout
            )],
            "reply at {reply}"
        );
        assert_eq!(s.m.deadline(), Some(at(4000)), "reply at {reply}");
        assert_eq!(s.m.permit(at(reply)), Err(Refused::Draining));
    }
}

#[test]
fn no_reacquire_leaves_it_fenced() {
    let mut s = holding_with(Options {
        reacquire: false,
        ..opts()
    });
    let a = without_keepalives(s.run_to(4000));
    assert_eq!(
        a,
        vec![
            (
                at(2500),
                tr(State::Holding, State::Draining, Reason::KeepaliveTimeout)
            ),
            (
                at(4000),
                tr(State::Draining, State::Fenced, Reason::Deadline)
            ),
            (at(4000), Action::Fence { token: TOKEN }),
        ]
    );
    // Only the held revoke is left, at the lease's own expiry.
    assert_eq!(s.m.poll_timeout(), Some(at(7750)));
    assert_eq!(
        s.run_to(60_000),
        vec![(at(7750), Action::Revoke { lease: LEASE })]
    );
    assert_eq!(s.m.poll_timeout(), None);
    assert_eq!(s.m.state(), State::Fenced);
    assert_eq!(s.m.permit(at(60_000)), Err(Refused::Fenced));
    // The application may acquire again, with a higher token.
    let g = grant_req(&s.ev(
        60_000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let l = lock_req(&s.ev(
        60_100,
        Event::LeaseGranted {
            req: g,
            lease: 8,
            ttl: ms(4000),
        },
    ));
    let a = s.ev(
        60_200,
        Event::Locked {
            req: l,
            lease: 8,
            token: Token(101),
        },
    );
    assert_eq!(
        a,
        vec![
            tr(State::Acquiring, State::Holding, Reason::Acquired),
            Action::Acquired { token: Token(101) },
        ]
    );
}

#[test]
fn lease_expiring_while_acquiring_starts_a_new_session_without_fence() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: 5,
            ttl: ms(4000),
        },
    );
    // Keepalives of the waiting session go unanswered until its deadline.
    let a = without_keepalives(s.run_to(4000));
    assert_eq!(fences(&a), 0);
    assert!(
        matches!(
            a[..],
            [(t, Action::Revoke { lease: 5 }), (_, Action::Grant { .. })] if t == at(4000)
        ),
        "{a:?}"
    );
    assert_eq!(s.m.state(), State::Acquiring);
}

#[test]
fn failing_keepalive_while_acquiring_drains_right_after_lock() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let l = lock_req(&s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    ));
    let k = keepalives(&s.run_to(2000));
    assert!(
        s.ev(2100, Event::KeepaliveFailed { req: k[0].1 })
            .is_empty()
    );
    let a = s.ev(
        2200,
        Event::Locked {
            req: l,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(
        a,
        vec![
            tr(State::Acquiring, State::Holding, Reason::Acquired),
            Action::Acquired { token: TOKEN },
            tr(State::Holding, State::Draining, Reason::KeepaliveFailed),
        ]
    );
    assert_eq!(s.m.permit(at(2200)), Err(Refused::Draining));
}

// ---------------------------------------------------------------- release

#[test]
fn release_from_holding() {
    let mut s = holding();
    let a = s.ev(1500, Event::Release);
    assert_eq!(
        a,
        vec![
            Action::Revoke { lease: LEASE },
            tr(State::Holding, State::Released, Reason::Release),
        ]
    );
    assert_eq!(s.m.permit(at(1500)), Err(Refused::Released));
    assert_eq!(s.m.token(), None);
    assert_eq!(s.m.poll_timeout(), None);
    // Nothing more, ever: no keepalive, no fence at the old deadline.
    assert!(s.run_to(100_000).is_empty());
    assert!(s.ev(100_000, Event::Release).is_empty());
    assert!(s.ev(100_000, Event::LeaseLost { lease: LEASE }).is_empty());
}

#[test]
fn release_from_draining() {
    let mut s = draining();
    let k = keepalives(&s.run_to(2350));
    let a = s.ev(2400, Event::Release);
    assert_eq!(
        a,
        vec![
            Action::Revoke { lease: LEASE },
            tr(State::Draining, State::Released, Reason::Release),
        ]
    );
    assert_eq!(s.m.permit(at(2400)), Err(Refused::Released));
    // A late confirmation of the retry does not bring it back.
    assert!(
        s.ev(
            2450,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.state(), State::Released);
    assert!(s.run_to(100_000).is_empty());
}

#[test]
fn release_while_acquiring() {
    // Before the grant's reply: no lease to revoke yet.
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let a = s.ev(1100, Event::Release);
    assert_eq!(
        a,
        vec![
            tr(State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                error: AcquireError::Released
            },
        ]
    );
    assert_eq!(s.m.poll_timeout(), None);
    // The grant's reply comes anyway: that lease would only block others.
    let a = s.ev(
        1200,
        Event::LeaseGranted {
            req: g,
            lease: 5,
            ttl: ms(4000),
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: 5 }]);
    assert_eq!(s.m.state(), State::Released);

    // After the grant, while the lock is pending.
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    let l = lock_req(&s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    ));
    let a = s.ev(1200, Event::Release);
    assert_eq!(
        a,
        vec![
            Action::Revoke { lease: LEASE },
            tr(State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                error: AcquireError::Released
            },
        ]
    );
    let a = s.ev(
        1300,
        Event::Locked {
            req: l,
            lease: LEASE,
            token: TOKEN,
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: LEASE }]);
    assert_eq!(s.m.state(), State::Released);
    assert_eq!(s.m.permit(at(1300)), Err(Refused::Released));
}

#[test]
fn release_while_reacquiring_emits_no_second_fence() {
    let mut s = holding();
    let a = s.run_to(4000);
    assert_eq!(fences(&a), 1);
    let a = s.ev(4100, Event::Release);
    assert_eq!(
        a,
        vec![
            tr(State::Reacquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                error: AcquireError::Released
            },
        ]
    );
    // The fenced lease's revoke still waits for on_fence and the permits,
    // or for the lease's own expiry: last keepalive sent at 3000 + TTL.
    let a = s.run_to(60_000);
    assert_eq!(a, vec![(at(7750), Action::Revoke { lease: LEASE })]);
}

// ---------------------------------------------------------------- ordering

fn revokes(actions: &[Action]) -> Vec<LeaseId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Revoke { lease } => Some(*lease),
            _ => None,
        })
        .collect()
}

#[test]
fn a_fenced_lease_is_revoked_once_on_fence_returned_and_the_last_permit_ended() {
    // Either order of the two reports; the revoke follows the second one,
    // never the first.
    for fence_first in [true, false] {
        let mut s = draining();
        assert!(s.m.watching_permits(), "a drain watches the permits");
        s.run_to(4000);
        assert_eq!(s.m.state(), State::Reacquiring);
        assert!(s.m.watching_permits());
        let (first, second) = if fence_first {
            (Event::FenceDelivered { token: TOKEN }, Event::PermitsEnded)
        } else {
            (Event::PermitsEnded, Event::FenceDelivered { token: TOKEN })
        };
        let a = s.ev(4100, first);
        assert!(revokes(&a).is_empty(), "revoked after one report: {a:?}");
        let a = s.ev(4200, second);
        assert_eq!(revokes(&a), vec![LEASE], "fence_first={fence_first}");
        assert!(!s.m.watching_permits());
        // Once only.
        assert!(revokes(&s.ev(4300, Event::PermitsEnded)).is_empty());
        assert!(
            !s.run_to(60_000)
                .iter()
                .any(|(_, a)| matches!(a, Action::Revoke { lease: LEASE }))
        );
    }
}

#[test]
fn a_drain_that_ended_before_the_fence_needs_only_on_fence() {
    let mut s = draining();
    let a = s.ev(2200, Event::PermitsEnded);
    assert_eq!(a, vec![Action::Drained]);
    s.run_to(4000);
    let a = s.ev(4010, Event::FenceDelivered { token: TOKEN });
    assert_eq!(revokes(&a), vec![LEASE]);
}

#[test]
fn a_fence_straight_from_holding_waits_for_the_permits_again() {
    // A drain that ended long ago says nothing about permits taken since.
    let mut s = draining();
    s.ev(2200, Event::PermitsEnded);
    let k = keepalives(&s.run_to(2350));
    s.ev(
        2400,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(s.m.state(), State::Holding);
    assert!(!s.m.watching_permits());
    let a = s.ev(2500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(), State::Reacquiring);
    assert!(revokes(&a).is_empty());
    let a = s.ev(2600, Event::FenceDelivered { token: TOKEN });
    assert!(revokes(&a).is_empty(), "permits may still run: {a:?}");
    let a = s.ev(2700, Event::PermitsEnded);
    assert_eq!(a, vec![Action::Drained, Action::Revoke { lease: LEASE }]);
}

#[test]
fn drained_is_reported_once_per_drain_and_never_while_holding() {
    let mut s = holding();
    assert!(!s.m.watching_permits());
    assert!(
        s.ev(1500, Event::PermitsEnded).is_empty(),
        "holding: no drain"
    );
    let mut s = draining();
    assert_eq!(s.ev(2200, Event::PermitsEnded), vec![Action::Drained]);
    assert!(!s.m.watching_permits());
    assert!(s.ev(2300, Event::PermitsEnded).is_empty(), "once per drain");
    // A release is no drain of its own.
    let mut s = holding();
    let a = s.ev(2400, Event::Release);
    assert!(!a.contains(&Action::Drained), "{a:?}");
    assert!(!s.m.watching_permits());
    // A drain begun goes on through a release.
    let mut s = draining();
    s.ev(2200, Event::Release);
    assert!(s.m.watching_permits());
    assert_eq!(s.ev(2300, Event::PermitsEnded), vec![Action::Drained]);
}

#[test]
fn a_resumed_drain_stops_watching() {
    let mut s = draining();
    let k = keepalives(&s.run_to(2350));
    s.ev(
        2400,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(s.m.state(), State::Holding);
    assert!(!s.m.watching_permits());
    assert!(s.ev(2500, Event::PermitsEnded).is_empty());
}

#[test]
fn a_lock_first_taken_with_try_acquire_reacquires_by_waiting() {
    let mut s = Sim::new(opts());
    let a = s.ev(
        1000,
        Event::Acquire {
            wait: false,
            until: Some(at(2000)),
        },
    );
    let g = grant_req(&a);
    let a = s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    );
    assert!(a.contains(&Action::Lock {
        req: lock_req(&a),
        lease: LEASE,
        wait: false
    }));
    let l = lock_req(&a);
    s.ev(
        1200,
        Event::Locked {
            req: l,
            lease: LEASE,
            token: TOKEN,
        },
    );
    let a = s.ev(1300, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(), State::Reacquiring);
    let g = grant_req(&a);
    let a = s.ev(
        1400,
        Event::LeaseGranted {
            req: g,
            lease: LEASE + 1,
            ttl: ms(4000),
        },
    );
    assert!(
        a.contains(&Action::Lock {
            req: lock_req(&a),
            lease: LEASE + 1,
            wait: true
        }),
        "a reacquire waits its turn: {a:?}"
    );
    // And is not given up: no timeout applies to it.
    let l = lock_req(&a);
    let a = s.ev(30_000, Event::LockFailed { req: l, busy: true });
    assert!(!a.iter().any(|a| matches!(a, Action::AcquireFailed { .. })));
    assert_eq!(s.m.state(), State::Reacquiring);
}

#[test]
fn a_guarded_write_needs_the_token_held_now() {
    let mut s = holding();
    assert_eq!(s.m.write_lease(at(1500), TOKEN), Some(LEASE));
    assert_eq!(s.m.write_lease(at(1500), Token(TOKEN.0 - 1)), None);
    assert_eq!(s.m.write_lease(at(4000), TOKEN), None, "past the deadline");
    s.ev(1600, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.write_lease(at(1600), TOKEN), None, "fenced");
}

// ---------------------------------------------------------------- permit

#[test]
fn permit_in_every_state() {
    // Idle.
    let s = Sim::new(opts());
    assert_eq!(s.m.permit(at(0)), Err(Refused::NotHeld));
    assert_eq!(s.m.permit(at(u64::MAX / 1_000_000)), Err(Refused::NotHeld));

    // Acquiring, with and without a lease.
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            wait: true,
            until: None,
        },
    ));
    assert_eq!(s.m.permit(at(1000)), Err(Refused::NotHeld));
    s.ev(
        1100,
        Event::LeaseGranted {
            req: g,
            lease: LEASE,
            ttl: ms(4000),
        },
    );
    assert_eq!(s.m.state(), State::Acquiring);
    assert_eq!(s.m.permit(at(1100)), Err(Refused::NotHeld));

    // Holding: granted strictly before the deadline only, by the clock alone
    // (no handle() call in between).
    let s = holding();
    assert_eq!(s.m.permit(at(1200)), Ok((TOKEN, at(4000))));
    assert_eq!(
        s.m.permit(at(4000) - Duration::from_nanos(1)),
        Ok((TOKEN, at(4000)))
    );
    assert_eq!(s.m.state(), State::Holding);
    assert_eq!(s.m.permit(at(4000)), Err(Refused::Fenced));
    assert_eq!(s.m.permit(at(4001)), Err(Refused::Fenced));

    // Draining: refuses with `draining`, and `fenced` from the deadline on.
    let s = draining();
    assert_eq!(s.m.permit(at(2100)), Err(Refused::Draining));
    assert_eq!(
        s.m.permit(at(4000) - Duration::from_nanos(1)),
        Err(Refused::Draining)
    );
    assert_eq!(s.m.permit(at(4000)), Err(Refused::Fenced));

    // Fenced (no reacquire).
    let mut s = holding_with(Options {
        reacquire: false,
        ..opts()
    });
    s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(), State::Fenced);
    assert_eq!(s.m.permit(at(1500)), Err(Refused::Fenced));

    // Reacquiring, before and after the new lease.
    let mut s = holding();
    let a = s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(), State::Reacquiring);
    assert_eq!(s.m.permit(at(1500)), Err(Refused::Fenced));
    s.ev(
        1600,
        Event::LeaseGranted {
            req: grant_req(&a),
            lease: 8,
            ttl: ms(4000),
        },
    );
    assert_eq!(s.m.state(), State::Reacquiring);
    assert_eq!(s.m.permit(at(1600)), Err(Refused::Fenced));

    // Released.
    let mut s = holding();
    s.ev(1500, Event::Release);
    assert_eq!(s.m.permit(at(1500)), Err(Refused::Released));
}

// ---------------------------------------------------------------- timers

#[test]
fn poll_timeout_always_makes_progress() {
    // Idle and released holders have nothing to wait for.
    assert_eq!(Holder::new(opts()).poll_timeout(), None);

    // A long healthy run: the run_to loop asserts after every wake-up that
    // the next timeout is later than now; count the wake-ups too.
    let mut s = holding();
    let mut t = 2000;
    while t <= 62_000 {
        let k = keepalives(&s.run_to(t));
        assert_eq!(k.len(), 1, "at {t}");
        s.ev(
            t + 50,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000),
            },
        );
        t += 1000;
    }
    assert_eq!(s.m.state(), State::Holding);
    // One wake-up per keepalive.
    assert_eq!(s.wakeups, 61);

    // A long unhealthy run: drain, fence, reacquire attempts, all silent.
    let mut s = holding();
    let a = s.run_to(120_000);
    assert_eq!(fences(&a), 1);
    // Bounded wake-ups: every timer serves a purpose (at most one per 250 ms).
    assert!(s.wakeups <= 120_000 / 250, "{} wake-ups", s.wakeups);

    // Timer events at arbitrary instants (not just at poll_timeout) are fine.
    let mut s = holding();
    for t in (1200..20_000).step_by(37) {
        s.ev(t, Event::Timer);
    }
}

// ---------------------------------------------------------------- properties

mod props {
    //! Random operation sequences against a model of the lock service.

    use std::collections::{BTreeMap, HashMap};

    use proptest::prelude::*;
    use proptest::sample::Index;
    use proptest::test_runner::TestCaseError;

    use super::*;

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10_000)
    }

    /// How the service answers a request.
    #[derive(Copy, Clone, Debug)]
    enum Outcome {
        /// Served normally.
        Ok,
        /// Transport error: not processed.
        Fail,
        /// The lease is gone on the server.
        Lost,
        /// Grant: failed; lock: busy; keepalive: processed, reply lost.
        Busy,
        /// Grant: another TTL; lock: a non-increasing token (buggy server);
        /// keepalive: processed, reply delivered twice.
        Odd,
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// Time passes. `driven`: the driver wakes at every `poll_timeout()`;
        /// otherwise it is starved and the machine is not told.
        Advance {
            ms: u64,
            driven: bool,
        },
        /// Answer an outstanding request; the server processed it at
        /// `sent + (now - sent) * processed / 255`.
        Reply {
            recent: bool,
            pick: Index,
            outcome: Outcome,
            processed: u8,
        },
        /// A healthy spell: time passes with the driver awake, and every
        /// request sent meanwhile is served and answered `lag_pct`% of
        /// `keepalive_timeout` after it was sent.
        Healthy {
            ms: u64,
            lag_pct: u8,
        },
        /// A request whose reply never comes (processed or not).
        Drop {
            pick: Index,
            processed: bool,
        },
        /// A reply delivered again, late.
        Replay {
            pick: Index,
        },
        Acquire {
            wait: bool,
            until_ms: Option<u64>,
        },
        Release,
        /// The driver says `on_fence` of the latest fenced token returned.
        FenceDelivered,
        /// The driver says no permit is in flight.
        PermitsEnded,
    }

    #[derive(Copy, Clone, Debug)]
    enum Kind {
        Grant { ttl: Duration },
        Lock { lease: LeaseId },
        Keepalive { lease: LeaseId },
    }

    #[derive(Copy, Clone, Debug)]
    struct Request {
        req: ReqId,
        kind: Kind,
        sent: Instant,
    }

    struct ServerLease {
        ttl: Duration,
        /// The latest expiry of any accepted grant / keepalive: processing
        /// time + ttl.
        expiry: Instant,
        revoked: bool,
        /// Send time of the latest grant or keepalive of this lease.
        last_sent: Instant,
    }

    #[derive(Default)]
    struct TokenRecord {
        fences: u32,
        released: bool,
        lease: Option<LeaseId>,
        /// The driver said on_fence returned.
        delivered: bool,
        /// The driver said no permit was in flight, after the lock left
        /// Holding for this token's drain or fence.
        ended: bool,
    }

    struct World {
        m: Holder,
        opts: Options,
        now: Instant,
        // The service.
        leases: HashMap<LeaseId, ServerLease>,
        next_lease: LeaseId,
        last_issued: u64,
        outstanding: Vec<Request>,
        delivered: Vec<Event>,
        // What the machine said.
        state: State,
        last_acquired: Option<Token>,
        tokens: BTreeMap<Token, TokenRecord>,
        /// Tokens fenced, latest last.
        fenced: Vec<Token>,
        /// The driver said no permit was in flight since the lock last left
        /// Holding.
        quiet: bool,
        /// A drain or fence began and no `drained` was reported for it.
        left_holding: bool,
    }

    type R = Result<(), TestCaseError>;

    impl World {
        fn new(opts: Options, start: Instant) -> World {
            World {
                m: Holder::new(opts.clone()),
                opts,
                now: start,
                leases: HashMap::new(),
                next_lease: 1,
                last_issued: 0,
                outstanding: Vec::new(),
                delivered: Vec::new(),
                state: State::Idle,
                last_acquired: None,
                tokens: BTreeMap::new(),
                fenced: Vec::new(),
                quiet: false,
                left_holding: false,
            }
        }

        fn alive(&self, lease: LeaseId, t: Instant) -> bool {
            self.leases
                .get(&lease)
                .is_some_and(|l| !l.revoked && t < l.expiry)
        }

        /// The server accepts a keepalive processed at `p`.
        fn accept_keepalive(&mut self, lease: LeaseId, p: Instant) -> Option<Duration> {
            if !self.alive(lease, p) {
                return None;
            }
            let l = self.leases.get_mut(&lease).expect("alive");
            l.expiry = l.expiry.max(p + l.ttl);
            Some(l.ttl)
        }

        fn new_lease(&mut self, ttl: Duration, p: Instant, sent: Instant) -> LeaseId {
            let id = self.next_lease;
            self.next_lease += 1;
            self.leases.insert(
                id,
                ServerLease {
                    ttl,
                    expiry: p + ttl,
                    revoked: ttl.is_zero(),
                    last_sent: sent,
                },
            );
            id
        }

        /// Feeds one event and checks everything.
        fn handle(&mut self, ev: Event) -> R {
            let before = self.m.token();
            let due = self.m.deadline().is_some_and(|d| d <= self.now);
            // The driver's own reports (on_fence returned, no permit in
            // flight) are facts of this process, not replies to replay.
            let replayable = !matches!(
                ev,
                Event::LeaseGranted { .. }
                    | Event::Acquire { .. }
                    | Event::Release
                    | Event::Timer
                    | Event::FenceDelivered { .. }
                    | Event::PermitsEnded
            );
            if replayable {
                self.delivered.push(ev.clone());
                if self.delivered.len() > 16 {
                    self.delivered.remove(0);
                }
            }
            let release = ev == Event::Release;
            self.m.handle(self.now, ev);
            self.drain()?;
            if let Some(t) = before.filter(|_| release) {
                // Released, unless a due timer fenced it first.
                let rec = self.tokens.get_mut(&t).expect("held token was acquired");
                if rec.fences == 0 {
                    rec.released = true;
                } else {
                    prop_assert!(due, "token {} fenced by a release", t);
                }
            }
            let now = self.now;
            prop_assert_eq!(self.state, self.m.state());
            if let Some(t) = self.m.poll_timeout() {
                prop_assert!(t > now, "poll_timeout {:?} not after now {:?}", t, now);
            }
            if matches!(self.m.state(), State::Holding | State::Draining) {
                prop_assert!(
                    self.m.deadline().is_some_and(|d| d > now),
                    "{:?} past its deadline {:?} at {:?}",
                    self.m.state(),
                    self.m.deadline(),
                    now
                );
                prop_assert!(self.m.token().is_some());
            }
            self.check()
        }

        fn drain(&mut self) -> R {
            let mut prev = None;
            while let Some(a) = self.m.poll_action() {
                match a.clone() {
                    Action::Transition(c) => {
                        prop_assert_eq!(c.from, self.state, "transition {}", c);
                        self.state = c.to;
                        if c.from == State::Holding {
                            self.quiet = false;
                            self.left_holding = matches!(c.to, State::Draining | State::Fenced);
                        }
                        if c.to == State::Holding {
                            self.left_holding = false;
                        }
                    }
                    Action::Grant { req, ttl } => self.push(req, Kind::Grant { ttl }),
                    Action::Lock { req, lease, .. } => self.push(req, Kind::Lock { lease }),
                    Action::Keepalive { req, lease } => {
                        prop_assert!(self.leases.contains_key(&lease));
                        self.leases.get_mut(&lease).expect("known").last_sent = self.now;
                        self.push(req, Kind::Keepalive { lease })
                    }
                    Action::Revoke { lease } => {
                        // A fenced token's lease goes only once on_fence
                        // returned and no permit is in flight, or once the
                        // lease has run out anyway (send time + TTL).
                        let now = self.now;
                        let bound = self
                            .leases
                            .get(&lease)
                            .map(|l| l.last_sent + l.ttl)
                            .unwrap_or(now);
                        for (t, rec) in &self.tokens {
                            if rec.lease == Some(lease) && rec.fences == 1 && !rec.released {
                                prop_assert!(
                                    (rec.delivered && rec.ended) || now >= bound,
                                    "lease of fenced {} revoked at {:?} before on_fence returned ({}) and permits ended ({}), bound {:?}",
                                    t,
                                    now,
                                    rec.delivered,
                                    rec.ended,
                                    bound
                                );
                            }
                        }
                        if let Some(l) = self.leases.get_mut(&lease) {
                            l.revoked = true;
                        }
                        prop_assert_ne!(self.m.lease(), Some(lease), "revoked its own lease");
                    }
                    Action::Fence { token } => {
                        prop_assert!(
                            matches!(
                                prev,
                                Some(Action::Transition(StateChange {
                                    to: State::Fenced,
                                    reason: Reason::Deadline | Reason::LeaseLost,
                                    ..
                                }))
                            ),
                            "fence of {} after {:?}",
                            token,
                            prev
                        );
                        prop_assert_ne!(self.m.token(), Some(token));
                        let rec = self.tokens.get_mut(&token);
                        prop_assert!(rec.is_some(), "fence of {} never acquired", token);
                        let rec = rec.unwrap();
                        prop_assert!(!rec.released, "fence of released {}", token);
                        prop_assert_eq!(rec.fences, 0, "second fence of {}", token);
                        rec.fences += 1;
                        rec.ended = self.quiet;
                        self.fenced.push(token);
                    }
                    Action::Acquired { token } => {
                        prop_assert!(
                            self.last_acquired.is_none_or(|last| token > last),
                            "token {} after {:?}",
                            token,
                            self.last_acquired
                        );
                        self.last_acquired = Some(token);
                        self.tokens.insert(
                            token,
                            TokenRecord {
                                lease: self.m.lease(),
                                ..TokenRecord::default()
                            },
                        );
                    }
                    Action::AcquireFailed { .. } | Action::AcquireRefused { .. } => {}
                    Action::Drained => {
                        // Reported for a drain or fence begun earlier; a
                        // return to Holding cancels it.
                        prop_assert!(self.state != State::Holding, "drained while holding");
                        prop_assert!(self.left_holding, "drained without a drain or fence");
                        self.left_holding = false;
                    }
                }
                prev = Some(a);
            }
            Ok(())
        }

        fn push(&mut self, req: ReqId, kind: Kind) {
            self.outstanding.push(Request {
                req,
                kind,
                sent: self.now,
            });
            if self.outstanding.len() > 32 {
                self.outstanding.remove(0);
            }
        }

        /// Checks that hold at any instant, told or not.
        fn check(&self) -> R {
            let now = self.now;
            let m = &self.m;
            // The deadline is never later than the server's expiry - margin.
            if let Some(d) = m.deadline() {
                let lease = m.lease();
                prop_assert!(lease.is_some(), "a deadline without a lease");
                let l = &self.leases[&lease.unwrap()];
                prop_assert!(
                    d + self.opts.margin <= l.expiry,
                    "deadline {:?} + margin {:?} later than server expiry {:?}",
                    d,
                    self.opts.margin,
                    l.expiry
                );
            }
            // permit(): only while Holding and before the deadline.
            let should = m.state() == State::Holding && m.deadline().is_some_and(|d| now < d);
            match m.permit(now) {
                Ok((token, d)) => {
                    prop_assert!(should, "permit in {:?} at {:?}", m.state(), now);
                    prop_assert!(now < d);
                    prop_assert_eq!(Some(d), m.deadline());
                    prop_assert_eq!(Some(token), m.token());
                    prop_assert!(self.alive(m.lease().unwrap(), now));
                }
                Err(_) => prop_assert!(!should, "refused in Holding at {:?}", now),
            }
            if let Some(d) = m.deadline() {
                prop_assert!(m.permit(d).is_err());
                prop_assert!(m.permit(d + Duration::from_secs(3600)).is_err());
            }
            // Fence exactly once per token lost without release.
            for (t, rec) in &self.tokens {
                if rec.released || m.token() == Some(*t) {
                    prop_assert_eq!(rec.fences, 0, "token {}", t);
                } else {
                    prop_assert_eq!(rec.fences, 1, "token {} lost without one fence", t);
                }
            }
            Ok(())
        }

        fn advance(&mut self, ms: u64, driven: bool) -> R {
            let end = self.now + Duration::from_millis(ms);
            if driven {
                let mut n = 0;
                while let Some(t) = self.m.poll_timeout().filter(|&t| t <= end) {
                    n += 1;
                    prop_assert!(n < 100_000, "timer loop makes no progress");
                    self.now = t;
                    self.handle(Event::Timer)?;
                }
                if matches!(self.m.state(), State::Holding | State::Draining) {
                    // The deadline is among the timers: no fence is late.
                    prop_assert!(self.m.deadline().is_some_and(|d| d > end));
                }
            }
            self.now = end;
            self.check()
        }

        fn healthy(&mut self, ms: u64, lag_pct: u8) -> R {
            let start = self.now;
            let end = start + Duration::from_millis(ms);
            let lag = self.opts.keepalive_timeout * u32::from(lag_pct % 100) / 100;
            let mut n = 0;
            loop {
                n += 1;
                prop_assert!(n < 100_000, "healthy spell makes no progress");
                let reply = self
                    .outstanding
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.sent >= start)
                    .map(|(i, r)| (r.sent + lag, i))
                    .min();
                let timer = self.m.poll_timeout().filter(|&t| t <= end);
                match reply {
                    Some((t, i)) if t <= end && timer.is_none_or(|tm| t <= tm) => {
                        self.now = self.now.max(t);
                        let r = self.outstanding.remove(i);
                        self.reply(r, Outcome::Ok, 128)?;
                    }
                    _ => match timer {
                        Some(t) => {
                            self.now = t;
                            self.handle(Event::Timer)?;
                        }
                        None => break,
                    },
                }
            }
            if matches!(self.m.state(), State::Holding | State::Draining) {
                prop_assert!(self.m.deadline().is_some_and(|d| d > end));
            }
            self.now = end;
            self.check()
        }

        fn take(&mut self, recent: bool, pick: Index) -> Option<Request> {
            let n = self.outstanding.len();
            if n == 0 {
                return None;
            }
            let i = if recent {
                n - 1 - pick.index(n.min(3))
            } else {
                pick.index(n)
            };
            Some(self.outstanding.remove(i))
        }

        fn reply(&mut self, r: Request, outcome: Outcome, processed: u8) -> R {
            let span = (self.now - r.sent).as_nanos() as u64;
            let p = r.sent + Duration::from_nanos(span / 255 * u64::from(processed));
            let req = r.req;
            match r.kind {
                Kind::Grant { ttl } => match outcome {
                    Outcome::Ok | Outcome::Odd => {
                        let ttl = match (outcome, processed % 4) {
                            (Outcome::Ok, _) => ttl,
                            (_, 0) => Duration::ZERO,
                            (_, k) => ttl * u32::from(k) / 2,
                        };
                        let lease = self.new_lease(ttl, p, r.sent);
                        self.handle(Event::LeaseGranted { req, lease, ttl })
                    }
                    _ => self.handle(Event::GrantFailed { req }),
                },
                Kind::Lock { lease } => match outcome {
                    Outcome::Ok | Outcome::Odd if self.alive(lease, p) => {
                        let token = if matches!(outcome, Outcome::Odd) && self.last_issued > 0 {
                            Token(self.last_issued - u64::from(processed % 3).min(self.last_issued))
                        } else {
                            self.last_issued += 1;
                            Token(self.last_issued)
                        };
                        self.handle(Event::Locked { req, lease, token })
                    }
                    Outcome::Ok | Outcome::Odd | Outcome::Lost => {
                        if let Some(l) = self.leases.get_mut(&lease) {
                            l.revoked = true;
                        }
                        self.handle(Event::LeaseLost { lease })
                    }
                    Outcome::Busy => self.handle(Event::LockFailed { req, busy: true }),
                    Outcome::Fail => self.handle(Event::LockFailed { req, busy: false }),
                },
                Kind::Keepalive { lease } => match outcome {
                    Outcome::Ok | Outcome::Odd => match self.accept_keepalive(lease, p) {
                        Some(ttl) => {
                            self.handle(Event::KeepaliveConfirmed { req, ttl })?;
                            if matches!(outcome, Outcome::Odd) {
                                self.handle(Event::KeepaliveConfirmed { req, ttl })?;
                            }
                            Ok(())
                        }
                        None if processed % 2 == 0 => self.handle(Event::KeepaliveConfirmed {
                            req,
                            ttl: Duration::ZERO,
                        }),
                        None => self.handle(Event::LeaseLost { lease }),
                    },
                    Outcome::Fail => self.handle(Event::KeepaliveFailed { req }),
                    Outcome::Lost => {
                        if let Some(l) = self.leases.get_mut(&lease) {
                            l.revoked = true;
                        }
                        self.handle(Event::LeaseLost { lease })
                    }
                    Outcome::Busy => {
                        self.accept_keepalive(lease, p);
                        self.handle(Event::KeepaliveFailed { req })
                    }
                },
            }
        }

        fn drop_request(&mut self, r: Request, processed: bool) {
            if !processed {
                return;
            }
            match r.kind {
                Kind::Grant { ttl } => {
                    // An orphan lease the holder never hears of.
                    self.new_lease(ttl, r.sent, r.sent);
                }
                Kind::Lock { lease } => {
                    if self.alive(lease, r.sent) {
                        self.last_issued += 1;
                    }
                }
                Kind::Keepalive { lease } => {
                    self.accept_keepalive(lease, r.sent);
                }
            }
        }

        fn step(&mut self, op: Op) -> R {
            match op {
                Op::Advance { ms, driven } => self.advance(ms, driven),
                Op::Healthy { ms, lag_pct } => self.healthy(ms, lag_pct),
                Op::Reply {
                    recent,
                    pick,
                    outcome,
                    processed,
                } => match self.take(recent, pick) {
                    Some(r) => self.reply(r, outcome, processed),
                    None => self.check(),
                },
                Op::Drop { pick, processed } => {
                    if let Some(r) = self.take(false, pick) {
                        self.drop_request(r, processed);
                    }
                    self.check()
                }
                Op::Replay { pick } => {
                    if self.delivered.is_empty() {
                        return self.check();
                    }
                    let ev = self.delivered[pick.index(self.delivered.len())].clone();
                    self.handle(ev)
                }
                Op::Acquire { wait, until_ms } => {
                    let until = until_ms.map(|d| self.now + Duration::from_millis(d));
                    self.handle(Event::Acquire { wait, until })
                }
                Op::Release => self.handle(Event::Release),
                Op::FenceDelivered => match self.fenced.last().copied() {
                    Some(token) => {
                        self.tokens.get_mut(&token).expect("fenced").delivered = true;
                        self.handle(Event::FenceDelivered { token })
                    }
                    None => self.check(),
                },
                Op::PermitsEnded => {
                    if !self.m.watching_permits() {
                        return self.check();
                    }
                    for t in &self.fenced {
                        self.tokens.get_mut(t).expect("fenced").ended = true;
                    }
                    if self.m.state() != State::Holding {
                        self.quiet = true;
                    }
                    self.handle(Event::PermitsEnded)
                }
            }
        }
    }

    fn options() -> impl Strategy<Value = Options> {
        (
            200u64..3000,
            5u64..100,
            50u64..1000,
            0u64..2000,
            1u64..4000,
            any::<bool>(),
        )
            .prop_map(
                |(interval, timeout_pct, retry, margin, extra, reacquire)| Options {
                    ttl: ms((interval + margin + extra).max(2000)),
                    keepalive_interval: ms(interval),
                    keepalive_timeout: ms((interval * timeout_pct / 100).max(1)),
                    retry_interval: ms(retry),
                    margin: ms(margin),
                    reacquire,
                },
            )
    }

    fn outcome() -> impl Strategy<Value = Outcome> {
        prop_oneof![
            8 => Just(Outcome::Ok),
            2 => Just(Outcome::Fail),
            1 => Just(Outcome::Lost),
            1 => Just(Outcome::Busy),
            1 => Just(Outcome::Odd),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        let advance = |lo: u64, hi: u64| {
            (lo..hi, proptest::bool::weighted(0.85))
                .prop_map(|(ms, driven)| Op::Advance { ms, driven })
        };
        let reply = (
            proptest::bool::weighted(0.8),
            any::<Index>(),
            outcome(),
            any::<u8>(),
        )
            .prop_map(|(recent, pick, outcome, processed)| Op::Reply {
                recent,
                pick,
                outcome,
                processed,
            });
        prop_oneof![
            16 => advance(0, 200),
            4 => advance(200, 3000),
            2 => advance(3000, 30_000),
            4 => (0u64..5000, any::<u8>())
                .prop_map(|(ms, lag_pct)| Op::Healthy { ms, lag_pct }),
            40 => reply,
            2 => (any::<Index>(), any::<bool>())
                .prop_map(|(pick, processed)| Op::Drop { pick, processed }),
            2 => any::<Index>().prop_map(|pick| Op::Replay { pick }),
            6 => (proptest::bool::weighted(0.7), proptest::option::of(0u64..10_000))
                .prop_map(|(wait, until_ms)| Op::Acquire { wait, until_ms }),
            1 => Just(Op::Release),
            3 => Just(Op::FenceDelivered),
            3 => Just(Op::PermitsEnded),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: cases(),
            ..ProptestConfig::default()
        })]

        #[test]
        fn holder_never_outlives_the_server(
            opts in options(),
            start_ms in 1u64..1_000_000,
            first_wait in proptest::bool::weighted(0.8),
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            prop_assert!(opts.validate().is_ok(), "{:?}", opts);
            let mut w = World::new(opts, at(start_ms));
            w.handle(Event::Acquire { wait: first_wait, until: None })?;
            for op in ops {
                w.step(op)?;
            }
        }
    }
}
