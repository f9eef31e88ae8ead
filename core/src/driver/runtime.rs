//! The driver's thread: one per process (one per fork), running a
//! current-thread tokio runtime that every session, backend call and
//! connection of the process shares; and the ways a caller runs a future
//! there. A leaf, so that the backends and the faces' calls reach the
//! runtime without naming the session pump.

use tokio::sync::oneshot;

use crate::Error;

/// The driver runtime's handle, creating the runtime thread on first use
/// (in a child of fork(), its own: the parent's thread did not follow it).
pub(crate) fn runtime() -> &'static tokio::runtime::Handle {
    static RT: crate::fork::PerFork<tokio::runtime::Handle> = crate::fork::PerFork::new();
    RT.get(
        || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("dlock: cannot build the driver runtime");
            (rt.handle().clone(), rt)
        },
        |rt| {
            std::thread::Builder::new()
                .name("dlock-driver".into())
                .spawn(move || {
                    block_signals();
                    ON_DRIVER.set(true);
                    rt.block_on(std::future::pending::<()>())
                })
                .expect("dlock: cannot spawn the driver thread");
        },
    )
}

thread_local! {
    static ON_DRIVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is the driver's: it must never wait for the
/// driver (a handle dropped there, say by a task dropping a callback that
/// owned it).
pub(crate) fn on_driver_thread() -> bool {
    ON_DRIVER.get()
}

/// Runs `fut` on the driver; the receiver gets its output ([`Error::Shutdown`]
/// if the driver dropped it). The blocking and async forms of every call
/// share this.
pub(crate) fn on_driver<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> oneshot::Receiver<T> {
    let (tx, rx) = oneshot::channel();
    runtime().spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx
}

/// Runs `fut` on the driver (it may need the driver's reactor: timers, a
/// backend's I/O) and awaits its output from any executor. Dropping the
/// returned future aborts `fut` there, dropping whatever it held (so a
/// dropped async call's cancel rule is the task's own drop).
pub(crate) async fn on_driver_until_dropped<T: Send + 'static>(
    fut: impl Future<Output = Result<T, Error>> + Send + 'static,
) -> Result<T, Error> {
    struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);
    impl<T> Drop for AbortOnDrop<T> {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let mut task = AbortOnDrop(runtime().spawn(fut));
    (&mut task.0).await.unwrap_or(Err(Error::Shutdown))
}

/// Runs `fut` on the driver and blocks the calling thread for its output.
pub(crate) fn block_on<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, Error> {
    on_driver(fut).blocking_recv().map_err(|_| Error::Shutdown)
}

/// Blocks SIGPIPE on the driver thread (and the threads it starts), where
/// all network I/O runs. A peer that closes a socket mid-write (an etcd
/// member dying, a TLS handshake refused) then gives that write EPIPE
/// instead of killing the process: Rust programs ignore SIGPIPE, but a C
/// host linking libdlock keeps the default action. The signal is
/// thread-directed, so the application's own threads keep their setting.
/// The stop signals are blocked too ([`crate::signals::block_stop`]): their
/// handler waits for the driver, so it must never run on it.
pub(crate) fn block_signals() {
    // SAFETY: plain libc calls on a local, initialised signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGPIPE);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    crate::signals::block_stop();
}
