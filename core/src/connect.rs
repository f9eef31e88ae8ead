//! The one place that chooses a backend: what a [`ClientConfig`]'s
//! [`BackendConfig`] (or a face's [`Endpoints`]) names, connected — the
//! embedded service, etcd or PostgreSQL — for a [`Client`], a [`Reader`] or
//! [`migrate`]. Nothing else in the core names a backend type to pick one:
//! [`Client`] holds a `dyn Backend`, and the embedded backend's fault
//! switches ([`Client::link`]) are found by downcasting it, here.

use std::sync::Arc;

use crate::backend::Backend;
use crate::client::Client;
use crate::clock::Clock;
use crate::config::{BackendConfig, ClientConfig};
use crate::endpoints::Endpoints;
use crate::error::Error;
use crate::etcd::EtcdConfig;
use crate::identity::Identity;
use crate::memory::{MemoryBackend, MemoryService};
use crate::options::Options;
use crate::postgres::{PostgresConfig, PostgresReader};
use crate::reader::Reader;

/// `backend` with the environment read for [`BackendConfig::FromEnv`]: the
/// process-wide embedded service when `DLOCK_ENDPOINTS` is unset.
fn resolve(backend: BackendConfig) -> Result<BackendConfig, Error> {
    let BackendConfig::FromEnv = backend else {
        return Ok(backend);
    };
    Ok(named(Endpoints::from_env()?)?
        .unwrap_or_else(|| BackendConfig::Embedded(MemoryService::shared())))
}

/// The backend the `DLOCK_*` variables name (`None`: unset), an error
/// naming `DLOCK_ENDPOINTS`.
fn named(endpoints: Option<Endpoints>) -> Result<Option<BackendConfig>, Error> {
    let prefixed = |e: Error| match e {
        Error::InvalidArgument(m) => Error::InvalidArgument(format!("DLOCK_ENDPOINTS: {m}")),
        e => e,
    };
    endpoints.map(|e| e.backend().map_err(prefixed)).transpose()
}

/// The backend `config` names, connected (on the driver: its connections
/// belong to the driver's runtime).
async fn open(backend: BackendConfig) -> Result<Arc<dyn Backend>, Error> {
    Ok(match resolve(backend)? {
        BackendConfig::Postgres(c) => Arc::new(crate::postgres::connect(c).await?),
        BackendConfig::Etcd(c) => Arc::new(crate::etcd::connect(c).await?),
        BackendConfig::Embedded(service) => Arc::new(service.link()),
        BackendConfig::FromEnv => unreachable!("resolved above"),
    })
}

impl Client {
    /// A client of the backend `config` names: validates the options,
    /// picks the backend (the environment's for [`BackendConfig::FromEnv`])
    /// and connects (etcd: to the first member that answers). Blocks.
    pub fn connect(config: ClientConfig) -> Result<Client, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        crate::driver::block_on(Client::connect_on_driver(config))?
    }

    /// [`Client::connect`] for async code, on any executor.
    pub async fn connect_async(config: ClientConfig) -> Result<Client, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        crate::driver::on_driver(Client::connect_on_driver(config))
            .await
            .map_err(|_| Error::Shutdown)?
    }

    async fn connect_on_driver(config: ClientConfig) -> Result<Client, Error> {
        let ClientConfig {
            options,
            backend,
            clock,
            identity,
        } = config;
        options.validate()?;
        identity.validate()?;
        let clock = clock.unwrap_or_else(Clock::system);
        let backend = open(backend).await?;
        let identity = identity
            .record
            .then(|| Arc::new(Identity::of_process(&identity)));
        Ok(Client::assemble(backend, options, clock, identity))
    }

    /// A client of the process-wide embedded service with default options.
    pub fn memory() -> Client {
        Client::new(MemoryService::shared().link(), Options::default())
            .expect("default options are valid")
    }

    /// A client of the etcd cluster in `config`. Blocks while it connects
    /// (and authenticates) to the first endpoint that answers; see
    /// [`Client::connect`].
    pub fn etcd(config: EtcdConfig, options: Options) -> Result<Client, Error> {
        Client::connect(ClientConfig::etcd(config).with_options(options))
    }

    /// A client of the PostgreSQL server in `config`. Blocks while it
    /// connects, checks replication and the schema; see [`Client::connect`].
    pub fn postgres(config: PostgresConfig, options: Options) -> Result<Client, Error> {
        Client::connect(ClientConfig::postgres(config).with_options(options))
    }

    /// etcd when `DLOCK_ENDPOINTS` is set (see [`EtcdConfig::from_env`]),
    /// else the process-wide embedded service; see [`Client::connect`].
    pub fn from_env(options: Options) -> Result<Client, Error> {
        Client::connect(ClientConfig::from_env().with_options(options))
    }

    /// The embedded backend's link of this client, with its fault switches
    /// (partition, lost or delayed replies, …) for applications' own fault
    /// tests; `None` on etcd and PostgreSQL.
    pub fn link(&self) -> Option<&MemoryBackend> {
        let backend: &dyn std::any::Any = self.backend().as_ref();
        backend.downcast_ref::<MemoryBackend>()
    }
}

impl EtcdConfig {
    /// Reads `DLOCK_ENDPOINTS` and the other `DLOCK_*` variables; `None`
    /// when `DLOCK_ENDPOINTS` is unset or empty.
    pub fn from_env() -> Result<Option<EtcdConfig>, Error> {
        EtcdConfig::only(named(Endpoints::from_env()?)?)
    }

    /// [`EtcdConfig::from_env`] over any source of variables (an empty
    /// value counts as unset): [`Endpoints::from_vars`], which must
    /// name etcd here.
    pub fn from_vars(
        get: impl Fn(&str) -> Result<Option<String>, Error>,
    ) -> Result<Option<EtcdConfig>, Error> {
        EtcdConfig::only(named(Endpoints::from_vars(get)?)?)
    }

    fn only(backend: Option<BackendConfig>) -> Result<Option<EtcdConfig>, Error> {
        match backend {
            None => Ok(None),
            Some(BackendConfig::Etcd(c)) => Ok(Some(c)),
            Some(_) => Err(Error::InvalidArgument(
                "DLOCK_ENDPOINTS is a PostgreSQL URL, not etcd: use ClientConfig::from_env or dlock::Endpoints"
                    .into(),
            )),
        }
    }
}

impl Reader {
    /// Connects to what `endpoints` name (blocks); the embedded service
    /// has nothing to read from outside its process.
    pub fn connect(endpoints: Endpoints) -> Result<Reader, Error> {
        Ok(Reader(match endpoints.backend()? {
            BackendConfig::Postgres(c) => Arc::new(PostgresReader::connect(&c)?),
            BackendConfig::Etcd(c) => Arc::new(c.connect_reader()?),
            _ => {
                return Err(Error::InvalidArgument(
                    "a reader needs etcd endpoints or a PostgreSQL URL".into(),
                ));
            }
        }))
    }
}

/// Creates or upgrades the `dlock` schema at the PostgreSQL URL that
/// `endpoints` name, as a client would on connect (`dlock postgres
/// migrate`, for a deploy step or a role that may create it); the schema
/// version afterwards. DBAs may run [`crate::SCHEMA_SQL`] instead.
pub fn migrate(endpoints: Endpoints) -> Result<i32, Error> {
    match endpoints.backend()? {
        BackendConfig::Postgres(c) => crate::postgres::migrate(&c),
        _ => Err(Error::InvalidArgument(
            "migrate needs a PostgreSQL URL (postgres:// or postgresql://); etcd has no schema"
                .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Result<Option<EtcdConfig>, Error> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        EtcdConfig::from_vars(|k| Ok(map.get(k).cloned()))
    }

    fn err(r: Result<impl std::fmt::Debug, Error>) -> String {
        match r {
            Err(e @ Error::InvalidArgument(_)) => e.to_string(),
            other => panic!("expected invalid_argument, got {other:?}"),
        }
    }

    #[test]
    fn env_unset_or_empty_is_none() {
        assert_eq!(vars(&[]).unwrap(), None);
        assert_eq!(vars(&[("DLOCK_ENDPOINTS", "  ")]).unwrap(), None);
    }

    #[test]
    fn env_reads_every_variable() {
        let c = vars(&[
            ("DLOCK_ENDPOINTS", "https://127.0.0.1:2379,127.0.0.1:2380"),
            ("DLOCK_CA_FILE", "/ca.pem"),
            ("DLOCK_CERT_FILE", "/c.pem"),
            ("DLOCK_KEY_FILE", "/k.pem"),
            ("DLOCK_USER", "root"),
            ("DLOCK_PASSWORD", "secret"),
            ("DLOCK_CONNECT_TIMEOUT_MS", "1500"),
            ("DLOCK_REQUEST_TIMEOUT_MS", "700"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoints.len(), 2);
        assert_eq!(c.ca_file, Some("/ca.pem".into()));
        assert_eq!(c.cert_file, Some("/c.pem".into()));
        assert_eq!(c.key_file, Some("/k.pem".into()));
        assert_eq!(c.user.as_deref(), Some("root"));
        assert_eq!(c.password.as_deref(), Some("secret"));
        let debug = format!("{c:?}");
        assert!(
            debug.contains("<hidden>") && !debug.contains("secret"),
            "{debug}"
        );
        assert!(!c.allow_plaintext_password);
        assert_eq!(c.connect_timeout, Duration::from_millis(1500));
        assert_eq!(c.request_timeout, Duration::from_millis(700));
    }

    #[test]
    fn env_bad_values_are_clear_errors() {
        let ep = ("DLOCK_ENDPOINTS", "127.0.0.1:2379");
        let e = err(vars(&[("DLOCK_ENDPOINTS", "nohost")]));
        assert!(e.contains("DLOCK_ENDPOINTS"), "{e}");
        for (name, value) in [
            ("DLOCK_CONNECT_TIMEOUT_MS", "0"),
            ("DLOCK_CONNECT_TIMEOUT_MS", "2s"),
            ("DLOCK_REQUEST_TIMEOUT_MS", "-5"),
            ("DLOCK_ALLOW_PLAINTEXT_PASSWORD", "maybe"),
        ] {
            let e = err(vars(&[ep, (name, value)]));
            assert!(e.contains(name) && e.contains(value), "{e}");
        }
        let e = err(vars(&[
            ep,
            ("DLOCK_CERT_FILE", "/c.pem"),
            ("DLOCK_CA_FILE", "/ca"),
        ]));
        assert!(e.contains("key file"), "{e}");
        let e = err(vars(&[ep, ("DLOCK_USER", "root")]));
        assert!(e.contains("password"), "{e}");
        let e = err(vars(&[("DLOCK_ENDPOINTS", "https://h:1")]));
        assert!(e.contains("CA file"), "{e}");
        let e = err(vars(&[
            ("DLOCK_ENDPOINTS", "https://h:1,http://h:2"),
            ("DLOCK_CA_FILE", "/ca"),
        ]));
        assert!(e.contains("plain http"), "{e}");
        let from_env = |_: &str| Err(Error::InvalidArgument("X is not valid UTF-8".into()));
        assert!(EtcdConfig::from_vars(from_env).is_err());
    }

    #[test]
    fn password_over_plaintext_is_refused_unless_allowed() {
        let plain = [
            ("DLOCK_ENDPOINTS", "127.0.0.1:2379"),
            ("DLOCK_USER", "root"),
            ("DLOCK_PASSWORD", "secret"),
        ];
        let e = err(vars(&plain));
        assert!(e.contains("plaintext"), "{e}");
        // Client::etcd checks before any connection is tried.
        let mut c = EtcdConfig::new(["127.0.0.1:1"]);
        c.user = Some("root".into());
        c.password = Some("secret".into());
        let e = err(Client::etcd(c.clone(), Options::default()).map(|_| ()));
        assert!(e.contains("plaintext"), "{e}");

        let mut allowed = plain.to_vec();
        allowed.push(("DLOCK_ALLOW_PLAINTEXT_PASSWORD", "yes"));
        assert!(vars(&allowed).unwrap().unwrap().allow_plaintext_password);
        c.ca_file = Some("/ca.pem".into());
        c.validate().unwrap();
    }

    #[test]
    fn unreadable_files_and_dead_endpoints_are_errors() {
        let mut c = EtcdConfig::new(["https://127.0.0.1:1"]);
        c.ca_file = Some("/nonexistent/ca.pem".into());
        let e = err(Client::etcd(c, Options::default()).map(|_| ()));
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");

        let mut c = EtcdConfig::new(["127.0.0.1:1"]);
        c.connect_timeout = Duration::from_millis(200);
        c.request_timeout = Duration::from_millis(200);
        match Client::etcd(c, Options::default()) {
            Err(Error::Backend(m)) => assert!(m.contains("127.0.0.1:1"), "{m}"),
            other => panic!("expected a backend error, got {:?}", other.map(|_| ())),
        }
    }

    /// Issue 28: a session with settings of its own stamps its own bounds
    /// on its grant, keepalives and key watch, whatever its client's are.
    #[test]
    fn a_session_calls_its_backend_with_its_own_bounds() {
        let client_options = crate::PartialOptions {
            ttl: Some(Duration::from_secs(10)),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let client = Client::new(MemoryService::new().link(), client_options.clone()).unwrap();
        let own = Options {
            ttl: Duration::from_secs(4),
            keepalive_interval: Duration::from_millis(100),
            keepalive_timeout: Duration::from_millis(50),
            retry_interval: Duration::from_millis(25),
            margin: Duration::from_secs(1),
            reacquire: true,
        };
        assert_ne!(client_options.keepalive_timeout, own.keepalive_timeout);
        let session = client.session(own.clone()).unwrap();
        let lock = session.lock("bounds").unwrap();
        lock.acquire(Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(350));
        lock.release().unwrap();
        let seen = client.link().expect("embedded").bounds_seen();
        let want = crate::backend::Bounds {
            timeout: own.keepalive_timeout,
            retry: own.retry_interval,
        };
        for what in ["grant", "keepalive", "watch"] {
            assert!(
                seen.iter().any(|(w, _)| *w == what),
                "no {what} in {seen:?}"
            );
        }
        assert!(seen.iter().all(|(_, b)| *b == want), "{seen:?}");
    }
}
