//! The lock protocol of etcd's `concurrency.Mutex` (`client/v3/concurrency/
//! mutex.go`): keys `<name>/<lease hex>` ([`crate::lock_key`]), the lowest
//! `create_revision` owns, so dlock and `etcdctl lock` exclude each other;
//! the token is the lock key's `create_revision`.

use std::sync::Arc;

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse, WatchOptions,
};
use tokio::time::timeout;

use super::conn::{ABANDONED, EtcdBackend, Flight, classify};
use crate::backend::BackendError;
use crate::lock_key;
use crate::machine::{LeaseId, Token};
use crate::sync::lock;

/// One lock request in flight, registered in [`Inner::puts`] until dropped.
pub(super) struct PutGuard {
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

/// A watch on one endpoint that ends when the endpoint is abandoned.
pub(super) struct Watch {
    stream: etcd_client::WatchStream,
    abandoned: tokio::sync::watch::Receiver<u64>,
}

impl Watch {
    /// The next reply, or why the watch ended: its stream failed or closed,
    /// or another call abandoned its endpoint ([`ABANDONED`]).
    pub(super) async fn next(&mut self) -> Result<etcd_client::WatchResponse, BackendError> {
        tokio::select! {
            m = self.stream.message() => m
                .map_err(classify)?
                .ok_or_else(|| BackendError::Unavailable("watch stream closed".into())),
            _ = self.abandoned.changed() => Err(BackendError::Unavailable(ABANDONED.into())),
        }
    }
}

/// etcd's Mutex request: puts our key (under `lease`) if absent, and reads
/// our key's and the oldest key's create revision under `prefix`.
fn lock_txn(key: &str, prefix: &str, lease: LeaseId, value: &[u8]) -> Txn {
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
            TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease))),
            first(),
        ])
        .or_else([TxnOp::get(key, None), first()])
}

impl EtcdBackend {
    /// One round of etcd's Mutex: creates our key if absent, returns its
    /// `create_revision` and that of the oldest key under the prefix.
    ///
    /// The transaction runs in a task of its own, registered in
    /// [`Inner::puts`] until it ends: dropping the lock future cannot cancel
    /// a request already sent, and a release without a token waits for it,
    /// so the put never lands after that release's delete.
    async fn try_acquire(
        &self,
        name: &str,
        lease: LeaseId,
        value: &[u8],
    ) -> Result<(i64, i64, Option<Vec<u8>>), BackendError> {
        let key = lock_key(name, lease);
        let prefix = format!("{name}/");
        let guard = self.put_started(&key);
        let b = self.clone();
        let value = value.to_vec();
        let request = tokio::spawn(async move {
            let _guard = guard;
            // Never closed, so a turn always comes.
            let _turn = b.0.lock_txns.clone().acquire_owned().await;
            b.unary(b.0.request_timeout, |mut c| {
                let t = lock_txn(&key, &prefix, lease, &value);
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
        let (mine, existing) = if resp.succeeded() {
            (resp.header().map(|h| h.revision()), None)
        } else {
            let existing = match ops.first() {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            };
            (get(0).flatten(), existing)
        };
        let (Some(mine), Some(owner)) = (mine, get(1)) else {
            return Err(BackendError::Unavailable(
                "unexpected lock transaction reply".into(),
            ));
        };
        Ok((mine, owner.unwrap_or(mine), existing))
    }

    /// Waits until the last key created before `mine` under the prefix is
    /// deleted (etcd's `waitDeletes`, one key at a time).
    pub(super) async fn wait_turn(&self, name: &str, mine: i64) -> Result<(), BackendError> {
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

    pub(super) async fn acquire(
        &self,
        name: &str,
        lease: LeaseId,
        wait: bool,
    ) -> Result<Token, BackendError> {
        self.acquire_with(name, lease, b"", wait).await
    }

    /// [`EtcdBackend::acquire`] with the key holding `value` (an election's
    /// candidate: an existing key with another value gets `value`, guarded
    /// by its create revision, as `Election.Campaign`). Every round reads
    /// our own key again: a key gone while we waited (the lease expired)
    /// is never reported as held.
    pub(super) async fn acquire_with(
        &self,
        name: &str,
        lease: LeaseId,
        value: &[u8],
        wait: bool,
    ) -> Result<Token, BackendError> {
        loop {
            let (mine, owner, existing) = self.try_acquire(name, lease, value).await?;
            if existing.is_some_and(|v| v != value) {
                self.proclaim_value(name, lease, Token(mine as u64), value)
                    .await?;
            }
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
    pub(super) fn put_started(&self, key: &str) -> PutGuard {
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
    pub(super) async fn release(
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

    /// Opens a watch of `key` from revision `from` on endpoint `i`.
    pub(super) async fn open_watch(
        &self,
        i: usize,
        key: impl Into<Vec<u8>>,
        from: i64,
    ) -> Result<Watch, BackendError> {
        self.open_watch_with(i, key, WatchOptions::new().with_start_revision(from))
            .await
    }

    /// Watches everything under `prefix` from revision `from` until a
    /// response `stop` accepts, or the server cancels the watch: the one
    /// wait of the reads that look again after a change (the next leader,
    /// a free slot). A failed watch marks its endpoint, as every watch does.
    pub(super) async fn watch_prefix_until(
        &self,
        prefix: &str,
        from: i64,
        stop: impl Fn(&etcd_client::WatchResponse) -> bool,
    ) -> Result<(), BackendError> {
        let i = self.current();
        let r = async {
            let opts = WatchOptions::new().with_prefix().with_start_revision(from);
            let mut w = self.open_watch_with(i, prefix, opts).await?;
            loop {
                let resp = w.next().await?;
                if resp.canceled() || stop(&resp) {
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

    /// Opens a watch of `key` with `options` on endpoint `i`.
    pub(super) async fn open_watch_with(
        &self,
        i: usize,
        key: impl Into<Vec<u8>>,
        options: WatchOptions,
    ) -> Result<Watch, BackendError> {
        // Subscribed first: an abandonment while connecting counts too.
        let abandoned = self.0.abandoned[i].subscribe();
        let mut conn = timeout(
            self.0.connect_timeout + self.0.request_timeout,
            self.conn(i),
        )
        .await
        .map_err(|_| BackendError::Unavailable("connect timed out".into()))??;
        let stream = conn.watch(key, Some(options)).await.map_err(classify)?;
        Ok(Watch { stream, abandoned })
    }
}
