//! Connections and fail-over: one connection per endpoint, a deadline on
//! every call, and a call that fails or runs out of time abandons its
//! endpoint.
//!
//! The crate balances new requests over endpoints but never moves an open
//! stream, and a member that silently drops packets hangs a stream with no
//! error. So each endpoint gets a connection of its own, every call has a
//! deadline, and a call that fails or runs out of time abandons its
//! connection and moves the shared `current` index to the next endpoint:
//! the next keepalive (or watch, or lock) opens there.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Certificate, Client as Etcd, ConnectOptions, Identity, TlsOptions};
use tokio::time::{Instant as TokioInstant, timeout, timeout_at};

use super::EtcdConfig;
use crate::Error;
use crate::backend::BackendError;
use crate::machine::LeaseId;
use crate::sync::lock;

/// HTTP/2 ping interval: etcd's default `--grpc-keepalive-min-time` (5 s);
/// pinging more often gets the connection closed with `too_many_pings`.
/// Keepalives have deadlines of their own; the pings catch a dead member
/// under a waiting lock or a watch.
pub(super) const H2_PING_INTERVAL: Duration = Duration::from_secs(5);

/// Pause between rounds of quick failures over every endpoint.
pub(super) const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why a watch left an endpoint that another call abandoned.
pub(super) const ABANDONED: &str = "endpoint abandoned";

/// Lock transactions in flight at once per backend. A session that lost
/// its lease reacquires every lock together: a thousand transactions sent
/// at once queued the session's own keepalive behind them past its
/// timeout, on a two-core machine, and it fenced again, round after round.
/// Only the transaction waits for a turn here, never the wait for a holder.
pub(super) const LOCK_TXNS: usize = 32;

/// The etcd backend. Clones share connections and streams.
#[derive(Clone)]
pub(crate) struct EtcdBackend(pub(super) Arc<Inner>);

pub(super) struct Inner {
    pub(super) urls: Vec<String>,
    /// One connection per endpoint, opened on first use, dropped on failure.
    pub(super) conns: Vec<Mutex<Option<Etcd>>>,
    /// The endpoint new calls and streams go to.
    pub(super) current: AtomicUsize,
    /// Bumped when an endpoint is abandoned, so the watches and waiting
    /// locks still open on it move too instead of hanging on a dead member.
    pub(super) abandoned: Vec<tokio::sync::watch::Sender<u64>>,
    pub(super) connect: ConnectOptions,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    pub(super) leases: Mutex<HashMap<LeaseId, Arc<LeaseRec>>>,
    /// The lock requests in flight, by lock key: a release without a token
    /// waits for them (see [`EtcdBackend::puts_done`]). An entry lives only
    /// while a request of its key is in flight.
    pub(super) puts: Mutex<HashMap<String, Flight>>,
    /// [`LOCK_TXNS`] turns.
    pub(super) lock_txns: Arc<tokio::sync::Semaphore>,
    /// Lease lookups made to tell a deleted key from a lost lease.
    #[cfg(test)]
    pub(super) why_asked: AtomicUsize,
    /// Keys read back after their watchers were canceled.
    #[cfg(test)]
    pub(super) read_back: AtomicUsize,
    /// Watcher create requests sent (the stream's first included).
    #[cfg(test)]
    pub(super) creates: AtomicUsize,
}

// The records [`Inner`] holds for `lease.rs` and `mutex.rs` are declared
// here, with it, so those files read this one and this one reads neither.

/// A lease granted here (see `lease.rs`), recorded for its keepalives.
pub(super) struct LeaseRec {
    /// TTL the grant returned (the stream's first reply is not handed out).
    pub(super) ttl: Duration,
    /// The keepalive stream; locked for the one keepalive in flight.
    pub(super) stream: tokio::sync::Mutex<Option<KeepaliveStream>>,
}

/// A lease's keepalive stream, on the endpoint it was opened on.
pub(super) struct KeepaliveStream {
    pub(super) endpoint: usize,
    pub(super) keeper: etcd_client::LeaseKeeper,
    pub(super) replies: etcd_client::LeaseKeepAliveStream,
}

/// The lock requests of one key in flight (counted by `mutex.rs`).
pub(super) struct Flight {
    pub(super) count: usize,
    /// Woken when the last one ends (and the entry goes).
    pub(super) done: Arc<tokio::sync::Notify>,
}

/// Sorts an etcd error: a lost lease, or a failure worth another endpoint.
pub(super) fn classify(e: etcd_client::Error) -> BackendError {
    let msg = e.to_string();
    if msg.contains("lease not found") {
        BackendError::LeaseNotFound
    } else if too_large(&msg) {
        BackendError::TooLarge(msg)
    } else {
        BackendError::Unavailable(msg)
    }
}

/// Whether the text says the request is over a size limit: etcd's own
/// (`--max-request-bytes`: "etcdserver: request is too large") or gRPC's
/// message limit ("message larger than max"). Final: never tried again.
fn too_large(msg: &str) -> bool {
    msg.contains("request is too large") || msg.contains("larger than max")
}

/// Whether etcd refused the request itself (a key or value too large,
/// permission denied, ...): another endpoint would refuse it too, so it is
/// answered at once instead of abandoning the endpoint and trying the next.
fn refused(e: &etcd_client::Error) -> bool {
    // gRPC status codes (fixed by the gRPC spec): INVALID_ARGUMENT,
    // PERMISSION_DENIED, OUT_OF_RANGE. Not UNIMPLEMENTED: an endpoint that
    // is no etcd says so, and the next one may be.
    matches!(e, etcd_client::Error::GRpcStatus(s) if matches!(i32::from(s.code()), 3 | 7 | 11))
}

fn read(what: &str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| {
        Error::InvalidArgument(format!("cannot read the {what} `{}`: {e}", path.display()))
    })
}

impl EtcdBackend {
    /// Builds the connection settings (reading the TLS files); connects
    /// nothing yet.
    pub(crate) fn new(config: &EtcdConfig) -> Result<EtcdBackend, Error> {
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(H2_PING_INTERVAL, config.connect_timeout)
            .with_keep_alive_while_idle(false)
            .with_require_leader(true);
        if config.tls() {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &config.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read("CA file", ca)?));
            }
            if let (Some(cert), Some(key)) = (&config.cert_file, &config.key_file) {
                tls = tls.identity(Identity::from_pem(
                    read("certificate file", cert)?,
                    read("key file", key)?,
                ));
            }
            connect = connect.with_tls(tls);
        }
        if let (Some(user), Some(password)) = (&config.user, &config.password) {
            connect = connect
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
        }
        let urls = config.urls();
        Ok(EtcdBackend(Arc::new(Inner {
            conns: urls.iter().map(|_| Mutex::new(None)).collect(),
            abandoned: urls
                .iter()
                .map(|_| tokio::sync::watch::Sender::new(0))
                .collect(),
            urls,
            current: AtomicUsize::new(0),
            connect,
            connect_timeout: config.connect_timeout,
            request_timeout: config.request_timeout,
            leases: Mutex::new(HashMap::new()),
            puts: Mutex::new(HashMap::new()),
            lock_txns: Arc::new(tokio::sync::Semaphore::new(LOCK_TXNS)),
            #[cfg(test)]
            why_asked: AtomicUsize::new(0),
            #[cfg(test)]
            read_back: AtomicUsize::new(0),
            #[cfg(test)]
            creates: AtomicUsize::new(0),
        })))
    }

    /// Connects to the first endpoint that answers a status request (and
    /// authenticates) and makes it current.
    pub(crate) async fn connect_first(&self) -> Result<(), Error> {
        let mut errors = Vec::new();
        for i in 0..self.0.urls.len() {
            let limit = self.0.connect_timeout + self.0.request_timeout;
            let r = timeout(limit, async {
                let mut c = self.conn(i).await?;
                c.status().await.map_err(classify).map(|_| ())
            })
            .await;
            match r {
                Ok(Ok(())) => {
                    self.0.current.store(i, Ordering::Relaxed);
                    return Ok(());
                }
                Ok(Err(BackendError::Unavailable(e))) => {
                    errors.push(format!("{}: {e}", self.0.urls[i]))
                }
                Ok(Err(e)) => errors.push(format!("{}: {e}", self.0.urls[i])),
                Err(_) => errors.push(format!("{}: no answer within {limit:?}", self.0.urls[i])),
            }
            self.fail(i);
        }
        Err(Error::Backend(format!(
            "no etcd endpoint answered: {}",
            errors.join("; ")
        )))
    }

    /// Before try `round` (from 2): after every endpoint had a try, waits
    /// [`RETRY_PAUSE`]; false once that would pass `deadline`.
    pub(super) async fn pause(&self, round: usize, deadline: TokioInstant) -> bool {
        if (round - 1) % self.0.urls.len() == 0 {
            let at = TokioInstant::now() + RETRY_PAUSE;
            if at >= deadline {
                return false;
            }
            tokio::time::sleep_until(at).await;
        }
        true
    }

    pub(super) fn current(&self) -> usize {
        self.0.current.load(Ordering::Relaxed) % self.0.urls.len()
    }

    /// The connection to endpoint `i`, opened (and authenticated) if needed.
    pub(super) async fn conn(&self, i: usize) -> Result<Etcd, BackendError> {
        if let Some(c) = lock(&self.0.conns[i]).clone() {
            return Ok(c);
        }
        let url = &self.0.urls[i];
        let c = Etcd::connect([url], Some(self.0.connect.clone()))
            .await
            .map_err(classify)?;
        Ok(lock(&self.0.conns[i]).get_or_insert(c).clone())
    }

    /// Abandons endpoint `i`'s connection and, if it is current, moves on
    /// to the next endpoint.
    pub(super) fn fail(&self, i: usize) {
        lock(&self.0.conns[i]).take();
        self.0.abandoned[i].send_modify(|n| *n += 1);
        let n = self.0.urls.len();
        if self
            .0
            .current
            .compare_exchange(i, (i + 1) % n, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && n > 1
        {
            tracing::debug!(from = %self.0.urls[i], to = %self.0.urls[(i + 1) % n], "etcd: moving to the next endpoint");
        }
    }

    /// One unary request within `limit`, on the current endpoint; a quick
    /// failure tries the next endpoints within the same limit, a timeout
    /// abandons the endpoint it hit, a request etcd [`refused`] fails at once.
    pub(super) async fn unary<T, F, Fut>(&self, limit: Duration, call: F) -> Result<T, BackendError>
    where
        F: Fn(Etcd) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = TokioInstant::now() + limit;
        let mut last = BackendError::Unavailable("no endpoint".into());
        // Until the deadline: quick failures (a dead member, "no leader"
        // during an election) try the next endpoint, on a fresh connection
        // (which authenticates again), pausing after each round.
        for round in 1.. {
            if round > 1 && !self.pause(round, deadline).await {
                break;
            }
            let i = self.current();
            let mut final_answer = false;
            let r = timeout_at(deadline, async {
                let c = self.conn(i).await?;
                call(c).await.map_err(|e| {
                    final_answer = refused(&e);
                    classify(e)
                })
            })
            .await;
            match r {
                Ok(Err(e @ BackendError::Unavailable(_))) if !final_answer => {
                    tracing::debug!(endpoint = %self.0.urls[i], error = %e, "etcd request failed");
                    self.fail(i);
                    last = e;
                }
                Ok(r) => return r,
                Err(_) => {
                    tracing::debug!(endpoint = %self.0.urls[i], "etcd request timed out");
                    self.fail(i);
                    return Err(BackendError::Unavailable(format!(
                        "{}: no answer within {limit:?}",
                        self.0.urls[i]
                    )));
                }
            }
        }
        Err(last)
    }

    /// After watch `e` on endpoint `i`: abandons the endpoint unless another
    /// call already did; true if this failure was the watch's own.
    pub(super) fn watch_failed(&self, i: usize, e: &BackendError) -> bool {
        let own = !matches!(e, BackendError::Unavailable(m) if m == ABANDONED);
        if own {
            self.fail(i);
        }
        own
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_leases_are_told_apart_from_failures() {
        let lost = etcd_client::Error::LeaseKeepAliveError("lease not found".into());
        assert_eq!(classify(lost), BackendError::LeaseNotFound);
        let status = error("etcdserver: requested lease not found");
        assert_eq!(classify(status), BackendError::LeaseNotFound);
        let other = error("etcdserver: no leader");
        assert!(matches!(classify(other), BackendError::Unavailable(m) if m.contains("no leader")));
    }

    /// Issue 32, item 6: "request is too large" (a cluster with a smaller
    /// `--max-request-bytes`) is final, not a failure to retry until the
    /// timeout; so is gRPC's own message limit.
    #[test]
    fn a_request_too_large_is_final() {
        let big = error("status: InvalidArgument, message: \"etcdserver: request is too large\"");
        assert!(matches!(classify(big), BackendError::TooLarge(m) if m.contains("too large")));
        let grpc = error(
            "status: ResourceExhausted, message: \"grpc: received message larger than max (4194400 vs. 4194304)\"",
        );
        assert!(matches!(classify(grpc), BackendError::TooLarge(_)));
    }

    /// An error carrying a server message (a gRPC status needs `tonic`,
    /// which is not a direct dependency; `classify` reads only the text).
    fn error(msg: &str) -> etcd_client::Error {
        etcd_client::Error::Internal(msg.to_string())
    }
}
