//! The set-up the embedded-backend tests of the core share: a client of a
//! service with the scenarios' short settings, and polling for what
//! happens on the driver's thread.

use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, MemoryService, Options};

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A client of `service` with [`crate::short`] settings.
pub fn client(service: &MemoryService) -> Client {
    client_with(service, crate::short())
}

/// A client of `service` with [`crate::short`] settings but no reacquire:
/// a fence is final.
pub fn client_no_reacquire(service: &MemoryService) -> Client {
    client_with(
        service,
        Options {
            reacquire: false,
            ..crate::short()
        },
    )
}

/// A client of `service` with `options`.
pub fn client_with(service: &MemoryService, options: Options) -> Client {
    Client::connect(ClientConfig::embedded_in(service.clone()).with_options(options))
        .expect("embedded client")
}

/// Polls `f` every 5 ms for up to `limit`: whether it held.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        if f() {
            return true;
        }
        std::thread::sleep(ms(5));
    }
    f()
}
