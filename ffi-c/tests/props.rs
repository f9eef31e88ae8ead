//! Bad input through the C ABI, by property (proptest): the exported `lk_`
//! functions of the built `libdlock.so` (opened with `dlopen`, as a C
//! program links it: this crate is a cdylib, no Rust API) are called with
//! random NULLs, lengths, bytes that are not UTF-8, out-of-range numbers,
//! handles after close, from callbacks and from other threads. Every call
//! returns a status; every failure but a permit refusal (which sets no
//! message, as the header says) leaves `lk_last_error` non-empty; nothing
//! crashes or hangs, and the locks and the service agree afterwards.
//!
//! A `test = false` target: scripts/test-c.sh runs it after the release
//! build, on `DLOCK_C_LIB` (target/release/libdlock.so; a cdylib is not
//! built for `cargo test`), then again with libasan preloaded, whose
//! allocator checks every free and reports leaks at exit.
//! `DLOCK_PROPS_CASES` (default 500) cases per property.
#![allow(clippy::missing_safety_doc)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::PathBuf;
use std::ptr::{null, null_mut};
use std::sync::OnceLock;

use proptest::prelude::*;

#[repr(C)]
struct Options {
    version: u32,
    ttl_ms: u64,
    keepalive_interval_ms: u64,
    keepalive_timeout_ms: u64,
    retry_interval_ms: u64,
    margin_ms: u64,
    reacquire: bool,
    endpoints: *const c_char,
    ca_file: *const c_char,
    cert_file: *const c_char,
    key_file: *const c_char,
    user: *const c_char,
    password: *const c_char,
    allow_plaintext_password: bool,
    connect_timeout_ms: u64,
    request_timeout_ms: u64,
    memory: *const c_void,
}

#[repr(C)]
#[derive(Default)]
struct Permit([u64; 4]);

type H = *mut c_void;
type FenceFn = unsafe extern "C" fn(*mut c_void, u64, u64);
type AcquiredFn = unsafe extern "C" fn(*mut c_void, u64);

const OK: i32 = 0;
const STATUS_MAX: i32 = 15;
const IDLE: i32 = 0;
const HOLDING: i32 = 2;
const DRAINING: i32 = 3;

macro_rules! api {
    ($($name:ident: fn($($a:ty),*) $(-> $r:ty)?;)*) => {
        #[allow(non_snake_case, dead_code)]
        struct Api { $($name: unsafe extern "C" fn($($a),*) $(-> $r)?,)* }
        fn load(lib: *mut c_void) -> Api {
            Api { $($name: {
                let name = CString::new(stringify!($name)).unwrap();
                // SAFETY: dlsym on a library we opened; the type is the header's.
                let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
                assert!(!p.is_null(), "{} not exported", stringify!($name));
                // SAFETY: the symbol is that function (include/dlock.h).
                unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($a),*) $(-> $r)?>(p) }
            },)* }
        }
    };
}

api! {
    lk_last_error: fn() -> *const c_char;
    lk_status_name: fn(i32) -> *const c_char;
    lk_state_name: fn(i32) -> *const c_char;
    lk_reason_name: fn(i32) -> *const c_char;
    lk_client_options_init: fn(*mut Options, u32) -> i32;
    lk_client_new: fn(*const Options, *mut H) -> i32;
    lk_client_free: fn(H);
    lk_memory_new: fn(*mut H) -> i32;
    lk_memory_named: fn(*const c_char, *mut H) -> i32;
    lk_memory_free: fn(H);
    lk_memory_holder: fn(H, *const c_char, *mut u64) -> i32;
    lk_memory_delete_lock_key: fn(H, *const c_char) -> i32;
    lk_memory_revoke_lease: fn(H, i64, *mut bool) -> i32;
    lk_memory_get: fn(H, *const u8, usize, *mut u8, usize, *mut usize, *mut bool) -> i32;
    lk_link_delay_keepalive_replies: fn(H, u64) -> i32;
    lk_link_fail_keepalives: fn(H, *const c_char) -> i32;
    lk_link_heal: fn(H) -> i32;
    lk_lock_new: fn(H, *const c_char, *mut H) -> i32;
    lk_lock_name: fn(H) -> *const c_char;
    lk_lock_free: fn(H);
    lk_lock_close: fn(H) -> i32;
    lk_lock_acquire: fn(H, u64, *mut u64) -> i32;
    lk_lock_try_acquire: fn(H, *mut u64) -> i32;
    lk_lock_release: fn(H) -> i32;
    lk_lock_state: fn(H, *mut i32) -> i32;
    lk_lock_token: fn(H, *mut u64) -> i32;
    lk_lock_time_left: fn(H, *mut u64) -> i32;
    lk_lock_deadline: fn(H, *mut u64) -> i32;
    lk_lock_in_flight: fn(H, *mut u64) -> i32;
    lk_set_on_fence: fn(H, Option<FenceFn>, *mut c_void) -> i32;
    lk_set_on_acquired: fn(H, Option<AcquiredFn>, *mut c_void) -> i32;
    lk_permit: fn(H, *mut Permit) -> i32;
    lk_permit_end: fn(*mut Permit);
    lk_permit_valid: fn(*const Permit) -> bool;
    lk_permit_token: fn(*const Permit, *mut u64) -> i32;
    lk_lock_guarded_put: fn(H, u64, *const u8, usize, *const u8, usize) -> i32;
    lk_lock_guarded_delete: fn(H, u64, *const u8, usize) -> i32;
    lk_session_new: fn(H, *const Options, *mut H) -> i32;
    lk_session_lock_new: fn(H, *const c_char, *mut H) -> i32;
    lk_session_close: fn(H) -> i32;
    lk_session_free: fn(H);
    lk_fence_gate_new: fn(*mut H) -> i32;
    lk_fence_gate_free: fn(H);
    lk_fence_gate_admit: fn(H, *const c_char, u64) -> i32;
    lk_fence_gate_highest: fn(H, *const c_char, *mut u64) -> i32;
}

/// The library: `DLOCK_C_LIB`, else target/release/libdlock.so.
fn api() -> &'static Api {
    static API: OnceLock<Api> = OnceLock::new();
    API.get_or_init(|| {
        let path = std::env::var_os("DLOCK_C_LIB").map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libdlock.so"),
            PathBuf::from,
        );
        let c = CString::new(path.to_str().expect("utf-8 path")).unwrap();
        // SAFETY: dlopen of the library under test.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW) };
        assert!(!lib.is_null(), "cannot dlopen {}", path.display());
        load(lib)
    })
}

fn last_error() -> String {
    // SAFETY: never NULL, valid until the next failing call on this thread.
    unsafe { CStr::from_ptr((api().lk_last_error)()) }
        .to_string_lossy()
        .into_owned()
}

/// A status is one of the header's, and a failure says why.
fn check(status: i32, what: &str) -> i32 {
    assert!(
        (0..=STATUS_MAX).contains(&status),
        "{what}: status {status} is none of lk_status"
    );
    if status != OK {
        assert!(
            !last_error().is_empty(),
            "{what}: status {status} and lk_last_error empty"
        );
    }
    status
}

/// As [`check`], for `lk_permit` (refusals set no message).
fn check_permit(status: i32) -> i32 {
    assert!(
        (0..=STATUS_MAX).contains(&status),
        "lk_permit: status {status}"
    );
    status
}

fn cases() -> u32 {
    std::env::var("DLOCK_PROPS_CASES").map_or(500, |s| s.parse().expect("DLOCK_PROPS_CASES"))
}

fn config(n: u32) -> ProptestConfig {
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Random bytes for a C string: NUL-terminated (cut at the first NUL),
/// not always UTF-8, sometimes long; `None` is NULL.
fn c_string() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop::option::weighted(
        0.85,
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(1u8..=255, 1020..1030),
            Just(b"ok".to_vec()),
            Just(vec![0xff, 0xfe]),
            Just(vec![0xed, 0xa0, 0x80]), // an encoded surrogate: not UTF-8
        ],
    )
}

fn to_c(v: &Option<Vec<u8>>) -> Option<CString> {
    v.as_ref().map(|b| {
        let cut: Vec<u8> = b.iter().copied().take_while(|&c| c != 0).collect();
        CString::new(cut).unwrap()
    })
}

fn ptr(c: &Option<CString>) -> *const c_char {
    c.as_ref().map_or(null(), |c| c.as_ptr())
}

fn memory_client(mem: H, ttl_ms: u64) -> H {
    let a = api();
    let mut o: Options = unsafe { std::mem::zeroed() };
    // SAFETY: a valid options struct.
    check(
        unsafe { (a.lk_client_options_init)(&mut o, 1) },
        "options_init",
    );
    o.ttl_ms = ttl_ms;
    o.keepalive_interval_ms = 500;
    o.keepalive_timeout_ms = 200;
    o.retry_interval_ms = 200;
    o.margin_ms = 500;
    // A fence ends the holding (reacquire is on by default).
    o.reacquire = false;
    o.memory = mem;
    let mut c: H = null_mut();
    // SAFETY: valid pointers.
    assert_eq!(
        check(unsafe { (a.lk_client_new)(&o, &mut c) }, "client_new"),
        OK
    );
    c
}

fn state(lock: H) -> i32 {
    let mut s = -1;
    // SAFETY: a live lock handle.
    check(unsafe { (api().lk_lock_state)(lock, &mut s) }, "state");
    s
}

fn token(lock: H) -> Option<u64> {
    let mut t = 0;
    // SAFETY: a live lock handle.
    (unsafe { (api().lk_lock_token)(lock, &mut t) } == OK).then_some(t)
}

fn holder(mem: H, name: &CStr) -> Option<u64> {
    let mut t = 0;
    // SAFETY: live handles.
    (unsafe { (api().lk_memory_holder)(mem, name.as_ptr(), &mut t) } == OK && t != 0).then_some(t)
}

proptest! {
    #![proptest_config(config(cases()))]

    /// Options: any numbers, NULL or odd strings; a client or a status.
    #[test]
    fn client_options(version in prop_oneof![Just(1u32), any::<u32>()],
                      ttl in any::<u64>(), ka in any::<u64>(), kt in any::<u64>(), margin in any::<u64>(),
                      retry in any::<u64>(), endpoints in c_string(), null_opts in any::<bool>()) {
        let a = api();
        let mut o: Options = unsafe { std::mem::zeroed() };
        let init = unsafe { (a.lk_client_options_init)(&mut o, version) };
        check(init, "options_init");
        o.ttl_ms = ttl;
        o.keepalive_interval_ms = ka;
        o.keepalive_timeout_ms = kt;
        o.margin_ms = margin;
        o.retry_interval_ms = retry;
        o.connect_timeout_ms = 1;
        o.request_timeout_ms = 1;
        let ep = to_c(&endpoints);
        // A real endpoint would dial: only strings that fail to parse.
        let dial = ep.as_ref().is_some_and(|e| !e.as_bytes().is_empty() && e.to_str().is_ok_and(|s| s.contains(':')));
        o.endpoints = if dial { null() } else { ptr(&ep) };
        let mut c: H = null_mut();
        let s = check(unsafe { (a.lk_client_new)(if null_opts { null() } else { &o }, &mut c) }, "client_new");
        prop_assert_eq!(s == OK, !c.is_null());
        if s == OK {
            unsafe { (a.lk_client_free)(c) };
        }
        // NULL out pointer: a status, never a write through NULL.
        let s = check(unsafe { (a.lk_client_new)(null(), null_mut()) }, "client_new(NULL out)");
        prop_assert_ne!(s, OK);
    }

    /// Lock names, session options and gate names: bytes of any kind.
    #[test]
    fn names(name in c_string(), gate_name in c_string(), t in any::<u64>()) {
        let a = api();
        let mut mem: H = null_mut();
        check(unsafe { (a.lk_memory_new)(&mut mem) }, "memory_new");
        let c = memory_client(mem, 2000);
        let n = to_c(&name);
        let mut lock: H = null_mut();
        let s = check(unsafe { (a.lk_lock_new)(c, ptr(&n), &mut lock) }, "lock_new");
        if s == OK {
            let back = unsafe { CStr::from_ptr((a.lk_lock_name)(lock)) };
            prop_assert_eq!(Some(back), n.as_deref());
            prop_assert_eq!(state(lock), IDLE);
            unsafe { (a.lk_lock_free)(lock) };
        } else {
            prop_assert!(lock.is_null());
        }
        check(unsafe { (a.lk_lock_new)(null_mut(), ptr(&n), &mut lock) }, "lock_new(NULL client)");
        let mut m2: H = null_mut();
        if check(unsafe { (a.lk_memory_named)(ptr(&n), &mut m2) }, "memory_named") == OK {
            unsafe { (a.lk_memory_free)(m2) };
        }
        let mut g: H = null_mut();
        check(unsafe { (a.lk_fence_gate_new)(&mut g) }, "gate_new");
        let gn = to_c(&gate_name);
        if check(unsafe { (a.lk_fence_gate_admit)(g, ptr(&gn), t) }, "admit") == OK {
            let mut h = 0;
            prop_assert_eq!(check(unsafe { (a.lk_fence_gate_highest)(g, ptr(&gn), &mut h) }, "highest"), OK);
            prop_assert_eq!(h, t);
            if t > 0 {
                prop_assert_eq!(check(unsafe { (a.lk_fence_gate_admit)(g, ptr(&gn), t - 1) }, "admit lower"), 14);
            }
        }
        unsafe { (a.lk_fence_gate_free)(g) };
        unsafe { (a.lk_fence_gate_free)(null_mut()) };
        unsafe { (a.lk_client_free)(c) };
        unsafe { (a.lk_memory_free)(mem) };
    }

    /// Guarded writes: any token, key and value pointers and lengths
    /// (NULL with a length, a length of 0 with a pointer, bytes that are
    /// not UTF-8); committed only with the holding token.
    #[test]
    fn guarded_writes(tok in prop_oneof![Just(None), any::<u64>().prop_map(Some)],
                      key in prop::option::weighted(0.9, prop::collection::vec(any::<u8>(), 0..64)),
                      value in prop::option::weighted(0.9, prop::collection::vec(any::<u8>(), 0..256)),
                      key_len_extra in 0usize..2, delete in any::<bool>()) {
        let a = api();
        let mut mem: H = null_mut();
        check(unsafe { (a.lk_memory_new)(&mut mem) }, "memory_new");
        let c = memory_client(mem, 2000);
        let name = c"props-guarded";
        let mut lock: H = null_mut();
        check(unsafe { (a.lk_lock_new)(c, name.as_ptr(), &mut lock) }, "lock_new");
        let mut held = 0;
        prop_assert_eq!(check(unsafe { (a.lk_lock_acquire)(lock, 5000, &mut held) }, "acquire"), OK);
        let t = tok.unwrap_or(held);
        // A NULL key is given a length only when it has one (never a
        // length past the buffer: that would be the caller's overflow).
        let (kp, kl) = key.as_ref().map_or((null(), key_len_extra), |k| (k.as_ptr(), k.len()));
        let (vp, vl) = value.as_ref().map_or((null(), 0), |v| (v.as_ptr(), v.len()));
        let s = if delete {
            check(unsafe { (a.lk_lock_guarded_delete)(lock, t, kp, kl) }, "guarded_delete")
        } else {
            check(unsafe { (a.lk_lock_guarded_put)(lock, t, kp, kl, vp, vl) }, "guarded_put")
        };
        if s == OK {
            prop_assert_eq!(t, held);
            let k = key.clone().unwrap_or_default();
            let mut buf = vec![0u8; 300];
            let (mut len, mut found) = (0usize, false);
            check(unsafe { (a.lk_memory_get)(mem, k.as_ptr(), k.len(), buf.as_mut_ptr(), buf.len(), &mut len, &mut found) }, "get");
            if delete {
                prop_assert!(!found);
            } else {
                prop_assert!(found);
                prop_assert_eq!(&buf[..len], value.as_deref().unwrap_or_default());
            }
        } else if s == 2 {
            prop_assert_ne!(t, held);
        }
        prop_assert_eq!(state(lock), HOLDING);
        prop_assert_eq!(token(lock), Some(held));
        prop_assert_eq!(holder(mem, name), Some(held));
        // memory_get with odd pointers and capacities.
        let (mut len, mut found) = (0usize, false);
        check(unsafe { (a.lk_memory_get)(mem, kp, kl, null_mut(), 0, &mut len, &mut found) }, "get(cap 0)");
        check(unsafe { (a.lk_memory_get)(mem, kp, kl, null_mut(), 0, null_mut(), null_mut()) }, "get(NULL outs)");
        unsafe { (a.lk_lock_free)(lock) };
        // Freeing a held lock releases it, without waiting for the delete.
        prop_assert!(released(mem, name), "a freed lock still holds 5 s later");
        unsafe { (a.lk_client_free)(c) };
        unsafe { (a.lk_memory_free)(mem) };
    }

    /// Two locks of one name, any calls in any order (also after close,
    /// NULL out pointers, from the callbacks and from another thread):
    /// at most one holds, its token is the service's.
    #[test]
    fn contenders(ops in prop::collection::vec((0usize..2, 0u8..12, any::<u64>()), 0..30)) {
        let a = api();
        let mut mem: H = null_mut();
        check(unsafe { (a.lk_memory_new)(&mut mem) }, "memory_new");
        let c = memory_client(mem, 2000);
        let name = c"contended";
        let mut locks = [null_mut(); 2];
        for l in &mut locks {
            check(unsafe { (a.lk_lock_new)(c, name.as_ptr(), l) }, "lock_new");
            check(unsafe { (a.lk_set_on_fence)(*l, Some(on_fence), *l) }, "set_on_fence");
            check(unsafe { (a.lk_set_on_acquired)(*l, Some(on_acquired), *l) }, "set_on_acquired");
        }
        let mut permits: [Option<Permit>; 2] = [None, None];
        for (i, op, n) in ops {
            let l = locks[i];
            let mut t = 0u64;
            match op {
                0 => { check(unsafe { (a.lk_lock_acquire)(l, n % 30, &mut t) }, "acquire"); }
                1 => { check(unsafe { (a.lk_lock_try_acquire)(l, if n % 2 == 0 { &mut t } else { null_mut() }) }, "try_acquire"); }
                2 => { check(unsafe { (a.lk_lock_release)(l) }, "release"); }
                3 => { check(unsafe { (a.lk_lock_close)(l) }, "close"); }
                4 => {
                    let mut p = Permit::default();
                    if check_permit(unsafe { (a.lk_permit)(l, &mut p) }) == OK {
                        let mut pt = 0;
                        prop_assert_eq!(check(unsafe { (a.lk_permit_token)(&p, &mut pt) }, "permit_token"), OK);
                        prop_assert_eq!(Some(pt), token(l));
                        if let Some(mut old) = permits[i].replace(p) {
                            unsafe { (a.lk_permit_end)(&mut old) };
                        }
                    }
                }
                5 => {
                    if let Some(mut p) = permits[i].take() {
                        unsafe { (a.lk_permit_end)(&mut p) };
                        unsafe { (a.lk_permit_end)(&mut p) };
                        let valid = unsafe { (a.lk_permit_valid)(&p) };
                        prop_assert!(!valid);
                    }
                }
                6 => { check(unsafe { (a.lk_lock_guarded_put)(l, n, b"k".as_ptr(), 1, b"v".as_ptr(), 1) }, "guarded_put"); }
                7 => {
                    check(unsafe { (a.lk_memory_delete_lock_key)(mem, name.as_ptr()) }, "delete_lock_key");
                    // The holder hears of it on the driver: wait for its fence.
                    settle(&locks);
                }
                8 => {
                    // NULL out pointers and NULL handles.
                    for s in [
                        unsafe { (a.lk_lock_state)(l, null_mut()) },
                        unsafe { (a.lk_lock_token)(l, null_mut()) },
                        unsafe { (a.lk_lock_time_left)(l, null_mut()) },
                        unsafe { (a.lk_lock_deadline)(l, null_mut()) },
                        unsafe { (a.lk_lock_in_flight)(l, null_mut()) },
                        unsafe { (a.lk_permit)(l, null_mut()) },
                        unsafe { (a.lk_lock_acquire)(null_mut(), 0, &mut t) },
                        unsafe { (a.lk_lock_release)(null_mut()) },
                        unsafe { (a.lk_permit_token)(null(), &mut t) },
                    ] {
                        prop_assert_eq!(check(s, "NULL argument"), 10);
                    }
                    unsafe { (a.lk_permit_end)(null_mut()) };
                    let valid = unsafe { (a.lk_permit_valid)(null()) };
                    prop_assert!(!valid);
                }
                9 => {
                    // From another thread, and the reading calls there.
                    let h = l as usize;
                    std::thread::spawn(move || {
                        let a = api();
                        let l = h as H;
                        let mut t = 0;
                        check(unsafe { (a.lk_lock_try_acquire)(l, &mut t) }, "try_acquire (thread)");
                        let mut p = Permit::default();
                        if check_permit(unsafe { (a.lk_permit)(l, &mut p) }) == OK {
                            unsafe { (a.lk_permit_end)(&mut p) };
                        }
                        check(unsafe { (a.lk_lock_release)(l) }, "release (thread)");
                    }).join().expect("a call from another thread panicked");
                }
                10 => {
                    let mut found = false;
                    check(unsafe { (a.lk_memory_revoke_lease)(mem, n as i64, &mut found) }, "revoke_lease");
                }
                _ => {
                    // Reasons, states and statuses of any value.
                    for f in [a.lk_status_name, a.lk_state_name, a.lk_reason_name] {
                        let s = unsafe { CStr::from_ptr(f(n as i32)) };
                        prop_assert!(!s.to_bytes().is_empty());
                    }
                }
            }
            let states = [state(locks[0]), state(locks[1])];
            let holding: Vec<usize> = (0..2).filter(|&k| matches!(states[k], HOLDING | DRAINING)).collect();
            prop_assert!(holding.len() <= 1, "both hold: {:?}", states);
            for (k, &l) in locks.iter().enumerate() {
                prop_assert_eq!(token(l).is_some(), holding.contains(&k), "state {} token {:?}", states[k], token(l));
            }
            if let Some(&k) = holding.first() {
                let h = holder(mem, name);
                prop_assert!(h.is_none() || h == token(locks[k]), "service {:?}, lock {:?}", h, token(locks[k]));
            }
        }
        for (k, p) in permits.iter_mut().enumerate() {
            if let Some(p) = p.as_mut() {
                unsafe { (a.lk_permit_end)(p) };
            }
            let _ = k;
        }
        for l in locks {
            check(unsafe { (a.lk_lock_close)(l) }, "close");
            // After close: every call answers; an acquire may take the
            // lock again (the handle stays valid), and then it agrees.
            let mut t = 0;
            let st = check(unsafe { (a.lk_lock_acquire)(l, 0, &mut t) }, "acquire after close");
            if st == OK {
                prop_assert_eq!(token(l), Some(t));
                prop_assert_eq!(holder(mem, name), Some(t));
                check(unsafe { (a.lk_lock_release)(l) }, "release after close");
            }
            prop_assert_eq!(token(l), None);
            unsafe { (a.lk_lock_free)(l) };
        }
        prop_assert_eq!(holder(mem, name), None);
        unsafe { (a.lk_client_free)(c) };
        unsafe { (a.lk_memory_free)(mem) };
    }
}

/// Whether the service lets go of `name` within 5 s.
fn released(mem: H, name: &CStr) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while holder(mem, name).is_some() {
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// Waits (up to 5 s) until no lock is Holding or Draining: after the lock
/// key was deleted, the holder's fence comes from the driver thread.
fn settle(locks: &[H]) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while locks
        .iter()
        .any(|&l| matches!(state(l), HOLDING | DRAINING))
    {
        assert!(
            std::time::Instant::now() < end,
            "no fence 5 s after the lock key was deleted"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Callbacks call back into the library: reads, a permit taken and ended.
unsafe extern "C" fn on_fence(lock: *mut c_void, _token: u64, _in_flight: u64) {
    reenter(lock);
}

unsafe extern "C" fn on_acquired(lock: *mut c_void, _token: u64) {
    reenter(lock);
}

fn reenter(lock: H) {
    let a = api();
    let (mut s, mut t) = (0, 0);
    check(
        unsafe { (a.lk_lock_state)(lock, &mut s) },
        "state (callback)",
    );
    unsafe { (a.lk_lock_token)(lock, &mut t) };
    let mut p = Permit::default();
    if check_permit(unsafe { (a.lk_permit)(lock, &mut p) }) == OK {
        unsafe { (a.lk_permit_end)(&mut p) };
    }
}
