//! The fork guard. A child of `fork()` inherits the parent's lock handles
//! but not its threads (the driver, the callback thread): it holds nothing,
//! and nothing it does may touch the parent's leases.
//!
//! The rule (issue 32, item 4): a child that inherited no live handle (a
//! session, an observer) is a fresh dlock process: it starts its own driver
//! and callback threads on first use and may create clients (gunicorn
//! `--preload`, celery's prefork pool, `multiprocessing` with fork). A
//! child that inherited one is [`forked`]: every call fails with
//! [`crate::Error::Forked`], getters included, and dropping the inherited
//! handles leaves the parent's leases alone.

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Set in a child forked while the parent had live handles.
static FORKED: AtomicBool = AtomicBool::new(false);
/// How many fork()s separate this process from the one that loaded dlock:
/// what the per-process threads ([`PerFork`]) are keyed by.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// Live handles that a child would inherit ([`Live`]).
static LIVE: AtomicUsize = AtomicUsize::new(0);

#[cfg(unix)]
extern "C" fn in_child() {
    // Only atomics: async-signal-safe, as a handler run after fork() must be.
    if LIVE.load(Ordering::SeqCst) > 0 {
        FORKED.store(true, Ordering::SeqCst);
    }
    GENERATION.fetch_add(1, Ordering::SeqCst);
}

/// Registers the child-side fork handler (once, before the driver starts).
pub(crate) fn watch() {
    #[cfg(unix)]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: `in_child` only touches atomics.
        ONCE.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
    }
}

/// Whether this process is a fork of a process that had live dlock
/// handles (a client, a session, a lock, an observer). In such a child
/// every call fails with [`crate::Error::Forked`], `permit()` refuses with
/// `not_held` and no permit is valid; dropping handles there leaves the
/// parent's leases alone. A child of a process that only loaded dlock, or
/// whose handles were all dropped before the fork, is not forked: it
/// creates clients of its own.
#[inline]
pub fn forked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// The fork generation of this process (see [`PerFork`]).
#[inline]
pub(crate) fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// Counts one live handle for as long as it lives: a fork while any is
/// alive makes the child [`forked`].
#[derive(Debug)]
pub(crate) struct Live(());

impl Live {
    pub(crate) fn new() -> Live {
        watch();
        LIVE.fetch_add(1, Ordering::SeqCst);
        Live(())
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A value made once per process: a child of fork() (whose parent's
/// threads did not follow it) makes its own on first use. Lock-free, so a
/// lock held by a thread that the fork left behind never blocks the child.
/// A value of an earlier generation is leaked, never freed: references to
/// it may live on.
pub(crate) struct PerFork<T> {
    now: AtomicPtr<(u64, T)>,
}

impl<T: Send + Sync + 'static> PerFork<T> {
    pub(crate) const fn new() -> PerFork<T> {
        PerFork {
            now: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// This process's value; `make` builds one (and anything `started` must
    /// run once it won, such as a thread to spawn) when there is none yet.
    pub(crate) fn get<S>(
        &'static self,
        make: impl Fn() -> (T, S),
        started: impl FnOnce(S),
    ) -> &'static T {
        let generation = generation();
        let mut seen = self.now.load(Ordering::Acquire);
        // SAFETY: a published pointer is never freed.
        if let Some((g, v)) = unsafe { seen.as_ref() }
            && *g == generation
        {
            return v;
        }
        watch();
        let (value, start) = make();
        let mine = Box::into_raw(Box::new((generation, value)));
        loop {
            match self
                .now
                .compare_exchange(seen, mine, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    started(start);
                    // SAFETY: published, never freed.
                    return unsafe { &(*mine).1 };
                }
                Err(other) => {
                    // SAFETY: a published pointer is never freed.
                    let (g, v) = unsafe { &*other };
                    if *g == generation {
                        // Another thread won: ours was never published.
                        // SAFETY: `mine` came from Box::into_raw above.
                        drop(unsafe { Box::from_raw(mine) });
                        return v;
                    }
                    seen = other;
                }
            }
        }
    }
}
