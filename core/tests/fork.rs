//! A child of fork() holds nothing and cannot touch the parent's lease.
#![cfg(unix)]

use std::time::Duration;

use dlock::{Client, Error, MemoryService, Refused, State};

use dlock_testkit as common;

#[test]
fn a_forked_child_holds_nothing() {
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
