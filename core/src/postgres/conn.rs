//! Connections: opening one (TLS or not), checking the server may be used
//! (a primary with synchronous replication, or a declared single node),
//! driving it (notices and notifications), and a slot that reopens a
//! connection that failed or timed out.
//!
//! Every statement is an unnamed one (`query_typed`, or the simple query
//! protocol) and every one is a transaction of its own, with no session
//! state, so a pooler in transaction mode (PgBouncer) can carry all of them
//! but LISTEN: the listener's connection may go elsewhere
//! ([`listen_config`], `dlock_listen=` in the URL).

use std::future::Future;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, Notification};

use super::PostgresConfig;
use crate::Error;
use crate::backend::BackendError;
use crate::sync::lock;

/// SQLSTATE of `dlock.acquire` when the lease is not alive.
const LEASE_NOT_FOUND: &str = "DL002";

/// One open connection.
pub(crate) struct Conn {
    pub client: tokio_postgres::Client,
    /// WARNINGs of a cancelled wait for synchronous replication seen on
    /// this connection: a reply after one is not confirmed on the standby.
    pub sync_cancels: Arc<AtomicU64>,
    /// Requests sent on it and not answered yet.
    in_flight: AtomicUsize,
    task: tokio::task::AbortHandle,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How to open a connection (the parsed URL, TLS, the replication rule).
pub(crate) struct Connector {
    config: tokio_postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    single_node: bool,
    /// The whole opening of a connection (TCP, TLS, authentication) and,
    /// separately, its checks, are bounded: the driver's connect timeout
    /// covers the TCP connect only, and a server (or a link) that accepts
    /// but never answers would otherwise hold the slot forever.
    connect_timeout: Duration,
    request_timeout: Duration,
    /// `host:port` for messages.
    pub target: String,
    /// Set once the schema is known to be there: from then on every
    /// connection opened checks the timeline (see [`Connector::open`]).
    pub schema_ready: AtomicBool,
}

/// A driver error as one line: the server's message and SQLSTATE when it
/// sent one, else the error with its cause.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut m = format!(
            "{}: {} (SQLSTATE {})",
            db.severity(),
            db.message(),
            db.code().code()
        );
        if let Some(h) = db.hint() {
            m.push_str("; hint: ");
            m.push_str(h);
        }
        return m;
    }
    let mut m = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        m.push_str(": ");
        m.push_str(&s.to_string());
        src = s.source();
    }
    m
}

/// Maps a failed statement: the lease's SQLSTATE is `LeaseNotFound`,
/// anything else `Unavailable`.
pub(crate) fn backend_error(e: &tokio_postgres::Error) -> BackendError {
    match e.code() {
        Some(c) if c.code() == LEASE_NOT_FOUND => BackendError::LeaseNotFound,
        _ => BackendError::Unavailable(describe(e)),
    }
}

fn tls_config(ca_file: &std::path::Path) -> Result<rustls::ClientConfig, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let bad = |why: String| Error::InvalidArgument(format!("CA file {}: {why}", ca_file.display()));
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca_file).map_err(|e| bad(e.to_string()))? {
        roots
            .add(cert.map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl Connector {
    /// Reads the CA file (when TLS is on); connects nothing yet.
    pub fn new(c: &PostgresConfig) -> Result<Connector, Error> {
        let config = c.driver_config();
        let tls = match (&c.tls, &c.ca_file) {
            (true, Some(ca)) => Some(tokio_postgres_rustls::MakeRustlsConnect::new(tls_config(
                ca,
            )?)),
            _ => None,
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let target = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => format!("{h}:{port}"),
            Some(tokio_postgres::config::Host::Unix(p)) => format!("{}:{port}", p.display()),
            None => format!("localhost:{port}"),
        };
        Ok(Connector {
            config,
            tls,
            single_node: c.single_node,
            connect_timeout: c.connect_timeout,
            request_timeout: c.request_timeout,
            target,
            schema_ready: AtomicBool::new(false),
        })
    }

    /// Opens and checks a connection; `notes` gets its notifications. An
    /// `Err` is a clear [`Error`]: `Backend` for the server (unreachable,
    /// refused authentication, no synchronous standby).
    pub async fn open(&self, notes: Option<UnboundedSender<Notification>>) -> Result<Conn, Error> {
        let fail = |e: tokio_postgres::Error| {
            Error::Backend(format!("PostgreSQL at {}: {}", self.target, describe(&e)))
        };
        let silent = |what: &str, limit: Duration| {
            Error::Backend(format!(
                "PostgreSQL at {}: no reply to {what} within {} ms",
                self.target,
                limit.as_millis()
            ))
        };
        let cancels = Arc::new(AtomicU64::new(0));
        let opening = async {
            Ok::<_, Error>(match &self.tls {
                Some(tls) => {
                    let (client, conn) = self.config.connect(tls.clone()).await.map_err(fail)?;
                    (client, drive(conn, cancels.clone(), notes))
                }
                None => {
                    let (client, conn) = self
                        .config
                        .connect(tokio_postgres::NoTls)
                        .await
                        .map_err(fail)?;
                    (client, drive(conn, cancels.clone(), notes))
                }
            })
        };
        let (client, task) = tokio::time::timeout(self.connect_timeout, opening)
            .await
            .map_err(|_| silent("the connection's start-up", self.connect_timeout))??;
        let conn = Conn {
            client,
            sync_cancels: cancels,
            in_flight: AtomicUsize::new(0),
            task,
        };
        let checks = async {
            self.check_replication(&conn).await?;
            if self.schema_ready.load(Ordering::SeqCst) {
                self.check_timeline(&conn).await?;
            }
            Ok::<_, Error>(())
        };
        tokio::time::timeout(self.request_timeout, checks)
            .await
            .map_err(|_| silent("the connection's checks", self.request_timeout))??;
        Ok(conn)
    }

    /// After a promotion (a new timeline) extends every lease to at least
    /// now + its TTL on the new primary's clock (`dlock.check_timeline`).
    pub async fn check_timeline(&self, conn: &Conn) -> Result<(), Error> {
        let row = conn
            .client
            .query_typed_one("SELECT dlock.check_timeline()", &[])
            .await
            .map_err(|e| {
                Error::Backend(format!("PostgreSQL at {}: {}", self.target, describe(&e)))
            })?;
        let extended: bool = row.try_get(0).map_err(|e| {
            Error::Backend(format!("PostgreSQL at {}: {}", self.target, describe(&e)))
        })?;
        if extended {
            tracing::warn!(
                "PostgreSQL at {}: a new timeline (a promotion): every lease extended by its TTL",
                self.target
            );
        }
        Ok(())
    }

    /// Refuses a standby, and a primary without synchronous replication
    /// unless the configuration declares a single node.
    async fn check_replication(&self, conn: &Conn) -> Result<(), Error> {
        let row = conn
            .client
            .query_typed_one(
                "SELECT pg_is_in_recovery(), current_setting('synchronous_commit'), \
                 current_setting('synchronous_standby_names')",
                &[],
            )
            .await
            .map_err(|e| {
                Error::Backend(format!("PostgreSQL at {}: {}", self.target, describe(&e)))
            })?;
        let read = || -> Result<(bool, String, String), tokio_postgres::Error> {
            Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?))
        };
        let (standby, commit, names) = read().map_err(|e| {
            Error::Backend(format!("PostgreSQL at {}: {}", self.target, describe(&e)))
        })?;
        if standby {
            return Err(Error::Backend(format!(
                "PostgreSQL at {} is a standby (in recovery): connect to the primary",
                self.target
            )));
        }
        let sync = matches!(commit.as_str(), "on" | "remote_apply") && !names.trim().is_empty();
        if !sync && !self.single_node {
            return Err(Error::Backend(format!(
                "PostgreSQL at {} has no synchronous replication (synchronous_commit = '{commit}', \
                 synchronous_standby_names = '{names}'): after a failover an asynchronous standby \
                 can lose a confirmed keepalive or reissue a token. Configure a synchronous standby \
                 (synchronous_commit on or remote_apply), or declare a single node with \
                 dlock_single_node=true in the URL",
                self.target
            )));
        }
        Ok(())
    }
}

/// The configuration of the listener's connection when the URL sends it
/// elsewhere (`dlock_listen`, for a pooler in transaction mode, which
/// cannot carry LISTEN): `HOST[:PORT][,HOST[:PORT]...]` replaces the URL's
/// hosts (same user, password, database, TLS); a whole `postgres://` URL
/// (percent-encoded inside the main one) replaces the URL, keeping the main
/// URL's TLS settings unless it names its own. `None`: the main URL.
pub(crate) fn listen_config(c: &PostgresConfig) -> Result<Option<PostgresConfig>, Error> {
    let Some(spec) = c.listen.as_deref().map(str::trim) else {
        return Ok(None);
    };
    // Never a password in a message.
    let shown = if super::config::is_postgres_url(spec) {
        "postgres://…".to_string()
    } else {
        spec.to_string()
    };
    let bad = |why: &str| {
        Err(Error::InvalidArgument(format!(
            "PostgreSQL URL: dlock_listen `{shown}`: {why}"
        )))
    };
    let mut l = c.clone();
    l.listen = None;
    if super::config::is_postgres_url(spec) {
        let own = PostgresConfig::parse(spec)
            .map_err(|e| Error::InvalidArgument(format!("dlock_listen: {e}")))?;
        if own.listen.is_some() {
            return bad("a listen URL cannot name another");
        }
        let query = spec.split_once('?').map_or("", |(_, q)| q);
        if query.split('&').any(|p| p.starts_with("sslmode=")) {
            l.tls = own.tls;
        }
        if own.ca_file.is_some() {
            l.ca_file = own.ca_file;
        }
        l.url = own.url;
    } else {
        if spec.is_empty() || spec.contains(['/', '?', '@', '&', ' ']) {
            return bad("expected HOST[:PORT][,HOST[:PORT]...] or a postgres:// URL");
        }
        let (scheme, rest) = c.url.split_once("://").expect("a validated URL");
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if tail.split_once('?').is_some_and(|(_, q)| {
            q.split('&')
                .any(|p| p.starts_with("host") || p.starts_with("port="))
        }) {
            return bad(
                "the URL names its hosts in host=/hostaddr=/port= parameters: give a whole postgres:// URL in dlock_listen",
            );
        }
        let userinfo = authority.rsplit_once('@').map(|(u, _)| u);
        l.url = match userinfo {
            Some(u) => format!("{scheme}://{u}@{spec}{tail}"),
            None => format!("{scheme}://{spec}{tail}"),
        };
    }
    l.validate().map_err(|e| {
        Error::InvalidArgument(format!("dlock_listen `{shown}` makes a bad URL: {e}"))
    })?;
    Ok(Some(l))
}

/// Drives a connection on a task of its own: counts the WARNINGs of a
/// cancelled synchronous-replication wait and forwards notifications. The
/// task (and with it `notes`) ends when the connection does.
fn drive<S, T>(
    mut conn: tokio_postgres::Connection<S, T>,
    cancels: Arc<AtomicU64>,
    notes: Option<UnboundedSender<Notification>>,
) -> tokio::task::AbortHandle
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notice(n))) => {
                    if *n.code() == SqlState::WARNING
                        && n.message().contains("synchronous replication")
                    {
                        cancels.fetch_add(1, Ordering::SeqCst);
                    }
                }
                Some(Ok(AsyncMessage::Notification(n))) => {
                    if let Some(tx) = &notes {
                        let _ = tx.send(n);
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    tracing::debug!("dlock postgres connection ended: {}", describe(&e));
                    break;
                }
                None => break,
            }
        }
    })
    .abort_handle()
}

/// A connection that is reopened on the next use after it failed, timed
/// out, or (`drop_abandoned`) a request on it was abandoned.
pub(crate) struct Slot {
    connector: Arc<Connector>,
    current: Mutex<Option<Arc<Conn>>>,
    opening: tokio::sync::Mutex<()>,
    /// The keepalives' slot: a request never queues behind another. A
    /// request dropped before its reply closes the connection, and a
    /// request that finds one still unanswered (the core counted it failed
    /// and retries) goes on a new connection rather than wait behind it on
    /// what may be a dead link (a half-open connection, a stopped server
    /// process) while a new one would be answered. The busy one is not
    /// closed: after a blip it may answer first, and the next retry uses
    /// it while the new one is still opening.
    drop_abandoned: bool,
}

impl Slot {
    pub fn new(connector: Arc<Connector>, drop_abandoned: bool) -> Slot {
        Slot {
            connector,
            current: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            drop_abandoned,
        }
    }

    /// Puts an already open connection in the slot.
    pub fn set(&self, conn: Conn) {
        *lock(&self.current) = Some(Arc::new(conn));
    }

    /// The open connection, opening one if needed. With `idle`, a connection with a request still unanswered does not
    /// do: a new one is opened and becomes the slot's, and the busy one is
    /// left to its request (closed when that returns or times out).
    async fn get_with(&self, idle: bool) -> Result<Arc<Conn>, BackendError> {
        let usable = |c: &Arc<Conn>| !idle || c.in_flight.load(Ordering::SeqCst) == 0;
        if let Some(c) = self.live().filter(usable) {
            return Ok(c);
        }
        let _opening = self.opening.lock().await;
        if let Some(c) = self.live().filter(usable) {
            return Ok(c);
        }
        if idle && self.live().is_some() {
            tracing::debug!(
                "PostgreSQL at {}: a keepalive still unanswered: the next goes on a new connection",
                self.connector.target
            );
        }
        let conn = Arc::new(
            self.connector
                .open(None)
                .await
                .map_err(|e| BackendError::Unavailable(e.to_string()))?,
        );
        *lock(&self.current) = Some(conn.clone());
        Ok(conn)
    }

    fn live(&self) -> Option<Arc<Conn>> {
        let cur = lock(&self.current);
        cur.as_ref().filter(|c| !c.client.is_closed()).cloned()
    }

    /// Closes `conn` if it is still the slot's.
    pub fn close(&self, conn: &Arc<Conn>) {
        let mut cur = lock(&self.current);
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *cur = None;
            conn.task.abort();
        }
    }

    /// Runs `f` on the connection within `timeout`: a timeout or a broken
    /// connection closes it (the next call reopens); errors are mapped by
    /// [`backend_error`].
    pub async fn run<T, F, Fut>(&self, timeout: Duration, f: F) -> Result<T, BackendError>
    where
        F: FnOnce(Arc<Conn>) -> Fut,
        Fut: Future<Output = Result<T, tokio_postgres::Error>>,
    {
        let conn = self.get_with(self.drop_abandoned).await?;
        let _in_flight = InFlight::new(conn.clone());
        let mut guard = Abandoned {
            slot: self,
            conn: Some(conn.clone()),
        };
        let out = tokio::time::timeout(timeout, f(conn.clone())).await;
        guard.conn = None;
        match out {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if e.is_closed() || e.as_db_error().is_none() {
                    self.close(&conn);
                }
                Err(backend_error(&e))
            }
            Err(_) => {
                self.close(&conn);
                Err(BackendError::Unavailable(format!(
                    "PostgreSQL at {}: no reply within {} ms",
                    self.connector.target,
                    timeout.as_millis()
                )))
            }
        }
    }
}

/// Counts a request in flight on its connection while it lives.
struct InFlight(Arc<Conn>);

impl InFlight {
    fn new(conn: Arc<Conn>) -> InFlight {
        conn.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(conn)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Closes the connection of a request dropped before its reply (only for
/// a slot with `drop_abandoned`).
struct Abandoned<'a> {
    slot: &'a Slot,
    conn: Option<Arc<Conn>>,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            if self.slot.drop_abandoned {
                self.slot.close(&c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listen(url: &str) -> Result<Option<PostgresConfig>, Error> {
        listen_config(&PostgresConfig::parse(url)?)
    }

    #[test]
    fn dlock_listen_replaces_the_hosts_or_the_url() {
        assert!(listen("postgres://u:p@bouncer:6432/db").unwrap().is_none());
        let l = listen(
            "postgres://u:p@bouncer:6432/db?application_name=x&dlock_listen=db1:5432,db2:5433&dlock_single_node=true",
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            l.url,
            "postgres://u:p@db1:5432,db2:5433/db?application_name=x"
        );
        assert!(l.single_node && l.listen.is_none());
        let l = listen("postgres://bouncer/db?dlock_listen=db1")
            .unwrap()
            .unwrap();
        assert_eq!(l.url, "postgres://db1/db");
        // A whole URL (percent-encoded inside the main one): its own
        // credentials and database; the main URL's TLS unless it says.
        let l = listen(
            "postgres://u:p@bouncer:6432/db?sslmode=require&sslrootcert=%2Fca.pem&dlock_listen=postgresql%3A%2F%2Fv%3Aq%40db1%3A5432%2Freal",
        )
        .unwrap()
        .unwrap();
        assert_eq!(l.url, "postgresql://v:q@db1:5432/real");
        assert!(l.tls && l.ca_file.as_deref() == Some(std::path::Path::new("/ca.pem")));
        let l = listen(
            "postgres://u:p@bouncer/db?sslmode=require&sslrootcert=%2Fca.pem&dlock_listen=postgres%3A%2F%2Fdb1%2Fdb%3Fsslmode%3Ddisable",
        )
        .unwrap()
        .unwrap();
        assert!(!l.tls);
    }

    #[test]
    fn bad_dlock_listen_values_are_clear_errors() {
        for url in [
            "postgres://u@h/db?dlock_listen=a/b",
            "postgres://u@h/db?dlock_listen=x%40y",
            "postgres://u@h/db?dlock_listen=h:notaport",
            "postgres://u@h/db?host=other&dlock_listen=db1",
            "postgres://u@h/db?dlock_listen=postgres%3A%2F%2Fh%2Fdb%3Fdlock_listen%3Dz",
        ] {
            match listen(url) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains("dlock_listen"), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        match PostgresConfig::parse("postgres://u@h/db?dlock_listen=") {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("dlock_listen"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
