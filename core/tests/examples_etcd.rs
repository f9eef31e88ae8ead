//! The Rust examples' stories on the etcd test cluster, checked on their
//! typed output (see `examples.rs`): the quickstart (A behind a relay that
//! is cut fences before B acquires a higher token) and guarded_write (etcd
//! itself refuses the stale write).
//!
//! A `test = false` target: `scripts/etcd-examples.sh` runs it by name
//! against the cluster of `scripts/etcd-cluster.sh`; without the cluster's
//! env it fails (it never passes as a skip).

// Each example includes its own copy of examples/rust/support/*.rs, as in
// its own binary.
#![allow(clippy::duplicate_mod)]

use dlock::EtcdConfig;

#[allow(dead_code)]
#[path = "../../examples/rust/guarded_write.rs"]
mod guarded_write;
#[allow(dead_code)]
#[path = "../../examples/rust/quickstart.rs"]
mod quickstart;

use dlock_testkit::etcd as etcd_cluster;
use dlock_testkit::story;
use story::Capture;

/// The cluster's plaintext members, as `DLOCK_ENDPOINTS` would give them.
fn etcd() -> Option<EtcdConfig> {
    Some(EtcdConfig::new(etcd_cluster::Cluster::from_env().members))
}

#[test]
fn quickstart_on_etcd_fences_before_b_acquires() {
    let capture = Capture::default();
    quickstart::run(capture.sink(), etcd()).expect("the quickstart runs on etcd");
    story::quickstart(&capture.events(), "etcd");
}

#[test]
fn guarded_write_on_etcd_is_refused_by_etcd() {
    let capture = Capture::default();
    guarded_write::run(capture.sink(), etcd()).expect("guarded_write runs on etcd");
    story::guarded_write(&capture.events(), "etcd");
}
