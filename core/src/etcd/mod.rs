//! The etcd v3 backend: configuration (endpoints, TLS, auth, environment),
//! the entry points and the [`Backend`] impl. The gRPC side is one concern a
//! file, as etcd's own `client/v3`: [`conn`] (connections and fail-over),
//! [`lease`] (grant, keepalive, revoke), [`mutex`] (the lock protocol of
//! `concurrency.Mutex`), [`watch`] (the key watch of a session), [`guarded`]
//! (writes guarded by a lock) and [`reader`] (read-only looks at the lock
//! keys, for `dlock show`).
//!
//! Environment (read by [`EtcdConfig::from_env`] and [`crate::Client::from_env`]):
//!
//! | variable | meaning |
//! | --- | --- |
//! | `DLOCK_ENDPOINTS` | comma-separated `host:port` or `http(s)://host:port`; unset or empty: the embedded backend |
//! | `DLOCK_CA_FILE` | CA certificate (PEM); turns TLS on |
//! | `DLOCK_CERT_FILE`, `DLOCK_KEY_FILE` | client certificate and key (PEM) for mutual TLS |
//! | `DLOCK_USER`, `DLOCK_PASSWORD` | etcd user authentication |
//! | `DLOCK_ALLOW_PLAINTEXT_PASSWORD` | `1`/`true`/`yes`: allow a password without TLS |
//! | `DLOCK_CONNECT_TIMEOUT_MS`, `DLOCK_REQUEST_TIMEOUT_MS` | timeouts in milliseconds |

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use crate::Error;
use crate::backend::{Backend, BackendError, Bounds, BoxFuture, Grant, KeyGone, KeyWatch, Leader};
use crate::identity::{Identity, LockHolder};
use crate::machine::{LeaseId, Token};

#[cfg(test)]
mod cluster_tests;
mod conn;
mod election;
mod guarded;
mod leaders;
mod lease;
mod mutex;
mod reader;
mod rwlock;
mod semaphore;
mod watch;

pub(crate) use conn::EtcdBackend;
pub use reader::EtcdReader;

/// Where and how to reach an etcd cluster. Its `Debug` output hides the
/// password.
#[derive(Clone, PartialEq, Eq)]
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

impl std::fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .field("allow_plaintext_password", &self.allow_plaintext_password)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
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
        let list: Vec<&str> = endpoints.split(',').map(str::trim).collect();
        if list.iter().all(|e| e.is_empty()) {
            return Err(Error::InvalidArgument("no etcd endpoint given".into()));
        }
        for e in &list {
            parse_endpoint(e)?;
        }
        Ok(EtcdConfig::new(list))
    }

    /// Whether connections use TLS: a CA file, a client certificate or an
    /// `https` endpoint turns it on.
    pub fn tls(&self) -> bool {
        self.ca_file.is_some()
            || self.cert_file.is_some()
            || self
                .endpoints
                .iter()
                .any(|e| matches!(parse_endpoint(e), Ok((Some(true), _))))
    }

    /// Checks the rules: endpoints well formed, certificate with key, user
    /// with password, TLS with a CA file, no password over plaintext unless
    /// allowed, timeouts above zero. Files are read by [`crate::Client::etcd`].
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.endpoints.is_empty() {
            return bad("no etcd endpoint given".into());
        }
        let tls = self.tls();
        for e in &self.endpoints {
            if parse_endpoint(e)?.0 == Some(false) && tls {
                return bad(format!(
                    "endpoint `{e}` is plain http but TLS is on (CA file, client certificate or an https endpoint)"
                ));
            }
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return bad("mutual TLS needs both a certificate file and a key file".into());
        }
        if tls && self.ca_file.is_none() {
            return bad("TLS needs a CA file (DLOCK_CA_FILE); no system roots are built in".into());
        }
        if self.user.is_some() != self.password.is_some() {
            return bad("etcd authentication needs both a user and a password".into());
        }
        if self.password.is_some() && !tls && !self.allow_plaintext_password {
            return bad(
                "refusing to send the etcd password over plaintext: use TLS (an https endpoint and a CA file) or set allow_plaintext_password (DLOCK_ALLOW_PLAINTEXT_PASSWORD=1)".into(),
            );
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be above zero".into());
        }
        if self.request_timeout.is_zero() {
            return bad("request_timeout must be above zero".into());
        }
        Ok(())
    }

    /// The endpoints as URLs with the scheme TLS implies.
    pub(crate) fn urls(&self) -> Vec<String> {
        let scheme = if self.tls() { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| {
                let (_, hostport) = parse_endpoint(e).expect("validated");
                format!("{scheme}://{hostport}")
            })
            .collect()
    }
}

/// Splits `[scheme://]host:port[/]` into (https?, `host:port`).
fn parse_endpoint(e: &str) -> Result<(Option<bool>, &str), Error> {
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "etcd endpoint `{e}`: {why}"
        )))
    };
    let (https, rest) = match e.split_once("://") {
        Some((s, rest)) if s.eq_ignore_ascii_case("http") => (Some(false), rest),
        Some((s, rest)) if s.eq_ignore_ascii_case("https") => (Some(true), rest),
        Some(_) => return bad("scheme must be http or https"),
        None => (None, e),
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty() {
        return bad("empty");
    }
    if rest.contains(['/', '?', '#', '@', ' ']) {
        return bad("expected host:port, without path, user or spaces");
    }
    let Some((host, port)) = rest.rsplit_once(':') else {
        return bad("missing :port");
    };
    if host.is_empty() {
        return bad("missing host");
    }
    let bracketed = host.starts_with('[') && host.ends_with(']');
    if host.contains(':') && !bracketed {
        return bad("an IPv6 address needs brackets, as in [::1]:2379");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((https, rest)),
        _ => bad("port must be a number from 1 to 65535"),
    }
}

pub(crate) fn parse_bool(name: &str, v: &str) -> Result<bool, Error> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::InvalidArgument(format!(
            "{name} must be 1/0, true/false or yes/no, got `{v}`"
        ))),
    }
}

pub(crate) fn parse_ms(name: &str, v: &str) -> Result<Duration, Error> {
    match v.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(Error::InvalidArgument(format!(
            "{name} must be a whole number of milliseconds above zero, got `{v}`"
        ))),
    }
}

/// Connects an etcd backend on the driver (its connections belong to the
/// driver's runtime, not the caller's).
pub(crate) async fn connect(config: EtcdConfig) -> Result<EtcdBackend, Error> {
    config.validate()?;
    let backend = EtcdBackend::new(&config)?;
    let b = backend.clone();
    crate::driver::on_driver(async move { b.connect_first().await })
        .await
        .map_err(|_| Error::Shutdown)??;
    Ok(backend)
}

impl Backend for EtcdBackend {
    fn grant<'a>(
        &'a self,
        ttl: Duration,
        bounds: Bounds,
        identity: Option<&'a Identity>,
    ) -> BoxFuture<'a, Result<Grant, BackendError>> {
        Box::pin(self.grant_lease(ttl, bounds, identity))
    }

    fn holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockHolder>, BackendError>> {
        Box::pin(self.holder_of(name))
    }

    fn keepalive(
        &self,
        lease: LeaseId,
        bounds: Bounds,
    ) -> BoxFuture<'_, Result<Duration, BackendError>> {
        Box::pin(self.keepalive_lease(lease, bounds))
    }

    fn lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(self.acquire(name, lease, wait))
    }

    fn lock_rw<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        mode: crate::mode::Mode,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(self.acquire_rw(name, lease, mode, wait))
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(self.revoke_lease(lease))
    }

    fn unlock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.release(name, lease, token))
    }

    /// Spawns the watch's task on the current tokio runtime (panics
    /// outside one). A key is reported at most once, and not once removed:
    /// [`KeyWatch::remove`] takes the same lock the report is sent under,
    /// so after it returns nothing more comes for its token (a report sent
    /// before may still wait in the channel). Each key is watched from its
    /// token on, so a key already gone when added is reported too.
    fn watch_keys(
        &self,
        lease: LeaseId,
        bounds: Bounds,
        gone: UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch> {
        self.spawn_key_watch(lease, bounds, gone)
    }

    fn guarded_write<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        key: &'a [u8],
        value: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.write(name, lease, token, key, value))
    }

    fn put_if_absent<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        Box::pin(self.put_absent(key, value))
    }

    fn campaign<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        value: &'a [u8],
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(self.acquire_with(name, lease, value, wait))
    }

    fn proclaim<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(self.proclaim_value(name, lease, token, value))
    }

    fn free_slot<'a>(
        &'a self,
        name: &'a str,
        limit: u32,
        wait: bool,
    ) -> BoxFuture<'a, Result<Option<u32>, BackendError>> {
        Box::pin(EtcdBackend::free_slot(self, name, limit, wait))
    }

    fn next_leader<'a>(
        &'a self,
        name: &'a str,
        last: Option<&'a Option<Leader>>,
    ) -> BoxFuture<'a, Result<Option<Leader>, BackendError>> {
        Box::pin(EtcdBackend::next_leader(self, name, last))
    }

    fn observe_leaders<'a>(
        &'a self,
        name: &'a str,
        each: &'a mut (dyn FnMut(Option<Leader>) + Send),
    ) -> BoxFuture<'a, BackendError> {
        Box::pin(EtcdBackend::observe_leaders(self, name, each))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<impl std::fmt::Debug, Error>) -> String {
        match r {
            Err(e @ Error::InvalidArgument(_)) => e.to_string(),
            other => panic!("expected invalid_argument, got {other:?}"),
        }
    }

    #[test]
    fn parse_endpoint_lists() {
        let c = EtcdConfig::parse("127.0.0.1:2379, http://a:1 ,https://[::1]:2/").unwrap();
        assert_eq!(
            c.endpoints,
            ["127.0.0.1:2379", "http://a:1", "https://[::1]:2/"]
        );
        assert_eq!(c.connect_timeout, Duration::from_secs(2));
        for bad in [
            "",
            " , ",
            "a:1,,b:2",
            "host",
            "host:0",
            "host:70000",
            "host:x",
            ":2379",
            "ftp://h:1",
            "h:1/path",
            "::1:2379",
            "user@h:1",
        ] {
            let e = err(EtcdConfig::parse(bad));
            assert!(e.contains("endpoint"), "{bad}: {e}");
        }
    }

    #[test]
    fn urls_follow_tls() {
        let c = EtcdConfig::parse("a:1,http://b:2").unwrap();
        assert!(!c.tls());
        assert_eq!(c.urls(), ["http://a:1", "http://b:2"]);
        let mut c = EtcdConfig::parse("a:1,https://b:2").unwrap();
        assert!(c.tls());
        c.ca_file = Some("/ca.pem".into());
        assert_eq!(c.urls(), ["https://a:1", "https://b:2"]);
        c.validate().unwrap();
    }
}
