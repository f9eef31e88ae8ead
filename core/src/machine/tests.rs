//! Tests of the session state machine against docs/design.md §2–§12.
//!
//! Unit tests drive every transition on hand-made instants (no sleeping, no
//! real clock): first the rules of one lock on its session, then the rules
//! of many locks sharing one lease. The property tests run random operation
//! sequences over a few locks of one session and a contender against a
//! small model of the lock service, and check the safety rules after every
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

/// The locks of the tests: `A` ("a"), `B` ("b"), `C` ("c"); `D` is added
/// where a test needs a fourth.
const A: LockId = 1;
const B: LockId = 2;
const C: LockId = 3;
const D: LockId = 4;

const LEASE: LeaseId = 7;

/// A service error's text.
const DOWN: &str = "down";
const TOKEN: Token = Token(100);

fn tr(lock: LockId, from: State, to: State, reason: Reason) -> Action {
    Action::Transition {
        lock,
        change: StateChange { from, to, reason },
    }
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

fn grants(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Grant { .. }))
        .count()
}

/// The lock requests among `actions`, in order, as `(lock, req)`.
fn lock_reqs(actions: &[Action]) -> Vec<(LockId, ReqId)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Lock { req, lock, .. } => Some((*lock, *req)),
            _ => None,
        })
        .collect()
}

/// The one lock request of `lock` among `actions`.
fn lock_req(actions: &[Action], lock: LockId) -> ReqId {
    let reqs: Vec<ReqId> = lock_reqs(actions)
        .into_iter()
        .filter(|(l, _)| *l == lock)
        .map(|(_, r)| r)
        .collect();
    assert_eq!(reqs.len(), 1, "expected one Lock of {lock} in {actions:?}");
    reqs[0]
}

/// The one unlock request of `lock` among `actions`, with its token.
fn unlock_req(actions: &[Action], lock: LockId) -> (ReqId, Option<Token>) {
    let reqs: Vec<(ReqId, Option<Token>)> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Unlock {
                req,
                lock: l,
                token,
                ..
            } if *l == lock => Some((*req, *token)),
            _ => None,
        })
        .collect();
    assert_eq!(
        reqs.len(),
        1,
        "expected one Unlock of {lock} in {actions:?}"
    );
    reqs[0]
}

fn unlocks(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Unlock { .. }))
        .count()
}

fn revokes(actions: &[Action]) -> Vec<LeaseId> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Revoke { lease } => Some(*lease),
            _ => None,
        })
        .collect()
}

/// The fences among `actions`, in order, as `(lock, token)`.
fn fence_list(actions: &[Action]) -> Vec<(LockId, Token)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Fence { lock, token } => Some((*lock, *token)),
            _ => None,
        })
        .collect()
}

/// The actions without their instants.
fn untimed(actions: &[(Instant, Action)]) -> Vec<Action> {
    actions.iter().map(|(_, a)| a.clone()).collect()
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

/// A session machine plus a tiny driver: feeds events at given instants,
/// runs the timer loop the way the real driver does, and checks after every
/// `handle` that no timer is left due (no busy loop), that each lock's
/// transitions chain, that a fence follows its lock's transition to
/// `Fenced` and an acquisition its lock's transition to `Holding`.
struct Sim {
    m: Holder,
    now: Instant,
    states: BTreeMap<LockId, State>,
    wakeups: usize,
    /// Show every output: the answers to calls (`ReleaseDone`,
    /// `CloseDone`), abandoned calls and tries again of a delete. Off, the
    /// tests of the lock rules see the requests and notices they are about,
    /// and every revoke is answered at once.
    all: bool,
    /// Deletes sent: a try again shows only with `all`.
    deletes: std::collections::HashSet<ReqId>,
}

impl Sim {
    /// A session with lock [`A`] ("a").
    fn new(opts: Options) -> Sim {
        Sim::with_locks(opts, &[(A, "a")])
    }

    fn with_locks(opts: Options, locks: &[(LockId, &str)]) -> Sim {
        let mut s = Sim {
            m: Holder::new(opts),
            now: Instant::ZERO,
            states: BTreeMap::new(),
            wakeups: 0,
            all: false,
            deletes: std::collections::HashSet::new(),
        };
        for (id, name) in locks {
            s.add(*id, name);
        }
        s
    }

    fn add(&mut self, id: LockId, name: &str) {
        self.m.add_lock(id, name);
        self.states.insert(id, State::Idle);
    }

    fn handle_at(&mut self, now: Instant, ev: Event) -> Vec<Action> {
        assert!(now >= self.now, "time went backwards");
        self.now = now;
        self.m.handle(now, ev);
        let mut out: Vec<Action> = Vec::new();
        let mut revoked = Vec::new();
        while let Some(a) = self.m.poll_action().or_else(|| {
            while let Some(lease) = revoked.pop() {
                self.m.handle(now, Event::Revoked { lease });
                if let Some(a) = self.m.poll_action() {
                    return Some(a);
                }
            }
            None
        }) {
            if !self.all {
                match &a {
                    Action::Revoke { lease } => revoked.push(*lease),
                    Action::ReleaseDone { .. }
                    | Action::CloseDone { .. }
                    | Action::Abandon { .. } => continue,
                    Action::Unlock { req, .. } if !self.deletes.insert(*req) => continue,
                    _ => {}
                }
            }
            match &a {
                Action::Transition { lock, change } => {
                    let st = self.states.get_mut(lock).expect("a lock of the test");
                    assert_eq!(
                        change.from, *st,
                        "transition {change} of {lock} does not start where it is"
                    );
                    *st = change.to;
                }
                Action::Fence { lock, .. } => assert!(
                    matches!(
                        out.last(),
                        Some(Action::Transition { lock: l, change }) if l == lock && change.to == State::Fenced
                    ),
                    "fence of {lock} after {:?}",
                    out.last()
                ),
                Action::Acquired { lock, token } => {
                    assert!(
                        matches!(
                            out.last(),
                            Some(Action::Transition { lock: l, change }) if l == lock && change.to == State::Holding
                        ),
                        "acquired of {lock} after {:?}",
                        out.last()
                    );
                    assert_eq!(self.m.token(*lock), Some(*token));
                }
                Action::Lock { lease, .. }
                | Action::Unlock { lease, .. }
                | Action::Keepalive { lease, .. } => {
                    assert_eq!(self.m.lease(), Some(*lease), "{a:?} not under the lease");
                }
                _ => {}
            }
            out.push(a);
        }
        for (id, st) in &self.states {
            assert_eq!(*st, self.m.state(*id), "state of {id}");
            if matches!(st, State::Holding | State::Draining) {
                assert!(self.m.deadline().is_some_and(|d| d > now));
                assert!(self.m.token(*id).is_some());
            }
        }
        if let Some(t) = self.m.poll_timeout() {
            assert!(
                t > now,
                "poll_timeout {t:?} is not after now {now:?}: busy loop"
            );
        }
        out
    }

    /// Feeds `ev` at `t` ms.
    fn ev(&mut self, t: u64, ev: Event) -> Vec<Action> {
        self.handle_at(at(t), ev)
    }

    /// Asks for `lock`, waiting its turn, with no timeout, at `t` ms.
    fn acquire(&mut self, t: u64, lock: LockId) -> Vec<Action> {
        self.ev(
            t,
            Event::Acquire {
                lock,
                wait: true,
                until: None,
            },
        )
    }

    /// The lease `lease` granted with TTL 4 s at `t` ms.
    fn granted(&mut self, t: u64, req: ReqId, lease: LeaseId) -> Vec<Action> {
        self.ev(
            t,
            Event::LeaseGranted {
                req,
                lease,
                ttl: ms(4000),
            },
        )
    }

    /// `lock` granted with `token` at `t` ms.
    fn locked(
        &mut self,
        t: u64,
        req: ReqId,
        lock: LockId,
        lease: LeaseId,
        token: Token,
    ) -> Vec<Action> {
        self.ev(
            t,
            Event::Locked {
                req,
                lock,
                lease,
                token,
            },
        )
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
        if self
            .states
            .values()
            .any(|s| matches!(s, State::Holding | State::Draining))
        {
            // poll_timeout() includes the deadline: a driver that woke at
            // every timer fenced in time.
            assert!(self.m.deadline().is_some_and(|d| d > end));
        }
        self.now = self.now.max(end);
        out
    }
}

/// Lock [`A`] acquired at 1000 ms (grant sent then), lease granted at 1100
/// ms, locked at 1200 ms with [`TOKEN`]: deadline 1000 + 4000 - 1000 = 4000
/// ms, first keepalive due at 2000 ms.
fn holding_with(opts: Options) -> Sim {
    let mut s = Sim::new(opts);
    let a = s.acquire(1000, A);
    let g = grant_req(&a);
    let a = s.granted(1100, g, LEASE);
    let l = lock_req(&a, A);
    s.locked(1200, l, A, LEASE, TOKEN);
    assert_eq!(s.m.state(A), State::Holding);
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
        vec![tr(
            A,
            State::Holding,
            State::Draining,
            Reason::KeepaliveFailed
        )]
    );
    s
}

/// Like [`draining`], with other options.
fn draining_with(o: Options) -> Sim {
    let mut s = holding_with(o);
    let k = keepalives(&s.run_to(2000));
    s.ev(2100, Event::KeepaliveFailed { req: k[0].1 });
    assert_eq!(s.m.state(A), State::Draining);
    s
}

/// The actions of a session fence of [`TOKEN`] (lock [`A`]) under
/// [`LEASE`] followed by reacquisition (with the grant's request id taken
/// from `actions`). The fenced lease's revoke is held back (see the
/// ordering tests).
fn fence_and_reacquire(from: State, reason: Reason, actions: &[Action]) -> Vec<Action> {
    vec![
        tr(A, from, State::Fenced, reason),
        Action::Fence {
            lock: A,
            token: TOKEN,
        },
        tr(A, State::Fenced, State::Reacquiring, Reason::Reacquire),
        Action::Deadline,
        Action::Grant {
            req: grant_req(actions),
            ttl: ms(4000),
        },
    ]
}

/// The tokens [`session`] holds.
const TOKENS: [(LockId, Token); 3] = [(A, Token(100)), (B, Token(200)), (C, Token(300))];

/// Locks [`A`], [`B`], [`C`] ("a", "b", "c") asked for together at 1000 ms
/// (one grant), lease [`LEASE`] granted at 1100 ms, each locked at 1200 ms
/// with its token of [`TOKENS`]: deadline 4000 ms, first keepalive at 2000
/// ms.
fn session_with(opts: Options) -> Sim {
    let mut s = Sim::with_locks(opts, &[(A, "a"), (B, "b"), (C, "c")]);
    let a = s.acquire(1000, A);
    let g = grant_req(&a);
    // The others wait for the same grant.
    assert_eq!(
        s.acquire(1000, B),
        vec![tr(B, State::Idle, State::Acquiring, Reason::Acquire)]
    );
    assert_eq!(
        s.acquire(1000, C),
        vec![tr(C, State::Idle, State::Acquiring, Reason::Acquire)]
    );
    let a = s.granted(1100, g, LEASE);
    let reqs = lock_reqs(&a);
    assert_eq!(
        reqs.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![A, B, C],
        "{a:?}"
    );
    for ((lock, req), (l, token)) in reqs.into_iter().zip(TOKENS) {
        assert_eq!(lock, l);
        let a = s.locked(1200, req, lock, LEASE, token);
        assert_eq!(
            a,
            vec![
                tr(lock, State::Acquiring, State::Holding, Reason::Acquired),
                Action::Acquired { lock, token },
            ]
        );
    }
    assert_eq!(s.m.deadline(), Some(at(4000)));
    s
}

fn session() -> Sim {
    session_with(opts())
}

/// [`session`], then the first keepalive (sent at 2000 ms) fails at 2100
/// ms: every lock drains.
fn session_draining() -> Sim {
    let mut s = session();
    let k = keepalives(&s.run_to(2000));
    assert_eq!(k.len(), 1);
    let a = s.ev(2100, Event::KeepaliveFailed { req: k[0].1 });
    assert_eq!(
        a,
        [A, B, C]
            .map(|l| tr(l, State::Holding, State::Draining, Reason::KeepaliveFailed))
            .to_vec()
    );
    s
}

// ---------------------------------------------------------------- acquiring

#[test]
fn idle_acquire_sends_grant() {
    let mut s = Sim::new(opts());
    assert_eq!(s.m.state(A), State::Idle);
    assert_eq!(s.m.poll_timeout(), None);
    assert_eq!(s.m.permit(A, at(0)), Err(Refused::NotHeld));
    let a = s.acquire(1000, A);
    let g = grant_req(&a);
    assert_eq!(
        a,
        vec![
            tr(A, State::Idle, State::Acquiring, Reason::Acquire),
            Action::Grant {
                req: g,
                ttl: ms(4000)
            },
        ]
    );
    assert_eq!(s.m.permit(A, at(1000)), Err(Refused::NotHeld));
    // The grant request times out after keepalive_timeout.
    assert_eq!(s.m.poll_timeout(), Some(at(1500)));
}

#[test]
fn grant_reply_sends_lock_and_locked_holds() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    // The reply arrives 300 ms after the request was sent.
    let a = s.granted(1300, g, LEASE);
    let l = lock_req(&a, A);
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            Action::Lock {
                req: l,
                lock: A,
                lease: LEASE,
                wait: true
            }
        ]
    );
    assert_eq!(s.m.state(A), State::Acquiring);
    assert_eq!(s.m.lease(), Some(LEASE));
    assert_eq!(s.m.permit(A, at(1300)), Err(Refused::NotHeld));
    // First deadline: the grant's *send* time + ttl - margin, not 1300 + 3000.
    assert_eq!(s.m.deadline(), Some(at(4000)));

    let a = s.locked(1800, l, A, LEASE, TOKEN);
    assert_eq!(
        a,
        vec![
            tr(A, State::Acquiring, State::Holding, Reason::Acquired),
            Action::Acquired {
                lock: A,
                token: TOKEN
            },
        ]
    );
    assert_eq!(s.m.token(A), Some(TOKEN));
    assert_eq!(s.m.deadline(), Some(at(4000)));
    assert_eq!(s.m.permit(A, at(1800)), Ok((TOKEN, at(4000))));
    assert_eq!(s.m.permit(A, at(3999)), Ok((TOKEN, at(4000))));
}

#[test]
fn acquire_timeout_in_the_queue_deletes_the_key_and_keeps_the_lease() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: true,
            until: Some(at(2200)),
        },
    ));
    let l = lock_req(&s.granted(1100, g, LEASE), A);
    // The lock request waits behind another holder; the lease is kept alive.
    let a = s.run_to(2000);
    let k = keepalives(&a);
    assert_eq!(k, vec![(at(2000), k[0].1)]);
    assert_eq!(
        s.ev(
            2100,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        ),
        vec![Action::Deadline]
    );
    assert!(s.run_to(2199).is_empty());
    assert_eq!(s.m.state(A), State::Acquiring);
    let a = untimed(&s.run_to(2200));
    let (u, token) = unlock_req(&a, A);
    assert_eq!(token, None, "the token is not known yet");
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: None
            },
            tr(A, State::Acquiring, State::Idle, Reason::AcquireTimeout),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Timeout
            },
        ]
    );
    assert_eq!(s.m.permit(A, at(2200)), Err(Refused::NotHeld));
    // The session lives on: no revoke. The delete's first try is
    // unanswered until 2700, before the next keepalive.
    assert_eq!(s.m.lease(), Some(LEASE));
    assert_eq!(s.m.poll_timeout(), Some(at(2700)));
    // The lock arrives too late: its key is deleted by token, nothing is
    // acquired.
    let a = s.locked(2300, l, A, LEASE, TOKEN);
    assert_eq!(
        a,
        vec![Action::Unlock {
            req: unlock_req(&a, A).0,
            lock: A,
            lease: LEASE,
            token: Some(TOKEN)
        }]
    );
    assert_eq!(s.m.state(A), State::Idle);
    assert_eq!(s.m.token(A), None);
    assert!(s.ev(2400, Event::Unlocked { req: u, lock: A }).is_empty());
    // The key is gone: asked for again, it asks the service at once.
    let a = s.acquire(2500, A);
    assert_eq!(grants(&a), 0);
    lock_req(&a, A);
}

#[test]
fn acquire_timeout_while_grant_retries_is_a_backend_failure() {
    // The service is unreachable: grants time out and are retried until the
    // acquisition gives up.
    let mut s = Sim::new(opts());
    s.ev(
        1000,
        Event::Acquire {
            lock: A,
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
            lock: A,
            error: AcquireError::Backend(None)
        })
    );
    assert_eq!(s.m.state(A), State::Idle);
    // The grant outstanding times out; nobody wants a lease: no retry.
    let a = s.run_to(10_000);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(s.m.poll_timeout(), None);
}

#[test]
fn try_acquire_busy_would_block() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: false,
            until: None,
        },
    ));
    let a = s.granted(1100, g, LEASE);
    let l = lock_req(&a, A);
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            Action::Lock {
                req: l,
                lock: A,
                lease: LEASE,
                wait: false
            }
        ]
    );
    let a = s.ev(
        1200,
        Event::LockFailed {
            req: l,
            lock: A,
            busy: true,
            error: DOWN.into(),
        },
    );
    let (u, _) = unlock_req(&a, A);
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: None
            },
            tr(A, State::Acquiring, State::Idle, Reason::WouldBlock),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::WouldBlock
            },
        ]
    );
    assert_eq!(s.m.permit(A, at(1200)), Err(Refused::NotHeld));
    // The lease is the session's: kept alive, not revoked. The delete's
    // first try is unanswered until 1700, before the next keepalive.
    assert_eq!(s.m.lease(), Some(LEASE));
    assert_eq!(s.m.poll_timeout(), Some(at(1700)));
}

#[test]
fn try_acquire_backend_failure() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: false,
            until: None,
        },
    ));
    let a = s.ev(
        1100,
        Event::GrantFailed {
            req: g,
            error: DOWN.into(),
        },
    );
    assert_eq!(
        a,
        vec![
            tr(A, State::Acquiring, State::Idle, Reason::AcquireFailed),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Backend(Some(DOWN.into()))
            },
        ]
    );
    assert_eq!(s.m.poll_timeout(), None);

    // A lock request that fails on the transport, on a live session.
    let mut s = holding();
    s.add(B, "b");
    let a = s.ev(
        1500,
        Event::Acquire {
            lock: B,
            wait: false,
            until: None,
        },
    );
    let l = lock_req(&a, B);
    let a = s.ev(
        1600,
        Event::LockFailed {
            req: l,
            lock: B,
            busy: false,
            error: DOWN.into(),
        },
    );
    assert_eq!(
        a,
        vec![
            // The request may have put the key.
            Action::Unlock {
                req: unlock_req(&a, B).0,
                lock: B,
                lease: LEASE,
                token: None
            },
            tr(B, State::Acquiring, State::Idle, Reason::AcquireFailed),
            Action::AcquireFailed {
                lock: B,
                error: AcquireError::Backend(Some(DOWN.into()))
            },
        ]
    );
    assert_eq!(s.m.state(A), State::Holding);
}

/// Issue 32, item 6: a lock request the service refuses as too large
/// (etcd: "request is too large") fails a waiting acquisition at once,
/// instead of being asked again until the timeout (or forever).
#[test]
fn a_lock_request_refused_as_too_large_fails_at_once() {
    let mut s = holding();
    s.add(B, "b");
    let a = s.ev(
        1500,
        Event::Acquire {
            lock: B,
            wait: true,
            until: None,
        },
    );
    let l = lock_req(&a, B);
    const BIG: &str = "etcdserver: request is too large";
    let a = s.ev(
        1600,
        Event::LockRefused {
            req: l,
            lock: B,
            error: BIG.into(),
        },
    );
    assert_eq!(
        a,
        vec![
            // The request may have put the key.
            Action::Unlock {
                req: unlock_req(&a, B).0,
                lock: B,
                lease: LEASE,
                token: None
            },
            tr(B, State::Acquiring, State::Idle, Reason::AcquireFailed),
            Action::AcquireFailed {
                lock: B,
                error: AcquireError::Refused(BIG.into())
            },
        ]
    );
    assert_eq!(s.m.state(A), State::Holding);
    let e = crate::Error::from(AcquireError::Refused(BIG.into()));
    assert!(
        matches!(&e, crate::Error::InvalidArgument(m) if m.contains("too large")),
        "{e}"
    );
}

#[test]
fn waiting_acquire_retries_busy_lock_and_failed_grant() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    // A failed grant is retried after retry_interval.
    assert!(
        s.ev(
            1100,
            Event::GrantFailed {
                req: g,
                error: DOWN.into()
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.state(A), State::Acquiring);
    let a = s.run_to(1350);
    assert_eq!(a.len(), 1);
    let g2 = grant_req(&untimed(&a));
    assert_eq!(a[0].0, at(1350));
    let l = lock_req(&s.granted(1400, g2, LEASE), A);
    // Busy while waiting: the lock is asked again, under the same lease.
    assert!(
        s.ev(
            1500,
            Event::LockFailed {
                req: l,
                lock: A,
                busy: true,
                error: DOWN.into()
            }
        )
        .is_empty()
    );
    let a = s.run_to(1750);
    assert_eq!(a.len(), 1);
    let l2 = lock_req(&untimed(&a), A);
    assert_eq!(
        a,
        vec![(
            at(1750),
            Action::Lock {
                req: l2,
                lock: A,
                lease: LEASE,
                wait: true
            }
        )]
    );
    let a = s.locked(1800, l2, A, LEASE, TOKEN);
    assert_eq!(
        a[1],
        Action::Acquired {
            lock: A,
            token: TOKEN
        }
    );
    // The deadline still comes from the grant's send time (1350 ms).
    assert_eq!(s.m.deadline(), Some(at(4350)));
}

#[test]
fn acquire_while_holding_or_draining_is_already_held() {
    let mut s = holding();
    let a = s.acquire(1500, A);
    assert_eq!(
        a,
        vec![Action::AcquireRefused {
            lock: A,
            error: AcquireError::AlreadyHeld
        }]
    );
    assert_eq!(s.m.state(A), State::Holding);
    assert_eq!(s.m.token(A), Some(TOKEN));
    assert_eq!(s.m.deadline(), Some(at(4000)));

    let mut s = draining();
    let a = s.ev(
        2200,
        Event::Acquire {
            lock: A,
            wait: false,
            until: None,
        },
    );
    assert_eq!(
        a,
        vec![Action::AcquireRefused {
            lock: A,
            error: AcquireError::AlreadyHeld
        }]
    );
    assert_eq!(s.m.state(A), State::Draining);
}

#[test]
fn second_acquire_while_acquiring_is_already_held() {
    // One acquire at a time per handle, whatever the backend's speed: the
    // second caller is refused at once, the first goes on unchanged.
    let mut s = Sim::new(opts());
    let a = s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: false,
            until: Some(at(2000)),
        },
    );
    let g = grant_req(&a);
    let a = s.acquire(1100, A);
    assert_eq!(
        a,
        vec![Action::AcquireRefused {
            lock: A,
            error: AcquireError::AlreadyHeld
        }]
    );
    assert_eq!(s.m.state(A), State::Acquiring);
    let a = s.granted(1200, g, LEASE);
    // Still the first caller's try: no wait.
    assert!(
        a.contains(&Action::Lock {
            req: lock_req(&a, A),
            lock: A,
            lease: LEASE,
            wait: false
        }),
        "{a:?}"
    );
}

#[test]
fn stale_grant_reply_is_revoked() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
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
    // A duplicate reply for the lease of the session never revokes it.
    let g2 = grant_req(&untimed(&a));
    s.granted(1800, g2, LEASE);
    let a = s.granted(1850, g2, LEASE);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(s.m.lease(), Some(LEASE));
}

#[test]
fn zero_ttl_grant_is_revoked_and_retried() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
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
fn stale_lock_reply_is_revoked_and_a_duplicate_ignored() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    let l = lock_req(&s.granted(1100, g, 5), A);
    // The lease is lost while the lock is pending: a fresh lease comes,
    // with no fence (no token was held).
    let a = s.ev(1200, Event::LeaseLost { lease: 5 });
    let g2 = grant_req(&a);
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            Action::Revoke { lease: 5 },
            Action::Grant {
                req: g2,
                ttl: ms(4000)
            },
        ]
    );
    assert_eq!(s.m.state(A), State::Acquiring);
    // The old lock request's reply: its lease is revoked, no token taken.
    let a = s.locked(1300, l, A, 5, Token(50));
    assert_eq!(a, vec![Action::Revoke { lease: 5 }]);
    assert_eq!(s.m.state(A), State::Acquiring);
    assert_eq!(s.m.token(A), None);
    // The new lease completes.
    let l2 = lock_req(&s.granted(1400, g2, LEASE), A);
    let a = s.locked(1500, l2, A, LEASE, TOKEN);
    assert_eq!(
        a[1],
        Action::Acquired {
            lock: A,
            token: TOKEN
        }
    );
    assert_eq!(s.m.deadline(), Some(at(4200)));
    // A duplicate reply to the lock request that made us hold is ignored:
    // neither its lease revoked nor its key deleted.
    let a = s.locked(1600, l2, A, LEASE, TOKEN);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(s.m.state(A), State::Holding);
    assert_eq!(s.m.permit(A, at(1600)), Ok((TOKEN, at(4200))));
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
    assert_eq!(
        s.ev(
            2300,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        ),
        vec![Action::Deadline]
    );
    assert_eq!(s.m.deadline(), Some(at(5000)));
    assert_eq!(s.m.permit(A, at(4999)), Ok((TOKEN, at(5000))));
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
        assert_eq!(
            s.ev(reply, Event::KeepaliveConfirmed { req, ttl: ms(4000) }),
            vec![Action::Deadline]
        );
        assert_eq!(s.m.deadline(), Some(t + ms(3000)));
        let k = keepalives(&s.run_to(4000 + 1000 * i));
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].0, at(4000 + 1000 * i));
        sent.push(k[0]);
    }
    assert_eq!(s.m.state(A), State::Holding);
}

#[test]
fn late_reply_within_timeout_uses_its_own_send_time() {
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    // 499 ms after sending: still within keepalive_timeout.
    assert_eq!(
        s.ev(
            2499,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        ),
        vec![Action::Deadline]
    );
    assert_eq!(s.m.deadline(), Some(at(5000)), "not 2499 + 3000");
    assert_eq!(s.m.state(A), State::Holding);
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
        .is_empty(),
        "the deadline did not move"
    );
    assert_eq!(s.m.deadline(), Some(at(4000)));
    // A longer grant extends it, from the send time.
    let k = keepalives(&s.run_to(3000));
    assert_eq!(
        s.ev(
            3100,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(10_000),
            },
        ),
        vec![Action::Deadline]
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
    let resumed = vec![
        Action::Deadline,
        tr(A, State::Draining, State::Holding, Reason::Resumed),
    ];

    // r1's reply arrives after r2 was sent: it uses r1's send time.
    let a = s.ev(
        2700,
        Event::KeepaliveConfirmed {
            req: r1,
            ttl: ms(4000),
        },
    );
    assert_eq!(a, resumed);
    assert_eq!(s.m.deadline(), Some(at(5350)), "not r2's 2600 + 3000");
    // Then r2's reply: its own send time.
    assert_eq!(
        s.ev(
            2800,
            Event::KeepaliveConfirmed {
                req: r2,
                ttl: ms(4000)
            }
        ),
        vec![Action::Deadline]
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
    assert_eq!(a, resumed);
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
    assert_eq!(s.m.permit(A, at(2499)), Ok((TOKEN, at(4000))));
    let a = s.run_to(2500);
    assert_eq!(
        a,
        vec![(
            at(2500),
            tr(A, State::Holding, State::Draining, Reason::KeepaliveTimeout)
        )]
    );
    assert_eq!(s.m.permit(A, at(2500)), Err(Refused::Draining));
    assert_eq!(s.m.deadline(), Some(at(4000)));
    // First retry one retry_interval after the failure.
    assert_eq!(s.m.poll_timeout(), Some(at(2750)));
}

#[test]
fn transport_failure_drains() {
    let s = draining();
    assert_eq!(s.m.permit(A, at(2100)), Err(Refused::Draining));
    assert_eq!(s.m.token(A), Some(TOKEN));
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
    assert_eq!(s.m.state(A), State::Holding);
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
    assert_eq!(s.m.state(A), State::Draining);
    assert_eq!(s.m.permit(A, at(3999)), Err(Refused::Draining));
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
        vec![
            Action::Deadline,
            tr(A, State::Draining, State::Holding, Reason::Resumed)
        ]
    );
    assert_eq!(s.m.deadline(), Some(at(5350)));
    assert_eq!(s.m.permit(A, at(2400)), Ok((TOKEN, at(5350))));
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
        vec![
            Action::Deadline,
            tr(A, State::Draining, State::Holding, Reason::Resumed)
        ]
    );
    // The older retry would time out at 2850: superseded, it drains nothing.
    let a = s.run_to(3000);
    assert!(
        a.iter()
            .all(|(_, a)| !matches!(a, Action::Transition { .. })),
        "{a:?}"
    );
    assert_eq!(s.m.state(A), State::Holding);
    // And its late reply is ignored.
    assert!(
        s.ev(
            3000,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000),
            },
        )
        .is_empty()
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
            tr(A, State::Holding, State::Draining, Reason::KeepaliveTimeout)
        )]
    );
    assert_eq!(s.m.permit(A, at(3999)), Err(Refused::Draining));
    let a = untimed(&s.run_to(4000));
    assert_eq!(
        a,
        fence_and_reacquire(State::Draining, Reason::Deadline, &a)
    );
    assert_eq!(s.m.permit(A, at(4000)), Err(Refused::Fenced));
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.token(A), None);
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
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.permit(A, at(64_000)), Err(Refused::Fenced));
}

#[test]
fn deadline_is_a_timer_of_its_own() {
    // Retries far apart: nothing else is due at the deadline.
    let mut s = draining_with(Options {
        retry_interval: ms(5000),
        ..opts()
    });
    assert_eq!(s.m.poll_timeout(), Some(at(4000)));
    let a = untimed(&s.run_to(4000));
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
    assert_eq!(s.m.state(A), State::Holding);
    assert_eq!(s.m.permit(A, at(4000)), Err(Refused::Fenced));
    assert_eq!(s.m.permit(A, at(9000)), Err(Refused::Fenced));
    let a = s.ev(9000, Event::Timer);
    // So late that the lease has run out anyway (grant sent at 1000 + TTL
    // 4000): its revoke is not held back.
    let mut want = fence_and_reacquire(State::Holding, Reason::Deadline, &a);
    want.push(Action::Revoke { lease: LEASE });
    assert_eq!(a, want);
}

#[test]
fn a_held_revoke_waits_for_the_longest_ttl_granted() {
    // A keepalive is granted 10 s (the grant gave 4 s): the fenced lease
    // may live until the last renewal + 10 s.
    let mut s = holding();
    let k = keepalives(&s.run_to(2000));
    s.ev(
        2100,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(10_000),
        },
    );
    assert_eq!(s.m.deadline(), Some(at(11_000)));
    // Nothing answers any more: drained at 3500, retries every 250 ms from
    // 3750, the last one sent at 10_750; fenced at 11_000.
    let a = s.run_to(11_000);
    assert_eq!(fences(&a), 1);
    let a: Vec<(Instant, Action)> = s
        .run_to(60_000)
        .into_iter()
        .filter(|(_, a)| matches!(a, Action::Revoke { .. }))
        .collect();
    assert_eq!(a, vec![(at(20_750), Action::Revoke { lease: LEASE })]);
}

#[test]
fn reacquired_holds_with_higher_token() {
    let mut s = holding();
    let a = untimed(&s.run_to(4000));
    let g = grant_req(&a);
    // An acquire while reacquiring waits for the reacquisition: no request
    // of its own, no refusal.
    assert!(s.acquire(4050, A).is_empty());
    let a = s.granted(4100, g, 8);
    let l = lock_req(&a, A);
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            Action::Lock {
                req: l,
                lock: A,
                lease: 8,
                wait: true
            }
        ]
    );
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.permit(A, at(4100)), Err(Refused::Fenced));
    let a = s.locked(4200, l, A, 8, Token(101));
    assert_eq!(
        a,
        vec![
            tr(A, State::Reacquiring, State::Holding, Reason::Reacquired),
            Action::Acquired {
                lock: A,
                token: Token(101)
            },
        ]
    );
    assert_eq!(s.m.deadline(), Some(at(7000)));
    assert_eq!(s.m.permit(A, at(4200)), Ok((Token(101), at(7000))));
}

#[test]
fn reacquire_never_accepts_a_non_increasing_token() {
    let mut s = holding();
    let a = untimed(&s.run_to(4000));
    let g = grant_req(&a);
    let mut l = lock_req(&s.granted(4100, g, 8), A);
    let mut t = 4100;
    // Same token, then lower ones: each is refused and its key deleted by
    // token; the lock asks again under the same lease once the key is gone.
    for bad in [TOKEN, Token(99), Token(0)] {
        let a = s.locked(t + 100, l, A, 8, bad);
        let (u, token) = unlock_req(&a, A);
        assert_eq!(
            a,
            vec![Action::Unlock {
                req: u,
                lock: A,
                lease: 8,
                token: Some(bad)
            }]
        );
        assert_eq!(token, Some(bad));
        assert_eq!(s.m.state(A), State::Reacquiring);
        assert_eq!(s.m.token(A), None);
        assert_eq!(s.m.permit(A, at(t + 100)), Err(Refused::Fenced));
        // Not before the delete is done.
        assert!(
            s.run_to(t + 150)
                .iter()
                .all(|(_, a)| !matches!(a, Action::Lock { .. }))
        );
        let a = s.ev(t + 200, Event::Unlocked { req: u, lock: A });
        assert_eq!(grants(&a), 0);
        l = lock_req(&a, A);
        t += 200;
    }
    let a = s.locked(t + 100, l, A, 8, Token(101));
    assert_eq!(
        a[1],
        Action::Acquired {
            lock: A,
            token: Token(101)
        }
    );
}

#[test]
fn acquire_after_release_never_accepts_an_old_token() {
    let mut s = holding();
    let (u, _) = unlock_req(&s.ev(1500, Event::Release { lock: A }), A);
    // On the live session: no grant; the lock waits for its own key to go.
    let a = s.acquire(1600, A);
    assert_eq!(
        a,
        vec![tr(A, State::Released, State::Acquiring, Reason::Acquire)]
    );
    let a = s.ev(1650, Event::Unlocked { req: u, lock: A });
    let l = lock_req(&a, A);
    assert_eq!(
        a,
        vec![Action::Lock {
            req: l,
            lock: A,
            lease: LEASE,
            wait: true
        }]
    );
    let a = s.locked(1800, l, A, LEASE, TOKEN);
    assert!(
        !a.iter().any(|a| matches!(a, Action::Acquired { .. })),
        "{a:?}"
    );
    assert_eq!(unlock_req(&a, A).1, Some(TOKEN));
    assert_eq!(s.m.state(A), State::Acquiring);
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
    assert_eq!(s.m.permit(A, at(2100)), Err(Refused::Fenced));
    // The old deadline (4000) is gone with the lease: no second fence.
    assert_eq!(fences(&s.run_to(10_000)), 0);
}

#[test]
fn lease_lost_fences_at_once() {
    let mut s = holding();
    // Another lease: not ours, ignored.
    assert!(s.ev(1500, Event::LeaseLost { lease: 99 }).is_empty());
    assert_eq!(s.m.state(A), State::Holding);
    let a = s.ev(1600, Event::LeaseLost { lease: LEASE });
    assert_eq!(
        a,
        fence_and_reacquire(State::Holding, Reason::LeaseLost, &a)
    );
    assert_eq!(s.m.permit(A, at(1600)), Err(Refused::Fenced));
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
fn lock_lost_fences_at_once_and_relocks_under_the_same_lease() {
    let mut s = holding();
    // Another token (or lock) of the session: ignored.
    assert!(
        s.ev(
            1500,
            Event::LockLost {
                lock: A,
                token: Token(99)
            }
        )
        .is_empty()
    );
    assert!(
        s.ev(
            1500,
            Event::LockLost {
                lock: 42,
                token: TOKEN
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.permit(A, at(1500)), Ok((TOKEN, at(4000))));
    // The key is gone although the lease lives: fence now, long before the
    // deadline, and put the key again under the same lease: no revoke, no
    // grant.
    let a = s.ev(
        1600,
        Event::LockLost {
            lock: A,
            token: TOKEN,
        },
    );
    let l = lock_req(&a, A);
    assert_eq!(
        a,
        vec![
            tr(A, State::Holding, State::Fenced, Reason::LockLost),
            Action::Fence {
                lock: A,
                token: TOKEN
            },
            tr(A, State::Fenced, State::Reacquiring, Reason::Reacquire),
            Action::Lock {
                req: l,
                lock: A,
                lease: LEASE,
                wait: true
            },
        ]
    );
    assert_eq!(Reason::LockLost.as_str(), "lock_lost");
    assert_eq!(s.m.permit(A, at(1600)), Err(Refused::Fenced));
    assert_eq!(s.m.lease(), Some(LEASE));
    assert_eq!(s.m.deadline(), Some(at(4000)));
    // Its permits are watched for on_drained; no revoke waits for them.
    assert!(s.m.watching_permits(A));
    assert!(
        s.ev(
            1650,
            Event::FenceDelivered {
                lock: A,
                token: TOKEN
            }
        )
        .is_empty()
    );
    assert_eq!(
        s.ev(1660, Event::PermitsEnded { lock: A }),
        vec![Action::Drained { lock: A }]
    );
    assert!(
        s.ev(
            1700,
            Event::LockLost {
                lock: A,
                token: TOKEN
            }
        )
        .is_empty()
    );
    // The new acquisition holds with a higher token.
    let a = s.locked(1900, l, A, LEASE, Token(TOKEN.0 + 1));
    assert!(a.contains(&tr(
        A,
        State::Reacquiring,
        State::Holding,
        Reason::Reacquired
    )));
    assert_eq!(s.m.permit(A, at(1900)), Ok((Token(101), at(4000))));

    // From Draining too; it holds again draining, the keepalive still fails.
    let mut s = draining();
    let a = s.ev(
        2200,
        Event::LockLost {
            lock: A,
            token: TOKEN,
        },
    );
    let l = lock_req(&a, A);
    assert_eq!(
        a[..3],
        [
            tr(A, State::Draining, State::Fenced, Reason::LockLost),
            Action::Fence {
                lock: A,
                token: TOKEN
            },
            tr(A, State::Fenced, State::Reacquiring, Reason::Reacquire),
        ]
    );
    let a = s.locked(2300, l, A, LEASE, Token(101));
    assert_eq!(
        a,
        vec![
            tr(A, State::Reacquiring, State::Holding, Reason::Reacquired),
            Action::Acquired {
                lock: A,
                token: Token(101)
            },
            tr(A, State::Holding, State::Draining, Reason::KeepaliveFailed),
        ]
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
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.token(A), None);
    assert_eq!(s.m.deadline(), None);
    assert_eq!(s.m.permit(A, at(4000)), Err(Refused::Fenced));

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
            tr(A, State::Draining, State::Fenced, Reason::Deadline),
            Action::Fence {
                lock: A,
                token: TOKEN
            },
            Action::Deadline,
        ]
    );
    assert_eq!(s.m.state(A), State::Fenced);
    assert_eq!(s.m.permit(A, at(4001)), Err(Refused::Fenced));
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
                A,
                State::Holding,
                State::Draining,
                Reason::KeepaliveTimeout
            )],
            "reply at {reply}"
        );
        assert_eq!(s.m.deadline(), Some(at(4000)), "reply at {reply}");
        assert_eq!(s.m.permit(A, at(reply)), Err(Refused::Draining));
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
                tr(A, State::Holding, State::Draining, Reason::KeepaliveTimeout)
            ),
            (
                at(4000),
                tr(A, State::Draining, State::Fenced, Reason::Deadline)
            ),
            (
                at(4000),
                Action::Fence {
                    lock: A,
                    token: TOKEN
                }
            ),
            (at(4000), Action::Deadline),
        ]
    );
    // No lock wants a lease: none is asked for. Only the held revoke is
    // left, at the lease's own expiry (and the unanswered keepalives are
    // abandoned at their TTL bound, the first sent at 2000).
    assert_eq!(s.m.poll_timeout(), Some(at(6000)));
    assert_eq!(
        s.run_to(60_000),
        vec![(at(7750), Action::Revoke { lease: LEASE })]
    );
    assert_eq!(s.m.poll_timeout(), None);
    assert_eq!(s.m.state(A), State::Fenced);
    assert_eq!(s.m.permit(A, at(60_000)), Err(Refused::Fenced));
    // The application may acquire again, with a higher token.
    let a = s.acquire(60_000, A);
    assert_eq!(
        a[0],
        tr(A, State::Fenced, State::Acquiring, Reason::Acquire)
    );
    let g = grant_req(&a);
    let l = lock_req(&s.granted(60_100, g, 8), A);
    let a = s.locked(60_200, l, A, 8, Token(101));
    assert_eq!(
        a,
        vec![
            tr(A, State::Acquiring, State::Holding, Reason::Acquired),
            Action::Acquired {
                lock: A,
                token: Token(101)
            },
        ]
    );
}

#[test]
fn lease_expiring_while_acquiring_takes_a_new_one_without_fence() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    s.granted(1100, g, 5);
    // Keepalives of the waiting session go unanswered until its deadline.
    let a = without_keepalives(s.run_to(4000));
    assert_eq!(fences(&a), 0);
    assert!(
        matches!(
            a[..],
            [
                (t, Action::Deadline),
                (_, Action::Revoke { lease: 5 }),
                (_, Action::Grant { .. })
            ] if t == at(4000)
        ),
        "{a:?}"
    );
    assert_eq!(s.m.state(A), State::Acquiring);
}

#[test]
fn failing_keepalive_while_acquiring_drains_right_after_lock() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    let l = lock_req(&s.granted(1100, g, LEASE), A);
    let k = keepalives(&s.run_to(2000));
    assert!(
        s.ev(2100, Event::KeepaliveFailed { req: k[0].1 })
            .is_empty()
    );
    let a = s.locked(2200, l, A, LEASE, TOKEN);
    assert_eq!(
        a,
        vec![
            tr(A, State::Acquiring, State::Holding, Reason::Acquired),
            Action::Acquired {
                lock: A,
                token: TOKEN
            },
            tr(A, State::Holding, State::Draining, Reason::KeepaliveFailed),
        ]
    );
    assert_eq!(s.m.permit(A, at(2200)), Err(Refused::Draining));
}

// ---------------------------------------------------------------- release

#[test]
fn release_from_holding_deletes_the_key_and_keeps_the_session() {
    let mut s = holding();
    let a = s.ev(1500, Event::Release { lock: A });
    let (u, _) = unlock_req(&a, A);
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: Some(TOKEN)
            },
            tr(A, State::Holding, State::Released, Reason::Release),
        ]
    );
    assert_eq!(s.m.permit(A, at(1500)), Err(Refused::Released));
    assert_eq!(s.m.token(A), None);
    assert_eq!(s.m.write_lease(at(1500), A, TOKEN), None);
    // The lease lives on: kept alive, not revoked.
    assert_eq!(s.m.lease(), Some(LEASE));
    assert_eq!(s.m.poll_timeout(), Some(at(2000)));
    assert!(!s.m.finished(A), "its key is being deleted");
    assert!(s.ev(1600, Event::Unlocked { req: u, lock: A }).is_empty());
    assert!(s.m.finished(A));
    // Said again: nothing.
    assert!(s.ev(1700, Event::Release { lock: A }).is_empty());
    let k = keepalives(&s.run_to(2000));
    assert_eq!(k.len(), 1);
    // A lease lost with no lock held fences nothing, revokes at once and
    // asks for no new lease (none is wanted).
    let a = s.ev(2100, Event::LeaseLost { lease: LEASE });
    assert_eq!(a, vec![Action::Deadline, Action::Revoke { lease: LEASE }]);
    assert!(s.run_to(100_000).is_empty());
    assert_eq!(s.m.poll_timeout(), None);
}

#[test]
fn release_from_draining() {
    let mut s = draining();
    let k = keepalives(&s.run_to(2350));
    let a = s.ev(2400, Event::Release { lock: A });
    let u = unlock_req(&a, A).0;
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: Some(TOKEN)
            },
            tr(A, State::Draining, State::Released, Reason::Release),
        ]
    );
    assert_eq!(s.m.permit(A, at(2400)), Err(Refused::Released));
    // A late confirmation of the retry does not bring it back.
    assert_eq!(
        s.ev(
            2450,
            Event::KeepaliveConfirmed {
                req: k[0].1,
                ttl: ms(4000)
            }
        ),
        vec![Action::Deadline]
    );
    assert_eq!(s.m.state(A), State::Released);
    // Nothing answers any more: the lease of no lock runs out, is revoked,
    // and nothing else happens (no fence, no transition, no grant).
    let a = without_keepalives(s.run_to(100_000));
    assert_eq!(
        a,
        vec![
            (at(5350), Action::Deadline),
            (at(5350), Action::Revoke { lease: LEASE })
        ]
    );
    // The delete is tried again until answered; then nothing is left.
    assert!(s.m.poll_timeout().is_some());
    s.ev(100_001, Event::Unlocked { req: u, lock: A });
    assert_eq!(s.m.poll_timeout(), None);
}

#[test]
fn release_while_acquiring() {
    // Before the grant's reply: no key to delete.
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    let a = s.ev(1100, Event::Release { lock: A });
    assert_eq!(
        a,
        vec![
            tr(A, State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Released
            },
        ]
    );
    // The grant's reply comes anyway: it is the session's lease now, kept
    // for the next acquisition.
    let a = s.granted(1200, g, 5);
    assert_eq!(a, vec![Action::Deadline]);
    assert_eq!(s.m.lease(), Some(5));
    assert_eq!(s.m.state(A), State::Released);
    let a = s.acquire(1300, A);
    assert_eq!(grants(&a), 0, "{a:?}");
    lock_req(&a, A);

    // After the grant, while the lock is pending: the key the request may
    // have put is deleted, token unknown.
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    let l = lock_req(&s.granted(1100, g, LEASE), A);
    let a = s.ev(1200, Event::Release { lock: A });
    let (u, _) = unlock_req(&a, A);
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: None
            },
            tr(A, State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Released
            },
        ]
    );
    // The lock request's reply comes anyway: that key is deleted by token.
    let a = s.locked(1300, l, A, LEASE, TOKEN);
    assert_eq!(
        a,
        vec![Action::Unlock {
            req: unlock_req(&a, A).0,
            lock: A,
            lease: LEASE,
            token: Some(TOKEN)
        }]
    );
    assert_eq!(s.m.state(A), State::Released);
    assert_eq!(s.m.permit(A, at(1300)), Err(Refused::Released));
    assert!(s.ev(1400, Event::Unlocked { req: u, lock: A }).is_empty());
    assert!(revokes(&untimed(&s.run_to(3000))).is_empty());
}

#[test]
fn cancel_cuts_an_acquisition_short_and_deletes_the_key_its_request_may_have_put() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    let l = lock_req(&s.granted(1100, g, LEASE), A);
    let a = s.ev(
        1200,
        Event::Cancel {
            lock: A,
            token: None,
        },
    );
    let (u, token) = unlock_req(&a, A);
    assert_eq!(token, None, "cut short: the key is deleted, token unknown");
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: None
            },
            tr(A, State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Released
            },
        ]
    );
    // The request's reply comes anyway: its key is deleted by token.
    let a = s.locked(1300, l, A, LEASE, TOKEN);
    assert_eq!(unlock_req(&a, A).1, Some(TOKEN));
    assert_eq!(s.m.state(A), State::Released);
    // Cancelled twice: nothing.
    assert!(
        s.ev(
            1400,
            Event::Cancel {
                lock: A,
                token: None
            }
        )
        .is_empty()
    );
}

#[test]
fn cancel_after_success_releases_only_the_token_it_won() {
    let mut s = holding();
    // Another token (an older acquisition's): the lock stays.
    let old = Token(TOKEN.0 - 1);
    assert!(
        s.ev(
            1300,
            Event::Cancel {
                lock: A,
                token: Some(old)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.state(A), State::Holding);
    // `None` names an acquisition in progress: there is none.
    assert!(
        s.ev(
            1300,
            Event::Cancel {
                lock: A,
                token: None
            }
        )
        .is_empty()
    );
    let a = s.ev(
        1400,
        Event::Cancel {
            lock: A,
            token: Some(TOKEN),
        },
    );
    let (u, token) = unlock_req(&a, A);
    assert_eq!(token, Some(TOKEN));
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: A,
                lease: LEASE,
                token: Some(TOKEN)
            },
            tr(A, State::Holding, State::Released, Reason::Release),
        ]
    );
    assert_eq!(s.m.lease(), Some(LEASE), "the session lives on");
}

#[test]
fn cancel_leaves_a_reacquisition_to_the_lock() {
    let mut s = holding();
    s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert!(
        s.ev(
            1600,
            Event::Cancel {
                lock: A,
                token: None
            }
        )
        .is_empty()
    );
    assert!(
        s.ev(
            1600,
            Event::Cancel {
                lock: A,
                token: Some(TOKEN)
            }
        )
        .is_empty()
    );
    assert_eq!(s.m.state(A), State::Reacquiring);
}

#[test]
fn release_while_reacquiring_emits_no_second_fence() {
    let mut s = holding();
    let a = s.run_to(4000);
    assert_eq!(fences(&a), 1);
    let a = s.ev(4100, Event::Release { lock: A });
    assert_eq!(
        a,
        vec![
            tr(A, State::Reacquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Released
            },
        ]
    );
    // The fenced lease's revoke still waits for on_fence and the permits,
    // or for the lease's own expiry: last keepalive sent at 3750 + TTL. The
    // grant times out and is not retried: no lock wants a lease.
    let a = s.run_to(60_000);
    assert_eq!(a, vec![(at(7750), Action::Revoke { lease: LEASE })]);
}

// ---------------------------------------------------------------- ordering

#[test]
fn a_fenced_lease_is_revoked_once_on_fence_returned_and_the_last_permit_ended() {
    // Either order of the two reports; the revoke follows the second one,
    // never the first.
    for fence_first in [true, false] {
        let mut s = draining();
        assert!(s.m.watching_permits(A), "a drain watches the permits");
        s.run_to(4000);
        assert_eq!(s.m.state(A), State::Reacquiring);
        assert!(s.m.watching_permits(A));
        let delivered = Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        };
        let ended = Event::PermitsEnded { lock: A };
        let (first, second) = if fence_first {
            (delivered, ended)
        } else {
            (ended, delivered)
        };
        let a = s.ev(4100, first);
        assert!(revokes(&a).is_empty(), "revoked after one report: {a:?}");
        let a = s.ev(4200, second);
        assert_eq!(revokes(&a), vec![LEASE], "fence_first={fence_first}");
        assert!(!s.m.watching_permits(A));
        // Once only.
        assert!(revokes(&s.ev(4300, Event::PermitsEnded { lock: A })).is_empty());
        assert!(
            !s.run_to(60_000)
                .iter()
                .any(|(_, a)| matches!(a, Action::Revoke { lease: LEASE }))
        );
    }
}

/// The timed actions among `actions` that `keep` selects.
fn only(actions: Vec<(Instant, Action)>, keep: impl Fn(&Action) -> bool) -> Vec<(Instant, Action)> {
    actions.into_iter().filter(|(_, a)| keep(a)).collect()
}

#[test]
fn unlock_retry_an_unanswered_delete_is_tried_again_every_retry_interval_until_answered() {
    // §10: a key left behind would block every other holder while the
    // session lives. Each try is unanswered after a keepalive timeout
    // (500 ms), the next goes a retry interval (250 ms) later; release()
    // is answered once the first try ended.
    let mut s = holding();
    s.all = true;
    let a = s.ev(1500, Event::Release { lock: A });
    let (u, token) = unlock_req(&a, A);
    assert_eq!(token, Some(TOKEN));
    assert!(!a.contains(&Action::ReleaseDone { lock: A }), "{a:?}");
    let deletes = |a: &Action| matches!(a, Action::Unlock { .. } | Action::ReleaseDone { .. });
    let again = Action::Unlock {
        req: u,
        lock: A,
        lease: LEASE,
        token: Some(TOKEN),
    };
    assert_eq!(
        only(s.run_to(2250), deletes),
        vec![
            (at(2000), Action::ReleaseDone { lock: A }),
            (at(2250), again.clone()),
        ]
    );
    // A failed try: again a retry interval after the failure.
    assert!(s.ev(2300, Event::UnlockFailed { req: u }).is_empty());
    assert_eq!(
        only(s.run_to(2550), deletes),
        vec![(at(2550), again.clone())]
    );
    // A failure of no try in flight (a try replaced) changes nothing.
    assert!(s.ev(2600, Event::UnlockFailed { req: u + 100 }).is_empty());
    assert!(!s.m.finished(A), "its key may still be there");
    assert!(s.ev(2700, Event::Unlocked { req: u, lock: A }).is_empty());
    assert!(s.m.finished(A));
    assert!(
        only(s.run_to(10_000), deletes).is_empty(),
        "answered: no more tries"
    );
}

#[test]
fn revoke_retry_an_unanswered_revoke_is_tried_again_until_answered() {
    // §10: a lease we know is ours and dead must never outlive an outage
    // (etcd restores leases with a fresh TTL when it comes back).
    let mut s = holding();
    s.all = true;
    let a = s.ev(1500, Event::Close { waiter: Some(9) });
    assert_eq!(revokes(&a), vec![LEASE]);
    let tries = |a: &Action| matches!(a, Action::Revoke { .. } | Action::CloseDone { .. });
    let again = Action::Revoke { lease: LEASE };
    // The close is answered once the first try ended (here unanswered).
    assert_eq!(
        only(s.run_to(2250), tries),
        vec![
            (at(2000), Action::CloseDone { waiter: 9 }),
            (at(2250), again.clone()),
        ]
    );
    assert!(s.ev(2400, Event::RevokeFailed { lease: LEASE }).is_empty());
    assert_eq!(only(s.run_to(2650), tries), vec![(at(2650), again.clone())]);
    assert!(!s.m.idle());
    assert!(s.ev(2700, Event::Revoked { lease: LEASE }).is_empty());
    assert!(only(s.run_to(10_000), tries).is_empty());
    s.m.remove_lock(A);
    assert!(s.m.idle(), "nothing left once the revoke is answered");
}

#[test]
fn close_wait_a_close_waits_for_the_revoke_of_its_lease_first_try() {
    let mut s = holding();
    s.all = true;
    let a = s.ev(1500, Event::Close { waiter: Some(1) });
    assert!(!a.contains(&Action::CloseDone { waiter: 1 }));
    // Answered by the first try's reply, before its keepalive timeout.
    assert_eq!(
        s.ev(1600, Event::Revoked { lease: LEASE }),
        vec![Action::CloseDone { waiter: 1 }]
    );
    // A second close finds nothing to wait for.
    assert_eq!(
        s.ev(1700, Event::Close { waiter: Some(2) }),
        vec![Action::CloseDone { waiter: 2 }]
    );
}

#[test]
fn close_wait_bound_a_close_waits_for_a_held_revoke_at_most_a_keepalive_timeout() {
    // §11 a: a fenced lease's revoke waits for on_fence and the work; a
    // close then waits for that revoke, so a process that exits once closed
    // does not cut it off, but at most a keepalive timeout (500 ms).
    let mut s = holding();
    s.all = true;
    s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.held_revokes(), 1);
    let a = s.ev(1600, Event::Close { waiter: Some(3) });
    assert!(revokes(&a).is_empty(), "held: {a:?}");
    let closes = |a: &Action| matches!(a, Action::CloseDone { .. } | Action::Revoke { .. });
    assert!(only(s.run_to(2099), closes).is_empty());
    assert_eq!(
        only(s.run_to(2100), closes),
        vec![(at(2100), Action::CloseDone { waiter: 3 })]
    );
    assert_eq!(s.m.held_revokes(), 1, "the revoke itself still waits");

    // The held revoke let go within the bound: the close waits for its
    // first try instead, not for the bound.
    let mut s = holding();
    s.all = true;
    s.ev(1500, Event::LeaseLost { lease: LEASE });
    s.ev(1600, Event::Close { waiter: Some(4) });
    s.ev(1700, Event::PermitsEnded { lock: A });
    let a = s.ev(
        1800,
        Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        },
    );
    assert_eq!(revokes(&a), vec![LEASE]);
    assert!(only(s.run_to(2200), |a| matches!(a, Action::CloseDone { .. })).is_empty());
    assert_eq!(
        s.ev(2250, Event::Revoked { lease: LEASE }),
        vec![Action::CloseDone { waiter: 4 }]
    );
}

#[test]
fn per_call_bound_an_unanswered_grant_or_keepalive_is_abandoned_at_its_ttl() {
    // No reply can matter once the TTL has passed since the send: the
    // driver drops the call then (4 s here).
    let mut s = Sim::new(opts());
    s.all = true;
    let g = grant_req(&s.acquire(1000, A));
    let abandoned = |a: &Action| matches!(a, Action::Abandon { .. });
    let a = only(s.run_to(5000), abandoned);
    assert_eq!(a.first(), Some(&(at(5000), Action::Abandon { req: g })));
    // An answered call is not abandoned.
    let mut s = holding();
    s.all = true;
    let k = keepalives(&s.run_to(2000));
    s.ev(
        2100,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    let k2 = keepalives(&s.run_to(3000));
    // The second one is never answered.
    let a = only(s.run_to(7000), abandoned);
    assert!(
        !a.iter().any(|(_, a)| *a == Action::Abandon { req: k[0].1 }),
        "{a:?}"
    );
    assert!(
        a.contains(&(at(7000), Action::Abandon { req: k2[0].1 })),
        "{a:?}"
    );
    // The lock request of an acquisition cut short is abandoned at once.
    let mut s = Sim::new(opts());
    s.all = true;
    let g = grant_req(&s.acquire(1000, A));
    let l = lock_req(&s.granted(1100, g, LEASE), A);
    let a = s.ev(1200, Event::Release { lock: A });
    assert_eq!(a.first(), Some(&Action::Abandon { req: l }));
}

#[test]
fn a_report_for_another_token_or_lock_does_not_release_the_revoke() {
    let mut s = draining();
    s.add(B, "b");
    s.run_to(4000);
    let stray = [
        Event::FenceDelivered {
            lock: A,
            token: Token(99),
        },
        Event::FenceDelivered {
            lock: B,
            token: TOKEN,
        },
        Event::PermitsEnded { lock: B },
    ];
    for (i, e) in stray.into_iter().enumerate() {
        assert!(revokes(&s.ev(4100 + i as u64, e)).is_empty());
    }
    assert_eq!(
        s.ev(4200, Event::PermitsEnded { lock: A }),
        vec![Action::Drained { lock: A }]
    );
    assert!(!s.m.watching_permits(A));
    let a = s.ev(
        4300,
        Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        },
    );
    assert_eq!(revokes(&a), vec![LEASE]);
}

#[test]
fn a_drain_that_ended_before_the_fence_needs_only_on_fence() {
    let mut s = draining();
    let a = s.ev(2200, Event::PermitsEnded { lock: A });
    assert_eq!(a, vec![Action::Drained { lock: A }]);
    s.run_to(4000);
    let a = s.ev(
        4010,
        Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        },
    );
    assert_eq!(revokes(&a), vec![LEASE]);
}

#[test]
fn a_fence_straight_from_holding_waits_for_the_permits_again() {
    // A drain that ended long ago says nothing about permits taken since.
    let mut s = draining();
    s.ev(2200, Event::PermitsEnded { lock: A });
    let k = keepalives(&s.run_to(2350));
    s.ev(
        2400,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(s.m.state(A), State::Holding);
    assert!(!s.m.watching_permits(A));
    let a = s.ev(2500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert!(revokes(&a).is_empty());
    let a = s.ev(
        2600,
        Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        },
    );
    assert!(revokes(&a).is_empty(), "permits may still run: {a:?}");
    let a = s.ev(2700, Event::PermitsEnded { lock: A });
    assert_eq!(
        a,
        vec![Action::Drained { lock: A }, Action::Revoke { lease: LEASE }]
    );
}

#[test]
fn permits_ended_is_taken_before_the_timers_due_at_the_same_instant() {
    // The report says no permit was in flight at 4000, while still
    // draining: the deadline fence at that instant finds the drain quiet,
    // and on_fence alone releases the revoke.
    let mut s = draining_with(Options {
        retry_interval: ms(5000),
        ..opts()
    });
    let a = s.ev(4000, Event::PermitsEnded { lock: A });
    assert_eq!(a[0], Action::Drained { lock: A });
    assert_eq!(fence_list(&a), vec![(A, TOKEN)]);
    let a = s.ev(
        4100,
        Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        },
    );
    assert_eq!(revokes(&a), vec![LEASE]);
}

#[test]
fn drained_is_reported_once_per_drain_and_never_while_holding() {
    let mut s = holding();
    assert!(!s.m.watching_permits(A));
    assert!(
        s.ev(1500, Event::PermitsEnded { lock: A }).is_empty(),
        "holding: no drain"
    );
    let mut s = draining();
    assert_eq!(
        s.ev(2200, Event::PermitsEnded { lock: A }),
        vec![Action::Drained { lock: A }]
    );
    assert!(!s.m.watching_permits(A));
    assert!(
        s.ev(2300, Event::PermitsEnded { lock: A }).is_empty(),
        "once per drain"
    );
    // A release is no drain of its own.
    let mut s = holding();
    let a = s.ev(2400, Event::Release { lock: A });
    assert!(!a.contains(&Action::Drained { lock: A }), "{a:?}");
    assert!(!s.m.watching_permits(A));
    // A drain begun goes on through a release.
    let mut s = draining();
    s.ev(2200, Event::Release { lock: A });
    assert!(s.m.watching_permits(A));
    assert!(!s.m.finished(A), "the drain is awaited");
    assert_eq!(
        s.ev(2300, Event::PermitsEnded { lock: A }),
        vec![Action::Drained { lock: A }]
    );
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
    assert_eq!(s.m.state(A), State::Holding);
    assert!(!s.m.watching_permits(A));
    assert!(s.ev(2500, Event::PermitsEnded { lock: A }).is_empty());
}

#[test]
fn a_lock_first_taken_with_try_acquire_reacquires_by_waiting() {
    let mut s = Sim::new(opts());
    let a = s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: false,
            until: Some(at(2000)),
        },
    );
    let g = grant_req(&a);
    let a = s.granted(1100, g, LEASE);
    let l = lock_req(&a, A);
    assert!(a.contains(&Action::Lock {
        req: l,
        lock: A,
        lease: LEASE,
        wait: false
    }));
    s.locked(1200, l, A, LEASE, TOKEN);
    let a = s.ev(1300, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(A), State::Reacquiring);
    let g = grant_req(&a);
    let a = s.granted(1400, g, LEASE + 1);
    let l = lock_req(&a, A);
    assert!(
        a.contains(&Action::Lock {
            req: l,
            lock: A,
            lease: LEASE + 1,
            wait: true
        }),
        "a reacquire waits its turn: {a:?}"
    );
    // And is not given up: no timeout applies to it.
    let a = s.ev(
        30_000,
        Event::LockFailed {
            req: l,
            lock: A,
            busy: true,
            error: DOWN.into(),
        },
    );
    assert!(!a.iter().any(|a| matches!(a, Action::AcquireFailed { .. })));
    assert_eq!(s.m.state(A), State::Reacquiring);
}

#[test]
fn a_guarded_write_needs_the_token_held_now() {
    let mut s = holding();
    assert_eq!(s.m.write_lease(at(1500), A, TOKEN), Some(LEASE));
    assert_eq!(s.m.write_lease(at(1500), A, Token(TOKEN.0 - 1)), None);
    assert_eq!(s.m.write_lease(at(1500), B, TOKEN), None, "not its lock");
    assert_eq!(
        s.m.write_lease(at(4000), A, TOKEN),
        None,
        "past the deadline"
    );
    s.ev(1600, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.write_lease(at(1600), A, TOKEN), None, "fenced");
}

// ---------------------------------------------------------------- permit

#[test]
fn permit_in_every_state() {
    // Idle, or a lock the session does not know.
    let s = Sim::new(opts());
    assert_eq!(s.m.permit(A, at(0)), Err(Refused::NotHeld));
    assert_eq!(
        s.m.permit(A, at(u64::MAX / 1_000_000)),
        Err(Refused::NotHeld)
    );
    assert_eq!(s.m.permit(42, at(0)), Err(Refused::Released));

    // Acquiring, with and without a lease.
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    assert_eq!(s.m.permit(A, at(1000)), Err(Refused::NotHeld));
    s.granted(1100, g, LEASE);
    assert_eq!(s.m.state(A), State::Acquiring);
    assert_eq!(s.m.permit(A, at(1100)), Err(Refused::NotHeld));

    // Holding: granted strictly before the deadline only, by the clock alone
    // (no handle() call in between).
    let s = holding();
    assert_eq!(s.m.permit(A, at(1200)), Ok((TOKEN, at(4000))));
    assert_eq!(
        s.m.permit(A, at(4000) - Duration::from_nanos(1)),
        Ok((TOKEN, at(4000)))
    );
    assert_eq!(s.m.state(A), State::Holding);
    assert_eq!(s.m.permit(A, at(4000)), Err(Refused::Fenced));
    assert_eq!(s.m.permit(A, at(4001)), Err(Refused::Fenced));

    // Draining: refuses with `draining`, and `fenced` from the deadline on.
    let s = draining();
    assert_eq!(s.m.permit(A, at(2100)), Err(Refused::Draining));
    assert_eq!(
        s.m.permit(A, at(4000) - Duration::from_nanos(1)),
        Err(Refused::Draining)
    );
    assert_eq!(s.m.permit(A, at(4000)), Err(Refused::Fenced));

    // Fenced (no reacquire).
    let mut s = holding_with(Options {
        reacquire: false,
        ..opts()
    });
    s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(A), State::Fenced);
    assert_eq!(s.m.permit(A, at(1500)), Err(Refused::Fenced));

    // Reacquiring, before and after the new lease.
    let mut s = holding();
    let a = s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.permit(A, at(1500)), Err(Refused::Fenced));
    s.granted(1600, grant_req(&a), 8);
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.permit(A, at(1600)), Err(Refused::Fenced));

    // Released.
    let mut s = holding();
    s.ev(1500, Event::Release { lock: A });
    assert_eq!(s.m.permit(A, at(1500)), Err(Refused::Released));
}

// ---------------------------------------------------------------- timers

#[test]
fn poll_timeout_always_makes_progress() {
    // A session with nothing to do has nothing to wait for.
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
    assert_eq!(s.m.state(A), State::Holding);
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

/// Every notice queued so far but the session's deadline notices, as the
/// driver polls them (apart from the requests).
fn lock_notices(h: &mut Holder, into: &mut Vec<Notice>) {
    while let Some(n) = h.poll_notice() {
        match n {
            Notice::Deadline => {}
            n => into.push(n),
        }
    }
}

/// The one request queued, as the driver polls it.
fn only_request(h: &mut Holder) -> Request {
    let r = h.poll_request().expect("a request");
    assert_eq!(h.poll_request(), None, "one request only");
    r
}

#[test]
fn events_in_order_the_fence_of_a_token_comes_before_the_acquisition_of_the_next() {
    // §11 d: the notice queue, which the driver hands to the callback
    // thread as it stands, holds a lock's notices in the order they were
    // decided: every transition, the fence of a token after the transition
    // to `Fenced`, and the acquisition of the next token after it.
    let mut h = Holder::new(opts());
    h.add_lock(A, "a");
    let mut seen = Vec::new();
    let acquire = Event::Acquire {
        lock: A,
        wait: true,
        until: None,
    };
    h.handle(at(1000), acquire);
    let Request::Grant { req, ttl, .. } = only_request(&mut h) else {
        panic!("a grant first");
    };
    let granted = |req, lease| Event::LeaseGranted { req, lease, ttl };
    h.handle(at(1100), granted(req, LEASE));
    let Request::Lock { req, .. } = only_request(&mut h) else {
        panic!("then the lock");
    };
    let locked = |req, lease, token| Event::Locked {
        req,
        lock: A,
        lease,
        token,
    };
    h.handle(at(1200), locked(req, LEASE, TOKEN));
    // The driver, starved since, wakes first at the deadline (4000 ms): the
    // fence and the reacquisition's grant come from that one wake-up.
    h.handle(at(4000), Event::Timer);
    let Request::Grant { req, .. } = only_request(&mut h) else {
        panic!("a grant for the reacquisition");
    };
    h.handle(at(4100), granted(req, LEASE + 1));
    let Request::Lock { req, .. } = only_request(&mut h) else {
        panic!("the lock again");
    };
    let next = Token(TOKEN.0 + 1);
    h.handle(at(4200), locked(req, LEASE + 1, next));
    lock_notices(&mut h, &mut seen);
    let change = |from, to, reason| Notice::Transition {
        lock: A,
        change: StateChange { from, to, reason },
    };
    assert_eq!(
        seen,
        vec![
            change(State::Idle, State::Acquiring, Reason::Acquire),
            change(State::Acquiring, State::Holding, Reason::Acquired),
            Notice::Acquired {
                lock: A,
                token: TOKEN
            },
            change(State::Holding, State::Fenced, Reason::Deadline),
            Notice::Fence {
                lock: A,
                token: TOKEN
            },
            change(State::Fenced, State::Reacquiring, Reason::Reacquire),
            change(State::Reacquiring, State::Holding, Reason::Reacquired),
            Notice::Acquired {
                lock: A,
                token: next
            },
        ]
    );
}

#[test]
fn every_wait_is_a_machine_timer_grant_keepalive_retry_deadline_and_give_up() {
    // §11 e: whatever the holder waits for is the instant `poll_timeout`
    // names (the driver has no timer of its own), each wait in turn.
    let mut s = Sim::new(opts());
    s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: true,
            until: Some(at(9000)),
        },
    );
    // The grant's timeout (sent at 1000, keepalive_timeout 500 ms).
    assert_eq!(s.m.poll_timeout(), Some(at(1500)));
    assert!(s.run_to(1500).is_empty());
    // Its retry, a retry interval later.
    assert_eq!(s.m.poll_timeout(), Some(at(1750)));
    let g = grant_req(&untimed(&s.run_to(1750)));
    let l = lock_req(&s.granted(1800, g, LEASE), A);
    // Waiting in its turn: the next keepalive (the grant's send time +
    // keepalive_interval) comes before the give-up and the calls' bounds.
    assert_eq!(s.m.poll_timeout(), Some(at(2750)));
    s.locked(1900, l, A, LEASE, TOKEN);
    // Holding: the next keepalive, then its timeout.
    assert_eq!(s.m.poll_timeout(), Some(at(2750)));
    let k = keepalives(&s.run_to(2750));
    assert_eq!(k.len(), 1);
    assert_eq!(s.m.poll_timeout(), Some(at(3250)));
    // Timed out: draining, the retry a retry interval later.
    s.run_to(3250);
    assert_eq!(s.m.state(A), State::Draining);
    assert_eq!(s.m.poll_timeout(), Some(at(3500)));
    // The deadline: the grant's send time (1750) + TTL − margin; the
    // retries every 250 ms until then change nothing.
    let d = s.m.deadline().expect("a deadline");
    assert_eq!(d, at(4750));
    let a = s.run_to(4749);
    assert_eq!(fences(&a), 0);
    assert_eq!(s.m.poll_timeout(), Some(d));
    let a = s.run_to(4750);
    assert_eq!(fences(&a), 1);
    assert_eq!(s.m.state(A), State::Reacquiring);
    // A reacquisition waits with no give-up; an acquisition gives up at
    // its own instant, which `poll_timeout` names when nothing is sooner.
    let mut s = Sim::new(opts());
    s.ev(
        1000,
        Event::Acquire {
            lock: A,
            wait: true,
            until: Some(at(1300)),
        },
    );
    assert_eq!(s.m.poll_timeout(), Some(at(1300)));
    let a = untimed(&s.run_to(1300));
    assert!(
        a.contains(&tr(
            A,
            State::Acquiring,
            State::Idle,
            Reason::AcquireTimeout
        )),
        "{a:?}"
    );
}

// ---------------------------------------------------------------- sessions

/// A session of `locks`, the first of which is held as in [`holding`]:
/// asked for at 1000 ms, lease [`LEASE`] granted at 1100 ms, locked at 1200
/// ms with [`TOKEN`]; the others are idle.
fn holding_among(locks: &[(LockId, &str)]) -> Sim {
    let mut s = Sim::with_locks(opts(), locks);
    let first = locks[0].0;
    let g = grant_req(&s.acquire(1000, first));
    let l = lock_req(&s.granted(1100, g, LEASE), first);
    s.locked(1200, l, first, LEASE, TOKEN);
    assert_eq!(s.m.state(first), State::Holding);
    s
}

#[test]
fn many_locks_share_one_lease_and_one_keepalive_loop() {
    // session() checks there is one grant for the three locks.
    let mut s = session();
    assert_eq!(s.m.locks().collect::<Vec<_>>(), vec![A, B, C]);
    for (lock, token) in TOKENS {
        assert_eq!(s.m.permit(lock, at(1200)), Ok((token, at(4000))));
        assert_eq!(s.m.write_lease(at(1200), lock, token), Some(LEASE));
    }
    // One keepalive per interval for the three of them.
    for i in 0..10 {
        let t = 2000 + 1000 * i;
        let a = s.run_to(t);
        let k = keepalives(&a);
        assert_eq!(
            a,
            vec![(
                at(t),
                Action::Keepalive {
                    req: k[0].1,
                    lease: LEASE
                }
            )]
        );
        assert_eq!(
            s.ev(
                t + 50,
                Event::KeepaliveConfirmed {
                    req: k[0].1,
                    ttl: ms(4000)
                }
            ),
            vec![Action::Deadline]
        );
    }
    let deadline = at(11_000 + 3000);
    for (lock, token) in TOKENS {
        assert_eq!(s.m.permit(lock, at(11_100)), Ok((token, deadline)));
    }
    // A fourth lock on the live session: a lock request under its lease,
    // no grant; it holds under the session's deadline.
    s.add(D, "d");
    let a = s.acquire(11_100, D);
    let l = lock_req(&a, D);
    assert_eq!(
        a,
        vec![
            tr(D, State::Idle, State::Acquiring, Reason::Acquire),
            Action::Lock {
                req: l,
                lock: D,
                lease: LEASE,
                wait: true
            },
        ]
    );
    s.locked(11_200, l, D, LEASE, Token(400));
    assert_eq!(s.m.permit(D, at(11_200)), Ok((Token(400), deadline)));
    let a = s.run_to(12_000);
    assert_eq!(keepalives(&a).len(), 1);
    assert_eq!(a.len(), 1);
}

#[test]
fn a_failed_keepalive_drains_every_lock_and_a_confirmed_one_resumes_them_all() {
    let mut s = session();
    // A released lock is not drained.
    s.ev(1500, Event::Release { lock: C });
    let k = keepalives(&s.run_to(2000));
    let a = s.ev(2100, Event::KeepaliveFailed { req: k[0].1 });
    assert_eq!(
        a,
        vec![
            tr(A, State::Holding, State::Draining, Reason::KeepaliveFailed),
            tr(B, State::Holding, State::Draining, Reason::KeepaliveFailed),
        ]
    );
    for lock in [A, B] {
        assert_eq!(s.m.permit(lock, at(2100)), Err(Refused::Draining));
        assert!(s.m.watching_permits(lock));
    }
    // A second failure while failing drains nothing more.
    let k = keepalives(&s.run_to(2350));
    assert!(
        s.ev(2360, Event::KeepaliveFailed { req: k[0].1 })
            .is_empty()
    );
    let k = keepalives(&s.run_to(2600));
    let a = s.ev(
        2650,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            tr(A, State::Draining, State::Holding, Reason::Resumed),
            tr(B, State::Draining, State::Holding, Reason::Resumed),
        ]
    );
    for (lock, token) in &TOKENS[..2] {
        assert_eq!(s.m.permit(*lock, at(2650)), Ok((*token, at(5600))));
    }
    assert_eq!(s.m.state(C), State::Released);
    // A keepalive timeout drains them all too.
    let k = keepalives(&s.run_to(3600));
    assert_eq!(k, vec![(at(3600), k[0].1)]);
    let a = s.run_to(4100);
    assert_eq!(
        a,
        vec![
            (
                at(4100),
                tr(A, State::Holding, State::Draining, Reason::KeepaliveTimeout)
            ),
            (
                at(4100),
                tr(B, State::Holding, State::Draining, Reason::KeepaliveTimeout)
            ),
        ]
    );
}

#[test]
fn the_deadline_fences_every_lock_once_and_holds_one_revoke_for_all() {
    // Each of the six reports is the last one once: the revoke comes with
    // that one, never before.
    let reports: Vec<Event> = TOKENS
        .iter()
        .flat_map(|&(lock, token)| {
            [
                Event::FenceDelivered { lock, token },
                Event::PermitsEnded { lock },
            ]
        })
        .collect();
    for last in 0..reports.len() {
        let mut s = session();
        let a = without_keepalives(s.run_to(3999));
        assert_eq!(a.len(), 3, "every lock drains: {a:?}");
        let a = untimed(&s.run_to(4000));
        let mut want = Vec::new();
        for (lock, token) in TOKENS {
            want.push(tr(lock, State::Draining, State::Fenced, Reason::Deadline));
            want.push(Action::Fence { lock, token });
            want.push(tr(
                lock,
                State::Fenced,
                State::Reacquiring,
                Reason::Reacquire,
            ));
        }
        want.push(Action::Deadline);
        want.push(Action::Grant {
            req: grant_req(&a),
            ttl: ms(4000),
        });
        assert_eq!(a, want);
        for lock in [A, B, C] {
            assert!(s.m.watching_permits(lock));
            assert_eq!(s.m.permit(lock, at(4000)), Err(Refused::Fenced));
        }
        let mut order = reports.clone();
        let e = order.remove(last);
        order.push(e);
        for (i, e) in order.iter().enumerate() {
            let a = s.ev(4100 + 10 * i as u64, e.clone());
            if i + 1 < order.len() {
                assert!(revokes(&a).is_empty(), "revoked after {e:?} ({i}): {a:?}");
            } else {
                assert_eq!(revokes(&a), vec![LEASE], "after {e:?}");
            }
        }
        for lock in [A, B, C] {
            assert!(!s.m.watching_permits(lock));
        }
        // Never a second fence or revoke of that lease.
        let a = s.run_to(60_000);
        assert_eq!(fences(&a), 0);
        assert!(revokes(&untimed(&a)).is_empty(), "{a:?}");
    }
}

#[test]
fn a_held_revoke_is_released_by_the_lease_expiry_if_a_report_never_comes() {
    let mut s = session();
    s.run_to(4000);
    for (lock, token) in TOKENS {
        s.ev(4100, Event::PermitsEnded { lock });
        if lock != B {
            s.ev(4100, Event::FenceDelivered { lock, token });
        }
    }
    // The last renewal was the retry sent at 3750: expired by 7750 anyway.
    assert_eq!(s.m.poll_timeout(), Some(at(4500)), "the grant's timeout");
    let a: Vec<(Instant, Action)> = s
        .run_to(60_000)
        .into_iter()
        .filter(|(_, a)| matches!(a, Action::Revoke { .. }))
        .collect();
    assert_eq!(a, vec![(at(7750), Action::Revoke { lease: LEASE })]);
    // The late report changes nothing.
    let a = s.ev(
        60_100,
        Event::FenceDelivered {
            lock: B,
            token: Token(200),
        },
    );
    assert!(revokes(&a).is_empty());
}

#[test]
fn each_fenced_lease_waits_for_its_own_tokens() {
    let mut s = holding();
    let g = grant_req(&s.ev(1500, Event::LeaseLost { lease: LEASE }));
    let l = lock_req(&s.granted(1600, g, 8), A);
    s.locked(1700, l, A, 8, Token(101));
    let a = s.ev(1800, Event::LeaseLost { lease: 8 });
    assert_eq!(fence_list(&a), vec![(A, Token(101))]);
    assert!(revokes(&a).is_empty());
    // The newer token's report releases the newer lease only.
    let a = s.ev(
        1900,
        Event::FenceDelivered {
            lock: A,
            token: Token(101),
        },
    );
    assert!(revokes(&a).is_empty());
    let a = s.ev(2000, Event::PermitsEnded { lock: A });
    assert_eq!(
        a,
        vec![Action::Drained { lock: A }, Action::Revoke { lease: 8 }]
    );
    let a = s.ev(
        2100,
        Event::FenceDelivered {
            lock: A,
            token: TOKEN,
        },
    );
    assert_eq!(a, vec![Action::Revoke { lease: LEASE }]);
}

#[test]
fn reacquire_after_a_session_fence_takes_one_lease_and_every_lock_relocks_higher() {
    let mut s = session();
    let a = s.ev(1500, Event::LeaseLost { lease: LEASE });
    assert_eq!(fence_list(&a), TOKENS.to_vec());
    assert!(revokes(&a).is_empty(), "held: {a:?}");
    let g = grant_req(&a);
    let a = s.granted(1600, g, 8);
    assert_eq!(a[0], Action::Deadline);
    let reqs = lock_reqs(&a);
    assert_eq!(
        a[1..],
        reqs.iter()
            .map(|&(lock, req)| Action::Lock {
                req,
                lock,
                lease: 8,
                wait: true
            })
            .collect::<Vec<_>>()
    );
    assert_eq!(reqs.iter().map(|r| r.0).collect::<Vec<_>>(), vec![A, B, C]);
    let reacquired = |lock, token| {
        vec![
            tr(lock, State::Reacquiring, State::Holding, Reason::Reacquired),
            Action::Acquired { lock, token },
        ]
    };
    assert_eq!(
        s.locked(1700, reqs[0].1, A, 8, Token(301)),
        reacquired(A, Token(301))
    );
    // Tokens increase per lock: B's old token again is refused, its key
    // deleted by token, and B asks again once that is done.
    let a = s.locked(1700, reqs[1].1, B, 8, Token(200));
    let (u, token) = unlock_req(&a, B);
    assert_eq!(token, Some(Token(200)));
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(s.m.state(B), State::Reacquiring);
    assert_eq!(
        s.locked(1700, reqs[2].1, C, 8, Token(302)),
        reacquired(C, Token(302))
    );
    let l = lock_req(&s.ev(1750, Event::Unlocked { req: u, lock: B }), B);
    assert_eq!(
        s.locked(1800, l, B, 8, Token(303)),
        reacquired(B, Token(303))
    );
    // The new lease's deadline, from its grant's send time (1500 ms).
    for (lock, token) in [(A, 301), (B, 303), (C, 302)] {
        assert_eq!(s.m.permit(lock, at(1800)), Ok((Token(token), at(4500))));
    }
}

#[test]
fn lock_lost_fences_that_lock_only() {
    let mut s = session();
    let a = s.ev(
        1500,
        Event::LockLost {
            lock: B,
            token: Token(200),
        },
    );
    let l = lock_req(&a, B);
    assert_eq!(
        a,
        vec![
            tr(B, State::Holding, State::Fenced, Reason::LockLost),
            Action::Fence {
                lock: B,
                token: Token(200)
            },
            tr(B, State::Fenced, State::Reacquiring, Reason::Reacquire),
            Action::Lock {
                req: l,
                lock: B,
                lease: LEASE,
                wait: true
            },
        ]
    );
    // The others hold on, under the same lease; nothing is revoked.
    for (lock, token) in [TOKENS[0], TOKENS[2]] {
        assert_eq!(s.m.permit(lock, at(1500)), Ok((token, at(4000))));
    }
    assert_eq!(s.m.lease(), Some(LEASE));
    assert!(
        s.ev(
            1550,
            Event::FenceDelivered {
                lock: B,
                token: Token(200)
            }
        )
        .is_empty()
    );
    assert_eq!(
        s.ev(1560, Event::PermitsEnded { lock: B }),
        vec![Action::Drained { lock: B }]
    );
    let a = s.locked(1600, l, B, LEASE, Token(201));
    assert_eq!(
        a,
        vec![
            tr(B, State::Reacquiring, State::Holding, Reason::Reacquired),
            Action::Acquired {
                lock: B,
                token: Token(201)
            },
        ]
    );
    assert_eq!(s.m.permit(B, at(1600)), Ok((Token(201), at(4000))));
    // One keepalive loop for all three still.
    assert_eq!(keepalives(&s.run_to(2000)).len(), 1);
    // A later session fence fences each token held then, once: B's dead
    // token is not fenced again.
    let a = s.ev(2100, Event::LeaseLost { lease: LEASE });
    assert_eq!(
        fence_list(&a),
        vec![(A, Token(100)), (B, Token(201)), (C, Token(300))]
    );
}

#[test]
fn release_of_one_lock_deletes_its_key_and_keeps_the_others_and_the_lease() {
    let mut s = session();
    let a = s.ev(1500, Event::Release { lock: B });
    let (u, _) = unlock_req(&a, B);
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: B,
                lease: LEASE,
                token: Some(Token(200))
            },
            tr(B, State::Holding, State::Released, Reason::Release),
        ]
    );
    for (lock, token) in [TOKENS[0], TOKENS[2]] {
        assert_eq!(s.m.permit(lock, at(1500)), Ok((token, at(4000))));
    }
    assert_eq!(s.m.permit(B, at(1500)), Err(Refused::Released));
    assert_eq!(s.m.lease(), Some(LEASE));
    assert!(!s.m.finished(B));
    assert!(s.ev(1600, Event::Unlocked { req: u, lock: B }).is_empty());
    assert!(s.m.finished(B));
    s.m.remove_lock(B);
    s.states.remove(&B);
    assert_eq!(s.m.locks().collect::<Vec<_>>(), vec![A, C]);
    assert_eq!(s.m.state(B), State::Released);
    assert!(!s.m.idle());
    // The session goes on; its deadline fences the two held locks only.
    let a = s.run_to(4000);
    assert!(revokes(&untimed(&a)).is_empty(), "{a:?}");
    assert_eq!(
        fence_list(&untimed(&a)),
        vec![(A, Token(100)), (C, Token(300))]
    );
}

#[test]
fn a_release_while_the_lock_request_is_in_flight_waits_for_its_unlock() {
    let mut s = holding();
    s.add(B, "b");
    let a = s.acquire(1500, B);
    assert_eq!(grants(&a), 0, "{a:?}");
    let l1 = lock_req(&a, B);
    let a = s.ev(1600, Event::Release { lock: B });
    let (u, _) = unlock_req(&a, B);
    assert_eq!(
        a,
        vec![
            Action::Unlock {
                req: u,
                lock: B,
                lease: LEASE,
                token: None
            },
            tr(B, State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: B,
                error: AcquireError::Released
            },
        ]
    );
    // Asked for again at once: it waits for that delete before putting its
    // key again.
    assert_eq!(
        s.acquire(1700, B),
        vec![tr(B, State::Released, State::Acquiring, Reason::Acquire)]
    );
    // The old request's reply: deleted by token, not taken.
    let a = s.locked(1750, l1, B, LEASE, Token(150));
    let (stray, token) = unlock_req(&a, B);
    assert_eq!(a.len(), 1);
    assert_eq!(token, Some(Token(150)));
    assert_eq!(s.m.state(B), State::Acquiring);
    assert_eq!(s.m.token(B), None);
    // That delete's reply is not the one awaited.
    assert!(
        s.ev(
            1760,
            Event::Unlocked {
                req: stray,
                lock: B
            }
        )
        .is_empty()
    );
    let a = s.ev(1800, Event::Unlocked { req: u, lock: B });
    let l2 = lock_req(&a, B);
    assert_eq!(
        a,
        vec![Action::Lock {
            req: l2,
            lock: B,
            lease: LEASE,
            wait: true
        }]
    );
    let a = s.locked(1900, l2, B, LEASE, Token(151));
    assert_eq!(
        a[1],
        Action::Acquired {
            lock: B,
            token: Token(151)
        }
    );
    assert_eq!(s.m.state(A), State::Holding);
}

#[test]
fn two_locks_of_one_name_on_one_session_exclude_each_other() {
    let mut s = Sim::with_locks(opts(), &[(A, "x"), (B, "x")]);
    let g = grant_req(&s.acquire(1000, A));
    assert_eq!(
        s.acquire(1000, B),
        vec![tr(B, State::Idle, State::Acquiring, Reason::Acquire)]
    );
    // One key of the name under the lease: only the first asks.
    let a = s.granted(1100, g, LEASE);
    assert_eq!(
        lock_reqs(&a).iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![A]
    );
    s.locked(1200, lock_req(&a, A), A, LEASE, TOKEN);
    assert!(s.run_to(1400).is_empty());
    assert_eq!(s.m.state(B), State::Acquiring);
    // The second asks once the first's key is deleted, not before.
    let a = s.ev(1500, Event::Release { lock: A });
    assert!(lock_reqs(&a).is_empty(), "{a:?}");
    let (u, _) = unlock_req(&a, A);
    let a = s.ev(1600, Event::Unlocked { req: u, lock: A });
    let l = lock_req(&a, B);
    assert_eq!(
        a,
        vec![Action::Lock {
            req: l,
            lock: B,
            lease: LEASE,
            wait: true
        }]
    );
    // And the first, asked for again, now waits for the second.
    assert_eq!(
        s.acquire(1700, A),
        vec![tr(A, State::Released, State::Acquiring, Reason::Acquire)]
    );
    s.locked(1800, l, B, LEASE, Token(101));
    let a = s.ev(1900, Event::Release { lock: B });
    let (u, _) = unlock_req(&a, B);
    let a = s.ev(1950, Event::Unlocked { req: u, lock: B });
    let l = lock_req(&a, A);
    let a = s.locked(1990, l, A, LEASE, Token(102));
    assert_eq!(
        a[1],
        Action::Acquired {
            lock: A,
            token: Token(102)
        }
    );
}

#[test]
fn a_key_lost_by_one_lock_of_a_name_lets_the_other_ask() {
    let mut s = holding_among(&[(A, "x"), (B, "x")]);
    assert_eq!(
        s.acquire(1300, B),
        vec![tr(B, State::Idle, State::Acquiring, Reason::Acquire)]
    );
    // A's key went: the name is free under the lease; one of the two asks
    // for it (A to reacquire, or B), the other waits for it in turn.
    let a = s.ev(
        1400,
        Event::LockLost {
            lock: A,
            token: TOKEN,
        },
    );
    assert_eq!(lock_reqs(&a).len(), 1, "{a:?}");
    assert_eq!(s.m.state(A), State::Reacquiring);
    assert_eq!(s.m.state(B), State::Acquiring);
}

#[test]
fn try_acquire_of_a_name_the_session_holds_would_block() {
    let mut s = holding_among(&[(A, "x"), (B, "x")]);
    let a = s.ev(
        1500,
        Event::Acquire {
            lock: B,
            wait: false,
            until: None,
        },
    );
    // No request: the session's own lock holds the name's key.
    assert_eq!(
        a,
        vec![
            tr(B, State::Idle, State::Acquiring, Reason::Acquire),
            tr(B, State::Acquiring, State::Idle, Reason::WouldBlock),
            Action::AcquireFailed {
                lock: B,
                error: AcquireError::WouldBlock
            },
        ]
    );
    assert_eq!(s.m.permit(A, at(1500)), Ok((TOKEN, at(4000))));

    // Likewise while the name's key is being taken or deleted.
    let mut s = holding_among(&[(A, "x"), (B, "x")]);
    let (u, _) = unlock_req(&s.ev(1500, Event::Release { lock: A }), A);
    let a = s.ev(
        1600,
        Event::Acquire {
            lock: B,
            wait: false,
            until: None,
        },
    );
    assert_eq!(
        a.last(),
        Some(&Action::AcquireFailed {
            lock: B,
            error: AcquireError::WouldBlock
        })
    );
    // Once it is gone, a try goes to the service.
    s.ev(1700, Event::Unlocked { req: u, lock: A });
    let a = s.ev(
        1800,
        Event::Acquire {
            lock: B,
            wait: false,
            until: None,
        },
    );
    assert_eq!(
        a,
        vec![
            tr(B, State::Idle, State::Acquiring, Reason::Acquire),
            Action::Lock {
                req: lock_req(&a, B),
                lock: B,
                lease: LEASE,
                wait: false
            },
        ]
    );
}

#[test]
fn give_up_is_a_timeout_when_waiting_its_turn_and_backend_without_a_lease() {
    // Waiting behind the session's own lock of the name: its turn, a
    // timeout; it never put a key, nothing to delete.
    let mut s = holding_among(&[(A, "x"), (B, "x")]);
    s.ev(
        1500,
        Event::Acquire {
            lock: B,
            wait: true,
            until: Some(at(1800)),
        },
    );
    let a = s.run_to(1800);
    assert_eq!(
        a,
        vec![
            (
                at(1800),
                tr(B, State::Acquiring, State::Idle, Reason::AcquireTimeout)
            ),
            (
                at(1800),
                Action::AcquireFailed {
                    lock: B,
                    error: AcquireError::Timeout
                }
            ),
        ]
    );
    assert_eq!(s.m.state(A), State::Holding);

    // No lease could be had: a backend failure, for every lock waiting.
    let mut s = Sim::with_locks(opts(), &[(A, "a"), (B, "b")]);
    for lock in [A, B] {
        s.ev(
            1000,
            Event::Acquire {
                lock,
                wait: true,
                until: Some(at(2000)),
            },
        );
    }
    let a = untimed(&s.run_to(2000));
    let failed: Vec<&Action> = a
        .iter()
        .filter(|a| matches!(a, Action::AcquireFailed { .. }))
        .collect();
    assert_eq!(
        failed,
        vec![
            &Action::AcquireFailed {
                lock: A,
                error: AcquireError::Backend(None)
            },
            &Action::AcquireFailed {
                lock: B,
                error: AcquireError::Backend(None)
            },
        ]
    );
}

#[test]
fn close_releases_every_lock_and_revokes_the_lease_once() {
    let mut s = session();
    s.add(D, "d");
    let l = lock_req(&s.acquire(1500, D), D);
    let a = s.ev(1600, Event::Close { waiter: None });
    // One revoke deletes every key: no delete of its own per lock.
    assert_eq!(unlocks(&a), 0);
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            tr(A, State::Holding, State::Released, Reason::Release),
            tr(B, State::Holding, State::Released, Reason::Release),
            tr(C, State::Holding, State::Released, Reason::Release),
            tr(D, State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: D,
                error: AcquireError::Released
            },
            Action::Revoke { lease: LEASE },
        ]
    );
    for lock in [A, B, C, D] {
        assert_eq!(s.m.permit(lock, at(1600)), Err(Refused::Released));
    }
    assert_eq!(s.m.lease(), None);
    assert_eq!(s.m.deadline(), None);
    assert_eq!(s.m.poll_timeout(), None);
    assert!(
        s.ev(1700, Event::Close { waiter: None }).is_empty(),
        "closing twice"
    );
    // No acquisition any more.
    assert_eq!(
        s.acquire(1800, A),
        vec![Action::AcquireRefused {
            lock: A,
            error: AcquireError::Released
        }]
    );
    assert_eq!(s.m.state(A), State::Released);
    // The lock request's late reply takes nothing.
    let a = s.locked(1900, l, D, LEASE, Token(400));
    assert!(
        !a.iter()
            .any(|a| matches!(a, Action::Acquired { .. } | Action::Lock { .. }))
    );
    assert_eq!(s.m.state(D), State::Released);
    assert!(s.run_to(100_000).is_empty());
    for lock in [A, B, C, D] {
        assert!(s.m.finished(lock), "{lock}");
        s.m.remove_lock(lock);
    }
    assert!(s.m.idle());
}

#[test]
fn close_while_the_first_grant_is_in_flight() {
    let mut s = Sim::new(opts());
    let g = grant_req(&s.acquire(1000, A));
    let a = s.ev(1100, Event::Close { waiter: None });
    assert_eq!(
        a,
        vec![
            Action::Deadline,
            tr(A, State::Acquiring, State::Released, Reason::Release),
            Action::AcquireFailed {
                lock: A,
                error: AcquireError::Released
            },
        ]
    );
    // Only the grant's TTL bound is left: its call is abandoned then.
    assert_eq!(s.m.poll_timeout(), Some(at(5000)));
    // Its reply: nobody will use that lease.
    assert_eq!(s.granted(1200, g, 5), vec![Action::Revoke { lease: 5 }]);
    assert_eq!(s.m.lease(), None);
}

#[test]
fn close_keeps_a_fenced_lease_held_until_its_reports() {
    let mut s = session();
    let g = grant_req(&s.ev(1500, Event::LeaseLost { lease: LEASE }));
    s.granted(1600, g, 8);
    let a = s.ev(1700, Event::Close { waiter: None });
    // The live lease goes at once, the fenced one waits.
    assert_eq!(revokes(&a), vec![8]);
    assert_eq!(
        a.iter()
            .filter(|a| matches!(
                a,
                Action::AcquireFailed {
                    error: AcquireError::Released,
                    ..
                }
            ))
            .count(),
        3
    );
    assert!(!s.m.idle());
    for (lock, token) in TOKENS {
        assert!(!s.m.finished(lock), "its fenced token is awaited");
        let a = s.ev(1800, Event::FenceDelivered { lock, token });
        assert!(revokes(&a).is_empty());
    }
    for lock in [A, B] {
        assert!(revokes(&s.ev(1900, Event::PermitsEnded { lock })).is_empty());
    }
    let a = s.ev(1900, Event::PermitsEnded { lock: C });
    assert_eq!(revokes(&a), vec![LEASE]);
    for lock in [A, B, C] {
        assert!(s.m.finished(lock));
        s.m.remove_lock(lock);
    }
    assert!(s.m.idle());
}

#[test]
fn a_lock_is_finished_once_released_its_key_deleted_and_its_drain_ended() {
    let mut s = session_draining();
    assert!(!s.m.finished(A), "holding");
    let a = s.ev(2200, Event::Release { lock: A });
    let (u, _) = unlock_req(&a, A);
    assert!(!s.m.finished(A), "its key is being deleted");
    s.ev(2250, Event::Unlocked { req: u, lock: A });
    assert!(!s.m.finished(A), "its drain is watched");
    assert_eq!(
        s.ev(2300, Event::PermitsEnded { lock: A }),
        vec![Action::Drained { lock: A }]
    );
    assert!(s.m.finished(A));
    // An unknown lock is finished; a removed one is Released.
    assert!(s.m.finished(42));
    s.m.remove_lock(A);
    s.states.remove(&A);
    assert_eq!(s.m.state(A), State::Released);
    assert_eq!(s.m.token(A), None);
}

// ---------------------------------------------------------------- properties

mod props {
    //! Random operation sequences over a few locks of one session (some of
    //! one name) and a contender, against a model of the lock service: a
    //! lease table with server-side expiry, and lock keys per name and
    //! owner with create revisions (the lowest live key of a name holds
    //! it).

    use std::collections::{BTreeMap, HashMap, HashSet};

    use proptest::prelude::*;
    use proptest::sample::Index;
    use proptest::test_runner::TestCaseError;

    use super::*;

    /// Cases per run: `PROPTEST_CASES`, else this many.
    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(10_000)
    }

    /// The names the locks and the contender use.
    const NAMES: [&str; 3] = ["x", "y", "z"];

    /// How the service answers a request.
    #[derive(Copy, Clone, Debug)]
    enum Outcome {
        /// Served normally.
        Ok,
        /// Transport error: not processed (a lock request may have put its
        /// key).
        Fail,
        /// The lease is gone on the server.
        Lost,
        /// Grant: failed; lock: busy; keepalive: processed, reply lost.
        Busy,
        /// Grant: another TTL; lock: a token not higher than the lock's
        /// last one (buggy server); keepalive: processed with a raised TTL,
        /// or its reply delivered twice.
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
            lock: Index,
            wait: bool,
            until_ms: Option<u64>,
        },
        Release {
            lock: Index,
        },
        Close,
        /// The application asks `permit()` of a lock and keeps the permit.
        Permit {
            lock: Index,
        },
        /// A permit in flight ends.
        EndPermit {
            pick: Index,
        },
        /// The driver says no permit of the lock is in flight (when true
        /// and asked for).
        PermitsEnded {
            lock: Index,
        },
        /// The driver sees no permit of a watched lock in flight, and tells
        /// the machine only later (the clock read after the look): in
        /// between time passes without the machine being told, and a
        /// permit may be granted by the state published then.
        /// The gaps are per cent of the time left to the deadline (of a
        /// second without one): the report often comes after a deadline
        /// passed, a permit granted before it.
        LatePermitsEnded {
            lock: Index,
            before_pct: u8,
            permit: bool,
            after_pct: u8,
        },
        /// The driver says `on_fence` of a fenced token returned.
        FenceDelivered {
            pick: Index,
        },
        /// An operator deletes a held lock's key; the watch tells at once.
        /// Without a held token: a stale report of an old one.
        DeleteKey {
            lock: Index,
        },
        /// The contender puts its key of a name (it holds the name while
        /// its key is the lowest).
        ContenderLock {
            name: Index,
        },
        /// The contender deletes its key of a name.
        ContenderUnlock {
            name: Index,
        },
    }

    #[derive(Clone, Debug)]
    enum Kind {
        Grant {
            ttl: Duration,
        },
        Lock {
            lock: LockId,
            lease: LeaseId,
            wait: bool,
        },
        Unlock {
            lock: LockId,
            lease: LeaseId,
            token: Option<Token>,
        },
        Keepalive {
            lease: LeaseId,
        },
        /// A reply already decided on the server, still on its way.
        Late(Event),
    }

    #[derive(Clone, Debug)]
    struct Request {
        req: ReqId,
        kind: Kind,
        sent: Instant,
    }

    /// Who a lock key belongs to.
    #[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
    enum Owner {
        Lease(LeaseId),
        /// Another client, whose lease never lapses.
        Contender,
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

    /// The lock service.
    #[derive(Default)]
    struct Service {
        leases: HashMap<LeaseId, ServerLease>,
        next_lease: LeaseId,
        revision: u64,
        /// Lock keys: `(name, owner)` → create revision. A key of a lease
        /// that expired or was revoked is gone (not live).
        keys: BTreeMap<(String, Owner), u64>,
    }

    impl Service {
        fn alive(&self, lease: LeaseId, t: Instant) -> bool {
            self.leases
                .get(&lease)
                .is_some_and(|l| !l.revoked && t < l.expiry)
        }

        fn live(&self, owner: Owner, t: Instant) -> bool {
            match owner {
                Owner::Lease(l) => self.alive(l, t),
                Owner::Contender => true,
            }
        }

        /// The revision of the live key of `name` owned by `owner`.
        fn key(&self, name: &str, owner: Owner, t: Instant) -> Option<u64> {
            self.keys
                .get(&(name.to_string(), owner))
                .copied()
                .filter(|_| self.live(owner, t))
        }

        /// Who holds `name`: the lowest live key.
        fn holder(&self, name: &str, t: Instant) -> Option<(Owner, u64)> {
            self.keys
                .iter()
                .filter(|((n, o), _)| n == name && self.live(*o, t))
                .map(|((_, o), rev)| (*o, *rev))
                .min_by_key(|(_, rev)| *rev)
        }

        /// Puts the key of `name` for `owner` unless it is there already;
        /// its revision.
        fn put(&mut self, name: &str, owner: Owner, t: Instant) -> u64 {
            if let Some(rev) = self.key(name, owner, t) {
                return rev;
            }
            self.revision += 1;
            self.keys.insert((name.to_string(), owner), self.revision);
            self.revision
        }

        fn delete(&mut self, name: &str, owner: Owner, token: Option<Token>) {
            let k = (name.to_string(), owner);
            if token.is_none_or(|t| self.keys.get(&k) == Some(&t.get())) {
                self.keys.remove(&k);
            }
        }

        /// The server renews `lease` at `p` with a longer TTL, from now on;
        /// the TTL and expiry before.
        fn raise_ttl(&mut self, lease: LeaseId, p: Instant) -> (Duration, Instant) {
            let l = self.leases.get_mut(&lease).expect("alive");
            let before = (l.ttl, l.expiry);
            l.ttl = l.ttl * 3 / 2;
            l.expiry = l.expiry.max(p + l.ttl);
            before
        }

        fn revoke(&mut self, lease: LeaseId) {
            if let Some(l) = self.leases.get_mut(&lease) {
                l.revoked = true;
            }
        }

        /// The server accepts a keepalive processed at `p`, if the lease
        /// lives then and still at `now`: the model never brings back a
        /// lease it has seen expire (its keys may have passed on since).
        fn accept_keepalive(
            &mut self,
            lease: LeaseId,
            p: Instant,
            now: Instant,
        ) -> Option<Duration> {
            if !self.alive(lease, p) || !self.alive(lease, now) {
                return None;
            }
            let l = self.leases.get_mut(&lease).expect("alive");
            l.expiry = l.expiry.max(p + l.ttl);
            Some(l.ttl)
        }

        fn new_lease(&mut self, ttl: Duration, p: Instant, sent: Instant) -> LeaseId {
            self.next_lease += 1;
            let id = self.next_lease;
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
    }

    /// One acquisition the machine reported.
    struct TokenRecord {
        lease: LeaseId,
        fences: u32,
        /// Fenced alone (its key deleted): no revoke waits for it.
        lock_lost: bool,
        /// Released (or closed) while held.
        released: bool,
        /// The driver said on_fence returned.
        delivered: bool,
    }

    struct World {
        m: Holder,
        opts: Options,
        now: Instant,
        /// The session's locks and their names.
        names: BTreeMap<LockId, &'static str>,
        svc: Service,
        outstanding: Vec<Request>,
        delivered: Vec<Event>,
        /// Deletes sent (a try again may go under a lease since lost).
        deletes: HashSet<ReqId>,
        /// Leases revoked in the batch: the service answers at once.
        revoked: Vec<LeaseId>,
        // What the machine said.
        states: BTreeMap<LockId, State>,
        last_acquired: BTreeMap<LockId, Token>,
        tokens: BTreeMap<(LockId, Token), TokenRecord>,
        /// Fenced tokens whose on_fence is not reported returned yet.
        undelivered: Vec<(LockId, Token)>,
        /// Permits in flight.
        permits: Vec<(LockId, Token)>,
        /// Per lock: a drain or fence began and no `drained` was reported
        /// for it.
        left_holding: BTreeMap<LockId, bool>,
    }

    type R = Result<(), TestCaseError>;

    impl World {
        /// A session with locks `1..=names.len()`, lock `i + 1` called
        /// `NAMES[names[i]]`.
        fn new(opts: Options, start: Instant, names: &[usize]) -> World {
            let names: BTreeMap<LockId, &'static str> = names
                .iter()
                .enumerate()
                .map(|(i, n)| (i as LockId + 1, NAMES[*n]))
                .collect();
            let mut m = Holder::new(opts.clone());
            for (&id, &name) in &names {
                m.add_lock(id, name);
            }
            World {
                m,
                opts,
                now: start,
                states: names.keys().map(|&id| (id, State::Idle)).collect(),
                left_holding: names.keys().map(|&id| (id, false)).collect(),
                names,
                svc: Service::default(),
                outstanding: Vec::new(),
                delivered: Vec::new(),
                deletes: HashSet::new(),
                revoked: Vec::new(),
                last_acquired: BTreeMap::new(),
                tokens: BTreeMap::new(),
                undelivered: Vec::new(),
                permits: Vec::new(),
            }
        }

        fn lock(&self, pick: Index) -> LockId {
            pick.index(self.names.len()) as LockId + 1
        }

        /// Feeds one event and checks everything.
        fn handle(&mut self, ev: Event) -> R {
            let due = self.m.deadline().is_some_and(|d| d <= self.now);
            // The driver's own reports (on_fence returned, no permit in
            // flight) are facts of this process, not replies to replay;
            // nor are the application's calls.
            let replayable = matches!(
                ev,
                Event::GrantFailed { .. }
                    | Event::Locked { .. }
                    | Event::LockFailed { .. }
                    | Event::LockRefused { .. }
                    | Event::Unlocked { .. }
                    | Event::KeepaliveConfirmed { .. }
                    | Event::KeepaliveFailed { .. }
                    | Event::LeaseLost { .. }
                    | Event::LockLost { .. }
            );
            if replayable {
                self.delivered.push(ev.clone());
                if self.delivered.len() > 16 {
                    self.delivered.remove(0);
                }
            }
            let releasing: Vec<LockId> = match ev {
                Event::Release { lock } => vec![lock],
                Event::Close { .. } => self.names.keys().copied().collect(),
                _ => Vec::new(),
            };
            let held: Vec<(LockId, Token)> = releasing
                .into_iter()
                .filter_map(|l| self.m.token(l).map(|t| (l, t)))
                .collect();
            self.m.handle(self.now, ev);
            self.drain()?;
            while let Some(lease) = self.revoked.pop() {
                self.m.handle(self.now, Event::Revoked { lease });
                self.drain()?;
            }
            for t in held {
                // Released, unless a due timer fenced it first.
                let rec = self.tokens.get_mut(&t).expect("held token was acquired");
                if rec.fences == 0 {
                    rec.released = true;
                } else {
                    prop_assert!(due, "token {:?} fenced by a release", t);
                }
            }
            let now = self.now;
            if let Some(t) = self.m.poll_timeout() {
                prop_assert!(t > now, "poll_timeout {:?} not after now {:?}", t, now);
            }
            for (&l, &st) in &self.states {
                prop_assert_eq!(st, self.m.state(l), "state of {}", l);
                if matches!(st, State::Holding | State::Draining) {
                    prop_assert!(
                        self.m.deadline().is_some_and(|d| d > now),
                        "{} {:?} past its deadline {:?} at {:?}",
                        l,
                        st,
                        self.m.deadline(),
                        now
                    );
                    prop_assert!(self.m.token(l).is_some());
                }
            }
            self.check()
        }

        fn drain(&mut self) -> R {
            let mut prev: Option<Action> = None;
            let batch: Vec<Action> = std::iter::from_fn(|| self.m.poll_action()).collect();
            for (i, a) in batch.iter().enumerate() {
                let now = self.now;
                // A request goes under the session's lease: the one it has
                // after the batch, or one given up later in the batch (a
                // timer sent a keepalive, then the event lost the lease; a
                // grant answered after its own deadline), which always
                // publishes the deadline again.
                let under = |lease: LeaseId| {
                    self.svc.leases.contains_key(&lease)
                        && (self.m.lease() == Some(lease) || batch[i..].contains(&Action::Deadline))
                };
                match a.clone() {
                    Action::Transition { lock, change: c } => {
                        let st = self.states.get_mut(&lock);
                        prop_assert!(st.is_some(), "transition of unknown lock {}", lock);
                        let st = st.unwrap();
                        prop_assert_eq!(c.from, *st, "transition {} of {}", c, lock);
                        *st = c.to;
                        let left = self.left_holding.get_mut(&lock).expect("known");
                        if c.from == State::Holding {
                            *left = matches!(c.to, State::Draining | State::Fenced);
                        }
                        if c.to == State::Holding {
                            *left = false;
                        }
                    }
                    Action::Grant { req, ttl } => self.push(req, Kind::Grant { ttl }),
                    Action::Lock {
                        req,
                        lock,
                        lease,
                        wait,
                    } => {
                        prop_assert!(under(lease), "lock request off the lease");
                        self.push(req, Kind::Lock { lock, lease, wait })
                    }
                    Action::Unlock {
                        req,
                        lock,
                        lease,
                        token,
                    } => {
                        prop_assert!(
                            self.deletes.contains(&req) || under(lease),
                            "unlock off the lease"
                        );
                        // A try again replaces the one before it (the
                        // driver drops that call).
                        if !self.deletes.insert(req) {
                            self.outstanding.retain(|r| r.req != req);
                        }
                        self.push(req, Kind::Unlock { lock, lease, token })
                    }
                    Action::Keepalive { req, lease } => {
                        prop_assert!(under(lease), "keepalive off the lease");
                        self.svc.leases.get_mut(&lease).expect("known").last_sent = now;
                        self.push(req, Kind::Keepalive { lease })
                    }
                    Action::Revoke { lease } => {
                        // A fenced token's lease goes only once on_fence
                        // returned and no permit of it is in flight, or once
                        // the lease has run out anyway (send time + TTL).
                        let bound = self
                            .svc
                            .leases
                            .get(&lease)
                            .map(|l| l.last_sent + l.ttl)
                            .unwrap_or(now);
                        for (&(lock, token), rec) in &self.tokens {
                            if rec.lease == lease
                                && rec.fences == 1
                                && !rec.lock_lost
                                && !rec.released
                            {
                                let ended = !self.permits.contains(&(lock, token));
                                prop_assert!(
                                    (rec.delivered && ended) || now >= bound,
                                    "lease {} of fenced {}:{} revoked at {:?} before on_fence returned ({}) and its permits ended ({}), bound {:?}",
                                    lease,
                                    lock,
                                    token,
                                    now,
                                    rec.delivered,
                                    ended,
                                    bound
                                );
                            }
                        }
                        self.svc.revoke(lease);
                        self.revoked.push(lease);
                        prop_assert_ne!(self.m.lease(), Some(lease), "revoked its own lease");
                    }
                    Action::Deadline => {}
                    Action::Fence { lock, token } => {
                        let reason = match &prev {
                            Some(Action::Transition { lock: l, change })
                                if *l == lock && change.to == State::Fenced =>
                            {
                                Some(change.reason)
                            }
                            _ => None,
                        };
                        prop_assert!(
                            matches!(
                                reason,
                                Some(Reason::Deadline | Reason::LeaseLost | Reason::LockLost)
                            ),
                            "fence of {}:{} after {:?}",
                            lock,
                            token,
                            prev
                        );
                        prop_assert_ne!(self.m.token(lock), Some(token));
                        let rec = self.tokens.get_mut(&(lock, token));
                        prop_assert!(rec.is_some(), "fence of {}:{} never acquired", lock, token);
                        let rec = rec.unwrap();
                        prop_assert!(!rec.released, "fence of released {}:{}", lock, token);
                        prop_assert_eq!(rec.fences, 0, "second fence of {}:{}", lock, token);
                        rec.fences = 1;
                        rec.lock_lost = reason == Some(Reason::LockLost);
                        self.undelivered.push((lock, token));
                    }
                    Action::Acquired { lock, token } => {
                        let last = self.last_acquired.get(&lock).copied();
                        prop_assert!(
                            last.is_none_or(|last| token > last),
                            "token {} of {} after {:?}",
                            token,
                            lock,
                            last
                        );
                        self.last_acquired.insert(lock, token);
                        let lease = self.m.lease();
                        prop_assert!(lease.is_some(), "acquired without a lease");
                        self.tokens.insert(
                            (lock, token),
                            TokenRecord {
                                lease: lease.unwrap(),
                                fences: 0,
                                lock_lost: false,
                                released: false,
                                delivered: false,
                            },
                        );
                    }
                    Action::AcquireFailed { .. }
                    | Action::AcquireRefused { .. }
                    | Action::ReleaseDone { .. }
                    | Action::CloseDone { .. } => {}
                    // The driver drops the call: no reply comes.
                    Action::Abandon { req } => self.outstanding.retain(|r| r.req != req),
                    Action::Drained { lock } => {
                        // Reported for a drain or fence begun earlier, when
                        // no permit of the lock is in flight; a return to
                        // Holding cancels it.
                        prop_assert!(
                            self.states[&lock] != State::Holding,
                            "drained while holding"
                        );
                        let left = self.left_holding.get_mut(&lock).expect("known");
                        prop_assert!(*left, "drained of {} without a drain or fence", lock);
                        *left = false;
                        prop_assert!(!self.permits.iter().any(|p| p.0 == lock));
                    }
                }
                prev = Some(a.clone());
            }
            Ok(())
        }

        fn push(&mut self, req: ReqId, kind: Kind) {
            self.outstanding.push(Request {
                req,
                kind,
                sent: self.now,
            });
            if self.outstanding.len() > 48 {
                // Deletes are retried until done: never lost.
                if let Some(i) = self
                    .outstanding
                    .iter()
                    .position(|r| !matches!(r.kind, Kind::Unlock { .. }))
                {
                    self.outstanding.remove(i);
                }
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
                let l = &self.svc.leases[&lease.unwrap()];
                prop_assert!(
                    d + self.opts.margin <= l.expiry,
                    "deadline {:?} + margin {:?} later than server expiry {:?}",
                    d,
                    self.opts.margin,
                    l.expiry
                );
                for &lock in self.names.keys() {
                    prop_assert!(m.permit(lock, d).is_err());
                    prop_assert!(m.permit(lock, d + Duration::from_secs(3600)).is_err());
                }
            }
            // permit(): only while Holding and before the deadline, and then
            // the service holds the lock for this lease and token: its key
            // is live, has the token as its revision, and is the lowest of
            // its name (no contender, no other lease of ours before it).
            let mut working: BTreeMap<&str, LockId> = BTreeMap::new();
            for (&lock, &name) in &self.names {
                let should =
                    m.state(lock) == State::Holding && m.deadline().is_some_and(|d| now < d);
                match m.permit(lock, now) {
                    Ok((token, d)) => {
                        prop_assert!(
                            should,
                            "permit of {} in {:?} at {:?}",
                            lock,
                            m.state(lock),
                            now
                        );
                        prop_assert!(now < d);
                        prop_assert_eq!(Some(d), m.deadline());
                        prop_assert_eq!(Some(token), m.token(lock));
                        let lease = m.lease().expect("a deadline has a lease");
                        prop_assert!(
                            self.svc.alive(lease, now),
                            "permit of {} on a dead lease",
                            lock
                        );
                        prop_assert_eq!(
                            self.svc.key(name, Owner::Lease(lease), now),
                            Some(token.get()),
                            "permit of {}:{} ({}) without its key",
                            lock,
                            token,
                            name
                        );
                        prop_assert_eq!(
                            self.svc.holder(name, now),
                            Some((Owner::Lease(lease), token.get())),
                            "permit of {}:{} ({}) while another holds the name",
                            lock,
                            token,
                            name
                        );
                        if let Some(other) = working.insert(name, lock) {
                            prop_assert!(false, "{} and {} both work on {}", other, lock, name);
                        }
                        prop_assert_eq!(m.write_lease(now, lock, token), Some(lease));
                    }
                    Err(_) => prop_assert!(!should, "{} refused in Holding at {:?}", lock, now),
                }
            }
            // Fence exactly once per token lost without release.
            for (&(lock, t), rec) in &self.tokens {
                if rec.released || m.token(lock) == Some(t) {
                    prop_assert_eq!(rec.fences, 0, "token {}:{}", lock, t);
                } else {
                    prop_assert_eq!(rec.fences, 1, "token {}:{} lost without one fence", lock, t);
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
                for &lock in self.names.keys() {
                    if matches!(self.m.state(lock), State::Holding | State::Draining) {
                        // The deadline is among the timers: no fence is late.
                        prop_assert!(self.m.deadline().is_some_and(|d| d > end));
                    }
                }
            }
            self.now = end;
            self.check()
        }

        fn healthy(&mut self, ms: u64, lag_pct: u8) -> R {
            let start = self.now;
            let end = start + Duration::from_millis(ms);
            let lag = self.opts.keepalive_timeout * u32::from(lag_pct % 100) / 100;
            let mut served: HashSet<ReqId> = HashSet::new();
            let mut n = 0;
            loop {
                n += 1;
                prop_assert!(n < 100_000, "healthy spell makes no progress");
                let reply = self
                    .outstanding
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.sent >= start && !served.contains(&r.req))
                    .map(|(i, r)| (r.sent + lag, i))
                    .min();
                let timer = self.m.poll_timeout().filter(|&t| t <= end);
                match reply {
                    Some((t, i)) if t <= end && timer.is_none_or(|tm| t <= tm) => {
                        self.now = self.now.max(t);
                        let r = self.outstanding.remove(i);
                        served.insert(r.req);
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

        /// Puts the request back: not answered yet.
        fn keep(&mut self, r: Request) -> R {
            self.outstanding.push(r);
            self.check()
        }

        fn reply(&mut self, r: Request, outcome: Outcome, processed: u8) -> R {
            let now = self.now;
            let span = (now - r.sent).as_nanos() as u64;
            let p = r.sent + Duration::from_nanos(span / 255 * u64::from(processed));
            let req = r.req;
            match r.kind.clone() {
                Kind::Grant { ttl } => match outcome {
                    Outcome::Ok | Outcome::Odd => {
                        let ttl = match (outcome, processed % 4) {
                            (Outcome::Ok, _) => ttl,
                            (_, 0) => Duration::ZERO,
                            (_, k) => ttl * u32::from(k) / 2,
                        };
                        let lease = self.svc.new_lease(ttl, p, r.sent);
                        self.handle(Event::LeaseGranted { req, lease, ttl })
                    }
                    _ => self.handle(Event::GrantFailed {
                        req,
                        error: DOWN.into(),
                    }),
                },
                Kind::Lock { lock, lease, wait } => {
                    let name = self.names[&lock];
                    match outcome {
                        Outcome::Lost => {
                            self.svc.revoke(lease);
                            self.handle(Event::LeaseLost { lease })
                        }
                        _ if !self.svc.alive(lease, p) || !self.svc.alive(lease, now) => {
                            self.handle(Event::LeaseLost { lease })
                        }
                        Outcome::Fail => {
                            if processed % 2 == 1 {
                                self.svc.put(name, Owner::Lease(lease), p);
                            }
                            self.handle(Event::LockFailed {
                                req,
                                lock,
                                busy: false,
                                error: DOWN.into(),
                            })
                        }
                        Outcome::Busy => {
                            if processed % 2 == 1 {
                                self.svc.put(name, Owner::Lease(lease), p);
                            }
                            self.handle(Event::LockFailed {
                                req,
                                lock,
                                busy: true,
                                error: DOWN.into(),
                            })
                        }
                        Outcome::Ok | Outcome::Odd => {
                            let rev = self.svc.put(name, Owner::Lease(lease), p);
                            let ours =
                                self.svc.holder(name, now) == Some((Owner::Lease(lease), rev));
                            if ours {
                                let token = match (outcome, self.last_acquired.get(&lock)) {
                                    (Outcome::Odd, Some(last)) => {
                                        Token(last.get() - u64::from(processed % 3).min(last.get()))
                                    }
                                    _ => Token(rev),
                                };
                                self.handle(Event::Locked {
                                    req,
                                    lock,
                                    lease,
                                    token,
                                })
                            } else if wait {
                                // Queued: the answer comes when it is its turn.
                                self.keep(r)
                            } else {
                                if processed % 2 == 0 {
                                    self.svc.delete(name, Owner::Lease(lease), None);
                                }
                                self.handle(Event::LockFailed {
                                    req,
                                    lock,
                                    busy: true,
                                    error: DOWN.into(),
                                })
                            }
                        }
                    }
                }
                Kind::Unlock { lock, lease, token } => {
                    if matches!(outcome, Outcome::Fail) {
                        // Retried until done.
                        return self.keep(r);
                    }
                    let name = self.names[&lock];
                    if token.is_none() {
                        // Ordered after the lock requests of this key still
                        // in flight: each is served first (its answer may
                        // still come), or never.
                        let (racing, rest): (Vec<Request>, Vec<Request>) =
                            std::mem::take(&mut self.outstanding)
                                .into_iter()
                                .partition(|q| {
                                    matches!(q.kind, Kind::Lock { lock: l, lease: le, .. }
                                    if le == lease && self.names[&l] == name)
                                });
                        self.outstanding = rest;
                        for q in racing {
                            let Kind::Lock { lock: l, .. } = q.kind else {
                                unreachable!()
                            };
                            if processed % 2 == 1 && self.svc.alive(lease, now) {
                                let rev = self.svc.put(name, Owner::Lease(lease), now);
                                if self.svc.holder(name, now) == Some((Owner::Lease(lease), rev)) {
                                    self.outstanding.push(Request {
                                        req: q.req,
                                        kind: Kind::Late(Event::Locked {
                                            req: q.req,
                                            lock: l,
                                            lease,
                                            token: Token(rev),
                                        }),
                                        sent: q.sent,
                                    });
                                }
                            }
                        }
                    }
                    self.svc.delete(name, Owner::Lease(lease), token);
                    self.handle(Event::Unlocked { req, lock })
                }
                Kind::Keepalive { lease } => match outcome {
                    Outcome::Odd
                        if processed % 2 == 1
                            && self.m.lease() == Some(lease)
                            && self.m.deadline().is_some_and(|d| now < d)
                            && now < r.sent + self.opts.keepalive_timeout
                            && self.svc.alive(lease, now) =>
                    {
                        // The server renews with a longer TTL, and says so in
                        // a reply the machine is waiting for: a TTL raised
                        // in silence could not be known by any client.
                        let before = self.svc.raise_ttl(lease, p);
                        let ttl = self.svc.leases[&lease].ttl;
                        self.handle(Event::KeepaliveConfirmed { req, ttl })?;
                        let taken = self.m.lease() == Some(lease)
                            && self
                                .m
                                .deadline()
                                .is_some_and(|d| d >= r.sent + ttl - self.opts.margin);
                        if !taken {
                            // Superseded by a newer confirmation: as if it
                            // was served with the old TTL.
                            let (ttl, expiry) = before;
                            let l = self.svc.leases.get_mut(&lease).expect("known");
                            l.ttl = ttl;
                            l.expiry = expiry.max(p + ttl);
                        }
                        Ok(())
                    }
                    Outcome::Ok | Outcome::Odd => match self.svc.accept_keepalive(lease, p, now) {
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
                        self.svc.revoke(lease);
                        self.handle(Event::LeaseLost { lease })
                    }
                    Outcome::Busy => {
                        self.svc.accept_keepalive(lease, p, now);
                        self.handle(Event::KeepaliveFailed { req })
                    }
                },
                Kind::Late(ev) => match outcome {
                    Outcome::Fail => self.check(),
                    _ => self.handle(ev),
                },
            }
        }

        fn drop_request(&mut self, r: Request, processed: bool) -> R {
            if !processed {
                if matches!(r.kind, Kind::Unlock { .. }) {
                    // Retried until done.
                    return self.keep(r);
                }
                return self.check();
            }
            match r.kind {
                Kind::Grant { ttl } => {
                    // An orphan lease the holder never hears of.
                    self.svc.new_lease(ttl, r.sent, r.sent);
                }
                Kind::Lock { lock, lease, .. } => {
                    if self.svc.alive(lease, r.sent) {
                        let name = self.names[&lock];
                        self.svc.put(name, Owner::Lease(lease), r.sent);
                    }
                }
                Kind::Keepalive { lease } => {
                    self.svc.accept_keepalive(lease, r.sent, self.now);
                }
                Kind::Unlock { .. } => return self.keep(r),
                Kind::Late(_) => {}
            }
            self.check()
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
                Op::Drop { pick, processed } => match self.take(false, pick) {
                    Some(r) => self.drop_request(r, processed),
                    None => self.check(),
                },
                Op::Replay { pick } => {
                    if self.delivered.is_empty() {
                        return self.check();
                    }
                    let ev = self.delivered[pick.index(self.delivered.len())].clone();
                    self.handle(ev)
                }
                Op::Acquire {
                    lock,
                    wait,
                    until_ms,
                } => {
                    let lock = self.lock(lock);
                    let until = until_ms.map(|d| self.now + Duration::from_millis(d));
                    self.handle(Event::Acquire { lock, wait, until })
                }
                Op::Release { lock } => {
                    let lock = self.lock(lock);
                    self.handle(Event::Release { lock })
                }
                Op::Close => self.handle(Event::Close { waiter: None }),
                Op::Permit { lock } => {
                    let lock = self.lock(lock);
                    if let Ok((token, _)) = self.m.permit(lock, self.now) {
                        self.permits.push((lock, token));
                    }
                    self.check()
                }
                Op::EndPermit { pick } => {
                    if !self.permits.is_empty() {
                        let i = pick.index(self.permits.len());
                        self.permits.remove(i);
                    }
                    self.check()
                }
                Op::PermitsEnded { lock } => {
                    let lock = self.lock(lock);
                    if !self.m.watching_permits(lock) || self.permits.iter().any(|p| p.0 == lock) {
                        return self.check();
                    }
                    self.handle(Event::PermitsEnded { lock })
                }
                Op::LatePermitsEnded {
                    lock,
                    before_pct,
                    permit,
                    after_pct,
                } => {
                    let lock = self.lock(lock);
                    if !self.m.watching_permits(lock) || self.permits.iter().any(|p| p.0 == lock) {
                        return self.check();
                    }
                    let left = self
                        .m
                        .deadline()
                        .map_or(Duration::from_secs(1), |d| d.saturating_since(self.now));
                    self.now = self.now + left * u32::from(before_pct % 101) / 100;
                    if permit && let Ok((token, _)) = self.m.permit(lock, self.now) {
                        self.permits.push((lock, token));
                    }
                    self.now = self.now + left * u32::from(after_pct % 101) / 50;
                    self.handle(Event::PermitsEnded { lock })
                }
                Op::FenceDelivered { pick } => {
                    if self.undelivered.is_empty() {
                        return self.check();
                    }
                    let (lock, token) = self.undelivered.remove(pick.index(self.undelivered.len()));
                    self.tokens
                        .get_mut(&(lock, token))
                        .expect("fenced")
                        .delivered = true;
                    self.handle(Event::FenceDelivered { lock, token })
                }
                Op::DeleteKey { lock } => {
                    let lock = self.lock(lock);
                    let name = self.names[&lock];
                    match (self.m.token(lock), self.m.lease()) {
                        (Some(token), Some(lease)) => {
                            self.svc.delete(name, Owner::Lease(lease), Some(token));
                            self.handle(Event::LockLost { lock, token })
                        }
                        _ => match self.tokens.keys().rev().find(|(l, _)| *l == lock) {
                            Some(&(_, token)) => self.handle(Event::LockLost { lock, token }),
                            None => self.check(),
                        },
                    }
                }
                Op::ContenderLock { name } => {
                    let name = NAMES[name.index(NAMES.len())];
                    let now = self.now;
                    self.svc.put(name, Owner::Contender, now);
                    self.check()
                }
                Op::ContenderUnlock { name } => {
                    let name = NAMES[name.index(NAMES.len())];
                    self.svc.delete(name, Owner::Contender, None);
                    self.check()
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
            8 => (
                any::<Index>(),
                proptest::bool::weighted(0.7),
                proptest::option::of(0u64..10_000)
            )
                .prop_map(|(lock, wait, until_ms)| Op::Acquire { lock, wait, until_ms }),
            3 => any::<Index>().prop_map(|lock| Op::Release { lock }),
            1 => Just(Op::Close),
            6 => any::<Index>().prop_map(|lock| Op::Permit { lock }),
            4 => any::<Index>().prop_map(|pick| Op::EndPermit { pick }),
            4 => any::<Index>().prop_map(|lock| Op::PermitsEnded { lock }),
            3 => (any::<Index>(), any::<u8>(), proptest::bool::weighted(0.8), any::<u8>())
                .prop_map(|(lock, before_pct, permit, after_pct)| Op::LatePermitsEnded {
                    lock,
                    before_pct,
                    permit,
                    after_pct
                }),
            4 => any::<Index>().prop_map(|pick| Op::FenceDelivered { pick }),
            1 => any::<Index>().prop_map(|lock| Op::DeleteKey { lock }),
            2 => any::<Index>().prop_map(|name| Op::ContenderLock { name }),
            2 => any::<Index>().prop_map(|name| Op::ContenderUnlock { name }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: cases(),
            ..ProptestConfig::default()
        })]

        #[test]
        fn no_lock_of_the_session_outlives_the_service(
            opts in options(),
            start_ms in 1u64..1_000_000,
            names in proptest::collection::vec(0usize..NAMES.len(), 2..=4),
            first_wait in proptest::bool::weighted(0.8),
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            prop_assert!(opts.validate().is_ok(), "{:?}", opts);
            let mut w = World::new(opts, at(start_ms), &names);
            w.handle(Event::Acquire { lock: 1, wait: first_wait, until: None })?;
            for op in ops {
                w.step(op)?;
            }
        }
    }
}

// Resignation (an election's leader steps down, docs/elections.md): no
// permit from the resign on; the key's delete waits for the permits in
// flight, up to the grace, on the machine's own timer.

#[test]
fn resign_deletes_the_key_only_once_the_permits_in_flight_ended() {
    let mut s = holding();
    s.all = true;
    assert!(s.m.permit(A, at(1300)).is_ok());
    let a = s.ev(
        1500,
        Event::Resign {
            lock: A,
            grace: ms(2000),
        },
    );
    assert_eq!(
        a,
        vec![tr(A, State::Holding, State::Released, Reason::Release)]
    );
    assert_eq!(s.m.permit(A, at(1500)), Err(Refused::Released));
    // The driver watches the permits: one is in flight.
    assert!(s.m.watching_permits(A));
    assert!(!s.m.finished(A));
    assert_eq!(s.m.poll_timeout(), Some(at(2000)), "the keepalive first");
    // Keepalives go on; no delete until the permit ends.
    let k = keepalives(&s.run_to(2000));
    s.ev(
        2050,
        Event::KeepaliveConfirmed {
            req: k[0].1,
            ttl: ms(4000),
        },
    );
    let a = s.ev(2400, Event::PermitsEnded { lock: A });
    assert_eq!(a[0], Action::Drained { lock: A });
    let (u, token) = unlock_req(&a, A);
    assert_eq!(token, Some(TOKEN), "only this acquisition's key");
    assert!(!a.contains(&Action::ReleaseDone { lock: A }), "{a:?}");
    let a = s.ev(2450, Event::Unlocked { req: u, lock: A });
    assert_eq!(a, vec![Action::ReleaseDone { lock: A }]);
    assert!(s.m.finished(A));
}

#[test]
fn resign_deletes_the_key_at_the_grace_with_a_permit_still_in_flight() {
    let mut s = holding();
    s.all = true;
    s.ev(
        1500,
        Event::Resign {
            lock: A,
            grace: ms(300),
        },
    );
    // The grace's end is a timer of its own.
    assert_eq!(s.m.poll_timeout(), Some(at(1800)));
    let a = s.run_to(1799);
    assert_eq!(
        unlocks(&a.iter().map(|(_, a)| a.clone()).collect::<Vec<_>>()),
        0
    );
    let a: Vec<Action> = s.run_to(1800).into_iter().map(|(_, a)| a).collect();
    let (u, token) = unlock_req(&a, A);
    assert_eq!(token, Some(TOKEN));
    let a = s.ev(1850, Event::Unlocked { req: u, lock: A });
    assert_eq!(a, vec![Action::ReleaseDone { lock: A }]);
    // The permit ending later deletes nothing more.
    let a = s.ev(1900, Event::PermitsEnded { lock: A });
    assert_eq!(unlocks(&a), 0, "{a:?}");
}

#[test]
fn resign_while_not_holding_is_a_release() {
    let mut s = Sim::new(opts());
    s.all = true;
    let a = s.ev(
        1000,
        Event::Resign {
            lock: A,
            grace: ms(300),
        },
    );
    assert_eq!(
        a,
        vec![
            tr(A, State::Idle, State::Released, Reason::Release),
            Action::ReleaseDone { lock: A }
        ]
    );
    assert!(s.m.finished(A));
}

#[test]
fn a_lease_lost_during_a_resign_answers_at_the_grace_without_a_delete() {
    let mut s = holding();
    s.all = true;
    s.ev(
        1500,
        Event::Resign {
            lock: A,
            grace: ms(1000),
        },
    );
    s.ev(1600, Event::LeaseLost { lease: LEASE });
    let a: Vec<Action> = s.run_to(2500).into_iter().map(|(_, a)| a).collect();
    assert_eq!(unlocks(&a), 0, "the key went with the lease: {a:?}");
    assert!(a.contains(&Action::ReleaseDone { lock: A }), "{a:?}");
}
