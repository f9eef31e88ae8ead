//! Read/write locks on etcd (docs/design.md §27): the lock protocol's keys
//! `<name>/<lease hex>`, queued by create revision, with the mode in the
//! value. A writer is an ordinary `concurrency.Mutex` holder (an empty
//! value, as `etcdctl lock` puts); a reader's key holds
//! [`READ_MARKER`]. So `etcdctl lock` and Go's Mutex, which own by the
//! lowest create revision alone, see every dlock holder as exclusive, and
//! their keys (no marker) are writers here.

use etcd_client::{
    Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use super::conn::EtcdBackend;
use crate::backend::BackendError;
use crate::lock_key;
use crate::machine::{LeaseId, Token};
use crate::mode::{Mode, READ_MARKER, holds};

/// A reader's request: puts our key holding the read marker (under `lease`)
/// if absent, else reads it; and reads every key under `prefix`, oldest
/// first, with its value (the queue and each key's mode).
fn read_txn(key: &str, prefix: &str, lease: LeaseId) -> Txn {
    let queue = || {
        TxnOp::get(
            prefix,
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend),
            ),
        )
    };
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key, READ_MARKER, Some(PutOptions::new().with_lease(lease))),
            queue(),
        ])
        .or_else([TxnOp::get(key, None), queue()])
}

/// One reader's round: our key's create revision and value, the key of the
/// last writer queued before it (if any), and the revision the round read at.
struct Round {
    mine: i64,
    value: Vec<u8>,
    last_writer: Option<Vec<u8>>,
    revision: i64,
}

impl EtcdBackend {
    /// Acquires `name` in `mode` (see [`crate::Backend::lock_rw`]).
    pub(super) async fn acquire_rw(
        &self,
        name: &str,
        lease: LeaseId,
        mode: Mode,
        wait: bool,
    ) -> Result<Token, BackendError> {
        match mode {
            Mode::Write => {
                self.acquire_with(name, lease, Mode::Write.value(), wait)
                    .await
            }
            Mode::Read => self.acquire_read(name, lease, wait).await,
        }
    }

    /// A reader: holds once no key created before its own is a writer's.
    /// Every round reads our own key again (a key gone while we waited,
    /// its lease expired, is never reported held: etcd #16221); a wait ends
    /// on any change of the last earlier writer's key (deleted, or
    /// downgraded to a reader).
    async fn acquire_read(
        &self,
        name: &str,
        lease: LeaseId,
        wait: bool,
    ) -> Result<Token, BackendError> {
        loop {
            let round = self.read_round(name, lease).await?;
            let token = Token(round.mine as u64);
            if round.value != READ_MARKER {
                // Our key exists as a writer's (this lease's earlier put):
                // it reads now, as a downgrade would make it.
                self.proclaim_value(name, lease, token, READ_MARKER).await?;
            }
            let Some(writer) = round.last_writer else {
                return Ok(token);
            };
            if !wait {
                // Leave no key behind (only this one, see `acquire_with`).
                let _ = self.release(name, lease, Some(token)).await;
                return Err(BackendError::Busy);
            }
            self.wait_change(writer, round.revision + 1).await?;
        }
    }

    /// Sends one reader's request, in a task of its own registered as a
    /// lock request in flight (as the Mutex's: a release without a token
    /// waits for it, so the put never lands after that release's delete).
    async fn read_round(&self, name: &str, lease: LeaseId) -> Result<Round, BackendError> {
        let key = lock_key(name, lease);
        let prefix = format!("{name}/");
        let guard = self.put_started(&key);
        let b = self.clone();
        let request = tokio::spawn(async move {
            let _guard = guard;
            let _turn = b.0.lock_txns.clone().acquire_owned().await;
            b.unary(b.0.request_timeout, |mut c| {
                let t = read_txn(&key, &prefix, lease);
                async move { c.txn(t).await }
            })
            .await
        });
        let resp = request
            .await
            .map_err(|e| BackendError::Unavailable(format!("lock request: {e}")))??;
        let revision = resp.header().map_or(0, |h| h.revision());
        let ops = resp.op_responses();
        let bad = || BackendError::Unavailable("unexpected lock transaction reply".into());
        let (mine, value) = if resp.succeeded() {
            (revision, READ_MARKER.to_vec())
        } else {
            match ops.first() {
                Some(TxnOpResponse::Get(g)) => {
                    let kv = g.kvs().first().ok_or_else(bad)?;
                    (kv.create_revision(), kv.value().to_vec())
                }
                _ => return Err(bad()),
            }
        };
        let Some(TxnOpResponse::Get(queue)) = ops.get(1) else {
            return Err(bad());
        };
        let keys = || {
            queue
                .kvs()
                .iter()
                .map(|kv| (kv.create_revision() as u64, Mode::of_value(kv.value())))
        };
        let last_writer = if holds(mine as u64, Mode::Read, keys()) {
            None
        } else {
            queue
                .kvs()
                .iter()
                .filter(|kv| kv.create_revision() < mine)
                .filter(|kv| Mode::of_value(kv.value()) == Mode::Write)
                .max_by_key(|kv| kv.create_revision())
                .map(|kv| kv.key().to_vec())
        };
        Ok(Round {
            mine,
            value,
            last_writer,
            revision,
        })
    }

    /// Waits for any change of `key` after revision `from - 1`: its delete,
    /// or a put (a downgrade). Compacted: returns, to look again.
    async fn wait_change(&self, key: Vec<u8>, from: i64) -> Result<(), BackendError> {
        // No deadline: we wait for another holder; HTTP/2 pings catch a
        // dead member, and an error sends the machine's retry elsewhere.
        let i = self.current();
        let r = async {
            let mut w = self.open_watch(i, key, from).await?;
            loop {
                let resp = w.next().await?;
                if resp.canceled()
                    || resp
                        .events()
                        .iter()
                        .any(|e| matches!(e.event_type(), EventType::Delete | EventType::Put))
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
}
