//! Semaphores (docs/design.md §26, issue 29): `NativeSemaphore` converts
//! to the core's `dlock::Semaphore`, which decides everything (the limit,
//! which slot, the wait, the cancel). A slot won is an ordinary
//! [`NativeLock`] on that slot's core lock (its `slot` set).
//!
//! An acquire is the core's completion form (`Semaphore::acquire_then`)
//! and resolves an [`Outcome`]; the slot won waits in the core's handle
//! until `take()`. `cancel()` (an aborted signal) is the core's cancel:
//! nothing stays held, even a slot won just then.

// napi-derive registers nothing in a test build (clippy --all-targets checks one).
#![cfg_attr(test, allow(dead_code))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::election::LockRef;
use crate::{NativeClient, NativeLock, NativeSession, Outcome, invalid, ms, thrown};

/// A counting semaphore (`session.semaphore(name, limit)`).
#[napi]
pub struct NativeSemaphore {
    inner: dlock::Semaphore,
}

/// A limit as the core takes it: a whole number (the core decides its
/// range; one beyond `u32` is refused as over the maximum).
fn limit_of(limit: f64) -> Result<u32> {
    if !(limit.is_finite() && limit.fract() == 0.0 && limit >= 0.0) {
        return Err(invalid(format!(
            "a semaphore limit is a whole number, got {limit}"
        )));
    }
    Ok(limit.min(f64::from(u32::MAX)) as u32)
}

#[napi]
impl NativeSemaphore {
    /// The semaphore `name` of `limit` slots on `session`: the core
    /// records the limit (first handle) or compares it (`invalid_argument`
    /// naming both). Blocks for that one request.
    #[napi(factory)]
    pub fn of_session(
        session: &NativeSession,
        name: String,
        limit: f64,
    ) -> Result<NativeSemaphore> {
        let limit = limit_of(limit)?;
        let inner = session.inner.semaphore(&name, limit).map_err(thrown)?;
        Ok(NativeSemaphore { inner })
    }

    /// [`NativeSemaphore::of_session`] on the client's default session.
    #[napi(factory)]
    pub fn of_client(client: &NativeClient, name: String, limit: f64) -> Result<NativeSemaphore> {
        let limit = limit_of(limit)?;
        let inner = client.inner.semaphore(&name, limit).map_err(thrown)?;
        Ok(NativeSemaphore { inner })
    }

    #[napi(getter)]
    pub fn name(&self) -> String {
        self.inner.name().to_string()
    }

    #[napi(getter)]
    pub fn limit(&self) -> u32 {
        self.inner.limit()
    }

    /// Takes a slot, waiting up to `timeout` ms (`null`: as long as it
    /// takes; 0: one try): the core's `acquire_async`. The slot won waits
    /// in `handle` (`take()`); `handle.cancel()` leaves nothing held.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn acquire<'e>(
        &self,
        env: &'e Env,
        timeout: Option<f64>,
        handle: &NativeSemaphoreAcquisition,
    ) -> Result<Object<'e>> {
        let timeout = timeout.map(|t| ms("timeout", t)).transpose()?;
        handle.start(env, &self.inner, timeout)
    }

    /// Takes a free slot, else `would_block`: the core's
    /// `try_acquire_async`. The slot waits in `handle`, as `acquire`'s.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn try_acquire<'e>(
        &self,
        env: &'e Env,
        handle: &NativeSemaphoreAcquisition,
    ) -> Result<Object<'e>> {
        handle.start(env, &self.inner, Some(std::time::Duration::ZERO))
    }
}

/// One semaphore acquire (`sem.acquire(timeout, handle)`): the core's
/// `SemaphoreAcquisition`, made at the start; a cancel before it is kept
/// for it.
#[napi]
#[derive(Default)]
pub struct NativeSemaphoreAcquisition {
    started: Mutex<Option<dlock::SemaphoreAcquisition>>,
    cancelled: AtomicBool,
}

impl NativeSemaphoreAcquisition {
    fn start<'e>(
        &self,
        env: &'e Env,
        sem: &dlock::Semaphore,
        timeout: Option<std::time::Duration>,
    ) -> Result<Object<'e>> {
        let mut started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        if started.is_some() {
            return Err(invalid("this acquisition handle is in use"));
        }
        let (deferred, promise) = env.create_deferred()?;
        let acq = sem.acquire_then(timeout, move |r| {
            let outcome = Outcome::of(r.map(|()| None));
            deferred.resolve(move |_| Ok(outcome));
        });
        if self.cancelled.load(Ordering::SeqCst) {
            acq.cancel();
        }
        *started = Some(acq);
        Ok(promise)
    }

    fn started(&self) -> Option<dlock::SemaphoreAcquisition> {
        self.started
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[napi]
impl NativeSemaphoreAcquisition {
    #[napi(constructor)]
    pub fn new() -> NativeSemaphoreAcquisition {
        NativeSemaphoreAcquisition::default()
    }

    /// Leaves nothing held by the acquire, whenever called (the core's
    /// `SemaphoreAcquisition::cancel`). Idempotent.
    #[napi]
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
        if let Some(a) = self.started() {
            a.cancel();
        }
    }

    /// The slot won, as a lock handle (once; `null` otherwise).
    #[napi]
    pub fn take(&self) -> Option<NativeLock> {
        let won = self.started()?.take()?;
        Some(NativeLock::of(LockRef::Lock(Arc::new(won))))
    }
}
