//! What the benchmarks share: the median they quote, the floor of a
//! blocking call answered by another thread (measured in the same run),
//! their count settings and the process's resident memory.

use std::time::{Duration, Instant};

/// The count in the environment variable `name`; `default` when it is
/// unset, not a number or 0.
pub fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// VmRSS of this process, in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// The median of `xs` (the mean of the middle two of an even count).
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    assert!(n > 0, "the median of nothing");
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The median over 5 runs of 2,000 round trips between two threads over
/// std channels: the floor of any blocking call answered by another thread.
pub fn thread_round_trip() -> Duration {
    let (to, from_main) = std::sync::mpsc::sync_channel::<u32>(1);
    let (back, from_echo) = std::sync::mpsc::sync_channel::<u32>(1);
    let echo = std::thread::spawn(move || {
        while let Ok(x) = from_main.recv() {
            if back.send(x).is_err() {
                return;
            }
        }
    });
    let runs: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            for i in 0..2000 {
                to.send(i).expect("echo thread");
                from_echo.recv().expect("echo thread");
            }
            t.elapsed().as_secs_f64() / 2000.0
        })
        .collect();
    drop(to);
    echo.join().expect("echo thread");
    Duration::from_secs_f64(median(&runs))
}
