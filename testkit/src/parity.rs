//! One body for both backends (the parity suite): every test here runs on
//! the embedded backend (`tests/parity.rs`, in every `cargo test`) and on
//! the etcd test cluster (`tests/etcd_parity.rs`, run by
//! `scripts/test-etcd.sh`), so the two cannot drift apart again.
//!
//! A test file that uses this module defines `fn client() -> Client`
//! (two calls give two clients, like two processes) and invokes
//! `dlock_testkit::parity_tests!()`.

use std::sync::Arc;
use std::time::Duration;

use dlock::{Client, Error, Options};

/// The settings of the parity suite, on every engine: the backend tests'
/// ([`crate::backend_options`]).
pub fn options() -> Options {
    crate::backend_options()
}

/// A name no other test (or earlier run) uses.
pub fn fresh(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = dlock::clock::system_now().as_nanos();
    format!("parity/{what}-{pid}-{t}-{n}")
}

const WAIT: Duration = Duration::from_secs(5);

/// Holding `a/b` (or `a/`) blocks `a`, as etcd's lock protocol nests names
/// (and `etcdctl lock`); holding `a` does not block `a/b`.
pub fn names_nest(c1: &Client, c2: &Client) {
    let base = fresh("nest");
    let child = c1.lock(&format!("{base}/b")).unwrap();
    child.acquire(WAIT).unwrap();
    let parent = c2.lock(&base).unwrap();
    assert_eq!(parent.try_acquire().unwrap_err(), Error::WouldBlock);
    child.release().unwrap();
    parent.try_acquire().unwrap();
    let other_child = c1.lock(&format!("{base}/c")).unwrap();
    other_child.try_acquire().unwrap();
    parent.release().unwrap();
    other_child.release().unwrap();

    let slash = c1.lock(&format!("{base}/")).unwrap();
    slash.acquire(WAIT).unwrap();
    assert_eq!(parent.try_acquire().unwrap_err(), Error::WouldBlock);
    slash.release().unwrap();
}

/// A guarded write decides by the lock service and by this handle's own
/// state: another client's handle of the same lock cannot write with a live
/// token it does not hold, a stale token is refused, and a key inside the
/// lock's own prefix is refused before any request.
pub fn guarded_writes_agree(c1: &Client, c2: &Client) {
    let name = fresh("guarded");
    let key = format!("{name}-data");
    let a = c1.lock(&name).unwrap();
    let t1 = a.acquire(WAIT).unwrap();
    a.guarded_put(t1, key.as_bytes(), b"one").unwrap();
    let other = c2.lock(&name).unwrap();
    assert_eq!(
        other.guarded_put(t1, key.as_bytes(), b"x").unwrap_err(),
        Error::Fenced(t1.get()),
        "a live token through a handle that does not hold it"
    );
    let own = format!("{name}/x");
    assert!(matches!(
        a.guarded_put(t1, own.as_bytes(), b"x").unwrap_err(),
        Error::InvalidArgument(m) if m.contains("prefix")
    ));
    assert!(matches!(
        a.guarded_put(t1, b"", b"x").unwrap_err(),
        Error::InvalidArgument(_)
    ));
    a.release().unwrap();
    assert_eq!(
        a.guarded_put(t1, key.as_bytes(), b"late").unwrap_err(),
        Error::Fenced(t1.get())
    );
    let t2 = other.acquire(WAIT).unwrap();
    assert!(t2 > t1);
    other.guarded_delete(t2, key.as_bytes()).unwrap();
    other.release().unwrap();
}

/// One acquire at a time per handle, whatever the backend's speed: of
/// concurrent calls one gets the token, every other `already_held`.
pub fn concurrent_acquires_on_one_handle(c1: &Client) {
    let lock = Arc::new(c1.lock(&fresh("concurrent")).unwrap());
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let l = lock.clone();
            std::thread::spawn(move || l.acquire(WAIT))
        })
        .collect();
    let results: Vec<Result<_, Error>> = calls.into_iter().map(|t| t.join().unwrap()).collect();
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(ok.len(), 1, "{results:?}");
    assert!(
        results
            .iter()
            .filter(|r| r.is_err())
            .all(|r| *r == Err(Error::AlreadyHeld)),
        "{results:?}"
    );
    lock.release().unwrap();
}

/// `acquire(0)` tries once, like `try_acquire`; a wait in the queue that
/// runs out is `timeout`.
pub fn zero_timeout_tries_once(c1: &Client, c2: &Client) {
    let name = fresh("zero");
    let a = c1.lock(&name).unwrap();
    a.acquire(Duration::ZERO).unwrap();
    let b = c2.lock(&name).unwrap();
    assert_eq!(b.acquire(Duration::ZERO).unwrap_err(), Error::WouldBlock);
    assert_eq!(
        b.acquire(Duration::from_millis(300)).unwrap_err(),
        Error::Timeout
    );
    a.release().unwrap();
    b.acquire(WAIT).unwrap();
    b.release().unwrap();
}

/// Defines one `#[test]` per parity case, each on two fresh clients from
/// the including file's `fn client() -> Client`. Attributes given
/// (`parity_tests!(#[ignore = "..."])`) go on every test.
#[macro_export]
macro_rules! parity_tests {
    ($(#[$attr:meta])*) => {
        #[test]
        $(#[$attr])*
        fn names_nest() {
            let (a, b) = (client(), client());
            $crate::parity::names_nest(&a, &b);
        }

        #[test]
        $(#[$attr])*
        fn guarded_writes_agree() {
            let (a, b) = (client(), client());
            $crate::parity::guarded_writes_agree(&a, &b);
        }

        #[test]
        $(#[$attr])*
        fn concurrent_acquires_on_one_handle() {
            let a = client();
            $crate::parity::concurrent_acquires_on_one_handle(&a);
        }

        #[test]
        $(#[$attr])*
        fn zero_timeout_tries_once() {
            let (a, b) = (client(), client());
            $crate::parity::zero_timeout_tries_once(&a, &b);
        }
    };
}
