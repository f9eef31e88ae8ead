//! Why resources check tokens: holder A starts a unit of work, then freezes
//! (a GC pause, SIGSTOP) past its deadline while cut off. B takes the lock
//! with a higher token and writes. A wakes up and tries to commit with its
//! old token: the resource's `FenceGate` refuses it.
//!
//! Run: `cargo run --example fence_gate`. With `DLOCK_STORY=json` every
//! event is also printed as a JSON line (support/story.rs);
//! `core/tests/examples.rs` checks the story that way.

use std::io::Write;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use dlock::{Client, FenceGate, MemoryService, Options, Token};
use serde_json::json;

#[path = "support/story.rs"]
mod story;

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
    run(story::json_from_env())
}

/// The story, its JSON lines to `json`.
pub fn run(json: Option<Box<dyn Write + Send>>) -> Result<(), dlock::Error> {
    let story = story::Story::new(json);
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
    let token = permit.token();
    story.tell(
        "A",
        json!({"event": "unit_start", "token": token.get()}),
        format_args!("A: starts a unit of work under token {token}"),
    );

    // A freezes for 3 s and its network is cut meanwhile.
    link_a.partition();
    let b_thread = {
        let store = store.clone();
        thread::spawn(move || {
            let t = b.acquire(Duration::from_secs(10)).expect("B acquires");
            let event = json!({"event": "acquired", "token": t.get()});
            story.tell("B", event, format_args!("B: acquired token {t}"));
            let p = b.permit().expect("holding");
            store
                .write(p.token(), "written by B")
                .expect("B's token is current");
            let event =
                json!({"event": "wrote", "token": p.token().get(), "value": "written by B"});
            story.tell(
                "B",
                event,
                format_args!("B: wrote with token {}", p.token()),
            );
        })
    };
    thread::sleep(Duration::from_secs(3));

    let valid = permit.valid();
    let event = json!({"event": "wakes", "valid": valid});
    story.tell(
        "A",
        event,
        format_args!("A: wakes up; permit.valid() = {valid}"),
    );
    match store.write(token, "written by A") {
        Ok(()) => {
            let event = json!({"event": "wrote", "token": token.get(), "value": "written by A"});
            story.tell("A", event, "A: wrote (this must not happen)")
        }
        Err(stale) => {
            let event = json!({"event": "write_refused", "token": token.get(), "by": "store",
                "error": stale.to_string()});
            story.tell(
                "A",
                event,
                format_args!("A: the store refused the write: {stale}"),
            )
        }
    }
    b_thread.join().unwrap();
    let value = store.value.lock().unwrap().clone();
    let event = json!({"event": "store", "value": value});
    story.tell("store", event, format_args!("store holds: {value:?}"));
    Ok(())
}
