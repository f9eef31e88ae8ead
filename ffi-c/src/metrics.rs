//! Metrics for C and C++ services (issue 22): the core's Prometheus text,
//! so no Prometheus library is needed, and the health check.

use std::time::Duration;

use crate::client::lk_client;
use crate::lock::lk_lock;
use crate::{Fail, arg, ffi, out};

/// Renders every session and lock of `client` in the Prometheus text
/// exposition format (docs/metrics.md; per-lock series capped at 100, the
/// rest folded into `lock="_other"`). `*len_out` is the text's length; the
/// first `min(len, cap)` bytes are copied to `buf` (NULL when `cap` is 0;
/// call with cap 0 to learn the length; no NUL is written). `*len_out >
/// cap`: the copy was cut short; call again with a larger buffer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_client_metrics_text(
    client: *const lk_client,
    buf: *mut u8,
    cap: usize,
    len_out: *mut usize,
) -> crate::lk_status {
    ffi!({
        let client = unsafe { arg(client, "client") }?;
        if buf.is_null() && cap > 0 {
            return Err(Fail::null("buf"));
        }
        let len = unsafe { out(len_out, "len_out") }?;
        let text = client.client.snapshot().to_text();
        let n = text.len().min(cap);
        if n > 0 {
            // SAFETY: `cap` writable bytes at `buf`, not overlapping `text`.
            unsafe { std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n) };
        }
        *len = text.len();
        Ok(())
    })
}

/// For a health endpoint: `*healthy_out` is false once the lock is still
/// holding or draining more than `max_overdue_ms` past its deadline (the
/// fence that was due did not happen); a lock not held is healthy.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_lock_healthy(
    lock: *const lk_lock,
    max_overdue_ms: u64,
    healthy_out: *mut bool,
) -> crate::lk_status {
    crate::getter!(lock, healthy_out =>
        lock.lock.healthy(Duration::from_millis(max_overdue_ms)))
}
