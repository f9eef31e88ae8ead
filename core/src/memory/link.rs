//! One client's link to the embedded service: its fault switches (a
//! partition, lost, delayed or failed replies) and the leases granted over
//! it.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::machine::LeaseId;

/// The link's switches and what waits on them.
#[derive(Default)]
pub(super) struct Link {
    pub(super) faults: Mutex<Faults>,
    pub(super) healed: Notify,
    pub(super) leases: Mutex<Vec<LeaseId>>,
    /// The bounds each grant, keepalive and key watch came with.
    #[cfg(test)]
    pub(super) bounds: Mutex<Vec<(&'static str, crate::backend::Bounds)>>,
}

impl Link {
    pub(super) fn faults(&self) -> MutexGuard<'_, Faults> {
        crate::sync::lock(&self.faults)
    }

    pub(super) fn partitioned(&self) -> bool {
        self.faults().partitioned
    }
}

/// The fault switches of one link.
#[derive(Clone, Default)]
pub(super) struct Faults {
    pub(super) partitioned: bool,
    pub(super) drop_replies: bool,
    pub(super) delay: Duration,
    pub(super) fail: Option<String>,
}
