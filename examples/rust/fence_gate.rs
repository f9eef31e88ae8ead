//! Why resources check tokens: holder A starts a unit of work, then freezes
//! (a GC pause, SIGSTOP) past its deadline while cut off. B takes the lock
//! with a higher token and writes. A wakes up and tries to commit with its
//! old token: the resource's `FenceGate` refuses it.
//!
//! Run: `cargo run --example fence_gate`

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dlock::{Client, FenceGate, MemoryService, Options, Token};

/// A toy resource: a value that only accepts writes with a current token.
struct Store {
    gate: FenceGate,
    value: std::sync::Mutex<String>,
}

impl Store {
    fn write(&self, token: Token, value: &str) -> Result<(), dlock::Stale> {
        self.gate.admit("orders", token)?;
        *self.value.lock().unwrap() = value.to_string();
        Ok(())
    }
}

fn main() -> Result<(), dlock::Error> {
    let options = Options {
        ttl: Duration::from_secs(2),
        keepalive_interval: Duration::from_millis(500),
        keepalive_timeout: Duration::from_millis(200),
        retry_interval: Duration::from_millis(200),
        margin: Duration::from_millis(500),
        reacquire: false,
    };
    let store = Arc::new(Store {
        gate: FenceGate::new(),
        value: Default::default(),
    });
    let service = MemoryService::new();
    let link_a = service.link();
    let a = Client::new(link_a.clone(), options.clone())?.lock("orders")?;
    let b = Client::new(service.link(), options)?.lock("orders")?;

    a.acquire(Duration::from_secs(5))?;
    let permit = a.permit().expect("holding");
    println!("A: starts a unit of work under token {}", permit.token());

    // A freezes for 3 s and its network is cut meanwhile.
    link_a.partition();
    let b_thread = {
        let store = store.clone();
        thread::spawn(move || {
            let t = b.acquire(Duration::from_secs(10)).expect("B acquires");
            println!("B: acquired token {t}");
            let p = b.permit().expect("holding");
            store
                .write(p.token(), "written by B")
                .expect("B's token is current");
            println!("B: wrote with token {}", p.token());
        })
    };
    thread::sleep(Duration::from_secs(3));

    println!("A: wakes up; permit.valid() = {}", permit.valid());
    match store.write(permit.token(), "written by A") {
        Ok(()) => println!("A: wrote (this must not happen)"),
        Err(stale) => println!("A: the store refused the write: {stale}"),
    }
    b_thread.join().unwrap();
    println!("store holds: {:?}", store.value.lock().unwrap());
    Ok(())
}
