//! How a caller waits for the driver's answer (a blocked thread, a future,
//! or a completion on the callback thread), and what the handles send the
//! session's task: its [`Command`]s. Plain types, shared by the client, the
//! lifecycle and the elections with the pump, which read them, never the
//! other way round.

use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::Error;
use crate::callbacks::Callbacks;
use crate::gate::Gate;
use crate::machine::{LeaseId, LockId, ReqId, Token};

/// A completion run once on the callback thread.
pub(crate) type Then<T> = Box<dyn FnOnce(T) + Send>;

/// Where a caller waits for the outcome: a blocked thread, a future, or a
/// completion run on the callback thread (the faces' one form: no face
/// runs an executor).
pub(crate) enum Reply<T> {
    Blocking(std_mpsc::SyncSender<T>),
    Async(oneshot::Sender<T>),
    Then(Then<T>),
}

impl<T: Send + 'static> Reply<T> {
    pub(crate) fn send(self, r: T) {
        match self {
            Reply::Blocking(tx) => drop(tx.try_send(r)),
            Reply::Async(tx) => drop(tx.send(r)),
            Reply::Then(done) => crate::callbacks::dispatch(Box::new(move || done(r))),
        }
    }

    /// A reply channel for a blocking caller.
    pub(crate) fn blocking() -> (Reply<T>, std_mpsc::Receiver<T>) {
        let (tx, rx) = std_mpsc::sync_channel(1);
        (Reply::Blocking(tx), rx)
    }

    /// A reply channel for an async caller.
    pub(crate) fn future() -> (Reply<T>, oneshot::Receiver<T>) {
        let (tx, rx) = oneshot::channel();
        (Reply::Async(tx), rx)
    }
}

/// What an acquisition's handle ([`crate::Acquisition`]) shares with the
/// driver: the token it won, once answered, so that a cancel after the
/// answer releases exactly that acquisition.
#[derive(Default)]
pub(crate) struct Ticket {
    pub(super) won: std::sync::Mutex<Option<Token>>,
}

/// The value an election's candidate key holds, shared with its handle.
pub(crate) type Candidate = Arc<std::sync::Mutex<Vec<u8>>>;

/// A guarded write asked of a lock.
pub(crate) struct Write {
    pub(crate) token: Token,
    pub(crate) key: Vec<u8>,
    pub(crate) value: Option<Vec<u8>>,
    pub(crate) reply: Reply<Result<(), Error>>,
}

/// What the handles of a session (its `Session` and its locks) ask of its
/// task.
pub(crate) enum Command {
    /// A new lock handle.
    Add {
        lock: LockId,
        name: Arc<str>,
        gate: Arc<Gate>,
    },
    /// The lock's first callback or stream: deliver its events from now on.
    Listen {
        lock: LockId,
        callbacks: Arc<Callbacks>,
    },
    Acquire {
        lock: LockId,
        wait: bool,
        timeout: Option<Duration>,
        reply: Reply<Result<Token, Error>>,
        /// Set for a cancellable acquisition.
        ticket: Option<Arc<Ticket>>,
    },
    /// An acquisition is cancelled: it leaves nothing held.
    Cancel {
        lock: LockId,
        ticket: Arc<Ticket>,
    },
    Release {
        lock: LockId,
        done: Reply<()>,
    },
    /// The handle is dropped: release, and answer once the release is
    /// published (permits then report invalid), without waiting for the
    /// key's delete.
    Drop {
        lock: LockId,
        published: Reply<()>,
    },
    Write {
        lock: LockId,
        write: Write,
    },
    /// The lock is an election's candidate: its key holds `value` (read at
    /// each acquisition, so a recampaign carries the last proclaimed one).
    Campaign {
        lock: LockId,
        value: Candidate,
    },
    /// Write → read, keeping the key and `token` (see
    /// [`crate::Lock::downgrade`]).
    Downgrade {
        lock: LockId,
        token: Token,
        reply: Reply<Result<(), Error>>,
    },
    /// Puts the candidate's value, guarded by `token` (see
    /// [`Backend::proclaim`]).
    Proclaim {
        lock: LockId,
        token: Token,
        value: Vec<u8>,
        reply: Reply<Result<(), Error>>,
    },
    /// Resigns: as a release, but the key's delete waits for the permits
    /// in flight, up to `grace` (the machine's timer).
    Resign {
        lock: LockId,
        grace: Duration,
        done: Reply<()>,
    },
    /// Releases every lock and revokes the lease; answered once revoked
    /// (or after a keepalive timeout).
    Close {
        done: Reply<()>,
    },
}

/// A backend call in flight, to drop when the machine abandons it or a new
/// try replaces it: requests by id, revokes by lease.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Call {
    Req(ReqId),
    Revoke(LeaseId),
}

pub(crate) fn finish(done: Vec<Reply<()>>) {
    for d in done {
        d.send(());
    }
}
