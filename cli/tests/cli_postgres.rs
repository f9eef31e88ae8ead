//! `dlock` on the real PostgreSQL primary (`scripts/test-postgres.sh` starts
//! it and runs this with `--ignored`): `run` holds a lock with the URL in
//! `--endpoints` and the password in `DLOCK_PASSWORD`, `show` and `list`
//! read its holder, `run --try` finds it held, `postgres migrate` reports
//! the schema version, and the lock is gone once `run` ends.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use dlock_testkit::pg;

const BIN: &str = env!("CARGO_BIN_EXE_dlock");

/// The URL without its password, and the password (DLOCK_PASSWORD).
fn split(url: &str) -> (String, String) {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (auth, host) = rest.rsplit_once('@').unwrap();
    let (user, password) = auth.split_once(':').unwrap();
    (format!("{scheme}://{user}@{host}"), password.to_string())
}

fn dlock(args: &[&str], password: &str) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("DLOCK_ENDPOINTS")
        .env("DLOCK_PASSWORD", password);
    c
}

fn output(args: &[&str], password: &str) -> Output {
    dlock(args, password).output().expect("run dlock")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Ends the holder on every way out of the test.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `dlock ARGS -- sh -c 'echo "$DLOCK_TOKEN"; exec sleep 60'` and
/// waits for its command's first line: the token it holds (or leads) with.
fn holding(args: &[&str], password: &str) -> (Holder, i64) {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--", "sh", "-c", "echo \"$DLOCK_TOKEN\"; exec sleep 60"]);
    let mut holder = Holder(
        dlock(&all, password)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn dlock"),
    );
    let mut line = String::new();
    BufReader::new(holder.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let token = line
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("token line {line:?}"));
    (holder, token)
}

#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn run_show_list_and_migrate_on_postgres() {
    let (url, password) = split(&pg::servers().url);
    let url = url.as_str();
    let pw = password.as_str();
    let out = output(&["postgres", "migrate", "--endpoints", url], pw);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("dlock schema version {}\n", dlock::SCHEMA_VERSION)
    );

    let name = format!("pg/cli-{}", std::process::id());
    let (mut holder, token) = holding(
        &["run", "--description", "pg job", "--endpoints", url, &name],
        pw,
    );

    let shown = output(&["show", "--json", "--endpoints", url, &name], pw);
    assert_eq!(shown.status.code(), Some(0), "{shown:?}");
    let shown = json(&shown);
    assert_eq!(shown["held"], true);
    assert_eq!(shown["holder"]["token"], token);
    assert_eq!(shown["waiters_known"], false);
    // The lease row's identity (issue 31): this holder's process.
    let id = &shown["holder"]["identity"];
    assert_eq!(
        (&id["description"], &id["face"]),
        (&"pg job".into(), &"cli".into())
    );
    assert_eq!(
        id["pid"].as_u64(),
        Some(u64::from(holder.0.id())),
        "{shown}"
    );
    let left = shown["holder"]["ttl_left_s"].as_i64().unwrap();
    assert!((1..=15).contains(&left), "{shown}");

    // The metrics view: held and token in the core's names; no waiter
    // count, which PostgreSQL does not know.
    let text = output(&["show", "--metrics", "--endpoints", url, &name], pw);
    assert_eq!(text.status.code(), Some(0), "{text:?}");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!("dlock_lock_held{{lock=\"{name}\"}} 1")),
        "{text}"
    );
    assert!(
        text.contains(&format!("dlock_lock_token{{lock=\"{name}\"}} {token}")),
        "{text}"
    );
    assert!(!text.contains("dlock_lock_waiters"), "{text}");

    let listed = json(&output(&["list", "--json", "--endpoints", url, &name], pw));
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["holder"]["token"], token);
    assert_eq!(listed[0]["identity"]["description"], "pg job");

    let busy = output(
        &["run", "--try", "--endpoints", url, &name, "--", "true"],
        pw,
    );
    assert_eq!(busy.status.code(), Some(120), "{busy:?}");

    // SIGTERM: run stops its group, releases, exits with the group's status.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(holder.0.id() as i32, libc::SIGTERM) },
        0
    );
    let status = holder.0.wait().unwrap();
    assert!(status.code().is_some_and(|c| c != 0), "{status:?}");
    let gone = output(&["show", "--endpoints", url, &name], pw);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
    assert!(String::from_utf8_lossy(&gone.stdout).contains("not held"));
}

/// `dlock elect` on PostgreSQL: an observer (`--observe --json`) sees no
/// leader, then the candidate's value and token once it leads.
#[test]
#[ignore = "needs PostgreSQL: scripts/test-postgres.sh"]
fn elect_and_observe_on_postgres() {
    let (url, password) = split(&pg::servers().url);
    let (url, pw) = (url.as_str(), password.as_str());
    let name = format!("pg/cli-elect-{}", std::process::id());
    let mut observer = Holder(
        dlock(
            &["elect", "--observe", "--json", "--endpoints", url, &name],
            pw,
        )
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dlock elect --observe"),
    );
    let mut lines = BufReader::new(observer.0.stdout.take().unwrap()).lines();
    let mut next = || -> serde_json::Value {
        let line = lines.next().expect("an observer line").unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    };
    assert_eq!(next()["event"], "no-leader");
    let (mut leader, token) = holding(&["elect", "--endpoints", url, &name, "primary-a"], pw);
    let seen = next();
    assert_eq!(seen["event"], "leader", "{seen}");
    assert_eq!(seen["value"], "primary-a");
    assert_eq!(seen["token"], token);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(leader.0.id() as i32, libc::SIGTERM) },
        0
    );
    leader.0.wait().unwrap();
    assert_eq!(next()["event"], "no-leader");
}
