//! The pump's backend calls: each request of the machine runs as a task of
//! its own (a hung request never delays the machine's timers) and reports
//! back as an event; guarded writes and proclaims, checked by the machine
//! first, are decided atomically by the service. The key watch of the
//! current lease lives here too.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tracing::Instrument;

use super::SessionTask;
use super::command::{Call, Reply, Write};
use super::runtime::runtime;
use crate::Error;
use crate::backend::BackendError;
use crate::clock::Instant;
use crate::machine::{Bounds, Event, LeaseId, LockId, ReqId, Request, Token};

impl SessionTask {
    pub(super) fn request(&mut self, r: Request) {
        match r {
            Request::Grant { req, ttl, bounds } => self.grant(req, ttl, bounds),
            Request::Lock {
                req,
                lock,
                lease,
                wait,
            } => self.lock(req, lock, lease, wait),
            Request::Unlock {
                req,
                lock,
                lease,
                token,
            } => self.unlock(req, lock, lease, token),
            Request::Keepalive { req, lease, bounds } => self.keepalive(req, lease, bounds),
            Request::Revoke { lease } => self.revoke(lease),
            Request::Abandon { req } => {
                if let Some(call) = self.calls.remove(&Call::Req(req)) {
                    call.abort();
                }
            }
        }
    }

    /// Runs one backend call as its own task (a hung request never delays
    /// the machine's timers) and feeds its reply back; a call of the same
    /// name still in flight (an earlier try) is dropped.
    pub(super) fn spawn_call(
        &mut self,
        call: Call,
        reply: impl Future<Output = Event> + Send + 'static,
    ) {
        let tx = self.replies_tx.clone();
        let task = runtime().spawn(
            async move {
                let _ = tx.send((Some(call), reply.await));
            }
            .instrument(self.span.clone()),
        );
        if let Some(earlier) = self.calls.insert(call, task.abort_handle()) {
            earlier.abort();
        }
    }

    pub(super) fn grant(&mut self, req: ReqId, ttl: Duration, bounds: Bounds) {
        let (b, identity) = (self.backend.clone(), self.identity.clone());
        self.spawn_call(Call::Req(req), async move {
            match b.grant(ttl, bounds, identity.as_deref()).await {
                Ok(g) => Event::LeaseGranted {
                    req,
                    lease: g.lease,
                    ttl: g.ttl,
                },
                Err(e) => {
                    tracing::debug!(error = %e, "lease grant failed");
                    let error = e.to_string();
                    Event::GrantFailed { req, error }
                }
            }
        });
    }

    pub(super) fn keepalive(&mut self, req: ReqId, lease: LeaseId, bounds: Bounds) {
        let (b, clock) = (self.backend.clone(), self.clock.clone());
        let shared = self.shared.clone();
        shared.keepalives.fetch_add(1, Relaxed);
        self.spawn_call(Call::Req(req), async move {
            let sent = clock.now();
            match b.keepalive(lease, bounds).await {
                Ok(ttl) => {
                    let rtt = clock.now().saturating_since(sent);
                    let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
                    shared.last_rtt_ns.store(ns.max(1), Relaxed);
                    shared.metrics.keepalive_rtt.observe(rtt);
                    shared.metrics.keepalives_ok.fetch_add(1, Relaxed);
                    Event::KeepaliveConfirmed { req, ttl }
                }
                Err(BackendError::LeaseNotFound) => {
                    shared.metrics.keepalives_lease_lost.fetch_add(1, Relaxed);
                    Event::LeaseLost { lease }
                }
                Err(e) => {
                    shared.metrics.keepalives_failed.fetch_add(1, Relaxed);
                    tracing::debug!(error = %e, "keepalive failed");
                    Event::KeepaliveFailed { req }
                }
            }
        });
    }

    pub(super) fn lock(&mut self, req: ReqId, lock: LockId, lease: LeaseId, wait: bool) {
        let Some(name) = self.machine.name(lock) else {
            return;
        };
        let b = self.backend.clone();
        let entry = self.locks.get(&lock);
        let value = entry
            .and_then(|e| e.candidate.as_ref())
            .map(|v| crate::sync::lock(v).clone());
        // A read/write holder's mode, read at each acquisition: a
        // downgraded holder reacquires as a reader.
        let mode = entry.and_then(|e| e.gate.metrics.mode());
        self.spawn_call(Call::Req(req), async move {
            let locked = match (&value, mode) {
                (Some(v), _) => b.campaign(&name, lease, v, wait).await,
                (None, Some(mode)) => b.lock_rw(&name, lease, mode, wait).await,
                (None, None) => b.lock(&name, lease, wait).await,
            };
            match locked {
                Ok(token) => Event::Locked {
                    req,
                    lock,
                    lease,
                    token,
                },
                Err(BackendError::LeaseNotFound) => Event::LeaseLost { lease },
                Err(BackendError::TooLarge(error)) => Event::LockRefused { req, lock, error },
                Err(e) => Event::LockFailed {
                    req,
                    lock,
                    busy: e == BackendError::Busy,
                    error: e.to_string(),
                },
            }
        });
    }

    /// One try of deleting the key of `lock` (the machine tries again until
    /// one is answered).
    pub(super) fn unlock(
        &mut self,
        req: ReqId,
        lock: LockId,
        lease: LeaseId,
        token: Option<Token>,
    ) {
        // A stray reply's delete names an older token: the current one
        // stays watched.
        if token.is_none() || self.locks.get(&lock).is_some_and(|e| e.watched == token) {
            self.unwatch(lock);
        }
        let Some(name) = self.machine.name(lock) else {
            return;
        };
        let b = self.backend.clone();
        self.spawn_call(Call::Req(req), async move {
            match b.unlock(&name, lease, token).await {
                Ok(()) | Err(BackendError::LeaseNotFound) => Event::Unlocked { req, lock },
                Err(e) => {
                    tracing::debug!(lock = %name, error = %e, "unlock failed; trying again");
                    Event::UnlockFailed { req }
                }
            }
        });
    }

    /// One try of revoking `lease` (the machine tries again until one is
    /// answered).
    pub(super) fn revoke(&mut self, lease: LeaseId) {
        if self.watch.as_ref().is_some_and(|(l, _)| *l == lease) {
            self.watch = None;
        }
        // A held revoke let go: its dropped locks may be done.
        self.touched.extend(self.dropped.iter().copied());
        let b = self.backend.clone();
        self.spawn_call(Call::Revoke(lease), async move {
            match b.revoke(lease).await {
                Ok(()) | Err(BackendError::LeaseNotFound) => Event::Revoked { lease },
                Err(e) => {
                    tracing::debug!(lease, error = %e, "revoke failed; trying again");
                    Event::RevokeFailed { lease }
                }
            }
        });
    }

    pub(super) fn unwatch(&mut self, lock: LockId) {
        if let Some(e) = self.locks.get_mut(&lock)
            && let Some(t) = e.watched.take()
            && let Some((_, w)) = &self.watch
        {
            w.remove(t);
        }
    }

    /// Watches the key of `lock`, held with `token` under the current lease.
    pub(super) fn watch_key(&mut self, lock: LockId, token: Token) {
        let Some(lease) = self.machine.lease() else {
            return;
        };
        if self.watch.as_ref().is_none_or(|(l, _)| *l != lease) {
            let (bounds, gone) = (self.machine.bounds(), self.gone_tx.clone());
            self.watch = Some((lease, self.backend.watch_keys(lease, bounds, gone)));
            self.span.record("lease", lease);
        }
        let Some(e) = self.locks.get_mut(&lock) else {
            return;
        };
        e.watched = Some(token);
        if let (Some((_, w)), Some(name)) = (&self.watch, self.machine.name(lock)) {
            w.add(&name, token);
        }
    }

    /// A guarded write: the machine says whether `token` is the one `lock`
    /// holds (and under which lease); the service then decides atomically.
    pub(super) fn write(&mut self, now: Instant, lock: LockId, w: Write) {
        let (Some(lease), Some(name)) = (
            self.machine.write_lease(now, lock, w.token),
            self.machine.name(lock),
        ) else {
            w.reply.send(Err(Error::Fenced(w.token.get())));
            return;
        };
        let (b, ttl) = (self.backend.clone(), self.ttl);
        runtime().spawn(
            async move {
                let write = b.guarded_write(&name, lease, w.token, &w.key, w.value.as_deref());
                let r = match tokio::time::timeout(ttl, write).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(BackendError::Fenced)) => Err(Error::Fenced(w.token.get())),
                    Ok(Err(BackendError::TooLarge(m))) => Err(Error::InvalidArgument(format!(
                        "guarded write: the service refused it as too large (nothing written): {m}"
                    ))),
                    Ok(Err(e)) => Err(Error::Backend(format!(
                        "guarded write: {e} (the outcome is unknown: it may have committed)"
                    ))),
                    Err(_) => Err(Error::Backend(
                        "guarded write: no answer within the TTL (the outcome is unknown: it may have committed)"
                            .into(),
                    )),
                };
                w.reply.send(r);
            }
            .instrument(self.span.clone()),
        );
    }

    /// A proclaim: the machine says whether `token` is held (and under
    /// which lease); the service then decides atomically.
    pub(super) fn proclaim(
        &mut self,
        now: Instant,
        lock: LockId,
        token: Token,
        value: Vec<u8>,
        reply: Reply<Result<(), Error>>,
    ) {
        let candidate = self.locks.get(&lock).and_then(|e| e.candidate.clone());
        self.put_value(now, lock, token, value, "proclaim", reply, move |value| {
            if let Some(c) = candidate {
                *crate::sync::lock(&c) = value;
            }
        });
    }

    /// A downgrade (write → read): the holder's key gets the read marker,
    /// as a proclaim puts a value, keeping the key and its token; then the
    /// handle is a reader (a reacquisition after a fence queues as one).
    pub(super) fn downgrade(
        &mut self,
        now: Instant,
        lock: LockId,
        token: Token,
        reply: Reply<Result<(), Error>>,
    ) {
        let Some(gate) = self
            .locks
            .get(&lock)
            .filter(|e| e.gate.metrics.mode().is_some())
            .map(|e| e.gate.clone())
        else {
            return reply.send(Err(Error::InvalidArgument(
                "downgrade: not a read/write lock's holder".into(),
            )));
        };
        let value = crate::mode::READ_MARKER.to_vec();
        self.put_value(now, lock, token, value, "downgrade", reply, move |_| {
            gate.metrics.set_mode(crate::mode::Mode::Read);
        });
    }

    /// Puts `value` in the key held with `token` ([`crate::Backend::proclaim`]),
    /// then `done(value)` once the service committed it.
    #[allow(clippy::too_many_arguments)]
    fn put_value(
        &mut self,
        now: Instant,
        lock: LockId,
        token: Token,
        value: Vec<u8>,
        what: &'static str,
        reply: Reply<Result<(), Error>>,
        done: impl FnOnce(Vec<u8>) + Send + 'static,
    ) {
        let (Some(lease), Some(name)) = (
            self.machine.write_lease(now, lock, token),
            self.machine.name(lock),
        ) else {
            let error = match self.machine.state(lock) {
                crate::State::Fenced | crate::State::Reacquiring => Error::Fenced(token.get()),
                _ => Error::NotHeld,
            };
            reply.send(Err(error));
            return;
        };
        let (b, ttl) = (self.backend.clone(), self.ttl);
        runtime().spawn(
            async move {
                let r = match tokio::time::timeout(ttl, b.proclaim(&name, lease, token, &value))
                    .await
                {
                    Ok(Ok(())) => {
                        done(value);
                        Ok(())
                    }
                    Ok(Err(BackendError::Fenced)) => Err(Error::Fenced(token.get())),
                    Ok(Err(BackendError::TooLarge(m))) => Err(Error::InvalidArgument(format!(
                        "{what}: the service refused it as too large (nothing written): {m}"
                    ))),
                    Ok(Err(e)) => Err(Error::Backend(format!(
                        "{what}: {e} (the outcome is unknown: it may have committed)"
                    ))),
                    Err(_) => Err(Error::Backend(format!(
                        "{what}: no answer within the TTL (the outcome is unknown)"
                    ))),
                };
                reply.send(r);
            }
            .instrument(self.span.clone()),
        );
    }
}
