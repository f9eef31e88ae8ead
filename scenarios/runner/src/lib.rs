//! The scenario runner of `scenarios/` (see `scenarios/README.md`), shared by
//! every face of dlock.
//!
//! This crate owns everything a runner has in common: loading a scenario
//! file into typed [`Scenario`] / [`Step`] values, the timing of steps
//! (`at`), the `wait` steps over the trace, the expectation checks (`expect`,
//! `token`), the final trace comparison with its `@lo..hi` windows, the
//! `DLOCK_SCENARIO` filter and `DLOCK_SCENARIO_SLACK_MS`, and the report.
//!
//! A face (Rust, C, Python, ...) implements only the step dispatch through its
//! own API: the [`Face`] trait in Rust, or the C vtable of
//! `ffi-c/tests/c/scenario_runner.h` (module [`ffi`]). A face performs a step
//! and returns what it [`Observed`]; the runner decides whether that is what
//! the file expects.
//!
//! The crate does not depend on `dlock`: it knows the scenario format, not
//! the library under test.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

pub mod ffi;
mod play;
mod trace;

pub use play::{Config, Outcome, Summary, play, play_dir, play_file};
pub use trace::{Event, Expected, TraceSink, check_trace, show};

/// How long a `wait` step, a blocking acquire and the final wait for the
/// trace may take.
pub const WAIT_LIMIT: Duration = Duration::from_secs(10);

/// The word of a [`Placement::session`] that means the client's default
/// session (also what an absent `session` means).
pub const DEFAULT_SESSION: &str = "default";

/// One scenario file.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub about: String,
    pub settings: Settings,
    /// The holders' names, in the order a face creates their clients,
    /// sessions and locks (locks of one session are handled in creation
    /// order, which fixes the trace order of events at one instant).
    pub holders: Vec<String>,
    /// Where each holder's lock lives, one per holder in the order of
    /// [`Scenario::holders`], every default filled in (see [`Placement`]).
    pub layout: Vec<Placement>,
    pub steps: Vec<Timed>,
    /// The trace the callbacks must produce, in order, and no other event.
    pub trace: Vec<Expected>,
}

impl Scenario {
    /// The lock name every holder without a `lock` of its own shares:
    /// `scenario/"<name>"`.
    pub fn default_lock(&self) -> String {
        default_lock(&self.name)
    }

    /// The placement of `holder` (`None`: no such holder).
    pub fn placement(&self, holder: &str) -> Option<Placement> {
        let i = self.holders.iter().position(|h| h == holder)?;
        Some(self.placement_at(i))
    }

    /// The placement of the `i`th holder: its [`Scenario::layout`] entry,
    /// or the defaults when there is none (a scenario built by hand).
    pub fn placement_at(&self, i: usize) -> Placement {
        self.layout.get(i).cloned().unwrap_or_else(|| Placement {
            client: self.holders.get(i).cloned().unwrap_or_default(),
            session: DEFAULT_SESSION.into(),
            lock: self.default_lock(),
            role: Role::Lock,
            limit: None,
        })
    }

    /// Whether a holder is an election candidate or an observer: a face
    /// without elections yet skips the file (see [`Face::elections`]).
    pub fn uses_elections(&self) -> bool {
        (0..self.holders.len())
            .any(|i| matches!(self.placement_at(i).role, Role::Election | Role::Observer))
    }

    /// Whether a holder is a read/write lock's reader or writer: a face
    /// without them yet skips the file (see [`Face::rwlocks`]).
    pub fn uses_rwlocks(&self) -> bool {
        (0..self.holders.len())
            .any(|i| matches!(self.placement_at(i).role, Role::Reader | Role::Writer))
    }

    /// Whether a holder is a semaphore's: a face without them yet skips the
    /// file (see [`Face::semaphores`]).
    pub fn uses_semaphores(&self) -> bool {
        (0..self.holders.len()).any(|i| self.placement_at(i).role == Role::Semaphore)
    }

    /// The holders that are observers: their trace lines are compared in
    /// their own order, apart from the others' (see [`play`]).
    pub fn observers(&self) -> Vec<String> {
        (0..self.holders.len())
            .filter(|&i| self.placement_at(i).role == Role::Observer)
            .map(|i| self.holders[i].clone())
            .collect()
    }
}

/// What a holder's handle is: a lock (`"lock"` in the layout, the default),
/// a candidate in an election (`"election"`: `session.election(name)`,
/// every lock step works on it, its events are the lock's), or an observer
/// of an election (`"observe"`: `client.observe(name)`, no session, no
/// lock steps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Lock,
    Election,
    Observer,
    /// A reader of a read/write lock (`"rwlock"` with `"mode": "read"`):
    /// `rwlock(name).reader()`, every lock step works on it.
    Reader,
    /// A writer of a read/write lock (`"mode": "write"`).
    Writer,
    /// A holder of a semaphore (`"semaphore"` with `"limit"`):
    /// `session.semaphore(name, limit)`; its `acquire` / `try_acquire` win a
    /// slot, an ordinary lock every lock step then works on.
    Semaphore,
}

impl Role {
    /// The word of the C ABI's `holder_role` (and of the layout field).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Lock => "lock",
            Role::Election => "election",
            Role::Observer => "observe",
            Role::Reader => "read",
            Role::Writer => "write",
            Role::Semaphore => "semaphore",
        }
    }
}

fn default_lock(scenario: &str) -> String {
    format!("scenario/\"{scenario}\"")
}

/// Where one holder's lock lives: the `layout` entry of the holder, with
/// the defaults filled in.
///
/// Holders with the same `client` share one client (one link to the
/// service: a link fault hits every session of it); holders with the same
/// `client` and `session` share one session (one lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The client's word; default: the holder's own name (every holder its
    /// own client).
    pub client: String,
    /// The session's word within its client: [`DEFAULT_SESSION`] (also
    /// when absent) for the client's default session, any other word for
    /// one session made for it with the scenario's settings.
    pub session: String,
    /// The lock's full name; default: [`Scenario::default_lock`], the one
    /// name every holder shares. For an election candidate or an observer:
    /// the election's name (`"election"` / `"observe"` in the layout).
    pub lock: String,
    /// Lock, election candidate, observer, reader, writer or semaphore
    /// holder.
    pub role: Role,
    /// A semaphore holder's limit (`"limit"` in the layout); `None` for
    /// every other role.
    pub limit: Option<u32>,
}

impl Placement {
    /// Whether the holder's lock is on its client's default session.
    pub fn default_session(&self) -> bool {
        self.session == DEFAULT_SESSION
    }
}

/// A `layout` entry as written: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    #[serde(default)]
    client: Option<String>,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    lock: Option<String>,
    #[serde(default)]
    election: Option<String>,
    #[serde(default)]
    observe: Option<String>,
    #[serde(default)]
    rwlock: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    semaphore: Option<String>,
    #[serde(default)]
    limit: Option<u32>,
}

/// The lock options of every holder (reacquire on), in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub ttl_ms: u64,
    pub keepalive_interval_ms: u64,
    pub keepalive_timeout_ms: u64,
    pub retry_interval_ms: u64,
    pub margin_ms: u64,
}

/// A step and when it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// Run this many milliseconds after the scenario started (the runner
    /// sleeps until then); `None`: at once.
    pub at: Option<u64>,
    pub step: Step,
    /// The step as written (compact JSON), for reports.
    pub text: String,
}

/// One `do` of `scenarios/README.md`.
///
/// The runner performs [`Step::Wait`] itself; a face is handed every other
/// step. Fields named `expect` (and the permit's `token`) are for the
/// runner: a face only reports what it observed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "do", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Start a blocking acquire (10 s timeout) on a thread of its own.
    Acquire { holder: String },
    /// `"ok"` or an error code (`"would_block"`): observe [`Observed::Word`].
    TryAcquire { holder: String, expect: String },
    /// Take a permit: observe [`Observed::Permit`]. With `label` (`"as"`),
    /// keep it open under that label, else end it at once. A granted
    /// permit's token must be `token` (if given) and above `above` (if
    /// given: where the order is the promise, not the number).
    Permit {
        holder: String,
        expect: String,
        #[serde(default)]
        token: Option<u64>,
        #[serde(default)]
        above: Option<u64>,
        #[serde(default, rename = "as")]
        label: Option<String>,
    },
    /// End the labelled permit.
    End { permit: String },
    /// The labelled permit's `valid()`: observe [`Observed::Bool`].
    Valid { permit: String, expect: bool },
    /// The state's name (`"Holding"`, ...): observe [`Observed::Word`].
    State { holder: String, expect: String },
    /// The token held: observe [`Observed::Token`] (`null`: none).
    Token { holder: String, expect: Option<u64> },
    /// Blocking release.
    Release { holder: String },
    /// Wait (up to 10 s) until `event` appears in the trace at or after the
    /// event the previous `wait` matched. Done by the runner.
    Wait { event: String },
    /// Switch a fault on the link of the holder's client, or act on the
    /// service (`delete_key`, `revoke_lease`, `*_expiry`).
    Fault {
        holder: String,
        fault: Fault,
        #[serde(default)]
        ms: Option<u64>,
    },
    /// Block dlock's driver thread for `ms` without blocking the script.
    StallDriver { ms: u64 },
    /// Close the holder's lock handle: it releases, and afterwards none of
    /// its callbacks runs.
    Close { holder: String },
    /// Read the holder's pull-style event stream (lines without the holder
    /// prefix): observe [`Observed::Events`], or [`Observed::Unsupported`]
    /// while the face has no such stream.
    Events { holder: String, expect: Vec<String> },
    /// Start a cancellable acquire (10 s timeout) the face's own way, and
    /// keep its handle for `cancel` (Rust `Lock::acquire_then`, C
    /// `lk_lock_acquire_start`, Node `acquire({ signal })`, Python an
    /// `acquire_async` task); the outcome shows in the trace.
    AcquireStart { holder: String },
    /// Cancel the holder's acquisition of the last `acquire_start` the
    /// face's own way (`Acquisition::cancel`, `lk_acquisition_cancel`, the
    /// signal aborted, the task cancelled): nothing stays held by it.
    Cancel { holder: String },
    /// The face's exit path for the holder's client: every session of that
    /// client ends at once (`Client::shutdown`, what each face runs for
    /// every client at process exit); its locks behave as closed.
    Shutdown { holder: String },
    /// An election candidate campaigns with `value` (10 s timeout) in the
    /// background, as `acquire`; the outcome shows in the trace.
    Campaign { holder: String, value: String },
    /// The candidate proclaims `value`: observe [`Observed::Word`], `"ok"`
    /// or the error's code (`"fenced"`, `"not_held"`).
    Proclaim {
        holder: String,
        value: String,
        expect: String,
    },
    /// The candidate resigns in the background: no permit from now on, its
    /// key deleted once the permits in flight end or `grace_ms` passes.
    Resign { holder: String, grace_ms: u64 },
    /// The candidate reads the current leader: observe [`Observed::Leader`];
    /// `expect` is its value (`null`: nobody leads), `token` (if given) its
    /// token.
    Leader {
        holder: String,
        expect: Option<String>,
        #[serde(default)]
        token: Option<u64>,
    },
    /// A read/write lock's writer downgrades to a reader, keeping its key
    /// and token: observe [`Observed::Word`], `"ok"` or the error's code.
    Downgrade { holder: String, expect: String },
    /// A read/write lock holder's mode now: observe [`Observed::Word`],
    /// `"read"` or `"write"`.
    Mode { holder: String, expect: String },
    /// Starts the observer holder's `client.observe(name)`; each event it
    /// reports is a trace line (`observed leader value=v token=n`, ...).
    Observe { holder: String },
    /// The slot a semaphore holder holds: observe [`Observed::Slot`]; `expect`
    /// is its number (`null`: no slot won yet), `lock` (if given) the slot
    /// lock's name (`<semaphore>/slot/<i>`).
    Slot {
        holder: String,
        expect: Option<u32>,
        #[serde(default)]
        lock: Option<String>,
    },
    /// Another handle of the holder's semaphore (same name, same session)
    /// asking for `limit`: observe [`Observed::Word`], `"ok"` or the error's
    /// code (`"invalid_argument"` for a limit other than the recorded one).
    Semaphore {
        holder: String,
        limit: u32,
        expect: String,
    },
}

/// A fault of a `fault` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    Partition,
    Heal,
    DropReplies,
    KeepReplies,
    /// Delay keepalive replies by the step's `ms` (0 ends it).
    DelayReplies,
    FailKeepalives,
    StopFailing,
    LeaseLost,
    FreezeExpiry,
    ThawExpiry,
    /// The service deletes the key that holds the holder's lock name, its
    /// lease living on (an operator's `etcdctl del`).
    DeleteKey,
    /// The service revokes the current lease of the holder's session (an
    /// operator's `etcdctl lease revoke`).
    RevokeLease,
}

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Partition => "partition",
            Fault::Heal => "heal",
            Fault::DropReplies => "drop_replies",
            Fault::KeepReplies => "keep_replies",
            Fault::DelayReplies => "delay_replies",
            Fault::FailKeepalives => "fail_keepalives",
            Fault::StopFailing => "stop_failing",
            Fault::LeaseLost => "lease_lost",
            Fault::FreezeExpiry => "freeze_expiry",
            Fault::ThawExpiry => "thaw_expiry",
            Fault::DeleteKey => "delete_key",
            Fault::RevokeLease => "revoke_lease",
        }
    }
}

impl Step {
    /// The `do` word.
    pub fn name(&self) -> &'static str {
        match self {
            Step::Acquire { .. } => "acquire",
            Step::TryAcquire { .. } => "try_acquire",
            Step::Permit { .. } => "permit",
            Step::End { .. } => "end",
            Step::Valid { .. } => "valid",
            Step::State { .. } => "state",
            Step::Token { .. } => "token",
            Step::Release { .. } => "release",
            Step::Wait { .. } => "wait",
            Step::Fault { .. } => "fault",
            Step::StallDriver { .. } => "stall_driver",
            Step::Close { .. } => "close",
            Step::Events { .. } => "events",
            Step::AcquireStart { .. } => "acquire_start",
            Step::Cancel { .. } => "cancel",
            Step::Shutdown { .. } => "shutdown",
            Step::Campaign { .. } => "campaign",
            Step::Proclaim { .. } => "proclaim",
            Step::Resign { .. } => "resign",
            Step::Leader { .. } => "leader",
            Step::Observe { .. } => "observe",
            Step::Downgrade { .. } => "downgrade",
            Step::Mode { .. } => "mode",
            Step::Slot { .. } => "slot",
            Step::Semaphore { .. } => "semaphore",
        }
    }

    /// The holder the step acts on, if any.
    pub fn holder(&self) -> Option<&str> {
        match self {
            Step::Acquire { holder }
            | Step::TryAcquire { holder, .. }
            | Step::Permit { holder, .. }
            | Step::State { holder, .. }
            | Step::Token { holder, .. }
            | Step::Release { holder }
            | Step::Fault { holder, .. }
            | Step::Close { holder }
            | Step::Events { holder, .. }
            | Step::AcquireStart { holder }
            | Step::Cancel { holder }
            | Step::Shutdown { holder }
            | Step::Campaign { holder, .. }
            | Step::Proclaim { holder, .. }
            | Step::Resign { holder, .. }
            | Step::Leader { holder, .. }
            | Step::Observe { holder }
            | Step::Downgrade { holder, .. }
            | Step::Mode { holder, .. }
            | Step::Slot { holder, .. }
            | Step::Semaphore { holder, .. } => Some(holder),
            _ => None,
        }
    }

    /// The role the step's holder must have (`None`: any).
    fn needs(&self) -> Option<&'static [Role]> {
        const LOCKS: &[Role] = &[Role::Lock, Role::Election, Role::Reader, Role::Writer];
        // A semaphore holder's slot, once won, is a lock too.
        const HELD: &[Role] = &[
            Role::Lock,
            Role::Election,
            Role::Reader,
            Role::Writer,
            Role::Semaphore,
        ];
        match self {
            Step::Campaign { .. }
            | Step::Proclaim { .. }
            | Step::Resign { .. }
            | Step::Leader { .. } => Some(&[Role::Election]),
            Step::Observe { .. } => Some(&[Role::Observer]),
            Step::Downgrade { .. } | Step::Mode { .. } => Some(&[Role::Reader, Role::Writer]),
            Step::Slot { .. } | Step::Semaphore { .. } => Some(&[Role::Semaphore]),
            // Not a semaphore holder's: it has no lock (so no key, no
            // stream) before it wins a slot, and no cancellable acquire.
            Step::Fault {
                fault: Fault::DeleteKey | Fault::RevokeLease,
                ..
            }
            | Step::AcquireStart { .. }
            | Step::Cancel { .. }
            | Step::Events { .. } => Some(LOCKS),
            Step::Fault { .. } => None,
            Step::Shutdown { .. } => None,
            _ if self.holder().is_some() => Some(HELD),
            _ => None,
        }
    }

    /// The value a campaign or proclaim carries (C ABI: `value`).
    pub fn value(&self) -> Option<&str> {
        match self {
            Step::Campaign { value, .. } | Step::Proclaim { value, .. } => Some(value),
            _ => None,
        }
    }
}

/// What a face saw when it performed a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// The step was done; nothing to compare (acquire, end, release, fault,
    /// stall_driver, close, acquire_start, cancel, shutdown, campaign,
    /// resign, observe).
    Done,
    /// A word: try_acquire's `"ok"` or error code, state's name.
    Word(String),
    /// valid's answer.
    Bool(bool),
    /// token's answer (`None`: no token held).
    Token(Option<u64>),
    /// permit's answer: `"granted"` with its token, or the refusal's word.
    Permit { word: String, token: Option<u64> },
    /// events' lines, without the holder prefix.
    Events(Vec<String>),
    /// leader's answer: the leader's value and token (`None`, `None`:
    /// nobody leads).
    Leader {
        value: Option<String>,
        token: Option<u64>,
    },
    /// slot's answer: the semaphore holder's slot and that slot lock's name
    /// (`None`, `None`: no slot won yet).
    Slot {
        slot: Option<u32>,
        lock: Option<String>,
    },
    /// The face cannot perform this step yet; the runner notes it and goes on.
    Unsupported,
}

/// The face of dlock under test: performs steps through its own API.
///
/// The runner calls, for each scenario: [`setup`](Face::setup), then
/// [`perform`](Face::perform) for every step but `wait` (which the runner
/// does on the trace), then always [`teardown`](Face::teardown), also after
/// a failure. [`warm_up`](Face::warm_up) runs once before the first scenario.
pub trait Face {
    /// Runs every path once before any scenario's clock starts, so first-use
    /// costs (thread start, valgrind's translation) fall outside the windows.
    fn warm_up(&mut self) {}

    /// Whether the face plays elections (holders with an `election` or
    /// `observe` role, their steps). A face that does not yet has every such
    /// file reported as SKIPPED (not failed); every face is to play them.
    fn elections(&self) -> bool {
        false
    }

    /// Whether the face plays read/write locks (holders with an `rwlock`,
    /// the `downgrade` and `mode` steps). A face that does not yet has every
    /// such file reported as SKIPPED (not failed); every face is to play them.
    fn rwlocks(&self) -> bool {
        false
    }

    /// Whether the face plays semaphores (holders with a `semaphore`, the
    /// `slot` and `semaphore` steps). A face that does not yet has every
    /// such file reported as SKIPPED (not failed); every face is to play them.
    fn semaphores(&self) -> bool {
        false
    }

    /// Creates one memory service and, in holder order, per
    /// [`Scenario::layout`]: a client per client word (its own link), a
    /// session per session word of it (the default one for
    /// [`DEFAULT_SESSION`]), and per holder a lock named by its
    /// [`Placement::lock`] (an election or an observer by its
    /// [`Placement::role`]), with callbacks that push `"<holder> <event>"`
    /// lines to `trace` (see the README's events).
    fn setup(&mut self, scenario: &Scenario, trace: TraceSink) -> Result<(), String>;

    /// Performs one step (never [`Step::Wait`]); `Err` for a call that failed
    /// where the step expects none (a release that errs, an unknown holder).
    fn perform(&mut self, step: &Step) -> Result<Observed, String>;

    /// Releases (so a pending acquire returns), joins, frees. After it
    /// returns no callback pushes to the trace any more.
    fn teardown(&mut self);
}

/// Loads one scenario file.
pub fn load(path: &Path) -> Result<Scenario, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read: {e}"))?;
    parse(&text)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    about: String,
    settings: Settings,
    holders: Vec<String>,
    #[serde(default)]
    layout: BTreeMap<String, RawPlacement>,
    steps: Vec<Value>,
    trace: Vec<String>,
}

/// The placements of `holders` from the file's `layout`, defaults filled.
fn layout(
    scenario: &str,
    holders: &[String],
    mut raw: BTreeMap<String, RawPlacement>,
) -> Result<Vec<Placement>, String> {
    if let Some(h) = raw.keys().find(|h| !holders.contains(h)) {
        return Err(format!("layout: no holder `{h}`"));
    }
    let mut seen = Vec::new();
    holders
        .iter()
        .map(|h| {
            if seen.contains(&h) {
                return Err(format!("holders: `{h}` twice"));
            }
            seen.push(h);
            let p = raw.remove(h).unwrap_or_default();
            let word = |v: Option<String>, field: &str, default: String| match v {
                Some(v) if v.is_empty() => Err(format!("layout: `{h}`: an empty `{field}`")),
                Some(v) => Ok(v),
                None => Ok(default),
            };
            let kinds = (p.lock, p.election, p.observe, p.rwlock, p.semaphore);
            let (role, name) = match kinds {
                (lock, None, None, None, None) => {
                    (Role::Lock, word(lock, "lock", default_lock(scenario))?)
                }
                (None, Some(e), None, None, None) => {
                    (Role::Election, word(Some(e), "election", String::new())?)
                }
                (None, None, Some(o), None, None) => {
                    (Role::Observer, word(Some(o), "observe", String::new())?)
                }
                (None, None, None, None, Some(s)) => {
                    if p.limit.is_none() {
                        return Err(format!("layout: `{h}`: a `semaphore` needs `limit`"));
                    }
                    (Role::Semaphore, word(Some(s), "semaphore", String::new())?)
                }
                (None, None, None, Some(r), None) => {
                    let role = match p.mode.as_deref() {
                        Some("read") => Role::Reader,
                        Some("write") => Role::Writer,
                        _ => {
                            return Err(format!(
                                "layout: `{h}`: an `rwlock` needs `mode`: `read` or `write`"
                            ));
                        }
                    };
                    (role, word(Some(r), "rwlock", String::new())?)
                }
                _ => {
                    return Err(format!(
                        "layout: `{h}`: one of `lock`, `election`, `observe`, `rwlock`, `semaphore`"
                    ));
                }
            };
            if p.limit.is_some() && role != Role::Semaphore {
                return Err(format!("layout: `{h}`: `limit` is for a `semaphore`"));
            }
            if p.mode.is_some() && !matches!(role, Role::Reader | Role::Writer) {
                return Err(format!("layout: `{h}`: `mode` is for an `rwlock`"));
            }
            if role == Role::Observer && p.session.is_some() {
                return Err(format!(
                    "layout: `{h}`: an observer has no session (it is the client's)"
                ));
            }
            Ok(Placement {
                client: word(p.client, "client", h.clone())?,
                session: word(p.session, "session", DEFAULT_SESSION.into())?,
                lock: name,
                role,
                limit: p.limit,
            })
        })
        .collect()
}

/// Parses a scenario's JSON and checks what a face would otherwise trip
/// over: unknown holders (in steps and `layout`), labels never given, a
/// delay without `ms`.
pub fn parse(text: &str) -> Result<Scenario, String> {
    let raw: RawScenario = serde_json::from_str(text).map_err(|e| format!("bad JSON: {e}"))?;
    let layout = layout(&raw.name, &raw.holders, raw.layout)?;
    let mut steps = Vec::with_capacity(raw.steps.len());
    let mut labels: Vec<String> = Vec::new();
    for (i, v) in raw.steps.into_iter().enumerate() {
        let text = v.to_string();
        let fail = |m: String| format!("step {i} {text}: {m}");
        let Value::Object(mut fields) = v else {
            return Err(fail("not an object".into()));
        };
        let at = match fields.remove("at") {
            None => None,
            Some(a) => Some(
                a.as_u64()
                    .ok_or_else(|| fail("`at` must be a number of ms".into()))?,
            ),
        };
        let step: Step =
            serde_json::from_value(Value::Object(fields)).map_err(|e| fail(e.to_string()))?;
        if let Some(h) = step.holder() {
            let Some(i) = raw.holders.iter().position(|n| n == h) else {
                return Err(fail(format!("no holder `{h}`")));
            };
            let role = layout[i].role;
            if let Some(roles) = step.needs() {
                if !roles.contains(&role) {
                    let want: Vec<_> = roles.iter().map(|r| r.as_str()).collect();
                    return Err(fail(format!(
                        "`{h}` is a {} holder; `{}` needs {}",
                        role.as_str(),
                        step.name(),
                        want.join(" or ")
                    )));
                }
            }
        }
        match &step {
            Step::Permit { label: Some(l), .. } => labels.push(l.clone()),
            Step::End { permit } | Step::Valid { permit, .. } if !labels.contains(permit) => {
                return Err(fail(format!("no permit labelled `{permit}` before")));
            }
            Step::Fault {
                fault: Fault::DelayReplies,
                ms: None,
                ..
            } => return Err(fail("delay_replies needs `ms`".into())),
            _ => {}
        }
        steps.push(Timed { at, step, text });
    }
    let trace = raw
        .trace
        .iter()
        .enumerate()
        .map(|(i, t)| Expected::parse(t).map_err(|e| format!("trace entry {i}: {e}")))
        .collect::<Result<_, _>>()?;
    Ok(Scenario {
        name: raw.name,
        about: raw.about,
        settings: raw.settings,
        holders: raw.holders,
        layout,
        steps,
        trace,
    })
}

/// The scenario files (`*.json`) in `dir`, sorted by name.
pub fn scenario_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests;
