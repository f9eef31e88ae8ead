//! One lifecycle for every face (docs/design.md §19): shutdown at exit,
//! cancellation of an acquisition, and the one completion form. Each is
//! decided here, in the core, so that Rust, C, Python, Node and the command
//! behave the same at exit and on cancel.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc::WeakUnboundedSender;

use crate::driver::{Command, Reply, Ticket};
use crate::machine::LockId;

/// One session as the process-wide registry knows it: enough to close it,
/// nothing that keeps it alive.
pub(crate) struct Registered {
    /// The [`crate::Client`] it belongs to.
    pub(crate) client: u64,
    pub(crate) commands: WeakUnboundedSender<Command>,
    /// Set once shut down: its handles then refuse with `shutdown`.
    pub(crate) shut: Arc<AtomicBool>,
    pub(crate) keepalive_timeout: Duration,
}

/// Every session of the process not yet dropped.
static SESSIONS: Mutex<Vec<Registered>> = Mutex::new(Vec::new());

/// Adds a session to the registry (forgetting dropped ones now and then,
/// so that the list stays proportional to the live sessions).
pub(crate) fn register(r: Registered) {
    static PRUNE_AT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(64);
    let mut all = crate::sync::lock(&SESSIONS);
    if all.len() >= PRUNE_AT.load(SeqCst) {
        all.retain(|s| s.commands.strong_count() > 0);
        PRUNE_AT.store((all.len() * 2).max(64), SeqCst);
    }
    all.push(r);
}

/// Ends every session of every client of this process, all at once: each
/// session releases its locks and revokes its lease (one request deletes
/// every key of it), the sessions in parallel, and the call returns once
/// all are done or after one keepalive timeout in total (the longest of
/// the sessions'), whatever the service does; undone revokes go on in the
/// background while the process lives.
///
/// Afterwards every handle of those sessions behaves as closed:
/// [`crate::Lock::permit`] refuses `released`, acquiring fails with
/// [`crate::Error::Shutdown`], release and close are harmless no-ops.
/// Clients connected afterwards work as usual. Idempotent; callable from
/// any thread, from a callback (which then blocks the callback thread for
/// at most that timeout) and from an exit hook. On the driver's own thread
/// it starts the closes without waiting.
///
/// This is what every face calls at process exit: Python's `atexit`,
/// Node's `process.on('exit')`, C's `lk_shutdown` and the last
/// `lk_client_free`, the `dlock` command on its way out.
pub fn shutdown() {
    shut_down(|_| true);
}

/// Shuts down the registered sessions `pick` selects (see [`shutdown`]).
pub(crate) fn shut_down(pick: impl Fn(&Registered) -> bool) {
    if crate::forked() {
        return;
    }
    let mut bound = Duration::ZERO;
    let mut asked = 0usize;
    let rx = {
        let mut all = crate::sync::lock(&SESSIONS);
        all.retain(|s| s.commands.strong_count() > 0);
        // Room for every answer: a close answers without waiting for us.
        let (tx, rx) = std_mpsc::sync_channel(all.len());
        for s in all.iter().filter(|s| pick(s)) {
            if s.shut.swap(true, SeqCst) {
                continue;
            }
            let Some(commands) = s.commands.upgrade() else {
                continue;
            };
            bound = bound.max(s.keepalive_timeout);
            let done = Reply::Blocking(tx.clone());
            if commands.send(Command::Close { done }).is_ok() {
                asked += 1;
            }
            // The last sender may be this one (every handle dropped just
            // now): its drop closes the session as well.
        }
        rx
    };
    if asked == 0 || crate::driver::on_driver_thread() {
        return;
    }
    // One bound for all: the sessions close in parallel.
    let until = std::time::Instant::now() + bound;
    for _ in 0..asked {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if rx.recv_timeout(left).is_err() {
            break;
        }
    }
}

/// A pending acquisition, from [`crate::Lock::acquire_then`]: cancel it to
/// leave nothing held. Cheap to clone; `Send + Sync`. Holding it keeps
/// nothing alive (not the lock, not its session).
#[derive(Clone)]
pub struct Acquisition {
    commands: WeakUnboundedSender<Command>,
    lock: LockId,
    ticket: Arc<Ticket>,
}

impl std::fmt::Debug for Acquisition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquisition")
            .field("lock", &self.lock)
            .finish()
    }
}

impl Acquisition {
    pub(crate) fn new(
        commands: WeakUnboundedSender<Command>,
        lock: LockId,
        ticket: Arc<Ticket>,
    ) -> Acquisition {
        Acquisition {
            commands,
            lock,
            ticket,
        }
    }

    /// Leaves nothing held by this acquisition, whenever it is called: a
    /// wait in the queue ends (the completion, if it has not run, gets
    /// [`crate::Error::Released`]); a key put by the cancelled request is
    /// deleted; if the acquisition already succeeded, the lock is released
    /// (only while it still holds the token this acquisition won, so a
    /// later acquisition is left alone). The outcome is decided on the
    /// driver, in order with the acquisition's own replies. Idempotent;
    /// never blocks. What Python's cancelled task and Ctrl-C, Node's
    /// aborted signal and a dropped [`crate::Lock::acquire_async`] future
    /// call.
    pub fn cancel(&self) {
        if crate::forked() {
            return;
        }
        // The session gone means its locks are released already.
        if let Some(commands) = self.commands.upgrade() {
            let _ = commands.send(Command::Cancel {
                lock: self.lock,
                ticket: self.ticket.clone(),
            });
        }
    }
}

/// Cancels an acquisition when dropped, unless disarmed: a dropped
/// `acquire_async` future leaves nothing held.
pub(crate) struct CancelOnDrop(pub(crate) Option<Acquisition>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.cancel();
        }
    }
}

/// Runs `fut` on dlock's driver; `done(output)` then runs once on the
/// callback thread (where lock callbacks run, in order with them). The
/// completion form of every async call for faces that run no executor of
/// their own (release, close, guarded writes): [`crate::Lock`] and
/// [`crate::Session`] are cheap to clone, so pass owned handles into `fut`.
/// In a forked child nothing runs.
pub fn spawn_then<T: Send + 'static>(
    fut: impl Future<Output = T> + Send + 'static,
    done: impl FnOnce(T) + Send + 'static,
) {
    if crate::forked() {
        return;
    }
    crate::driver::runtime().spawn(async move {
        let out = fut.await;
        Reply::Then(Box::new(done)).send(out);
    });
}

/// Whether `flag` (a session's shutdown flag) is set.
pub(crate) fn is_shut(flag: &AtomicBool) -> bool {
    flag.load(SeqCst)
}
