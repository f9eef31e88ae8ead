//! etcd's election protocol (`client/v3/concurrency/election.go`): the
//! candidate key is the lock key `<name>/<lease hex>` holding the value,
//! the leader is the key with the lowest create revision, its token that
//! revision. Campaigning is [`EtcdBackend::acquire_with`]; this file has
//! the proclaim and the leader's reads and watches.

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};

use super::conn::EtcdBackend;
use crate::backend::{BackendError, Leader};
use crate::lock_key;
use crate::machine::{LeaseId, Token};

impl EtcdBackend {
    /// `Election.Proclaim`: puts `value` in our candidate key, under its
    /// lease, only while the key's create revision is `token`.
    pub(super) async fn proclaim_value(
        &self,
        name: &str,
        lease: LeaseId,
        token: Token,
        value: &[u8],
    ) -> Result<(), BackendError> {
        let key = lock_key(name, lease);
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        key.clone(),
                        CompareOp::Equal,
                        token.0 as i64,
                    )])
                    .and_then([TxnOp::put(
                        key.clone(),
                        value,
                        Some(PutOptions::new().with_lease(lease)),
                    )]);
                async move { c.txn(txn).await }
            })
            .await?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(BackendError::Fenced)
        }
    }

    /// The leader of `name` and the revision it was read at.
    async fn read_leader(&self, name: &str) -> Result<(Option<Leader>, i64), BackendError> {
        let prefix = format!("{name}/");
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let p = prefix.clone();
                async move {
                    let opts = GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1);
                    c.get(p, Some(opts)).await
                }
            })
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let leader = resp.kvs().first().map(|kv| Leader {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            token: Token(kv.create_revision() as u64),
            lease: kv.lease(),
        });
        Ok((leader, rev))
    }

    /// The leader once it differs from `last` (see
    /// [`crate::Backend::next_leader`]): read, and if unchanged, one watch of
    /// the prefix from the next revision until anything under it changes,
    /// then read again.
    pub(super) async fn next_leader(
        &self,
        name: &str,
        last: Option<&Option<Leader>>,
    ) -> Result<Option<Leader>, BackendError> {
        let prefix = format!("{name}/");
        loop {
            let (leader, rev) = self.read_leader(name).await?;
            if last != Some(&leader) {
                return Ok(leader);
            }
            let i = self.current();
            let r = async {
                let opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(rev + 1);
                let mut w = self.open_watch_with(i, prefix.clone(), opts).await?;
                loop {
                    let resp = w.next().await?;
                    if resp.canceled() || !resp.events().is_empty() {
                        return Ok(());
                    }
                }
            }
            .await;
            if let Err(e) = &r {
                self.watch_failed(i, e);
            }
            r?;
        }
    }

    /// Follows the leader (see [`crate::Backend::observe_leaders`]): read,
    /// then one watch of the prefix from the next revision, kept open; after
    /// each response with events a linearizable read gives the state (at
    /// or after the change, so never a leader whose key is gone). A watch
    /// canceled by the server (compaction) is opened again from a new read.
    pub(super) async fn observe_leaders(
        &self,
        name: &str,
        each: &mut (dyn FnMut(Option<Leader>) + Send),
    ) -> BackendError {
        let prefix = format!("{name}/");
        loop {
            let (leader, rev) = match self.read_leader(name).await {
                Ok(r) => r,
                Err(e) => return e,
            };
            each(leader);
            let i = self.current();
            let r: Result<(), BackendError> = async {
                let opts = WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(rev + 1);
                let mut w = self.open_watch_with(i, prefix.clone(), opts).await?;
                loop {
                    let resp = w.next().await?;
                    if resp.canceled() {
                        return Ok(());
                    }
                    if !resp.events().is_empty() {
                        each(self.read_leader(name).await?.0);
                    }
                }
            }
            .await;
            if let Err(e) = r {
                self.watch_failed(i, &e);
                return e;
            }
        }
    }
}
