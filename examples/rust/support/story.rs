//! The story an example tells, twice: a human line per event on stdout, and
//! (with `DLOCK_STORY=json`) the same event as one JSON object on a line of
//! its own, for programs: `{"event":"fence","t_ms":3002,"token":1,"who":"A"}`.
//! Every object has `who`, `event` and `t_ms` (milliseconds since the story
//! began), plus the event's own fields. `core/tests/examples*.rs` read them.

// Each example uses a part.
#![allow(dead_code)]

use std::fmt::Display;
use std::io::Write;
use std::sync::Mutex;

use dlock::Instant;
use serde_json::Value;

pub struct Story {
    start: Instant,
    json: Mutex<Option<Box<dyn Write + Send>>>,
}

/// Where `DLOCK_STORY` sends the typed story: stdout for `json`, nowhere
/// when unset or empty.
pub fn json_from_env() -> Option<Box<dyn Write + Send>> {
    match std::env::var("DLOCK_STORY").as_deref() {
        Ok("json") => Some(Box::new(std::io::stdout())),
        Ok("") | Err(_) => None,
        Ok(other) => panic!("DLOCK_STORY={other:?}: the one format is `json`"),
    }
}

impl Story {
    /// A story beginning now, its JSON lines written to `json`. Leaked:
    /// dlock's callback threads tell it and may outlive the caller.
    pub fn new(json: Option<Box<dyn Write + Send>>) -> &'static Story {
        Box::leak(Box::new(Story {
            start: dlock::clock::system_now(),
            json: Mutex::new(json),
        }))
    }

    pub fn start(&self) -> Instant {
        self.start
    }

    /// Seconds since the story began.
    pub fn secs(&self) -> f64 {
        (dlock::clock::system_now() - self.start).as_secs_f64()
    }

    /// Prints `line`, then `event` (an object with at least `"event"`) with
    /// `who` and `t_ms` added as one JSON line; the two stay together.
    pub fn tell(&self, who: &str, event: Value, line: impl Display) {
        let t_ms = (dlock::clock::system_now() - self.start).as_millis() as u64;
        let mut json = self.json.lock().unwrap_or_else(|e| e.into_inner());
        println!("{line}");
        if let Some(out) = json.as_mut() {
            let mut event = event;
            let fields = event.as_object_mut().expect("an event is a JSON object");
            fields.insert("who".into(), who.into());
            fields.insert("t_ms".into(), t_ms.into());
            let _ = writeln!(out, "{event}");
            let _ = out.flush();
        }
    }
}
