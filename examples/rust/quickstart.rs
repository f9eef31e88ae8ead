//! Two holders contend for one lock on the embedded backend. Holder A works
//! under permits; its network is cut; it drains, then fences at its
//! deadline; B takes the lock with a higher token; A gets it back after.
//!
//! Run: `cargo run --example quickstart`. With `DLOCK_ENDPOINTS` set (and
//! the other `DLOCK_*` variables, see the README) the same story runs on
//! etcd: A reaches the first endpoint through a relay that the example cuts.
//! With `DLOCK_STORY=json` every event is also printed as a JSON line
//! (support/story.rs); `core/tests/examples.rs` checks the story that way.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use dlock::{EtcdConfig, Instant, Options};
use serde_json::{Value, json};

#[path = "support/network.rs"]
mod network;
#[path = "support/story.rs"]
mod story;

fn main() -> Result<(), dlock::Error> {
    run(story::json_from_env(), EtcdConfig::from_env()?)
}

/// The story, its JSON lines to `json`; on etcd with `etcd`, else embedded.
pub fn run(
    json: Option<Box<dyn Write + Send>>,
    etcd: Option<EtcdConfig>,
) -> Result<(), dlock::Error> {
    let story = story::Story::new(json);
    let start = story.start();
    let say = move |who: &str, event: Value, what: String| {
        let t = story.secs();
        story.tell(who, event, format_args!("{t:7.3}s  {who:<2} {what}"));
    };

    // Short settings so the story takes seconds: keepalive every second,
    // deadline = send time of the last confirmed keepalive + 3 s - 1 s.
    let options = Options {
        ttl: Duration::from_secs(3),
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_millis(300),
        retry_interval: Duration::from_millis(250),
        margin: Duration::from_secs(1),
        reacquire: true,
    };
    // A's network can be cut; B talks to the same service directly.
    let (client_a, net_a, client_b, backend) = network::clients(options, etcd)?;
    say(
        "--",
        json!({"event": "backend", "backend": backend}),
        format!("backend: {backend}"),
    );
    let a = client_a.lock("orders")?;
    let b = client_b.lock("orders")?;

    for (name, lock) in [("A", &a), ("B", &b)] {
        lock.on_state_change(move |c| {
            let event = json!({"event": "state", "from": c.from.to_string(),
                "to": c.to.to_string(), "reason": c.reason.to_string()});
            say(
                name,
                event,
                format!("{} -> {} ({})", c.from, c.to, c.reason),
            )
        });
        lock.on_acquired(move |t| {
            let event = json!({"event": "acquired", "token": t.get()});
            say(name, event, format!("acquired token {t}"))
        });
        lock.on_fence(move |t, n| {
            say(
                name,
                json!({"event": "fence", "token": t.get(), "in_flight": n}),
                format!("FENCED token {t} with {n} in flight: stop all work"),
            )
        });
    }
    a.on_drained(move || {
        let event = json!({"event": "drained"});
        say("A", event, "drained: no unit of work in flight".into())
    });

    let token = a.acquire(Duration::from_secs(5))?;
    let event = json!({"event": "holds", "token": token.get()});
    say("A", event, format!("holds the lock, token {token}"));

    let b = Arc::new(b);
    let waiter = {
        let b = b.clone();
        thread::spawn(move || {
            say("B", json!({"event": "waits"}), "waits for the lock".into());
            match b.acquire(Duration::from_secs(30)) {
                Ok(t) => {
                    let event = json!({"event": "holds", "token": t.get()});
                    say("B", event, format!("holds the lock, token {t}"))
                }
                Err(e) => {
                    let event = json!({"event": "acquire_failed", "error": e.to_string()});
                    say("B", event, format!("acquire failed: {e}"))
                }
            }
        })
    };

    // A's worker: one unit of work (200 ms) per permit; refused permits are
    // reported once per reason change.
    let a = Arc::new(a);
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (a, stop) = (a.clone(), stop.clone());
        thread::spawn(move || {
            let mut last_refusal = None;
            let mut unit = 0;
            while !stop.load(Ordering::Relaxed) {
                match a.permit() {
                    Ok(permit) => {
                        unit += 1;
                        last_refusal = None;
                        let token = permit.token();
                        let event =
                            json!({"event": "unit_start", "unit": unit, "token": token.get()});
                        say(
                            "A",
                            event,
                            format!("unit {unit} starts under token {token}"),
                        );
                        thread::sleep(Duration::from_millis(200));
                        let (event, commit) = if permit.valid() {
                            ("commit", "commits")
                        } else {
                            ("discard", "is discarded (deadline passed)")
                        };
                        let event = json!({"event": event, "unit": unit, "token": token.get()});
                        say("A", event, format!("unit {unit} {commit}"));
                    }
                    Err(r) => {
                        if last_refusal != Some(r) {
                            let event =
                                json!({"event": "permit_refused", "refused": format!("{r:?}")});
                            say("A", event, format!("permit refused: {r}"));
                            last_refusal = Some(r);
                        }
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
    };

    sleep_until(start, 1.5);
    say(
        "--",
        json!({"event": "cut", "of": "A"}),
        "fault: A's network is cut; its keepalives get no reply".into(),
    );
    net_a.cut();

    sleep_until(start, 5.0);
    say(
        "--",
        json!({"event": "heal", "of": "A"}),
        "fault healed: A's requests go through again".into(),
    );
    net_a.heal();

    sleep_until(start, 6.0);
    say("B", json!({"event": "release"}), "releases".into());
    b.release()?;
    waiter.join().unwrap();

    sleep_until(start, 7.0);
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    let (state, token) = (a.state(), a.token().map(|t| t.get()));
    say(
        "A",
        json!({"event": "release", "state": state.to_string(), "token": token}),
        format!("releases; state {state}, token {token:?}"),
    );
    a.release()?;
    Ok(())
}

fn sleep_until(start: Instant, secs: f64) {
    let at = start + Duration::from_secs_f64(secs);
    thread::sleep(at.saturating_since(dlock::clock::system_now()));
}
