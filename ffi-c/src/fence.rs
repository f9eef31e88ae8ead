//! The resource side of fencing: a token gate for servers written in C.

use std::ffi::c_char;

use dlock_core::{FenceGate, Stale, Token};

use crate::lk_status::{self, LK_STALE};
use crate::{Fail, Res, arg, boxed, ffi, out, text};

/// Accepts a write only if its token is at least the highest seen for its
/// lock name (atomic; share one gate between threads).
pub struct lk_fence_gate {
    gate: FenceGate,
}

/// An empty gate.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_new(gate_out: *mut *mut lk_fence_gate) -> lk_status {
    ffi!({
        let dest = unsafe { out(gate_out, "gate_out") }?;
        boxed(
            dest,
            lk_fence_gate {
                gate: FenceGate::new(),
            },
        );
        Ok(())
    })
}

/// Frees a gate (NULL: nothing).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_free(gate: *mut lk_fence_gate) {
    ffi!(value { unsafe { crate::free_handle(gate) } })
}

/// What the three admit exports share; `check` is the gate's method for
/// the export's mode. Called inside each export's own `ffi!` boundary.
unsafe fn admit(
    gate: *const lk_fence_gate,
    name: *const c_char,
    token: u64,
    check: fn(&FenceGate, &str, Token) -> Result<(), Stale>,
) -> Res {
    let gate = unsafe { arg(gate, "gate") }?;
    let name = unsafe { text(name, "name") }?;
    check(&gate.gate, name, Token(token)).map_err(|stale| Fail::new(LK_STALE, stale.to_string()))
}

/// Admits a write carrying `token` for the lock `name` (and remembers the
/// token), or refuses it with `LK_STALE` if a higher token was seen: its
/// writer lost the lock.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_admit(
    gate: *const lk_fence_gate,
    name: *const c_char,
    token: u64,
) -> lk_status {
    ffi!({ unsafe { admit(gate, name, token, FenceGate::admit) } })
}

/// Admits a read carrying `token` for the read/write lock `name` (and
/// remembers it) iff it is at least the highest write token admitted,
/// else `LK_STALE`. Readers never refuse each other.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_admit_read(
    gate: *const lk_fence_gate,
    name: *const c_char,
    token: u64,
) -> lk_status {
    ffi!({ unsafe { admit(gate, name, token, FenceGate::admit_read) } })
}

/// Admits a write carrying `token` for the read/write lock `name` iff it
/// is at least the highest write and the highest read token admitted,
/// else `LK_STALE` (`lk_fence_gate_admit` is this).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_admit_write(
    gate: *const lk_fence_gate,
    name: *const c_char,
    token: u64,
) -> lk_status {
    ffi!({ unsafe { admit(gate, name, token, FenceGate::admit_write) } })
}

/// The two watermarks of `name`: the highest write and the highest read
/// token admitted; 0 for a mode with none yet (tokens start at 1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_watermarks(
    gate: *const lk_fence_gate,
    name: *const c_char,
    write_out: *mut u64,
    read_out: *mut u64,
) -> lk_status {
    ffi!({
        let gate = unsafe { arg(gate, "gate") }?;
        let name = unsafe { text(name, "name") }?;
        let write = unsafe { out(write_out, "write_out") }?;
        let read = unsafe { out(read_out, "read_out") }?;
        let (w, r) = gate.gate.watermarks(name);
        *write = w.map_or(0, Token::get);
        *read = r.map_or(0, Token::get);
        Ok(())
    })
}

/// The highest token seen for `name`; 0 if none (tokens start at 1).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lk_fence_gate_highest(
    gate: *const lk_fence_gate,
    name: *const c_char,
    token_out: *mut u64,
) -> lk_status {
    ffi!({
        let gate = unsafe { arg(gate, "gate") }?;
        let name = unsafe { text(name, "name") }?;
        let dest = unsafe { out(token_out, "token_out") }?;
        *dest = gate.gate.highest(name).map_or(0, Token::get);
        Ok(())
    })
}
