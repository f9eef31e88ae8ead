//! Holder identity on the embedded engine (issue 31): a lock held by
//! another client names that client's host, pid, process start, face and
//! description; a semaphore's slot too; a bad description is refused.
//! The etcd and PostgreSQL cases are in core/tests/etcd.rs and
//! postgres.rs.

use std::time::Duration;

use dlock::{Client, ClientConfig, Error, MemoryService, Options};

fn client(service: &MemoryService, description: Option<&str>) -> Client {
    let mut config = ClientConfig::embedded_in(service.clone());
    if let Some(d) = description {
        config = config.with_description(d);
    }
    Client::connect(config).expect("embedded client")
}

#[test]
fn another_clients_lock_names_its_holder() {
    let service = MemoryService::new();
    let a = client(&service, Some("nightly backup #7"));
    let b = client(&service, None);
    let held = a.lock("jobs").unwrap();
    let seen = b.lock("jobs").unwrap();
    assert_eq!(seen.holder().unwrap(), None, "nothing holds it yet");

    let token = held.acquire(Duration::from_secs(5)).unwrap();
    let h = seen.holder().unwrap().expect("held");
    assert_eq!(h.token, token);
    assert_eq!(Some(h.lease), held.session().lease());
    assert_eq!(h.key, dlock::lock_key("jobs", h.lease));
    let id = h.identity.expect("dlock records its identity");
    assert_eq!(Some(&*id), a.identity());
    assert_eq!(id.description.as_deref(), Some("nightly backup #7"));
    assert_eq!(id.pid, std::process::id());
    assert_eq!((id.face.as_str(), id.version.as_str()), ("rust", "0.1.0"));
    assert!(!id.host.is_empty() && id.started.is_some(), "{id:?}");
    // b's own identity has no description.
    assert_eq!(b.identity().unwrap().description, None);

    held.release().unwrap();
    assert_eq!(seen.holder().unwrap(), None);
}

#[test]
fn every_session_of_a_client_carries_its_identity() {
    let service = MemoryService::new();
    let a = client(&service, Some("worker"));
    let own = a.session(Options::default()).unwrap();
    let held = own.lock("q").unwrap();
    held.acquire(Duration::from_secs(5)).unwrap();
    let seen = client(&service, None).lock("q").unwrap();
    let h = seen.holder().unwrap().unwrap();
    assert_eq!(Some(h.lease), own.lease());
    assert_eq!(h.identity.unwrap().description.as_deref(), Some("worker"));
}

#[test]
fn a_semaphore_slot_names_its_holder() {
    let service = MemoryService::new();
    let a = client(&service, Some("gpu job"));
    let sem = a.default_session().semaphore("gpu", 2).unwrap();
    let slot = sem.acquire(Duration::from_secs(5)).unwrap();
    let seen = client(&service, None).lock(slot.name()).unwrap();
    let h = seen.holder().unwrap().expect("the slot is held");
    assert_eq!(h.identity.unwrap().description.as_deref(), Some("gpu job"));
}

#[test]
fn a_bad_description_is_an_invalid_option() {
    let service = MemoryService::new();
    for bad in ["a\0b", "two\nlines", &"x".repeat(257)] {
        let r = Client::connect(ClientConfig::embedded_in(service.clone()).with_description(bad));
        match r {
            Err(e @ Error::InvalidOption { .. }) => {
                assert_eq!(e.code(), "invalid_option");
                assert!(e.to_string().contains("description"), "{e}");
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
}

#[test]
fn a_client_that_records_none_shows_its_lease_only() {
    let service = MemoryService::new();
    let mut config = ClientConfig::embedded_in(service.clone());
    config.identity.record = false;
    let quiet = Client::connect(config).unwrap();
    assert_eq!(quiet.identity(), None);
    let held = quiet.lock("q").unwrap();
    held.acquire(Duration::from_secs(5)).unwrap();
    let h = client(&service, None).lock("q").unwrap().holder().unwrap();
    let h = h.expect("held");
    assert_eq!((Some(h.lease), h.identity), (held.session().lease(), None));
}
