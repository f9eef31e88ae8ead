//! Playing scenarios through a [`Face`].

use std::path::Path;
use std::time::Duration;

use crate::{
    Event, Face, Observed, Scenario, Step, TraceSink, WAIT_LIMIT, check_trace, load,
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
}

impl Outcome {
    /// The report: `ok` or the failure, then the notes, then the trace.
    pub fn report(&self, name: &str) -> String {
        let mut s = match &self.result {
            Ok(()) => format!("{name}: ok\n"),
            Err(e) => format!("FAILED {name}: {e}\n"),
        };
        for n in &self.notes {
            s.push_str(&format!("  note: {n}\n"));
        }
        s.push_str(&show(&self.trace));
        s
    }
}

/// Compares what the face observed with what the step expects.
fn judge(step: &Step, got: Observed) -> Result<(), String> {
    let mismatch = |got: &Observed| Err(format!("the face answered {got:?}"));
    match (step, got) {
        (
            Step::Acquire { .. }
            | Step::End { .. }
            | Step::Release { .. }
            | Step::Fault { .. }
            | Step::StallDriver { .. }
            | Step::Close { .. },
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
            Step::Permit { expect, token, .. },
            Observed::Permit {
                word,
                token: got_token,
            },
        ) => {
            if &word != expect {
                Err(format!("permit gave {word}"))
            } else if word == "granted" && token.is_some() && got_token != *token {
                match got_token {
                    Some(t) => Err(format!("permit token {t}")),
                    None => Err("permit has no token".into()),
                }
            } else {
                Ok(())
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
        (_, got) => mismatch(&got),
    }
}

/// Plays one scenario: setup, the steps (sleeping until each `at`, waiting
/// on the trace for each `wait`, judging what the face observed), the trace
/// comparison, and always the teardown.
pub fn play(scenario: &Scenario, face: &mut dyn Face, config: &Config) -> Outcome {
    let trace = TraceSink::new();
    let mut notes = Vec::new();
    let mut result = face
        .setup(scenario, trace.clone())
        .map_err(|e| format!("setup: {e}"));
    let mut snapshot = None;
    if result.is_ok() {
        result = steps(scenario, face, config, &trace, &mut notes);
    }
    if result.is_ok() {
        let actual = trace.wait_len(scenario.trace.len(), config.wait_limit);
        result = check_trace(&scenario.trace, &actual, config.slack_ms);
        snapshot = Some(actual);
    }
    let snapshot = snapshot.unwrap_or_else(|| trace.events());
    face.teardown();
    Outcome {
        trace: snapshot,
        notes,
        result,
    }
}

fn steps(
    scenario: &Scenario,
    face: &mut dyn Face,
    config: &Config,
    trace: &TraceSink,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let mut cursor = 0;
    for (i, timed) in scenario.steps.iter().enumerate() {
        let fail = |m: String| format!("step {i} {}: {m}", timed.text);
        if let Some(at) = timed.at {
            let elapsed = trace.elapsed_ms();
            if at > elapsed {
                std::thread::sleep(Duration::from_millis(at - elapsed));
            }
        }
        if let Step::Wait { event } = &timed.step {
            cursor = trace
                .wait_for(event, cursor, config.wait_limit)
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
        },
    }
}

/// The tally of [`play_dir`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// `*.json` files in the directory (before the filter).
    pub files: usize,
    pub played: usize,
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
        if outcome.result.is_ok() {
            print!("{report}");
        } else {
            eprint!("{report}");
            summary.failed += 1;
            summary.failures.push(report);
        }
    }
    println!(
        "scenarios: {} played, {} failed",
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
