//! A semaphore's free slot on etcd (docs/design.md §26): one read of
//! every key under `<name>/slot/` (keys only), and when every slot has a
//! key, one watch of that prefix from the next revision until a key goes,
//! then read again. Only the head of the semaphore's queue waits here.

use etcd_client::{EventType, GetOptions};

use super::conn::EtcdBackend;
use crate::backend::BackendError;
use crate::semaphore::{first_free, slot_of_key};

impl EtcdBackend {
    /// See [`crate::Backend::free_slot`].
    pub(super) async fn free_slot(
        &self,
        name: &str,
        limit: u32,
        wait: bool,
    ) -> Result<Option<u32>, BackendError> {
        let prefix = format!("{name}/slot/");
        loop {
            let (free, rev) = self.read_free(name, &prefix, limit).await?;
            if free.is_some() || !wait {
                return Ok(free);
            }
            let gone = |r: &etcd_client::WatchResponse| {
                r.events()
                    .iter()
                    .any(|e| e.event_type() == EventType::Delete)
            };
            self.watch_prefix_until(&prefix, rev + 1, gone).await?;
        }
    }

    /// The lowest slot without a key, and the revision it was read at.
    async fn read_free(
        &self,
        name: &str,
        prefix: &str,
        limit: u32,
    ) -> Result<(Option<u32>, i64), BackendError> {
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let p = prefix.to_owned();
                async move {
                    let opts = GetOptions::new().with_prefix().with_keys_only();
                    c.get(p, Some(opts)).await
                }
            })
            .await?;
        let rev = resp.header().map_or(0, |h| h.revision());
        let taken = resp
            .kvs()
            .iter()
            .filter_map(|kv| slot_of_key(name, &String::from_utf8_lossy(kv.key())));
        Ok((first_free(limit, taken), rev))
    }
}
