//! Test-only (cargo feature `scenarios`): plays `scenarios/` through the
//! shared runner crate with a JavaScript face. The runner runs on a thread
//! of its own and asks the JavaScript thread to perform each step (a
//! threadsafe function call); the face (test/scenario-face.js) does it
//! through the public JavaScript API and answers with `scenarioReply`.
//! Listeners push trace lines with `scenarioTrace`. The event loop stays
//! free throughout, so events and promises flow as in any program.

// napi-derive registers nothing in a test build (clippy --all-targets checks one).
#![cfg_attr(test, allow(dead_code))]

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use dlock_scenarios::{Config, Face, Observed, Scenario, Step, TraceSink};
use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use serde_json::{Value, json};

static REPLY: Mutex<Option<Sender<std::result::Result<String, String>>>> = Mutex::new(None);
static SINK: Mutex<Option<TraceSink>> = Mutex::new(None);

/// How long one step may take on the JavaScript side (a release, a close
/// or a ten-second acquire's wait are far shorter).
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// A trace line from a listener of the JavaScript face.
#[napi]
pub fn scenario_trace(line: String) {
    if let Ok(sink) = SINK.lock() {
        if let Some(s) = sink.as_ref() {
            s.push(line);
        }
    }
}

/// The JavaScript face's answer to the request in progress: `ok` with a
/// JSON value, or not with an error message.
#[napi]
pub fn scenario_reply(ok: bool, value: String) {
    if let Ok(reply) = REPLY.lock() {
        if let Some(tx) = reply.as_ref() {
            let _ = tx.send(if ok { Ok(value) } else { Err(value) });
        }
    }
}

type Ask = ThreadsafeFunction<(String, String), (), (String, String), Status, false>;

struct JsFace {
    ask: Ask,
    replies: Receiver<std::result::Result<String, String>>,
}

impl JsFace {
    fn ask(&self, what: &str, payload: Value) -> std::result::Result<Value, String> {
        let status = self.ask.call(
            (what.to_string(), payload.to_string()),
            ThreadsafeFunctionCallMode::Blocking,
        );
        if status != Status::Ok {
            return Err(format!("cannot call the JavaScript face: {status}"));
        }
        let text = self.replies.recv_timeout(STEP_LIMIT).map_err(|_| {
            format!("the JavaScript face did not answer `{what}` within {STEP_LIMIT:?}")
        })??;
        serde_json::from_str(&text).map_err(|e| format!("bad answer to `{what}`: {e}: {text}"))
    }
}

fn step_json(step: &Step) -> Value {
    let mut v = json!({ "do": step.name() });
    if let Some(h) = step.holder() {
        v["holder"] = json!(h);
    }
    match step {
        Step::Permit { label, .. } => v["label"] = json!(label),
        Step::End { permit } | Step::Valid { permit, .. } => v["permit"] = json!(permit),
        Step::Fault { fault, ms, .. } => {
            v["fault"] = json!(fault.as_str());
            v["ms"] = json!(ms);
        }
        Step::StallDriver { ms } => v["ms"] = json!(ms),
        Step::Events { expect, .. } => v["count"] = json!(expect.len()),
        Step::Campaign { value, .. } | Step::Proclaim { value, .. } => v["value"] = json!(value),
        Step::Resign { grace_ms, .. } => v["ms"] = json!(grace_ms),
        Step::Semaphore { limit, .. } => v["limit"] = json!(limit),
        _ => {}
    }
    v
}

fn observed(v: &Value) -> std::result::Result<Observed, String> {
    let word = || {
        v["word"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no word in {v}"))
    };
    let token = || v["token"].as_u64();
    Ok(match v["kind"].as_str() {
        Some("done") => Observed::Done,
        Some("word") => Observed::Word(word()?),
        Some("bool") => Observed::Bool(v["flag"].as_bool().ok_or("no flag")?),
        Some("token") => Observed::Token(token()),
        Some("permit") => Observed::Permit {
            word: word()?,
            token: token(),
        },
        Some("events") => Observed::Events(
            v["lines"]
                .as_array()
                .ok_or("no lines")?
                .iter()
                .map(|l| l.as_str().unwrap_or_default().to_string())
                .collect(),
        ),
        Some("leader") => Observed::Leader {
            value: v["value"].as_str().map(str::to_string),
            token: token(),
        },
        Some("slot") => Observed::Slot {
            slot: v["slot"]
                .as_u64()
                .map(|s| u32::try_from(s).map_err(|_| format!("slot {s}")))
                .transpose()?,
            lock: v["lock"].as_str().map(str::to_string),
        },
        Some("unsupported") => Observed::Unsupported,
        _ => return Err(format!("unknown observation {v}")),
    })
}

impl Face for JsFace {
    fn warm_up(&mut self) {
        let _ = self.ask("warm_up", Value::Null);
    }

    fn setup(&mut self, s: &Scenario, trace: TraceSink) -> std::result::Result<(), String> {
        if let Ok(mut sink) = SINK.lock() {
            *sink = Some(trace);
        }
        let placements: Vec<Value> = (0..s.holders.len())
            .map(|i| {
                let p = s.placement_at(i);
                json!({
                    "holder": s.holders[i],
                    "client": p.client,
                    "session": p.session,
                    "defaultSession": p.default_session(),
                    "lock": p.lock,
                    "role": p.role.as_str(),
                    "limit": p.limit,
                })
            })
            .collect();
        let st = &s.settings;
        self.ask(
            "setup",
            json!({
                "name": s.name,
                "settings": {
                    "ttl": st.ttl_ms,
                    "keepaliveInterval": st.keepalive_interval_ms,
                    "keepaliveTimeout": st.keepalive_timeout_ms,
                    "retryInterval": st.retry_interval_ms,
                    "margin": st.margin_ms,
                },
                "placements": placements,
            }),
        )
        .map(|_| ())
    }

    fn elections(&self) -> bool {
        true
    }

    fn rwlocks(&self) -> bool {
        true
    }

    fn semaphores(&self) -> bool {
        true
    }

    fn perform(&mut self, step: &Step) -> std::result::Result<Observed, String> {
        observed(&self.ask("perform", step_json(step))?)
    }

    fn teardown(&mut self) {
        if let Err(e) = self.ask("teardown", Value::Null) {
            eprintln!("teardown: {e}");
        }
        if let Ok(mut sink) = SINK.lock() {
            *sink = None;
        }
    }
}

#[napi(object)]
pub struct ScenarioSummary {
    pub files: u32,
    pub played: u32,
    pub failed: u32,
    /// Of those played, the files skipped (a part of the format this face
    /// does not play yet).
    pub skipped: u32,
    pub failures: Vec<String>,
}

/// Plays every file of `dir` (DLOCK_SCENARIO / DLOCK_SCENARIO_SLACK_MS
/// honoured) with `ask(what, json)` as the face; resolves with the tally.
#[napi(ts_return_type = "Promise<ScenarioSummary>")]
pub fn play_scenarios<'e>(
    env: &'e Env,
    dir: String,
    ask: Function<(String, String), ()>,
) -> Result<Object<'e>> {
    let ask: Ask = ask
        .build_threadsafe_function::<(String, String)>()
        .callee_handled::<false>()
        .build_callback(|ctx| Ok(ctx.value))?;
    let (tx, replies) = channel();
    *REPLY
        .lock()
        .map_err(|_| Error::from_reason("scenario state poisoned"))? = Some(tx);
    let (deferred, promise) = env.create_deferred()?;
    std::thread::Builder::new()
        .name("dlock-node-scenarios".into())
        .spawn(move || {
            let mut face = JsFace { ask, replies };
            let s = dlock_scenarios::play_dir(&PathBuf::from(dir), &mut face, &Config::from_env());
            if let Ok(mut r) = REPLY.lock() {
                *r = None;
            }
            drop(face);
            deferred.resolve(move |_| {
                Ok(ScenarioSummary {
                    files: s.files as u32,
                    played: s.played as u32,
                    failed: s.failed as u32,
                    skipped: s.skipped as u32,
                    failures: s.failures,
                })
            });
        })
        .map_err(|e| Error::from_reason(format!("cannot start the runner thread: {e}")))?;
    Ok(promise)
}
