//! The embedded `memory` backend: an in-process lock service with leases,
//! server-side expiry on the same clock, strictly increasing tokens, waiting
//! acquisition, and fault switches.
//!
//! A [`MemoryService`] is the server; each client talks to it through its own
//! [`MemoryBackend`] link, and the fault switches sit on that link (a
//! partition, lost or delayed replies, errors), so two holders in one process
//! contend for real and one of them can be cut off alone. Applications use it
//! to test their own fence handling.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use crate::backend::{Backend, BackendError, BoxFuture, Grant, LockGone};
use crate::clock::{Clock, Instant};
use crate::machine::{LeaseId, Token};

/// An in-process lock service. Clones share one service.
#[derive(Clone)]
pub struct MemoryService(Arc<Service>);

struct Service {
    clock: Clock,
    state: Mutex<ServiceState>,
    /// Woken on every change that could let a waiter in.
    changed: Notify,
}

#[derive(Default)]
struct ServiceState {
    revision: u64,
    next_lease: LeaseId,
    leases: HashMap<LeaseId, LeaseRec>,
    /// Lock keys `<name>/<lease hex>` of holders and waiters, with their
    /// lease and create revision: etcd's lock protocol, so names nest as
    /// they do there (the holder of `a/b` blocks `a`).
    keys: BTreeMap<String, (LeaseId, u64)>,
    frozen: bool,
    /// The whole service is down (see [`MemoryService::outage`]).
    down: bool,
    /// The keys of guarded writes.
    kv: HashMap<Vec<u8>, Vec<u8>>,
}

/// The lock key of `name` under `lease`, as etcd's concurrency Mutex names it.
fn lock_key(name: &str, lease: LeaseId) -> String {
    format!("{name}/{lease:x}")
}

struct LeaseRec {
    ttl: Duration,
    expires_at: Instant,
}

impl ServiceState {
    /// Server-side expiry: drops every lease whose TTL ran out, with its locks.
    fn expire(&mut self, now: Instant) -> bool {
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

    fn remove_lease(&mut self, lease: LeaseId) -> bool {
        let found = self.leases.remove(&lease).is_some();
        self.keys.retain(|_, (l, _)| *l != lease);
        found
    }

    /// The create revision of the key that holds `name`: the oldest key
    /// under `name/` (etcd: the lowest create revision with that prefix).
    fn owner(&self, name: &str) -> Option<(&str, u64)> {
        let prefix = format!("{name}/");
        self.keys
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .min_by_key(|(_, (_, rev))| *rev)
            .map(|(k, (_, rev))| (k.as_str(), *rev))
    }

    /// The holder of the lock `name` itself (not of a name nested in it).
    fn holder_of(&self, name: &str) -> Option<(String, Token)> {
        let (key, rev) = self.owner(name)?;
        let rest = &key[name.len() + 1..];
        (!rest.contains('/')).then(|| (key.to_string(), Token(rev)))
    }

    fn next_expiry(&self) -> Option<Instant> {
        if self.frozen || self.down {
            return None;
        }
        self.leases.values().map(|l| l.expires_at).min()
    }
}

impl MemoryService {
    /// A new, isolated service on the system clock.
    pub fn new() -> MemoryService {
        MemoryService::with_clock(Clock::system())
    }

    /// A new, isolated service whose leases expire on `clock` (give a client
    /// the same clock).
    pub fn with_clock(clock: Clock) -> MemoryService {
        MemoryService(Arc::new(Service {
            clock,
            state: Mutex::new(ServiceState {
                next_lease: 0x1000,
                ..Default::default()
            }),
            changed: Notify::new(),
        }))
    }

    /// The process-wide default service (what the `memory` endpoint means).
    pub fn shared() -> MemoryService {
        MemoryService::named("")
    }

    /// The process-wide service called `name`, created on first use.
    pub fn named(name: &str) -> MemoryService {
        static NAMED: OnceLock<Mutex<HashMap<String, MemoryService>>> = OnceLock::new();
        let mut all = NAMED.get_or_init(Default::default).lock().unwrap();
        all.entry(name.to_string()).or_default().clone()
    }

    /// A new client link to this service, with its own fault switches.
    pub fn link(&self) -> MemoryBackend {
        MemoryBackend {
            service: self.clone(),
            link: Arc::new(Link::default()),
        }
    }

    /// The clock leases expire on.
    pub fn clock(&self) -> &Clock {
        &self.0.clock
    }

    /// Stops (`true`) or restarts server-side expiry, as a paused leader
    /// would. Leases whose time ran out while frozen expire on thaw.
    pub fn freeze_expiry(&self, frozen: bool) {
        self.lock().frozen = frozen;
        self.0.changed.notify_waiters();
    }

    /// The token of the current holder of `name`, as the server sees it.
    pub fn holder(&self, name: &str) -> Option<Token> {
        let mut st = self.lock();
        st.expire(self.0.clock.now());
        st.holder_of(name).map(|(_, t)| t)
    }

    /// The whole service goes down (`true`) or comes back, as an etcd
    /// cluster that lost its quorum would: while down, every request fails
    /// at once and no lease expires; on the way back every lease gets a
    /// fresh TTL, as etcd's new leader gives it.
    pub fn outage(&self, down: bool) {
        let now = self.0.clock.now();
        let mut st = self.lock();
        if st.down && !down {
            for l in st.leases.values_mut() {
                l.expires_at = now + l.ttl;
            }
        }
        st.down = down;
        drop(st);
        self.0.changed.notify_waiters();
    }

    fn check_up(&self) -> Result<(), BackendError> {
        if self.lock().down {
            Err(BackendError::Unavailable(
                "the embedded service is down (outage)".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Revokes a lease on the server, as an operator would.
    pub fn revoke_lease(&self, lease: LeaseId) -> bool {
        let found = self.lock().remove_lease(lease);
        self.0.changed.notify_waiters();
        found
    }

    /// Deletes the lock key of `name` while its lease lives on, as an
    /// operator running `etcdctl del` would: the holder's watch fences it at
    /// once. Returns whether the lock was held.
    pub fn delete_lock_key(&self, name: &str) -> bool {
        let found = {
            let mut st = self.lock();
            match st.holder_of(name) {
                Some((key, _)) => st.keys.remove(&key).is_some(),
                None => false,
            }
        };
        self.0.changed.notify_waiters();
        found
    }

    /// The value of `key` in the service's key-value store (written by
    /// guarded writes).
    pub fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().kv.get(key).cloned()
    }

    /// Commits a write only while the lock key of `name` under `lease`
    /// exists with `token` as its create revision (the rule of an etcd
    /// transaction comparing the lock key's `create_revision`).
    fn guarded_write(
        &self,
        name: &str,
        lease: LeaseId,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.expire(self.0.clock.now());
        if st.keys.get(&lock_key(name, lease)) != Some(&(lease, token.0)) {
            return Err(BackendError::Fenced);
        }
        st.revision += 1;
        match value {
            Some(v) => st.kv.insert(key.to_vec(), v.to_vec()),
            None => st.kv.remove(key),
        };
        Ok(())
    }

    /// Resolves once `name` is no longer held with `token` while `lease`
    /// lives. A lost lease is the keepalives' news: then it never resolves.
    async fn lock_gone(&self, name: &str, lease: LeaseId, token: Token) {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (lease_alive, held) = {
                let st = self.lock();
                let held = st.keys.get(&lock_key(name, lease)) == Some(&(lease, token.0));
                (st.leases.contains_key(&lease), held)
            };
            if !lease_alive {
                return std::future::pending().await;
            }
            if !held {
                return;
            }
            changed.await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, ServiceState> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn grant(&self, ttl: Duration) -> Grant {
        let mut st = self.lock();
        st.next_lease += 1;
        let lease = st.next_lease;
        let expires_at = self.0.clock.now() + ttl;
        st.leases.insert(lease, LeaseRec { ttl, expires_at });
        Grant { lease, ttl }
    }

    fn keepalive(&self, lease: LeaseId) -> Result<Duration, BackendError> {
        let now = self.0.clock.now();
        let mut st = self.lock();
        if st.expire(now) {
            self.0.changed.notify_waiters();
        }
        let rec = st
            .leases
            .get_mut(&lease)
            .ok_or(BackendError::LeaseNotFound)?;
        rec.expires_at = now + rec.ttl;
        Ok(rec.ttl)
    }

    /// etcd's lock protocol: put the key `<name>/<lease>` (once), then
    /// hold when it is the oldest key under `<name>/`. Without `wait`, a key
    /// that does not hold at once is deleted again.
    async fn acquire(&self, name: &str, lease: LeaseId, wait: bool) -> Result<Token, BackendError> {
        let key = lock_key(name, lease);
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next_expiry = {
                let mut st = self.lock();
                if st.expire(self.0.clock.now()) {
                    self.0.changed.notify_waiters();
                }
                if st.down {
                    return Err(BackendError::Unavailable(
                        "the embedded service is down (outage)".into(),
                    ));
                }
                if !st.leases.contains_key(&lease) {
                    return Err(BackendError::LeaseNotFound);
                }
                let mine = match st.keys.get(&key) {
                    Some((_, rev)) => *rev,
                    None => {
                        st.revision += 1;
                        let rev = st.revision;
                        st.keys.insert(key.clone(), (lease, rev));
                        rev
                    }
                };
                if st.owner(name).is_some_and(|(_, rev)| rev == mine) {
                    return Ok(Token(mine));
                }
                if !wait {
                    st.keys.remove(&key);
                    drop(st);
                    self.0.changed.notify_waiters();
                    return Err(BackendError::Busy);
                }
                st.next_expiry()
            };
            match next_expiry {
                Some(t) => tokio::select! {
                    _ = &mut changed => {}
                    _ = self.0.clock.sleep_until(t) => {}
                },
                None => changed.await,
            }
        }
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), BackendError> {
        if self.revoke_lease(lease) {
            Ok(())
        } else {
            Err(BackendError::LeaseNotFound)
        }
    }
}

impl std::fmt::Debug for MemoryService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryService").finish_non_exhaustive()
    }
}

impl Default for MemoryService {
    fn default() -> Self {
        MemoryService::new()
    }
}

#[derive(Default)]
struct Link {
    faults: Mutex<Faults>,
    healed: Notify,
    leases: Mutex<Vec<LeaseId>>,
}

#[derive(Clone, Default)]
struct Faults {
    partitioned: bool,
    drop_replies: bool,
    delay: Duration,
    fail: Option<String>,
}

/// One client's link to a [`MemoryService`]: the [`Backend`] to give a
/// [`crate::Client`], and the fault switches of that client's network.
/// Clones share the link.
#[derive(Clone)]
pub struct MemoryBackend {
    service: MemoryService,
    link: Arc<Link>,
}

impl MemoryBackend {
    /// The service behind this link.
    pub fn service(&self) -> &MemoryService {
        &self.service
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.link.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cuts the link: requests sent from now on reach the service only when
    /// the link heals, as over a TCP connection whose packets are dropped.
    pub fn partition(&self) {
        self.faults().partitioned = true;
    }

    /// Heals a partition: held requests go through, late.
    pub fn heal(&self) {
        self.faults().partitioned = false;
        self.link.healed.notify_waiters();
    }

    /// Keepalives reach the service (and renew the lease) but their replies
    /// are lost while `on`.
    pub fn drop_keepalive_replies(&self, on: bool) {
        self.faults().drop_replies = on;
    }

    /// Keepalive replies arrive `delay` late (zero: on time).
    pub fn delay_keepalive_replies(&self, delay: Duration) {
        self.faults().delay = delay;
    }

    /// Keepalives fail at once with `error` (`None`: they work again).
    pub fn fail_keepalives(&self, error: Option<&str>) {
        self.faults().fail = error.map(str::to_string);
    }

    /// The service drops every lease this link was granted, as if they had
    /// expired or an operator had revoked them: the next keepalive is told
    /// the lease is lost.
    pub fn declare_lease_lost(&self) {
        let leases = std::mem::take(&mut *self.link.leases.lock().unwrap());
        for lease in leases {
            self.service.revoke_lease(lease);
        }
    }

    /// Waits while the link is partitioned.
    async fn cross(&self) -> Faults {
        loop {
            let healed = self.link.healed.notified();
            tokio::pin!(healed);
            healed.as_mut().enable();
            let f = self.faults().clone();
            if !f.partitioned {
                return f;
            }
            healed.await;
        }
    }
}

impl Backend for MemoryBackend {
    fn grant(&self, ttl: Duration) -> BoxFuture<'_, Result<Grant, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            let g = self.service.grant(ttl);
            // Link before service: the only place both are held.
            let mut leases = self.link.leases.lock().unwrap();
            let service = self.service.lock();
            leases.retain(|l| service.leases.contains_key(l));
            leases.push(g.lease);
            Ok(g)
        })
    }

    fn keepalive(&self, lease: LeaseId) -> BoxFuture<'_, Result<Duration, BackendError>> {
        Box::pin(async move {
            let f = self.cross().await;
            if let Some(e) = f.fail {
                return Err(BackendError::Unavailable(e));
            }
            self.service.check_up()?;
            let reply = self.service.keepalive(lease);
            if f.drop_replies {
                std::future::pending::<()>().await;
            }
            if !f.delay.is_zero() {
                self.service.clock().sleep(f.delay).await;
            }
            reply
        })
    }

    fn lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.acquire(name, lease, wait).await
        })
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.revoke(lease)
        })
    }

    fn unlock<'a>(
        &'a self,
        _name: &'a str,
        _lease: LeaseId,
        _token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async { todo!("unlock") })
    }

    fn guarded_write<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        key: &'a [u8],
        value: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.guarded_write(name, lease, token, key, value)
        })
    }
}

/// Blocks the driver thread for `d`, as a CPU-starved process or a long GC
/// pause would: no keepalive is sent and no timer fires meanwhile. Shows that
/// `permit()` refuses after the deadline on the clock alone.
pub fn stall_driver(d: Duration) {
    crate::driver::runtime().spawn(async move { std::thread::sleep(d) });
}
