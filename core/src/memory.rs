//! The embedded `memory` backend: an in-process lock service with leases,
//! server-side expiry on the same clock, strictly increasing tokens, waiting
//! acquisition, and fault switches.
//!
//! A [`MemoryService`] is the server; each client talks to it through its own
//! [`MemoryBackend`] link, and the fault switches sit on that link (a
//! partition, lost or delayed replies, errors), so two holders in one process
//! contend for real and one of them can be cut off alone. Applications use it
//! to test their own fence handling.
//!
//! Key watches ([`Backend::watch_keys`]) cost nothing per key but an entry
//! in their watch's token set: a key's removal looks its lease's watches up
//! and reports to the one watching its token; no watcher waits on the
//! service's changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;

use crate::backend::{
    Backend, BackendError, Bounds, BoxFuture, Grant, KeyGone, KeyWatch, Leader, lock_key,
};
use crate::clock::Clock;
use crate::identity::{Identity, LockHolder};
use crate::machine::{LeaseId, Token};

mod link;
mod state;

use link::{Faults, Link};
use state::{ServiceState, WatchId};

/// An in-process lock service. Clones share one service.
#[derive(Clone)]
pub struct MemoryService(Arc<Service>);

struct Service {
    clock: Clock,
    state: Mutex<ServiceState>,
    /// Woken on every change that could let a waiter in.
    changed: Notify,
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
            Err(outage())
        } else {
            Ok(())
        }
    }

    /// Whether `lease` lives on the server (not revoked, not expired).
    pub fn lease_alive(&self, lease: LeaseId) -> bool {
        let mut st = self.lock();
        st.expire(self.0.clock.now());
        st.leases.contains_key(&lease)
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
            st.expire(self.0.clock.now());
            match st.holder_of(name) {
                Some((key, _)) => st.delete_key(&key),
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
        st.guarded_write(name, lease, token, key, value)
    }

    /// Stores `key` = `value` in the key-value store unless `key` is
    /// there; returns the value stored now.
    fn put_if_absent(&self, key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut st = self.lock();
        if let Some(found) = st.kv.get(key) {
            return found.clone();
        }
        st.revision += 1;
        st.kv.insert(key.to_vec(), value.to_vec());
        value.to_vec()
    }

    fn lock(&self) -> MutexGuard<'_, ServiceState> {
        crate::sync::lock(&self.0.state)
    }

    /// The state with the expired leases gone, waking the waiters when any
    /// went (their keys went with them).
    fn lock_expired(&self) -> MutexGuard<'_, ServiceState> {
        let mut st = self.lock();
        if st.expire(self.0.clock.now()) {
            self.0.changed.notify_waiters();
        }
        st
    }

    /// [`Self::lock_expired`] for a request: refused during an outage.
    fn lock_up(&self) -> Result<MutexGuard<'_, ServiceState>, BackendError> {
        let st = self.lock_expired();
        if st.down {
            return Err(outage());
        }
        Ok(st)
    }

    fn grant(&self, ttl: Duration, identity: Option<&Identity>) -> Grant {
        let identity = identity.map(|i| Arc::new(i.clone()));
        self.lock().grant(self.0.clock.now(), ttl, identity)
    }

    /// The holder of `name` now, expired leases dropped first.
    fn holder_of(&self, name: &str) -> Option<LockHolder> {
        let now = self.0.clock.now();
        let mut st = self.lock();
        if st.expire(now) {
            self.0.changed.notify_waiters();
        }
        st.holder(name)
    }

    fn keepalive(&self, lease: LeaseId) -> Result<Duration, BackendError> {
        let now = self.0.clock.now();
        let mut st = self.lock();
        if st.expire(now) {
            self.0.changed.notify_waiters();
        }
        st.renew(now, lease)
    }

    /// etcd's lock protocol: put the key `<name>/<lease>` (once), then
    /// hold when it is the oldest key under `<name>/`. Without `wait`, a key
    /// that does not hold at once is deleted again.
    async fn acquire(
        &self,
        name: &str,
        lease: LeaseId,
        value: Option<&[u8]>,
        read: bool,
        wait: bool,
    ) -> Result<Token, BackendError> {
        let key = lock_key(name, lease);
        self.look_until(|st| {
            if !st.leases.contains_key(&lease) {
                return Err(BackendError::LeaseNotFound);
            }
            let (mine, put) = match st.keys.get(&key) {
                Some((_, rev)) => (*rev, false),
                None => {
                    st.revision += 1;
                    let rev = st.revision;
                    st.keys.insert(key.clone(), (lease, rev));
                    st.values.remove(&key);
                    (rev, true)
                }
            };
            let mut proclaimed = false;
            if let Some(v) = value
                && st.values.get(&key).map_or(&[][..], Vec::as_slice) != v
            {
                st.values.insert(key.clone(), v.to_vec());
                proclaimed = true;
            }
            let holds = if read {
                st.reader_holds(name, mine)
            } else {
                st.owner(name).is_some_and(|(_, rev)| rev == mine)
            };
            if holds {
                if put || proclaimed {
                    // An observer sees the new leader (or value).
                    self.0.changed.notify_waiters();
                }
                return Ok(Some(Token(mine)));
            }
            if !wait {
                st.delete_key(&key);
                self.0.changed.notify_waiters();
                return Err(BackendError::Busy);
            }
            Ok(None)
        })
        .await
    }

    /// Looks at the state with `look` until it gives `Some`: again after
    /// every change and at the next lease expiry (nothing fires then). The
    /// one wait of the embedded engine's waits: a lock's queue, a free
    /// slot, the next leader.
    async fn look_until<T>(
        &self,
        mut look: impl FnMut(&mut ServiceState) -> Result<Option<T>, BackendError>,
    ) -> Result<T, BackendError> {
        loop {
            let changed = self.0.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next_expiry = {
                let mut st = self.lock_up()?;
                if let Some(found) = look(&mut st)? {
                    return Ok(found);
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

    /// The lowest slot of the semaphore `name` with no key under it, once
    /// there is one (with `wait`): woken by every change and expiry.
    async fn free_slot(
        &self,
        name: &str,
        limit: u32,
        wait: bool,
    ) -> Result<Option<u32>, BackendError> {
        self.look_until(|st| {
            let free =
                (0..limit).find(|&i| st.owner(&crate::semaphore::slot_name(name, i)).is_none());
            Ok((free.is_some() || !wait).then_some(free))
        })
        .await
    }

    /// `Election.Proclaim`: the value of our key, while it holds `token`.
    fn proclaim(
        &self,
        name: &str,
        lease: LeaseId,
        token: Token,
        value: &[u8],
    ) -> Result<(), BackendError> {
        let key = lock_key(name, lease);
        let mut st = self.lock_expired();
        st.proclaim(key, lease, token, value)?;
        drop(st);
        self.0.changed.notify_waiters();
        Ok(())
    }

    /// The leader of `name` (the holder of the name itself, as etcd's
    /// election prefix), once it differs from `last`.
    async fn next_leader(
        &self,
        name: &str,
        last: Option<&Option<Leader>>,
    ) -> Result<Option<Leader>, BackendError> {
        self.look_until(|st| {
            let leader = st.holder_of(name).map(|(key, token)| Leader {
                value: st.values.get(&key).cloned().unwrap_or_default(),
                lease: st.keys.get(&key).map_or(0, |(l, _)| *l),
                key,
                token,
            });
            Ok((last != Some(&leader)).then_some(leader))
        })
        .await
    }

    fn revoke(&self, lease: LeaseId) -> Result<(), BackendError> {
        if self.revoke_lease(lease) {
            Ok(())
        } else {
            Err(BackendError::LeaseNotFound)
        }
    }

    /// Deletes the lock key of `name` under `lease`: with `token`, only
    /// while the key was created with it. Wakes the waiters if it did.
    fn unlock(&self, name: &str, lease: LeaseId, token: Option<Token>) {
        let mut st = self.lock();
        let expired = st.expire(self.0.clock.now());
        let deleted = st.unlock(&lock_key(name, lease), token);
        drop(st);
        if expired || deleted {
            self.0.changed.notify_waiters();
        }
    }

    /// A new key watch of `lease` whose news crosses `link` to `gone`.
    fn watch(&self, lease: LeaseId, link: Arc<Link>, gone: UnboundedSender<KeyGone>) -> WatchId {
        self.lock().watch(lease, link, gone)
    }

    /// Watch `id` watches the key of `name` held with `token`; a key already
    /// gone is reported at once.
    fn watch_add(&self, id: WatchId, name: &str, token: Token) {
        let mut st = self.lock();
        if st.expire(self.0.clock.now()) {
            self.0.changed.notify_waiters();
        }
        st.watch_add(id, name, token);
    }

    /// Sends the news a partition of `link` held.
    fn flush_held(&self, link: &Arc<Link>) {
        self.lock().flush_held(link);
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

/// One client's link to a [`MemoryService`]: the [`Backend`] to give a
/// [`crate::Client`], and the fault switches of that client's network.
/// Clones share the link.
#[derive(Clone)]
pub struct MemoryBackend {
    service: MemoryService,
    link: Arc<Link>,
}

impl MemoryBackend {
    /// Notes the bounds a call came with (tests read them back); the
    /// service answers at once, or as the link's faults say, and the
    /// machine times every call itself.
    fn saw(&self, call: &'static str, bounds: Bounds) {
        #[cfg(test)]
        crate::sync::lock(&self.link.bounds).push((call, bounds));
        let _ = (call, bounds);
    }

    /// The bounds of every grant, keepalive and key watch so far.
    #[cfg(test)]
    pub(crate) fn bounds_seen(&self) -> Vec<(&'static str, Bounds)> {
        crate::sync::lock(&self.link.bounds).clone()
    }

    /// The service behind this link.
    pub fn service(&self) -> &MemoryService {
        &self.service
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        self.link.faults()
    }

    /// Cuts the link: requests sent from now on reach the service only when
    /// the link heals, as over a TCP connection whose packets are dropped.
    pub fn partition(&self) {
        self.faults().partitioned = true;
    }

    /// Heals a partition: held requests and key-watch news go through, late.
    pub fn heal(&self) {
        self.faults().partitioned = false;
        self.link.healed.notify_waiters();
        self.service.flush_held(&self.link);
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
    fn grant<'a>(
        &'a self,
        ttl: Duration,
        bounds: Bounds,
        identity: Option<&'a Identity>,
    ) -> BoxFuture<'a, Result<Grant, BackendError>> {
        self.saw("grant", bounds);
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            let g = self.service.grant(ttl, identity);
            // Link before service: the only place both are held.
            let mut leases = self.link.leases.lock().unwrap();
            let service = self.service.lock();
            leases.retain(|l| service.leases.contains_key(l));
            leases.push(g.lease);
            Ok(g)
        })
    }

    fn keepalive(
        &self,
        lease: LeaseId,
        bounds: Bounds,
    ) -> BoxFuture<'_, Result<Duration, BackendError>> {
        self.saw("keepalive", bounds);
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
            self.service.acquire(name, lease, None, false, wait).await
        })
    }

    fn campaign<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        value: &'a [u8],
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service
                .acquire(name, lease, Some(value), false, wait)
                .await
        })
    }

    fn lock_rw<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        mode: crate::mode::Mode,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            let read = mode == crate::mode::Mode::Read;
            let value = Some(mode.value());
            self.service.acquire(name, lease, value, read, wait).await
        })
    }

    fn proclaim<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.proclaim(name, lease, token, value)
        })
    }

    fn holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockHolder>, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            Ok(self.service.holder_of(name))
        })
    }

    fn next_leader<'a>(
        &'a self,
        name: &'a str,
        last: Option<&'a Option<Leader>>,
    ) -> BoxFuture<'a, Result<Option<Leader>, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.next_leader(name, last).await
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
        name: &'a str,
        lease: LeaseId,
        token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        // `None` is ordered after this link's lock requests of the key: a
        // lock request puts its key synchronously while polled, so one whose
        // future was dropped never puts it later.
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.unlock(name, lease, token);
            Ok(())
        })
    }

    fn watch_keys(
        &self,
        lease: LeaseId,
        bounds: Bounds,
        gone: UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch> {
        self.saw("watch", bounds);
        let id = self.service.watch(lease, self.link.clone(), gone);
        Box::new(MemoryKeyWatch {
            service: self.service.clone(),
            id,
        })
    }

    fn free_slot<'a>(
        &'a self,
        name: &'a str,
        limit: u32,
        wait: bool,
    ) -> BoxFuture<'a, Result<Option<u32>, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            self.service.free_slot(name, limit, wait).await
        })
    }

    fn put_if_absent<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        Box::pin(async move {
            self.cross().await;
            self.service.check_up()?;
            Ok(self.service.put_if_absent(key, value))
        })
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

/// The key watches of one lease on a [`MemoryBackend`] link: a registration
/// in the service, no task. Dropping it unregisters every key.
struct MemoryKeyWatch {
    service: MemoryService,
    id: WatchId,
}

impl KeyWatch for MemoryKeyWatch {
    fn add(&self, name: &str, token: Token) {
        self.service.watch_add(self.id, name, token);
    }

    fn remove(&self, token: Token) {
        self.service.lock().watch_remove(self.id, token);
    }
}

impl Drop for MemoryKeyWatch {
    fn drop(&mut self) {
        self.service.lock().unwatch(self.id);
    }
}

/// Blocks the driver thread for `d`, as a CPU-starved process or a long GC
/// pause would: no keepalive is sent and no timer fires meanwhile. Shows that
/// `permit()` refuses after the deadline on the clock alone.
pub fn stall_driver(d: Duration) {
    crate::driver::runtime().spawn(async move { std::thread::sleep(d) });
}

/// What every request gets while the service is down.
fn outage() -> BackendError {
    BackendError::Unavailable("the embedded service is down (outage)".into())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use tokio::sync::mpsc::{self, UnboundedReceiver, error::TryRecvError};
    use tokio::time::timeout;

    use super::*;
    use crate::backend::LockGone;
    use crate::clock::ManualClock;

    /// The bound on every awaited event: far above what any takes.
    const WITHIN: Duration = Duration::from_secs(5);
    const TTL: Duration = Duration::from_secs(60);
    const BOUNDS: Bounds = Bounds {
        timeout: Duration::from_secs(2),
        retry: Duration::from_secs(1),
    };

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    async fn grant(b: &MemoryBackend) -> LeaseId {
        let anon = crate::Identity::of_process(&Default::default());
        b.grant(TTL, BOUNDS, Some(&anon)).await.unwrap().lease
    }

    /// A service, a link to it and a lease granted over that link.
    async fn linked() -> (MemoryService, MemoryBackend, LeaseId) {
        let s = MemoryService::new();
        let b = s.link();
        let l = grant(&b).await;
        (s, b, l)
    }

    /// [`linked`] with a key watch on the lease and its report channel.
    struct Watched {
        s: MemoryService,
        b: MemoryBackend,
        l: LeaseId,
        rx: UnboundedReceiver<KeyGone>,
        w: Box<dyn KeyWatch>,
    }

    async fn watched() -> Watched {
        let (s, b, l) = linked().await;
        let (tx, rx) = mpsc::unbounded_channel();
        let w = b.watch_keys(l, BOUNDS, tx);
        Watched { s, b, l, rx, w }
    }

    /// Locks each of `names` under `l`, each key added to `w`: their tokens.
    async fn lock_watched<const N: usize>(
        b: &MemoryBackend,
        l: LeaseId,
        w: &dyn KeyWatch,
        names: [&'static str; N],
    ) -> BTreeMap<&'static str, Token> {
        let mut t = BTreeMap::new();
        for name in names {
            let tok = b.lock(name, l, false).await.unwrap();
            w.add(name, tok);
            t.insert(name, tok);
        }
        t
    }

    async fn next(rx: &mut UnboundedReceiver<KeyGone>) -> KeyGone {
        timeout(WITHIN, rx.recv())
            .await
            .expect("no report in time")
            .expect("the watch's sender is gone")
    }

    /// Reports are sent synchronously by the removal that makes them: none
    /// pending now means none was made.
    fn assert_quiet(rx: &mut UnboundedReceiver<KeyGone>) {
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
    }

    fn gone(token: Token, why: LockGone) -> KeyGone {
        KeyGone { token, why }
    }

    /// Yields until `cond` holds (bounded by [`WITHIN`]).
    async fn until(mut cond: impl FnMut() -> bool) {
        timeout(WITHIN, async {
            while !cond() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("condition not reached in time");
    }

    #[test]
    fn unlock_with_token_deletes() {
        run(async {
            let (s, b, l) = linked().await;
            let t = b.lock("a", l, false).await.unwrap();
            assert_eq!(s.holder("a"), Some(t));
            b.unlock("a", l, Some(t)).await.unwrap();
            assert_eq!(s.holder("a"), None);
            // Absent: still Ok.
            b.unlock("a", l, Some(t)).await.unwrap();
            b.unlock("a", l, None).await.unwrap();
            // `None` deletes whatever is there.
            let t2 = b.lock("a", l, false).await.unwrap();
            assert!(t2 > t);
            b.unlock("a", l, None).await.unwrap();
            assert_eq!(s.holder("a"), None);
            // The lease lives on for other locks.
            assert!(b.lock("b", l, false).await.is_ok());
        });
    }

    #[test]
    fn unlock_with_old_token_keeps_newer_key() {
        run(async {
            let (s, b, l) = linked().await;
            let t1 = b.lock("a", l, false).await.unwrap();
            b.unlock("a", l, Some(t1)).await.unwrap();
            let t2 = b.lock("a", l, false).await.unwrap();
            assert!(t2 > t1);
            b.unlock("a", l, Some(t1)).await.unwrap();
            assert_eq!(s.holder("a"), Some(t2));
            b.unlock("a", l, Some(t2)).await.unwrap();
            assert_eq!(s.holder("a"), None);
        });
    }

    #[test]
    fn unlock_only_deletes_own_lease_key() {
        run(async {
            let s = MemoryService::new();
            let (b1, b2) = (s.link(), s.link());
            let (l1, l2) = (grant(&b1).await, grant(&b2).await);
            let t1 = b1.lock("a", l1, false).await.unwrap();
            b2.unlock("a", l2, None).await.unwrap();
            b2.unlock("a", l2, Some(t1)).await.unwrap();
            assert_eq!(s.holder("a"), Some(t1));
        });
    }

    #[test]
    fn unlock_wakes_queued_waiter() {
        run(async {
            let s = MemoryService::new();
            let (b1, b2) = (s.link(), s.link());
            let (l1, l2) = (grant(&b1).await, grant(&b2).await);
            let t1 = b1.lock("a", l1, false).await.unwrap();
            let waiter = {
                let b2 = b2.clone();
                tokio::spawn(async move { b2.lock("a", l2, true).await })
            };
            // Queued: its key is put behind the holder's.
            until(|| s.lock().keys.contains_key(&lock_key("a", l2))).await;
            assert!(!waiter.is_finished());
            b1.unlock("a", l1, Some(t1)).await.unwrap();
            let t2 = timeout(WITHIN, waiter)
                .await
                .expect("the waiter was not woken")
                .unwrap()
                .unwrap();
            assert!(t2 > t1);
            assert_eq!(s.holder("a"), Some(t2));
        });
    }

    #[test]
    fn unlock_crosses_the_link() {
        run(async {
            let (s, b, l) = linked().await;
            let t = b.lock("a", l, false).await.unwrap();
            b.partition();
            let held = {
                let b = b.clone();
                tokio::spawn(async move { b.unlock("a", l, Some(t)).await })
            };
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
            assert!(!held.is_finished());
            assert_eq!(s.holder("a"), Some(t));
            b.heal();
            timeout(WITHIN, held).await.unwrap().unwrap().unwrap();
            assert_eq!(s.holder("a"), None);

            let t = b.lock("a", l, false).await.unwrap();
            s.outage(true);
            assert!(matches!(
                b.unlock("a", l, Some(t)).await,
                Err(BackendError::Unavailable(_))
            ));
            s.outage(false);
            assert_eq!(s.holder("a"), Some(t));
        });
    }

    /// A dropped lock request never puts its key afterwards, so an
    /// `unlock(None)` sent after the drop is final.
    #[test]
    fn dropped_lock_request_never_puts_after_unlock() {
        run(async {
            let (s, b, l) = linked().await;
            b.partition();
            let req = {
                let b = b.clone();
                tokio::spawn(async move { b.lock("a", l, true).await })
            };
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
            req.abort();
            assert!(timeout(WITHIN, req).await.unwrap().is_err());
            let rel = {
                let b = b.clone();
                tokio::spawn(async move { b.unlock("a", l, None).await })
            };
            b.heal();
            timeout(WITHIN, rel).await.unwrap().unwrap().unwrap();
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
            assert!(s.lock().keys.is_empty());
        });
    }

    #[test]
    fn key_watch_reports_the_deleted_key_then_the_lease_lost() {
        run(async {
            let Watched { s, b, l, mut rx, w } = watched().await;
            let mut tokens = BTreeMap::new();
            for i in 0..1000 {
                let name = format!("k{i}");
                let t = b.lock(&name, l, false).await.unwrap();
                w.add(&name, t);
                tokens.insert(name, t);
            }
            assert_quiet(&mut rx);
            assert!(s.delete_lock_key("k500"));
            let deleted = tokens.remove("k500").unwrap();
            assert_eq!(next(&mut rx).await, gone(deleted, LockGone::KeyDeleted));
            assert_quiet(&mut rx);

            assert!(s.revoke_lease(l));
            let mut lost = BTreeSet::new();
            for _ in 0..999 {
                let g = next(&mut rx).await;
                assert_eq!(g.why, LockGone::LeaseLost);
                assert!(lost.insert(g.token), "reported twice: {g:?}");
            }
            assert_eq!(lost, tokens.values().copied().collect());
            assert_quiet(&mut rx);
            drop(w);
        });
    }

    #[test]
    fn key_watch_reports_only_its_lease_and_each_watch_its_own() {
        run(async {
            let s = MemoryService::new();
            let (b1, b2) = (s.link(), s.link());
            let (l1, l2) = (grant(&b1).await, grant(&b2).await);
            let (tx1, mut rx1) = mpsc::unbounded_channel();
            let (tx2, mut rx2) = mpsc::unbounded_channel();
            let (w1, w2) = (
                b1.watch_keys(l1, BOUNDS, tx1),
                b2.watch_keys(l2, BOUNDS, tx2),
            );
            let t1 = b1.lock("a", l1, false).await.unwrap();
            let t2 = b2.lock("b", l2, false).await.unwrap();
            w1.add("a", t1);
            w2.add("b", t2);
            assert!(s.delete_lock_key("b"));
            assert_eq!(next(&mut rx2).await, gone(t2, LockGone::KeyDeleted));
            assert_quiet(&mut rx1);
            b1.declare_lease_lost();
            assert_eq!(next(&mut rx1).await, gone(t1, LockGone::LeaseLost));
            assert_quiet(&mut rx2);
            drop((w1, w2));
        });
    }

    #[test]
    fn key_watch_remove_stops_reports() {
        run(async {
            let Watched { s, b, l, mut rx, w } = watched().await;
            let t = lock_watched(&b, l, &*w, ["a", "b", "c"]).await;
            w.remove(t["a"]);
            w.remove(Token(999_999)); // unknown: ignored
            assert!(s.delete_lock_key("a"));
            assert_quiet(&mut rx);
            w.remove(t["b"]);
            assert!(s.revoke_lease(l));
            assert_eq!(next(&mut rx).await, gone(t["c"], LockGone::LeaseLost));
            assert_quiet(&mut rx);
        });
    }

    #[test]
    fn key_watch_reports_a_release_of_a_watched_key() {
        run(async {
            let Watched {
                b, l, mut rx, w, ..
            } = watched().await;
            let t = b.lock("a", l, false).await.unwrap();
            w.add("a", t);
            b.unlock("a", l, Some(t)).await.unwrap();
            assert_eq!(next(&mut rx).await, gone(t, LockGone::KeyDeleted));
            // Removed first: the release is silent.
            let t = b.lock("a", l, false).await.unwrap();
            w.add("a", t);
            w.remove(t);
            b.unlock("a", l, None).await.unwrap();
            assert_quiet(&mut rx);
        });
    }

    #[test]
    fn key_watch_add_of_a_gone_key_reports_at_once() {
        run(async {
            let Watched { s, b, l, mut rx, w } = watched().await;
            let old = b.lock("a", l, false).await.unwrap();
            b.unlock("a", l, Some(old)).await.unwrap();
            let new = b.lock("a", l, false).await.unwrap();
            w.add("a", old);
            assert_eq!(next(&mut rx).await, gone(old, LockGone::KeyDeleted));
            assert_quiet(&mut rx);
            w.add("a", new);
            w.add("a", new); // twice: one watch
            assert_quiet(&mut rx);
            assert!(s.revoke_lease(l));
            assert_eq!(next(&mut rx).await, gone(new, LockGone::LeaseLost));
            assert_quiet(&mut rx);
            w.add("a", new);
            assert_eq!(next(&mut rx).await, gone(new, LockGone::LeaseLost));
        });
    }

    #[test]
    fn key_watch_reports_expiry() {
        run(async {
            let clock = ManualClock::default();
            let s = MemoryService::with_clock(clock.clock());
            let b = s.link();
            let l = b
                .grant(Duration::from_secs(10), BOUNDS, None)
                .await
                .unwrap()
                .lease;
            let (tx, mut rx) = mpsc::unbounded_channel();
            let w = b.watch_keys(l, BOUNDS, tx);
            let t = b.lock("a", l, false).await.unwrap();
            w.add("a", t);
            clock.advance(Duration::from_secs(9));
            assert_eq!(s.holder("a"), Some(t));
            assert_quiet(&mut rx);
            clock.advance(Duration::from_secs(2));
            // The service expires leases when next asked anything.
            assert_eq!(s.holder("a"), None);
            assert_eq!(next(&mut rx).await, gone(t, LockGone::LeaseLost));
            assert_eq!(
                b.keepalive(l, BOUNDS).await,
                Err(BackendError::LeaseNotFound)
            );
            assert_quiet(&mut rx);
        });
    }

    #[test]
    fn partition_holds_the_report_until_healed() {
        run(async {
            let Watched { s, b, l, mut rx, w } = watched().await;
            let t = lock_watched(&b, l, &*w, ["a", "b", "c"]).await;
            b.partition();
            assert!(s.delete_lock_key("a"));
            assert!(s.delete_lock_key("b"));
            assert_quiet(&mut rx);
            // Removed while held: never reported.
            w.remove(t["b"]);
            // Another link's partition holds nothing of this one.
            s.link().heal();
            assert_quiet(&mut rx);
            b.heal();
            assert_eq!(next(&mut rx).await, gone(t["a"], LockGone::KeyDeleted));
            assert_quiet(&mut rx);
            assert!(s.revoke_lease(l));
            assert_eq!(next(&mut rx).await, gone(t["c"], LockGone::LeaseLost));
            assert_quiet(&mut rx);
        });
    }

    #[test]
    fn drop_of_the_key_watch_unregisters() {
        run(async {
            let Watched { s, b, l, mut rx, w } = watched().await;
            lock_watched(&b, l, &*w, ["a", "b"]).await;
            b.partition();
            assert!(s.delete_lock_key("a"));
            drop(w);
            {
                let st = s.lock();
                assert!(st.watches.is_empty());
                assert!(st.lease_watches.is_empty());
            }
            b.heal();
            assert!(s.delete_lock_key("b"));
            // The registry held the only sender: the channel ends unsent.
            assert_eq!(timeout(WITHIN, rx.recv()).await, Ok(None));
        });
    }

    #[test]
    fn ten_thousand_keys_on_one_lease_are_cheap() {
        run(async {
            const N: usize = 10_000;
            let Watched { s, b, l, mut rx, w } = watched().await;
            let start = std::time::Instant::now();
            let mut tokens = Vec::with_capacity(N);
            for i in 0..N {
                let name = format!("lock-{i}");
                let t = b.lock(&name, l, true).await.unwrap();
                w.add(&name, t);
                tokens.push(t);
            }
            let acquired = start.elapsed();
            for (i, t) in tokens.iter().enumerate().step_by(2) {
                b.unlock(&format!("lock-{i}"), l, Some(*t)).await.unwrap();
            }
            let released = start.elapsed();
            assert!(s.revoke_lease(l));
            // The releases of watched keys, then the rest with the lease.
            for t in tokens.iter().step_by(2) {
                assert_eq!(next(&mut rx).await, gone(*t, LockGone::KeyDeleted));
            }
            let mut lost = 0;
            for t in tokens.iter().skip(1).step_by(2) {
                assert_eq!(next(&mut rx).await, gone(*t, LockGone::LeaseLost));
                lost += 1;
            }
            assert_quiet(&mut rx);
            let total = start.elapsed();
            println!(
                "{N} keys: acquired and watched in {acquired:?}, half released by {released:?}, all reported by {total:?} ({lost} lost with the lease)"
            );
            assert!(total < Duration::from_secs(10), "too slow: {total:?}");
            drop(w);
        });
    }
}
