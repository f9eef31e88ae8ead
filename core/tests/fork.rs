//! A child of fork() holds nothing and cannot touch the parent's lease; a
//! child that inherited no handle is a fresh dlock process (issue 32, 4).
//! A stop signal releases what the process holds, then ends it as the
//! signal would have (issue 32, 8).
#![cfg(unix)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use dlock::backend::{BackendError, Bounds, BoxFuture, Grant, KeyGone, KeyWatch, Leader};
use dlock::machine::LeaseId;
use dlock::{Backend, Client, Error, MemoryBackend, MemoryService, Refused, State, Token};

use dlock_testkit as common;

/// A child inherits whatever handle another test holds at its fork: the
/// tests of this file run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_forked_child_holds_nothing() {
    let _one = serial();
    let service = MemoryService::new();
    let client = Client::new(service.link(), common::short()).unwrap();
    let lock = client.lock("fork").unwrap();
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let permit = lock.permit_owned().unwrap();
    assert!(!dlock::forked());

    // SAFETY: the child only runs dlock calls that check the fork guard
    // first, then leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // A call that waits on a driver the child does not have would hang:
        // die of SIGALRM instead, which the parent reports.
        unsafe { libc::alarm(10) };
        let mut failed = 0;
        failed |= (!dlock::forked()) as i32;
        failed |= ((lock.permit().err() != Some(Refused::NotHeld)) as i32) << 1;
        failed |= (permit.valid() as i32) << 2;
        failed |= ((lock.release() != Err(Error::Forked)) as i32) << 3;
        failed |= ((lock.try_acquire() != Err(Error::Forked)) as i32) << 4;
        failed |= ((client.lock("other").err() != Some(Error::Forked)) as i32) << 5;
        drop(lock); // must not release the parent's lock
        unsafe { libc::_exit(failed) };
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child checks failed (bit mask)"
    );

    // The parent still holds, past the first deadline: keepalives go on.
    std::thread::sleep(Duration::from_millis(1800));
    assert_eq!(lock.state(), State::Holding);
    assert!(permit.valid());
    assert_eq!(service.holder("fork"), Some(token));
}

/// Forks; the child runs `child` (under a 10 s alarm) and exits with its
/// status; the parent gets the child's pid.
fn fork_child(child: impl FnOnce() -> i32) -> libc::pid_t {
    // SAFETY: the child runs `child` and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        unsafe { libc::alarm(10) };
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(99);
        unsafe { libc::_exit(code) };
    }
    pid
}

fn wait_status(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    status
}

/// Issue 32, 4: a child of a process whose handles are all gone (gunicorn
/// --preload, a prefork pool) creates clients and locks of its own.
#[test]
fn a_child_that_inherited_no_handle_makes_clients_of_its_own() {
    let _one = serial();
    {
        // The parent used dlock: its driver and callback threads run.
        let client = Client::new(MemoryService::new().link(), common::short()).unwrap();
        let lock = client.lock("before").unwrap();
        lock.on_fence(|_, _| {});
        lock.acquire(Duration::from_secs(5)).unwrap();
        lock.release().unwrap();
    }
    let pid = fork_child(|| {
        if dlock::forked() {
            return 1;
        }
        let service = MemoryService::new();
        let Ok(client) = Client::new(service.link(), common::short()) else {
            return 2;
        };
        let Ok(lock) = client.lock("child") else {
            return 3;
        };
        let (tx, rx) = std::sync::mpsc::channel();
        lock.on_acquired(move |t| {
            let _ = tx.send(t);
        });
        let Ok(token) = lock.acquire(Duration::from_secs(5)) else {
            return 4;
        };
        // The child's own callback thread runs its callbacks.
        if rx.recv_timeout(Duration::from_secs(5)) != Ok(token) {
            return 5;
        }
        if lock.permit().is_err() || service.holder("child") != Some(token) {
            return 6;
        }
        if lock.release().is_err() || service.holder("child").is_some() {
            return 7;
        }
        0
    });
    let status = wait_status(pid);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child failed at step");
}

/// A child forked while the parent holds a client makes none either.
#[test]
fn a_child_that_inherited_a_client_makes_none() {
    let _one = serial();
    let client = Client::new(MemoryService::new().link(), common::short()).unwrap();
    let pid = fork_child(|| {
        let fresh = Client::new(MemoryService::new().link(), common::short());
        i32::from(!dlock::forked()) | (i32::from(fresh.err() != Some(Error::Forked)) << 1)
    });
    let status = wait_status(pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "child checks failed (bit mask)"
    );
    drop(client);
}

/// The embedded backend, writing one byte to `fd` when the lease is
/// revoked or a key deleted: the child's release, seen by the parent.
struct Reporting {
    inner: MemoryBackend,
    fd: i32,
}

impl Reporting {
    fn say(&self, b: u8) {
        unsafe { libc::write(self.fd, [b].as_ptr().cast(), 1) };
    }
}

impl Backend for Reporting {
    fn grant<'a>(
        &'a self,
        ttl: Duration,
        bounds: Bounds,
        identity: Option<&'a dlock::Identity>,
    ) -> BoxFuture<'a, Result<Grant, BackendError>> {
        self.inner.grant(ttl, bounds, identity)
    }
    fn keepalive(
        &self,
        lease: LeaseId,
        bounds: Bounds,
    ) -> BoxFuture<'_, Result<Duration, BackendError>> {
        self.inner.keepalive(lease, bounds)
    }
    fn lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        self.inner.lock(name, lease, wait)
    }
    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), BackendError>> {
        self.say(b'R');
        self.inner.revoke(lease)
    }
    fn unlock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.say(b'R');
        self.inner.unlock(name, lease, token)
    }
    fn watch_keys(
        &self,
        lease: LeaseId,
        bounds: Bounds,
        gone: tokio::sync::mpsc::UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch> {
        self.inner.watch_keys(lease, bounds, gone)
    }
    fn guarded_write<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        key: &'a [u8],
        value: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.guarded_write(name, lease, token, key, value)
    }
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        value: &'a [u8],
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        self.inner.campaign(name, lease, value, wait)
    }
    fn proclaim<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        self.inner.proclaim(name, lease, token, value)
    }
    fn next_leader<'a>(
        &'a self,
        name: &'a str,
        last: Option<&'a Option<Leader>>,
    ) -> BoxFuture<'a, Result<Option<Leader>, BackendError>> {
        self.inner.next_leader(name, last)
    }
}

/// The application's handler in the child: says `A` and exits 7.
extern "C" fn app_handler(_: libc::c_int) {
    unsafe {
        libc::write(APP_FD, [b'A'].as_ptr().cast(), 1);
        libc::_exit(7);
    }
}
static mut APP_FD: i32 = -1;

/// How the child's process ends after `sig`, and the bytes it wrote: a
/// child holding a lock (its application's handler installed before or
/// after the client, or none) gets `sig` once it holds.
fn stopped_holder(sig: libc::c_int, handler: Option<bool>) -> (i32, Vec<u8>, Duration) {
    let _one = serial();
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (r, w) = (fds[0], fds[1]);
    let pid = fork_child(|| {
        unsafe { libc::close(r) };
        let install = || unsafe {
            APP_FD = w;
            libc::signal(sig, app_handler as *const () as libc::sighandler_t);
        };
        if handler == Some(true) {
            install();
        }
        let backend = Reporting {
            inner: MemoryService::new().link(),
            fd: w,
        };
        let client = Client::new(backend, common::short()).unwrap();
        let lock = client.lock("stop").unwrap();
        lock.acquire(Duration::from_secs(5)).unwrap();
        if handler == Some(false) {
            install();
        }
        unsafe { libc::write(w, b"H".as_ptr().cast(), 1) };
        loop {
            unsafe { libc::pause() };
        }
    });
    unsafe { libc::close(w) };
    let mut b = [0u8; 1];
    assert_eq!(unsafe { libc::read(r, b.as_mut_ptr().cast(), 1) }, 1);
    assert_eq!(b[0], b'H', "the child holds");
    let sent = Instant::now();
    unsafe { libc::kill(pid, sig) };
    let status = wait_status(pid);
    let took = sent.elapsed();
    let mut said = Vec::new();
    while unsafe { libc::read(r, b.as_mut_ptr().cast(), 1) } == 1 {
        said.push(b[0]);
    }
    unsafe { libc::close(r) };
    (status, said, took)
}

/// Issue 32, 8: SIGTERM or SIGINT with the default disposition: the
/// process releases (bounded by one keepalive timeout), then dies of the
/// signal.
#[test]
fn a_stop_signal_releases_then_ends_the_process_as_the_signal_would() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let (status, said, took) = stopped_holder(sig, None);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == sig,
            "signal {sig}: killed by it, got status {status:#x}"
        );
        assert_eq!(said, b"R", "signal {sig}: released before dying");
        let bound = common::short().keepalive_timeout + Duration::from_millis(500);
        assert!(took < bound, "signal {sig}: {took:?} > {bound:?}");
    }
}

/// The application's own handler still runs, whether installed before the
/// first client or after it, and decides how the process ends.
#[test]
fn a_stop_signal_still_reaches_the_applications_handler() {
    for before in [true, false] {
        let (status, said, _) = stopped_holder(libc::SIGTERM, Some(before));
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7,
            "handler installed before: {before}: status {status:#x}"
        );
        assert_eq!(said, b"A", "handler installed before: {before}");
    }
}
