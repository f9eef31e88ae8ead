//! Soak of the Rust face (issue 23; `scripts/soak.sh`, docs/testing.md
//! "Soak"): DLOCK_SOAK_CYCLES acquire/release cycles (default 100,000),
//! each on a lock of its own name (created, acquired, one permit,
//! released, dropped), and DLOCK_SOAK_PERMITS permits (default 1,000,000)
//! on one held lock. The embedded backend, or etcd when DLOCK_ENDPOINTS is
//! set. A tenth of each is a warm-up; then ten slices, each followed by a
//! sample of the RSS, open file descriptors and threads (/proc/self).
//! Asserted: the RSS never more than DLOCK_SOAK_RSS_MIB (default 4) above
//! the warm-up's, the descriptors and threads equal to the warm-up's.
//! Prints one `SOAK|...` line (the same in every face) before asserting.
//! A `test = false`, `harness = false` target: too slow for CI.

use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
struct Sample {
    rss_kib: u64,
    fds: u64,
    threads: u64,
}

fn status_field(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
}

fn sample() -> Sample {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    // The directory listing holds one descriptor of its own: not counted.
    let fds = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64 - 1;
    Sample {
        rss_kib: status_field(&status, "VmRSS:"),
        fds,
        threads: status_field(&status, "Threads:"),
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a whole number, got {v:?}"))
        })
}

fn main() {
    let cycles = env_u64("DLOCK_SOAK_CYCLES", 100_000);
    let permits = env_u64("DLOCK_SOAK_PERMITS", 1_000_000);
    let bound_mib = env_u64("DLOCK_SOAK_RSS_MIB", 4);
    let backend = if std::env::var("DLOCK_ENDPOINTS").is_ok_and(|v| !v.is_empty()) {
        "etcd"
    } else {
        "memory"
    };
    let client = dlock::Client::connect(dlock::ClientConfig::from_env()).unwrap();
    let pid = std::process::id();
    let held = client.lock(&format!("soak/rust/{pid}/held")).unwrap();
    held.on_fence(|_, _| {});
    held.acquire(Duration::from_secs(10)).unwrap();

    let mut next = 0u64;
    let mut run = |n_cycles: u64, n_permits: u64| {
        for _ in 0..n_cycles {
            let lock = client.lock(&format!("soak/rust/{pid}/{next}")).unwrap();
            next += 1;
            let token = lock.acquire(Duration::from_secs(10)).unwrap();
            let p = lock.permit().unwrap();
            assert_eq!(p.token(), token);
            drop(p);
            lock.release().unwrap();
        }
        for _ in 0..n_permits {
            let p = held.permit().unwrap();
            std::hint::black_box(p.token());
        }
    };

    run(cycles / 10, permits / 10);
    let warm = sample();
    let t0 = Instant::now();
    let mut samples = Vec::new();
    for _ in 0..10 {
        run(cycles / 10, permits / 10);
        samples.push(sample());
    }
    let seconds = t0.elapsed().as_secs_f64();
    let end = *samples.last().unwrap();
    let max_growth = samples
        .iter()
        .map(|s| s.rss_kib.saturating_sub(warm.rss_kib))
        .max()
        .unwrap();
    println!(
        "SOAK|rust|{backend}|{}|{}|{seconds:.1}|{}|{}|{max_growth}|{}|{}|{}|{}|{bound_mib}",
        cycles / 10 * 10,
        permits / 10 * 10,
        warm.rss_kib,
        end.rss_kib,
        warm.fds,
        end.fds,
        warm.threads,
        end.threads
    );
    assert!(
        max_growth < bound_mib * 1024,
        "RSS grew {max_growth} KiB after the warm-up (bound {bound_mib} MiB): {samples:?}"
    );
    for s in &samples {
        assert_eq!(
            s.fds, warm.fds,
            "open descriptors changed: warm-up {warm:?}, then {samples:?}"
        );
        assert_eq!(
            s.threads, warm.threads,
            "threads changed: warm-up {warm:?}, then {samples:?}"
        );
    }
    assert_eq!(held.in_flight(), 0);
    held.release().unwrap();
}
