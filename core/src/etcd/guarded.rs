//! Guarded writes: a put or delete that lands only while the lock key
//! still exists with the token as its create revision.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

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
