//! etcd's election protocol (`client/v3/concurrency/election.go`): the
//! candidate key is the lock key `<name>/<lease hex>` holding the value,
//! the leader is the key with the lowest create revision, its token that
//! revision. Campaigning is [`EtcdBackend::acquire_with`]; this file has
//! the proclaim and the leader's reads and watches.

use etcd_client::{
    EventType, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, TxnOp, WatchOptions,
};

use super::conn::EtcdBackend;
use super::leaders::{Change, Key, Leaders};
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
        let op = TxnOp::put(
            key.clone(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        );
        self.txn_while_held(key, token, op).await
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
            self.watch_prefix_until(&prefix, rev + 1, |r| !r.events().is_empty())
                .await?;
        }
    }

    /// Follows the leader (see [`crate::Backend::observe_leaders`]): one
    /// read of every key under the prefix, then one watch from the next
    /// revision, kept open; each response's events update those keys
    /// ([`Leaders`]), which name the leader at the response's revision
    /// (so never a leader whose key is gone, and no read per change). A
    /// watch canceled by the server (compaction) is opened again from a
    /// new read.
    pub(super) async fn observe_leaders(
        &self,
        name: &str,
        each: &mut (dyn FnMut(Option<Leader>) + Send),
    ) -> BackendError {
        let prefix = format!("{name}/");
        loop {
            let (mut keys, rev) = match self.read_keys(&prefix).await {
                Ok(r) => r,
                Err(e) => return e,
            };
            each(keys.leader());
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
                    if resp.events().is_empty() {
                        continue;
                    }
                    // The leader at this response's revision, from the
                    // events themselves: no read, no round trip.
                    for e in resp.events() {
                        let Some(kv) = e.kv() else { continue };
                        keys.apply(match e.event_type() {
                            EventType::Put => Change::Put(candidate(kv)),
                            EventType::Delete => {
                                Change::Delete(String::from_utf8_lossy(kv.key()).into_owned())
                            }
                        });
                    }
                    each(keys.leader());
                }
            }
            .await;
            if let Err(e) = r {
                self.watch_failed(i, &e);
                return e;
            }
        }
    }

    /// Every key under `prefix` (the candidates, in queue order) and the
    /// revision they were read at.
    async fn read_keys(&self, prefix: &str) -> Result<(Leaders, i64), BackendError> {
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let p = prefix.to_owned();
                async move {
                    let opts = GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend);
                    c.get(p, Some(opts)).await
                }
            })
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        Ok((Leaders::new(resp.kvs().iter().map(candidate)), rev))
    }
}

fn candidate(kv: &KeyValue) -> Key {
    Key {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        lease: kv.lease(),
    }
}
