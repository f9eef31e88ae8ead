//! `dlock run -n N NAME -- CMD` (semaphores, issue 29) on the 3-member test
//! cluster (scripts/test-cli.sh starts it; `dlock run` needs a lock
//! service): N + 1 contenders, at most N run at once, each on a distinct
//! slot (`DLOCK_SLOT`, `DLOCK_LOCK` = `NAME/slot/<i>`, `DLOCK_TOKEN`); a
//! limit mismatch, 0 or over the maximum exit 123 (the core's
//! `invalid_argument`); `--try` with every slot held exits 120; `dlock
//! show` / `list` see the held slots; an operator's delete of one slot's
//! key stops that holder's group (exit 124) and leaves the other alone; a
//! signal while waiting leaves no key queued.

use dlock_testkit::etcd as etcd_cluster;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use etcd_cluster::Cluster;

const BIN: &str = env!("CARGO_BIN_EXE_dlock");

fn unique(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "cli-sem-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn dlock(c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("DLOCK_ENDPOINTS", c.members.join(",")).args(args);
    cmd
}

/// `dlock run -n N NAME -- sh -c SCRIPT`, its output piped.
fn run_n(c: &Cluster, n: u32, name: &str, script: &str) -> Child {
    dlock(
        c,
        &["run", "-n", &n.to_string(), name, "--", "sh", "-c", script],
    )
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("dlock run -n")
}

fn finish(child: Child, limit: Duration) -> Output {
    let pid = child.id() as i32;
    let killer = std::thread::spawn(move || {
        std::thread::sleep(limit);
        // SAFETY: a signal to our own child (gone already: ESRCH).
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let out = child.wait_with_output().expect("wait");
    drop(killer);
    out
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `dlock show --json NAME`: (exit code, JSON).
fn show(c: &Cluster, name: &str) -> (i32, serde_json::Value) {
    let out = dlock(c, &["show", "--json", name]).output().expect("show");
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("dlock show: {e}: {}", stderr(&out)));
    (out.status.code().expect("exited"), v)
}

/// Waits until `dlock show NAME` sees `n` slots held.
fn slots_held(c: &Cluster, name: &str, n: u64) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = show(c, name);
        if v["semaphore"]["held"].as_u64() == Some(n) {
            return v;
        }
        assert!(Instant::now() < end, "{name}: not {n} slots held: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// N + 1 contenders: at most N run at once (intervals of their commands
/// read from one log, on one machine's clock), N at once at some point,
/// every holder at once on a distinct slot, each with its slot's lock
/// name and a token.
#[test]
fn n_plus_one_contenders_at_most_n_at_once() {
    let c = etcd_cluster::cluster();
    let name = unique("n1");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("log");
    const N: u32 = 2;
    let script = format!(
        "echo start $DLOCK_SLOT $DLOCK_LOCK $DLOCK_TOKEN $(date +%s%N) >> {log}; sleep 1; \
         echo end $DLOCK_SLOT $DLOCK_LOCK $DLOCK_TOKEN $(date +%s%N) >> {log}",
        log = log.display()
    );
    let children: Vec<Child> = (0..=N).map(|_| run_n(&c, N, &name, &script)).collect();
    for child in children {
        let out = finish(child, Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    check_log(&log, &name, N, N as usize + 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The log's intervals: `runs` runs, never more than `n` at once, `n` at
/// once at some point, the slots of the runs at once distinct.
fn check_log(log: &Path, name: &str, n: u32, runs: usize) {
    let text = std::fs::read_to_string(log).expect("the log");
    // (time, +1 start / -1 end, slot)
    let mut events: Vec<(u128, i32, u32)> = Vec::new();
    for line in BufReader::new(text.as_bytes()).lines() {
        let line = line.unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.len(), 5, "{line}");
        let slot: u32 = f[1].parse().expect("DLOCK_SLOT");
        assert!(slot < n, "{line}");
        assert_eq!(f[2], format!("{name}/slot/{slot}"), "DLOCK_LOCK: {line}");
        assert!(f[3].parse::<u64>().expect("DLOCK_TOKEN") > 0, "{line}");
        let t: u128 = f[4].parse().expect("time");
        events.push((t, if f[0] == "start" { 1 } else { -1 }, slot));
    }
    assert_eq!(events.len(), 2 * runs, "{text}");
    // Ends before starts at the same instant.
    events.sort_by_key(|&(t, d, _)| (t, d));
    let mut running: Vec<u32> = Vec::new();
    let mut most = 0;
    for (_, d, slot) in events {
        if d > 0 {
            assert!(
                !running.contains(&slot),
                "slot {slot} twice at once:\n{text}"
            );
            running.push(slot);
        } else {
            running.retain(|&s| s != slot);
        }
        most = most.max(running.len());
    }
    assert!(most <= n as usize, "{most} at once:\n{text}");
    assert_eq!(most, n as usize, "never {n} at once:\n{text}");
}

/// The limit is the core's: another limit than the recorded one, 0 and
/// over the maximum exit 123 (`invalid_argument`) without running CMD.
#[test]
fn a_limit_mismatch_exits_invalid_argument() {
    let c = etcd_cluster::cluster();
    let name = unique("limit");
    let first = dlock(&c, &["run", "-n", "2", &name, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let other = dlock(&c, &["run", "-n", "3", &name, "--", "echo", "ran"])
        .output()
        .unwrap();
    assert_eq!(other.status.code(), Some(123), "{}", stderr(&other));
    let e = stderr(&other);
    assert!(
        e.contains("invalid_argument") && e.contains("limit 2") && e.contains("not 3"),
        "{e}"
    );
    assert!(other.stdout.is_empty(), "CMD ran");
    for bad in ["0", "1025"] {
        let o = dlock(&c, &["run", "-n", bad, &unique("bad"), "--", "true"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(123), "-n {bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("invalid_argument"), "{}", stderr(&o));
    }
}

/// Two holders of a semaphore of 2: `--try` exits 120, `show` and `list`
/// see both slots; deleting one slot's key (an operator) stops that
/// holder's group (exit 124, fenced) while the other goes on.
#[test]
fn show_list_try_and_one_slot_fenced_alone() {
    let c = etcd_cluster::cluster();
    let name = unique("show");
    let mut a = run_n(&c, 2, &name, "echo key=$ETCD_LOCK_KEY; exec sleep 1000");
    let mut b = run_n(&c, 2, &name, "echo key=$ETCD_LOCK_KEY; exec sleep 1000");
    let v = slots_held(&c, &name, 2);
    let slots: Vec<u64> = v["semaphore"]["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, [0, 1], "{v}");
    assert_eq!(v["held"], serde_json::Value::Bool(true));
    assert_eq!(v["semaphore"]["slots"][0]["name"], format!("{name}/slot/0"));
    assert_eq!(
        v["semaphore"]["limit"], 2,
        "the limit its first handle recorded: {v}"
    );

    let tried = dlock(&c, &["run", "--try", "-n", "2", &name, "--", "echo", "ran"])
        .output()
        .unwrap();
    assert_eq!(tried.status.code(), Some(120), "{}", stderr(&tried));
    assert!(tried.stdout.is_empty());

    let listed = dlock(&c, &["list", "--json", &name]).output().unwrap();
    let l: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let marked = l
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["semaphore"]["name"] == name.as_str())
        .count();
    assert_eq!(marked, 2, "{l}");

    // Holder a's key, from its first line.
    let mut out_a = BufReader::new(a.stdout.take().unwrap());
    let mut line = String::new();
    out_a.read_line(&mut line).unwrap();
    let key = line.trim().strip_prefix("key=").expect("key=").to_owned();
    let del = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", c.members[1]))
        .args(["del", &key])
        .output()
        .unwrap();
    assert!(del.status.success());
    let t = Instant::now();
    let out = finish(a, Duration::from_secs(15));
    assert_eq!(out.status.code(), Some(124), "{}", stderr(&out));
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    // The other holder goes on.
    assert!(b.try_wait().unwrap().is_none(), "the other holder stopped");
    slots_held(&c, &name, 1);
    b.kill().unwrap();
    let _ = b.wait();
}

/// A signal while waiting for a slot cancels the wait (the core's cancel:
/// the dropped acquisition leaves nothing held, no key queued in the
/// semaphore's queue or on any slot) and dlock exits 128 + n without
/// running CMD.
#[test]
fn a_signal_while_waiting_leaves_no_key_queued() {
    let c = etcd_cluster::cluster();
    let name = unique("sig");
    let mut holder = run_n(&c, 1, &name, "exec sleep 1000");
    slots_held(&c, &name, 1);
    let waiter = run_n(&c, 1, &name, "echo ran");
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = show(&c, &name);
        if v["semaphore"]["queue"].as_array().map_or(0, Vec::len) == 1 {
            break;
        }
        assert!(Instant::now() < end, "no waiter queued: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(waiter.id() as i32, libc::SIGTERM) };
    let out = finish(waiter, Duration::from_secs(15));
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty(), "CMD ran");
    let (_, v) = show(&c, &name);
    assert_eq!(v["semaphore"]["held"], 1, "{v}");
    for queued in [
        &v["semaphore"]["queue"],
        &v["semaphore"]["slots"][0]["waiters"],
    ] {
        assert_eq!(queued, &serde_json::json!([]), "{v}");
    }
    holder.kill().unwrap();
    let _ = holder.wait();
}

/// A start through late replies (issue 29: `dlock run -n` gave up when its
/// first request got no answer in time): every reply 1.5 s late for the
/// first 6 s (the lease's grant and the limit's record answered late, then
/// the slot tried first: later than its bound, two keepalive timeouts). The command waits, as `dlock run NAME` does,
/// and runs CMD in a slot once replies are on time again.
#[test]
fn a_start_through_late_replies_waits_and_runs() {
    use dlock_testkit::proxy::{Mode, Proxy};
    let c = etcd_cluster::cluster();
    let name = unique("late");
    let proxy = Proxy::start(c.member_addr(0));
    proxy.set(Mode::Delay(Duration::from_millis(1500)));
    let child = Command::new(BIN)
        .env("DLOCK_ENDPOINTS", proxy.url())
        .args([
            "run",
            "-n",
            "2",
            "--ttl",
            "4s",
            "--keepalive-interval",
            "1s",
            "--keepalive-timeout",
            "500ms",
            "--retry-interval",
            "250ms",
            "--margin",
            "1s",
            &name,
            "--",
            "sh",
            "-c",
            "echo slot=$DLOCK_SLOT",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock run -n");
    std::thread::sleep(Duration::from_secs(6));
    proxy.set(Mode::Pass);
    let out = finish(child, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("slot="),
        "CMD did not run: {}",
        stderr(&out)
    );
}
