//! Shared test support of the dlock workspace (a dev-dependency of the
//! core, the command and the nemesis): the etcd test cluster and the one
//! switch that says it exists ([`etcd::cluster`]), the TCP fault proxy, the
//! examples' typed stories, and the parity suite of both backends.

pub mod etcd;
pub mod parity;
pub mod pg;
pub mod proxy;
pub mod story;

use std::time::Duration;

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
