//! `dlock run NAME -- CMD`: the command runs in a process group of its own
//! while it holds a permit of the lock. At the fence the group gets SIGTERM,
//! SIGKILL after `--grace`, and the permit ends only once the group is
//! gone: the core revokes a fenced lease only after its last permit ended
//! (docs/design.md §11 a), and otherwise the lock passes on only at the
//! server's expiry, a margin after the local deadline. The grace must fit
//! inside that margin, so no process of the group outlives the lock.
//!
//! `dlock run -n N NAME -- CMD`: the same in one of the N slots of the
//! semaphore NAME (the core's `Semaphore`, docs/design.md §26). A slot is
//! an ordinary lock, `NAME/slot/<i>`, so everything above holds for it
//! unchanged; CMD also gets `DLOCK_SLOT`.
//!
//! `dlock run --read NAME -- CMD`: the same as a reader of the read/write
//! lock NAME (the core's `RwLock`, docs/design.md §27): readers run at
//! once, a writer (a plain `dlock run NAME`, or `etcdctl lock NAME`) alone.
//! CMD also gets `DLOCK_MODE=read`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use clap::Args;
use dlock::{LockEvent, Options, OwnedPermit, PartialOptions, Refused, State, Token};
use signal_hook::consts::{
    SIGCHLD, SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGTSTP, SIGUSR1, SIGUSR2, SIGWINCH,
};

/// Signals that end the run: forwarded to the group, and no restart after.
const ENDING: [i32; 4] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT];
/// Signals only forwarded to the group. SIGTSTP (^Z) stops the group, not
/// dlock: a stopped dlock could not stop the group at the fence.
const FORWARDED: [i32; 5] = [SIGTSTP, SIGCONT, SIGUSR1, SIGUSR2, SIGWINCH];

use crate::exit::{self, Fail};
use crate::{Conn, duration, setting};

/// Time kept inside the margin beyond `--grace`: for the fence to be seen
/// and the SIGTERM sent, and for the SIGKILLed group to be gone.
pub const KILL_ROOM: Duration = Duration::from_millis(250);

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub(crate) conn: Conn,
    #[command(flatten)]
    pub(crate) timing: Timing,
    /// Wait at most this long for the lock (default: as long as it takes)
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub(crate) timeout: Option<Duration>,
    /// Do not wait: exit 120 if another holder has the lock
    #[arg(long = "try", conflicts_with = "timeout")]
    pub(crate) try_only: bool,
    /// Time between SIGTERM and SIGKILL to the group at the fence; must be
    /// at most --margin - 250ms
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "500ms")]
    pub(crate) grace: Duration,
    /// At the drain (a keepalive failed): `none`, `stop` (SIGSTOP, SIGCONT
    /// on resume) or a signal to send (e.g. USR1)
    #[arg(long, value_name = "WHAT", value_parser = on_drain, default_value = "none")]
    pub(crate) on_drain: OnDrain,
    /// After a fence, acquire again (higher token) and start CMD again
    #[arg(long)]
    pub(crate) restart: bool,
    /// With --restart: at most this many restarts
    #[arg(long, value_name = "N", requires = "restart")]
    pub(crate) restart_limit: Option<u32>,
    /// NAME is a semaphore of N slots: run CMD in any free one (the slot
    /// `NAME/slot/<i>`, an ordinary lock; DLOCK_SLOT=i). Every holder gives
    /// the same N (the first records it)
    #[arg(short = 'n', long = "limit", value_name = "N")]
    pub(crate) limit: Option<u32>,
    /// Hold NAME as a reader of a read/write lock: readers share it, a
    /// writer (a plain `dlock run NAME`) excludes them (DLOCK_MODE=read)
    #[arg(long, conflicts_with = "limit")]
    pub(crate) read: bool,
    #[command(flatten)]
    pub(crate) metrics: crate::metrics::TextfileArgs,
    /// The lock's name
    pub(crate) name: String,
    /// The command and its arguments, after `--`
    #[arg(last = true, required = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// The session's timing (docs/design.md §14); unset: derived from the ones
/// given by the core (the defaults when none is).
#[derive(Args, Debug, Clone, Default)]
pub struct Timing {
    /// Lease TTL [default: 15s]
    #[arg(long, value_name = "DURATION", value_parser = setting("ttl"))]
    ttl: Option<Duration>,
    /// Time between keepalives [default: ttl/3, 5s]
    #[arg(long, value_name = "DURATION", value_parser = setting("keepalive_interval"))]
    keepalive_interval: Option<Duration>,
    /// Time a keepalive may take [default: min(2s, keepalive-interval × 2/5)]
    #[arg(long, value_name = "DURATION", value_parser = setting("keepalive_timeout"))]
    keepalive_timeout: Option<Duration>,
    /// Time between keepalive retries while draining [default: min(1s,
    /// keepalive-interval / 5)]
    #[arg(long, value_name = "DURATION", value_parser = setting("retry_interval"))]
    retry_interval: Option<Duration>,
    /// Subtracted from every deadline: the time between the local deadline
    /// and the server's expiry [default: min(1s, (ttl - keepalive-interval) / 2)]
    #[arg(long, value_name = "DURATION", value_parser = setting("margin"))]
    margin: Option<Duration>,
    /// Who this holder is, for `dlock show` and `Lock.holder()` in other
    /// processes (at most 256 bytes, one line; beside the host, pid and
    /// start time dlock records itself, never the command line)
    #[arg(long, value_name = "TEXT")]
    pub(crate) description: Option<String>,
}

impl Timing {
    /// The flags given, the others derived from them by the core's rule
    /// (docs/design.md §14).
    fn options(&self, reacquire: bool) -> Result<Options, Fail> {
        PartialOptions {
            ttl: self.ttl,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
            retry_interval: self.retry_interval,
            margin: self.margin,
            reacquire: Some(reacquire),
        }
        .resolve()
        .map_err(Fail::from)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDrain {
    Nothing,
    Stop,
    Signal(i32),
}

fn on_drain(s: &str) -> Result<OnDrain, String> {
    match s {
        "none" => Ok(OnDrain::Nothing),
        "stop" => Ok(OnDrain::Stop),
        _ => signal_number(s)
            .map(OnDrain::Signal)
            .ok_or_else(|| format!("`{s}`: expected none, stop or a signal (USR1, SIGUSR1, 10)")),
    }
}

/// `USR1`, `SIGUSR1` or `10`.
fn signal_number(s: &str) -> Option<i32> {
    const NAMES: &[(&str, i32)] = &[
        ("HUP", libc::SIGHUP),
        ("INT", libc::SIGINT),
        ("QUIT", libc::SIGQUIT),
        ("TERM", libc::SIGTERM),
        ("KILL", libc::SIGKILL),
        ("USR1", libc::SIGUSR1),
        ("USR2", libc::SIGUSR2),
        ("ALRM", libc::SIGALRM),
        ("STOP", libc::SIGSTOP),
        ("CONT", libc::SIGCONT),
        ("TSTP", libc::SIGTSTP),
        ("WINCH", libc::SIGWINCH),
    ];
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let upper = s.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    NAMES.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
}

/// What the main loop hears.
enum Ev {
    Signal(i32),
    Lock(LockEvent),
    Acquired(Result<Token, dlock::Error>),
}

/// A lock event listener, as `dlock::Lock::on_event` takes it.
pub type Listener = Arc<dyn Fn(&LockEvent) + Send + Sync>;

/// A started first acquisition: cancelled, it leaves nothing held.
pub trait Cancel: Send {
    fn cancel(&self);
}

impl Cancel for dlock::Acquisition {
    fn cancel(&self) {
        dlock::Acquisition::cancel(self)
    }
}

/// What `run` holds while CMD runs: a lock, an election's candidate
/// (`dlock elect`), which campaigns with its value instead of acquiring,
/// or a semaphore's slot (`-n N`), known once acquired.
pub trait Held: Send + Sync + 'static {
    /// The lock whose permits the command runs under (once acquired).
    fn lock(&self) -> &dlock::Lock;
    /// Starts the first acquisition (see `dlock::Lock::acquire_then`).
    fn start(
        &self,
        wait: bool,
        timeout: Option<Duration>,
        done: Box<dyn FnOnce(Result<Token, dlock::Error>) + Send>,
    ) -> Result<Box<dyn Cancel>, dlock::Error>;
    /// Every event of the lock, from its acquisition on at the latest.
    fn on_event(&self, f: Listener) {
        self.lock().on_event(move |e| f(e));
    }
}

impl Held for dlock::Lock {
    fn lock(&self) -> &dlock::Lock {
        self
    }

    fn start(
        &self,
        wait: bool,
        timeout: Option<Duration>,
        done: Box<dyn FnOnce(Result<Token, dlock::Error>) + Send>,
    ) -> Result<Box<dyn Cancel>, dlock::Error> {
        Ok(Box::new(self.acquire_then(wait, timeout, done)))
    }
}

/// A slot of a semaphore (`-n N`): the core's `Semaphore` acquires it (a
/// wait in the semaphore's one queue, or a try of a free slot); the
/// slot's lock is known from then on.
struct Slot {
    semaphore: dlock::Semaphore,
    won: Arc<OnceLock<dlock::Lock>>,
    listener: Mutex<Option<Listener>>,
}

/// Cancels a slot's acquisition: the core's future is dropped, which
/// leaves nothing held (even a slot won just then).
struct CancelSlot(Mutex<Option<tokio::sync::oneshot::Sender<()>>>);

impl Cancel for CancelSlot {
    fn cancel(&self) {
        if let Some(tx) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(());
        }
    }
}

impl Held for Slot {
    fn lock(&self) -> &dlock::Lock {
        self.won
            .get()
            .expect("the slot's lock is used once acquired")
    }

    fn on_event(&self, f: Listener) {
        *self.listener.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }

    fn start(
        &self,
        wait: bool,
        timeout: Option<Duration>,
        done: Box<dyn FnOnce(Result<Token, dlock::Error>) + Send>,
    ) -> Result<Box<dyn Cancel>, dlock::Error> {
        let (cancel, mut cancelled) = tokio::sync::oneshot::channel::<()>();
        let semaphore = self.semaphore.clone();
        let acquire = async move {
            let acquired = async {
                match wait {
                    true => semaphore.acquire_async(timeout).await,
                    false => semaphore.try_acquire_async().await,
                }
            };
            tokio::select! {
                r = acquired => Some(r),
                Ok(()) = &mut cancelled => None,
            }
        };
        let won = self.won.clone();
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        dlock::spawn_then(acquire, move |r| match r {
            Some(Ok(lock)) => {
                if let Some(f) = listener {
                    lock.on_event(move |e| f(e));
                }
                // No token: lost already; the permit says so next.
                let token = lock.token().unwrap_or(Token(0));
                let _ = won.set(lock);
                done(Ok(token));
            }
            Some(Err(e)) => done(Err(e)),
            None => done(Err(dlock::Error::Released)),
        });
        Ok(Box::new(CancelSlot(Mutex::new(Some(cancel)))))
    }
}

pub fn main(args: RunArgs) -> Result<i32, Fail> {
    if let Some(limit) = args.limit {
        // The limit by the core's rule before anything connects.
        dlock::Semaphore::check(&args.name, limit)?;
    }
    match args.limit {
        None if args.read => main_with(args, |session, name| {
            Ok(Arc::new(session.rwlock(name)?.read()?))
        }),
        None => main_with(args, |session, name| Ok(Arc::new(session.lock(name)?))),
        Some(limit) => main_with(args, move |session, name| {
            Ok(Arc::new(Slot {
                semaphore: session.semaphore(name, limit)?,
                won: Arc::default(),
                listener: Mutex::new(None),
            }))
        }),
    }
}

/// `run` with what to hold made by `held` (a lock, an election).
pub fn main_with(
    args: RunArgs,
    held: impl FnOnce(&dlock::Session, &str) -> Result<Arc<dyn Held>, Fail>,
) -> Result<i32, Fail> {
    let options = args.timing.options(args.restart)?;
    // The name by the core's rule before anything connects.
    dlock::options::check_name("lock", args.name.as_bytes())?;
    // The core's rule for the description, before anything connects (as
    // the name's).
    dlock::IdentityOptions {
        description: args.timing.description.clone(),
        ..Default::default()
    }
    .validate()?;
    if args.grace + KILL_ROOM > options.margin {
        return Err(Fail::new(
            exit::INVALID,
            format!(
                "invalid_option: --grace {} does not fit inside --margin {}: the group must be gone before the server's expiry, so the grace is at most the margin - {} (raise --margin, and --ttl with it)",
                humantime::format_duration(args.grace),
                humantime::format_duration(options.margin),
                humantime::format_duration(KILL_ROOM),
            ),
        ));
    }
    let config = args
        .conn
        .client(options.clone(), args.timing.description.as_deref())?;
    let (tx, rx) = channel();
    listen_to_signals(tx.clone())?;
    // Orphaned grandchildren are re-parented to dlock, which reaps them:
    // the group is gone only once none of them is left.
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };

    let client = dlock::Client::connect(config)?;
    let session = client.session(options)?;
    let lock = held(&session, &args.name)?;
    let textfile = args.metrics.start(&client);
    {
        let tx = tx.clone();
        lock.on_event(Arc::new(move |e| {
            let _ = tx.send(Ev::Lock(*e));
        }));
    }
    let r = Run {
        args: &args,
        rx,
        lock: lock.clone(),
    }
    .go(tx);
    // On the way out, whatever ended the run: the core's shutdown deletes
    // the key and revokes the lease (at most a keepalive timeout when the
    // service does not answer), while the handles are still alive. The
    // group is gone and the permit ended by now, so a fenced lease is
    // revoked only after that (docs/design.md §11 a).
    dlock::shutdown();
    drop(textfile);
    r
}

fn listen_to_signals(tx: Sender<Ev>) -> Result<(), Fail> {
    let all = ENDING.iter().chain(&FORWARDED).chain(&[SIGCHLD]);
    let mut signals = signal_hook::iterator::Signals::new(all)
        .map_err(|e| Fail::new(exit::OTHER, format!("cannot handle signals: {e}")))?;
    // A write to the terminal from the background must not stop dlock
    // either (`stty tostop`); CMD gets the default back (see `start`).
    // SAFETY: setting a signal's disposition to ignored.
    unsafe {
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
        libc::signal(libc::SIGTTIN, libc::SIG_IGN);
    }
    std::thread::Builder::new()
        .name("dlock-signals".into())
        .spawn(move || {
            for s in signals.forever() {
                if tx.send(Ev::Signal(s)).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Fail::new(exit::OTHER, format!("cannot start a thread: {e}")))?;
    Ok(())
}

struct Run<'a> {
    args: &'a RunArgs,
    rx: Receiver<Ev>,
    lock: Arc<dyn Held>,
}

/// How one child's run ended.
struct Ended {
    /// The leader's wait status.
    status: i32,
    fenced: bool,
    /// A signal dlock was sent (and forwarded).
    interrupted: Option<i32>,
}

impl Run<'_> {
    fn say(&self, what: std::fmt::Arguments<'_>) {
        crate::say(format_args!("{}: {what}", self.args.name));
    }

    fn go(self, tx: Sender<Ev>) -> Result<i32, Fail> {
        let mut token = self.acquire(tx)?;
        let mut restarts = 0u32;
        loop {
            let permit = loop {
                match self.lock.lock().permit_owned() {
                    Ok(permit) => break Some(permit),
                    // A keepalive failed right after the acquisition: the
                    // command starts once one is confirmed (or never).
                    Err(Refused::Draining) => {
                        match self.rx.recv_timeout(Duration::from_millis(100)) {
                            Ok(Ev::Signal(s)) if ENDING.contains(&s) => return Ok(128 + s),
                            Err(RecvTimeoutError::Disconnected) => return Ok(exit::OTHER),
                            _ => {}
                        }
                    }
                    // Lost between the acquisition and here: nothing ran.
                    Err(refused) => {
                        self.say(format_args!("{refused}: not starting the command"));
                        break None;
                    }
                }
            };
            let ended = match permit {
                Some(permit) => self.start(permit)?,
                None => Ended {
                    status: 0,
                    fenced: true,
                    interrupted: None,
                },
            };
            if !ended.fenced {
                return Ok(status_code(ended.status));
            }
            let may_restart = self.args.restart
                && ended.interrupted.is_none()
                && self.args.restart_limit.is_none_or(|l| restarts < l);
            if !may_restart {
                if self.args.restart {
                    self.say(format_args!(
                        "fenced; not restarting ({restarts} restart(s))"
                    ));
                }
                return Ok(exit::FENCED);
            }
            restarts += 1;
            self.say(format_args!(
                "waiting for the lock again (restart {restarts})"
            ));
            token = match self.reacquired(token) {
                Ok(t) => t,
                Err(code) => return Ok(code),
            };
        }
    }

    /// The first acquisition: the core's `acquire_then`, answered on the
    /// event channel, so that signals are heard while waiting.
    fn acquire(&self, tx: Sender<Ev>) -> Result<Token, Fail> {
        let done = Box::new(move |r| {
            let _ = tx.send(Ev::Acquired(r));
        });
        let acquisition = self
            .lock
            .start(!self.args.try_only, self.args.timeout, done)
            .map_err(Fail::from)?;
        loop {
            match self.rx.recv() {
                Ok(Ev::Acquired(r)) => return r.map_err(Fail::from),
                Ok(Ev::Signal(s)) if ENDING.contains(&s) => {
                    // The core's cancel: nothing stays held by it.
                    acquisition.cancel();
                    return Err(Fail::new(
                        128 + s,
                        format!("signal {s} while waiting for the lock"),
                    ));
                }
                Ok(_) => {}
                Err(_) => return Err(Fail::new(exit::OTHER, "internal: event channel closed")),
            }
        }
    }

    /// After a fence: the core's reacquisition, with a higher token.
    fn reacquired(&self, old: Token) -> Result<Token, i32> {
        loop {
            match self.rx.recv() {
                Ok(Ev::Lock(LockEvent::Acquired { token, .. })) if token > old => {
                    self.say(format_args!("acquired again, token {token}"));
                    return Ok(token);
                }
                Ok(Ev::Signal(s)) if ENDING.contains(&s) => return Err(128 + s),
                Ok(_) => {}
                Err(_) => return Err(exit::OTHER),
            }
        }
    }

    /// Starts the command under `permit` and supervises its group until it
    /// is gone; the permit ends then.
    fn start(&self, permit: OwnedPermit) -> Result<Ended, Fail> {
        let token = permit.token();
        let lock = self.lock.lock();
        let lease = lock.session().lease().unwrap_or_default();
        // A semaphore's slot is the lock `NAME/slot/<i>`.
        let name = match lock.slot() {
            Some(_) => lock.name(),
            None => &self.args.name,
        };
        let key = dlock::lock_key(name, lease);
        let (program, rest) = crate::split_command(&self.args.command);
        let mut command = Command::new(program);
        command
            .args(rest)
            .env("DLOCK_LOCK", name)
            .env("DLOCK_TOKEN", token.0.to_string())
            .env("ETCD_LOCK_KEY", &key)
            .env("ETCD_LOCK_REV", token.0.to_string())
            .process_group(0);
        if let Some(mode) = lock.mode() {
            command.env("DLOCK_MODE", mode.as_str());
        }
        if let Some(slot) = lock.slot() {
            command
                .env("DLOCK_SLOT", slot.to_string())
                .env("DLOCK_SEMAPHORE", &self.args.name);
        }
        // If dlock itself dies (SIGKILL, a crash), the command's first
        // process is killed with it: nobody would stop it at the fence.
        let parent = std::process::id();
        // On a terminal where dlock is in the foreground, CMD's group takes
        // the terminal (CMD may read it; ^C and ^Z go to the group), and
        // dlock takes it back once the group is gone.
        let tty = foreground_tty();
        // SAFETY: between fork and exec the hook calls only prctl, setpgid,
        // tcsetpgrp, signal, getpid, getppid and reads errno, all
        // async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if tty {
                    // SIGTTOU is still ignored here (inherited from dlock).
                    libc::setpgid(0, 0);
                    libc::tcsetpgrp(0, libc::getpid());
                }
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                libc::signal(libc::SIGTTIN, libc::SIG_DFL);
                if libc::getppid() as u32 != parent {
                    // dlock died before the setting took: do not run.
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        let spawned = command.spawn();
        let child = match spawned {
            Ok(c) => c,
            Err(e) => {
                drop(permit);
                let code = if e.kind() == std::io::ErrorKind::NotFound {
                    exit::NOT_FOUND
                } else {
                    exit::CANNOT_EXEC
                };
                return Err(Fail::new(
                    code,
                    format!("cannot run `{}`: {e}", program.to_string_lossy()),
                ));
            }
        };
        let pgid = child.id() as i32;
        // Reaped by hand (waitpid), with the orphans of the group.
        std::mem::forget(child);
        if tty {
            // The same from this side, whichever runs first (as shells do).
            // SAFETY: plain syscall; dlock ignores SIGTTOU.
            unsafe { libc::tcsetpgrp(0, pgid) };
        }
        let ended = self.supervise(permit, pgid);
        if tty {
            // SAFETY: as above.
            unsafe { libc::tcsetpgrp(0, libc::getpgrp()) };
        }
        Ok(ended)
    }

    fn supervise(&self, permit: OwnedPermit, pgid: i32) -> Ended {
        let grace = self.args.grace;
        let mut fenced = false;
        let mut interrupted = None;
        let mut leader: Option<i32> = None;
        let mut kill_at: Option<Instant> = None;
        let mut stopping = false;
        // Stopped (SIGSTOP at a drain, or a forwarded SIGTSTP): a signal
        // that ends the run is followed by SIGCONT. `drain_frozen`: by
        // --on-drain=stop, thawed at the resume.
        let mut frozen = false;
        let mut drain_frozen = false;
        let stop = |why: std::fmt::Arguments<'_>, kill_at: &mut Option<Instant>| {
            self.say(format_args!("{why}: SIGTERM to process group {pgid}"));
            killpg(pgid, libc::SIGTERM);
            killpg(pgid, libc::SIGCONT);
            *kill_at = Some(Instant::now() + grace);
        };
        loop {
            reap(pgid, &mut leader);
            if leader.is_some() && group_gone(pgid) {
                break;
            }
            if leader.is_some() && !stopping {
                stopping = true;
                stop(
                    format_args!("the command exited; stopping what is left of its group"),
                    &mut kill_at,
                );
            }
            // The permit reads the clock: at the deadline it is invalid
            // even if the fence event is late.
            if !fenced && !permit.valid() {
                fenced = true;
                stopping = true;
                stop(
                    format_args!("fenced (token {}): the lock may move on", permit.token()),
                    &mut kill_at,
                );
            }
            let now = Instant::now();
            if let Some(at) = kill_at {
                if now >= at {
                    self.say(format_args!("SIGKILL to process group {pgid}"));
                    killpg(pgid, libc::SIGKILL);
                    kill_at = None;
                }
            }
            let mut wait = Duration::from_secs(3600);
            if let Some(at) = kill_at {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if !fenced {
                wait = wait.min(permit.remaining() + Duration::from_millis(1));
            }
            if leader.is_some() {
                // The orphans' deaths are reported to us; this only bounds
                // a missed one.
                wait = wait.min(Duration::from_millis(20));
            }
            match self.rx.recv_timeout(wait) {
                Ok(Ev::Signal(SIGCHLD)) | Err(RecvTimeoutError::Timeout) => {}
                Ok(Ev::Signal(s)) if ENDING.contains(&s) => {
                    self.say(format_args!(
                        "signal {s}: forwarded to process group {pgid}"
                    ));
                    interrupted = Some(s);
                    killpg(pgid, s);
                    if frozen {
                        killpg(pgid, libc::SIGCONT);
                        frozen = false;
                    }
                }
                Ok(Ev::Signal(s)) => {
                    killpg(pgid, s);
                    match s {
                        SIGTSTP => {
                            self.say(format_args!(
                                "signal {s}: process group {pgid} stopped (the lock is kept)"
                            ));
                            frozen = true;
                        }
                        SIGCONT => frozen = false,
                        _ => {}
                    }
                }
                Ok(Ev::Lock(LockEvent::Fence { token, .. }))
                    if token == permit.token() && !fenced =>
                {
                    fenced = true;
                    stopping = true;
                    stop(
                        format_args!("fenced (token {token}): the lock may move on"),
                        &mut kill_at,
                    );
                }
                Ok(Ev::Lock(LockEvent::State { change, .. })) if !fenced && !stopping => {
                    match (change.to, self.args.on_drain) {
                        (State::Draining, OnDrain::Stop) => {
                            self.say(format_args!(
                                "draining ({}): SIGSTOP to process group {pgid}",
                                change.reason
                            ));
                            killpg(pgid, libc::SIGSTOP);
                            frozen = true;
                            drain_frozen = true;
                        }
                        (State::Draining, OnDrain::Signal(s)) => {
                            self.say(format_args!(
                                "draining ({}): signal {s} to process group {pgid}",
                                change.reason
                            ));
                            killpg(pgid, s);
                        }
                        (State::Draining, OnDrain::Nothing) => {
                            self.say(format_args!(
                                "draining ({}): the command goes on",
                                change.reason
                            ));
                        }
                        (State::Holding, _) if change.from == State::Draining => {
                            if drain_frozen {
                                self.say(format_args!("resumed: SIGCONT to process group {pgid}"));
                                killpg(pgid, libc::SIGCONT);
                                frozen = false;
                                drain_frozen = false;
                            } else {
                                self.say(format_args!("resumed"));
                            }
                        }
                        _ => {}
                    }
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Disconnected) => {}
            }
        }
        if fenced {
            self.say(format_args!(
                "process group {pgid} is gone; the lock may be revoked"
            ));
        }
        // Ends the permit: only now may the core revoke a fenced lease.
        drop(permit);
        Ended {
            status: leader.unwrap_or(0),
            fenced,
            interrupted,
        }
    }
}

/// Whether stdin is a terminal whose foreground process group is dlock's.
fn foreground_tty() -> bool {
    // SAFETY: plain syscalls on fd 0.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

fn killpg(pgid: i32, sig: i32) {
    // SAFETY: plain syscall; a group already gone is ESRCH, ignored.
    unsafe { libc::kill(-pgid, sig) };
}

/// Whether no process of the group exists any more (zombies included:
/// dlock reaps its children and the orphans re-parented to it).
fn group_gone(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    let r = unsafe { libc::kill(-pgid, 0) };
    r == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Reaps every child that has exited; the leader's status into `leader`.
fn reap(pgid: i32, leader: &mut Option<i32>) {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        if pid == pgid {
            *leader = Some(status);
        }
    }
}

/// The exit code for a wait status: the code, or 128 + the signal.
fn status_code(status: i32) -> i32 {
    if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        libc::WEXITSTATUS(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_and_drain_actions_parse() {
        assert_eq!(signal_number("USR1"), Some(libc::SIGUSR1));
        assert_eq!(signal_number("sigterm"), Some(libc::SIGTERM));
        assert_eq!(signal_number("9"), Some(9));
        assert_eq!(signal_number("0"), None);
        assert_eq!(signal_number("NOPE"), None);
        assert_eq!(on_drain("stop"), Ok(OnDrain::Stop));
        assert_eq!(on_drain("none"), Ok(OnDrain::Nothing));
        assert_eq!(on_drain("SIGUSR2"), Ok(OnDrain::Signal(libc::SIGUSR2)));
        assert!(on_drain("freeze").is_err());
    }
}
