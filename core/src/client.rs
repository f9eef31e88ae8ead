//! The public face: [`Client`], [`Lock`], [`Permit`].

use std::mem::ManuallyDrop;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::backend::Backend;
use crate::clock::{Clock, Instant};
use crate::driver::{Command, Reply, spawn_lock};
use crate::gate::Gate;
use crate::machine::{Refused, State, StateChange, Token};
use crate::memory::MemoryService;
use crate::{Error, Options};

/// Longest lock name accepted.
pub const MAX_NAME_LEN: usize = 1024;

/// A connection to a lock service with the settings its locks share.
/// Cheap to clone.
#[derive(Clone)]
pub struct Client {
    backend: Arc<dyn Backend>,
    options: Options,
    clock: Clock,
}

impl Client {
    /// A client of `backend` with `options` (validated) on the system clock.
    pub fn new(backend: impl Backend, options: Options) -> Result<Client, Error> {
        Client::with_clock(backend, options, Clock::system())
    }

    /// A client whose deadlines are read from `clock` (a
    /// [`crate::ManualClock`]'s, in tests; use the same clock for a memory
    /// service).
    pub fn with_clock(
        backend: impl Backend,
        options: Options,
        clock: Clock,
    ) -> Result<Client, Error> {
        options.validate()?;
        Ok(Client {
            backend: Arc::new(backend),
            options,
            clock,
        })
    }

    /// A client of the process-wide embedded service with default options.
    pub fn memory() -> Client {
        Client::new(MemoryService::shared().link(), Options::default())
            .expect("default options are valid")
    }

    /// The options every lock of this client uses.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The clock deadlines are read from.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// A handle on the lock called `name` (not acquired yet). Register
    /// callbacks, then [`Lock::acquire`].
    pub fn lock(&self, name: &str) -> Result<Lock, Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "lock name must be 1 to {MAX_NAME_LEN} bytes without NUL, got {} bytes",
                name.len()
            )));
        }
        let gate = Arc::new(Gate::new(self.clock.clone()));
        let name: Arc<str> = name.into();
        let commands = spawn_lock(
            gate.clone(),
            self.backend.clone(),
            name.clone(),
            self.options.clone(),
        );
        Ok(Lock {
            gate,
            commands: ManuallyDrop::new(commands),
            name,
            options: self.options.clone(),
            backend: self.backend.clone(),
        })
    }
}

/// One named lock. Dropping it releases the lock.
///
/// Callbacks run on dlock's callback thread, one at a time, in order; a
/// callback may call any method of the lock.
pub struct Lock {
    gate: Arc<Gate>,
    /// Dropped with the lock (which releases it), except in a forked child:
    /// there the driver does not exist and the lease is the parent's.
    commands: ManuallyDrop<mpsc::UnboundedSender<Command>>,
    name: Arc<str>,
    options: Options,
    backend: Arc<dyn Backend>,
}

impl Lock {
    /// One guarded write (`value: None` deletes), run on the driver and
    /// awaited here; bounded by the TTL so a cut link cannot hang the caller.
    pub(crate) fn guarded_write(
        &self,
        token: Token,
        key: &[u8],
        value: Option<&[u8]>,
    ) -> Result<(), Error> {
        use crate::backend::BackendError;
        if crate::forked() {
            return Err(Error::Forked);
        }
        if key.is_empty() {
            return Err(Error::InvalidArgument("guarded write: empty key".into()));
        }
        let (backend, name, ttl) = (self.backend.clone(), self.name.clone(), self.options.ttl);
        let (key, value) = (key.to_vec(), value.map(<[u8]>::to_vec));
        let r = crate::driver::block_on(async move {
            let write = backend.guarded_write(&name, token, &key, value.as_deref());
            tokio::time::timeout(ttl, write).await.unwrap_or_else(|_| {
                Err(BackendError::Unavailable("no answer within the TTL".into()))
            })
        })?;
        match r {
            Ok(()) => Ok(()),
            Err(BackendError::Fenced) => Err(Error::Fenced(token.get())),
            Err(e) => Err(Error::Backend(format!("guarded write: {e}"))),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn send(&self, c: Command) -> Result<(), Error> {
        if crate::forked() {
            return Err(Error::Forked);
        }
        self.commands.send(c).map_err(|_| Error::Shutdown)
    }

    fn acquire_blocking(&self, wait: bool, timeout: Option<Duration>) -> Result<Token, Error> {
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.send(Command::Acquire {
            wait,
            timeout,
            reply: Reply::Blocking(tx),
        })?;
        rx.recv().map_err(|_| Error::Shutdown)?
    }

    /// Acquires the lock, waiting up to `timeout` behind another holder.
    /// Returns the fencing token. Blocks the calling thread.
    pub fn acquire(&self, timeout: Duration) -> Result<Token, Error> {
        self.acquire_blocking(true, Some(timeout))
    }

    /// Acquires the lock if nobody holds it, else fails with
    /// [`Error::WouldBlock`]. Blocks for at most about two keepalive timeouts.
    pub fn try_acquire(&self) -> Result<Token, Error> {
        self.acquire_blocking(false, Some(self.options.keepalive_timeout * 2))
    }

    /// Acquires the lock, waiting up to `timeout` (`None`: as long as it
    /// takes). Works on any executor.
    pub async fn acquire_async(&self, timeout: Option<Duration>) -> Result<Token, Error> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Acquire {
            wait: true,
            timeout,
            reply: Reply::Async(tx),
        })?;
        rx.await.map_err(|_| Error::Shutdown)?
    }

    /// Releases the lock: no permit is valid from now on; returns once the
    /// lease is revoked, or after a keepalive timeout if the service does not
    /// answer (the lease then expires on its own).
    pub fn release(&self) -> Result<(), Error> {
        let (tx, rx) = std_mpsc::sync_channel(1);
        self.send(Command::Release {
            done: Reply::Blocking(tx),
        })?;
        rx.recv().map_err(|_| Error::Shutdown)
    }

    /// [`Lock::release`] for async code.
    pub async fn release_async(&self) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.send(Command::Release {
            done: Reply::Async(tx),
        })?;
        rx.await.map_err(|_| Error::Shutdown)
    }

    /// The current state.
    pub fn state(&self) -> State {
        self.gate.read().state
    }

    /// The token held, while `Holding` or `Draining`.
    pub fn token(&self) -> Option<Token> {
        let s = self.gate.read();
        matches!(s.state, State::Holding | State::Draining).then_some(s.token)
    }

    /// The local deadline, while `Holding` or `Draining`.
    pub fn deadline(&self) -> Option<Instant> {
        let s = self.gate.read();
        matches!(s.state, State::Holding | State::Draining).then_some(s.deadline)
    }

    /// Time left before the deadline (zero once passed), while `Holding` or
    /// `Draining`.
    pub fn time_left(&self) -> Option<Duration> {
        self.gate.time_left()
    }

    /// Units of work in flight (permits not yet dropped).
    pub fn in_flight(&self) -> u64 {
        self.gate.in_flight()
    }

    /// Permission to start one unit of work: granted only while `Holding`
    /// and before the deadline, read from the clock on every call. Counted in
    /// flight until dropped.
    #[inline]
    pub fn permit(&self) -> Result<Permit<'_>, Refused> {
        let s = self.gate.enter()?;
        Ok(Permit {
            gate: &self.gate,
            token: s.token,
            deadline: s.deadline,
        })
    }

    /// [`Lock::permit`] for work that outlives the borrow (another thread,
    /// a binding). Does not allocate.
    #[inline]
    pub fn permit_owned(&self) -> Result<OwnedPermit, Refused> {
        let s = self.gate.enter()?;
        Ok(OwnedPermit {
            gate: self.gate.clone(),
            token: s.token,
            deadline: s.deadline,
        })
    }

    /// Called once per fenced token with the number of permits then in
    /// flight: stop the work now.
    pub fn on_fence(&self, f: impl Fn(Token, u64) + Send + Sync + 'static) {
        set(&self.gate.callbacks.on_fence, Arc::new(f));
    }

    /// Called on every state change.
    pub fn on_state_change(&self, f: impl Fn(StateChange) + Send + Sync + 'static) {
        set(&self.gate.callbacks.on_state_change, Arc::new(f));
    }

    /// Called on every acquisition (first and after a fence) with its token.
    pub fn on_acquired(&self, f: impl Fn(Token) + Send + Sync + 'static) {
        set(&self.gate.callbacks.on_acquired, Arc::new(f));
    }

    /// Called once the lock has left `Holding` (drain or fence) and no permit
    /// is in flight any more.
    pub fn on_drained(&self, f: impl Fn() + Send + Sync + 'static) {
        set(&self.gate.callbacks.on_drained, Arc::new(f));
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !crate::forked() {
            // SAFETY: dropped once, here; never used again.
            unsafe { ManuallyDrop::drop(&mut self.commands) }
        }
    }
}

fn set<T: ?Sized>(slot: &Mutex<Option<Arc<T>>>, f: Arc<T>) {
    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
}

impl std::fmt::Debug for Lock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.gate.read();
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("state", &s.state)
            .field("token", &s.token)
            .finish()
    }
}

/// Permission for one unit of work, borrowed from its [`Lock`]. Dropping it
/// ends the unit of work.
#[must_use = "the permit ends when dropped"]
pub struct Permit<'a> {
    gate: &'a Gate,
    token: Token,
    deadline: Instant,
}

/// A [`Permit`] that owns a reference to its lock's state.
#[must_use = "the permit ends when dropped"]
pub struct OwnedPermit {
    gate: Arc<Gate>,
    token: Token,
    deadline: Instant,
}

macro_rules! permit_methods {
    ($t:ty) => {
        impl $t {
            /// The token to send with every write this unit of work makes.
            pub fn token(&self) -> Token {
                self.token
            }

            /// The deadline when the permit was granted (keepalives may
            /// extend the lock's; [`Self::valid`] reads the current one).
            pub fn deadline(&self) -> Instant {
                self.deadline
            }

            /// Whether the work may still commit: the lock still holds this
            /// token and its deadline has not passed (read from the clock).
            pub fn valid(&self) -> bool {
                self.gate.valid(self.token)
            }

            /// Ends the unit of work (same as dropping it).
            pub fn end(self) {}
        }

        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("token", &self.token)
                    .field("deadline", &self.deadline)
                    .finish()
            }
        }

        impl Drop for $t {
            #[inline]
            fn drop(&mut self) {
                self.gate.exit();
            }
        }
    };
}

permit_methods!(Permit<'_>);
permit_methods!(OwnedPermit);
