//! The etcd backend over gRPC (`etcd-client`), with its own fail-over.
//!
//! The crate balances new requests over endpoints but never moves an open
//! stream, and a member that silently drops packets hangs a stream with no
//! error. So each endpoint gets a connection of its own, every call has a
//! deadline, and a call that fails or runs out of time abandons its
//! connection and moves the shared `current` index to the next endpoint:
//! the next keepalive (or watch, or lock) opens there.
//!
//! Locks use the keys of etcd's concurrency `Mutex` (`<name>/<lease hex>`,
//! lowest `create_revision` owns), so dlock and `etcdctl lock` exclude each
//! other; the token is the lock key's `create_revision`.
//!
//! The held keys of one lease are watched together ([`KeyWatch`]): one task
//! and one Watch stream per lease, one watcher (a map entry here, a watch id
//! on the stream) per key, however many keys.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Certificate, Client as Etcd, Compare, CompareOp, ConnectOptions, EventType, GetOptions,
    Identity, PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions, WatchRequestSender, WatchResponse, WatchResponseStream,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::{Instant as TokioInstant, timeout, timeout_at};

use super::EtcdConfig;
use crate::backend::{Backend, BackendError, BoxFuture, Grant, KeyGone, KeyWatch, LockGone};
use crate::machine::{LeaseId, Token};
use crate::{Error, Options};

/// HTTP/2 ping interval: etcd's default `--grpc-keepalive-min-time` (5 s);
/// pinging more often gets the connection closed with `too_many_pings`.
/// Keepalives have deadlines of their own; the pings catch a dead member
/// under a waiting lock or a watch.
const H2_PING_INTERVAL: Duration = Duration::from_secs(5);

/// Pause between rounds of quick failures over every endpoint.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why a watch left an endpoint that another call abandoned.
const ABANDONED: &str = "endpoint abandoned";

/// Keys read back per transaction when their watchers were canceled
/// (etcd's `--max-txn-ops` defaults to 128).
const CHECK_BATCH: usize = 64;

/// Watch requests sent in one go (the stream's request queue holds 100).
const SEND_BATCH: usize = 64;

/// A key is watched once it has been held this long: most short holds are
/// released before, and so cost no watcher (a create and a cancel on the
/// stream, and the server's work for them). Nothing is missed: a watcher
/// starts from the revision after the acquisition, so it replays a delete
/// that came meanwhile, at most this much later.
const WATCH_AFTER: Duration = Duration::from_millis(20);

/// The etcd backend. Clones share connections and streams.
#[derive(Clone)]
pub(crate) struct EtcdBackend(Arc<Inner>);

struct Inner {
    urls: Vec<String>,
    /// One connection per endpoint, opened on first use, dropped on failure.
    conns: Vec<Mutex<Option<Etcd>>>,
    /// The endpoint new calls and streams go to.
    current: AtomicUsize,
    /// Bumped when an endpoint is abandoned, so the watches and waiting
    /// locks still open on it move too instead of hanging on a dead member.
    abandoned: Vec<tokio::sync::watch::Sender<u64>>,
    connect: ConnectOptions,
    connect_timeout: Duration,
    request_timeout: Duration,
    /// Deadline of a grant or keepalive: the machine counts one failed
    /// after `keepalive_timeout`, so the backend leaves its endpoint then.
    keepalive_timeout: Duration,
    retry_interval: Duration,
    leases: Mutex<HashMap<LeaseId, Arc<LeaseRec>>>,
    /// The lock requests in flight, by lock key: a release without a token
    /// waits for them (see [`EtcdBackend::puts_done`]). An entry lives only
    /// while a request of its key is in flight.
    puts: Mutex<HashMap<String, Flight>>,
    /// Lease lookups made to tell a deleted key from a lost lease.
    #[cfg(test)]
    why_asked: AtomicUsize,
    /// Keys read back after their watchers were canceled.
    #[cfg(test)]
    read_back: AtomicUsize,
    /// Watcher create requests sent (the stream's first included).
    #[cfg(test)]
    creates: AtomicUsize,
}

/// The lock requests of one key in flight.
struct Flight {
    count: usize,
    /// Woken when the last one ends (and the entry goes).
    done: Arc<tokio::sync::Notify>,
}

/// One lock request in flight, registered in [`Inner::puts`] until dropped.
struct PutGuard {
    backend: EtcdBackend,
    key: String,
}

impl Drop for PutGuard {
    fn drop(&mut self) {
        let mut puts = lock(&self.backend.0.puts);
        if let Some(f) = puts.get_mut(&self.key) {
            f.count -= 1;
            if f.count == 0 {
                if let Some(f) = puts.remove(&self.key) {
                    f.done.notify_waiters();
                }
            }
        }
    }
}

struct LeaseRec {
    /// TTL the grant returned (the stream's first reply is not handed out).
    ttl: Duration,
    /// The keepalive stream; locked for the one keepalive in flight.
    stream: tokio::sync::Mutex<Option<KeepaliveStream>>,
}

struct KeepaliveStream {
    endpoint: usize,
    keeper: etcd_client::LeaseKeeper,
    replies: etcd_client::LeaseKeepAliveStream,
}

/// A watch on one endpoint that ends when the endpoint is abandoned.
struct Watch {
    stream: etcd_client::WatchStream,
    abandoned: tokio::sync::watch::Receiver<u64>,
}

impl Watch {
    /// The next reply, or why the watch ended: its stream failed or closed,
    /// or another call abandoned its endpoint ([`ABANDONED`]).
    async fn next(&mut self) -> Result<etcd_client::WatchResponse, BackendError> {
        tokio::select! {
            m = self.stream.message() => m
                .map_err(classify)?
                .ok_or_else(|| BackendError::Unavailable("watch stream closed".into())),
            _ = self.abandoned.changed() => Err(BackendError::Unavailable(ABANDONED.into())),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sorts an etcd error: a lost lease, or a failure worth another endpoint.
fn classify(e: etcd_client::Error) -> BackendError {
    let msg = e.to_string();
    if msg.contains("lease not found") {
        BackendError::LeaseNotFound
    } else {
        BackendError::Unavailable(msg)
    }
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

/// The lock key of `name` under `lease`, as etcd's concurrency Mutex names it.
fn lock_key(name: &str, lease: LeaseId) -> String {
    format!("{name}/{lease:x}")
}

/// etcd's Mutex request: puts our key (under `lease`) if absent, and reads
/// our key's and the oldest key's create revision under `prefix`.
fn lock_txn(key: &str, prefix: &str, lease: LeaseId) -> Txn {
    let first = || {
        TxnOp::get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    };
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, "", Some(PutOptions::new().with_lease(lease))),
            first(),
        ])
        .or_else([TxnOp::get(key, None), first()])
}

fn read(what: &str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| {
        Error::InvalidArgument(format!("cannot read the {what} `{}`: {e}", path.display()))
    })
}

impl EtcdBackend {
    /// Builds the connection settings (reading the TLS files); connects
    /// nothing yet.
    pub(crate) fn new(config: &EtcdConfig, options: &Options) -> Result<EtcdBackend, Error> {
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
            keepalive_timeout: options.keepalive_timeout,
            retry_interval: options.retry_interval,
            leases: Mutex::new(HashMap::new()),
            puts: Mutex::new(HashMap::new()),
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
    async fn pause(&self, round: usize, deadline: TokioInstant) -> bool {
        if (round - 1) % self.0.urls.len() == 0 {
            let at = TokioInstant::now() + RETRY_PAUSE;
            if at >= deadline {
                return false;
            }
            tokio::time::sleep_until(at).await;
        }
        true
    }

    fn current(&self) -> usize {
        self.0.current.load(Ordering::Relaxed) % self.0.urls.len()
    }

    /// The connection to endpoint `i`, opened (and authenticated) if needed.
    async fn conn(&self, i: usize) -> Result<Etcd, BackendError> {
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
    fn fail(&self, i: usize) {
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
    async fn unary<T, F, Fut>(&self, limit: Duration, call: F) -> Result<T, BackendError>
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

    async fn keepalive_once(&self, lease: LeaseId) -> Result<Duration, BackendError> {
        // Every lease kept alive was granted here; one no longer recorded
        // was revoked or found lost.
        let Some(rec) = lock(&self.0.leases).get(&lease).cloned() else {
            return Err(BackendError::LeaseNotFound);
        };
        // The machine counts this keepalive failed `keepalive_timeout` after
        // it asked, also when it waited here behind the previous one.
        let deadline = TokioInstant::now() + self.0.keepalive_timeout;
        // One keepalive in flight per lease: the stream is taken out while
        // in use and put back only after its reply, so a keepalive that
        // times out (or is cancelled) leaves no unread reply behind.
        let Ok(mut slot) = timeout_at(deadline, rec.stream.lock()).await else {
            return Err(BackendError::Unavailable(
                "the previous keepalive is still in flight".into(),
            ));
        };
        let mut last = BackendError::Unavailable("no endpoint".into());
        if let Some(mut s) = slot.take() {
            let i = s.endpoint;
            let r = timeout_at(deadline, async {
                s.keeper.keep_alive().await.map_err(classify)?;
                s.replies.message().await.map_err(classify)
            })
            .await;
            match r {
                Ok(Ok(Some(reply))) if reply.ttl() > 0 => {
                    *slot = Some(s);
                    return Ok(Duration::from_secs(reply.ttl() as u64));
                }
                Ok(Ok(Some(_))) | Ok(Err(BackendError::LeaseNotFound)) => {
                    return Err(BackendError::LeaseNotFound);
                }
                Ok(Ok(None)) => {
                    self.fail(i);
                    last = BackendError::Unavailable("keepalive stream closed".into());
                }
                Ok(Err(e)) => {
                    self.fail(i);
                    last = e;
                }
                Err(_) => {
                    tracing::debug!(endpoint = %self.0.urls[i], "etcd keepalive timed out: abandoning the stream");
                    self.fail(i);
                    return Err(BackendError::Unavailable("keepalive timed out".into()));
                }
            }
        }
        // A quick failure leaves time to open a stream on the next endpoint
        // within the same keepalive's budget. Opening a stream sends its
        // first keepalive and waits for the reply; the machine keeps its own
        // (earlier) send time for it.
        for round in 1.. {
            if round > 1 && !self.pause(round, deadline).await {
                break;
            }
            let i = self.current();
            let r = timeout_at(deadline, async {
                let c = self.conn(i).await?;
                c.lease_client().keep_alive(lease).await.map_err(classify)
            })
            .await;
            match r {
                Ok(Ok((keeper, replies))) => {
                    *slot = Some(KeepaliveStream {
                        endpoint: i,
                        keeper,
                        replies,
                    });
                    return Ok(rec.ttl);
                }
                Ok(Err(BackendError::LeaseNotFound)) => return Err(BackendError::LeaseNotFound),
                Ok(Err(e)) => {
                    tracing::debug!(endpoint = %self.0.urls[i], error = %e, "etcd keepalive stream failed to open");
                    self.fail(i);
                    last = e;
                }
                Err(_) => {
                    tracing::debug!(endpoint = %self.0.urls[i], "etcd keepalive stream did not open in time");
                    self.fail(i);
                    return Err(BackendError::Unavailable("keepalive timed out".into()));
                }
            }
        }
        Err(last)
    }

    /// One round of etcd's Mutex: creates our key if absent, returns its
    /// `create_revision` and that of the oldest key under the prefix.
    ///
    /// The transaction runs in a task of its own, registered in
    /// [`Inner::puts`] until it ends: dropping the lock future cannot cancel
    /// a request already sent, and a release without a token waits for it,
    /// so the put never lands after that release's delete.
    async fn try_acquire(&self, name: &str, lease: LeaseId) -> Result<(i64, i64), BackendError> {
        let key = lock_key(name, lease);
        let prefix = format!("{name}/");
        let guard = self.put_started(&key);
        let b = self.clone();
        let request = tokio::spawn(async move {
            let _guard = guard;
            b.unary(b.0.request_timeout, |mut c| {
                let t = lock_txn(&key, &prefix, lease);
                async move { c.txn(t).await }
            })
            .await
        });
        let resp = request
            .await
            .map_err(|e| BackendError::Unavailable(format!("lock request: {e}")))??;
        let ops = resp.op_responses();
        let get = |i: usize| match ops.get(i) {
            Some(TxnOpResponse::Get(g)) => Some(g.kvs().first().map(|kv| kv.create_revision())),
            _ => None,
        };
        let mine = if resp.succeeded() {
            resp.header().map(|h| h.revision())
        } else {
            get(0).flatten()
        };
        let (Some(mine), Some(owner)) = (mine, get(1)) else {
            return Err(BackendError::Unavailable(
                "unexpected lock transaction reply".into(),
            ));
        };
        Ok((mine, owner.unwrap_or(mine)))
    }

    /// Waits until the last key created before `mine` under the prefix is
    /// deleted (etcd's `waitDeletes`, one key at a time).
    async fn wait_turn(&self, name: &str, mine: i64) -> Result<(), BackendError> {
        let prefix = format!("{name}/");
        let before = self
            .unary(self.0.request_timeout, |mut c| {
                let p = prefix.clone();
                async move {
                    let opts = GetOptions::new()
                        .with_prefix()
                        .with_max_create_revision(mine - 1)
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1);
                    c.get(p, Some(opts)).await
                }
            })
            .await?;
        let Some(kv) = before.kvs().first() else {
            return Ok(());
        };
        let from = before.header().map_or(0, |h| h.revision()) + 1;
        let key = kv.key().to_vec();
        // No deadline: we wait for another holder; HTTP/2 pings catch a
        // dead member, and an error sends the machine's retry elsewhere.
        let i = self.current();
        let r = async {
            let mut w = self.open_watch(i, key, from).await?;
            loop {
                let resp = w.next().await?;
                if resp.canceled() {
                    // Compacted: look again.
                    return Ok(());
                }
                if resp
                    .events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
                {
                    return Ok(());
                }
            }
        }
        .await;
        if let Err(e) = &r {
            self.watch_failed(i, e);
        }
        r
    }

    async fn acquire(&self, name: &str, lease: LeaseId, wait: bool) -> Result<Token, BackendError> {
        loop {
            let (mine, owner) = self.try_acquire(name, lease).await?;
            if owner == mine {
                return Ok(Token(mine as u64));
            }
            if !wait {
                // Leave no key behind to block the holder's successor (only
                // this one: a late delete must not remove a later
                // acquisition's key); if this fails, revoking the lease
                // removes it.
                let _ = self.release(name, lease, Some(Token(mine as u64))).await;
                return Err(BackendError::Busy);
            }
            self.wait_turn(name, mine).await?;
        }
    }

    /// Registers a lock request of `key` in flight (see [`Inner::puts`]).
    fn put_started(&self, key: &str) -> PutGuard {
        lock(&self.0.puts)
            .entry(key.to_owned())
            .or_insert_with(|| Flight {
                count: 0,
                done: Arc::new(tokio::sync::Notify::new()),
            })
            .count += 1;
        PutGuard {
            backend: self.clone(),
            key: key.to_owned(),
        }
    }

    /// Resolves once no lock request of `key` is in flight.
    async fn puts_done(&self, key: &str) {
        loop {
            let done = {
                let puts = lock(&self.0.puts);
                let Some(f) = puts.get(key) else {
                    return;
                };
                // Enabled under the lock: the last request cannot end
                // between the look and the wait unnoticed.
                let mut done = Box::pin(f.done.clone().notified_owned());
                done.as_mut().enable();
                done
            };
            done.await;
        }
    }

    /// Deletes the lock key of `name` under `lease` (see [`Backend::unlock`]).
    async fn release(
        &self,
        name: &str,
        lease: LeaseId,
        token: Option<Token>,
    ) -> Result<(), BackendError> {
        let key = lock_key(name, lease);
        match token {
            Some(token) => self
                .unary(self.0.request_timeout, |mut c| {
                    let txn = Txn::new()
                        .when([Compare::create_revision(
                            key.clone(),
                            CompareOp::Equal,
                            token.0 as i64,
                        )])
                        .and_then([TxnOp::delete(key.clone(), None)]);
                    async move { c.txn(txn).await }
                })
                .await
                .map(|_| ()),
            None => {
                self.puts_done(&key).await;
                self.unary(self.0.request_timeout, |mut c| {
                    let k = key.clone();
                    async move { c.delete(k, None).await }
                })
                .await
                .map(|_| ())
            }
        }
    }

    /// Reads the keys back: whether each still exists with its token as
    /// create revision, and the revision read at.
    async fn check_keys(&self, keys: &[(Token, String)]) -> Result<(i64, Vec<bool>), BackendError> {
        #[cfg(test)]
        self.0.read_back.fetch_add(keys.len(), Ordering::Relaxed);
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let gets: Vec<TxnOp> = keys
                    .iter()
                    .map(|(_, k)| TxnOp::get(k.as_str(), None))
                    .collect();
                let txn = Txn::new().and_then(gets);
                async move { c.txn(txn).await }
            })
            .await?;
        let ops = resp.op_responses();
        let (Some(header), true) = (resp.header(), ops.len() == keys.len()) else {
            return Err(BackendError::Unavailable(
                "unexpected read-back transaction reply".into(),
            ));
        };
        let alive = ops
            .iter()
            .zip(keys)
            .map(|(op, (token, _))| {
                matches!(op, TxnOpResponse::Get(g)
                    if g.kvs().first().is_some_and(|kv| kv.create_revision() == token.0 as i64))
            })
            .collect();
        Ok((header.revision(), alive))
    }

    /// Opens the Watch stream of a [`KeyWatch`] on endpoint `i`, with the
    /// watcher of its first key; with `fresh_token`, authenticates again
    /// first (a stream keeps the token it opened with).
    async fn open_keys(
        &self,
        i: usize,
        key: String,
        options: WatchOptions,
        fresh_token: bool,
    ) -> Result<(WatchRequestSender, WatchResponseStream), BackendError> {
        let mut conn = timeout(
            self.0.connect_timeout + self.0.request_timeout,
            self.conn(i),
        )
        .await
        .map_err(|_| BackendError::Unavailable("connect timed out".into()))??;
        if fresh_token {
            // Without credentials, this only drops a token there is none of.
            timeout(self.0.request_timeout, conn.refresh_token())
                .await
                .map_err(|_| BackendError::Unavailable("authentication timed out".into()))?
                .map_err(classify)?;
        }
        let stream = timeout(self.0.request_timeout, conn.watch(key, Some(options)))
            .await
            .map_err(|_| BackendError::Unavailable("watch did not open in time".into()))?
            .map_err(classify)?;
        Ok(stream.split())
    }

    /// Opens a watch of `key` from revision `from` on endpoint `i`.
    async fn open_watch(
        &self,
        i: usize,
        key: impl Into<Vec<u8>>,
        from: i64,
    ) -> Result<Watch, BackendError> {
        // Subscribed first: an abandonment while connecting counts too.
        let abandoned = self.0.abandoned[i].subscribe();
        let mut conn = timeout(
            self.0.connect_timeout + self.0.request_timeout,
            self.conn(i),
        )
        .await
        .map_err(|_| BackendError::Unavailable("connect timed out".into()))??;
        let stream = conn
            .watch(key, Some(WatchOptions::new().with_start_revision(from)))
            .await
            .map_err(classify)?;
        Ok(Watch { stream, abandoned })
    }

    /// After watch `e` on endpoint `i`: abandons the endpoint unless another
    /// call already did; true if this failure was the watch's own.
    fn watch_failed(&self, i: usize, e: &BackendError) -> bool {
        let own = !matches!(e, BackendError::Unavailable(m) if m == ABANDONED);
        if own {
            self.fail(i);
        }
        own
    }

    /// The key is gone: with its lease (revoked, expired), or alone? Asked
    /// within a keepalive timeout; no answer counts as the key alone (the
    /// fence is the same, only its reason differs).
    async fn why_gone(&self, lease: LeaseId) -> LockGone {
        #[cfg(test)]
        self.0.why_asked.fetch_add(1, Ordering::Relaxed);
        let ttl = self
            .unary(self.0.keepalive_timeout, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await;
        match ttl {
            Ok(r) if r.ttl() <= 0 => LockGone::LeaseLost,
            Err(BackendError::LeaseNotFound) => LockGone::LeaseLost,
            _ => LockGone::KeyDeleted,
        }
    }

    async fn write(
        &self,
        name: &str,
        lease: LeaseId,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), BackendError> {
        // The service decides: the lock key must still exist with the token
        // as its create revision.
        let lock_key = lock_key(name, lease).into_bytes();
        let op = || match value {
            Some(v) => TxnOp::put(key, v, None),
            None => TxnOp::delete(key, None),
        };
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        lock_key.clone(),
                        CompareOp::Equal,
                        token.0 as i64,
                    )])
                    .and_then([op()]);
                async move { c.txn(txn).await }
            })
            .await?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(BackendError::Fenced)
        }
    }
}

/// The key watches of one lease ([`Backend::watch_keys`]): the keys live in
/// [`Keys`], one [`KeysTask`] keeps one Watch stream for all of them.
/// Dropping it ends the task, which closes the stream.
struct EtcdKeyWatch {
    keys: Arc<Keys>,
    lease: LeaseId,
}

/// What a [`KeyWatch`] shares with its task.
struct Keys {
    state: Mutex<KeysState>,
    /// Wakes the task: a key added or removed, or the watch dropped.
    wake: tokio::sync::Notify,
}

/// The bookkeeping of one [`KeyWatch`]: one map entry per key, plus the
/// work queued for the task.
#[derive(Default)]
struct KeysState {
    keys: HashMap<Token, KeyEntry>,
    /// The watchers on the current stream: watch id → token.
    by_watch: HashMap<i64, Token>,
    /// Keys waiting for a watcher on the current stream. May hold tokens
    /// removed or no longer waiting since: skipped.
    queued: VecDeque<Token>,
    /// Keys added, with when they join `queued` ([`WATCH_AFTER`]).
    fresh: VecDeque<(Token, TokioInstant)>,
    /// Watchers to cancel on the current stream.
    cancels: Vec<i64>,
    /// Keys to read back: their watcher was canceled (history compacted).
    checks: VecDeque<Token>,
    /// Keys seen gone, not yet reported: waiting for a lease lookup.
    doomed: Vec<Token>,
    /// The last watch id handed out: ids are chosen here (etcd ≥ 3.4) and
    /// never reused, so no reply of an old watcher is taken for a new one.
    last_id: i64,
    closed: bool,
}

struct KeyEntry {
    /// `<name>/<lease hex>`.
    key: String,
    /// The next revision to watch from: every revision before it is known
    /// to leave the key alive.
    from: i64,
    phase: Phase,
}

/// What a reply on a [`KeyWatch`]'s stream means for the stream.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// A watcher of ours created.
    Created,
    /// A create refused, the key unknown: the stream opens again.
    Refused(String),
    Other,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a watcher on the current stream (in `queued`).
    Queued,
    /// Watched by this watch id on the current stream.
    Watching(i64),
    /// Being read back (in `checks` or a read in flight).
    Checking,
    /// Seen gone; reported once the lease lookup answers.
    Gone,
}

impl KeysState {
    /// Takes the next key waiting for a watcher and gives it a watch id:
    /// the key and the create request's options.
    fn next_create(&mut self) -> Option<(String, WatchOptions)> {
        while let Some(token) = self.queued.pop_front() {
            let Some(e) = self.keys.get_mut(&token) else {
                continue;
            };
            if e.phase != Phase::Queued {
                continue;
            }
            self.last_id += 1;
            let id = self.last_id;
            e.phase = Phase::Watching(id);
            self.by_watch.insert(id, token);
            let options = WatchOptions::new()
                .with_start_revision(e.from)
                .with_watch_id(id)
                // Periodic progress (etcd: every 10 min, synced watchers
                // only) moves `from` on, so a re-open after a fail-over
                // replays little history.
                .with_progress_notify();
            return Some((e.key.clone(), options));
        }
        None
    }

    /// The stream is gone: every watched key waits for a watcher on the
    /// next one, from its own `from`.
    fn reset(&mut self) {
        self.by_watch.clear();
        self.cancels.clear();
        self.queued.clear();
        for (token, e) in &mut self.keys {
            if matches!(e.phase, Phase::Queued | Phase::Watching(_)) {
                e.phase = Phase::Queued;
                self.queued.push_back(*token);
            }
        }
    }

    /// One reply on the stream.
    fn on_reply(&mut self, r: &WatchResponse) -> Reply {
        if r.created() && r.canceled() {
            // A create refused. etcd says which only by the id -1 (an auth
            // token expired since the stream opened, or permission
            // denied): the stream must open again, with a fresh token.
            return Reply::Refused(r.cancel_reason().to_owned());
        }
        let id = r.watch_id();
        // Not ours (any more): removed, or already gone.
        let Some(&token) = self.by_watch.get(&id) else {
            return Reply::Other;
        };
        let Some(e) = self.keys.get_mut(&token) else {
            self.by_watch.remove(&id);
            return Reply::Other;
        };
        if r.created() {
            return Reply::Created;
        }
        if r.canceled() {
            // History compacted past `from` (or another reason of the
            // server's): the key itself tells whether it still stands.
            tracing::debug!(key = %e.key, reason = r.cancel_reason(), compacted = r.compact_revision(), "etcd key watcher canceled: reading the key back");
            self.by_watch.remove(&id);
            // Frees the watcher on the server.
            self.cancels.push(id);
            e.phase = Phase::Checking;
            self.checks.push_back(token);
            return Reply::Other;
        }
        let mut deleted = false;
        for ev in r.events() {
            if ev.event_type() == EventType::Delete {
                deleted = true;
                break;
            }
            if let Some(kv) = ev.kv() {
                e.from = e.from.max(kv.mod_revision() + 1);
            }
        }
        if deleted {
            self.by_watch.remove(&id);
            self.cancels.push(id);
            e.phase = Phase::Gone;
            self.doomed.push(token);
        } else if r.events().is_empty() {
            // A progress notification: the watcher is synced up to it.
            if let Some(h) = r.header() {
                e.from = e.from.max(h.revision() + 1);
            }
        }
        Reply::Other
    }

    /// Reports the keys of `tokens` still gone (not removed meanwhile).
    fn report(&mut self, tokens: &[Token], why: LockGone, gone: &UnboundedSender<KeyGone>) {
        for token in tokens {
            if self.keys.get(token).is_some_and(|e| e.phase == Phase::Gone) {
                self.keys.remove(token);
                let _ = gone.send(KeyGone { token: *token, why });
            }
        }
    }
}

impl KeyWatch for EtcdKeyWatch {
    fn add(&self, name: &str, token: Token) {
        let mut s = lock(&self.keys.state);
        if s.closed || s.keys.contains_key(&token) {
            return;
        }
        s.keys.insert(
            token,
            KeyEntry {
                key: lock_key(name, self.lease),
                from: token.0 as i64 + 1,
                phase: Phase::Queued,
            },
        );
        s.fresh
            .push_back((token, TokioInstant::now() + WATCH_AFTER));
        // Tokens removed while waiting stay queued until popped; keep them
        // from piling up while no stream takes them.
        if s.queued.len() + s.fresh.len() > 2 * s.keys.len() + 64 {
            let KeysState {
                keys,
                queued,
                fresh,
                ..
            } = &mut *s;
            queued.retain(|t| keys.get(t).is_some_and(|e| e.phase == Phase::Queued));
            fresh.retain(|(t, _)| keys.get(t).is_some_and(|e| e.phase == Phase::Queued));
        }
        drop(s);
        self.keys.wake.notify_one();
    }

    fn remove(&self, token: Token) {
        let mut s = lock(&self.keys.state);
        if let Some(e) = s.keys.remove(&token) {
            if let Phase::Watching(id) = e.phase {
                s.by_watch.remove(&id);
                s.cancels.push(id);
                drop(s);
                self.keys.wake.notify_one();
            }
        }
    }
}

impl Drop for EtcdKeyWatch {
    fn drop(&mut self) {
        lock(&self.keys.state).closed = true;
        self.keys.wake.notify_one();
    }
}

type Job<T> = Option<(Vec<Token>, BoxFuture<'static, T>)>;

/// The task of one [`KeyWatch`]: owns its Watch stream, sends the
/// watchers' create and cancel requests on it (a batch at a time), reads
/// its replies, and runs the reads the replies call for (a lease lookup for
/// the keys gone, a read-back of the keys whose watchers were canceled),
/// one of each at a time, while it goes on reading the stream.
struct KeysTask {
    backend: EtcdBackend,
    lease: LeaseId,
    keys: Arc<Keys>,
    gone: UnboundedSender<KeyGone>,
    /// The endpoint of the stream open or opening.
    endpoint: usize,
    /// Ends the stream when another call abandons its endpoint.
    abandoned: Option<tokio::sync::watch::Receiver<u64>>,
    opening:
        Option<BoxFuture<'static, Result<(WatchRequestSender, WatchResponseStream), BackendError>>>,
    replies: Option<WatchResponseStream>,
    /// The stream's request side, while no request is being sent.
    sender: Option<WatchRequestSender>,
    /// The requests being sent; gives the sender back.
    sending: Option<BoxFuture<'static, (WatchRequestSender, Result<(), etcd_client::Error>)>>,
    /// No stream opens before (after a failure of the stream's own).
    reopen_at: Option<TokioInstant>,
    checking: Job<Result<(i64, Vec<bool>), BackendError>>,
    /// No read-back starts before (after one failed).
    check_at: Option<TokioInstant>,
    /// When the oldest fresh key is due for a watcher.
    create_at: Option<TokioInstant>,
    asking: Job<LockGone>,
    /// The lease is known gone: every key gone since went with it.
    lease_lost: bool,
    /// Streams that had a create refused since a create last succeeded:
    /// the next stream authenticates again first, and after a second
    /// refusal in a row opens only after a pause.
    refusals: u32,
}

/// A request on a [`KeyWatch`]'s stream.
enum Request {
    Cancel(i64),
    Create(String, WatchOptions),
}

enum Wake {
    Poked,
    Opened(Result<(WatchRequestSender, WatchResponseStream), BackendError>),
    Reply(Result<WatchResponse, BackendError>),
    Sent(WatchRequestSender, Result<(), etcd_client::Error>),
    Checked(Result<(i64, Vec<bool>), BackendError>),
    Answered(LockGone),
}

/// Awaits the future in `slot`, or forever if there is none.
async fn slot<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn job<T>(job: &mut Job<T>) -> T {
    match job {
        Some((_, f)) => f.await,
        None => std::future::pending().await,
    }
}

async fn next_reply(
    replies: &mut Option<WatchResponseStream>,
) -> Result<WatchResponse, BackendError> {
    match replies {
        Some(r) => r
            .message()
            .await
            .map_err(classify)?
            .ok_or_else(|| BackendError::Unavailable("watch stream closed".into())),
        None => std::future::pending().await,
    }
}

async fn abandoned(rx: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

async fn until(at: Option<TokioInstant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl KeysTask {
    async fn run(mut self) {
        while self.step() {
            let wake = self.wait().await;
            self.handle(wake);
        }
    }

    /// Starts whatever can start; false once the watch is dropped (or no
    /// one listens any more).
    fn step(&mut self) -> bool {
        let now = TokioInstant::now();
        if self.reopen_at.is_some_and(|t| t <= now) {
            self.reopen_at = None;
        }
        if self.check_at.is_some_and(|t| t <= now) {
            self.check_at = None;
        }
        let mut s = lock(&self.keys.state);
        if s.closed || self.gone.is_closed() {
            return false;
        }
        // Keys held for WATCH_AFTER now wait for a watcher.
        while let Some(&(token, at)) = s.fresh.front() {
            if at > now {
                break;
            }
            s.fresh.pop_front();
            s.queued.push_back(token);
        }
        self.create_at = s.fresh.front().map(|(_, at)| *at);
        // A stream opens with the first key to watch (etcd's create
        // request opens it).
        if self.replies.is_none() && self.opening.is_none() && self.reopen_at.is_none() {
            if let Some((key, options)) = s.next_create() {
                #[cfg(test)]
                self.backend.0.creates.fetch_add(1, Ordering::Relaxed);
                let i = self.backend.current();
                self.endpoint = i;
                // Subscribed first: an abandonment while opening counts.
                self.abandoned = Some(self.backend.0.abandoned[i].subscribe());
                let b = self.backend.clone();
                let fresh_token = self.refusals > 0;
                self.opening = Some(Box::pin(async move {
                    b.open_keys(i, key, options, fresh_token).await
                }));
            }
        }
        // One batch of requests on the stream at a time, cancels first. A
        // request taken is sent unless the stream goes (and then all
        // starts over).
        if self.sending.is_none() {
            if let Some(mut tx) = self.sender.take() {
                let mut batch = Vec::new();
                while batch.len() < SEND_BATCH {
                    match s.cancels.pop() {
                        Some(id) => batch.push(Request::Cancel(id)),
                        None => match s.next_create() {
                            Some((key, options)) => {
                                #[cfg(test)]
                                self.backend.0.creates.fetch_add(1, Ordering::Relaxed);
                                batch.push(Request::Create(key, options))
                            }
                            None => break,
                        },
                    }
                }
                if batch.is_empty() {
                    self.sender = Some(tx);
                } else {
                    self.sending = Some(Box::pin(async move {
                        for request in batch {
                            let r = match request {
                                Request::Cancel(id) => tx.cancel(id).await,
                                Request::Create(key, options) => tx.watch(key, Some(options)).await,
                            };
                            if r.is_err() {
                                return (tx, r);
                            }
                        }
                        (tx, Ok(()))
                    }));
                }
            }
        }
        if self.checking.is_none() && self.check_at.is_none() {
            let mut batch = Vec::new();
            while batch.len() < CHECK_BATCH {
                let Some(token) = s.checks.pop_front() else {
                    break;
                };
                if let Some(e) = s.keys.get(&token) {
                    if e.phase == Phase::Checking {
                        batch.push((token, e.key.clone()));
                    }
                }
            }
            if !batch.is_empty() {
                let tokens = batch.iter().map(|(t, _)| *t).collect();
                let b = self.backend.clone();
                self.checking = Some((tokens, Box::pin(async move { b.check_keys(&batch).await })));
            }
        }
        if !s.doomed.is_empty() {
            if self.lease_lost {
                let doomed = std::mem::take(&mut s.doomed);
                s.report(&doomed, LockGone::LeaseLost, &self.gone);
            } else if self.asking.is_none() {
                // One lookup for every key seen gone so far.
                let batch = std::mem::take(&mut s.doomed);
                let b = self.backend.clone();
                let lease = self.lease;
                self.asking = Some((batch, Box::pin(async move { b.why_gone(lease).await })));
            }
        }
        true
    }

    async fn wait(&mut self) -> Wake {
        let timer = self
            .reopen_at
            .into_iter()
            .chain(self.check_at)
            .chain(self.create_at)
            .min();
        tokio::select! {
            _ = self.keys.wake.notified() => Wake::Poked,
            _ = until(timer) => Wake::Poked,
            _ = abandoned(&mut self.abandoned) => {
                Wake::Reply(Err(BackendError::Unavailable(ABANDONED.into())))
            }
            r = slot(&mut self.opening) => Wake::Opened(r),
            r = next_reply(&mut self.replies) => Wake::Reply(r),
            (tx, r) = slot(&mut self.sending) => Wake::Sent(tx, r),
            r = job(&mut self.checking) => Wake::Checked(r),
            why = job(&mut self.asking) => Wake::Answered(why),
        }
    }

    fn handle(&mut self, wake: Wake) {
        match wake {
            Wake::Poked => {}
            Wake::Opened(Ok((tx, replies))) => {
                self.opening = None;
                self.sender = Some(tx);
                self.replies = Some(replies);
            }
            Wake::Opened(Err(e)) | Wake::Reply(Err(e)) => self.lost(e),
            Wake::Reply(Ok(r)) => {
                let reply = lock(&self.keys.state).on_reply(&r);
                match reply {
                    Reply::Created => self.refusals = 0,
                    Reply::Refused(why) => self.refused(&why),
                    Reply::Other => {}
                }
            }
            Wake::Sent(tx, Ok(())) => {
                self.sending = None;
                self.sender = Some(tx);
            }
            Wake::Sent(_, Err(e)) => self.lost(BackendError::Unavailable(e.to_string())),
            Wake::Checked(r) => {
                let Some((tokens, _)) = self.checking.take() else {
                    return;
                };
                let mut s = lock(&self.keys.state);
                match r {
                    Ok((revision, alive)) => {
                        for (token, alive) in tokens.into_iter().zip(alive) {
                            let Some(e) = s.keys.get_mut(&token) else {
                                continue;
                            };
                            if e.phase != Phase::Checking {
                                continue;
                            }
                            if alive {
                                // Alive at `revision`: watch what follows.
                                e.from = revision + 1;
                                e.phase = Phase::Queued;
                                s.queued.push_back(token);
                            } else {
                                e.phase = Phase::Gone;
                                s.doomed.push(token);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd: reading watched keys back failed; retrying");
                        for token in tokens.into_iter().rev() {
                            s.checks.push_front(token);
                        }
                        self.check_at = Some(TokioInstant::now() + self.backend.0.retry_interval);
                    }
                }
            }
            Wake::Answered(why) => {
                let Some((tokens, _)) = self.asking.take() else {
                    return;
                };
                if why == LockGone::LeaseLost {
                    // For good: a lease never comes back.
                    self.lease_lost = true;
                }
                lock(&self.keys.state).report(&tokens, why, &self.gone);
            }
        }
    }

    /// The stream failed, closed or was abandoned: every watcher re-opens
    /// together on the next stream, each from its own next revision.
    fn lost(&mut self, e: BackendError) {
        let i = self.endpoint;
        tracing::debug!(endpoint = %self.backend.0.urls[i], error = %e, "etcd key watch failed: re-opening its watchers");
        self.close();
        if self.backend.watch_failed(i, &e) {
            self.reopen_at = Some(TokioInstant::now() + self.backend.0.retry_interval);
        }
    }

    /// A create was refused: the stream's auth token expired (its token is
    /// the one it opened with), or permission is denied. Every watcher
    /// re-opens on a new stream (on the current endpoint), with a fresh
    /// token.
    fn refused(&mut self, why: &str) {
        tracing::debug!(endpoint = %self.backend.0.urls[self.endpoint], reason = why, "etcd key watch: a watcher was refused; re-opening with a fresh token");
        self.close();
        self.refusals += 1;
        if self.refusals > 1 {
            tracing::warn!(endpoint = %self.backend.0.urls[self.endpoint], reason = why, "etcd refuses to watch a lock key; retrying");
            self.reopen_at = Some(TokioInstant::now() + self.backend.0.retry_interval);
        }
    }

    /// Drops the stream; every key waits for the next one.
    fn close(&mut self) {
        self.opening = None;
        self.replies = None;
        self.sender = None;
        self.sending = None;
        self.abandoned = None;
        lock(&self.keys.state).reset();
    }
}

impl Backend for EtcdBackend {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, BackendError>> {
        Box::pin(async move {
            // Whole seconds, rounded up; a TTL past i64 (no upper bound in
            // the options) asks for the most and lets etcd say no.
            let secs = ttl
                .as_secs()
                .saturating_add(u64::from(ttl.subsec_nanos() > 0));
            let secs = i64::try_from(secs).unwrap_or(i64::MAX);
            let r = self
                .unary(self.0.keepalive_timeout, |mut c| async move {
                    c.lease_grant(secs, None).await
                })
                .await?;
            if r.ttl() <= 0 {
                return Err(BackendError::Unavailable(
                    "lease granted with no TTL".into(),
                ));
            }
            let ttl = Duration::from_secs(r.ttl() as u64);
            lock(&self.0.leases).insert(
                r.id(),
                Arc::new(LeaseRec {
                    ttl,
                    stream: tokio::sync::Mutex::new(None),
                }),
            );
            Ok(Grant { lease: r.id(), ttl })
        })
    }

    fn keepalive(&self, lease: LeaseId) -> BoxFuture<'_, Result<Duration, BackendError>> {
        Box::pin(async move {
            let r = self.keepalive_once(lease).await;
            if r == Err(BackendError::LeaseNotFound) {
                lock(&self.0.leases).remove(&lease);
            }
            r
        })
    }

    fn lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(self.acquire(name, lease, wait))
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            lock(&self.0.leases).remove(&lease);
            self.unary(self.0.request_timeout, |mut c| async move {
                c.lease_revoke(lease).await
            })
            .await
            .map(|_| ())
        })
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
    fn watch_keys(&self, lease: LeaseId, gone: UnboundedSender<KeyGone>) -> Box<dyn KeyWatch> {
        let keys = Arc::new(Keys {
            state: Mutex::new(KeysState::default()),
            wake: tokio::sync::Notify::new(),
        });
        let task = KeysTask {
            backend: self.clone(),
            lease,
            keys: keys.clone(),
            gone,
            endpoint: 0,
            abandoned: None,
            opening: None,
            replies: None,
            sender: None,
            sending: None,
            reopen_at: None,
            checking: None,
            check_at: None,
            create_at: None,
            asking: None,
            lease_lost: false,
            refusals: 0,
        };
        tokio::spawn(task.run());
        Box::new(EtcdKeyWatch { keys, lease })
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_etcd_mutex_keys() {
        // concurrency.Mutex: pfx + "/" + fmt.Sprintf("%x", leaseID)
        assert_eq!(
            lock_key("jobs", 0x694d7f0c2b0c7e0a),
            "jobs/694d7f0c2b0c7e0a"
        );
        assert_eq!(lock_key("a/b", 255), "a/b/ff");
    }

    #[test]
    fn lost_leases_are_told_apart_from_failures() {
        let lost = etcd_client::Error::LeaseKeepAliveError("lease not found".into());
        assert_eq!(classify(lost), BackendError::LeaseNotFound);
        let status = error("etcdserver: requested lease not found");
        assert_eq!(classify(status), BackendError::LeaseNotFound);
        let other = error("etcdserver: no leader");
        assert!(matches!(classify(other), BackendError::Unavailable(m) if m.contains("no leader")));
    }

    #[test]
    fn keys_state_hands_out_fresh_watch_ids_and_requeues_on_reset() {
        let mut s = KeysState::default();
        for t in [10, 20, 30] {
            s.keys.insert(
                Token(t),
                KeyEntry {
                    key: format!("k{t}/1"),
                    from: t as i64 + 1,
                    phase: Phase::Queued,
                },
            );
            s.queued.push_back(Token(t));
        }
        // A token removed while queued is skipped.
        s.keys.remove(&Token(20));
        let (k1, _) = s.next_create().unwrap();
        let (k2, _) = s.next_create().unwrap();
        assert_eq!((k1.as_str(), k2.as_str()), ("k10/1", "k30/1"));
        assert!(s.next_create().is_none());
        assert_eq!(s.keys[&Token(10)].phase, Phase::Watching(1));
        assert_eq!(s.keys[&Token(30)].phase, Phase::Watching(2));
        // The stream goes: both wait for the next one, with new ids there.
        s.cancels.push(7);
        s.reset();
        assert!(s.by_watch.is_empty() && s.cancels.is_empty());
        let mut ids = vec![];
        while s.next_create().is_some() {}
        for t in [10, 30] {
            let Phase::Watching(id) = s.keys[&Token(t)].phase else {
                panic!("{t} not watched again");
            };
            ids.push(id);
        }
        ids.sort();
        assert_eq!(ids, [3, 4]);
        // Gone keys are reported once, and not once removed.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for t in [10, 30] {
            s.keys.get_mut(&Token(t)).unwrap().phase = Phase::Gone;
        }
        s.keys.remove(&Token(30));
        s.report(&[Token(10), Token(30)], LockGone::KeyDeleted, &tx);
        s.report(&[Token(10)], LockGone::KeyDeleted, &tx);
        assert_eq!(
            rx.try_recv(),
            Ok(KeyGone {
                token: Token(10),
                why: LockGone::KeyDeleted
            })
        );
        assert!(rx.try_recv().is_err());
    }

    // ---- Against a real etcd: set DLOCK_TEST_ENDPOINTS (for example to the
    // members of `scripts/etcd-cluster.sh start`); skipped otherwise. ----

    use std::collections::HashSet;
    use std::pin::Pin;
    use std::task::Poll;
    use std::time::{SystemTime, UNIX_EPOCH};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

    /// Tests that stop a member, compact the history or count the
    /// cluster's requests run alone; the others share the cluster.
    static CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

    /// The bound on every wait for an event.
    const WAIT: Duration = Duration::from_secs(30);

    struct Fixture {
        backend: EtcdBackend,
        /// A plain client, for what an operator would do.
        raw: Etcd,
        endpoints: Vec<String>,
        /// Names under it are this test run's own.
        prefix: String,
    }

    async fn fixture(test: &str) -> Option<Fixture> {
        let endpoints: Vec<String> = match std::env::var("DLOCK_TEST_ENDPOINTS") {
            Ok(v) if !v.trim().is_empty() => v.split(',').map(|e| e.trim().to_string()).collect(),
            _ => {
                eprintln!("{test}: skipped (DLOCK_TEST_ENDPOINTS is not set)");
                return None;
            }
        };
        let mut config = EtcdConfig::new(endpoints.clone());
        config.connect_timeout = Duration::from_secs(1);
        config.request_timeout = Duration::from_secs(2);
        let backend = EtcdBackend::new(&config, &Options::default()).unwrap();
        backend.connect_first().await.unwrap();
        let raw = Etcd::connect(&endpoints, None).await.unwrap();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Some(Fixture {
            backend,
            raw,
            endpoints,
            prefix: format!("dlock-test/{test}/{}-{nanos}", std::process::id()),
        })
    }

    impl Fixture {
        async fn lease(&self) -> LeaseId {
            self.backend
                .grant(Duration::from_secs(120))
                .await
                .unwrap()
                .lease
        }

        /// Locks `n` names under `lease`: token → (name, key).
        async fn lock_many(&self, lease: LeaseId, n: usize) -> HashMap<Token, (String, String)> {
            let mut set = tokio::task::JoinSet::new();
            let workers = 32.min(n.max(1));
            for w in 0..workers {
                let b = self.backend.clone();
                let prefix = self.prefix.clone();
                set.spawn(async move {
                    let mut out = vec![];
                    for i in (w..n).step_by(workers) {
                        let name = format!("{prefix}/k{i}");
                        let t = b.lock(&name, lease, false).await.unwrap();
                        out.push((t, (name.clone(), lock_key(&name, lease))));
                    }
                    out
                });
            }
            let mut all = HashMap::new();
            while let Some(r) = set.join_next().await {
                all.extend(r.unwrap());
            }
            assert_eq!(all.len(), n, "tokens are unique");
            all
        }

        /// The create revision of `key`, if it exists.
        async fn key_rev(&mut self, key: &str) -> Option<i64> {
            let r = self.raw.get(key, None).await.unwrap();
            r.kvs().first().map(|kv| kv.create_revision())
        }

        /// A plain delete (an operator's `etcdctl del`).
        async fn delete(&mut self, key: &str) {
            let r = self.raw.delete(key, None).await.unwrap();
            assert_eq!(r.deleted(), 1, "{key} was there to delete");
        }
    }

    async fn recv(rx: &mut UnboundedReceiver<KeyGone>) -> KeyGone {
        timeout(WAIT, rx.recv())
            .await
            .expect("no key reported gone in time")
            .expect("the report channel closed")
    }

    /// Asserts nothing more is reported for a while.
    async fn quiet(rx: &mut UnboundedReceiver<KeyGone>) {
        if let Ok(g) = timeout(Duration::from_secs(1), rx.recv()).await {
            panic!("unexpected report {g:?}");
        }
    }

    /// Polls `f` once.
    async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
        std::future::poll_fn(|cx| {
            Poll::Ready(match Pin::new(&mut *f).poll(cx) {
                Poll::Ready(v) => Some(v),
                Poll::Pending => None,
            })
        })
        .await
    }

    /// `grpc_server_started_total` of `method` summed over the members
    /// (their `/metrics`).
    async fn started(endpoints: &[String], method: &str) -> u64 {
        let mut total = 0;
        for e in endpoints {
            let host = e.trim_start_matches("http://").trim_end_matches('/');
            let mut c = tokio::net::TcpStream::connect(host).await.unwrap();
            c.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut body = String::new();
            c.read_to_string(&mut body).await.unwrap();
            let tag = format!("grpc_method=\"{method}\"");
            total += body
                .lines()
                .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&tag))
                .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
                .sum::<u64>();
        }
        total
    }

    #[tokio::test]
    async fn etcd_unlock_with_a_token_deletes_only_that_acquisition() {
        let _shared = CLUSTER.read().await;
        let Some(mut f) = fixture("unlock-token").await else {
            return;
        };
        let lease = f.lease().await;
        let name = format!("{}/a", f.prefix);
        let key = lock_key(&name, lease);
        let t1 = f.backend.lock(&name, lease, false).await.unwrap();
        assert_eq!(f.key_rev(&key).await, Some(t1.0 as i64));
        f.backend.unlock(&name, lease, Some(t1)).await.unwrap();
        assert_eq!(f.key_rev(&key).await, None);
        let t2 = f.backend.lock(&name, lease, false).await.unwrap();
        assert!(t2 > t1);
        // A late release of the first acquisition leaves the second alone.
        f.backend.unlock(&name, lease, Some(t1)).await.unwrap();
        assert_eq!(f.key_rev(&key).await, Some(t2.0 as i64));
        f.backend.unlock(&name, lease, Some(t2)).await.unwrap();
        assert_eq!(f.key_rev(&key).await, None);
        // Absent: still Ok.
        f.backend.unlock(&name, lease, Some(t2)).await.unwrap();
        f.backend.unlock(&name, lease, None).await.unwrap();
        f.backend.revoke(lease).await.unwrap();
    }

    #[tokio::test]
    async fn etcd_unlock_without_a_token_lands_after_a_dropped_lock_request() {
        let _shared = CLUSTER.read().await;
        let Some(mut f) = fixture("unlock-race").await else {
            return;
        };
        let lease = f.lease().await;
        for n in 0..20 {
            let name = format!("{}/r{n}", f.prefix);
            let key = lock_key(&name, lease);
            // What lands on the key, in order.
            let mut w = f.raw.watch(key.as_str(), None).await.unwrap();
            let created = timeout(WAIT, w.message()).await.unwrap().unwrap().unwrap();
            assert!(created.created());
            let mut request = f.backend.lock(&name, lease, false);
            // One poll sends the lock request on its way; then the caller
            // gives up on it and releases.
            assert!(poll_once(&mut request).await.is_none());
            drop(request);
            f.backend.unlock(&name, lease, None).await.unwrap();
            // The put, then the delete; a put landing last shows as no
            // second event (the delete found nothing).
            let mut seen = vec![];
            while seen.len() < 2 {
                match timeout(Duration::from_secs(3), w.message()).await {
                    Ok(m) => {
                        seen.extend(m.unwrap().unwrap().events().iter().map(|e| e.event_type()))
                    }
                    Err(_) => break,
                }
            }
            assert_eq!(
                seen,
                [EventType::Put, EventType::Delete],
                "round {n}: the lock request must land before the release"
            );
            assert_eq!(f.key_rev(&key).await, None, "round {n}: a key was left");
        }
        assert!(lock(&f.backend.0.puts).is_empty(), "no entry left behind");
        f.backend.revoke(lease).await.unwrap();
    }

    #[tokio::test]
    async fn etcd_key_watch_tells_a_deleted_key_from_a_lost_lease() {
        // Alone: counts the cluster's Watch streams.
        let _alone = CLUSTER.write().await;
        let Some(mut f) = fixture("watch-200").await else {
            return;
        };
        let lease = f.lease().await;
        let held = f.lock_many(lease, 200).await;
        let streams = started(&f.endpoints, "Watch").await;
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        for (t, (name, _)) in &held {
            watch.add(name, *t);
        }
        // An operator deletes one key.
        let (&victim, (_, vkey)) = held.iter().nth(17).unwrap();
        let vkey = vkey.clone();
        f.delete(&vkey).await;
        assert_eq!(
            recv(&mut rx).await,
            KeyGone {
                token: victim,
                why: LockGone::KeyDeleted
            }
        );
        let asked = f.backend.0.why_asked.load(Ordering::Relaxed);
        assert_eq!(asked, 1);
        // The lease goes: every other key with it, each reported once.
        f.backend.revoke(lease).await.unwrap();
        let mut lost = HashSet::new();
        while lost.len() < held.len() - 1 {
            let g = recv(&mut rx).await;
            assert_eq!(g.why, LockGone::LeaseLost, "{g:?}");
            assert!(held.contains_key(&g.token) && g.token != victim, "{g:?}");
            assert!(lost.insert(g.token), "{g:?} reported twice");
        }
        quiet(&mut rx).await;
        let lookups = f.backend.0.why_asked.load(Ordering::Relaxed) - asked;
        assert!(lookups <= 3, "{lookups} lease lookups for one revocation");
        // Every watcher on one stream.
        assert_eq!(started(&f.endpoints, "Watch").await - streams, 1);
        drop(watch);
    }

    #[tokio::test]
    async fn etcd_key_watch_reports_neither_removed_keys_nor_twice() {
        let _shared = CLUSTER.read().await;
        let Some(mut f) = fixture("watch-remove").await else {
            return;
        };
        let lease = f.lease().await;
        let names: Vec<String> = ["a", "b", "c", "d"]
            .iter()
            .map(|n| format!("{}/{n}", f.prefix))
            .collect();
        let mut tokens = vec![];
        for n in &names {
            tokens.push(f.backend.lock(n, lease, false).await.unwrap());
        }
        let key = |i: usize| lock_key(&names[i], lease);
        // d is deleted before it is watched: the watch starts at its token.
        f.delete(&key(3)).await;
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        for (n, t) in names.iter().zip(&tokens) {
            watch.add(n, *t);
        }
        watch.add(&names[0], tokens[0]); // twice: one watcher
        watch.remove(tokens[1]);
        watch.remove(Token(1)); // unknown: ignored
        f.delete(&key(1)).await;
        f.delete(&key(0)).await;
        f.delete(&key(2)).await;
        let mut got = HashSet::new();
        for _ in 0..3 {
            let g = recv(&mut rx).await;
            assert_eq!(g.why, LockGone::KeyDeleted, "{g:?}");
            assert!(got.insert(g.token), "{g:?} reported twice");
        }
        assert_eq!(got, HashSet::from([tokens[0], tokens[2], tokens[3]]));
        quiet(&mut rx).await;
        f.backend.revoke(lease).await.unwrap();
        // Nothing left to report.
        quiet(&mut rx).await;
        drop(watch);
    }

    #[tokio::test]
    async fn etcd_key_watch_reopens_on_an_abandoned_endpoint() {
        let _shared = CLUSTER.read().await;
        let Some(mut f) = fixture("watch-abandon").await else {
            return;
        };
        let lease = f.lease().await;
        let held = f.lock_many(lease, 20).await;
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        for (t, (name, _)) in &held {
            watch.add(name, *t);
        }
        let mut order: Vec<_> = held.iter().map(|(t, (_, k))| (*t, k.clone())).collect();
        order.sort();
        // The stream is open once a delete is reported.
        f.delete(&order[0].1).await;
        assert_eq!(recv(&mut rx).await.token, order[0].0);
        for (round, (token, key)) in order.iter().enumerate().take(4).skip(1) {
            // Every endpoint abandoned (as a timed-out call does): the
            // stream moves wherever it is, all its watchers with it.
            for i in 0..f.endpoints.len() {
                f.backend.fail(i);
            }
            f.delete(key).await;
            assert_eq!(
                recv(&mut rx).await,
                KeyGone {
                    token: *token,
                    why: LockGone::KeyDeleted
                },
                "round {round}"
            );
        }
        quiet(&mut rx).await;
        drop(watch);
        f.backend.revoke(lease).await.unwrap();
    }

    /// Stops a process until dropped.
    struct Stopped(i32);

    impl Stopped {
        fn new(pid: i32) -> Stopped {
            assert_eq!(
                unsafe { libc::kill(pid, libc::SIGSTOP) },
                0,
                "SIGSTOP {pid}"
            );
            Stopped(pid)
        }
    }

    impl Drop for Stopped {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }

    #[tokio::test]
    async fn etcd_key_watch_misses_no_delete_while_its_member_hangs() {
        let _alone = CLUSTER.write().await;
        let Some(mut f) = fixture("watch-member").await else {
            return;
        };
        let members = std::env::var("DLOCK_TEST_MEMBERS").unwrap_or_default();
        // The env file has the current pids (other tests restart members);
        // the variable those of the cluster's start.
        let fresh = std::env::var("DLOCK_TEST_ENV_FILE")
            .ok()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|text| {
                text.lines()
                    .find_map(|l| l.strip_prefix("export DLOCK_TEST_PIDS="))
                    .map(str::to_owned)
            });
        let pids: Vec<i32> = fresh
            .or_else(|| std::env::var("DLOCK_TEST_PIDS").ok())
            .unwrap_or_default()
            .split(',')
            .filter_map(|p| p.parse().ok())
            .collect();
        if members.split(',').collect::<Vec<_>>() != f.endpoints || pids.len() != f.endpoints.len()
        {
            eprintln!(
                "skipped: needs DLOCK_TEST_MEMBERS and DLOCK_TEST_PIDS of the cluster in DLOCK_TEST_ENDPOINTS"
            );
            return;
        }
        let lease = f.lease().await;
        let held = f.lock_many(lease, 20).await;
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        for (t, (name, _)) in &held {
            watch.add(name, *t);
        }
        let mut order: Vec<_> = held.iter().map(|(t, (_, k))| (*t, k.clone())).collect();
        order.sort();
        f.delete(&order[0].1).await;
        assert_eq!(recv(&mut rx).await.token, order[0].0);
        // The stream opened on the current endpoint (nothing failed since).
        let i = f.backend.current();
        let stopped = Stopped::new(pids[i]);
        // Deleted while the stream hangs on the stopped member: the next
        // stream must find it in the history.
        let others: Vec<&String> = (0..f.endpoints.len())
            .filter(|&j| j != i)
            .map(|j| &f.endpoints[j])
            .collect();
        let mut raw = Etcd::connect(others, None).await.unwrap();
        let deadline = TokioInstant::now() + WAIT;
        loop {
            match timeout(
                Duration::from_secs(2),
                raw.delete(order[1].1.as_str(), None),
            )
            .await
            {
                Ok(Ok(r)) => {
                    assert_eq!(r.deleted(), 1);
                    break;
                }
                other => {
                    assert!(TokioInstant::now() < deadline, "delete failed: {other:?}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        assert_eq!(
            recv(&mut rx).await,
            KeyGone {
                token: order[1].0,
                why: LockGone::KeyDeleted
            }
        );
        drop(stopped);
        // Still watching, elsewhere.
        f.raw = raw;
        f.delete(&order[2].1).await;
        assert_eq!(recv(&mut rx).await.token, order[2].0);
        quiet(&mut rx).await;
        drop(watch);
        f.backend.revoke(lease).await.unwrap();
        // The member back before the next test.
        let mut m = Etcd::connect([&f.endpoints[i]], None).await.unwrap();
        timeout(WAIT, async {
            while m.status().await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn etcd_key_watch_reads_keys_back_after_a_compaction() {
        let _alone = CLUSTER.write().await;
        let Some(mut f) = fixture("watch-compact").await else {
            return;
        };
        let lease = f.lease().await;
        let a = format!("{}/a", f.prefix);
        let b = format!("{}/b", f.prefix);
        let ta = f.backend.lock(&a, lease, false).await.unwrap();
        let tb = f.backend.lock(&b, lease, false).await.unwrap();
        f.delete(&lock_key(&b, lease)).await;
        // History compacted past both tokens and b's delete (etcd keeps the
        // revision compacted at): both watchers are canceled; a reads back
        // alive, b gone.
        let scratch = format!("{}/scratch", f.prefix);
        let put = f.raw.put(scratch.as_str(), "", None).await.unwrap();
        f.raw
            .compact(put.header().unwrap().revision(), None)
            .await
            .unwrap();
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        watch.add(&a, ta);
        watch.add(&b, tb);
        assert_eq!(
            recv(&mut rx).await,
            KeyGone {
                token: tb,
                why: LockGone::KeyDeleted
            }
        );
        quiet(&mut rx).await;
        assert_eq!(f.backend.0.read_back.load(Ordering::Relaxed), 2);
        // a is watched again, from after the read.
        f.delete(&lock_key(&a, lease)).await;
        assert_eq!(
            recv(&mut rx).await,
            KeyGone {
                token: ta,
                why: LockGone::KeyDeleted
            }
        );
        drop(watch);
        f.backend.revoke(lease).await.unwrap();
    }

    #[tokio::test]
    async fn etcd_acquire_and_release_cost_one_txn_each() {
        let _alone = CLUSTER.write().await;
        let Some(f) = fixture("cost").await else {
            return;
        };
        let lease = f.lease().await;
        let (tx, _rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        let name = format!("{}/one", f.prefix);
        // Warm: the watch stream open.
        let t0 = f.backend.lock(&name, lease, false).await.unwrap();
        watch.add(&name, t0);
        watch.remove(t0);
        f.backend.unlock(&name, lease, Some(t0)).await.unwrap();
        let methods = ["Txn", "Range", "DeleteRange", "Put", "LeaseTimeToLive"];
        let mut before = vec![];
        for m in methods {
            before.push(started(&f.endpoints, m).await);
        }
        let t = f.backend.lock(&name, lease, false).await.unwrap();
        watch.add(&name, t);
        watch.remove(t);
        f.backend.unlock(&name, lease, Some(t)).await.unwrap();
        let mut after = vec![];
        for m in methods {
            after.push(started(&f.endpoints, m).await);
        }
        let spent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(spent, [2, 0, 0, 0, 0], "requests by method {methods:?}");
        drop(watch);
        f.backend.revoke(lease).await.unwrap();
    }

    /// A key released within WATCH_AFTER costs no watcher; one held longer
    /// gets one, and a delete made before it started is still reported.
    #[tokio::test]
    async fn etcd_key_watch_watches_only_keys_held_past_watch_after() {
        let _alone = CLUSTER.write().await;
        let Some(mut f) = fixture("watch-after").await else {
            return;
        };
        let lease = f.lease().await;
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        let backend = f.backend.clone();
        let creates = || backend.0.creates.load(Ordering::Relaxed);
        let name = format!("{}/short", f.prefix);
        let before = creates();
        for _ in 0..20 {
            let t = f.backend.lock(&name, lease, false).await.unwrap();
            watch.add(&name, t);
            // Held while the watch's task runs (it shares this runtime),
            // released well within WATCH_AFTER.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
            watch.remove(t);
            f.backend.unlock(&name, lease, Some(t)).await.unwrap();
        }
        tokio::time::sleep(WATCH_AFTER * 5).await;
        assert_eq!(creates(), before, "short holds created watchers");
        // Held: deleted at once by an operator, before its watcher exists.
        let name = format!("{}/held", f.prefix);
        let t = f.backend.lock(&name, lease, false).await.unwrap();
        watch.add(&name, t);
        f.delete(&lock_key(&name, lease)).await;
        let g = recv(&mut rx).await;
        assert_eq!((g.token, g.why), (t, LockGone::KeyDeleted));
        assert_eq!(creates(), before + 1, "one watcher for the held key");
        drop(watch);
        f.backend.revoke(lease).await.unwrap();
    }

    #[tokio::test]
    async fn etcd_key_watch_scales_to_10k_keys_on_one_stream() {
        let _alone = CLUSTER.write().await;
        let Some(f) = fixture("watch-10k").await else {
            return;
        };
        let n: usize = std::env::var("DLOCK_TEST_WATCH_KEYS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10_000);
        let lease = f.lease().await;
        let start = TokioInstant::now();
        let held = f.lock_many(lease, n).await;
        eprintln!("{n} keys locked in {:?}", start.elapsed());
        let streams = started(&f.endpoints, "Watch").await;
        let (tx, mut rx) = unbounded_channel();
        let watch = f.backend.watch_keys(lease, tx);
        for (t, (name, _)) in &held {
            watch.add(name, *t);
        }
        // One more key, deleted: once it is reported, every watcher before
        // it on the stream is in place.
        let last = format!("{}/last", f.prefix);
        let t = f.backend.lock(&last, lease, false).await.unwrap();
        let start = TokioInstant::now();
        watch.add(&last, t);
        f.backend.unlock(&last, lease, None).await.unwrap();
        assert_eq!(recv(&mut rx).await.token, t);
        eprintln!("{n} watchers created in {:?}", start.elapsed());
        let start = TokioInstant::now();
        f.backend.revoke(lease).await.unwrap();
        let mut lost = HashSet::new();
        while lost.len() < n {
            let g = recv(&mut rx).await;
            assert_eq!(g.why, LockGone::LeaseLost, "{g:?}");
            assert!(held.contains_key(&g.token), "{g:?}");
            assert!(lost.insert(g.token), "{g:?} reported twice");
        }
        eprintln!("{n} keys reported lost in {:?}", start.elapsed());
        quiet(&mut rx).await;
        let lookups = f.backend.0.why_asked.load(Ordering::Relaxed) - 1;
        assert!(lookups <= 3, "{lookups} lease lookups for one revocation");
        assert_eq!(started(&f.endpoints, "Watch").await - streams, 1);
        drop(watch);
    }

    #[tokio::test]
    async fn etcd_key_watch_adds_keys_after_its_auth_token_expired() {
        let _shared = CLUSTER.read().await;
        // Gated like the others, though it uses the TLS member.
        if fixture("watch-auth").await.is_none() {
            return;
        }
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
        let (Some(endpoint), Some(ca), Some(cert), Some(key), Some(user), Some(password)) = (
            var("DLOCK_TEST_TLS_ENDPOINT"),
            var("DLOCK_TEST_CA"),
            var("DLOCK_TEST_CERT"),
            var("DLOCK_TEST_KEY"),
            var("DLOCK_TEST_USER"),
            var("DLOCK_TEST_PASSWORD"),
        ) else {
            eprintln!(
                "skipped: needs the TLS member of scripts/etcd-cluster.sh (DLOCK_TEST_TLS_*)"
            );
            return;
        };
        let token_ttl: u64 = var("DLOCK_TEST_AUTH_TOKEN_TTL").map_or(3, |v| v.parse().unwrap());
        let mut config = EtcdConfig::new([endpoint.clone()]);
        config.ca_file = Some(ca.clone().into());
        config.cert_file = Some(cert.clone().into());
        config.key_file = Some(key.clone().into());
        config.user = Some(user.clone());
        config.password = Some(password.clone());
        let b = EtcdBackend::new(&config, &Options::default()).unwrap();
        b.connect_first().await.unwrap();
        // The operator, with a connection (and token) of its own.
        let tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap()))
            .identity(Identity::from_pem(
                std::fs::read(&cert).unwrap(),
                std::fs::read(&key).unwrap(),
            ));
        let options = ConnectOptions::new()
            .with_tls(tls)
            .with_user(user, password)
            .with_auto_token_refresh(true);
        let mut raw = Etcd::connect([endpoint], Some(options)).await.unwrap();
        let lease = b.grant(Duration::from_secs(120)).await.unwrap().lease;
        let prefix = format!("dlock-test/watch-auth/{}", std::process::id());
        let (a, c) = (format!("{prefix}/a"), format!("{prefix}/c"));
        let ta = b.lock(&a, lease, false).await.unwrap();
        let tc = b.lock(&c, lease, false).await.unwrap();
        let (tx, mut rx) = unbounded_channel();
        let watch = b.watch_keys(lease, tx);
        watch.add(&a, ta);
        raw.delete(lock_key(&a, lease), None).await.unwrap();
        // Reported: the stream is open.
        assert_eq!(recv(&mut rx).await.token, ta);
        // The token the stream (and the backend) authenticated with
        // expires: a time, no event to wait for.
        tokio::time::sleep(Duration::from_secs(token_ttl + 1)).await;
        // Nothing of the backend's refreshes it but the watch itself.
        watch.add(&c, tc);
        raw.delete(lock_key(&c, lease), None).await.unwrap();
        assert_eq!(
            recv(&mut rx).await,
            KeyGone {
                token: tc,
                why: LockGone::KeyDeleted
            }
        );
        // Re-opened, not read back in a loop.
        assert_eq!(b.0.read_back.load(Ordering::Relaxed), 0);
        drop(watch);
        b.revoke(lease).await.unwrap();
    }

    /// An error carrying a server message (a gRPC status needs `tonic`,
    /// which is not a direct dependency; `classify` reads only the text).
    fn error(msg: &str) -> etcd_client::Error {
        etcd_client::Error::Internal(msg.to_string())
    }
}
