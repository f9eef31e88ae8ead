//! The lease: grant, keepalive (one stream per lease, moved to the next
//! endpoint on failure), revoke, and the lookup that tells a lost lease
//! from a deleted key (etcd's `client/v3/lease.go`).

use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::{Instant as TokioInstant, timeout_at};

use super::conn::{EtcdBackend, KeepaliveStream, LeaseRec, classify};
use crate::backend::{BackendError, Bounds, Grant, LockGone};
use etcd_client::{GetOptions, PutOptions, SortOrder, SortTarget};

use crate::identity::{Identity, LockHolder, identity_key};
use crate::machine::{LeaseId, Token};
use crate::sync::lock;

impl EtcdBackend {
    /// Grants a lease of `ttl` within `bounds.timeout`, records it for its
    /// keepalives, and puts `identity` under it (the rest of the bound).
    pub(super) async fn grant_lease(
        &self,
        ttl: Duration,
        bounds: Bounds,
        identity: Option<&Identity>,
    ) -> Result<Grant, BackendError> {
        let deadline = TokioInstant::now() + bounds.timeout;
        // Whole seconds, rounded up; a TTL past i64 (no upper bound in
        // the options) asks for the most and lets etcd say no.
        let secs = ttl
            .as_secs()
            .saturating_add(u64::from(ttl.subsec_nanos() > 0));
        let secs = i64::try_from(secs).unwrap_or(i64::MAX);
        let r = self
            .unary(bounds.timeout, |mut c| async move {
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
        let lease = r.id();
        if let Some(identity) = identity {
            let left = deadline.saturating_duration_since(TokioInstant::now());
            if let Err(e) = self.put_identity(lease, identity, left).await {
                tracing::warn!(error = %e, "the lease's holder identity was not recorded");
            }
        }
        Ok(Grant { lease, ttl })
    }

    /// The key of `lease`'s identity (`identity::identity_key`), under that
    /// lease: it goes with it.
    async fn put_identity(
        &self,
        lease: LeaseId,
        identity: &Identity,
        limit: Duration,
    ) -> Result<(), BackendError> {
        let value = identity.to_json();
        self.unary(limit, |mut c| {
            let value = value.clone();
            async move {
                let opts = PutOptions::new().with_lease(lease);
                c.put(identity_key(lease), value, Some(opts)).await
            }
        })
        .await
        .map(|_| ())
    }

    /// The identity recorded for `lease`, `None` when there is none (a
    /// holder that is not dlock, or an unreadable value).
    pub(super) async fn identity_of(
        &self,
        lease: LeaseId,
    ) -> Result<Option<Identity>, BackendError> {
        let got = self
            .unary(self.0.request_timeout, |mut c| async move {
                c.get(identity_key(lease), None).await
            })
            .await?;
        Ok(got
            .kvs()
            .first()
            .and_then(|kv| Identity::from_json(kv.value())))
    }

    /// See [`crate::Backend::holder`]: the oldest key with a lease under
    /// `<name>/` (etcd's `GetOwner`; a semaphore's limit has no lease).
    pub(super) async fn holder_of(&self, name: &str) -> Result<Option<LockHolder>, BackendError> {
        let prefix = format!("{name}/");
        let got = self
            .unary(self.0.request_timeout, |mut c| {
                let p = prefix.clone();
                async move {
                    let opts = GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_sort(SortTarget::Create, SortOrder::Ascend);
                    c.get(p, Some(opts)).await
                }
            })
            .await?;
        let Some(kv) = got.kvs().iter().find(|kv| kv.lease() != 0) else {
            return Ok(None);
        };
        let (key, lease) = (String::from_utf8_lossy(kv.key()).into_owned(), kv.lease());
        let token = Token(u64::try_from(kv.create_revision()).unwrap_or(0));
        let identity = self.identity_of(lease).await?.map(Arc::new);
        Ok(Some(LockHolder {
            key,
            token,
            lease,
            identity,
        }))
    }

    /// One keepalive within `bounds.timeout`; a lease found lost is
    /// forgotten.
    pub(super) async fn keepalive_lease(
        &self,
        lease: LeaseId,
        bounds: Bounds,
    ) -> Result<Duration, BackendError> {
        let r = self.keepalive_once(lease, bounds.timeout).await;
        if r == Err(BackendError::LeaseNotFound) {
            lock(&self.0.leases).remove(&lease);
        }
        r
    }

    /// Revokes the lease (and so deletes its keys).
    pub(super) async fn revoke_lease(&self, lease: LeaseId) -> Result<(), BackendError> {
        lock(&self.0.leases).remove(&lease);
        self.unary(self.0.request_timeout, |mut c| async move {
            c.lease_revoke(lease).await
        })
        .await
        .map(|_| ())
    }

    async fn keepalive_once(
        &self,
        lease: LeaseId,
        limit: Duration,
    ) -> Result<Duration, BackendError> {
        // Every lease kept alive was granted here; one no longer recorded
        // was revoked or found lost.
        let Some(rec) = lock(&self.0.leases).get(&lease).cloned() else {
            return Err(BackendError::LeaseNotFound);
        };
        // The machine counts this keepalive failed its session's
        // `keepalive_timeout` (`limit`) after it asked, also when it waited
        // here behind the previous one.
        let deadline = TokioInstant::now() + limit;
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

    /// The key is gone: with its lease (revoked, expired), or alone? Asked
    /// within `limit` (the session's keepalive timeout); no answer counts
    /// as the key alone (the fence is the same, only its reason differs).
    pub(super) async fn why_gone(&self, lease: LeaseId, limit: Duration) -> LockGone {
        #[cfg(test)]
        self.0.why_asked.fetch_add(1, Ordering::Relaxed);
        let ttl = self
            .unary(limit, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await;
        match ttl {
            Ok(r) if r.ttl() <= 0 => LockGone::LeaseLost,
            Err(BackendError::LeaseNotFound) => LockGone::LeaseLost,
            _ => LockGone::KeyDeleted,
        }
    }
}
