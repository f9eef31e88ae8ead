//! Locks that survive a panic elsewhere: a callback that panicked while a
//! guard was held must not take the lock state down with it (the data
//! behind every mutex here stays consistent across a panic).

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Locks `m`, taking the guard back from a poisoned mutex.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv`, taking the guard back from a poisoned mutex.
pub(crate) fn wait<'a, T>(cv: &Condvar, g: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(g).unwrap_or_else(|e| e.into_inner())
}

/// Waits on `cv` at most `t`, taking the guard back from a poisoned mutex.
pub(crate) fn wait_timeout<'a, T>(
    cv: &Condvar,
    g: MutexGuard<'a, T>,
    t: Duration,
) -> MutexGuard<'a, T> {
    cv.wait_timeout(g, t).unwrap_or_else(|e| e.into_inner()).0
}
