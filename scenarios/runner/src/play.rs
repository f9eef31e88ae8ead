//! Playing scenarios through a [`Face`].

use std::path::Path;
use std::time::Duration;

use crate::{
    Event, Expected, Face, Observed, Scenario, Step, TraceSink, WAIT_LIMIT, check_trace, load,
    scenario_files, show,
};

/// How scenarios are played.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Widens the upper end of every window by this much (valgrind runs
    /// code 20-50x slower); order, tokens and every step stay exact.
    pub slack_ms: u64,
    /// Plays only the files whose path contains this.
    pub only: Option<String>,
    /// The limit of each `wait` step and of the final wait for the trace.
    pub wait_limit: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            slack_ms: 0,
            only: None,
            wait_limit: WAIT_LIMIT,
        }
    }
}

impl Config {
    /// `DLOCK_SCENARIO_SLACK_MS` and `DLOCK_SCENARIO` from the environment.
    pub fn from_env() -> Self {
        Config {
            slack_ms: std::env::var("DLOCK_SCENARIO_SLACK_MS")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0),
            only: std::env::var("DLOCK_SCENARIO")
                .ok()
                .filter(|s| !s.is_empty()),
            wait_limit: WAIT_LIMIT,
        }
    }
}

/// One scenario played.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The trace as compared (or when the failure happened).
    pub trace: Vec<Event>,
    /// Steps the face could not perform (it answered `Unsupported`).
    pub notes: Vec<String>,
    /// `Err`: what went wrong first.
    pub result: Result<(), String>,
    /// Not played: the face does not play this part of the format yet
    /// (`"elections"`, see [`Face::elections`]).
    pub skipped: Option<String>,
}

impl Outcome {
    /// The report: `ok`, `SKIPPED` or the failure, then the notes, then the
    /// trace.
    pub fn report(&self, name: &str) -> String {
        let mut s = match (&self.result, &self.skipped) {
            (Ok(()), Some(what)) => {
                format!("{name}: SKIPPED, unsupported: this face does not play {what} yet\n")
            }
            (Ok(()), None) => format!("{name}: ok\n"),
            (Err(e), _) => format!("FAILED {name}: {e}\n"),
        };
        for n in &self.notes {
            s.push_str(&format!("  note: {n}\n"));
        }
        s.push_str(&show(&self.trace));
        s
    }
}

/// Compares what the face observed with what the step expects.
pub(crate) fn judge(step: &Step, got: Observed) -> Result<(), String> {
    let mismatch = |got: &Observed| Err(format!("the face answered {got:?}"));
    match (step, got) {
        (
            Step::Acquire { .. }
            | Step::End { .. }
            | Step::Release { .. }
            | Step::Fault { .. }
            | Step::StallDriver { .. }
            | Step::Close { .. }
            | Step::AcquireStart { .. }
            | Step::Cancel { .. }
            | Step::Shutdown { .. }
            | Step::Campaign { .. }
            | Step::Resign { .. }
            | Step::Observe { .. },
            Observed::Done,
        ) => Ok(()),
        (Step::TryAcquire { expect, .. }, Observed::Word(w)) => {
            if &w == expect {
                Ok(())
            } else {
                Err(format!("try_acquire gave {w}"))
            }
        }
        (
            Step::Permit {
                expect,
                token,
                above,
                ..
            },
            Observed::Permit {
                word,
                token: got_token,
            },
        ) => {
            if &word != expect {
                return Err(format!("permit gave {word}"));
            }
            match got_token {
                _ if word != "granted" => Ok(()),
                None if token.is_some() || above.is_some() => Err("permit has no token".into()),
                Some(t) if token.is_some_and(|want| want != t) => Err(format!("permit token {t}")),
                Some(t) if above.is_some_and(|a| t <= a) => Err(format!(
                    "permit token {t}, not above {}",
                    above.unwrap_or_default()
                )),
                _ => Ok(()),
            }
        }
        (Step::Valid { expect, .. }, Observed::Bool(b)) => {
            if b == *expect {
                Ok(())
            } else {
                Err(format!("valid() was {b}"))
            }
        }
        (Step::State { expect, .. }, Observed::Word(w)) => {
            if &w == expect {
                Ok(())
            } else {
                Err(format!("state was {w}"))
            }
        }
        (Step::Token { expect, .. }, Observed::Token(t)) => {
            if t == *expect {
                Ok(())
            } else {
                Err(format!("token was {t:?}"))
            }
        }
        (Step::Events { expect, .. }, Observed::Events(lines)) => {
            if &lines == expect {
                Ok(())
            } else {
                Err(format!("events were {lines:?}"))
            }
        }
        (
            Step::Downgrade { expect, .. }
            | Step::Mode { expect, .. }
            | Step::Proclaim { expect, .. }
            | Step::Semaphore { expect, .. },
            Observed::Word(w),
        ) => {
            if &w == expect {
                Ok(())
            } else {
                let what = match step {
                    Step::Downgrade { .. } => "downgrade gave",
                    Step::Mode { .. } => "mode was",
                    Step::Semaphore { .. } => "the semaphore handle gave",
                    _ => "proclaim gave",
                };
                Err(format!("{what} {w}"))
            }
        }
        (Step::Leader { expect, token, .. }, Observed::Leader { value, token: got }) => {
            if &value != expect {
                Err(format!("the leader's value was {value:?}"))
            } else if token.is_some() && got != *token {
                Err(format!("the leader's token was {got:?}"))
            } else {
                Ok(())
            }
        }
        (
            Step::Slot { expect, lock, .. },
            Observed::Slot {
                slot,
                lock: got_lock,
            },
        ) => {
            if slot != *expect {
                Err(format!("the slot was {slot:?}"))
            } else if lock.is_some() && got_lock != *lock {
                Err(format!("the slot's lock was {got_lock:?}"))
            } else {
                Ok(())
            }
        }
        (_, got) => mismatch(&got),
    }
}

/// Plays one scenario: setup, the steps (sleeping until each `at`, waiting
/// on the trace for each `wait`, judging what the face observed), the trace
/// comparison, and always the teardown.
///
/// An observer's lines are compared in their own order (and windows), apart
/// from the other holders': an observer watches the service, so its event
/// and a candidate's callback at one instant come in either order.
pub fn play(scenario: &Scenario, face: &mut dyn Face, config: &Config) -> Outcome {
    // A kind of holder the face does not play yet: skipped, visibly.
    let unplayed = [
        (scenario.uses_elections() && !face.elections(), "elections"),
        (
            scenario.uses_rwlocks() && !face.rwlocks(),
            "read/write locks",
        ),
        (
            scenario.uses_semaphores() && !face.semaphores(),
            "semaphores",
        ),
    ];
    if let Some((_, what)) = unplayed.iter().find(|(skip, _)| *skip) {
        return Outcome {
            trace: Vec::new(),
            notes: Vec::new(),
            result: Ok(()),
            skipped: Some((*what).into()),
        };
    }
    let trace = TraceSink::new();
    let mut notes = Vec::new();
    let mut result = face
        .setup(scenario, trace.clone())
        .map_err(|e| format!("setup: {e}"));
    let mut snapshot = None;
    if result.is_ok() {
        trace.restart();
        result = steps(scenario, face, config, &trace, &mut notes);
    }
    if result.is_ok() {
        let actual = trace.wait_len(scenario.trace.len(), config.wait_limit);
        result = check_streams(
            &scenario.trace,
            &actual,
            config.slack_ms,
            &scenario.observers(),
        );
        snapshot = Some(actual);
    }
    let snapshot = snapshot.unwrap_or_else(|| trace.events());
    face.teardown();
    Outcome {
        trace: snapshot,
        notes,
        result,
        skipped: None,
    }
}

/// Which observer's line `line` is (`None`: another holder's).
fn stream_of(observers: &[String], line: &str) -> Option<usize> {
    observers.iter().position(|o| {
        line.strip_prefix(o.as_str())
            .is_some_and(|r| r.starts_with(' '))
    })
}

/// [`check_trace`] with each observer's lines compared apart: first every
/// other line, then each observer's.
fn check_streams(
    expected: &[Expected],
    actual: &[Event],
    slack_ms: u64,
    observers: &[String],
) -> Result<(), String> {
    let of = |line: &str| stream_of(observers, line);
    for stream in std::iter::once(None).chain((0..observers.len()).map(Some)) {
        let want: Vec<_> = expected
            .iter()
            .filter(|e| of(&e.line) == stream)
            .cloned()
            .collect();
        let got: Vec<_> = actual
            .iter()
            .filter(|e| of(&e.line) == stream)
            .cloned()
            .collect();
        check_trace(&want, &got, slack_ms).map_err(|e| match stream {
            None if observers.is_empty() => e,
            None => format!("{e} (the lines of every holder but the observers)"),
            Some(o) => format!("{e} (observer {}'s lines)", observers[o]),
        })?;
    }
    Ok(())
}

fn steps(
    scenario: &Scenario,
    face: &mut dyn Face,
    config: &Config,
    trace: &TraceSink,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    // One cursor per stream (the observers' lines are ordered apart).
    let observers = scenario.observers();
    let mut cursors = vec![0; observers.len() + 1];
    for (i, timed) in scenario.steps.iter().enumerate() {
        let fail = |m: String| format!("step {i} {}: {m}", timed.text);
        if let Some(at) = timed.at {
            let elapsed = trace.elapsed_ms();
            if at > elapsed {
                std::thread::sleep(Duration::from_millis(at - elapsed));
            }
        }
        if let Step::Wait { event } = &timed.step {
            let cursor = &mut cursors[stream_of(&observers, event).map_or(0, |o| o + 1)];
            *cursor = trace
                .wait_for(event, *cursor, config.wait_limit)
                .ok_or_else(|| fail(format!("no `{event}` within {:?}", config.wait_limit)))?;
            continue;
        }
        match face.perform(&timed.step).map_err(fail)? {
            Observed::Unsupported => notes.push(format!(
                "step {i} {}: unsupported by this face, skipped",
                timed.text
            )),
            got => judge(&timed.step, got).map_err(fail)?,
        }
    }
    Ok(())
}

/// Loads and plays one file.
pub fn play_file(path: &Path, face: &mut dyn Face, config: &Config) -> Outcome {
    match load(path) {
        Ok(s) => play(&s, face, config),
        Err(e) => Outcome {
            trace: Vec::new(),
            notes: Vec::new(),
            result: Err(e),
            skipped: None,
        },
    }
}

/// The tally of [`play_dir`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// `*.json` files in the directory (before the filter).
    pub files: usize,
    pub played: usize,
    /// Of those played, the files skipped as a part of the format the face
    /// does not play yet (see [`Face::elections`]): reported, not failed.
    pub skipped: usize,
    /// Failed scenarios, plus one when nothing could be played.
    pub failed: usize,
    /// One report per failure.
    pub failures: Vec<String>,
}

/// Plays every `*.json` of `dir` (those matching `config.only`), one after
/// another: scenario `g` stalls the process-wide driver thread, which would
/// disturb scenarios played beside it. Prints each report (passes to
/// stdout, failures to stderr) and a closing `scenarios: N played, N failed`.
pub fn play_dir(dir: &Path, face: &mut dyn Face, config: &Config) -> Summary {
    let mut summary = Summary::default();
    let files = match scenario_files(dir) {
        Ok(f) => f,
        Err(e) => {
            summary.failed = 1;
            summary.failures.push(e);
            eprintln!("{}", summary.failures[0]);
            return summary;
        }
    };
    summary.files = files.len();
    if config.slack_ms > 0 {
        println!(
            "windows widened by {} ms (DLOCK_SCENARIO_SLACK_MS)",
            config.slack_ms
        );
    }
    face.warm_up();
    for f in &files {
        let name = f.display().to_string();
        if config.only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        let outcome = play_file(f, face, config);
        summary.played += 1;
        let report = outcome.report(&name);
        summary.skipped += usize::from(outcome.skipped.is_some());
        if outcome.result.is_ok() {
            print!("{report}");
        } else {
            eprint!("{report}");
            summary.failed += 1;
            summary.failures.push(report);
        }
    }
    let skipped = if summary.skipped > 0 {
        format!(", {} SKIPPED (unsupported by this face)", summary.skipped)
    } else {
        String::new()
    };
    println!(
        "scenarios: {} played, {} failed{skipped}",
        summary.played, summary.failed
    );
    if summary.played == 0 {
        let why = match &config.only {
            Some(o) => format!(
                "no scenario in {} matches DLOCK_SCENARIO={o}",
                dir.display()
            ),
            None => format!("no scenario file in {}", dir.display()),
        };
        eprintln!("{why}");
        summary.failed += 1;
        summary.failures.push(why);
    }
    summary
}
