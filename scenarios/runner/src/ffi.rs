//! The C ABI of the runner (`libdlock_scenarios.so`; header
//! `ffi-c/tests/c/scenario_runner.h`, prefix `lks_`): a C face is a vtable
//! of step dispatch over its own API, played by [`lks_play_dir`].
//!
//! Every type here mirrors the header; change both together.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::Path;
use std::sync::Arc;

use crate::trace::Inner;
use crate::{
    Config, Face, Fault, Observed, Placement, Scenario, Step, TraceSink, play_dir, scenario_files,
};

/// `struct lks_sink`: opaque to C; a `TraceSink`'s shared state.
#[allow(non_camel_case_types)]
pub type lks_sink = c_void;

#[repr(C)]
pub struct LksSettings {
    pub ttl_ms: u64,
    pub keepalive_interval_ms: u64,
    pub keepalive_timeout_ms: u64,
    pub retry_interval_ms: u64,
    pub margin_ms: u64,
}

#[repr(C)]
pub struct LksScenario {
    pub name: *const c_char,
    pub about: *const c_char,
    pub settings: LksSettings,
    pub holders: *const *const c_char,
    pub n_holders: usize,
    // Added with the layout; per holder (`n_holders` each), never NULL.
    pub holder_client: *const *const c_char,
    pub holder_session: *const *const c_char,
    pub holder_lock: *const *const c_char,
    // Added with elections; per holder: "lock", "election" or "observe"
    // (read/write locks: "read", "write"; semaphores: "semaphore").
    pub holder_role: *const *const c_char,
    // Added with semaphores; per holder: a semaphore holder's limit, else 0.
    pub holder_limit: *const u32,
}

// enum lks_do
pub const LKS_DO_ACQUIRE: c_int = 0;
pub const LKS_DO_TRY_ACQUIRE: c_int = 1;
pub const LKS_DO_PERMIT: c_int = 2;
pub const LKS_DO_END: c_int = 3;
pub const LKS_DO_VALID: c_int = 4;
pub const LKS_DO_STATE: c_int = 5;
pub const LKS_DO_TOKEN: c_int = 6;
pub const LKS_DO_RELEASE: c_int = 7;
pub const LKS_DO_FAULT: c_int = 8;
pub const LKS_DO_STALL_DRIVER: c_int = 9;
pub const LKS_DO_CLOSE: c_int = 10;
pub const LKS_DO_EVENTS: c_int = 11;
pub const LKS_DO_ACQUIRE_START: c_int = 12;
pub const LKS_DO_CANCEL: c_int = 13;
pub const LKS_DO_SHUTDOWN: c_int = 14;
pub const LKS_DO_CAMPAIGN: c_int = 15;
pub const LKS_DO_PROCLAIM: c_int = 16;
pub const LKS_DO_RESIGN: c_int = 17;
pub const LKS_DO_LEADER: c_int = 18;
pub const LKS_DO_OBSERVE: c_int = 19;
// Added with read/write locks (a face that plays them: `LKS_PLAYS_RWLOCKS`).
pub const LKS_DO_DOWNGRADE: c_int = 20;
pub const LKS_DO_MODE: c_int = 21;
// Added with semaphores (a face that plays them: `LKS_PLAYS_SEMAPHORES`).
pub const LKS_DO_SLOT: c_int = 22;
pub const LKS_DO_SEMAPHORE: c_int = 23;

/// `lks_play_dir_with`'s `plays`: the face plays elections.
pub const LKS_PLAYS_ELECTIONS: u32 = 1;
/// `lks_play_dir_with`'s `plays`: the face plays read/write locks
/// (`holder_role` `"read"` / `"write"`, `LKS_DO_DOWNGRADE`, `LKS_DO_MODE`).
pub const LKS_PLAYS_RWLOCKS: u32 = 2;
/// `lks_play_dir_with`'s `plays`: the face plays semaphores (`holder_role`
/// `"semaphore"` with `holder_limit`, `LKS_DO_SLOT`, `LKS_DO_SEMAPHORE`).
pub const LKS_PLAYS_SEMAPHORES: u32 = 4;

/// `enum lks_fault`'s number of `f`.
pub(crate) fn fault_code(f: Fault) -> c_int {
    match f {
        Fault::Partition => 0,
        Fault::Heal => 1,
        Fault::DropReplies => 2,
        Fault::KeepReplies => 3,
        Fault::DelayReplies => 4,
        Fault::FailKeepalives => 5,
        Fault::StopFailing => 6,
        Fault::LeaseLost => 7,
        Fault::FreezeExpiry => 8,
        Fault::ThawExpiry => 9,
        Fault::DeleteKey => 10,
        Fault::RevokeLease => 11,
    }
}

#[repr(C)]
pub struct LksStep {
    pub what: c_int,
    pub do_name: *const c_char,
    pub holder: *const c_char,
    pub label: *const c_char,
    pub fault: c_int,
    pub fault_name: *const c_char,
    pub ms: u64,
    // Added with elections: campaign's and proclaim's value.
    pub value: *const c_char,
}

// enum lks_saw
pub const LKS_SAW_DONE: c_int = 0;
pub const LKS_SAW_WORD: c_int = 1;
pub const LKS_SAW_BOOL: c_int = 2;
pub const LKS_SAW_TOKEN: c_int = 3;
pub const LKS_SAW_PERMIT: c_int = 4;
pub const LKS_SAW_EVENTS: c_int = 5;
pub const LKS_SAW_UNSUPPORTED: c_int = 6;
pub const LKS_SAW_LEADER: c_int = 7;
pub const LKS_SAW_SLOT: c_int = 8;

#[repr(C)]
pub struct LksObserved {
    pub kind: c_int,
    pub word: *const c_char,
    pub flag: bool,
    pub has_token: bool,
    pub token: u64,
    pub lines: *const *const c_char,
    pub n_lines: usize,
    pub error: *const c_char,
}

type SetupFn = unsafe extern "C" fn(
    ctx: *mut c_void,
    scenario: *const LksScenario,
    sink: *const lks_sink,
    error: *mut *const c_char,
) -> c_int;
type PerformFn =
    unsafe extern "C" fn(ctx: *mut c_void, step: *const LksStep, out: *mut LksObserved) -> c_int;
type CtxFn = unsafe extern "C" fn(ctx: *mut c_void);

/// `struct lks_face`.
#[repr(C)]
pub struct LksFace {
    pub ctx: *mut c_void,
    pub warm_up: Option<CtxFn>,
    pub setup: Option<SetupFn>,
    pub perform: Option<PerformFn>,
    pub teardown: Option<CtxFn>,
}

/// # Safety
/// `s` is NULL or a NUL-terminated string.
unsafe fn text(s: *const c_char) -> Option<String> {
    // SAFETY: the caller's promise.
    (!s.is_null()).then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

fn cstring(s: &str) -> CString {
    CString::new(s.replace('\0', "?")).unwrap_or_default()
}

/// A C face as a [`Face`].
struct CFace<'a> {
    face: &'a LksFace,
    /// The sink handed to C in `setup`: one strong count, taken back after
    /// `teardown`.
    sink: Option<*const Inner>,
    /// `LKS_PLAYS_*` bits.
    plays: u32,
}

impl CFace<'_> {
    fn error(e: *const c_char, what: &str) -> String {
        // SAFETY: the header says `error` is NULL or a string valid until
        // the call returns, and it has not returned to C yet.
        unsafe { text(e) }.unwrap_or_else(|| format!("{what} failed"))
    }
}

impl Face for CFace<'_> {
    fn elections(&self) -> bool {
        self.plays & LKS_PLAYS_ELECTIONS != 0
    }

    fn rwlocks(&self) -> bool {
        self.plays & LKS_PLAYS_RWLOCKS != 0
    }

    fn semaphores(&self) -> bool {
        self.plays & LKS_PLAYS_SEMAPHORES != 0
    }

    fn warm_up(&mut self) {
        if let Some(f) = self.face.warm_up {
            // SAFETY: the vtable's contract.
            unsafe { f(self.face.ctx) }
        }
    }

    fn setup(&mut self, scenario: &Scenario, trace: TraceSink) -> Result<(), String> {
        let setup = self.face.setup.ok_or("the face has no setup")?;
        let name = cstring(&scenario.name);
        let about = cstring(&scenario.about);
        // Per holder: its name, client, session and lock; the strings live
        // until `setup` returns.
        let layout: Vec<_> = (0..scenario.holders.len())
            .map(|i| scenario.placement_at(i))
            .collect();
        let column = |f: fn(&Placement) -> &str| -> Vec<CString> {
            layout.iter().map(|p| cstring(f(p))).collect()
        };
        let columns = [
            scenario.holders.iter().map(|h| cstring(h)).collect(),
            column(|p| &p.client),
            column(|p| &p.session),
            column(|p| &p.lock),
            column(|p| p.role.as_str()),
        ];
        let [holders, clients, sessions, locks, roles] = columns
            .each_ref()
            .map(|v| v.iter().map(|c| c.as_ptr()).collect::<Vec<_>>());
        let limits: Vec<u32> = layout.iter().map(|p| p.limit.unwrap_or(0)).collect();
        let s = &scenario.settings;
        let c = LksScenario {
            name: name.as_ptr(),
            about: about.as_ptr(),
            settings: LksSettings {
                ttl_ms: s.ttl_ms,
                keepalive_interval_ms: s.keepalive_interval_ms,
                keepalive_timeout_ms: s.keepalive_timeout_ms,
                retry_interval_ms: s.retry_interval_ms,
                margin_ms: s.margin_ms,
            },
            holders: holders.as_ptr(),
            n_holders: holders.len(),
            holder_client: clients.as_ptr(),
            holder_session: sessions.as_ptr(),
            holder_lock: locks.as_ptr(),
            holder_role: roles.as_ptr(),
            holder_limit: limits.as_ptr(),
        };
        let sink = Arc::into_raw(trace.0);
        self.sink = Some(sink);
        let mut error = std::ptr::null();
        // SAFETY: every pointer lives until the call returns; the sink until
        // `teardown` returns.
        let rc = unsafe { setup(self.face.ctx, &c, sink.cast(), &mut error) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Self::error(error, "setup"))
        }
    }

    fn perform(&mut self, step: &Step) -> Result<Observed, String> {
        let perform = self.face.perform.ok_or("the face has no perform")?;
        let (what, label, fault, ms) = match step {
            Step::Acquire { .. } => (LKS_DO_ACQUIRE, None, None, 0),
            Step::TryAcquire { .. } => (LKS_DO_TRY_ACQUIRE, None, None, 0),
            Step::Permit { label, .. } => (LKS_DO_PERMIT, label.as_deref(), None, 0),
            Step::End { permit } => (LKS_DO_END, Some(permit.as_str()), None, 0),
            Step::Valid { permit, .. } => (LKS_DO_VALID, Some(permit.as_str()), None, 0),
            Step::State { .. } => (LKS_DO_STATE, None, None, 0),
            Step::Token { .. } => (LKS_DO_TOKEN, None, None, 0),
            Step::Release { .. } => (LKS_DO_RELEASE, None, None, 0),
            Step::Fault { fault, ms, .. } => (LKS_DO_FAULT, None, Some(*fault), ms.unwrap_or(0)),
            Step::StallDriver { ms } => (LKS_DO_STALL_DRIVER, None, None, *ms),
            Step::Close { .. } => (LKS_DO_CLOSE, None, None, 0),
            // `ms` carries the number of events the step expects, so a
            // face knows how many to read.
            Step::Events { expect, .. } => (LKS_DO_EVENTS, None, None, expect.len() as u64),
            Step::AcquireStart { .. } => (LKS_DO_ACQUIRE_START, None, None, 0),
            Step::Cancel { .. } => (LKS_DO_CANCEL, None, None, 0),
            Step::Shutdown { .. } => (LKS_DO_SHUTDOWN, None, None, 0),
            Step::Campaign { .. } => (LKS_DO_CAMPAIGN, None, None, 0),
            Step::Proclaim { .. } => (LKS_DO_PROCLAIM, None, None, 0),
            Step::Resign { grace_ms, .. } => (LKS_DO_RESIGN, None, None, *grace_ms),
            Step::Leader { .. } => (LKS_DO_LEADER, None, None, 0),
            Step::Observe { .. } => (LKS_DO_OBSERVE, None, None, 0),
            Step::Downgrade { .. } => (LKS_DO_DOWNGRADE, None, None, 0),
            Step::Mode { .. } => (LKS_DO_MODE, None, None, 0),
            Step::Slot { .. } => (LKS_DO_SLOT, None, None, 0),
            // `ms` carries the limit the other handle asks for.
            Step::Semaphore { limit, .. } => (LKS_DO_SEMAPHORE, None, None, u64::from(*limit)),
            Step::Wait { .. } => return Err("`wait` is the runner's".into()),
        };
        let do_name = cstring(step.name());
        let holder = step.holder().map(cstring);
        let label = label.map(cstring);
        let fault_name = fault.map(|f| cstring(f.as_str()));
        let value = step.value().map(cstring);
        let opt = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let c = LksStep {
            what,
            do_name: do_name.as_ptr(),
            holder: opt(&holder),
            label: opt(&label),
            fault: fault.map_or(-1, fault_code),
            fault_name: opt(&fault_name),
            ms,
            value: opt(&value),
        };
        let mut out = LksObserved {
            kind: LKS_SAW_DONE,
            word: std::ptr::null(),
            flag: false,
            has_token: false,
            token: 0,
            lines: std::ptr::null(),
            n_lines: 0,
            error: std::ptr::null(),
        };
        // SAFETY: the step's strings live until the call returns.
        let rc = unsafe { perform(self.face.ctx, &c, &mut out) };
        if rc != 0 {
            return Err(Self::error(out.error, step.name()));
        }
        // SAFETY: the header: `word` and `lines` stay valid until the face
        // is called again; they are copied here, before that.
        let word = || unsafe { text(out.word) }.unwrap_or_default();
        let token = out.has_token.then_some(out.token);
        Ok(match out.kind {
            LKS_SAW_DONE => Observed::Done,
            LKS_SAW_WORD => Observed::Word(word()),
            LKS_SAW_BOOL => Observed::Bool(out.flag),
            LKS_SAW_TOKEN => Observed::Token(token),
            LKS_SAW_PERMIT => Observed::Permit {
                word: word(),
                token,
            },
            LKS_SAW_EVENTS => Observed::Events(
                (0..out.n_lines)
                    // SAFETY: `lines` has `n_lines` strings (the header).
                    .map(|i| unsafe { text(*out.lines.add(i)) }.unwrap_or_default())
                    .collect(),
            ),
            LKS_SAW_UNSUPPORTED => Observed::Unsupported,
            LKS_SAW_LEADER => Observed::Leader {
                value: (!out.word.is_null()).then(word),
                token,
            },
            LKS_SAW_SLOT => Observed::Slot {
                slot: token
                    .map(|t| u32::try_from(t).map_err(|_| format!("slot {t}")))
                    .transpose()?,
                lock: (!out.word.is_null()).then(word),
            },
            k => return Err(format!("the face answered kind {k}")),
        })
    }

    fn teardown(&mut self) {
        if let Some(f) = self.face.teardown {
            // SAFETY: the vtable's contract.
            unsafe { f(self.face.ctx) }
        }
        if let Some(sink) = self.sink.take() {
            // SAFETY: from `Arc::into_raw` in `setup`; after `teardown` no
            // callback of the face pushes to it (the header's contract).
            drop(unsafe { Arc::from_raw(sink) });
        }
    }
}

/// `lks_trace(sink, line)`: appends `"<holder> <event>"` to the trace, time
/// stamped now. From any thread, between `setup` and the end of `teardown`.
///
/// # Safety
/// `sink` is the one `setup` was given, and `teardown` has not returned;
/// `line` is NULL (ignored) or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lks_trace(sink: *const lks_sink, line: *const c_char) {
    if sink.is_null() {
        return;
    }
    // SAFETY: the caller's promise.
    let Some(line) = (unsafe { text(line) }) else {
        return;
    };
    // SAFETY: a live `Arc<Inner>` (one count held until after `teardown`);
    // borrowed, not taken.
    let inner = unsafe { &*sink.cast::<Inner>() };
    inner.push(line);
}

/// `lks_play_dir(dir, face)`: plays every scenario of `dir` (honouring
/// `DLOCK_SCENARIO` and `DLOCK_SCENARIO_SLACK_MS`), prints the reports and
/// `scenarios: N played, N failed`; the number of failures (at least 1 when
/// nothing was played or an argument is NULL).
///
/// # Safety
/// `dir` is a NUL-terminated string; `face` points to a filled vtable whose
/// `ctx` the functions accept.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lks_play_dir(dir: *const c_char, face: *const LksFace) -> c_int {
    // SAFETY: the caller's promise.
    unsafe { lks_play_dir_with(dir, face, 0) }
}

/// `lks_play_dir_with(dir, face, plays)`: [`lks_play_dir`] for a face that
/// plays the optional parts named by `plays` (`LKS_PLAYS_ELECTIONS`); the
/// files needing a part it does not play are reported SKIPPED.
///
/// # Safety
/// As [`lks_play_dir`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lks_play_dir_with(
    dir: *const c_char,
    face: *const LksFace,
    plays: u32,
) -> c_int {
    // SAFETY: the caller's promise.
    let (Some(dir), Some(face)) = (unsafe { text(dir) }, unsafe { face.as_ref() }) else {
        eprintln!("lks_play_dir: NULL argument");
        return 1;
    };
    let mut c = CFace {
        face,
        sink: None,
        plays,
    };
    let s = play_dir(Path::new(&dir), &mut c, &Config::from_env());
    s.failed.try_into().unwrap_or(c_int::MAX)
}

/// `lks_count_files(dir)`: the number of `*.json` files in `dir`; -1 when it
/// cannot be read.
///
/// # Safety
/// `dir` is NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lks_count_files(dir: *const c_char) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { text(dir) }.map(|d| scenario_files(Path::new(&d))) {
        Some(Ok(f)) => f.len().try_into().unwrap_or(c_int::MAX),
        _ => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    static SEEN_MS: AtomicU64 = AtomicU64::new(u64::MAX);

    unsafe extern "C" fn perform(
        _ctx: *mut c_void,
        step: *const LksStep,
        out: *mut LksObserved,
    ) -> c_int {
        // SAFETY: the runner passes valid pointers for the call.
        let (step, out) = unsafe { (&*step, &mut *out) };
        SEEN_MS.store(step.ms, Ordering::SeqCst);
        out.kind = LKS_SAW_UNSUPPORTED;
        0
    }

    /// A face binding the C ABI learns how many events an `events` step
    /// expects from `ms`.
    #[test]
    fn an_events_step_carries_its_count_in_ms() {
        let vtable = LksFace {
            ctx: std::ptr::null_mut(),
            warm_up: None,
            setup: None,
            perform: Some(perform),
            teardown: None,
        };
        let mut face = CFace {
            face: &vtable,
            sink: None,
            plays: 0,
        };
        let step = Step::Events {
            holder: "a".into(),
            expect: vec!["drained".into(), "acquired token=2".into()],
        };
        assert_eq!(face.perform(&step).unwrap(), Observed::Unsupported);
        assert_eq!(SEEN_MS.load(Ordering::SeqCst), 2);
    }

    static SEEN_VALUE: Mutex<Option<String>> = Mutex::new(None);
    static SEEN_GRACE: AtomicU64 = AtomicU64::new(u64::MAX);

    unsafe extern "C" fn leader(
        _ctx: *mut c_void,
        step: *const LksStep,
        out: *mut LksObserved,
    ) -> c_int {
        // SAFETY: the runner passes valid pointers for the call.
        let (step, out) = unsafe { (&*step, &mut *out) };
        // SAFETY: NULL or a string valid during the call.
        *SEEN_VALUE.lock().unwrap() = unsafe { text(step.value) };
        SEEN_GRACE.store(step.ms, Ordering::SeqCst);
        out.kind = LKS_SAW_LEADER;
        if step.what == LKS_DO_LEADER {
            out.word = c"v1".as_ptr();
            out.has_token = true;
            out.token = 7;
        }
        0
    }

    /// A C face gets a campaign's value and a resign's grace, and answers
    /// a leader (or none: NULL word) with LKS_SAW_LEADER.
    #[test]
    fn election_steps_cross_the_c_abi() {
        let vtable = LksFace {
            ctx: std::ptr::null_mut(),
            warm_up: None,
            setup: None,
            perform: Some(leader),
            teardown: None,
        };
        let mut face = CFace {
            face: &vtable,
            sink: None,
            plays: LKS_PLAYS_ELECTIONS,
        };
        assert!(face.elections());
        let h = String::from("a");
        let got = face
            .perform(&Step::Campaign {
                holder: h.clone(),
                value: "v1".into(),
            })
            .unwrap();
        assert_eq!(SEEN_VALUE.lock().unwrap().as_deref(), Some("v1"));
        assert_eq!(
            got,
            Observed::Leader {
                value: None,
                token: None
            }
        );
        face.perform(&Step::Resign {
            holder: h.clone(),
            grace_ms: 250,
        })
        .unwrap();
        assert_eq!(SEEN_GRACE.load(Ordering::SeqCst), 250);
        assert_eq!(*SEEN_VALUE.lock().unwrap(), None);
        let got = face
            .perform(&Step::Leader {
                holder: h,
                expect: None,
                token: None,
            })
            .unwrap();
        assert_eq!(
            got,
            Observed::Leader {
                value: Some("v1".into()),
                token: Some(7)
            }
        );
    }

    static SEEN_LIMITS: Mutex<Vec<u32>> = Mutex::new(Vec::new());
    static SEEN_SEM_MS: AtomicU64 = AtomicU64::new(u64::MAX);

    unsafe extern "C" fn sem_setup(
        _ctx: *mut c_void,
        scenario: *const LksScenario,
        _sink: *const lks_sink,
        _error: *mut *const c_char,
    ) -> c_int {
        // SAFETY: the runner passes a valid scenario for the call, with
        // `n_holders` limits.
        let s = unsafe { &*scenario };
        let limits = unsafe { std::slice::from_raw_parts(s.holder_limit, s.n_holders) };
        *SEEN_LIMITS.lock().unwrap() = limits.to_vec();
        0
    }

    unsafe extern "C" fn slot(
        _ctx: *mut c_void,
        step: *const LksStep,
        out: *mut LksObserved,
    ) -> c_int {
        // SAFETY: the runner passes valid pointers for the call.
        let (step, out) = unsafe { (&*step, &mut *out) };
        SEEN_SEM_MS.store(step.ms, Ordering::SeqCst);
        if step.what == LKS_DO_SLOT {
            out.kind = LKS_SAW_SLOT;
            out.word = c"w/sem/slot/1".as_ptr();
            out.has_token = true;
            out.token = 1;
        } else {
            out.kind = LKS_SAW_WORD;
            out.word = c"invalid_argument".as_ptr();
        }
        0
    }

    /// A C face gets each holder's limit (0: not a semaphore's), a
    /// `semaphore` step's limit in `ms`, and answers `slot` with
    /// LKS_SAW_SLOT (the slot in `token`, its lock in `word`).
    #[test]
    fn semaphore_steps_cross_the_c_abi() {
        let vtable = LksFace {
            ctx: std::ptr::null_mut(),
            warm_up: None,
            setup: Some(sem_setup),
            perform: Some(slot),
            teardown: None,
        };
        let mut face = CFace {
            face: &vtable,
            sink: None,
            plays: LKS_PLAYS_SEMAPHORES,
        };
        assert!(face.semaphores() && !face.rwlocks() && !face.elections());
        let s = crate::parse(
            r#"{"name": "t", "settings": {"ttl_ms": 2000, "keepalive_interval_ms": 500, "keepalive_timeout_ms": 200, "retry_interval_ms": 200, "margin_ms": 500},
                "holders": ["a", "p"], "layout": {"a": {"semaphore": "w/sem", "limit": 2}},
                "steps": [], "trace": []}"#,
        )
        .unwrap();
        face.setup(&s, TraceSink::new()).unwrap();
        face.teardown();
        assert_eq!(*SEEN_LIMITS.lock().unwrap(), [2, 0]);
        let got = face
            .perform(&Step::Slot {
                holder: "a".into(),
                expect: Some(1),
                lock: None,
            })
            .unwrap();
        assert_eq!(
            got,
            Observed::Slot {
                slot: Some(1),
                lock: Some("w/sem/slot/1".into())
            }
        );
        let got = face
            .perform(&Step::Semaphore {
                holder: "a".into(),
                limit: 3,
                expect: "invalid_argument".into(),
            })
            .unwrap();
        assert_eq!(SEEN_SEM_MS.load(Ordering::SeqCst), 3);
        assert_eq!(got, Observed::Word("invalid_argument".into()));
    }
}
