//! The examples' typed stories and their checks. With `DLOCK_STORY=json`
//! the examples (examples/rust/support/story.rs, examples/c/worker.c) print
//! each event as one JSON object on a line of its own, with `who`, `event`,
//! `t_ms` and the event's own fields; the human lines around them are not
//! read. Each check panics naming the broken step, with the whole story.
// Shared by several test binaries; each uses a part.
#![allow(dead_code)]

use std::fmt;
use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::Value;

/// The events of one story, in the order they were told.
pub struct Events(Vec<Value>);

/// An event and its place in the story.
pub type At<'a> = (usize, &'a Value);

impl Events {
    /// The JSON lines of `out` (a line starting with `{`), each checked to
    /// be an object with `who`, `event` and `t_ms`.
    pub fn parse(out: &str) -> Events {
        let events = out
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| {
                let v: Value = serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("not a JSON event ({e}): {l}"));
                for field in ["who", "event"] {
                    assert!(v[field].is_string(), "event without `{field}`: {l}");
                }
                assert!(v["t_ms"].is_u64(), "event without `t_ms`: {l}");
                v
            })
            .collect();
        Events(events)
    }

    /// How many events the story holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the story holds no event.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every event `event` of `who`, in order.
    pub fn all(&self, who: &str, event: &str) -> Vec<At<'_>> {
        self.0
            .iter()
            .enumerate()
            .filter(|(_, v)| v["who"] == who && v["event"] == event)
            .collect()
    }

    /// The first event `event` of `who` for which `pred` holds.
    pub fn first_where(&self, who: &str, event: &str, pred: impl Fn(&Value) -> bool) -> At<'_> {
        self.all(who, event)
            .into_iter()
            .find(|(_, v)| pred(v))
            .unwrap_or_else(|| panic!("no matching `{event}` of {who} in the story:\n{self}"))
    }

    pub fn first(&self, who: &str, event: &str) -> At<'_> {
        self.first_where(who, event, |_| true)
    }

    pub fn last(&self, who: &str, event: &str) -> At<'_> {
        *self
            .all(who, event)
            .last()
            .unwrap_or_else(|| panic!("no `{event}` of {who} in the story:\n{self}"))
    }

    /// The first state change of `who` into `to` (and `reason`, if given).
    pub fn entered(&self, who: &str, to: &str, reason: Option<&str>) -> At<'_> {
        self.first_where(who, "state", |v| {
            v["to"] == to && reason.is_none_or(|r| v["reason"] == r)
        })
    }

    /// Asserts that the events at `places` come in that order.
    pub fn in_order(&self, places: &[(&str, At<'_>)]) {
        for w in places.windows(2) {
            let ((a, (i, _)), (b, (j, _))) = (w[0], w[1]);
            assert!(
                i < j,
                "expected {a} (event {i}) before {b} (event {j}) in the story:\n{self}"
            );
        }
    }
}

impl fmt::Display for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, v) in self.0.iter().enumerate() {
            writeln!(f, "  {i:3} {v}")?;
        }
        Ok(())
    }
}

/// A numeric field.
pub fn num(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("`{field}` is not a number in {v}"))
}

/// Where an example run in this process tells its typed story.
#[derive(Clone, Default)]
pub struct Capture(Arc<Mutex<Vec<u8>>>);

impl Capture {
    /// A writer to pass to an example's `run`.
    pub fn sink(&self) -> Option<Box<dyn Write + Send>> {
        Some(Box::new(self.clone()))
    }

    pub fn events(&self) -> Events {
        let bytes = self.0.lock().unwrap().clone();
        Events::parse(&String::from_utf8(bytes).expect("the story is UTF-8"))
    }
}

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// --- the stories -------------------------------------------------------------

/// examples/rust/quickstart.rs on `backend` ("embedded" or "etcd"): A drains,
/// then fences its token before B acquires a higher one; A starts no work
/// under the fenced token after the fence, and gets the lock back (a token
/// above B's) after B releases.
pub fn quickstart(ev: &Events, backend: &str) {
    assert_eq!(ev.first("--", "backend").1["backend"], backend, "{ev}");
    let holds = ev.first("A", "holds");
    let ta = num(holds.1, "token");
    let drain = ev.entered("A", "Draining", None);
    let drained = ev.first("A", "drained");
    let fence = ev.first("A", "fence");
    assert_eq!(num(fence.1, "token"), ta, "A fences its own token:\n{ev}");
    let b_acquired = ev.first("B", "acquired");
    let b_holds = ev.first("B", "holds");
    let tb = num(b_holds.1, "token");
    assert!(tb > ta, "B's token {tb} should be above A's {ta}:\n{ev}");
    if backend == "embedded" {
        assert_eq!((ta, tb), (1, 2), "embedded tokens:\n{ev}");
    }
    ev.in_order(&[
        ("A holds", holds),
        ("A draining", drain),
        ("A drained", drained),
        ("A's fence", fence),
        ("B acquired", b_acquired),
    ]);
    ev.in_order(&[("A's fence", fence), ("B holds", b_holds)]);
    for event in ["unit_start", "commit"] {
        if let Some((i, v)) = ev
            .all("A", event)
            .into_iter()
            .find(|(i, v)| *i > fence.0 && num(v, "token") == ta)
        {
            panic!("A's `{event}` (event {i}) under token {ta} after its fence: {v}\n{ev}");
        }
    }
    let b_release = ev.first("B", "release");
    let back = ev.first_where("A", "acquired", |v| num(v, "token") > tb);
    ev.in_order(&[("B releases", b_release), ("A acquires again", back)]);
}

/// examples/rust/fence_gate.rs: A's stale write (its first token) is refused
/// by the store, B's write with a higher token stands.
pub fn fence_gate(ev: &Events) {
    let start = ev.first("A", "unit_start");
    let ta = num(start.1, "token");
    let b = ev.first("B", "acquired");
    let tb = num(b.1, "token");
    assert!(tb > ta, "B's token {tb} should be above A's {ta}:\n{ev}");
    let b_wrote = ev.first("B", "wrote");
    assert_eq!(num(b_wrote.1, "token"), tb, "{ev}");
    let wakes = ev.first("A", "wakes");
    assert_eq!(
        wakes.1["valid"], false,
        "A's permit is dead when it wakes:\n{ev}"
    );
    let refused = ev.first("A", "write_refused");
    assert_eq!(
        num(refused.1, "token"),
        ta,
        "the refused write is A's:\n{ev}"
    );
    assert_eq!(refused.1["by"], "store", "{ev}");
    assert!(
        ev.all("A", "wrote").is_empty(),
        "A's stale write went through:\n{ev}"
    );
    let store = ev.last("store", "store");
    assert_eq!(
        store.1["value"], "written by B",
        "the store keeps B's write:\n{ev}"
    );
    ev.in_order(&[
        ("A starts", start),
        ("B writes", b_wrote),
        ("A's write refused", refused),
        ("the store read", store),
    ]);
}

/// examples/rust/guarded_write.rs on `backend`: A is fenced, B writes with a
/// higher token, and A's late guarded write with its old token is refused by
/// the lock service itself.
pub fn guarded_write(ev: &Events, backend: &str) {
    assert_eq!(ev.first("--", "backend").1["backend"], backend, "{ev}");
    let holds = ev.first("A", "holds");
    let ta = num(holds.1, "token");
    let cut = ev.first("--", "cut");
    let fence = ev.first("A", "fence");
    assert_eq!(num(fence.1, "token"), ta, "{ev}");
    let b_holds = ev.first("B", "holds");
    let tb = num(b_holds.1, "token");
    assert!(tb > ta, "B's token {tb} should be above A's {ta}:\n{ev}");
    let b_wrote = ev.first("B", "wrote");
    let heal = ev.first("--", "heal");
    let refused = ev.first("A", "write_refused");
    assert_eq!(refused.1["by"], "service", "{ev}");
    assert_eq!(
        num(refused.1, "token"),
        ta,
        "the refused token is A's:\n{ev}"
    );
    assert!(ev.all("A", "unexpected").is_empty(), "{ev}");
    ev.in_order(&[
        ("A holds", holds),
        ("the cut", cut),
        ("A's fence", fence),
        ("B holds", b_holds),
        ("B writes", b_wrote),
        ("the heal", heal),
        ("A's write refused", refused),
        ("B's cleanup", ev.first("B", "cleanup")),
    ]);
}

/// examples/c/worker.c on the embedded backend: commits, then the drain,
/// then the fence of its token, then a clean stop with nothing in flight;
/// no commit after the fence.
pub fn c_worker_embedded(ev: &Events) {
    let holds = ev.first("worker", "holds");
    assert_eq!(holds.1["backend"], "embedded", "{ev}");
    let token = num(holds.1, "token");
    assert_eq!(token, 1, "{ev}");
    let first_commit = ev.first("worker", "commit");
    let last_commit = ev.last("worker", "commit");
    for (_, c) in ev.all("worker", "commit") {
        assert_eq!(num(c, "token"), token, "{ev}");
    }
    let drain = ev.entered("worker", "Draining", None);
    let fence = ev.first("worker", "fence");
    assert_eq!(num(fence.1, "token"), token, "{ev}");
    let stop = ev.first("worker", "stopped");
    assert_eq!(num(stop.1, "in_flight"), 0, "a clean stop:\n{ev}");
    ev.in_order(&[
        ("holds", holds),
        ("the first commit", first_commit),
        ("the drain", drain),
        ("the fence", fence),
        ("the stop", stop),
    ]);
    ev.in_order(&[("the last commit", last_commit), ("the fence", fence)]);
}

/// examples/c/worker.c on etcd, its lock key deleted by an operator after
/// its commits: it fences at once (lock_lost), etcd refuses a late write
/// under the old token, it stops cleanly. Returns the last commit as the
/// worker wrote it to etcd (`unit N token T`), for the caller to read back.
pub fn c_worker_etcd(ev: &Events) -> String {
    let holds = ev.first("worker", "holds");
    assert_eq!(holds.1["backend"], "etcd", "{ev}");
    let token = num(holds.1, "token");
    let commits = ev.all("worker", "commit");
    assert!(
        commits.len() >= 2,
        "at least 2 commits before the delete:\n{ev}"
    );
    for (_, c) in &commits {
        assert_eq!(num(c, "token"), token, "{ev}");
        assert_eq!(c["guarded"], true, "{ev}");
    }
    let last_commit = ev.last("worker", "commit");
    let lost = ev.entered("worker", "Fenced", Some("lock_lost"));
    let fence = ev.first("worker", "fence");
    assert_eq!(num(fence.1, "token"), token, "{ev}");
    let late = ev.first("worker", "late_write");
    assert_eq!(num(late.1, "token"), token, "{ev}");
    assert_eq!(late.1["refused"], true, "etcd refuses the old token:\n{ev}");
    assert_eq!(late.1["status"], "fenced", "{ev}");
    let stop = ev.first("worker", "stopped");
    assert_eq!(num(stop.1, "in_flight"), 0, "a clean stop:\n{ev}");
    ev.in_order(&[
        ("holds", holds),
        ("lock_lost", lost),
        ("the late write", late),
    ]);
    ev.in_order(&[("the fence", fence), ("the late write", late)]);
    ev.in_order(&[
        ("the last commit", last_commit),
        ("the late write", late),
        ("the stop", stop),
    ]);
    format!(
        "unit {} token {}",
        num(last_commit.1, "unit"),
        num(last_commit.1, "token")
    )
}
