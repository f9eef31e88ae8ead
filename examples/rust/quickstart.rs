//! Two holders contend for one lock on the embedded backend. Holder A works
//! under permits; its network is cut; it drains, then fences at its
//! deadline; B takes the lock with a higher token; A gets it back after.
//!
//! Run: `cargo run --example quickstart`. With `DLOCK_ENDPOINTS` set (and
//! the other `DLOCK_*` variables, see the README) the same story runs on
//! etcd: A reaches the first endpoint through a relay that the example cuts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use dlock::{Instant, Options};

#[path = "support/network.rs"]
mod network;

fn main() -> Result<(), dlock::Error> {
    let start = dlock::clock::system_now();
    let say = move |who: &str, what: String| {
        let t = (dlock::clock::system_now() - start).as_secs_f64();
        println!("{t:7.3}s  {who:<2} {what}");
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
    let (client_a, net_a, client_b, backend) = network::clients(options)?;
    say("--", format!("backend: {backend}"));
    let a = client_a.lock("orders")?;
    let b = client_b.lock("orders")?;

    for (name, lock) in [("A", &a), ("B", &b)] {
        lock.on_state_change(move |c| say(name, format!("{} -> {} ({})", c.from, c.to, c.reason)));
        lock.on_acquired(move |t| say(name, format!("acquired token {t}")));
        lock.on_fence(move |t, n| {
            say(
                name,
                format!("FENCED token {t} with {n} in flight: stop all work"),
            )
        });
    }
    a.on_drained(move || say("A", "drained: no unit of work in flight".into()));

    let token = a.acquire(Duration::from_secs(5))?;
    say("A", format!("holds the lock, token {token}"));

    let b = Arc::new(b);
    let waiter = {
        let b = b.clone();
        thread::spawn(move || {
            say("B", "waits for the lock".into());
            match b.acquire(Duration::from_secs(30)) {
                Ok(t) => say("B", format!("holds the lock, token {t}")),
                Err(e) => say("B", format!("acquire failed: {e}")),
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
                        say(
                            "A",
                            format!("unit {unit} starts under token {}", permit.token()),
                        );
                        thread::sleep(Duration::from_millis(200));
                        let commit = if permit.valid() {
                            "commits"
                        } else {
                            "is discarded (deadline passed)"
                        };
                        say("A", format!("unit {unit} {commit}"));
                    }
                    Err(r) => {
                        if last_refusal != Some(r) {
                            say("A", format!("permit refused: {r}"));
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
        "fault: A's network is cut; its keepalives get no reply".into(),
    );
    net_a.cut();

    sleep_until(start, 5.0);
    say("--", "fault healed: A's requests go through again".into());
    net_a.heal();

    sleep_until(start, 6.0);
    say("B", "releases".into());
    b.release()?;
    waiter.join().unwrap();

    sleep_until(start, 7.0);
    stop.store(true, Ordering::Relaxed);
    worker.join().unwrap();
    say(
        "A",
        format!(
            "releases; state {}, token {:?}",
            a.state(),
            a.token().map(|t| t.get())
        ),
    );
    a.release()?;
    Ok(())
}

fn sleep_until(start: Instant, secs: f64) {
    let at = start + Duration::from_secs_f64(secs);
    thread::sleep(at.saturating_since(dlock::clock::system_now()));
}
