//! Semaphore cases every engine plays alike (etcd_semaphore.rs and
//! postgres_semaphore.rs): `client` makes a client of the engine under
//! test, `name` is the case's own semaphore name.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use dlock::{Client, Lock, State, Token};
use dlock_testkit::watch;

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

/// Three holders of a limit-3 semaphore; `delete` is an operator deleting
/// the middle holder's slot (its key or row): that holder alone fences,
/// then takes its own slot again with a higher token, while the other two
/// keep their tokens and hold.
pub fn a_slot_deleted_by_an_operator_fences_that_holder_alone(
    client: &dyn Fn() -> Client,
    name: &str,
    event: Duration,
    delete: &dyn Fn(&Lock),
) {
    let holders: Vec<Lock> = (0..3)
        .map(|_| client().semaphore(name, 3).unwrap().acquire(event).unwrap())
        .collect();
    let before: Vec<Token> = holders.iter().map(|l| l.token().unwrap()).collect();
    let fenced: Vec<_> = holders.iter().map(watch::fences).collect();
    let acquired: Vec<_> = holders.iter().map(watch::acquisitions).collect();
    let cut = &holders[1];
    delete(cut);
    assert_eq!(fenced[1].recv_timeout(event).unwrap(), before[1]);
    let again = acquired[1].recv_timeout(event).unwrap();
    assert!(
        again > before[1],
        "its own slot, higher: {again} > {}",
        before[1]
    );
    watch::until("holding again", event, || cut.state() == State::Holding);
    assert_eq!(cut.token(), Some(again));
    for i in [0, 2] {
        assert!(fenced[i].try_recv().is_err(), "holder {i} untouched");
        assert_eq!(holders[i].token(), Some(before[i]));
        assert_eq!(holders[i].state(), State::Holding);
    }
}
