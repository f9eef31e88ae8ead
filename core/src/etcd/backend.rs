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

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{
    Certificate, Client as Etcd, Compare, CompareOp, ConnectOptions, EventType, GetOptions,
    Identity, PutOptions, SortOrder, SortTarget, TlsOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use tokio::time::{Instant as TokioInstant, sleep, timeout, timeout_at};

use super::EtcdConfig;
use crate::backend::{Backend, BackendError, BoxFuture, Grant, LockGone};
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
    conn: Etcd,
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
    async fn try_acquire(&self, name: &str, lease: LeaseId) -> Result<(i64, i64), BackendError> {
        let key = lock_key(name, lease);
        let prefix = format!("{name}/");
        let first = || {
            TxnOp::get(
                prefix.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                ),
            )
        };
        let txn = || {
            Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(key.clone(), "", Some(PutOptions::new().with_lease(lease))),
                    first(),
                ])
                .or_else([TxnOp::get(key.clone(), None), first()])
        };
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let t = txn();
                async move { c.txn(t).await }
            })
            .await?;
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
                let key = lock_key(name, lease);
                // Leave no key behind to block the holder's successor; if
                // this fails, revoking the lease removes it.
                let _ = self
                    .unary(self.0.request_timeout, |mut c| {
                        let k = key.clone();
                        async move { c.delete(k, None).await }
                    })
                    .await;
                return Err(BackendError::Busy);
            }
            self.wait_turn(name, mine).await?;
        }
    }

    /// Resolves once the lock key is deleted (or replaced); re-opens the
    /// watch on the next endpoint when its stream fails.
    async fn watch_key(&self, name: &str, lease: LeaseId, token: Token) -> LockGone {
        let key = lock_key(name, lease);
        let mut from = token.0 as i64 + 1;
        loop {
            let i = self.current();
            let r: Result<bool, BackendError> = async {
                let mut w = self.open_watch(i, key.clone(), from).await?;
                loop {
                    let resp = w.next().await?;
                    if resp.canceled() {
                        // History compacted past `from`: read the key itself.
                        let g = timeout(self.0.request_timeout, w.conn.get(key.clone(), None))
                            .await
                            .map_err(|_| BackendError::Unavailable("get timed out".into()))?
                            .map_err(classify)?;
                        let alive = g
                            .kvs()
                            .first()
                            .is_some_and(|kv| kv.create_revision() == token.0 as i64);
                        from = g.header().map_or(from, |h| h.revision() + 1);
                        return Ok(!alive);
                    }
                    for e in resp.events() {
                        if e.event_type() == EventType::Delete {
                            return Ok(true);
                        }
                        if let Some(kv) = e.kv() {
                            from = from.max(kv.mod_revision() + 1);
                        }
                    }
                }
            }
            .await;
            match r {
                Ok(true) => return self.why_gone(lease).await,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(endpoint = %self.0.urls[i], error = %e, "etcd watch failed: re-opening");
                    if self.watch_failed(i, &e) {
                        sleep(self.0.retry_interval).await;
                    }
                }
            }
        }
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
        Ok(Watch {
            conn,
            stream,
            abandoned,
        })
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
        _name: &'a str,
        _lease: LeaseId,
        _token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { todo!("unlock") })
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

    /// An error carrying a server message (a gRPC status needs `tonic`,
    /// which is not a direct dependency; `classify` reads only the text).
    fn error(msg: &str) -> etcd_client::Error {
        etcd_client::Error::Internal(msg.to_string())
    }
}
