//! `permit()` + drop on a held lock, beside a bare read of the same clock.
//! Target: the permit path's median within 1.5x the clock read, no allocation.
//!
//! Run: `cargo bench -p dlock --bench permit`

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use dlock::{Client, Clock};

fn permit(c: &mut Criterion) {
    let client = Client::memory();
    let lock = client.lock("bench/permit").unwrap();
    lock.acquire(Duration::from_secs(5)).unwrap();
    let clock = Clock::system();

    let mut g = c.benchmark_group("permit");
    g.bench_function("clock_now", |b| b.iter(|| black_box(clock.now())));
    g.bench_function("permit_drop", |b| {
        b.iter(|| {
            let p = lock.permit().unwrap();
            black_box(&p);
        })
    });
    g.bench_function("permit_owned_drop", |b| {
        b.iter(|| {
            let p = lock.permit_owned().unwrap();
            black_box(&p);
        })
    });
    g.finish();
    lock.release().unwrap();
}

criterion_group!(benches, permit);
criterion_main!(benches);
