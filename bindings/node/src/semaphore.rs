//! Semaphores (docs/design.md §26, issue 29): `NativeSemaphore` converts
//! to the core's `dlock::Semaphore`, which decides everything (the limit,
//! which slot, the wait, the cancel). A slot won is an ordinary
//! [`NativeLock`] on that slot's core lock (its `slot` set).
//!
//! An acquire runs the core's `acquire_async` on the core's driver
//! (`dlock::spawn_then`) and resolves an [`Outcome`]; the slot won waits
//! in its [`NativeSemaphoreAcquisition`] until `take()`. `cancel()` (an
//! aborted signal) drops the core's future on the driver, which is the
//! core's cancel (nothing stays held, even a slot won just then), and
//! drops a slot won but not yet taken.

// napi-derive registers nothing in a test build (clippy --all-targets checks one).
#![cfg_attr(test, allow(dead_code))]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

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
        let sem = self.inner.clone();
        handle.start(env, async move { sem.acquire_async(timeout).await })
    }

    /// Takes a free slot, else `would_block`: the core's
    /// `try_acquire_async`. The slot waits in `handle`, as `acquire`'s.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn try_acquire<'e>(
        &self,
        env: &'e Env,
        handle: &NativeSemaphoreAcquisition,
    ) -> Result<Object<'e>> {
        let sem = self.inner.clone();
        handle.start(env, async move { sem.try_acquire_async().await })
    }
}

/// What an acquire and its cancel share.
#[derive(Default)]
struct Shared {
    started: bool,
    cancelled: bool,
    /// The driver's waker of the acquire, to drop it at the cancel.
    waker: Option<Waker>,
    /// The slot won, until taken.
    won: Option<dlock::Lock>,
}

fn locked(m: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The core's acquire until it is cancelled: then `None`, and the core's
/// future is dropped on the driver (the core's cancel).
struct UntilCancelled<F> {
    future: Pin<Box<F>>,
    shared: Arc<Mutex<Shared>>,
}

impl<F: Future> Future for UntilCancelled<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        {
            let mut s = locked(&self.shared);
            if s.cancelled {
                return Poll::Ready(None);
            }
            s.waker = Some(cx.waker().clone());
        }
        self.future.as_mut().poll(cx).map(Some)
    }
}

/// One semaphore acquire (`sem.acquire(timeout, handle)`): holds the slot
/// won until `take()`; `cancel()` leaves nothing held.
#[napi]
#[derive(Default)]
pub struct NativeSemaphoreAcquisition {
    shared: Arc<Mutex<Shared>>,
}

impl NativeSemaphoreAcquisition {
    fn start<'e>(
        &self,
        env: &'e Env,
        acquire: impl Future<Output = std::result::Result<dlock::Lock, dlock::Error>> + Send + 'static,
    ) -> Result<Object<'e>> {
        if std::mem::replace(&mut locked(&self.shared).started, true) {
            return Err(invalid("this acquisition handle is in use"));
        }
        let (deferred, promise) = env.create_deferred()?;
        let work = UntilCancelled {
            future: Box::pin(acquire),
            shared: self.shared.clone(),
        };
        let shared = self.shared.clone();
        dlock::spawn_then(work, move |got| {
            let r = match got {
                Some(Ok(lock)) => {
                    let mut s = locked(&shared);
                    if s.cancelled {
                        drop(s);
                        // Cancelled as it was won: let the slot go.
                        drop(lock);
                        Err(dlock::Error::Released)
                    } else {
                        s.won = Some(lock);
                        Ok(None)
                    }
                }
                Some(Err(e)) => Err(e),
                None => Err(dlock::Error::Released),
            };
            let outcome = Outcome::of(r);
            deferred.resolve(move |_| Ok(outcome));
        });
        Ok(promise)
    }
}

#[napi]
impl NativeSemaphoreAcquisition {
    #[napi(constructor)]
    pub fn new() -> NativeSemaphoreAcquisition {
        NativeSemaphoreAcquisition::default()
    }

    /// Leaves nothing held by the acquire, whenever called: the core's
    /// future is dropped on the driver (its cancel), a slot won but not
    /// taken is released. Idempotent.
    #[napi]
    pub fn cancel(&self) {
        let (waker, won) = {
            let mut s = locked(&self.shared);
            s.cancelled = true;
            (s.waker.take(), s.won.take())
        };
        if let Some(w) = waker {
            w.wake();
        }
        drop(won);
    }

    /// The slot won, as a lock handle (once; `null` otherwise).
    #[napi]
    pub fn take(&self) -> Option<NativeLock> {
        let won = locked(&self.shared).won.take()?;
        Some(NativeLock::of(LockRef::Lock(Arc::new(won))))
    }
}
