//! What the command's tests of bad input without a lock service share:
//! running `dlock` with no `DLOCK_ENDPOINTS`, and the one-line-error check.

use std::process::Command;

/// Runs `dlock args` with no `DLOCK_ENDPOINTS`: its exit code and stderr.
fn dlock(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .env_remove("DLOCK_ENDPOINTS")
        .output()
        .expect("run dlock");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().expect("exited"), stderr)
}

/// `dlock args` exits `code` with one line on stderr, `dlock: …`, that
/// contains `needle`.
pub fn one_line_error(args: &[&str], code: i32, needle: &str) {
    let (got, stderr) = dlock(args);
    assert_eq!(got, code, "dlock {args:?}: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "dlock {args:?}: not one line: {stderr}"
    );
    assert!(stderr.starts_with("dlock: "), "{stderr}");
    assert!(
        stderr.contains(needle),
        "dlock {args:?}: {stderr:?} lacks {needle:?}"
    );
}
