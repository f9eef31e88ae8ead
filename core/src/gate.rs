//! The permit fast path (docs/design.md §8): a snapshot of the machine's
//! state, published by the driver through a seqlock and read by `permit()`
//! with atomics only, and the count of permits in flight. No lock the
//! keepalive path holds, no allocation.
//!
//! The in-flight word also carries two flags, so that ending a permit is
//! one atomic step (a `fetch_sub`) that also tells whether anything else is
//! to be done; with no flag set, the gate is not touched again:
//! - `WATCH`: the driver waits for the count to reach zero (a drain or a
//!   fence, decided by the machine). The permit that ends last finds the
//!   driver in [`WATCHED`] (under its lock, so the driver, and with it the
//!   gate, is still there), clears the flag and wakes it.
//! - `GONE`: the lock handle was dropped. Permits keep the gate's memory
//!   alive ([`Gate::kept`]): the last one to end frees it, so a permit of a
//!   freed handle (C, Python, Node) stays safe to end.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::{Clock, Instant};
use crate::machine::{Refused, State, Token, decide};

const WATCH: u64 = 1 << 62;
const GONE: u64 = 1 << 63;
const COUNT: u64 = WATCH - 1;

/// The gates whose driver watches for the end of a drain, by address and
/// id (an address may be reused once a gate is freed; an id never is). An
/// entry is removed before its driver lets go of the gate.
static WATCHED: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

fn watched() -> std::sync::MutexGuard<'static, Vec<(usize, u64)>> {
    crate::sync::lock(&WATCHED)
}

/// A consistent reading of the published state.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Snapshot {
    pub(crate) state: State,
    pub(crate) token: Token,
    pub(crate) deadline: Instant,
}

/// The index of `r` in [`Counters::refused`], in [`Refused`]'s order (the
/// order of the metrics' `REFUSALS` labels).
fn refusal_index(r: Refused) -> usize {
    match r {
        Refused::Draining => 0,
        Refused::Fenced => 1,
        Refused::Released => 2,
        Refused::NotHeld => 3,
    }
}

/// Counters read by `Lock::stats()` and the metrics; written by the driver
/// (and a refused permit). Shared with the session's metrics list, so a
/// client's counts outlive the lock's handle (issue 32).
#[derive(Default)]
pub(crate) struct Counters {
    /// Permits refused, by `refusal_index` (`metrics::REFUSALS` order).
    pub(crate) refused: [AtomicU64; 4],
    pub(crate) acquisitions: AtomicU64,
    pub(crate) drains: AtomicU64,
    pub(crate) resumes: AtomicU64,
    pub(crate) fences_deadline: AtomicU64,
    pub(crate) fences_lease_lost: AtomicU64,
    pub(crate) fences_lock_lost: AtomicU64,
}

/// Per-lock figures beside [`Counters`], written by the driver and read by
/// the metrics at scrape time (kept here, with the gate that holds them, so
/// the metrics read the gate and the gate knows nothing of the metrics).
#[derive(Default)]
pub(crate) struct LockMetrics {
    /// When the current hold began (clock ns), 0: not holding.
    pub(crate) held_since: AtomicU64,
    /// The last deadline published (clock ns), for the fence lateness.
    pub(crate) deadline: AtomicU64,
    /// The handle is an election's candidate (`dlock_election_leader`).
    pub(crate) election: AtomicBool,
    /// A read/write lock holder's mode (0: a plain lock, 1: read, 2:
    /// write): the one copy, which the handle, the driver and the snapshot
    /// read ([`crate::Mode`]). A byte in the padding: a gate
    /// does not grow.
    pub(crate) mode: AtomicU8,
    /// The handle is a semaphore's slot: that semaphore's limit (0: a
    /// plain lock). Its name is the lock's without `/slot/<i>`.
    pub(crate) semaphore_limit: std::sync::atomic::AtomicU32,
}

impl LockMetrics {
    /// A read/write lock holder's mode (`None`: a plain lock).
    pub(crate) fn mode(&self) -> Option<crate::mode::Mode> {
        crate::mode::Mode::of_byte(self.mode.load(Acquire))
    }

    /// Sets the mode: a new holder's, or a committed downgrade's.
    pub(crate) fn set_mode(&self, mode: crate::Mode) {
        self.mode.store(mode.byte(), Release);
    }
}

/// Shared between a lock's handle, its permits and its driver task. The
/// fields `permit()` touches come first (32 bytes). Not cache-line aligned:
/// a session holds thousands of gates, and an aligned allocation costs
/// more than a gate.
#[repr(C)]
pub(crate) struct Gate {
    seq: AtomicU64,
    token: AtomicU64,
    deadline: AtomicU64,
    /// Permits in flight, plus the `WATCH` and `GONE` flags.
    flight: AtomicU64,
    pub(crate) clock: Clock,
    state: AtomicU8,
    /// Unique per gate, for [`WATCHED`].
    id: u64,
    /// Wakes the session's driver when the last permit of a watched drain
    /// ends (one `Notify` shared by every lock of the session).
    pub(crate) drained: Arc<Notify>,
    /// The reference the permits in flight share once the handle is gone.
    kept: Mutex<Option<Arc<Gate>>>,
    /// Inline, not a second allocation: the session's metrics list keeps
    /// the gate itself until it folds these counts (120 B a lock saved).
    pub(crate) counters: Counters,
    pub(crate) metrics: LockMetrics,
}

impl Gate {
    pub(crate) fn new(clock: Clock, drained: Arc<Notify>) -> Gate {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Gate {
            id: IDS.fetch_add(1, Relaxed),
            seq: AtomicU64::new(0),
            state: AtomicU8::new(State::Idle as u8),
            token: AtomicU64::new(0),
            deadline: AtomicU64::new(0),
            flight: AtomicU64::new(0),
            drained,
            kept: Mutex::new(None),
            clock,
            counters: Counters::default(),
            metrics: Default::default(),
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
        if let Some(d) = deadline {
            self.metrics.deadline.store(d.as_nanos(), Relaxed);
        }
    }

    /// Starts one unit of work: counted in flight first, then checked, so a
    /// fence that reads `in_flight` after publishing never misses it.
    #[inline(always)]
    pub(crate) fn enter(&self) -> Result<Snapshot, Refused> {
        if crate::forked() {
            return Err(Refused::NotHeld);
        }
        self.flight.fetch_add(1, SeqCst);
        let snap = self.read();
        match decide(snap.state, snap.deadline, self.clock.now()) {
            Ok(()) => Ok(snap),
            Err(r) => {
                // Counted while still in flight: after `exit` the gate
                // may be freed.
                self.refused(r);
                self.exit();
                Err(r)
            }
        }
    }

    /// Counts a refused permit (off the granted path).
    #[cold]
    #[inline(never)]
    fn refused(&self, r: Refused) {
        self.counters.refused[refusal_index(r)].fetch_add(1, Relaxed);
    }

    /// Ends one unit of work: one `fetch_sub`. Once the count is given up
    /// the gate may be freed by another thread, so what follows uses only
    /// values read before it, unless a flag says the gate is still held.
    #[inline(always)]
    pub(crate) fn exit(&self) {
        let (addr, id) = (self as *const Gate as usize, self.id);
        let prev = self.flight.fetch_sub(1, SeqCst);
        if prev & (WATCH | GONE) != 0 && prev & COUNT == 1 {
            Gate::exit_last(addr, id, prev);
        }
    }

    /// The last permit ended while the driver watched, or after the handle
    /// was dropped.
    #[cold]
    #[inline(never)]
    fn exit_last(addr: usize, id: u64, prev: u64) {
        if prev & WATCH != 0 {
            let w = watched();
            if w.contains(&(addr, id)) {
                // SAFETY: registered, so its driver still holds the gate.
                let gate = unsafe { &*(addr as *const Gate) };
                gate.flight.fetch_and(!WATCH, SeqCst);
                gate.drained.notify_one();
            }
        }
        if prev & GONE != 0 {
            // SAFETY: the handle is gone and this was the last permit: the
            // gate lives by `kept` alone, which only this call takes.
            let gate = unsafe { &*(addr as *const Gate) };
            gate.free_kept();
        }
    }

    fn free_kept(&self) {
        let kept = crate::sync::lock(&self.kept).take();
        drop(kept);
    }

    /// The lock handle is gone: the permits in flight (if any) keep the
    /// gate until the last one ends.
    pub(crate) fn orphan(self: &Arc<Self>) {
        *crate::sync::lock(&self.kept) = Some(self.clone());
        let prev = self.flight.fetch_or(GONE, SeqCst);
        if prev & COUNT == 0 {
            self.free_kept();
        }
    }

    /// Asks to be woken (through [`Gate::drained`]) once no permit is in
    /// flight; `true` if none is now (nothing armed). Driver only; the
    /// driver holds the gate until [`Gate::unwatch_drain`].
    pub(crate) fn watch_drain(&self) -> bool {
        let me = (self as *const Gate as usize, self.id);
        let mut w = watched();
        let mut cur = self.flight.load(SeqCst);
        loop {
            if cur & COUNT == 0 {
                return true;
            }
            match self
                .flight
                .compare_exchange(cur, cur | WATCH, SeqCst, SeqCst)
            {
                Ok(_) => {
                    if !w.contains(&me) {
                        w.push(me);
                    }
                    return false;
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Stops a watch (the machine no longer waits for it, or the last
    /// permit ended): no permit will look for this gate in [`WATCHED`].
    pub(crate) fn unwatch_drain(&self) {
        let me = (self as *const Gate as usize, self.id);
        let mut w = watched();
        w.retain(|e| *e != me);
        self.flight.fetch_and(!WATCH, SeqCst);
    }

    /// Whether a watch is armed: after a wake-up, `false` means the last
    /// permit ended (a wake-up left over from an earlier watch finds the
    /// current one still armed).
    pub(crate) fn watching(&self) -> bool {
        self.flight.load(SeqCst) & WATCH != 0
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.flight.load(SeqCst) & COUNT
    }

    /// Whether a permit with `token` may still commit its work: the lock
    /// still holds that very token (not a later one of a reacquisition) and
    /// its deadline has not passed.
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;

    fn gate() -> (ManualClock, Arc<Gate>) {
        let clock = ManualClock::new(Instant::from_nanos(1_000_000_000));
        let gate = Arc::new(Gate::new(clock.clock(), Arc::default()));
        (clock, gate)
    }

    #[test]
    fn a_permit_of_an_old_token_is_invalid_once_a_new_token_holds() {
        let (clock, g) = gate();
        let far = clock.now() + Duration::from_secs(10);
        g.publish(State::Holding, Some(Token(1)), Some(far));
        let old = g.enter().unwrap();
        assert!(g.valid(old.token));
        g.publish(State::Fenced, None, None);
        assert!(!g.valid(old.token));
        // Reacquired: Holding again, a later deadline, token 2.
        g.publish(State::Holding, Some(Token(2)), Some(far));
        assert!(!g.valid(old.token), "token 1 must stay dead under token 2");
        assert!(g.valid(Token(2)));
        g.exit();
    }

    #[test]
    fn the_last_permit_of_a_watched_drain_clears_the_watch() {
        let (clock, g) = gate();
        let far = clock.now() + Duration::from_secs(10);
        g.publish(State::Holding, Some(Token(1)), Some(far));
        g.enter().unwrap();
        g.enter().unwrap();
        g.publish(State::Draining, Some(Token(1)), Some(far));
        assert!(!g.watch_drain(), "two in flight: armed");
        assert!(g.watching());
        g.exit();
        assert!(g.watching(), "one still in flight");
        assert_eq!(g.enter().unwrap_err(), Refused::Draining);
        assert!(g.watching(), "a refused permit is no end of the drain");
        g.exit();
        assert!(!g.watching(), "the last one cleared it");
        assert_eq!(g.in_flight(), 0);
        assert!(g.watch_drain(), "none in flight: nothing to arm");
    }

    #[test]
    fn permits_keep_an_orphaned_gate_until_the_last_ends() {
        let (clock, g) = gate();
        let far = clock.now() + Duration::from_secs(10);
        g.publish(State::Holding, Some(Token(1)), Some(far));
        g.enter().unwrap();
        let weak = Arc::downgrade(&g);
        g.orphan();
        let raw = Arc::as_ptr(&g);
        drop(g);
        assert!(weak.upgrade().is_some(), "kept for the permit in flight");
        // SAFETY: kept alive by the permit in flight.
        unsafe { &*raw }.exit();
        assert!(weak.upgrade().is_none(), "freed by the last permit");

        let (_, g) = gate();
        let weak = Arc::downgrade(&g);
        g.orphan();
        drop(g);
        assert!(weak.upgrade().is_none(), "no permit: freed at once");
    }
}
