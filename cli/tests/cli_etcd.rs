//! `dlock` on the 3-member test cluster (scripts/test-cli.sh starts it):
//! the holder talks to member 1 through the fault proxy of the core's
//! tests, contenders (`etcdctl lock`, another `dlock run`) go to the other
//! members directly.
//!
//! The cut-off case is repeated `DLOCK_FAULT_RUNS` times (default 3) and
//! prints one `CLI|...` line of figures: the smallest time between the
//! group's death and the contender's acquisition, and SIGTERM -> group gone.
//! Times are read from one monotonic clock in this process: a group's death
//! when no process of it is left in /proc (polled every millisecond), a
//! contender's acquisition when its first line arrives.

use dlock_testkit::etcd as etcd_cluster;
// Shared with the core's fault tests; this binary uses a part.
use dlock_testkit::proxy;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use etcd_cluster::Cluster;
use proxy::{Mode, Proxy};

const BIN: &str = env!("CARGO_BIN_EXE_dlock");

/// The holder's short timing: a cut fences within about 2.5 s, and the
/// server expires the lease a 1 s margin after the local deadline.
const FAST: &[&str] = &[
    "--ttl",
    "3s",
    "--keepalive-interval",
    "1s",
    "--keepalive-timeout",
    "500ms",
    "--retry-interval",
    "200ms",
    "--margin",
    "1s",
    "--grace",
    "500ms",
];

/// A blip's timing: a TTL of 5 s leaves about 3 s after a cut before the
/// deadline, the drain comes within 1.3 s.
const BLIP: &[&str] = &[
    "--ttl",
    "5s",
    "--keepalive-interval",
    "1s",
    "--keepalive-timeout",
    "300ms",
    "--retry-interval",
    "200ms",
    "--margin",
    "1s",
];

fn runs() -> usize {
    etcd_cluster::fault_runs()
}

fn unique(what: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "cli-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A line of a child's output and when it arrived.
type Line = (Instant, String);

/// A running process with its output read line by line, killed (with its
/// process group, if known) when dropped.
struct Proc {
    what: String,
    child: Child,
    out: Receiver<Line>,
    err: Receiver<Line>,
    seen_out: Vec<String>,
    seen_err: Vec<String>,
    group: Option<i32>,
}

fn lines(r: impl std::io::Read + Send + 'static, echo: Option<String>) -> Receiver<Line> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for l in BufReader::new(r).lines() {
            let Ok(l) = l else { break };
            if let Some(label) = &echo {
                eprintln!("[{label}] {l}");
            }
            if tx.send((Instant::now(), l)).is_err() {
                break;
            }
        }
    });
    rx
}

impl Proc {
    fn spawn(what: &str, cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let out = lines(child.stdout.take().unwrap(), None);
        let err = lines(child.stderr.take().unwrap(), Some(what.to_owned()));
        Proc {
            what: what.to_owned(),
            child,
            out,
            err,
            seen_out: Vec::new(),
            seen_err: Vec::new(),
            group: None,
        }
    }

    fn dlock(what: &str, endpoints: &str, args: &[&str]) -> Proc {
        Proc::spawn(
            what,
            Command::new(BIN)
                .env("DLOCK_ENDPOINTS", endpoints)
                .arg("run")
                .args(args),
        )
    }

    /// The first stdout line matching `f`, waiting at most `limit`.
    fn out_line(&mut self, limit: Duration, f: impl Fn(&str) -> bool) -> Line {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok((t, l)) => {
                    self.seen_out.push(l.clone());
                    if f(&l) {
                        return (t, l);
                    }
                }
                Err(_) => panic!(
                    "{}: no such stdout line within {limit:?}; stdout {:?}, stderr {:?}",
                    self.what, self.seen_out, self.seen_err
                ),
            }
        }
    }

    /// The first stderr line containing `needle`, waiting at most `limit`.
    fn err_line(&mut self, limit: Duration, needle: &str) -> Line {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok((t, l)) => {
                    self.seen_err.push(l.clone());
                    if l.contains(needle) {
                        return (t, l);
                    }
                }
                Err(_) => panic!(
                    "{}: no stderr line with {needle:?} within {limit:?}; stderr {:?}",
                    self.what, self.seen_err
                ),
            }
        }
    }

    /// The stderr lines so far and any still buffered.
    fn stderr_now(&mut self) -> Vec<String> {
        while let Ok((_, l)) = self.err.try_recv() {
            self.seen_err.push(l);
        }
        self.seen_err.clone()
    }

    /// Waits for the exit (at most `limit`); the exit code.
    fn exit(&mut self, limit: Duration) -> i32 {
        let end = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                use std::os::unix::process::ExitStatusExt;
                return s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0));
            }
            if Instant::now() >= end {
                let err = self.stderr_now();
                panic!(
                    "{}: still running after {limit:?}; stderr {err:?}",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(g) = self.group {
            // SAFETY: plain syscall.
            unsafe { libc::kill(-g, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// (pid, state) of every live process of group `pgid` (zombies left out).
fn group(pgid: i32) -> Vec<(i32, char)> {
    let mut found = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut f = rest.split(' ');
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        let pgrp = f.nth(1).and_then(|s| s.parse::<i32>().ok());
        if pgrp == Some(pgid) && state != 'Z' && state != 'X' {
            found.push((pid, state));
        }
    }
    found
}

/// When the group `pgid` was first seen without a live process (polled
/// every millisecond: a measurement, not a synchronisation).
fn group_gone(pgid: i32, limit: Duration) -> Instant {
    let end = Instant::now() + limit;
    loop {
        if group(pgid).is_empty() {
            return Instant::now();
        }
        assert!(
            Instant::now() < end,
            "group {pgid} still alive after {limit:?}: {:?}",
            group(pgid)
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// When none of `pids` was left alive (zombies count as dead), polled
/// every millisecond.
fn pids_gone(pids: &[i32], limit: Duration) -> Instant {
    let alive = |p: &i32| {
        std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, r)| !r.starts_with('Z') && !r.starts_with('X'))
        })
    };
    let end = Instant::now() + limit;
    loop {
        if !pids.iter().any(alive) {
            return Instant::now();
        }
        assert!(Instant::now() < end, "{pids:?} still alive after {limit:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the group has at least `n` live processes.
fn group_has(pgid: i32, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    while group(pgid).len() < n {
        assert!(
            Instant::now() < end,
            "group {pgid}: {:?}, expected {n} processes",
            group(pgid)
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The group id the child printed as `pgid=N` (its shell's `$$`).
fn pgid_of(p: &mut Proc) -> i32 {
    let (_, l) = p.out_line(Duration::from_secs(20), |l| l.starts_with("pgid="));
    let g = l["pgid=".len()..].parse().expect("pgid");
    p.group = Some(g);
    g
}

fn etcdctl_lock(c: &Cluster, member: usize, name: &str, cmd: &[&str]) -> Proc {
    Proc::spawn(
        "etcdctl lock",
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", c.members[member]))
            .arg("lock")
            .arg(name)
            .args(cmd),
    )
}

/// `dlock show NAME --json` against the members.
fn show(c: &Cluster, name: &str) -> (i32, serde_json::Value) {
    let out = dlock_cmd(c, &["show", "--json", name])
        .output()
        .expect("dlock show");
    let code = out.status.code().expect("exited");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dlock show: {e}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (code, v)
}

/// `dlock show` finds `name` not held (exit 1).
fn assert_free(c: &Cluster, name: &str) {
    let (code, v) = show(c, name);
    assert_eq!(
        (code, &v["held"]),
        (1, &serde_json::Value::Bool(false)),
        "{v}"
    );
}

/// The cluster (a missing one fails the test) and a fresh lock name.
fn setup(what: &str) -> (Cluster, String) {
    (etcd_cluster::cluster(), unique(what))
}

/// SIGTERM to dlock, forwarded: the command dies of it, so does dlock's
/// status (128 + 15).
fn terminate(p: &mut Proc) {
    p.signal(libc::SIGTERM);
    assert_eq!(p.exit(Duration::from_secs(10)), 128 + libc::SIGTERM);
}

/// `dlock run NAME -- sh -c SCRIPT` against the members.
fn run_sh(c: &Cluster, what: &str, name: &str, script: &str) -> Proc {
    Proc::dlock(
        what,
        &c.members.join(","),
        &[name, "--", "sh", "-c", script],
    )
}

/// `dlock ARGS` against the members.
fn dlock_cmd(c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("DLOCK_ENDPOINTS", c.members.join(",")).args(args);
    cmd
}

/// Waits until `dlock show` sees at least `n` waiters on `name`.
fn waiters_at_least(c: &Cluster, name: &str, n: usize) {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = show(c, name);
        if v["waiters"].as_array().map_or(0, Vec::len) >= n {
            return;
        }
        assert!(Instant::now() < end, "{name}: fewer than {n} waiters: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    if later >= earlier {
        ms(later - earlier)
    } else {
        -ms(earlier - later)
    }
}

/// The holder cut off (every byte held both ways): every process of its
/// group (grandchildren too) is gone before a contender through another
/// member acquires, in every run. The lock passes on at the server's
/// expiry of the lease, a margin after the local deadline.
#[test]
fn cut_off_group_is_gone_before_the_contender_acquires() {
    let c = etcd_cluster::cluster();
    fence_case(&c, "cut_off", Mode::Blackhole, true);
}

/// Replies lost (keepalives reach the server and keep the lease alive, no
/// reply comes back): the holder fences at its deadline all the same, and
/// the lock passes on through dlock's revoke, which the core sends only
/// once the permit ended, i.e. once the group is gone (or at the server's
/// expiry, when that revoke does not get through). A TERM-ignoring group
/// lives out its grace first.
#[test]
fn replies_lost_revoke_only_after_the_group_is_gone() {
    let c = etcd_cluster::cluster();
    // The lead is then the revoke's round trip (a few ms): too small to
    // assert from two threads' clock readings on a loaded machine; the
    // contender's own check (the group gone once it holds) is the rule.
    fence_case(&c, "replies_lost", Mode::DropReplies, false);
}

/// One fence case over `runs()` runs. Odd runs: the command ignores
/// SIGTERM, so SIGKILL after --grace ends it. The contender alternates
/// between `etcdctl lock` and `dlock run`; once it holds the lock its
/// command checks the old group is gone. `assert_lead`: also the group's
/// measured death before the contender's acquisition.
fn fence_case(c: &Cluster, case: &str, mode: Mode, assert_lead: bool) {
    let c = c.clone();
    let n = runs();
    let (mut leads, mut term_gone) = (Vec::new(), Vec::new());
    let mut failures = Vec::new();
    for run in 0..n {
        let name = unique("cut");
        // The holder reaches every member through a proxy of its own, all
        // switched to the fault together (as the core's fault tests do).
        let proxies: Vec<Proxy> = (0..c.members.len())
            .map(|i| Proxy::start(c.member_addr(i)))
            .collect();
        let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let ignores_term = run % 2 == 1;
        let script = if ignores_term {
            "trap '' TERM; echo pgid=$$; sleep 1000 & sleep 1000 & echo started; wait"
        } else {
            "echo pgid=$$; sleep 1000 & sleep 1000 & echo started; wait"
        };
        let mut args: Vec<&str> = FAST.to_vec();
        args.extend([name.as_str(), "--", "sh", "-c", script]);
        let mut holder = Proc::dlock("holder", &urls.join(","), &args);
        let pgid = pgid_of(&mut holder);
        holder.out_line(Duration::from_secs(5), |l| l == "started");
        group_has(pgid, 3);
        let pids: Vec<i32> = group(pgid).into_iter().map(|(p, _)| p).collect();
        // The contender's command checks, once it holds the lock, that no
        // process of the old group is left (zombies count: the holder reaps
        // them before its permit ends).
        let check = format!("kill -0 -{pgid} 2>/dev/null && echo alive || echo gone");
        let mut contender = if run % 4 < 2 {
            etcdctl_lock(&c, 1, &name, &["--", "sh", "-c", &check])
        } else {
            Proc::dlock(
                "contender",
                &c.members[2],
                &[&name, "--", "sh", "-c", &check],
            )
        };
        waiters_at_least(&c, &name, 1);

        for p in &proxies {
            p.set(mode);
        }
        let (t_term, _) = holder.err_line(Duration::from_secs(10), "SIGTERM to process group");
        let t_gone = pids_gone(&pids, Duration::from_secs(5));
        let (t_acq, line) = contender.out_line(Duration::from_secs(15), |_| true);
        if line != "gone" {
            failures.push(format!(
                "run {run}: the contender found the old group {line}"
            ));
        }
        let code = holder.exit(Duration::from_secs(10));
        let lead = signed_ms(t_acq, t_gone);
        let kill = ms(t_gone - t_term);
        eprintln!(
            "{case} run {run}: ignores TERM {ignores_term}: SIGTERM->gone {kill:.1} ms, gone->contender ({line}) {lead:.1} ms, holder exit {code}"
        );
        leads.push(lead);
        term_gone.push(kill);
        if assert_lead && lead <= 0.0 {
            failures.push(format!(
                "run {run}: the contender acquired {lead:.1} ms after the group's death"
            ));
        }
        if code != 124 {
            failures.push(format!(
                "run {run}: holder exit {code}, expected 124 (fenced)"
            ));
        }
        if ignores_term && kill < 400.0 {
            failures.push(format!("run {run}: a TERM-ignoring group gone {kill:.1} ms after SIGTERM, before the 500 ms grace"));
        }
        contender.signal(libc::SIGTERM);
        let _ = contender.exit(Duration::from_secs(10));
    }
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    println!(
        "CLI|{case}|{n} runs|smallest gone->contender {:.1} ms (largest {:.1})|SIGTERM->gone {:.1}..{:.1} ms (TERM ignored: SIGKILL after the 500 ms grace)",
        min(&leads),
        max(&leads),
        min(&term_gone),
        max(&term_gone)
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A blip shorter than the slack: with --on-drain=stop the group is frozen
/// at the drain and thawed at the resume, never fenced; then SIGTERM to
/// dlock is forwarded and the exit status is the child's (128 + 15).
#[test]
fn blip_freezes_and_thaws_the_group_and_keeps_it() {
    let (c, name) = setup("blip");
    let proxy = Proxy::start(c.member_addr(0));
    let mut args: Vec<&str> = BLIP.to_vec();
    args.extend([
        "--on-drain",
        "stop",
        name.as_str(),
        "--",
        "sh",
        "-c",
        "echo pgid=$$; sleep 1000 & sleep 1000 & echo started; wait",
    ]);
    let mut holder = Proc::dlock("holder", &proxy.url(), &args);
    let pgid = pgid_of(&mut holder);
    holder.out_line(Duration::from_secs(5), |l| l == "started");
    group_has(pgid, 3);
    let before = group(pgid);

    proxy.set(Mode::Blackhole);
    holder.err_line(Duration::from_secs(5), "SIGSTOP to process group");
    let end = Instant::now() + Duration::from_secs(2);
    while !group(pgid).iter().all(|&(_, s)| s == 'T') {
        assert!(Instant::now() < end, "not frozen: {:?}", group(pgid));
        std::thread::sleep(Duration::from_millis(2));
    }
    proxy.set(Mode::Pass);
    holder.err_line(Duration::from_secs(5), "SIGCONT to process group");
    let end = Instant::now() + Duration::from_secs(2);
    while group(pgid).iter().any(|&(_, s)| s == 'T') {
        assert!(Instant::now() < end, "not thawed: {:?}", group(pgid));
        std::thread::sleep(Duration::from_millis(2));
    }
    let pids = |g: Vec<(i32, char)>| g.into_iter().map(|(p, _)| p).collect::<Vec<_>>();
    assert_eq!(pids(group(pgid)), pids(before), "the same processes run on");
    assert!(
        !holder.stderr_now().iter().any(|l| l.contains("fenced")),
        "fenced by a blip: {:?}",
        holder.seen_err
    );

    terminate(&mut holder);
    group_gone(pgid, Duration::from_secs(2));
    assert_free(&c, &name);
}

/// A blip with --on-drain=USR1: the group gets the signal once at the
/// drain, the lock is kept (no fence) and the command goes on.
#[test]
fn blip_with_a_drain_signal_keeps_the_lock() {
    let (c, name) = setup("blip-usr1");
    let proxy = Proxy::start(c.member_addr(0));
    let mut args: Vec<&str> = BLIP.to_vec();
    args.extend(["--on-drain", "USR1", name.as_str(), "--", "sh", "-c"]);
    args.push("trap 'echo usr1' USR1; echo pgid=$$; while :; do sleep 0.05; done");
    let mut holder = Proc::dlock("holder", &proxy.url(), &args);
    let pgid = pgid_of(&mut holder);
    let (_, v) = show(&c, &name);
    let token = v["holder"]["token"].as_u64();

    proxy.set(Mode::Blackhole);
    holder.err_line(Duration::from_secs(5), "signal 10 to process group");
    holder.out_line(Duration::from_secs(5), |l| l == "usr1");
    proxy.set(Mode::Pass);
    holder.err_line(Duration::from_secs(5), "resumed");
    let (_, v) = show(&c, &name);
    assert_eq!(
        v["holder"]["token"].as_u64(),
        token,
        "the same acquisition: {v}"
    );
    assert!(!group(pgid).is_empty());
    assert!(
        !holder.stderr_now().iter().any(|l| l.contains("fenced")),
        "fenced by a blip: {:?}",
        holder.seen_err
    );
    terminate(&mut holder);
    assert_free(&c, &name);
}

/// Signals to dlock reach the group; the exit status is the child's; the
/// lock is free at once after.
#[test]
fn signals_are_forwarded_and_the_exit_status_is_the_childs() {
    let c = etcd_cluster::cluster();
    let eps = c.members.join(",");
    let name = unique("sig");
    for (sig, script, want) in [
        (
            libc::SIGTERM,
            "trap 'exit 42' TERM; echo pgid=$$; while :; do sleep 0.05; done",
            42,
        ),
        (
            libc::SIGINT,
            "echo pgid=$$; exec sleep 1000",
            128 + libc::SIGINT,
        ),
        (
            libc::SIGHUP,
            "trap 'exit 7' HUP; echo pgid=$$; while :; do sleep 0.05; done",
            7,
        ),
    ] {
        let mut p = Proc::dlock("sig", &eps, &[&name, "--", "sh", "-c", script]);
        let pgid = pgid_of(&mut p);
        p.signal(sig);
        assert_eq!(p.exit(Duration::from_secs(10)), want, "signal {sig}");
        assert!(group(pgid).is_empty(), "group left: {:?}", group(pgid));
        let free = dlock_cmd(&c, &["run", "--try", &name, "--", "true"])
            .status()
            .expect("dlock run --try");
        assert_eq!(free.code(), Some(0), "the lock is free after signal {sig}");
    }
    for (script, want) in [
        ("exit 3", 3),
        ("kill -USR1 $$", 128 + libc::SIGUSR1),
        ("true", 0),
    ] {
        let s = dlock_cmd(&c, &["run", &name, "--", "sh", "-c", script])
            .status()
            .expect("dlock run");
        assert_eq!(s.code(), Some(want), "{script}");
    }
}

/// SIGUSR1 is forwarded without ending the run; SIGTSTP (^Z) stops the
/// group, not dlock, which keeps the lock; SIGTERM then ends both.
#[test]
fn user_signals_and_sigtstp_reach_the_group_only() {
    let (c, name) = setup("tstp");
    let mut p = run_sh(
        &c,
        "tstp",
        &name,
        "trap 'echo usr1' USR1; echo pgid=$$; while :; do sleep 1000 & wait $!; done",
    );
    let pgid = pgid_of(&mut p);
    p.signal(libc::SIGUSR1);
    p.out_line(Duration::from_secs(5), |l| l == "usr1");
    p.signal(libc::SIGTSTP);
    p.err_line(Duration::from_secs(5), "stopped (the lock is kept)");
    let end = Instant::now() + Duration::from_secs(5);
    // Stopped, or waiting uninterruptibly on a stopped child (a vfork
    // parent): none running or sleeping.
    while group(pgid).iter().any(|&(_, s)| s != 'T' && s != 'D') {
        assert!(Instant::now() < end, "not stopped: {:?}", group(pgid));
        std::thread::sleep(Duration::from_millis(2));
    }
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", p.child.id())).expect("dlock stat");
    assert!(
        !stat.rsplit_once(") ").unwrap().1.starts_with('T'),
        "dlock stopped: {stat}"
    );
    let (code, _) = show(&c, &name);
    assert_eq!(code, 0, "the lock is kept while the group is stopped");
    terminate(&mut p);
    assert_free(&c, &name);
}

/// On a terminal (a pty from `script`), CMD's group takes the terminal
/// and can read it; dlock takes it back after. Without that hand-over a
/// read would stop CMD (SIGTTIN) for good.
#[test]
fn cmd_reads_the_terminal_dlock_runs_on() {
    let (c, name) = setup("tty");
    let inner = format!(
        "{BIN} run {name} -- sh -c 'read a; echo got $a; exit 4'; echo dlock=$?; \
         [ \"$(ps -o tpgid= -p $$)\" -eq \"$(ps -o pgid= -p $$)\" ] && echo terminal-back"
    );
    let mut child = Command::new("script")
        .env("DLOCK_ENDPOINTS", c.members.join(","))
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    let out = lines(child.stdout.take().unwrap(), None);
    let mut stdin = child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"hello\n").expect("type");
    let mut seen = Vec::new();
    let end = Instant::now() + Duration::from_secs(20);
    while !seen.iter().any(|l: &String| l.trim() == "terminal-back") {
        let left = end.saturating_duration_since(Instant::now());
        match out.recv_timeout(left) {
            Ok((_, l)) => seen.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("no terminal-back within 20 s: {seen:?}");
            }
        }
    }
    drop(stdin);
    let _ = child.wait();
    let seen: Vec<&str> = seen.iter().map(|l| l.trim()).collect();
    assert!(seen.contains(&"got hello"), "{seen:?}");
    assert!(seen.contains(&"dlock=4"), "{seen:?}");
}

/// examples/cli/guarded-put.sh: a put under the run's token commits; the
/// same token after the run (lock released) is refused by etcd.
#[test]
fn the_guarded_put_example_writes_only_under_a_held_token() {
    let (c, name) = setup("guarded");
    let key = format!("{name}-data");
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/cli/guarded-put.sh"
    );
    let script = format!("{example} {key} v1 && echo token $ETCD_LOCK_KEY $ETCD_LOCK_REV");
    let out = dlock_cmd(&c, &["run", &name, "--", "sh", "-c", &script])
        .output()
        .expect("dlock run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("token "))
        .expect("token line");
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(c.etcdctl(&["get", &key, "--print-value-only"]).trim(), "v1");

    let stale = Command::new(example)
        .env("DLOCK_ENDPOINTS", c.members.join(","))
        .env("ETCD_LOCK_KEY", f[1])
        .env("ETCD_LOCK_REV", f[2])
        .args([key.as_str(), "v2"])
        .output()
        .expect("guarded-put.sh");
    assert_eq!(
        stale.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&stale.stdout)
    );
    assert_eq!(c.etcdctl(&["get", &key, "--print-value-only"]).trim(), "v1");
}

/// The TLS member (client certificate and user auth): `dlock run` from
/// flags, `dlock show` from the `DLOCK_*` variables, the same holder.
#[test]
fn tls_and_auth_from_flags_and_from_the_environment() {
    let (c, name) = setup("tls");
    let (ca, cert, key) = (
        c.ca.display().to_string(),
        c.cert.display().to_string(),
        c.key.display().to_string(),
    );
    let mut holder = Proc::spawn(
        "tls",
        Command::new(BIN)
            .env_remove("DLOCK_ENDPOINTS")
            .env("DLOCK_PASSWORD", &c.password)
            .args(["run", "--endpoints", &c.tls_endpoint, "--ca-file", &ca])
            .args(["--cert-file", &cert, "--key-file", &key, "--user", &c.user])
            .args([
                &name,
                "--",
                "sh",
                "-c",
                "echo pgid=$$ key=$ETCD_LOCK_KEY; exec sleep 1000",
            ]),
    );
    let (_, line) = holder.out_line(Duration::from_secs(20), |l| l.starts_with("pgid="));
    let held_key = line.split(" key=").nth(1).expect("key").to_owned();
    holder.group = line["pgid=".len()..]
        .split(' ')
        .next()
        .and_then(|g| g.parse().ok());
    let out = Command::new(BIN)
        .env("DLOCK_ENDPOINTS", &c.tls_endpoint)
        .env("DLOCK_CA_FILE", &ca)
        .env("DLOCK_CERT_FILE", &cert)
        .env("DLOCK_KEY_FILE", &key)
        .env("DLOCK_USER", &c.user)
        .env("DLOCK_PASSWORD", &c.password)
        .args(["show", "--json", &name])
        .output()
        .expect("dlock show");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(v["holder"]["key"].as_str(), Some(held_key.as_str()), "{v}");
    terminate(&mut holder);
}

/// An operator deletes the lock key: the lock is free at once, so the
/// fence (lock_lost) stops the group at once, without waiting for a
/// deadline; exit 124.
#[test]
fn a_deleted_key_stops_the_group_at_once() {
    let (c, name) = setup("del");
    let mut holder = run_sh(
        &c,
        "del",
        &name,
        "echo pgid=$$ key=$ETCD_LOCK_KEY; exec sleep 1000",
    );
    let (_, line) = holder.out_line(Duration::from_secs(20), |l| l.starts_with("pgid="));
    let key = line.split(" key=").nth(1).expect("key").to_owned();
    let pgid: i32 = line["pgid=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    holder.group = Some(pgid);
    let t_del = Instant::now();
    c.etcdctl(&["del", &key]);
    let t_gone = pids_gone(&[pgid], Duration::from_secs(5));
    assert!(
        t_gone - t_del < Duration::from_secs(2),
        "gone {:?} after the delete",
        t_gone - t_del
    );
    assert_eq!(holder.exit(Duration::from_secs(10)), 124);
}

/// dlock killed with SIGKILL cannot stop anything at a fence: the
/// command's first process is killed with it (parent-death signal).
#[test]
fn the_command_dies_with_a_killed_dlock() {
    let (c, name) = setup("kill9");
    let mut p = run_sh(&c, "kill9", &name, "echo pgid=$$; exec sleep 1000");
    let pgid = pgid_of(&mut p);
    p.signal(libc::SIGKILL);
    assert_eq!(p.exit(Duration::from_secs(5)), 128 + libc::SIGKILL);
    pids_gone(&[pgid], Duration::from_secs(5));
}

/// dlock's stderr closed (`dlock run … 2>&1 | head -1`): its reports fail
/// to write, and it still stops the group at the fence.
#[test]
fn a_closed_stderr_does_not_stop_the_fence() {
    let (c, name) = setup("stderr");
    let proxy = Proxy::start(c.member_addr(0));
    let mut args: Vec<&str> = vec!["run"];
    args.extend(FAST);
    args.extend([
        name.as_str(),
        "--",
        "sh",
        "-c",
        "echo pgid=$$; exec sleep 1000",
    ]);
    let mut child = Command::new(BIN)
        .env("DLOCK_ENDPOINTS", proxy.url())
        .args(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock run");
    drop(child.stderr.take());
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("pgid line");
    let pgid: i32 = line.trim()["pgid=".len()..].parse().expect("pgid");
    proxy.set(Mode::Blackhole);
    pids_gone(&[pgid], Duration::from_secs(10));
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(124), "{status:?}");
}

/// The command exits but leaves a background process in its group: that
/// one is stopped too before the lock is released.
#[test]
fn leftovers_of_the_group_are_stopped_before_the_release() {
    let (c, name) = setup("left");
    let mut p = run_sh(&c, "left", &name, "echo pgid=$$; sleep 1000 & exit 5");
    let pgid = pgid_of(&mut p);
    p.err_line(Duration::from_secs(10), "stopping what is left");
    assert_eq!(p.exit(Duration::from_secs(10)), 5);
    assert!(group(pgid).is_empty(), "left running: {:?}", group(pgid));
}

/// --restart: after a fence the group is gone, the lock is acquired again
/// with a higher token and the command starts again; --restart-limit 1
/// ends the second fence with exit 124.
#[test]
fn restart_gives_the_new_child_a_higher_token() {
    let (c, name) = setup("restart");
    let proxy = Proxy::start(c.member_addr(0));
    let mut args: Vec<&str> = FAST.to_vec();
    args.extend([
        "--restart",
        "--restart-limit",
        "1",
        name.as_str(),
        "--",
        "sh",
        "-c",
    ]);
    args.push("echo token=$DLOCK_TOKEN pgid=$$; exec sleep 1000");
    let mut holder = Proc::dlock("restart", &proxy.url(), &args);
    let token = |l: &str| -> (u64, i32) {
        let mut f = l.split(' ');
        let t = f.next().unwrap()["token=".len()..].parse().unwrap();
        let g = f.next().unwrap()["pgid=".len()..].parse().unwrap();
        (t, g)
    };
    let (_, l) = holder.out_line(Duration::from_secs(20), |l| l.starts_with("token="));
    let (t1, g1) = token(&l);
    holder.group = Some(g1);

    proxy.set(Mode::Blackhole);
    holder.err_line(Duration::from_secs(10), "is gone; the lock may be revoked");
    assert!(group(g1).is_empty());
    proxy.set(Mode::Pass);
    let (_, l) = holder.out_line(Duration::from_secs(20), |l| l.starts_with("token="));
    let (t2, g2) = token(&l);
    holder.group = Some(g2);
    assert!(t2 > t1, "token {t2} after {t1}");
    let (_, v) = show(&c, &name);
    assert_eq!(v["holder"]["token"].as_u64(), Some(t2), "{v}");

    proxy.set(Mode::Blackhole);
    holder.err_line(Duration::from_secs(10), "not restarting");
    assert_eq!(holder.exit(Duration::from_secs(10)), 124);
    assert!(group(g2).is_empty());
}

/// `dlock run` and `etcdctl lock` exclude each other both ways; the
/// child's ETCD_LOCK_KEY / ETCD_LOCK_REV / DLOCK_TOKEN are the key and
/// token `dlock show` reports; `--try` is 120, `--timeout` 121.
#[test]
fn etcdctl_lock_and_dlock_run_exclude_each_other() {
    let (c, name) = setup("interop");
    let run = |args: &[&str]| -> i32 {
        dlock_cmd(&c, &[&["run"], args].concat())
            .status()
            .expect("dlock run")
            .code()
            .expect("exited")
    };

    // etcdctl holds: dlock waits.
    let mut ctl = etcdctl_lock(&c, 1, &name, &[]);
    let (_, key) = ctl.out_line(Duration::from_secs(10), |l| {
        l.starts_with(&format!("{name}/"))
    });
    assert_eq!(run(&["--try", &name, "--", "true"]), 120);
    assert_eq!(run(&["--timeout", "500ms", &name, "--", "true"]), 121);
    let (code, v) = show(&c, &name);
    assert_eq!(
        (code, v["holder"]["key"].as_str()),
        (0, Some(key.as_str())),
        "{v}"
    );
    let mut waiting = run_sh(&c, "waiting", &name, "echo acquired");
    waiters_at_least(&c, &name, 1);
    let t_released = Instant::now();
    ctl.signal(libc::SIGTERM);
    ctl.exit(Duration::from_secs(10));
    let (t_acq, _) = waiting.out_line(Duration::from_secs(10), |l| l == "acquired");
    assert!(t_acq > t_released, "dlock acquired while etcdctl held");
    assert_eq!(waiting.exit(Duration::from_secs(10)), 0);

    // dlock holds: etcdctl waits until dlock is gone.
    let mut holder = run_sh(
        &c,
        "holder",
        &name,
        "echo pgid=$$; echo env $ETCD_LOCK_KEY $ETCD_LOCK_REV $DLOCK_TOKEN $DLOCK_LOCK; exec sleep 1000",
    );
    pgid_of(&mut holder);
    let (_, env) = holder.out_line(Duration::from_secs(10), |l| l.starts_with("env "));
    let f: Vec<&str> = env.split(' ').collect();
    assert_eq!(f.len(), 5, "{env}");
    assert_eq!(f[2], f[3], "ETCD_LOCK_REV is the token");
    assert_eq!(f[4], name);
    let mut ctl = etcdctl_lock(&c, 2, &name, &["--", "sh", "-c", "echo got $ETCD_LOCK_KEY"]);
    waiters_at_least(&c, &name, 1);
    let (code, v) = show(&c, &name);
    assert_eq!(code, 0);
    assert_eq!(v["holder"]["key"].as_str(), Some(f[1]), "{v}");
    assert_eq!(
        v["holder"]["token"]
            .as_u64()
            .map(|t| t.to_string())
            .as_deref(),
        Some(f[2]),
        "{v}"
    );
    assert!(v["holder"]["ttl_left_s"].as_i64() > Some(0), "{v}");
    // Nothing can release the lock before this signal.
    let t_released = Instant::now();
    terminate(&mut holder);
    let (t_got, got) = ctl.out_line(Duration::from_secs(10), |l| l.starts_with("got "));
    assert!(t_got > t_released, "etcdctl acquired while dlock held");
    assert!(got.starts_with(&format!("got {name}/")), "{got}");
    assert_eq!(ctl.exit(Duration::from_secs(10)), 0);
    assert_free(&c, &name);
}

/// Bad input on a live cluster: a command not found is 127 with the lock
/// free at once; an empty name is the core's invalid_argument.
#[test]
fn bad_input_leaves_no_lock_held() {
    let (c, name) = setup("bad");
    let out = dlock_cmd(&c, &["run", &name, "--", "/nonexistent/command"])
        .output()
        .expect("dlock run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert_free(&c, &name);

    let out = dlock_cmd(&c, &["run", "", "--", "true"])
        .output()
        .expect("dlock run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(123), "{stderr}");
    assert!(stderr.starts_with("dlock: invalid_argument:"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// `dlock list PREFIX`: the held locks under it, with their waiters.
#[test]
fn list_shows_held_locks_under_a_prefix() {
    let c = etcd_cluster::cluster();
    let eps = c.members.join(",");
    let prefix = unique("list");
    let a = format!("{prefix}/a");
    let mut holder = run_sh(&c, "list", &a, "echo pgid=$$; exec sleep 1000");
    pgid_of(&mut holder);
    let mut waiter = Proc::dlock("list-waiter", &eps, &[&a, "--", "true"]);
    waiters_at_least(&c, &a, 1);
    let out = dlock_cmd(&c, &["list", "--json", &prefix])
        .output()
        .expect("dlock list");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let l = v.as_array().expect("array");
    assert_eq!(l.len(), 1, "{v}");
    assert_eq!(l[0]["name"].as_str(), Some(a.as_str()), "{v}");
    assert_eq!(l[0]["waiters"].as_u64(), Some(1), "{v}");
    holder.signal(libc::SIGTERM);
    holder.exit(Duration::from_secs(10));
    assert_eq!(waiter.exit(Duration::from_secs(10)), 0);
}

/// The case, as a new user types it: the settings left out follow
/// the given ones (design §14), so the command runs under the lock.
#[test]
fn a_ttl_and_an_interval_alone_are_enough() {
    let (c, name) = setup("derived");
    let out = dlock_cmd(
        &c,
        &[
            "run",
            "--ttl",
            "6s",
            "--keepalive-interval",
            "2s",
            &name,
            "--",
            "sh",
            "-c",
            "echo token=$DLOCK_TOKEN",
        ],
    )
    .output()
    .expect("dlock run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("token="),
        "{stderr}"
    );
    assert_free(&c, &name);
}

/// Exit while holding: `dlock run` whose command ends (as `true` does) or
/// which gets SIGTERM, a contender waiting: the core's shutdown on dlock's
/// way out deletes the key, so the contender acquires within one keepalive
/// timeout (FAST: 500 ms, + 500 ms of slack for a loaded machine) of the
/// cause, not at the lease's expiry (TTL 3 s). Prints `EXIT|cli-<case>|<ms>`
/// (from the test's own action: the command told to end, or SIGTERM sent).
#[test]
fn exit_while_holding_lets_the_contender_in_at_once() {
    let c = etcd_cluster::cluster();
    let eps = c.members.join(",");
    for (case, want) in [("end", 0), ("sigterm", 128 + libc::SIGTERM)] {
        let name = unique(&format!("exit-{case}"));
        let flag = std::env::temp_dir().join(format!("{name}.go"));
        let _ = std::fs::remove_file(&flag);
        let script = format!(
            "echo pgid=$$; while [ ! -e '{}' ]; do sleep 0.01; done",
            flag.display()
        );
        let mut args: Vec<&str> = FAST.to_vec();
        args.extend([name.as_str(), "--", "sh", "-c", &script]);
        let mut holder = Proc::dlock("exit holder", &eps, &args);
        pgid_of(&mut holder);
        let mut contender = Proc::dlock("exit contender", &eps, &[&name, "--", "echo", "acquired"]);
        waiters_at_least(&c, &name, 1);
        let cause = Instant::now();
        if case == "end" {
            std::fs::write(&flag, b"").expect("the flag file");
        } else {
            holder.signal(libc::SIGTERM);
        }
        let (acquired, _) = contender.out_line(Duration::from_secs(10), |l| l == "acquired");
        let took = ms(acquired - cause);
        println!("EXIT|cli-{case}|{took:.1}");
        assert_eq!(holder.exit(Duration::from_secs(10)), want, "{case}");
        assert_eq!(contender.exit(Duration::from_secs(10)), 0);
        let _ = std::fs::remove_file(&flag);
        assert!(
            took < 1000.0,
            "{case}: the contender acquired {took} ms after the holder's end"
        );
    }
}

/// The value of the sample `series` (name and labels as written) in the
/// Prometheus text file at `path`, if it is there.
fn sample(path: &std::path::Path, series: &str) -> Option<f64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until the sample `series` in `path` is at least `min`.
fn sample_reaches(path: &std::path::Path, series: &str, min: f64, limit: Duration) {
    let end = Instant::now() + limit;
    while sample(path, series).is_none_or(|v| v < min) {
        assert!(
            Instant::now() < end,
            "{series} not >= {min} within {limit:?}:\n{}",
            std::fs::read_to_string(path).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Metrics (issue 22) through `dlock run --metrics-textfile`, on the real
/// cluster behind a fault proxy: a blip moves the drains and resumes, a cut
/// moves `dlock_fences_total{reason="deadline"}` and fills the fence
/// lateness, an operator's `etcdctl del` shows `reason="lock_lost"`; and
/// `dlock show --metrics` names the holder's token.
#[test]
fn the_metrics_textfile_follows_blips_cuts_and_deletes() {
    let (c, name) = setup("metrics");
    let proxy = Proxy::start(c.member_addr(0));
    let dir = std::env::temp_dir().join(unique("metrics-dir"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dlock.prom");
    let path_s = path.to_str().unwrap().to_owned();
    let mut args: Vec<&str> = BLIP.to_vec();
    args.extend([
        "--restart",
        "--metrics-textfile",
        &path_s,
        "--metrics-interval",
        "100ms",
        name.as_str(),
        "--",
        "sleep",
        "1000",
    ]);
    let mut holder = Proc::dlock("holder", &proxy.url(), &args);
    let held = format!("dlock_lock_held{{lock=\"{name}\"}}");
    let limit = Duration::from_secs(10);
    sample_reaches(&path, &held, 1.0, limit);
    let (_, shown) = show(&c, &name);
    let token = shown["holder"]["token"].as_i64().expect("a holder");
    let out = dlock_cmd(&c, &["show", "--metrics", &name])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines()
            .any(|l| l == format!("dlock_lock_token{{lock=\"{name}\"}} {token}")),
        "{text}"
    );
    // etcd lists the waiting keys: their count is known (none here).
    assert!(
        text.lines()
            .any(|l| l == format!("dlock_lock_waiters{{lock=\"{name}\"}} 0")),
        "{text}"
    );
    assert_eq!(
        sample(&path, &format!("dlock_lock_token{{lock=\"{name}\"}}")),
        Some(token as f64)
    );

    // A blip: drained, then resumed.
    proxy.set(Mode::Blackhole);
    sample_reaches(&path, "dlock_drains_total", 1.0, limit);
    proxy.set(Mode::Pass);
    sample_reaches(&path, "dlock_resumes_total", 1.0, limit);
    assert_eq!(
        sample(&path, "dlock_fences_total{reason=\"deadline\"}"),
        Some(0.0)
    );

    // A cut: the deadline fences, and its lateness is observed.
    proxy.set(Mode::Blackhole);
    sample_reaches(&path, "dlock_fences_total{reason=\"deadline\"}", 1.0, limit);
    sample_reaches(&path, "dlock_fence_lateness_seconds_count", 1.0, limit);
    proxy.set(Mode::Pass);
    sample_reaches(
        &path,
        "dlock_acquisitions_total",
        2.0,
        Duration::from_secs(20),
    );

    // An operator deletes the key: a fence for the lost lock.
    let (_, shown) = show(&c, &name);
    let key = shown["holder"]["key"]
        .as_str()
        .expect("a holder")
        .to_owned();
    c.etcdctl(&["del", &key]);
    sample_reaches(
        &path,
        "dlock_fences_total{reason=\"lock_lost\"}",
        1.0,
        limit,
    );

    terminate(&mut holder);
    // The last rewrite comes after the shutdown: nothing held.
    assert_eq!(sample(&path, &held), Some(0.0));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Holder identity (issue 31): `dlock run --description` in one process,
/// `dlock show` and `dlock list` in others name it (host, pid, face,
/// description; text and JSON); an `etcdctl lock` holder has none; a bad
/// description is the core's `invalid_option` (exit 123) before CMD runs.
#[test]
fn show_and_list_name_the_holder() {
    let c = etcd_cluster::cluster();
    let eps = c.members.join(",");
    let prefix = unique("identity");
    let a = format!("{prefix}/a");
    let mut holder = Proc::dlock(
        "identity",
        &eps,
        &[
            "--description",
            "nightly backup",
            &a,
            "--",
            "sh",
            "-c",
            "echo pgid=$$; exec sleep 1000",
        ],
    );
    pgid_of(&mut holder);
    let (code, v) = show(&c, &a);
    assert_eq!(code, 0, "{v}");
    let id = &v["holder"]["identity"];
    assert_eq!(id["description"], "nightly backup", "{v}");
    assert_eq!(
        id["pid"].as_u64(),
        Some(u64::from(holder.child.id())),
        "{v}"
    );
    assert_eq!(
        (id["face"].as_str(), id["version"].as_str()),
        (Some("cli"), Some(env!("CARGO_PKG_VERSION")))
    );
    assert!(
        id["host"].as_str().is_some_and(|h| !h.is_empty()) && id["started"].is_u64(),
        "{v}"
    );
    let text = dlock_cmd(&c, &["show", &a]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let by = text
        .lines()
        .find(|l| l.starts_with("by "))
        .expect("a `by` line");
    assert!(
        by.contains(&format!("pid {}", holder.child.id()))
            && by.contains("cli ")
            && by.ends_with("\"nightly backup\""),
        "{text}"
    );
    let out = dlock_cmd(&c, &["list", "--json", &prefix])
        .output()
        .unwrap();
    let l: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(l[0]["identity"]["description"], "nightly backup", "{l}");

    // An etcdctl holder: a lease, no identity.
    let b = format!("{prefix}/b");
    let mut ctl = etcdctl_lock(&c, 1, &b, &[]);
    ctl.out_line(Duration::from_secs(10), |l| l.starts_with(&format!("{b}/")));
    let (_, v) = show(&c, &b);
    assert!(v["holder"]["identity"].is_null(), "{v}");
    let text = dlock_cmd(&c, &["list", &prefix]).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("by none recorded"), "{text}");
    ctl.signal(libc::SIGTERM);
    holder.signal(libc::SIGTERM);
    holder.exit(Duration::from_secs(10));

    for bad in ["two\nlines", &"x".repeat(257)] {
        let out = dlock_cmd(&c, &["run", "--description", bad, &a, "--", "echo", "ran"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(123), "{err}");
        assert!(
            err.contains("invalid_option") && err.contains("description"),
            "{err}"
        );
        assert!(out.stdout.is_empty(), "CMD ran");
    }
}
