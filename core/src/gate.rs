//! The permit fast path: a snapshot of the machine's state, published by the
//! driver through a seqlock and read by `permit()` with atomics only. No lock
//! the keepalive path holds, no allocation.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::clock::{Clock, Instant};
use crate::machine::{Refused, State, StateChange, Token, decide};

type FenceFn = dyn Fn(Token, u64) + Send + Sync;
type StateFn = dyn Fn(StateChange) + Send + Sync;
type TokenFn = dyn Fn(Token) + Send + Sync;
type DrainedFn = dyn Fn() + Send + Sync;

/// The application's callbacks. Each is cloned out of its mutex before it is
/// called, so a callback may register another or call back into the lock.
#[derive(Default)]
pub(crate) struct Callbacks {
    pub(crate) on_fence: Mutex<Option<Arc<FenceFn>>>,
    pub(crate) on_state_change: Mutex<Option<Arc<StateFn>>>,
    pub(crate) on_acquired: Mutex<Option<Arc<TokenFn>>>,
    pub(crate) on_drained: Mutex<Option<Arc<DrainedFn>>>,
}

fn get<T: ?Sized>(slot: &Mutex<Option<Arc<T>>>) -> Option<Arc<T>> {
    slot.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// One event for the application, delivered on the callback thread.
#[derive(Copy, Clone, Debug)]
pub(crate) enum Notice {
    StateChange(StateChange),
    Fence { token: Token, in_flight: u64 },
    Acquired(Token),
    Drained,
}

/// A callback call, ready to run on the callback thread.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

impl Callbacks {
    /// The call of the registered callback for `n`, if one is registered.
    pub(crate) fn job(&self, n: Notice) -> Option<Job> {
        match n {
            Notice::StateChange(c) => {
                get(&self.on_state_change).map(|f| Box::new(move || f(c)) as Job)
            }
            Notice::Fence { token, in_flight } => {
                get(&self.on_fence).map(|f| Box::new(move || f(token, in_flight)) as Job)
            }
            Notice::Acquired(t) => get(&self.on_acquired).map(|f| Box::new(move || f(t)) as Job),
            Notice::Drained => get(&self.on_drained).map(|f| Box::new(move || f()) as Job),
        }
    }
}

/// A consistent reading of the published state.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Snapshot {
    pub(crate) state: State,
    pub(crate) token: Token,
    pub(crate) deadline: Instant,
}

/// Shared between a lock's handle, its permits and its driver task.
pub(crate) struct Gate {
    seq: AtomicU64,
    state: AtomicU8,
    token: AtomicU64,
    deadline: AtomicU64,
    in_flight: AtomicU64,
    /// Set when the lock leaves `Holding`; cleared by the first party that
    /// sees no permit in flight, which then fires `on_drained`.
    drain_pending: AtomicBool,
    pub(crate) clock: Clock,
    pub(crate) callbacks: Callbacks,
}

impl Gate {
    pub(crate) fn new(clock: Clock) -> Gate {
        Gate {
            seq: AtomicU64::new(0),
            state: AtomicU8::new(State::Idle as u8),
            token: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            drain_pending: AtomicBool::new(false),
            clock,
            callbacks: Callbacks::default(),
        }
    }

    /// Reads state, token and deadline as one (seqlock; the driver is the
    /// only writer).
    #[inline]
    pub(crate) fn read(&self) -> Snapshot {
        match self.try_read() {
            Some(s) => s,
            None => self.read_contended(),
        }
    }

    #[inline(always)]
    fn try_read(&self) -> Option<Snapshot> {
        let s1 = self.seq.load(SeqCst);
        if s1 & 1 != 0 {
            return None;
        }
        let state = self.state.load(Relaxed);
        let token = self.token.load(Relaxed);
        let deadline = self.deadline.load(Relaxed);
        std::sync::atomic::fence(Acquire);
        (self.seq.load(Relaxed) == s1).then(|| Snapshot {
            state: State::from_u8(state),
            token: Token(token),
            deadline: Instant::from_nanos(deadline),
        })
    }

    /// The writer was caught mid-publish: spin, and if it was preempted
    /// there, give it the core back instead of spinning out a time slice.
    #[cold]
    #[inline(never)]
    fn read_contended(&self) -> Snapshot {
        for spins in 1u32.. {
            if spins % 64 == 0 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            if let Some(s) = self.try_read() {
                return s;
            }
        }
        unreachable!("a publish never takes 2^32 spins")
    }

    /// Publishes a new snapshot (driver only).
    pub(crate) fn publish(&self, state: State, token: Option<Token>, deadline: Option<Instant>) {
        let s = self.seq.load(Relaxed);
        self.seq.store(s.wrapping_add(1), Relaxed);
        std::sync::atomic::fence(Release);
        self.state.store(state as u8, Relaxed);
        self.token.store(token.map_or(0, |t| t.0), Relaxed);
        self.deadline
            .store(deadline.map_or(0, |d| d.as_nanos()), Relaxed);
        self.seq.store(s.wrapping_add(2), SeqCst);
    }

    /// Starts one unit of work: counted in flight first, then checked, so a
    /// fence that reads `in_flight` after publishing never misses it.
    #[inline]
    pub(crate) fn enter(&self) -> Result<Snapshot, Refused> {
        if crate::forked() {
            return Err(Refused::NotHeld);
        }
        self.in_flight.fetch_add(1, SeqCst);
        let snap = self.read();
        match decide(snap.state, snap.deadline, self.clock.now()) {
            Ok(()) => Ok(snap),
            Err(r) => {
                self.exit();
                Err(r)
            }
        }
    }

    /// Ends one unit of work.
    #[inline]
    pub(crate) fn exit(&self) {
        if self.in_flight.fetch_sub(1, SeqCst) == 1 && self.drain_pending.load(SeqCst) {
            self.drained_now();
        }
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(SeqCst)
    }

    /// Whether a permit with `token` may still commit its work.
    pub(crate) fn valid(&self, token: Token) -> bool {
        let s = self.read();
        !crate::forked()
            && s.token == token
            && matches!(s.state, State::Holding | State::Draining)
            && self.clock.now() < s.deadline
    }

    /// Time left before the deadline while holding or draining.
    pub(crate) fn time_left(&self) -> Option<Duration> {
        let s = self.read();
        matches!(s.state, State::Holding | State::Draining)
            .then(|| s.deadline.saturating_since(self.clock.now()))
    }

    /// The lock left `Holding`: fire `on_drained` once no permit is in flight.
    pub(crate) fn start_drain(&self) {
        self.drain_pending.store(true, SeqCst);
        if self.in_flight.load(SeqCst) == 0 {
            self.drained_now();
        }
    }

    pub(crate) fn stop_drain(&self) {
        self.drain_pending.store(false, SeqCst);
    }

    fn drained_now(&self) {
        if self
            .drain_pending
            .compare_exchange(true, false, SeqCst, SeqCst)
            .is_ok()
        {
            crate::driver::dispatch(self.callbacks.job(Notice::Drained));
        }
    }
}
