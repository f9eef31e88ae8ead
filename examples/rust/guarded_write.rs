//! A fenced write refused by the server. Holder A writes `orders/total`
//! with guarded writes (committed only while A's token still holds the
//! lock); A's network is cut, A fences, B takes the lock and writes; A's
//! network heals and A, a slow worker that did not check its permit, tries
//! to write with its old token: the service refuses it.
//!
//! Run: `cargo run --example guarded_write` (embedded backend), or with
//! `DLOCK_ENDPOINTS` set to run it on etcd (an etcd transaction comparing
//! the lock key's `create_revision` with the token). With `DLOCK_STORY=json`
//! every event is also printed as a JSON line (support/story.rs);
//! `core/tests/examples*.rs` check the story that way.

use std::io::Write;
use std::time::Duration;

use dlock::{Error, EtcdConfig, Options};
use serde_json::json;

#[path = "support/network.rs"]
mod network;
#[path = "support/story.rs"]
mod story;

fn main() -> Result<(), Error> {
    run(story::json_from_env(), EtcdConfig::from_env()?)
}

/// The story, its JSON lines to `json`; on etcd with `etcd`, else embedded.
pub fn run(json: Option<Box<dyn Write + Send>>, etcd: Option<EtcdConfig>) -> Result<(), Error> {
    let story = story::Story::new(json);
    let options = Options {
        ttl: Duration::from_secs(3),
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_millis(300),
        retry_interval: Duration::from_millis(250),
        margin: Duration::from_secs(1),
        // A stays fenced: this story is about its stale token.
        reacquire: false,
    };
    let (client_a, net_a, client_b, backend) = network::clients(options, etcd)?;
    let event = json!({"event": "backend", "backend": backend});
    story.tell("--", event, format_args!("backend: {backend}"));
    let name = format!("guarded-write-example-{}", std::process::id());
    // Not under `<name>/`: those keys are the lock's queue.
    let key = format!("{name}-data/total");
    let (a, b) = (client_a.lock(&name)?, client_b.lock(&name)?);
    let (fenced_tx, fenced) = std::sync::mpsc::channel();
    let fenced_tx = std::sync::Mutex::new(fenced_tx);
    a.on_fence(move |token, _| {
        let event = json!({"event": "fence", "token": token.get()});
        story.tell("A", event, format_args!("A: FENCED token {token}"));
        let _ = fenced_tx.lock().unwrap().send(());
    });

    let ta = a.acquire(Duration::from_secs(5))?;
    let event = json!({"event": "holds", "token": ta.get()});
    story.tell("A", event, format_args!("A: holds the lock, token {ta}"));
    a.guarded_put(ta, key.as_bytes(), b"100")?;
    let event = json!({"event": "wrote", "token": ta.get(), "value": "100"});
    story.tell(
        "A",
        event,
        format_args!("A: wrote total=100 with token {ta}"),
    );

    let event = json!({"event": "cut", "of": "A"});
    story.tell("--", event, "-- A's network is cut");
    net_a.cut();
    fenced
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| Error::Backend("A was not fenced".into()))?;
    let tb = b.acquire(Duration::from_secs(10))?;
    let event = json!({"event": "holds", "token": tb.get()});
    story.tell("B", event, format_args!("B: holds the lock, token {tb}"));
    b.guarded_put(tb, key.as_bytes(), b"200")?;
    let event = json!({"event": "wrote", "token": tb.get(), "value": "200"});
    story.tell(
        "B",
        event,
        format_args!("B: wrote total=200 with token {tb}"),
    );

    let event = json!({"event": "heal", "of": "A"});
    story.tell(
        "--",
        event,
        "-- A's network heals; A writes with its old token",
    );
    net_a.heal();
    match a.guarded_put(ta, key.as_bytes(), b"150") {
        Err(Error::Fenced(t)) => {
            let event = json!({"event": "write_refused", "token": t, "by": "service"});
            story.tell(
                "A",
                event,
                format_args!("A: the service refused the write: fenced token {t}"),
            )
        }
        other => {
            let event = json!({"event": "unexpected", "result": format!("{other:?}")});
            story.tell("A", event, format_args!("A: unexpected: {other:?}"));
            return Err(Error::Backend("a stale write was not refused".into()));
        }
    }
    b.guarded_delete(tb, key.as_bytes())?;
    let event = json!({"event": "cleanup", "token": tb.get()});
    story.tell("B", event, format_args!("B: cleaned up with token {tb}"));
    b.release()?;
    a.release()?;
    Ok(())
}
