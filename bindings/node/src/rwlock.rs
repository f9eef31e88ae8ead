//! Read/write locks (docs/design.md §27, issue 30): `NativeRwLock`
//! converts to the core's `dlock::RwLock`, which decides everything. Its
//! reader and writer are ordinary [`NativeLock`]s on the core's locks (with
//! their `mode`), not acquired yet.

// napi-derive registers nothing in a test build (clippy --all-targets checks one).
#![cfg_attr(test, allow(dead_code))]

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::election::LockRef;
use crate::{NativeClient, NativeLock, NativeSession, thrown};

/// A read/write lock (`session.rwlock(name)`); sends nothing itself.
#[napi]
pub struct NativeRwLock {
    inner: dlock::RwLock,
}

#[napi]
impl NativeRwLock {
    /// The read/write lock `name` on `session`.
    #[napi(factory)]
    pub fn of_session(session: &NativeSession, name: String) -> Result<NativeRwLock> {
        let inner = session.inner.rwlock(&name).map_err(thrown)?;
        Ok(NativeRwLock { inner })
    }

    /// [`NativeRwLock::of_session`] on the client's default session.
    #[napi(factory)]
    pub fn of_client(client: &NativeClient, name: String) -> Result<NativeRwLock> {
        let inner = client.inner.rwlock(&name).map_err(thrown)?;
        Ok(NativeRwLock { inner })
    }

    #[napi(getter)]
    pub fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// A new reader, not acquired yet.
    #[napi]
    pub fn reader(&self) -> Result<NativeLock> {
        let lock = self.inner.read().map_err(thrown)?;
        Ok(NativeLock::of(LockRef::Lock(Arc::new(lock))))
    }

    /// A new writer, not acquired yet.
    #[napi]
    pub fn writer(&self) -> Result<NativeLock> {
        let lock = self.inner.write().map_err(thrown)?;
        Ok(NativeLock::of(LockRef::Lock(Arc::new(lock))))
    }
}
