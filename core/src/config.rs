//! What a client is made of, before anything connects: [`ClientConfig`]
//! (the options, the clock) and [`BackendConfig`] (which lock service).
//! Every face builds one; [`crate::Endpoints`] turns a face's endpoints
//! into a [`BackendConfig`]; `connect.rs` is the one place that connects
//! what it names.

use crate::clock::Clock;
use crate::etcd::EtcdConfig;
use crate::identity::IdentityOptions;
use crate::memory::MemoryService;
use crate::options::Options;
use crate::postgres::PostgresConfig;

/// Which lock service a [`crate::Client`] talks to.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum BackendConfig {
    /// The embedded in-process service (its links have fault switches:
    /// [`crate::Client::link`]).
    Embedded(MemoryService),
    /// An etcd cluster.
    Etcd(EtcdConfig),
    /// A PostgreSQL server (docs/postgres.md).
    Postgres(PostgresConfig),
    /// What `DLOCK_ENDPOINTS` names, with the other `DLOCK_*` variables
    /// ([`crate::Endpoints::from_env`]): PostgreSQL for a `postgres://` or
    /// `postgresql://` URL, else etcd; the process-wide embedded service
    /// when it is unset.
    FromEnv,
}

/// Everything [`crate::Client::connect`] needs: the options every lock of the
/// client uses and the backend. Every face builds one of these and lets
/// the core choose and connect.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Timing and reacquire settings (validated by `connect`).
    pub options: Options,
    /// The lock service.
    pub backend: BackendConfig,
    /// The clock deadlines are read from (default: the system's
    /// [`Clock::system`]; tests give a [`crate::ManualClock`]'s).
    pub clock: Option<Clock>,
    /// The description and face recorded beside every lease of the client
    /// (docs/design.md, holder identity); validated by `connect`.
    pub identity: IdentityOptions,
}

impl ClientConfig {
    /// The process-wide embedded service, default options.
    pub fn embedded() -> ClientConfig {
        ClientConfig::embedded_in(MemoryService::shared())
    }

    /// The embedded `service`, default options.
    pub fn embedded_in(service: MemoryService) -> ClientConfig {
        ClientConfig::with_backend(BackendConfig::Embedded(service))
    }

    /// An etcd cluster, default options.
    pub fn etcd(config: EtcdConfig) -> ClientConfig {
        ClientConfig::with_backend(BackendConfig::Etcd(config))
    }

    /// A PostgreSQL server, default options.
    pub fn postgres(config: PostgresConfig) -> ClientConfig {
        ClientConfig::with_backend(BackendConfig::Postgres(config))
    }

    /// From the `DLOCK_*` environment, default options.
    pub fn from_env() -> ClientConfig {
        ClientConfig::with_backend(BackendConfig::FromEnv)
    }

    fn with_backend(backend: BackendConfig) -> ClientConfig {
        ClientConfig {
            options: Options::default(),
            backend,
            clock: None,
            identity: IdentityOptions::default(),
        }
    }

    /// The same, with `options`.
    pub fn with_options(mut self, options: Options) -> ClientConfig {
        self.options = options;
        self
    }

    /// The same, with the application's `description` recorded beside
    /// each lease of the client ([`crate::Lock::holder`], `dlock show`).
    pub fn with_description(mut self, description: impl Into<String>) -> ClientConfig {
        self.identity.description = Some(description.into());
        self
    }

    /// The same, naming the face that builds the client and its version
    /// (each face passes its own; the default is "rust" and this crate's).
    pub fn with_face(
        mut self,
        face: impl Into<String>,
        version: impl Into<String>,
    ) -> ClientConfig {
        self.identity.face = face.into();
        self.identity.version = version.into();
        self
    }
}
