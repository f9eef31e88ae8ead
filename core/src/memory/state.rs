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
use crate::backend::{BackendError, Grant, KeyGone, LockGone, lock_key};
use crate::clock::Instant;
use crate::identity::{Identity, LockHolder};
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
    /// Who holds it ([`crate::Backend::holder`]).
    pub(super) identity: Option<Arc<Identity>>,
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

    /// Whether the reader whose key under `name/` has create revision
    /// `mine` holds: no earlier key is a writer (a key without the read
    /// marker; docs/design.md §27).
    pub(super) fn reader_holds(&self, name: &str, mine: u64) -> bool {
        use crate::mode::{Mode, holds};
        let prefix = format!("{name}/");
        let keys = self
            .keys
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, (_, rev))| {
                let value = self.values.get(k).map_or(&[][..], Vec::as_slice);
                (*rev, Mode::of_value(value))
            });
        holds(mine, Mode::Read, keys)
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

    /// A new lease of `ttl` from `now`.
    pub(super) fn grant(
        &mut self,
        now: Instant,
        ttl: Duration,
        identity: Option<Arc<Identity>>,
    ) -> Grant {
        self.next_lease += 1;
        let lease = self.next_lease;
        let expires_at = now + ttl;
        self.leases.insert(
            lease,
            LeaseRec {
                ttl,
                expires_at,
                identity,
            },
        );
        Grant { lease, ttl }
    }

    /// See [`crate::Backend::holder`]: the owner key under `<name>/`.
    pub(super) fn holder(&self, name: &str) -> Option<LockHolder> {
        let (key, rev) = self.owner(name)?;
        let lease = self.keys.get(key).map_or(0, |(l, _)| *l);
        Some(LockHolder {
            key: key.to_string(),
            token: Token(rev),
            lease,
            identity: self.leases.get(&lease).and_then(|l| l.identity.clone()),
        })
    }

    /// A keepalive of `lease` at `now` (expired leases already dropped):
    /// its TTL again from `now`.
    pub(super) fn renew(&mut self, now: Instant, lease: LeaseId) -> Result<Duration, BackendError> {
        let rec = self
            .leases
            .get_mut(&lease)
            .ok_or(BackendError::LeaseNotFound)?;
        rec.expires_at = now + rec.ttl;
        Ok(rec.ttl)
    }

    /// Commits a write only while the lock key of `name` under `lease`
    /// exists with `token` as its create revision (the rule of an etcd
    /// transaction comparing the lock key's `create_revision`).
    pub(super) fn guarded_write(
        &mut self,
        name: &str,
        lease: LeaseId,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), BackendError> {
        if self.keys.get(&lock_key(name, lease)) != Some(&(lease, token.0)) {
            return Err(BackendError::Fenced);
        }
        self.revision += 1;
        match value {
            Some(v) => self.kv.insert(key.to_vec(), v.to_vec()),
            None => self.kv.remove(key),
        };
        Ok(())
    }

    /// `Election.Proclaim`: `value` in the candidate key `key`, while it
    /// holds `token` under `lease`.
    pub(super) fn proclaim(
        &mut self,
        key: String,
        lease: LeaseId,
        token: Token,
        value: &[u8],
    ) -> Result<(), BackendError> {
        if self.keys.get(&key) != Some(&(lease, token.0)) {
            return Err(BackendError::Fenced);
        }
        self.values.insert(key, value.to_vec());
        Ok(())
    }

    /// Deletes the lock key `key`: with `token`, only while the key was
    /// created with it. Whether it did.
    pub(super) fn unlock(&mut self, key: &str, token: Option<Token>) -> bool {
        match (self.keys.get(key), token) {
            (Some((_, rev)), Some(t)) if *rev != t.0 => false,
            (Some(_), _) => self.delete_key(key),
            (None, _) => false,
        }
    }

    /// A new key watch of `lease` whose news crosses `link` to `gone`.
    pub(super) fn watch(
        &mut self,
        lease: LeaseId,
        link: Arc<Link>,
        gone: UnboundedSender<KeyGone>,
    ) -> WatchId {
        self.next_watch += 1;
        let id = self.next_watch;
        self.watches.insert(
            id,
            WatchReg {
                lease,
                link,
                gone,
                tokens: HashSet::new(),
                held: BTreeMap::new(),
            },
        );
        self.lease_watches.entry(lease).or_default().push(id);
        id
    }

    /// Watch `id` watches the key of `name` held with `token` (expired
    /// leases already dropped); a key already gone is reported at once.
    pub(super) fn watch_add(&mut self, id: WatchId, name: &str, token: Token) {
        let Some(lease) = self.watches.get(&id).map(|w| w.lease) else {
            return;
        };
        let alive = self.leases.contains_key(&lease);
        let held = alive && self.keys.get(&lock_key(name, lease)) == Some(&(lease, token.0));
        let Some(w) = self.watches.get_mut(&id) else {
            return;
        };
        if held {
            w.tokens.insert(token.0);
        } else if alive {
            w.report(token.0, LockGone::KeyDeleted);
        } else {
            w.report(token.0, LockGone::LeaseLost);
        }
    }

    /// Watch `id` stops watching the key held with `token`, news held by a
    /// partition included.
    pub(super) fn watch_remove(&mut self, id: WatchId, token: Token) {
        if let Some(w) = self.watches.get_mut(&id) {
            w.tokens.remove(&token.0);
            w.held.remove(&token.0);
        }
    }

    /// Ends watch `id`, news held by a partition included.
    pub(super) fn unwatch(&mut self, id: WatchId) {
        let Some(w) = self.watches.remove(&id) else {
            return;
        };
        if let Some(ids) = self.lease_watches.get_mut(&w.lease) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                self.lease_watches.remove(&w.lease);
            }
        }
    }

    /// Sends the news a partition of `link` held.
    pub(super) fn flush_held(&mut self, link: &Arc<Link>) {
        for w in self.watches.values_mut() {
            if Arc::ptr_eq(&w.link, link) {
                w.flush();
            }
        }
    }
}
