//! Shared test support of the dlock workspace (a dev-dependency of the
//! core, the command and the nemesis): the etcd test cluster and the one
//! switch that says it exists ([`etcd::cluster`]), the embedded tests'
//! client ([`embedded`]), the TCP fault proxy, the
//! examples' typed stories, and the parity suite of both backends.

pub mod bench;
pub mod embedded;
pub mod etcd;
pub mod faults;
pub mod parity;
pub mod pg;
pub mod proxy;
pub mod story;
pub mod watch;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Keepalive interval of the backend tests (etcd and PostgreSQL).
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Keepalive timeout of the backend tests.
pub const TIMEOUT: Duration = Duration::from_millis(500);
/// Retry interval of the backend tests.
pub const RETRY: Duration = Duration::from_millis(250);
/// Margin of the backend tests.
pub const MARGIN: Duration = Duration::from_secs(1);

/// The settings of the backend tests with the test's own TTL and
/// reacquire. One place, so a bound a test computes from [`INTERVAL`],
/// [`TIMEOUT`] or [`MARGIN`] is the one its client runs with.
pub fn options(ttl: Duration, reacquire: bool) -> dlock::Options {
    dlock::Options {
        ttl,
        keepalive_interval: INTERVAL,
        keepalive_timeout: TIMEOUT,
        retry_interval: RETRY,
        margin: MARGIN,
        reacquire,
    }
}

/// The TTL of the backend tests (etcd and PostgreSQL).
pub const TTL: Duration = Duration::from_secs(4);

/// The settings of the backend tests: [`TTL`], the keepalive, retry and
/// margin above, and reacquire on (the etcd and PostgreSQL lock, election,
/// semaphore, read/write lock and fault tests).
pub fn backend_options() -> dlock::Options {
    options(TTL, true)
}

/// The value of `c`'s metric series of `name` with the label values
/// `labels` (a histogram's count); fails if there is none.
pub fn metric(c: &dlock::Client, name: &str, labels: &[&str]) -> f64 {
    let fs = c.snapshot().families();
    let f = fs
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name}"));
    for (l, v) in &f.series {
        if l.iter().map(String::as_str).eq(labels.iter().copied()) {
            return match v {
                dlock::metrics::Value::Number(n) => *n,
                dlock::metrics::Value::Histogram(h) => h.count as f64,
            };
        }
    }
    panic!("{name}{labels:?}: no such series in {:?}", f.series)
}

/// A lock name no other test, run or process uses:
/// `{prefix}-{pid}-{nanos}-{n}` (the servers outlive a test run).
pub fn fresh(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = dlock::clock::system_now().as_nanos();
    format!("{prefix}-{}-{t}-{n}", std::process::id())
}

/// The short settings of the scenarios: TTL 2 s, keepalive every 500 ms,
/// timeout 200 ms, retry every 200 ms, margin 500 ms.
pub fn short() -> dlock::Options {
    dlock::Options {
        ttl: Duration::from_secs(2),
        keepalive_interval: Duration::from_millis(500),
        keepalive_timeout: Duration::from_millis(200),
        retry_interval: Duration::from_millis(200),
        margin: Duration::from_millis(500),
        reacquire: true,
    }
}

/// The refusals at the guarded-write size limits, after a write at them
/// committed: `longer` (a key one byte over `MAX_KEY_LEN`) and a value one
/// byte over `MAX_VALUE_LEN` are refused naming their limit; then `key` is
/// deleted and `lock` released. Every engine checks them alike.
pub fn over_the_size_limits_refused(
    lock: &dlock::Lock,
    token: dlock::Token,
    key: &[u8],
    longer: &[u8],
) {
    let refused = |r: Result<(), dlock::Error>, limit: &str| match r {
        Err(dlock::Error::InvalidArgument(m)) => assert!(m.contains(limit), "{m}"),
        other => panic!("expected InvalidArgument naming {limit}, got {other:?}"),
    };
    refused(lock.guarded_put(token, longer, b"v"), "MAX_KEY_LEN");
    let over = vec![b'v'; dlock::election::MAX_VALUE_LEN + 1];
    refused(lock.guarded_put(token, key, &over), "MAX_VALUE_LEN");
    lock.guarded_delete(token, key).unwrap();
    lock.release().unwrap();
}

/// N + 1 contenders for the semaphore `name` of limit `n`, each on a
/// client of its own (`client()`) in a thread of its own, acquiring with
/// `wait`: each outcome beside its client (which the lock must not
/// outlive), for [`exactly_n_hold`].
pub fn n_plus_one_contend(
    client: impl Fn() -> dlock::Client,
    name: &str,
    n: u32,
    wait: Duration,
) -> Vec<(dlock::Client, Result<dlock::Lock, dlock::Error>)> {
    let threads: Vec<_> = (0..=n)
        .map(|_| {
            let c = client();
            let name = name.to_owned();
            std::thread::spawn(move || {
                let r = c.semaphore(&name, n).unwrap().acquire(wait);
                (c, r)
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The outcomes of N + 1 contenders for a semaphore of limit `n`, each
/// beside its client: exactly `n` hold and the other timed out. The
/// holders' locks.
pub fn exactly_n_hold<C>(
    results: &[(C, Result<dlock::Lock, dlock::Error>)],
    n: u32,
) -> Vec<&dlock::Lock> {
    let held: Vec<&dlock::Lock> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .collect();
    let failed: Vec<&dlock::Error> = results
        .iter()
        .filter_map(|(_, r)| r.as_ref().err())
        .collect();
    assert_eq!(held.len(), n as usize, "exactly N hold: {failed:?}");
    assert_eq!(failed, [&dlock::Error::Timeout]);
    held
}
