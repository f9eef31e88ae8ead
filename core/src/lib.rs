//! # dlock
//!
//! Distributed locks whose holders stop working before the lock can be
//! given to someone else.
//!
//! A holder keeps its lease alive with a keepalive every
//! `keepalive_interval`. Its local **deadline** is the *send* time of the
//! last confirmed keepalive + TTL − margin, on a clock that counts through
//! suspend. On the first failed keepalive the lock **drains**:
//! [`Lock::permit`] refuses new work, work in flight finishes, and a
//! keepalive confirmed in time resumes. At the deadline it **fences**:
//! `on_fence` is called once, and the lock is acquired again with a strictly
//! higher fencing **token**. `permit()` reads the clock itself, so no late
//! timer can let work start after the deadline.
//!
//! ```
//! use std::time::Duration;
//! let client = dlock::Client::memory();
//! let lock = client.lock("jobs").unwrap();
//! lock.on_fence(|token, in_flight| eprintln!("lost {token}, {in_flight} in flight"));
//! let token = lock.acquire(Duration::from_secs(5)).unwrap();
//! if let Ok(permit) = lock.permit() {
//!     assert_eq!(permit.token(), token);
//!     // ... one unit of work, writing with permit.token() ...
//! }
//! lock.release().unwrap();
//! ```
//!
//! The core is sans-IO ([`machine::Holder`]); a driver thread runs the
//! keepalives and timers; callbacks run on a thread of their own. Every
//! face (C, Python, Node) converts types and calls this crate: the design
//! is `docs/design.md` in the repository.
#![warn(missing_docs)]

pub mod backend;
mod callbacks;
mod client;
pub mod clock;
pub mod codes;
mod config;
mod connect;
mod driver;
pub mod election;
mod endpoints;
mod error;
mod etcd;
mod events;
mod fence;
mod fork;
mod gate;
pub mod identity;
mod lifecycle;
pub mod log;
pub mod machine;
pub mod memory;
pub mod metrics;
mod mode;
mod observer;
pub mod options;
mod permit;
mod postgres;
mod reader;
pub mod rwlock;
pub mod semaphore;
mod session;
mod signals;
mod sync;

pub use backend::{Backend, lock_key};
pub use client::{Client, Lock, LockStats, MAX_KEY_LEN, MAX_NAME_LEN};
pub use clock::{Clock, Instant, ManualClock};
pub use codes::Code;
pub use config::{BackendConfig, ClientConfig};
pub use connect::migrate;
pub use election::{Election, Leader, Observed, Observer};
pub use endpoints::Endpoints;
pub use error::Error;
pub use etcd::{EtcdConfig, EtcdReader};
pub use events::{EventStream, LockEvent};
pub use fence::{FenceGate, Stale};
pub use fork::forked;
pub use identity::{Identity, IdentityOptions, LockHolder};
pub use lifecycle::{Acquisition, shutdown, spawn_then};
pub use machine::{Reason, Refused, State, StateChange, Token};
pub use memory::{MemoryBackend, MemoryService};
pub use metrics::Snapshot as MetricsSnapshot;
pub use options::{DEFAULT_MAX_OVERDUE, MAX_TTL, Options, PartialOptions};
pub use permit::{OwnedPermit, Permit};
pub use postgres::{GUARD_SQLSTATE, PostgresConfig, SCHEMA_SQL, SCHEMA_VERSION};
pub use reader::{LeaseTtl, LockKey, Reader};
pub use rwlock::{Mode, RwLock};
pub use semaphore::{MAX_SEMAPHORE_LIMIT, Semaphore, SemaphoreAcquisition};
pub use session::{Session, SessionStats};
