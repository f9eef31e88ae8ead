//! The one clock every dlock decision is read from.
//!
//! Deadlines must keep counting while the machine is suspended: a laptop that
//! sleeps for a minute has lost its lease, whatever `CLOCK_MONOTONIC` says. On
//! Linux (and Android) the clock is `CLOCK_BOOTTIME`; on Apple platforms
//! `CLOCK_MONOTONIC`, which there counts through sleep; elsewhere
//! `std::time::Instant`, which may stop during suspend (documented fallback).
//! The wall clock is never used.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// An instant on dlock's clock, in nanoseconds from the clock's origin
/// (boot, for the system clock). Only differences and order carry meaning.
#[derive(Copy, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The clock's origin.
    pub const ZERO: Instant = Instant(0);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(duration_nanos(d)))
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(duration_nanos(d)))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.0 as f64 / 1e9)
    }
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The longest a driver timer sleeps before it reads the clock again. Tokio's
/// timers run on `CLOCK_MONOTONIC`; re-reading the boot clock this often bounds
/// how late a fence callback can be after a suspend. `permit()` is never late:
/// it reads the clock itself.
const MAX_TIMER_SLICE: Duration = Duration::from_millis(250);

/// The clock: the system's suspend-aware monotonic clock, or a manual clock
/// that tests (and applications testing their own fence handling) move by hand.
#[derive(Clone, Default)]
pub struct Clock(Kind);

#[derive(Clone, Default)]
enum Kind {
    #[default]
    System,
    Manual(Arc<ManualInner>),
}

struct ManualInner {
    now: AtomicU64,
    moved: tokio::sync::Notify,
}

impl Clock {
    /// The system clock (`CLOCK_BOOTTIME` on Linux).
    pub fn system() -> Clock {
        Clock(Kind::System)
    }

    /// Reads the clock.
    #[inline]
    pub fn now(&self) -> Instant {
        match &self.0 {
            Kind::System => system_now(),
            Kind::Manual(m) => Instant(m.now.load(Ordering::Acquire)),
        }
    }

    /// Whether this is a manual clock.
    pub fn is_manual(&self) -> bool {
        matches!(self.0, Kind::Manual(_))
    }

    /// Completes once `now() >= at`.
    pub(crate) async fn sleep_until(&self, at: Instant) {
        match &self.0 {
            Kind::System => loop {
                let now = system_now();
                if now >= at {
                    return;
                }
                tokio::time::sleep((at - now).min(MAX_TIMER_SLICE)).await;
            },
            Kind::Manual(m) => loop {
                let moved = m.moved.notified();
                tokio::pin!(moved);
                moved.as_mut().enable();
                if Instant(m.now.load(Ordering::Acquire)) >= at {
                    return;
                }
                moved.await;
            },
        }
    }

    /// Completes after `d` has passed on this clock.
    pub(crate) async fn sleep(&self, d: Duration) {
        self.sleep_until(self.now() + d).await
    }
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::System => f.write_str("Clock::system"),
            Kind::Manual(m) => write!(
                f,
                "Clock::manual({:?})",
                Instant(m.now.load(Ordering::Relaxed))
            ),
        }
    }
}

/// A clock that moves only when told to. Everything built on its [`Clock`]
/// (the memory backend's expiry, the driver's timers, `permit()`) follows it,
/// so a test can jump past a deadline without sleeping.
#[derive(Clone)]
pub struct ManualClock(Arc<ManualInner>);

impl ManualClock {
    /// A manual clock standing at `start`.
    pub fn new(start: Instant) -> ManualClock {
        ManualClock(Arc::new(ManualInner {
            now: AtomicU64::new(start.0),
            moved: tokio::sync::Notify::new(),
        }))
    }

    /// The [`Clock`] to hand to a client or a memory service.
    pub fn clock(&self) -> Clock {
        Clock(Kind::Manual(self.0.clone()))
    }

    /// The current reading.
    pub fn now(&self) -> Instant {
        Instant(self.0.now.load(Ordering::Acquire))
    }

    /// Moves the clock forward by `d` and wakes every timer that is due.
    pub fn advance(&self, d: Duration) {
        self.0.now.fetch_add(duration_nanos(d), Ordering::AcqRel);
        self.0.moved.notify_waiters();
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new(Instant::ZERO)
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
const CLOCK_ID: libc::clockid_t = libc::CLOCK_BOOTTIME;
#[cfg(any(target_os = "macos", target_os = "ios"))]
const CLOCK_ID: libc::clockid_t = libc::CLOCK_MONOTONIC;

/// Reads the suspend-aware system clock.
#[cfg(any(
    target_os = "linux",
    target_os = "android",
    target_os = "macos",
    target_os = "ios"
))]
#[inline]
pub fn system_now() -> Instant {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is supported on
    // every kernel this cfg admits (CLOCK_BOOTTIME since Linux 2.6.39).
    let rc = unsafe { libc::clock_gettime(CLOCK_ID, &mut ts) };
    debug_assert_eq!(rc, 0);
    Instant(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// Reads the fallback clock (`std::time::Instant`, which may stop during
/// suspend on this platform).
#[cfg(not(any(
    target_os = "linux",
    target_os = "android",
    target_os = "macos",
    target_os = "ios"
)))]
pub fn system_now() -> Instant {
    use std::sync::OnceLock;
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(std::time::Instant::now);
    Instant(duration_nanos(origin.elapsed()) + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_moves_forward() {
        let c = Clock::system();
        let a = c.now();
        std::thread::sleep(Duration::from_millis(2));
        let b = c.now();
        assert!(b - a >= Duration::from_millis(2), "{a:?} {b:?}");
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let m = ManualClock::default();
        let c = m.clock();
        assert_eq!(c.now(), Instant::ZERO);
        m.advance(Duration::from_secs(3));
        assert_eq!(c.now(), Instant::from_nanos(3_000_000_000));
        assert!(c.is_manual());
    }

    #[test]
    fn instant_arithmetic_saturates() {
        let t = Instant::from_nanos(5);
        assert_eq!(t - Duration::from_secs(1), Instant::ZERO);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(
            Instant::from_nanos(u64::MAX) + Duration::from_secs(1),
            Instant::from_nanos(u64::MAX)
        );
    }
}
