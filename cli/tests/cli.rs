//! Bad input that needs no lock service: each is one line on stderr and a
//! documented exit code (docs/cli.md).

mod usage;

use std::process::Command;

use usage::one_line_error;

#[test]
fn usage_errors_are_one_line_and_exit_2_or_123() {
    one_line_error(
        &["run", "jobs", "sleep", "1"],
        2,
        "unexpected argument 'sleep'",
    );
    one_line_error(&["run", "jobs"], 2, "<CMD>");
    one_line_error(&["run", "jobs", "--"], 2, "<CMD>");
    // An unknown flag and a bad setting are the core's invalid_option (exit
    // 123), as in every face (scenarios/vectors/bad_input.json).
    one_line_error(
        &["run", "--bogus", "jobs", "--", "true"],
        123,
        "invalid_option: invalid option `unknown`: `--bogus` is not a setting",
    );
    one_line_error(
        &["run", "--ttl", "5", "jobs", "--", "true"],
        123,
        "invalid_option: invalid option `ttl`: `5`: time unit needed",
    );
    one_line_error(
        &["run", "--timeout=-2s", "jobs", "--", "true"],
        123,
        "invalid_argument: invalid argument: --timeout <DURATION>: duration `-2s` must be >= 0 seconds",
    );
    one_line_error(
        &["run", "--on-drain", "freeze", "jobs", "--", "true"],
        2,
        "expected none, stop or a signal",
    );
    one_line_error(
        &["run", "--try", "--timeout", "1s", "jobs", "--", "true"],
        2,
        "cannot be used with",
    );
    one_line_error(
        &["run", "--restart-limit", "2", "jobs", "--", "true"],
        2,
        "--restart",
    );
    one_line_error(&["frobnicate"], 2, "unrecognized subcommand");
}

#[test]
fn a_grace_that_does_not_fit_inside_the_margin_is_refused() {
    one_line_error(
        &[
            "run",
            "--endpoints",
            "127.0.0.1:1",
            "--grace",
            "800ms",
            "jobs",
            "--",
            "true",
        ],
        123,
        "--grace 800ms does not fit inside --margin 1s",
    );
    one_line_error(
        &[
            "run", "--margin", "3s", "--ttl", "10s", "--grace", "3s", "jobs", "--", "true",
        ],
        123,
        "does not fit",
    );
}

#[test]
fn bad_settings_are_the_cores_words() {
    one_line_error(
        &["run", "jobs", "--", "true"],
        123,
        "invalid_argument: no lock service",
    );
    one_line_error(
        &["run", "--endpoints", "nohost", "jobs", "--", "true"],
        123,
        "invalid_argument",
    );
    one_line_error(
        &[
            "run",
            "--endpoints",
            "127.0.0.1:1",
            "--ttl",
            "2s",
            "--keepalive-interval",
            "2s",
            "--grace",
            "0s",
            "jobs",
            "--",
            "true",
        ],
        123,
        "invalid_option",
    );
}

#[test]
fn an_unreachable_service_is_a_backend_error() {
    let args = [
        "run",
        "--endpoints",
        "127.0.0.1:1",
        "--connect-timeout",
        "300ms",
        "--request-timeout",
        "300ms",
        "jobs",
        "--",
        "true",
    ];
    one_line_error(&args, 122, "backend:");
    one_line_error(
        &[
            "show",
            "--endpoints",
            "127.0.0.1:1",
            "--connect-timeout",
            "300ms",
            "jobs",
        ],
        122,
        "backend:",
    );
}

/// Settings left out follow the given ones (design §14): a 6 s TTL with a
/// 2 s interval passes the option rules (the keepalive timeout is derived
/// from the interval, not the 2 s default) and gets as far as the service;
/// only a contradiction the user wrote is refused, naming both settings.
#[test]
fn left_out_settings_follow_the_given_ones() {
    let unreachable = [
        "--endpoints",
        "127.0.0.1:1",
        "--connect-timeout",
        "300ms",
        "--request-timeout",
        "300ms",
    ];
    let run = |timing: &[&str]| -> Vec<String> {
        let mut args = vec!["run".to_string()];
        args.extend(unreachable.iter().chain(timing).map(|s| s.to_string()));
        args.extend(["jobs", "--", "true"].map(String::from));
        args
    };
    let args = run(&["--ttl", "6s", "--keepalive-interval", "2s"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    one_line_error(&args, 122, "backend:");
    let args = run(&[
        "--ttl",
        "6s",
        "--keepalive-interval",
        "2s",
        "--keepalive-timeout",
        "2s",
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    one_line_error(
        &args,
        123,
        "invalid_option: invalid option `keepalive_timeout`: must be > 0 and < keepalive_interval (2s), got 2s",
    );
}

/// A PostgreSQL URL in `--endpoints`: the core picks PostgreSQL for `run`,
/// `show` and `postgres migrate` (nothing listens on port 1, so each is a
/// backend error naming PostgreSQL, not an etcd scheme error); `migrate`
/// refuses etcd endpoints; `postgres schema` needs no server.
#[test]
fn a_postgres_url_selects_postgres_in_every_command() {
    let url = "postgresql://dlock@127.0.0.1:1/db";
    let timeouts = ["--connect-timeout", "300ms", "--request-timeout", "300ms"];
    let with = |head: &[&'static str], tail: &[&'static str]| -> Vec<&'static str> {
        let mut v = head.to_vec();
        v.extend_from_slice(&["--endpoints", url]);
        v.extend_from_slice(&timeouts);
        v.extend_from_slice(tail);
        v
    };
    for args in [
        with(&["run"], &["jobs", "--", "true"]),
        with(&["show"], &["jobs"]),
        with(&["list"], &[]),
        with(&["elect", "--observe"], &["jobs"]),
        with(&["postgres", "migrate"], &[]),
    ] {
        one_line_error(&args, 122, "PostgreSQL at 127.0.0.1:1");
    }
    one_line_error(
        &["postgres", "migrate", "--endpoints", "127.0.0.1:2379"],
        123,
        "migrate needs a PostgreSQL URL",
    );
    one_line_error(
        &["show", "--endpoints", "127.0.0.1:1,postgres://h/db", "jobs"],
        123,
        "PostgreSQL URL",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["postgres", "schema"])
        .output()
        .expect("run dlock");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), dlock::SCHEMA_SQL);
}
