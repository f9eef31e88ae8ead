//! Exit while holding, on the etcd test cluster: a child process acquires a
//! lock and leaves by its face's exit path while a contender in this
//! process waits; the contender must acquire within one keepalive timeout
//! of the child's exit (500 ms here, + 500 ms of slack for a loaded
//! machine), not at the lease's expiry a TTL later (3 s).
//!
//! - C (`DLOCK_C_EXIT`, `ffi-c/tests/c/exit_holding.c` built by
//!   `scripts/test-c-etcd.sh`): `return` from main and `exit()`, with no
//!   free and no `lk_shutdown`: the handler dlock registered with `atexit`
//!   does it.
//! - Rust: this binary run again as the child (`rust_child`), calling
//!   `dlock::shutdown()` before `exit` (the Rust face's documented exit).
//! - The baseline, in the same run: the C child killed with SIGKILL, so no
//!   exit path runs and the lock passes only at the lease's expiry.
//!
//! Each case prints `EXIT|<face>|<ms>`: from the start of the child's exit
//! path (its `exit NS` line, CLOCK_MONOTONIC) to the contender's
//! acquisition (the same clock, read in its completion callback).
//! A `test = false` target: `scripts/test-c-etcd.sh` runs it with the
//! cluster's environment.

use dlock_testkit::etcd as etcd_cluster;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use dlock_core::{Client, ClientConfig, EtcdConfig, Options};

/// The children's keepalive timeout (their TTL is 3 s).
const KEEPALIVE_TIMEOUT_MS: f64 = 500.0;
/// Room for a loaded 2-core machine beyond the keepalive timeout.
const SLACK_MS: f64 = 500.0;

fn mono_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, t: *mut Timespec) -> i32;
    }
    const CLOCK_MONOTONIC: i32 = 1;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: a valid out pointer.
    unsafe { clock_gettime(CLOCK_MONOTONIC, &mut t) };
    t.sec as u64 * 1_000_000_000 + t.nsec as u64
}

fn unique(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "exit-test/{what}/{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The number of lock keys under `name/` (etcdctl).
fn keys(members: &str, name: &str) -> usize {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            &format!("--endpoints={members}"),
            "get",
            "--prefix",
            &format!("{name}/"),
            "--keys-only",
        ])
        .output()
        .expect("etcdctl");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .count()
}

/// A child holding a lock: its stdin (a line lets it go) and its stdout.
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Holder {
    fn spawn(cmd: &mut Command, members: &str) -> Holder {
        let mut child = cmd
            .env("DLOCK_ENDPOINTS", members)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the child");
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Holder {
            child,
            stdin,
            lines,
        }
    }

    /// The value after `prefix` of the first line that starts with it.
    fn line(&self, prefix: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(20))
                .unwrap_or_else(|_| panic!("no `{prefix}` line from the child"));
            if let Some(v) = l.strip_prefix(prefix) {
                return v.trim().to_string();
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How the child leaves.
enum Leave {
    /// A line on its stdin: its own exit path.
    ExitPath,
    /// SIGKILL: no exit path at all (the baseline).
    Kill,
}

/// The settings of the holders and the contender: the backend tests'
/// keepalive, retry and margin, TTL 3 s, no reacquire.
fn holder_options() -> Options {
    dlock_testkit::options(Duration::from_secs(3), false)
}

/// Runs one case: the child holds `name`, a contender waits, the child
/// leaves; the milliseconds from the start of its exit to the contender's
/// acquisition.
fn measure(face: &str, members: &str, name: &str, cmd: &mut Command, leave: Leave) -> f64 {
    let mut holder = Holder::spawn(cmd, members);
    let token: u64 = holder.line("held ").parse().expect("held TOKEN");
    let options = holder_options();
    let client = Client::connect(
        ClientConfig::etcd(EtcdConfig::new(members.split(','))).with_options(options),
    )
    .expect("the contender's client");
    let lock = client.lock(name).expect("the contender's lock");
    let (tx, acquired) = channel();
    let _acquisition = lock.acquire_then(true, Some(Duration::from_secs(20)), move |r| {
        let _ = tx.send((mono_ns(), r));
    });
    // The contender's key is in etcd behind the child's: it waits.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while keys(members, name) < 2 {
        assert!(
            std::time::Instant::now() < until,
            "{face}: the contender never queued"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let exit_ns = match leave {
        Leave::ExitPath => {
            let mut stdin = holder.stdin.take().expect("stdin");
            stdin.write_all(b"go\n").expect("write to the child");
            drop(stdin);
            holder.line("exit ").parse::<u64>().expect("exit NS")
        }
        Leave::Kill => {
            let t = mono_ns();
            holder.child.kill().expect("SIGKILL");
            t
        }
    };
    let (at, r) = acquired
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{face}: the contender did not acquire"));
    let got = r.unwrap_or_else(|e| panic!("{face}: the contender's acquire failed: {e}"));
    assert!(got.get() > token, "{face}: token {got} after {token}");
    let status = holder.child.wait().expect("wait");
    if let Leave::ExitPath = leave {
        assert!(status.success(), "{face}: the child exited with {status}");
    }
    lock.release().expect("release");
    let ms = at.saturating_sub(exit_ns) as f64 / 1e6;
    println!("EXIT|{face}|{ms:.1}");
    ms
}

/// The C face: `return` from main and `exit()` while holding release at
/// once; SIGKILL (the baseline) waits out the lease.
#[test]
fn c_exit_while_holding() {
    let cluster = etcd_cluster::cluster();
    let bin = std::env::var("DLOCK_C_EXIT")
        .expect("DLOCK_C_EXIT: the compiled ffi-c/tests/c/exit_holding.c (scripts/test-c-etcd.sh)");
    let members = cluster.members.join(",");
    for mode in ["return", "exit"] {
        let name = unique(&format!("c-{mode}"));
        let ms = measure(
            &format!("c-{mode}"),
            &members,
            &name,
            Command::new(&bin).args([mode, &name]),
            Leave::ExitPath,
        );
        assert!(
            ms < KEEPALIVE_TIMEOUT_MS + SLACK_MS,
            "c {mode}: the contender acquired {ms} ms after the exit"
        );
    }
    let name = unique("c-sigkill");
    let ms = measure(
        "c-sigkill (baseline)",
        &members,
        &name,
        Command::new(&bin).args(["return", &name]),
        Leave::Kill,
    );
    // The lease's expiry: at least a TTL less a keepalive interval.
    assert!(
        ms > KEEPALIVE_TIMEOUT_MS + SLACK_MS,
        "the baseline passed in {ms} ms"
    );
}

/// The Rust face: `dlock::shutdown()` on the way out.
#[test]
fn rust_exit_while_holding() {
    let cluster = etcd_cluster::cluster();
    let members = cluster.members.join(",");
    let name = unique("rust");
    let exe = std::env::current_exe().expect("this test binary");
    let ms = measure(
        "rust",
        &members,
        &name,
        Command::new(exe)
            .args(["rust_child", "--exact", "--ignored", "--nocapture"])
            .env("DLOCK_EXIT_CHILD", &name),
        Leave::ExitPath,
    );
    assert!(
        ms < KEEPALIVE_TIMEOUT_MS + SLACK_MS,
        "rust: the contender acquired {ms} ms after the exit"
    );
}

/// The child of `rust_exit_while_holding` (run only as that child): holds
/// `DLOCK_EXIT_CHILD`, then leaves through the Rust face's exit path.
#[test]
#[ignore = "the child process of rust_exit_while_holding"]
fn rust_child() {
    let Ok(name) = std::env::var("DLOCK_EXIT_CHILD") else {
        return;
    };
    let options = holder_options();
    let client = Client::connect(ClientConfig::from_env().with_options(options)).expect("client");
    let lock = client.lock(&name).expect("lock");
    let token = lock.acquire(Duration::from_secs(10)).expect("acquire");
    println!("held {}", token.get());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("stdin");
    println!("exit {}", mono_ns());
    dlock_core::shutdown();
    std::process::exit(0);
}
