//! Semaphore cases every engine plays alike (etcd_semaphore.rs and
//! postgres_semaphore.rs): `client` makes a client of the engine under
//! test, `name` is the case's own semaphore name.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use dlock::Client;

/// Two holders of a limit-2 semaphore and two waiters: nobody wakes while
/// both slots are held; a release wakes exactly one waiter, onto the slot
/// released, with a higher token; the second release wakes the other.
pub fn a_release_wakes_one_waiter_onto_that_slot(
    client: &dyn Fn() -> Client,
    name: &str,
    event: Duration,
) {
    let a = client().semaphore(name, 2).unwrap().acquire(event).unwrap();
    let b = client().semaphore(name, 2).unwrap().acquire(event).unwrap();
    let (tx, rx) = mpsc::channel();
    let waiters: Vec<_> = (0..2)
        .map(|i| {
            let sem = client().semaphore(name, 2).unwrap();
            let tx = tx.clone();
            thread::spawn(move || {
                let l = sem.acquire(event).unwrap();
                tx.send((i, l.slot().unwrap(), l.token().unwrap())).unwrap();
                l
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(500));
    assert!(rx.try_recv().is_err(), "both slots held: nobody wakes");
    let (slot, token) = (a.slot().unwrap(), a.token().unwrap());
    a.release().unwrap();
    let (first, woke_slot, woke_token) = rx.recv_timeout(event).unwrap();
    assert_eq!(woke_slot, slot);
    assert!(woke_token > token, "tokens rise per slot");
    assert!(
        rx.recv_timeout(Duration::from_millis(700)).is_err(),
        "one release, one waiter"
    );
    drop(b);
    let (second, _, _) = rx.recv_timeout(event).unwrap();
    assert_ne!(first, second);
    drop(
        waiters
            .into_iter()
            .map(|w| w.join().unwrap())
            .collect::<Vec<_>>(),
    );
}
