//! The embedded service's state, sans-IO: leases, lock keys, values,
//! guarded writes and key watches, and the rules over them (expiry, the
//! lock protocol's owner of a name, a key's removal reported to its
//! watch). The service (`memory.rs`) takes its lock, reads the clock and
//! wakes waiters; nothing here waits or reads a clock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::link::Link;
use crate::backend::{KeyGone, LockGone};
use crate::clock::Instant;
use crate::machine::{LeaseId, Token};

#[derive(Default)]
pub(super) struct ServiceState {
    pub(super) revision: u64,
    pub(super) next_lease: LeaseId,
    pub(super) leases: HashMap<LeaseId, LeaseRec>,
    /// Lock keys `<name>/<lease hex>` of holders and waiters, with their
    /// lease and create revision: etcd's lock protocol, so names nest as
    /// they do there (the holder of `a/b` blocks `a`).
    pub(super) keys: BTreeMap<String, (LeaseId, u64)>,
    /// The values of election candidates' keys (absent: empty), kept only
    /// while the key is in `keys`.
    pub(super) values: HashMap<String, Vec<u8>>,
    pub(super) frozen: bool,
    /// The whole service is down (see [`super::MemoryService::outage`]).
    pub(super) down: bool,
    /// The keys of guarded writes.
    pub(super) kv: HashMap<Vec<u8>, Vec<u8>>,
    /// The live key watches ([`crate::Backend::watch_keys`]) by id.
    pub(super) watches: HashMap<WatchId, WatchReg>,
    /// The watches of each lease (usually one: its session's).
    pub(super) lease_watches: HashMap<LeaseId, Vec<WatchId>>,
    pub(super) next_watch: WatchId,
}

/// Names one key watch in the service.
pub(super) type WatchId = u64;

/// One key watch: the keys it watches, by token, and where their news goes.
pub(super) struct WatchReg {
    pub(super) lease: LeaseId,
    /// The link the news crosses (a partition holds it).
    pub(super) link: Arc<Link>,
    pub(super) gone: UnboundedSender<KeyGone>,
    /// The create revisions of the watched keys of `lease`. Revisions are
    /// unique service-wide, so a token names its key: no key strings here.
    pub(super) tokens: HashSet<u64>,
    /// News made while the link was partitioned, sent when it heals.
    pub(super) held: BTreeMap<u64, LockGone>,
}

impl WatchReg {
    /// Reports the key held with `token` gone, across the link: at once, or
    /// held behind a partition (and behind news already held). Called under
    /// the service's lock; takes the link's fault lock inside it (nothing
    /// takes the two the other way round: `heal` flips the switch first,
    /// then flushes under the service's lock).
    pub(super) fn report(&mut self, token: u64, why: LockGone) {
        if self.held.is_empty() && !self.link.partitioned() {
            let _ = self.gone.send(KeyGone {
                token: Token(token),
                why,
            });
        } else {
            self.held.insert(token, why);
        }
    }

    /// Sends the news a partition held.
    pub(super) fn flush(&mut self) {
        for (token, why) in std::mem::take(&mut self.held) {
            let _ = self.gone.send(KeyGone {
                token: Token(token),
                why,
            });
        }
    }
}

pub(super) struct LeaseRec {
    pub(super) ttl: Duration,
    pub(super) expires_at: Instant,
}

impl ServiceState {
    /// Server-side expiry: drops every lease whose TTL ran out, with its locks.
    pub(super) fn expire(&mut self, now: Instant) -> bool {
        if self.frozen || self.down {
            return false;
        }
        let dead: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, l)| l.expires_at <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in &dead {
            self.remove_lease(*id);
        }
        !dead.is_empty()
    }

    /// Drops `lease` with its keys; its watches report every watched key
    /// lost with it, as etcd's watch sees the lease's deletes.
    pub(super) fn remove_lease(&mut self, lease: LeaseId) -> bool {
        let found = self.leases.remove(&lease).is_some();
        if found {
            self.keys.retain(|_, (l, _)| *l != lease);
            let keys = &self.keys;
            self.values.retain(|k, _| keys.contains_key(k));
        }
        for id in self.lease_watches.get(&lease).into_iter().flatten() {
            if let Some(w) = self.watches.get_mut(id) {
                let mut tokens: Vec<u64> = std::mem::take(&mut w.tokens).into_iter().collect();
                tokens.sort_unstable();
                for token in tokens {
                    w.report(token, LockGone::LeaseLost);
                }
            }
        }
        found
    }

    /// Removes the lock key `key` while its lease lives (a release, a try
    /// that did not hold, an operator): its watch reports it deleted.
    pub(super) fn delete_key(&mut self, key: &str) -> bool {
        let Some((lease, rev)) = self.keys.remove(key) else {
            return false;
        };
        self.values.remove(key);
        for id in self.lease_watches.get(&lease).into_iter().flatten() {
            if let Some(w) = self.watches.get_mut(id) {
                if w.tokens.remove(&rev) {
                    w.report(rev, LockGone::KeyDeleted);
                }
            }
        }
        true
    }

    /// The create revision of the key that holds `name`: the oldest key
    /// under `name/` (etcd: the lowest create revision with that prefix).
    pub(super) fn owner(&self, name: &str) -> Option<(&str, u64)> {
        let prefix = format!("{name}/");
        self.keys
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .min_by_key(|(_, (_, rev))| *rev)
            .map(|(k, (_, rev))| (k.as_str(), *rev))
    }

    /// The holder of the lock `name` itself (not of a name nested in it).
    pub(super) fn holder_of(&self, name: &str) -> Option<(String, Token)> {
        let (key, rev) = self.owner(name)?;
        let rest = &key[name.len() + 1..];
        (!rest.contains('/')).then(|| (key.to_string(), Token(rev)))
    }

    pub(super) fn next_expiry(&self) -> Option<Instant> {
        if self.frozen || self.down {
            return None;
        }
        self.leases.values().map(|l| l.expires_at).min()
    }
}
