//! Guarded writes: a put or delete that lands only while the lock key
//! still exists with the token as its create revision; and the one
//! unguarded write, a put if absent (a semaphore's limit).

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};

use super::conn::EtcdBackend;
use crate::backend::BackendError;
use crate::lock_key;
use crate::machine::{LeaseId, Token};

impl EtcdBackend {
    /// A write guarded by the lock (see [`crate::Backend::guarded_write`]).
    pub(super) async fn write(
        &self,
        name: &str,
        lease: LeaseId,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), BackendError> {
        let op = match value {
            Some(v) => TxnOp::put(key, v, None),
            None => TxnOp::delete(key, None),
        };
        self.txn_while_held(lock_key(name, lease), token, op).await
    }

    /// Runs `op` in one transaction only while the lock key `lock_key`
    /// still exists with `token` as its create revision, else
    /// [`BackendError::Fenced`]: the service decides (guarded writes, and
    /// an election's proclaim).
    pub(super) async fn txn_while_held(
        &self,
        lock_key: String,
        token: Token,
        op: TxnOp,
    ) -> Result<(), BackendError> {
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        lock_key.clone(),
                        CompareOp::Equal,
                        token.0 as i64,
                    )])
                    .and_then([op.clone()]);
                async move { c.txn(txn).await }
            })
            .await?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(BackendError::Fenced)
        }
    }

    /// Puts `key` = `value` unless `key` exists (one transaction comparing
    /// its create revision with 0); returns the value stored now (see
    /// [`crate::Backend::put_if_absent`]).
    pub(super) async fn put_absent(
        &self,
        key: &[u8],
        value: &[u8],
    ) -> Result<Vec<u8>, BackendError> {
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let txn = Txn::new()
                    .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key, value, None)])
                    .or_else([TxnOp::get(key, None)]);
                async move { c.txn(txn).await }
            })
            .await?;
        if resp.succeeded() {
            return Ok(value.to_vec());
        }
        match resp.op_responses().first() {
            Some(TxnOpResponse::Get(g)) => match g.kvs().first() {
                Some(kv) => Ok(kv.value().to_vec()),
                // Deleted between the compare and the get cannot happen in
                // one transaction; an empty answer is the server's fault.
                None => Err(BackendError::Unavailable(
                    "put if absent: the key exists but reads empty".into(),
                )),
            },
            _ => Err(BackendError::Unavailable(
                "put if absent: the transaction's answer has no read".into(),
            )),
        }
    }
}
