//! Plays every file in `scenarios/` on the memory backend with real time and
//! compares the callback trace with the file's. The C, Python and Node suites
//! play the same files; see `scenarios/README.md` for the format.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use dlock::{Client, Lock, MemoryBackend, MemoryService, Options, OwnedPermit};
use serde_json::Value;

const WAIT_LIMIT: Duration = Duration::from_secs(10);

fn now_ms(start: dlock::Instant) -> u64 {
    (dlock::clock::system_now() - start).as_millis() as u64
}

/// The trace: callback events with their time since the scenario started.
struct Trace {
    start: dlock::Instant,
    events: Mutex<Vec<(u64, String)>>,
    grew: Condvar,
}

impl Trace {
    fn push(&self, e: String) {
        let at = now_ms(self.start);
        self.events.lock().unwrap().push((at, e));
        self.grew.notify_all();
    }

    /// Waits until `event` appears at or after index `from`; returns its index.
    fn wait_for(&self, event: &str, from: usize) -> Result<usize, String> {
        let events = self.events.lock().unwrap();
        let (events, _) = self
            .grew
            .wait_timeout_while(events, WAIT_LIMIT, |ev| {
                !ev.iter().skip(from).any(|(_, e)| e == event)
            })
            .unwrap();
        events
            .iter()
            .skip(from)
            .position(|(_, e)| e == event)
            .map(|i| i + from)
            .ok_or_else(|| format!("no `{event}` within {WAIT_LIMIT:?}"))
    }

    fn wait_len(&self, n: usize) -> Vec<(u64, String)> {
        let events = self.events.lock().unwrap();
        let (events, _) = self
            .grew
            .wait_timeout_while(events, WAIT_LIMIT, |ev| ev.len() < n)
            .unwrap();
        events.clone()
    }
}

struct Holder {
    link: MemoryBackend,
    lock: Arc<Lock>,
}

fn ms(v: &Value, key: &str) -> Duration {
    Duration::from_millis(
        v[key]
            .as_u64()
            .unwrap_or_else(|| panic!("`{key}` must be a number")),
    )
}

fn play(path: &Path) -> Result<(), String> {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .map_err(|e| format!("bad JSON: {e}"))?;
    let s = &doc["settings"];
    let options = Options {
        ttl: ms(s, "ttl_ms"),
        keepalive_interval: ms(s, "keepalive_interval_ms"),
        keepalive_timeout: ms(s, "keepalive_timeout_ms"),
        retry_interval: ms(s, "retry_interval_ms"),
        margin: ms(s, "margin_ms"),
        reacquire: true,
    };
    let service = MemoryService::new();
    let trace = Arc::new(Trace {
        start: dlock::clock::system_now(),
        events: Mutex::new(Vec::new()),
        grew: Condvar::new(),
    });
    let mut holders = HashMap::new();
    for h in doc["holders"].as_array().unwrap() {
        let h = h.as_str().unwrap().to_string();
        let link = service.link();
        let client = Client::new(link.clone(), options.clone()).map_err(|e| e.to_string())?;
        let lock = Arc::new(client.lock(&format!("scenario/{}", doc["name"])).unwrap());
        let (t, n) = (trace.clone(), h.clone());
        lock.on_state_change(move |c| {
            t.push(format!("{n} state {}->{} {}", c.from, c.to, c.reason))
        });
        let (t, n) = (trace.clone(), h.clone());
        lock.on_acquired(move |tok| t.push(format!("{n} acquired token={tok}")));
        let (t, n) = (trace.clone(), h.clone());
        lock.on_fence(move |tok, k| t.push(format!("{n} fence token={tok} in_flight={k}")));
        let (t, n) = (trace.clone(), h.clone());
        lock.on_drained(move || t.push(format!("{n} drained")));
        holders.insert(h, Holder { link, lock });
    }
    let mut permits: HashMap<String, OwnedPermit> = HashMap::new();
    let mut cursor = 0;
    for (i, step) in doc["steps"].as_array().unwrap().iter().enumerate() {
        let fail = |m: String| format!("step {i} {step}: {m}");
        if let Some(at) = step["at"].as_u64() {
            let elapsed = now_ms(trace.start);
            if at > elapsed {
                std::thread::sleep(Duration::from_millis(at - elapsed));
            }
        }
        let holder = step["holder"].as_str().map(|h| &holders[h]);
        let expect = &step["expect"];
        match step["do"].as_str().unwrap() {
            "acquire" => {
                let lock = holder.unwrap().lock.clone();
                std::thread::spawn(move || lock.acquire(WAIT_LIMIT));
            }
            "try_acquire" => {
                let got = match holder.unwrap().lock.try_acquire() {
                    Ok(_) => "ok",
                    Err(e) => e.code(),
                };
                if got != expect.as_str().unwrap() {
                    return Err(fail(format!("try_acquire gave {got}")));
                }
            }
            "permit" => {
                let got = holder.unwrap().lock.permit_owned();
                let word = got
                    .as_ref()
                    .map(|_| "granted")
                    .unwrap_or_else(|r| r.as_str());
                if word != expect.as_str().unwrap() {
                    return Err(fail(format!("permit gave {word}")));
                }
                if let (Ok(p), Some(t)) = (&got, step["token"].as_u64()) {
                    if p.token().get() != t {
                        return Err(fail(format!("permit token {}", p.token())));
                    }
                }
                if let (Ok(p), Some(label)) = (got, step["as"].as_str()) {
                    permits.insert(label.to_string(), p);
                }
            }
            "end" => {
                permits
                    .remove(step["permit"].as_str().unwrap())
                    .ok_or_else(|| fail("no such permit".into()))?
                    .end();
            }
            "valid" => {
                let p = &permits[step["permit"].as_str().unwrap()];
                if p.valid() != expect.as_bool().unwrap() {
                    return Err(fail(format!("valid() was {}", p.valid())));
                }
            }
            "state" => {
                let got = holder.unwrap().lock.state();
                if got.as_str() != expect.as_str().unwrap() {
                    return Err(fail(format!("state was {got}")));
                }
            }
            "token" => {
                let got = holder.unwrap().lock.token().map(|t| t.get());
                if got != expect.as_u64() {
                    return Err(fail(format!("token was {got:?}")));
                }
            }
            "release" => holder
                .unwrap()
                .lock
                .release()
                .map_err(|e| fail(e.to_string()))?,
            "wait" => {
                cursor = trace
                    .wait_for(step["event"].as_str().unwrap(), cursor)
                    .map_err(fail)?
            }
            "stall_driver" => dlock::memory::stall_driver(ms(step, "ms")),
            "fault" => {
                let link = &holder.unwrap().link;
                match step["fault"].as_str().unwrap() {
                    "partition" => link.partition(),
                    "heal" => link.heal(),
                    "drop_replies" => link.drop_keepalive_replies(true),
                    "keep_replies" => link.drop_keepalive_replies(false),
                    "delay_replies" => link.delay_keepalive_replies(ms(step, "ms")),
                    "fail_keepalives" => link.fail_keepalives(Some("injected failure")),
                    "stop_failing" => link.fail_keepalives(None),
                    "lease_lost" => link.declare_lease_lost(),
                    "freeze_expiry" => service.freeze_expiry(true),
                    "thaw_expiry" => service.freeze_expiry(false),
                    other => return Err(fail(format!("unknown fault {other}"))),
                }
            }
            other => return Err(fail(format!("unknown step {other}"))),
        }
    }
    let expected = doc["trace"].as_array().unwrap();
    let actual = trace.wait_len(expected.len());
    let show = || {
        actual
            .iter()
            .map(|(t, e)| format!("  {t:>5} ms  {e}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if actual.len() != expected.len() {
        return Err(format!(
            "trace has {} events, expected {}:\n{}",
            actual.len(),
            expected.len(),
            show()
        ));
    }
    for (i, (want, (at, got))) in expected.iter().zip(&actual).enumerate() {
        let want = want.as_str().unwrap();
        let (event, window) = match want.split_once(" @") {
            Some((e, w)) => {
                let (lo, hi) = w.split_once("..").expect("window is lo..hi");
                (
                    e,
                    Some((lo.parse::<u64>().unwrap(), hi.parse::<u64>().unwrap())),
                )
            }
            None => (want, None),
        };
        if event != got {
            return Err(format!(
                "trace event {i}: expected `{event}`, got `{got}`:\n{}",
                show()
            ));
        }
        if let Some((lo, hi)) = window {
            if !(lo..=hi).contains(at) {
                return Err(format!(
                    "`{event}` at {at} ms, expected {lo}..{hi} ms:\n{}",
                    show()
                ));
            }
        }
    }
    drop(holders);
    eprintln!("{}: ok\n{}", path.display(), show());
    Ok(())
}

/// One test plays the files one after another: scenario `g` stalls the
/// process-wide driver thread, which would disturb scenarios played beside it.
#[test]
fn scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 8,
        "expected the eight scenarios, found {files:?}"
    );
    let only = std::env::var("DLOCK_SCENARIO").ok();
    let mut failures = Vec::new();
    for f in &files {
        if only
            .as_deref()
            .is_some_and(|o| !f.to_string_lossy().contains(o))
        {
            continue;
        }
        if let Err(e) = play(f) {
            failures.push(format!("{}: {e}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
