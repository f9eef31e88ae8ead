//! `dlock.guard` against a real pause, process by process: the Rust and C
//! examples (`examples/rust/pg_guard.rs`, `examples/c/pg_guard.c`) hold
//! the lock, commit a unit of work to the user's own table, and stop
//! themselves with SIGSTOP before the next; their lease runs out on the
//! server; a contender here takes the lock and writes in its own guarded
//! transaction; the holder resumes (SIGCONT) into its next transaction,
//! which the database refuses with SQLSTATE DL001. The table then holds the
//! holder's one unit and the contender's write, nothing after it.
//!
//! `scripts/test-postgres.sh` builds both examples and names them in
//! `DLOCK_PG_GUARD_RUST` and `DLOCK_PG_GUARD_C`; the Python and Node faces
//! run the same story in their own suites.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use dlock::{Client, ClientConfig, Options, PostgresConfig};
use dlock_testkit::pg;
use pg::Sql;

/// The examples' lock name and table.
const NAME: &str = "examples/pg-guard";
const TABLE: &str = "CREATE TABLE IF NOT EXISTS pg_guard_units \
     (id bigserial PRIMARY KEY, who text NOT NULL, unit int NOT NULL, token bigint NOT NULL)";
/// The longest wait for something that must happen (the examples' TTL is
/// 3 s).
const EVENT: Duration = Duration::from_secs(20);

/// One story at a time: both examples use the one lock name.
static ONE: Mutex<()> = Mutex::new(());

/// Kills the holder if the test fails half-way (a stopped holder would hold
/// its connections, and nothing else, until the cluster stops).
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0.id() as i32, libc::SIGCONT) };
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The process's state letter in /proc/PID/stat ('T': stopped).
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: " S ...".
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

fn wait_for_line(
    lines: &mpsc::Receiver<String>,
    seen: &mut Vec<String>,
    pred: impl Fn(&str) -> bool,
    what: &str,
) -> String {
    let end = Instant::now() + EVENT;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                seen.push(line.clone());
                if pred(&line) {
                    return line;
                }
            }
            Err(_) => panic!(
                "no {what} from the holder in {EVENT:?}; its output:\n{}",
                seen.join("\n")
            ),
        }
    }
}

fn holder_path(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: scripts/test-postgres.sh builds the example and sets it")
    })
}

fn paused_holder_is_refused(program: &str, face: &str) {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let s = pg::servers();
    let admin = Sql::connect(&s.url);
    admin.batch(TABLE).unwrap();
    let t = dlock::clock::system_now().as_nanos();
    let old = format!("{face}-holder-{t}");
    let new = format!("{face}-contender-{t}");

    // 1. The holder: one unit committed, then stopped before the next.
    let mut child = Command::new(program)
        .args([old.as_str(), "3"])
        .env("DLOCK_ENDPOINTS", &s.url)
        .env("DATABASE_URL", &s.url)
        .env("PG_GUARD_PAUSE_AT", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let pid = child.id();
    let mut holder = Holder(child);
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let holds = wait_for_line(&lines, &mut seen, |l| l.contains(" holds "), "token");
    let t1: u64 = holds.rsplit(' ').next().unwrap().parse().unwrap();
    wait_for_line(
        &lines,
        &mut seen,
        |l| l.contains("pausing before unit 1"),
        "pause",
    );
    let end = Instant::now() + EVENT;
    while proc_state(pid) != Some('T') {
        assert!(
            Instant::now() < end,
            "the holder did not stop: {:?}",
            proc_state(pid)
        );
        thread::sleep(Duration::from_millis(10));
    }
    let stopped = Instant::now();

    // 2. A contender: it gets the lock once the stopped holder's lease runs
    // out on the server (about a TTL after its last keepalive), and writes.
    let config = PostgresConfig::parse(&s.url).unwrap();
    let contender = Client::connect(ClientConfig::postgres(config).with_options(Options {
        ttl: Duration::from_secs(4),
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_millis(500),
        retry_interval: Duration::from_millis(250),
        margin: Duration::from_secs(1),
        reacquire: false,
    }))
    .unwrap();
    let lock = contender.lock(NAME).unwrap();
    let t2 = lock.acquire(EVENT).expect("the contender acquires");
    assert!(t2.get() > t1, "token {t2} after {t1}");
    assert_eq!(
        proc_state(pid),
        Some('T'),
        "the holder ran before the contender's write"
    );
    eprintln!(
        "{face}: the contender acquired {:?} after the holder stopped",
        stopped.elapsed()
    );
    let app = Sql::connect(&s.url);
    let t2 = t2.get() as i64;
    app.batch("BEGIN").unwrap();
    app.query("SELECT dlock.guard($1, $2)", &[&NAME, &t2])
        .expect("the contender's guard");
    app.query(
        "INSERT INTO pg_guard_units (who, unit, token) VALUES ($1, 0, $2)",
        &[&new, &t2],
    )
    .unwrap();
    app.batch("COMMIT").unwrap();

    // 3. The holder resumes into its next transaction: refused.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGCONT) }, 0);
    let end = Instant::now() + EVENT;
    let status = loop {
        if let Some(status) = holder.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < end,
            "the holder did not finish after SIGCONT"
        );
        thread::sleep(Duration::from_millis(20));
    };
    seen.extend(lines.try_iter());
    let out = seen.join("\n");
    assert!(status.success(), "{status}; output:\n{out}");
    let refused = format!(
        "{old}: refused by the database (SQLSTATE DL001): token {t1} no longer holds {NAME}; stopping"
    );
    assert!(seen.contains(&refused), "no refusal; output:\n{out}");
    assert!(!out.contains("unit 1 committed"), "output:\n{out}");

    // 4. The user's table: the holder's unit 0, then the contender's write,
    // nothing of the old holder after it.
    let rows: Vec<(String, i32, i64)> = admin
        .query(
            "SELECT who, unit, token FROM pg_guard_units WHERE who IN ($1, $2) ORDER BY id",
            &[&old, &new],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        rows,
        vec![(old.clone(), 0, t1 as i64), (new.clone(), 0, t2)]
    );
    lock.release().unwrap();
}

#[test]
#[ignore = "needs PostgreSQL and the built example: scripts/test-postgres.sh"]
fn rust_example_paused_past_its_ttl_is_refused_by_the_guard() {
    paused_holder_is_refused(&holder_path("DLOCK_PG_GUARD_RUST"), "rust");
}

#[test]
#[ignore = "needs PostgreSQL and the built example: scripts/test-postgres.sh"]
fn c_example_paused_past_its_ttl_is_refused_by_the_guard() {
    paused_holder_is_refused(&holder_path("DLOCK_PG_GUARD_C"), "c");
}
