//! README.md's examples as written (issue 32, item 9). Rust cannot compile
//! a README block at run time, so the Rust block lives here, in
//! `readme_rust` between the `README` markers, and a test holds it equal
//! to the README's; another runs it on the embedded backend, fenced (its
//! lock key deleted, the default reacquire) at its third unit, and checks
//! that the loop stops as its comment says: no unit under the new token.
//! The C and C++ blocks live the same way in ffi-c/tests/c/readme.c and
//! ffi-c/tests/cpp/readme.cpp (compiled and run by scripts/test-c.sh and
//! scripts/test-cpp.sh); their text is checked here too.

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::{MemoryService, Token};

const README: &str = include_str!("../../README.md");

/// The first ```LANG block under README.md's `## FACE` heading; panics
/// (naming what is missing) when the heading or the block moved.
fn readme_block(face: &str, lang: &str) -> String {
    let heading = format!("\n## {face}\n");
    let section = README
        .split_once(&heading)
        .unwrap_or_else(|| {
            panic!("README.md has no `## {face}` heading: update core/tests/readme.rs")
        })
        .1;
    let section = section.split("\n## ").next().unwrap_or(section);
    let fence = format!("```{lang}\n");
    let block = section
        .split_once(&fence)
        .unwrap_or_else(|| {
            panic!("README.md's `## {face}` has no ```{lang} block: update core/tests/readme.rs")
        })
        .1;
    block
        .split_once("```")
        .unwrap_or_else(|| panic!("README.md's `## {face}` ```{lang} block is not closed"))
        .0
        .to_owned()
}

/// The lines of `source` between the line holding `README: begin` and the
/// one holding `README: end`, with `indent` leading spaces taken off each.
fn marked_region(source: &str, file: &str, indent: usize) -> String {
    let mut out = String::new();
    let mut inside = false;
    let mut closed = false;
    for line in source.lines() {
        let marker = line
            .trim_start()
            .trim_start_matches("//")
            .trim_start_matches("/*")
            .trim_start();
        if marker.starts_with("README: begin") {
            inside = true;
        } else if marker.starts_with("README: end") {
            closed = inside;
            break;
        } else if inside {
            let line = if line.trim().is_empty() {
                ""
            } else {
                line.get(indent..).unwrap_or(line)
            };
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        closed,
        "{file} has no `README: begin` ... `README: end` region"
    );
    out
}

// ---- the Rust block, as README.md's `## Rust` has it ---------------------

static UNITS: Mutex<Vec<Token>> = Mutex::new(Vec::new());

fn do_one_unit(token: Token) {
    let n = {
        let mut units = UNITS.lock().unwrap();
        units.push(token);
        units.len()
    };
    if n == 3 {
        // The fence: an operator deletes the key; the lock reacquires
        // (the service's holder is the new token once it has).
        let service = MemoryService::shared();
        assert!(service.delete_lock_key("orders"));
        let start = Instant::now();
        while service.holder("orders").is_none() || service.holder("orders") == Some(token) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no reacquisition after the fence"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(n < 50, "the loop did not stop at the fence");
}

fn commit() {}

// As README.md has it, so rustfmt leaves it alone.
#[rustfmt::skip]
fn readme_rust() -> Result<(), dlock::Error> {
    // README: begin (README.md, `## Rust`, the first ```rust block)
    use std::time::Duration;

    let client = dlock::Client::memory(); // embedded backend, default options
    let lock = client.lock("orders")?;
    lock.on_fence(|token, in_flight| eprintln!("lost token {token}; {in_flight} units in flight"));
    let token = lock.acquire(Duration::from_secs(10))?;

    while let Ok(permit) = lock.permit() {
        if permit.token() != token { break } // fenced and acquired again meanwhile: stop too
        do_one_unit(permit.token());         // every write carries permit.token()
        if permit.valid() { commit() }       // re-reads the clock
    }   // refused: draining, fenced, released or not_held: no new work
    lock.release()?;
    // README: end
    Ok(())
}

#[test]
fn the_rust_block_here_is_the_readmes() {
    let here = marked_region(include_str!("readme.rs"), "core/tests/readme.rs", 4);
    assert_eq!(
        here,
        readme_block("Rust", "rust"),
        "README.md's Rust block and core/tests/readme.rs differ"
    );
}

#[test]
fn the_readme_rust_loop_stops_at_a_fence_as_its_comment_says() {
    for run in 0..30 {
        UNITS.lock().unwrap().clear();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(readme_rust()));
        let result = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("run {run}: the loop did not stop within 20 s"));
        result.unwrap_or_else(|e| panic!("run {run}: {e}"));
        let units = UNITS.lock().unwrap().clone();
        assert_eq!(
            units.len(),
            3,
            "run {run}: {} units ({units:?}): worked after the fence",
            units.len()
        );
        assert!(
            units.iter().all(|t| *t == units[0]),
            "run {run}: worked under {units:?} (the new token)"
        );
    }
}

#[test]
fn the_c_block_is_ffi_c_tests_c_readme_c() {
    let here = marked_region(
        include_str!("../../ffi-c/tests/c/readme.c"),
        "ffi-c/tests/c/readme.c",
        2,
    );
    assert_eq!(
        here,
        readme_block("C", "c"),
        "README.md's C block and ffi-c/tests/c/readme.c differ"
    );
}

#[test]
fn the_cpp_block_is_ffi_c_tests_cpp_readme_cpp() {
    let here = marked_region(
        include_str!("../../ffi-c/tests/cpp/readme.cpp"),
        "ffi-c/tests/cpp/readme.cpp",
        2,
    );
    assert_eq!(
        here,
        readme_block("C++", "cpp"),
        "README.md's C++ block and ffi-c/tests/cpp/readme.cpp differ"
    );
}
