//! `dlock elect` bad input that needs no lock service: one line on stderr
//! and exit 2 (usage) or 123 (invalid).

use std::process::Command;

fn dlock(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env_remove("DLOCK_ENDPOINTS")
        .output()
        .expect("run dlock");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().expect("exited"), stderr)
}

fn one_line_error(args: &[&str], code: i32, needle: &str) {
    let (got, stderr) = dlock(args);
    assert_eq!(got, code, "dlock {args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert!(stderr.contains(needle), "{stderr:?} lacks {needle:?}");
}

#[test]
fn elect_usage_errors_are_one_line() {
    one_line_error(&["elect", "leaders"], 2, "dlock elect NAME VALUE -- CMD");
    one_line_error(
        &["elect", "leaders", "v"],
        2,
        "dlock elect NAME VALUE -- CMD",
    );
    one_line_error(
        &["elect", "leaders", "--", "true"],
        2,
        "dlock elect NAME VALUE",
    );
    one_line_error(
        &["elect", "--observe", "leaders", "v"],
        2,
        "--observe takes the election's name only",
    );
    one_line_error(&["elect", "--json", "leaders"], 2, "--observe");
    one_line_error(
        &["elect", "leaders", "v", "--", "true"],
        123,
        "no lock service",
    );
}
