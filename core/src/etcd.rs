//! The etcd v3 backend: configuration (endpoints, TLS, auth, environment).
//!
//! CONTRACT STUB: the public types and entry points below are fixed so the
//! C, Python and Node faces can bind them; the backend itself lands with
//! the etcd issue.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Client, Error, Options};

/// Where and how to reach an etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Member endpoints, `host:port` or `http(s)://host:port`. An `https`
    /// endpoint (or a CA file) turns TLS on.
    pub endpoints: Vec<String>,
    /// CA certificate (PEM) that signs the members' certificates.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Client private key (PEM) for mutual TLS; needs `cert_file`.
    pub key_file: Option<PathBuf>,
    /// etcd user name (needs `password`).
    pub user: Option<String>,
    /// etcd password. Refused over plaintext unless
    /// `allow_plaintext_password`.
    pub password: Option<String>,
    /// Allows sending the password without TLS (tests on loopback only).
    pub allow_plaintext_password: bool,
    /// Time allowed to open a connection to one member. Default 2 s.
    pub connect_timeout: Duration,
    /// Time allowed for one unary request. Default 3 s.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// A plaintext configuration for `endpoints`, with default timeouts.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> EtcdConfig {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ca_file: None,
            cert_file: None,
            key_file: None,
            user: None,
            password: None,
            allow_plaintext_password: false,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
        }
    }

    /// Parses a comma-separated endpoint list, as in `DLOCK_ENDPOINTS`.
    pub fn parse(endpoints: &str) -> Result<EtcdConfig, Error> {
        let _ = endpoints;
        Err(Error::Backend("etcd backend: not built yet".into()))
    }

    /// Reads `DLOCK_ENDPOINTS` and the other `DLOCK_*` variables; `None`
    /// when `DLOCK_ENDPOINTS` is unset or empty.
    pub fn from_env() -> Result<Option<EtcdConfig>, Error> {
        Err(Error::Backend("etcd backend: not built yet".into()))
    }
}

impl Client {
    /// A client of the etcd cluster in `config`. Blocks while it connects.
    pub fn etcd(config: EtcdConfig, options: Options) -> Result<Client, Error> {
        let _ = (config, options);
        Err(Error::Backend("etcd backend: not built yet".into()))
    }

    /// etcd when `DLOCK_ENDPOINTS` is set (see [`EtcdConfig::from_env`]),
    /// else the process-wide embedded service.
    pub fn from_env(options: Options) -> Result<Client, Error> {
        match EtcdConfig::from_env()? {
            Some(config) => Client::etcd(config, options),
            None => Client::new(crate::MemoryService::shared().link(), options),
        }
    }
}

impl crate::Lock {
    /// Puts `key` = `value` only while this lock's key still exists with
    /// `token` as its fencing token (one etcd transaction). Fails with
    /// [`Error::Fenced`] otherwise.
    pub fn guarded_put(&self, token: crate::Token, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let _ = (token, key, value);
        Err(Error::Backend("guarded writes: not built yet".into()))
    }

    /// Deletes `key` only while this lock's key still exists with `token`
    /// as its fencing token. Fails with [`Error::Fenced`] otherwise.
    pub fn guarded_delete(&self, token: crate::Token, key: &[u8]) -> Result<(), Error> {
        let _ = (token, key);
        Err(Error::Backend("guarded writes: not built yet".into()))
    }
}
