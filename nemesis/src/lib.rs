//! The nemesis of dlock (issue 13): holder processes contend for one lock on
//! the 3-member etcd test cluster, each through fault proxies of its own,
//! while a nemesis injects random faults; every process appends JSON lines
//! to a history, and an independent checker ([`check`]) reads the history
//! alone and asserts the invariants G1-G4, liveness, and the fate of every
//! acknowledged write. The holder protocol (command line and records) is in
//! `docs/nemesis.md`, so a holder of another face can join. On PostgreSQL
//! ([`driver::Backend::Postgres`], [`pg`]) the holders reach one primary
//! through their proxies and write a user table under `dlock.guard`.
#![warn(missing_docs)]

pub mod bench;
pub mod check;
pub mod driver;
pub mod faces;
pub mod gate;
pub mod history;
pub mod holder;
pub mod pg;

// The fault proxy and the etcd test cluster of `scripts/etcd-cluster.sh`,
// shared with the core's tests (documented in `dlock-testkit`).
#[doc(hidden)]
pub use dlock_testkit::etcd as cluster;
#[doc(hidden)]
pub use dlock_testkit::proxy;

use std::time::Duration;

/// The holders' settings (those of the core's fault tests): TTL 4 s,
/// keepalive every 1 s, keepalive timeout 0.5 s, retry every 0.25 s,
/// margin 1 s.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// Lease TTL.
    pub ttl: Duration,
    /// Keepalive interval.
    pub interval: Duration,
    /// Keepalive timeout.
    pub timeout: Duration,
    /// Retry interval.
    pub retry: Duration,
    /// Margin before the TTL.
    pub margin: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            ttl: Duration::from_secs(4),
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
            retry: Duration::from_millis(250),
            margin: Duration::from_secs(1),
        }
    }
}

impl Settings {
    /// The short settings of the scenarios: TTL 2 s, keepalive 0.5 s,
    /// timeout 0.2 s, retry 0.2 s, margin 0.5 s.
    pub fn short() -> Settings {
        Settings {
            ttl: Duration::from_secs(2),
            interval: Duration::from_millis(500),
            timeout: Duration::from_millis(200),
            retry: Duration::from_millis(200),
            margin: Duration::from_millis(500),
        }
    }

    /// As dlock options (reacquire on).
    pub fn options(&self) -> dlock::Options {
        dlock::Options {
            ttl: self.ttl,
            keepalive_interval: self.interval,
            keepalive_timeout: self.timeout,
            retry_interval: self.retry,
            margin: self.margin,
            reacquire: true,
        }
    }

    /// The holder command-line flags that carry these settings.
    pub fn args(&self) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        [
            ("--ttl-ms", self.ttl),
            ("--interval-ms", self.interval),
            ("--timeout-ms", self.timeout),
            ("--retry-ms", self.retry),
            ("--margin-ms", self.margin),
        ]
        .into_iter()
        .flat_map(|(k, v)| [k.to_owned(), ms(v)])
        .collect()
    }
}

/// A small deterministic generator (xorshift64*), seeded per run and
/// printed, so a run's fault sequence can be replayed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a constant).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// A duration in `lo..=hi`.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let span = hi.saturating_sub(lo).as_millis() as u64;
        lo + Duration::from_millis(self.below(span + 1))
    }
}
