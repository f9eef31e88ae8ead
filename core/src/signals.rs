//! Stop signals (issue 32, item 8): a process stopped by SIGINT or SIGTERM
//! releases what it holds within one keepalive timeout, as an exit does
//! (docs/design.md §10), in every face, without taking the signal from the
//! application.
//!
//! The core installs one handler per stop signal, once, when the first
//! session starts, and only over a disposition that would end the process:
//!
//! - the default (`SIG_DFL`: C programs, Python's SIGTERM): release, then
//!   the default disposition again and the signal re-raised, so the
//!   process dies of it (its exit status says so);
//! - a handler registered with `SA_RESETHAND` (a one-shot hook before the
//!   default, such as Node's own, which restores the terminal and
//!   re-raises): release, then that handler, with the default disposition
//!   in place as `SA_RESETHAND` would have left it;
//! - any other handler (the application's, Python's SIGINT handler that
//!   raises `KeyboardInterrupt`, a handler library's): only that handler,
//!   called in turn: the application decides, and its exit path releases
//!   (Python's `atexit`, Node's `exit`, C's `lk_shutdown`);
//! - ignored (`SIG_IGN`): left alone.
//!
//! A handler installed after dlock's replaces it (the application decides);
//! one that chains to the previous handler (signal-hook, tokio) finds
//! dlock's no longer on top and dlock's then only passes the call on.
//!
//! The handler does only async-signal-safe work: it wakes the `dlock-stop`
//! thread through a pipe, which runs [`crate::shutdown`], and waits for its
//! answer with `poll`, bounded by the longest keepalive timeout of the
//! sessions plus [`SLACK`]. dlock's own threads block the stop signals, so
//! the handler never runs on the driver it waits for.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::SeqCst};
use std::time::Duration;

/// What the handler's wait may take beyond the longest keepalive timeout:
/// waking the thread, and the answer of a shutdown that finished in time.
pub const SLACK: Duration = Duration::from_millis(500);

/// The signals handled.
const STOP: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

/// The longest keepalive timeout of the sessions started, in ms.
static BOUND_MS: AtomicU64 = AtomicU64::new(0);
/// The pipe that wakes the `dlock-stop` thread (write end) and the one it
/// answers on (read end), valid in fork generation [`PIPES_OF`].
static WAKE: AtomicI32 = AtomicI32::new(-1);
static DONE: AtomicI32 = AtomicI32::new(-1);
static PIPES_OF: AtomicU64 = AtomicU64::new(u64::MAX);

/// The dispositions found before dlock's, per signal of [`STOP`]; written
/// once before dlock's handler is installed, read by the handler only.
struct Previous(std::cell::UnsafeCell<[Option<libc::sigaction>; 2]>);
// SAFETY: written once under `INSTALL` before any handler can read it.
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(std::cell::UnsafeCell::new([None, None]));

/// Blocks the stop signals on the calling thread (dlock's own threads):
/// the handler never runs there.
pub(crate) fn block_stop() {
    // SAFETY: plain libc calls on a local, initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in STOP {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Called when a session starts: installs the handlers (once per process)
/// and the `dlock-stop` thread (once per fork generation), and raises the
/// wait bound to `keepalive_timeout`.
pub(crate) fn install(keepalive_timeout: Duration) {
    let ms = u64::try_from(keepalive_timeout.as_millis()).unwrap_or(u64::MAX);
    BOUND_MS.fetch_max(ms, SeqCst);
    static THREAD: crate::fork::PerFork<()> = crate::fork::PerFork::new();
    THREAD.get(|| ((), ()), |()| start_thread());
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        for (i, sig) in STOP.into_iter().enumerate() {
            // SAFETY: sigaction on a zeroed struct; PREVIOUS is written
            // before the handler that reads it is installed.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction == libc::SIG_IGN
                {
                    continue;
                }
                (*PREVIOUS.0.get())[i] = Some(old);
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_stop as *const () as libc::sighandler_t;
                // The previous handler's own restart and stack choices: a
                // handler that counts on interrupting a blocking call
                // (Python's, whose KeyboardInterrupt needs the EINTR) gets
                // the same interruption when called through dlock's.
                new.sa_flags = libc::SA_SIGINFO
                    | if old.sa_sigaction == libc::SIG_DFL {
                        libc::SA_RESTART | libc::SA_ONSTACK
                    } else {
                        old.sa_flags & (libc::SA_RESTART | libc::SA_ONSTACK)
                    };
                new.sa_mask = old.sa_mask;
                for s in STOP {
                    libc::sigaddset(&mut new.sa_mask, s);
                }
                libc::sigaction(sig, &new, std::ptr::null_mut());
            }
        }
    });
}

/// The `dlock-stop` thread of this process: each byte on the wake pipe is
/// one stop signal; it shuts everything down and answers with one byte.
fn start_thread() {
    let (Some(wake), Some(done)) = (pipe(false), pipe(true)) else {
        tracing::warn!("no pipe for the stop signals: a stop signal will not release");
        return;
    };
    let (wake_r, done_w) = (wake[0], done[1]);
    let spawned = std::thread::Builder::new()
        .name("dlock-stop".into())
        .spawn(move || {
            block_stop();
            let mut b = [0u8; 1];
            loop {
                // SAFETY: read into a local buffer.
                let n = unsafe { libc::read(wake_r, b.as_mut_ptr().cast(), 1) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                if n != 1 {
                    return;
                }
                crate::shutdown();
                // SAFETY: write from a local buffer.
                unsafe { libc::write(done_w, b.as_ptr().cast(), 1) };
            }
        });
    if spawned.is_ok() {
        WAKE.store(wake[1], SeqCst);
        DONE.store(done[0], SeqCst);
        PIPES_OF.store(crate::fork::generation(), SeqCst);
    }
}

/// Wakes the `dlock-stop` thread and waits (bounded) for its answer: the
/// process's locks are released. Async-signal-safe.
fn release_and_wait(sig: libc::c_int) {
    if crate::forked() || PIPES_OF.load(SeqCst) != crate::fork::generation() {
        // Nothing of this process to release (a forked child: the
        // parent's; a fresh child that started no session).
        return;
    }
    let (wake, done) = (WAKE.load(SeqCst), DONE.load(SeqCst));
    let bound = BOUND_MS.load(SeqCst) + SLACK.as_millis() as u64;
    let b = [sig as u8];
    // SAFETY: write, poll and read are async-signal-safe; the buffers are
    // local.
    unsafe {
        if libc::write(wake, b.as_ptr().cast(), 1) != 1 {
            return;
        }
        let mut pfd = libc::pollfd {
            fd: done,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut left = bound as libc::c_int;
        // The answer, or the bound; a poll interrupted by another signal
        // goes on (with a coarse bound: the rest is not measured).
        while left > 0 {
            let r = libc::poll(&mut pfd, 1, left.min(100));
            if r > 0 {
                let mut x = [0u8; 1];
                libc::read(done, x.as_mut_ptr().cast(), 1);
                return;
            }
            left -= 100;
        }
    }
}

/// dlock's handler of SIGINT and SIGTERM (see the module's text).
extern "C" fn on_stop(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let Some(i) = STOP.iter().position(|s| *s == sig) else {
        return;
    };
    // SAFETY: only async-signal-safe calls (sigaction, raise, the previous
    // handler, which was one before); errno is saved and restored.
    unsafe {
        let saved = *errno();
        let Some(prev) = (*PREVIOUS.0.get())[i] else {
            return;
        };
        let mut now: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut now);
        let on_top = now.sa_sigaction == on_stop as *const () as libc::sighandler_t;
        let dfl = prev.sa_sigaction == libc::SIG_DFL;
        let reset = prev.sa_flags & libc::SA_RESETHAND != 0;
        if on_top && (dfl || reset) {
            // The signal ends the process: release first.
            release_and_wait(sig);
            let mut default: libc::sigaction = std::mem::zeroed();
            default.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &default, std::ptr::null_mut());
            if dfl {
                // Pending while this handler runs; it ends the process once
                // the handler returns, as the default would have.
                libc::raise(sig);
            }
        }
        if !dfl && prev.sa_sigaction != libc::SIG_IGN {
            if prev.sa_flags & libc::SA_SIGINFO != 0 {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(prev.sa_sigaction);
                f(sig, info, ctx);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(prev.sa_sigaction);
                f(sig);
            }
        }
        *errno() = saved;
    }
}

/// Where `errno` lives on this thread.
fn errno() -> *mut libc::c_int {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    // SAFETY: returns this thread's errno location.
    unsafe {
        libc::__errno_location()
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    // SAFETY: returns this thread's errno location.
    unsafe {
        libc::__error()
    }
}

/// A close-on-exec pipe, its read end non-blocking with `nonblocking`.
fn pipe(nonblocking: bool) -> Option<[libc::c_int; 2]> {
    let mut fds = [-1; 2];
    // SAFETY: pipe into a local array, then fcntl on its descriptors.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return None;
        }
        for fd in fds {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        if nonblocking {
            libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK);
        }
    }
    Some(fds)
}
