//! Read-only looks at the lock keys (`dlock show`, `dlock list`), through
//! the same connections as a client: TLS, user auth with token refresh,
//! require-leader, deadlines and fail-over (see [`super::conn`]).

use etcd_client::{GetOptions, SortOrder, SortTarget};

use super::{EtcdBackend, EtcdConfig};
use crate::backend::BackendError;
use crate::identity::{IDENTITY_PREFIX, Identity};
use crate::machine::LeaseId;
use crate::reader::{LeaseTtl, LockKey, Read};
use crate::{Error, lock_key};

/// A read-only connection to an etcd cluster, for looking at lock queues
/// ([`EtcdConfig::connect_reader`]). Holds no lease and writes nothing.
#[derive(Clone)]
pub struct EtcdReader {
    backend: EtcdBackend,
}

impl EtcdConfig {
    /// A read-only connection: blocks while it connects (and
    /// authenticates) to the first endpoint that answers, as
    /// [`crate::Client::etcd`] does.
    pub fn connect_reader(&self) -> Result<EtcdReader, Error> {
        self.validate()?;
        let backend = EtcdBackend::new(self)?;
        let b = backend.clone();
        crate::driver::block_on(async move { b.connect_first().await })??;
        Ok(EtcdReader { backend })
    }
}

fn failed(what: &str, e: BackendError) -> Error {
    Error::Backend(format!("{what}: {e}"))
}

impl EtcdReader {
    /// The lock keys whose key starts with `prefix`, oldest (lowest create
    /// revision) first: so the first key of each name holds it, the others
    /// wait in that order. Keys that are not lock keys (no lease, or a last
    /// segment that is not their lease in hex) are left out.
    pub fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error> {
        let b = self.backend.clone();
        let prefix = prefix.to_owned();
        let got = crate::driver::block_on(async move {
            b.unary(b.0.request_timeout, |mut c| {
                let p = prefix.clone();
                async move {
                    let opts = GetOptions::new()
                        .with_prefix()
                        .with_sort(SortTarget::Create, SortOrder::Ascend);
                    c.get(p, Some(opts)).await
                }
            })
            .await
        })?
        .map_err(|e| failed("get", e))?;
        Ok(got
            .kvs()
            .iter()
            // Identities (`identity::IDENTITY_PREFIX`) are not lock keys.
            .filter(|kv| !kv.key().starts_with(IDENTITY_PREFIX))
            .filter_map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let (name, _) = key.rsplit_once('/')?;
                (kv.lease() != 0 && lock_key(name, kv.lease()) == key).then(|| LockKey {
                    name: name.to_owned(),
                    key: key.clone(),
                    create_revision: kv.create_revision(),
                    lease: kv.lease(),
                })
            })
            .collect())
    }

    /// The time to live of `lease`.
    pub fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error> {
        let b = self.backend.clone();
        let r = crate::driver::block_on(async move {
            b.unary(b.0.request_timeout, |mut c| async move {
                c.lease_time_to_live(lease, None).await
            })
            .await
        })?;
        match r {
            Ok(r) => Ok(LeaseTtl {
                left_s: r.ttl(),
                granted_s: r.granted_ttl(),
            }),
            // Gone between the read of its key and this.
            Err(BackendError::LeaseNotFound) => Ok(LeaseTtl {
                left_s: -1,
                granted_s: 0,
            }),
            Err(e) => Err(failed("lease time-to-live", e)),
        }
    }
}

impl Read for EtcdReader {
    fn lock_keys(&self, prefix: &str) -> Result<Vec<LockKey>, Error> {
        EtcdReader::lock_keys(self, prefix)
    }

    fn lease_ttl(&self, lease: LeaseId) -> Result<LeaseTtl, Error> {
        EtcdReader::lease_ttl(self, lease)
    }

    fn lists_waiters(&self) -> bool {
        true
    }

    fn value(&self, key: &str) -> Result<Option<Vec<u8>>, Error> {
        let b = self.backend.clone();
        let key = key.to_owned();
        let got = crate::driver::block_on(async move {
            b.unary(b.0.request_timeout, |mut c| {
                let k = key.clone();
                async move { c.get(k, None).await }
            })
            .await
        })?
        .map_err(|e| failed("get", e))?;
        Ok(got.kvs().first().map(|kv| kv.value().to_vec()))
    }

    fn identity(&self, lease: LeaseId) -> Result<Option<Identity>, Error> {
        let b = self.backend.clone();
        crate::driver::block_on(async move { b.identity_of(lease).await })?
            .map_err(|e| failed("get identity", e))
    }
}
