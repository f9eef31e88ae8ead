//! The two-stage rule under real faults: a holder on the real 3-member test
//! cluster (`scripts/test-etcd.sh`) goes through one fault proxy per member;
//! a contender, connected to the members directly, waits on the same lock.
//! Every case is repeated `DLOCK_FAULT_RUNS` times (default 3); every time
//! is read from dlock's clock (`dlock::clock::system_now`). Each case
//! prints one `FAULT|...` line of figures over its runs (the table of
//! `scripts/test-etcd.sh`) before it checks its rules, so a failing case
//! still shows what it measured, and the event log of a failing run.
//!
//! Settings: TTL 4 s, keepalive every 1 s, keepalive timeout 0.5 s, retry
//! every 0.25 s, margin 1 s.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use dlock::clock::system_now;
use dlock::{Client, Error, EtcdConfig, Instant, Lock, Options, Reason, State, StateChange, Token};

use dlock_testkit::TTL;
use dlock_testkit::faults::{self, Ev, Run, draining, fenced, ms, ms_of, random_phase};
use dlock_testkit::proxy;
use dlock_testkit::{INTERVAL, MARGIN, TIMEOUT};

use dlock_testkit::etcd as etcd_cluster;

use etcd_cluster::Cluster;
use proxy::{Mode, Proxy};

mod own_settings;

/// Scheduling slack of a timing bound: a late timer or callback thread on
/// a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(300);
/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(20);

fn runs() -> usize {
    etcd_cluster::fault_runs()
}

/// Cases that disturb the cluster itself (a member killed or paused) run
/// alone; the others share it and may run at the same time.
static CLUSTER: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    CLUSTER.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    CLUSTER.write().unwrap_or_else(|e| e.into_inner())
}

/// A lock name of this run only.
fn unique(case: &str, run: usize) -> String {
    format!(
        "dlock-fault/{case}-{}-{run}-{}",
        std::process::id(),
        system_now().as_nanos()
    )
}

/// The lock holder, behind one fault proxy per member.
struct Holder {
    proxies: Vec<Proxy>,
    lock: Lock,
    rx: Receiver<(Instant, Ev)>,
    log: Vec<(Instant, Ev)>,
    token: Token,
}

impl Holder {
    fn start(cluster: &Cluster, name: &str) -> Holder {
        Holder::start_on(cluster, name, dlock_testkit::backend_options(), None)
    }

    /// [`Holder::start`] on a client with `client` options; with `session`,
    /// the lock is on a session of its own with those options.
    fn start_on(
        cluster: &Cluster,
        name: &str,
        client: Options,
        session: Option<Options>,
    ) -> Holder {
        let proxies: Vec<Proxy> = (0..cluster.members.len())
            .map(|i| Proxy::start(cluster.member_addr(i)))
            .collect();
        let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let client = Client::etcd(EtcdConfig::new(urls), client).expect("holder connects");
        let lock = match session {
            Some(o) => client.session(o).expect("session").lock(name),
            None => client.lock(name),
        }
        .expect("lock handle");
        let rx = faults::record(&lock);
        let token = lock.acquire(EVENT).expect("holder acquires");
        Holder {
            proxies,
            lock,
            rx,
            log: Vec::new(),
            token,
        }
    }

    /// Sets every proxy of the holder to `mode`; returns the time just
    /// before the first was set.
    fn cut(&self, mode: Mode) -> Instant {
        let t = system_now();
        for p in &self.proxies {
            p.set(mode);
        }
        t
    }

    fn heal(&self) {
        for p in &self.proxies {
            p.set(Mode::Pass);
        }
    }

    /// Right after a keepalive is confirmed (the deadline moves).
    fn after_keepalive(&self) {
        let before = self.lock.deadline();
        let end = system_now() + EVENT;
        while self.lock.deadline() == before {
            assert!(system_now() < end, "no keepalive confirmed");
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Collects the callbacks' reports so far.
    fn collect(&mut self) {
        self.log.extend(self.rx.try_iter());
    }

    /// Waits up to `within` for a report matching `f`; returns its time.
    fn wait(&mut self, within: Duration, f: impl Fn(Instant, &Ev) -> bool) -> Option<Instant> {
        self.collect();
        if let Some((t, _)) = self.log.iter().find(|(t, e)| f(*t, e)) {
            return Some(*t);
        }
        let end = system_now() + within;
        loop {
            let left = end.saturating_since(system_now());
            let (t, e) = self.rx.recv_timeout(left).ok()?;
            self.log.push((t, e));
            if f(t, &e) {
                return Some(t);
            }
        }
    }

    /// The first report after `from` matching `f`.
    fn first(&mut self, from: Instant, f: impl Fn(&Ev) -> bool) -> Option<(Instant, Ev)> {
        self.collect();
        self.log.iter().copied().find(|(t, e)| *t >= from && f(e))
    }

    /// The log, times in ms from `origin`, for a failure message.
    fn story(&mut self, origin: Instant) -> String {
        self.collect();
        self.log
            .iter()
            .map(|(t, e)| format!("\n  {:+9.1} ms  {e:?}", ms(origin, *t)))
            .collect()
    }
}

impl Drop for Holder {
    /// Releases while the proxies still run, so the lease is revoked rather
    /// than left to expire.
    fn drop(&mut self) {
        for p in &self.proxies {
            p.set(Mode::Pass);
        }
        let _ = self.lock.release();
    }
}

/// A second client, connected to the members directly, waiting on the
/// same lock in a thread of its own; it holds the lock once acquired until
/// [`Contender::finish`].
struct Contender {
    acquired: Receiver<(Result<Token, Error>, Instant)>,
    release: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

impl Contender {
    /// Starts waiting (up to `within`) and returns once its lock key is
    /// queued behind the holder's in etcd.
    fn start(cluster: &Cluster, name: &str, within: Duration) -> Contender {
        let client = Client::etcd(
            EtcdConfig::new(cluster.members.clone()),
            dlock_testkit::backend_options(),
        )
        .expect("contender connects");
        let lock = client.lock(name).expect("lock handle");
        let (acq_tx, acquired) = mpsc::channel();
        let (release, rel_rx) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            let r = lock.acquire(within);
            let _ = acq_tx.send((r.clone(), system_now()));
            if r.is_ok() {
                let _ = rel_rx.recv();
                let _ = lock.release();
            }
        });
        let end = system_now() + EVENT;
        while waiters(cluster, name) < 2 {
            assert!(system_now() < end, "the contender never queued on {name}");
            thread::sleep(Duration::from_millis(20));
        }
        Contender {
            acquired,
            release,
            thread,
        }
    }

    /// The contender's acquisition (or its error) and when it returned.
    fn result(&self, within: Duration) -> Option<(Result<Token, Error>, Instant)> {
        self.acquired.recv_timeout(within).ok()
    }

    /// Releases the lock if held and ends the thread.
    fn finish(self) {
        drop(self.release);
        self.thread.join().expect("contender thread");
    }
}

/// The keys queued on `name` (etcd's Mutex keys `<name>/<lease hex>`).
fn waiters(cluster: &Cluster, name: &str) -> usize {
    cluster
        .etcdctl(&["get", "--prefix", "--keys-only", &format!("{name}/")])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// Runs `case` `runs()` times, prints its figures line, then fails with
/// every broken rule of every run.
fn repeat(case: &str, other: &str, run: impl FnMut(usize) -> Run) {
    faults::repeat("", case, runs(), other, run);
}

/// A cut that takes the lock away: the holder must drain within one
/// interval + timeout, call on_fence before the contender acquires, and
/// after the heal acquire again with a higher token.
fn cut_until_fenced(case: &'static str, mode: Mode) {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    repeat(case, "cut->fence", |run| {
        let name = unique(case, run);
        let mut h = Holder::start(&cluster, &name);
        let c = Contender::start(&cluster, &name, EVENT);
        thread::sleep(random_phase());
        let deadline = h.lock.deadline().expect("holding");
        let cut = h.cut(mode);
        let mut r = Run::default();
        let contender = c.result(EVENT);
        let t1 = h.token;
        // on_fence for the token held, no permit in flight (none was taken).
        let fence = h.wait(EVENT, |t, e| {
            t >= cut && matches!(e, Ev::Fence(f, 0) if *f == t1)
        });
        h.heal();
        let drain = h.first(cut, draining).map(|(t, _)| t);
        r.drain = drain.map(|d| ms(cut, d));
        r.other = fence.map(|f| ms(cut, f));
        match (fence, &contender) {
            (Some(f), Some((Ok(_), tc))) => r.lead = Some(ms(f, *tc)),
            _ => r.check(false, format!("fence {fence:?}, contender {contender:?}")),
        }
        r.check(
            r.lead.is_some_and(|l| l > 0.0),
            format!("on_fence did not lead the contender: {:?} ms", r.lead),
        );
        r.drained_then_fenced_on_time(fence, deadline, SLACK);
        // After the heal the holder acquires again, behind the contender.
        c.finish();
        let again = h.wait(EVENT, |_, e| matches!(e, Ev::Acquired(t) if *t > t1));
        r.check(
            again.is_some(),
            format!("no reacquisition above {t1} after the heal"),
        );
        if !r.broken.is_empty() {
            r.broken
                .push(format!("events (ms from the cut):{}", h.story(cut)));
        }
        r
    });
}

/// A fault the holder must ride out, observed for `window` from the cut:
/// no fence, still holding the same token, and the contender never
/// acquires. `fault` starts the fault and returns the cut time; `after`
/// undoes it once the window is over. With `expect_drain`, the holder must
/// also drain within interval + timeout of the cut and then resume.
fn survive(
    case: &'static str,
    window: Duration,
    expect_drain: bool,
    mut fault: impl FnMut(&Cluster, &mut Holder) -> Instant,
    mut after: impl FnMut(&mut Cluster, &mut Holder),
) {
    let mut cluster = etcd_cluster::cluster();
    let _cluster = exclusive_if(case);
    repeat(case, "", |run| {
        let name = unique(case, run);
        let mut h = Holder::start(&cluster, &name);
        // It gives up about when the window ends, so finish() is quick.
        let c = Contender::start(&cluster, &name, window + Duration::from_millis(500));
        let cut = fault(&cluster, &mut h);
        let mut r = Run::default();
        let left = (cut + window).saturating_since(system_now());
        let fence = h.wait(left, |t, e| t >= cut && fenced(e));
        after(&mut cluster, &mut h);
        let drain = h.first(cut, draining).map(|(t, _)| t);
        r.drain = drain.map(|d| ms(cut, d));
        r.check(
            fence.is_none(),
            format!("fenced {:?} ms after the cut", fence.map(|f| ms(cut, f))),
        );
        if expect_drain {
            r.check(
                r.drain
                    .is_some_and(|d| d <= ms_of(INTERVAL + TIMEOUT + SLACK)),
                format!(
                    "drain {:?} ms after the cut, bound {:?}",
                    r.drain,
                    INTERVAL + TIMEOUT + SLACK
                ),
            );
            let resumed = drain.and_then(|d| {
                h.first(
                    d,
                    |e| matches!(e, Ev::Change(c) if c.reason == Reason::Resumed),
                )
            });
            r.check(resumed.is_some(), "drained but never resumed");
        }
        r.check(
            h.lock.state() == State::Holding,
            format!("state {:?} after the fault", h.lock.state()),
        );
        r.check(
            h.lock.token() == Some(h.token),
            format!("token {:?}, was {}", h.lock.token(), h.token),
        );
        let contender = c.result(EVENT);
        r.check(
            !matches!(contender, Some((Ok(_), _))),
            format!("the contender acquired while the holder held: {contender:?}"),
        );
        c.finish();
        if !r.broken.is_empty() {
            r.broken
                .push(format!("events (ms from the cut):{}", h.story(cut)));
        }
        r
    });
}

/// Cases that kill or pause a member hold the cluster alone.
fn exclusive_if(case: &str) -> Result<RwLockWriteGuard<'static, ()>, RwLockReadGuard<'static, ()>> {
    if case.contains("member") || case.contains("leader") {
        Ok(exclusive())
    } else {
        Err(shared())
    }
}

// ---------------------------------------------------------------------------
// The cluster and the proxy with etcdctl.

#[test]
fn cluster_env_and_etcdctl() {
    let cluster = etcd_cluster::cluster();
    cluster.etcdctl(&["put", "dlock-test/smoke", "1"]);
    assert!(cluster.etcdctl(&["get", "dlock-test/smoke"]).contains('1'));
    cluster.etcdctl_tls(&["put", "dlock-test/smoke", "1"]);
    assert!(cluster.leader() < 3);
}

/// etcdctl through a proxy: served in Pass, cut off in Blackhole.
#[test]
fn etcdctl_through_the_proxy() {
    let cluster = etcd_cluster::cluster();
    let p = proxy::Proxy::start(cluster.member_addr(0));
    let ctl = |timeout: &str, args: &[&str]| {
        std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", p.url()))
            .args(["--dial-timeout=1s", &format!("--command-timeout={timeout}")])
            .args(args)
            .output()
            .expect("etcdctl")
    };
    assert!(
        ctl("3s", &["put", "dlock-test/proxy", "v"])
            .status
            .success()
    );
    p.set(proxy::Mode::Blackhole);
    let cut = ctl("500ms", &["get", "dlock-test/proxy"]);
    assert!(!cut.status.success(), "etcdctl got through a blackhole");
    p.set(proxy::Mode::Pass);
    let out = ctl("3s", &["get", "dlock-test/proxy"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains('v'));
}

// ---------------------------------------------------------------------------
// The fault cases.

/// Both ways silent: the holder drains within interval + timeout, fences
/// at its deadline, before the server lets the lease expire and gives the
/// lock to the contender; after the heal it acquires again, higher token.
#[test]
fn fault_blackhole() {
    cut_until_fenced("blackhole", Mode::Blackhole);
}

/// Issue 28: a session created with settings of its own is timed by them,
/// not by its client's. The client has TTL 10 s and a keepalive timeout of
/// 0.2 s (the rest derived); the holder's lock is on a session with the
/// fault settings (TTL 4 s, keepalive every 1 s, timeout 0.5 s). Cut right
/// after a confirmed keepalive (sent at `deadline − (TTL − margin)`): the
/// next one goes out an interval after that send and fails the session's
/// 0.5 s later, never the client's 0.2 s (a backend bounding keepalives by
/// the client's timeout drains 300 ms early); the fence comes at the
/// session's deadline (send + 4 s − 1 s), not the client's (+ 10 s − 1 s).
#[test]
fn fault_session_own_settings() {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let client = own_settings_client();
    repeat("session_own_settings", "cut->fence", |run| {
        let name = unique("own-settings", run);
        let mut h = Holder::start_on(
            &cluster,
            &name,
            client.clone(),
            Some(dlock_testkit::backend_options()),
        );
        h.after_keepalive();
        thread::sleep(Duration::from_millis(100));
        let deadline = h.lock.deadline().expect("holding");
        let cut = h.cut(Mode::Blackhole);
        let fence = h.wait(EVENT, |t, e| t >= cut && fenced(e));
        h.heal();
        let drain = h.first(cut, draining).map(|(t, _)| t);
        let j = own_settings::judge("etcd", run, SLACK, cut, deadline, drain, fence);
        let mut r = Run {
            drain: j.drain,
            other: j.fence,
            broken: j.broken,
            ..Run::default()
        };
        if !r.broken.is_empty() {
            r.broken
                .push(format!("events (ms from the cut):{}", h.story(cut)));
        }
        r
    });
}

/// The client of [`fault_session_own_settings`]: TTL 10 s, a keepalive
/// timeout below the session's, the rest derived.
fn own_settings_client() -> Options {
    let o = dlock::PartialOptions {
        ttl: Some(Duration::from_secs(10)),
        keepalive_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    };
    o.resolve().expect("valid client options")
}

/// Keepalives reach the server (which keeps the lease alive) but no reply
/// comes back: the holder cannot know, so it fences at its deadline all the
/// same; the lock moves only once it revokes its lease.
#[test]
fn fault_replies_lost() {
    cut_until_fenced("replies_lost", Mode::DropReplies);
}

/// Replies lost while a unit of work is in flight: etcd keeps renewing the
/// lease, so the lock passes on only through the fenced holder's revoke,
/// and that revoke waits for the last permit. The contender acquires after
/// the work ended (lead > 0 from the permit's end), never at the fence.
#[test]
fn fault_replies_lost_with_work_in_flight() {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let work_after_fence = Duration::from_millis(600);
    repeat(
        "replies_lost_work_in_flight",
        "work end->contender",
        |run| {
            let name = unique("lost-in-flight", run);
            let mut h = Holder::start(&cluster, &name);
            let c = Contender::start(&cluster, &name, EVENT);
            let permit = h.lock.permit_owned().expect("holding");
            let cut = h.cut(Mode::DropReplies);
            let mut r = Run::default();
            let t1 = h.token;
            let fence = h.wait(EVENT, |t, e| {
                t >= cut && matches!(e, Ev::Fence(f, 1) if *f == t1)
            });
            r.check(fence.is_some(), "no fence with one permit in flight");
            r.drain = h.first(cut, draining).map(|(t, _)| ms(cut, t));
            thread::sleep(work_after_fence);
            let early = c.result(Duration::ZERO);
            r.check(
                early.is_none(),
                format!("the contender acquired while the old holder's work ran: {early:?}"),
            );
            r.check(!permit.valid(), "a fenced permit still valid");
            let ended = system_now();
            permit.end();
            match c.result(EVENT) {
                Some((Ok(_), tc)) => {
                    r.lead = Some(ms(ended, tc));
                    r.other = Some(ms(ended, tc));
                    r.check(
                        tc >= ended,
                        format!("acquired {:?} ms before the work ended", ms(tc, ended)),
                    );
                }
                other => r.check(false, format!("contender: {other:?}")),
            }
            h.heal();
            c.finish();
            if !r.broken.is_empty() {
                r.broken
                    .push(format!("events (ms from the cut):{}", h.story(cut)));
            }
            r
        },
    );
}

/// Replies later than the keepalive timeout confirm nothing: as lost
/// replies, though every one of them arrives.
#[test]
fn fault_replies_delayed_past_timeout() {
    cut_until_fenced(
        "replies_delayed_800ms",
        Mode::Delay(Duration::from_millis(800)),
    );
}

/// Replies delayed by less than the keepalive timeout confirm, but the
/// deadline comes from each keepalive's send time: the time left never
/// exceeds TTL − margin − delay (an arrival-time deadline would show
/// TTL − margin right after each reply).
#[test]
fn fault_replies_delayed_within_timeout() {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let delay = Duration::from_millis(300);
    let bound = ms_of(TTL - MARGIN - delay);
    repeat("replies_delayed_300ms", "max time_left", |run| {
        let name = unique("delayed-within", run);
        let mut h = Holder::start(&cluster, &name);
        let cut = h.cut(Mode::Delay(delay));
        let mut r = Run::default();
        // From the first keepalive sent after the cut, for three intervals.
        let from = cut + INTERVAL + delay + SLACK;
        let until = from + 3 * INTERVAL;
        let mut most = 0.0f64;
        while system_now() < until {
            if system_now() >= from {
                let left = h.lock.time_left().map_or(0.0, ms_of);
                most = most.max(left);
            }
            thread::sleep(Duration::from_millis(2));
        }
        h.heal();
        r.other = Some(most);
        r.drain = h.first(cut, draining).map(|(t, _)| ms(cut, t));
        r.check(most <= bound, format!("time left {most:.1} ms > TTL − margin − delay = {bound:.0} ms: deadline not from the send time"));
        r.check(
            most >= bound - ms_of(INTERVAL + SLACK),
            format!("time left at most {most:.1} ms: keepalives were not confirmed"),
        );
        r.check(
            r.drain.is_none(),
            format!(
                "drained {:?} ms after the cut on replies within the timeout",
                r.drain
            ),
        );
        r.check(h.first(cut, fenced).is_none(), "fenced");
        if !r.broken.is_empty() {
            r.broken
                .push(format!("events (ms from the cut):{}", h.story(cut)));
        }
        r
    });
}

/// Every open connection of the holder reset (RST); new ones pass. The
/// lease is intact: the holder reconnects, with at most a drain.
#[test]
fn fault_tcp_reset() {
    survive(
        "tcp_reset",
        TTL,
        false,
        |_, h| {
            thread::sleep(random_phase());
            let open: usize = h.proxies.iter().map(Proxy::open).sum();
            assert!(open > 0, "the holder has no connection to reset");
            let cut = system_now();
            for p in &h.proxies {
                p.reset();
            }
            cut
        },
        |_, _| {},
    );
}

/// The leader is killed (SIGKILL): the holder rides out the election on
/// the other members, no fence. The member is restarted afterwards.
#[test]
fn fault_leader_killed() {
    let killed = std::cell::Cell::new(0);
    survive(
        "leader_killed",
        TTL + 2 * INTERVAL,
        false,
        |cluster, _| {
            thread::sleep(random_phase());
            killed.set(cluster.leader());
            let cut = system_now();
            signal(cluster.pid(killed.get()), libc::SIGKILL);
            cut
        },
        |cluster, _| cluster.restart_member(killed.get()),
    );
}

/// The member serving the holder's keepalives, a follower, is paused
/// (SIGSTOP): its keepalive times out, the holder drains, moves to another
/// member and resumes, no fence, also after SIGCONT.
#[test]
fn fault_serving_member_paused() {
    paused_member("serving_member_paused", false);
}

/// The same with the serving member made the leader first. Ignored: etcd
/// without etcd-io/etcd#16822 (Debian's 3.4.23 here) has etcd-io/etcd#15247: a
/// leader resumed after a pause still believes it leads and revokes every
/// lease that was renewed on the new leader meanwhile, so the holder is
/// told its lease is gone (and fences, correctly) right after SIGCONT. Run
/// it with `--ignored` against a fixed etcd.
#[test]
#[ignore = "etcd 3.4.23 revokes leases when a paused leader resumes (etcd-io/etcd#15247)"]
fn fault_serving_leader_paused() {
    paused_member("serving_leader_paused", true);
}

fn paused_member(case: &'static str, leader: bool) {
    let paused = std::cell::Cell::new(0);
    survive(
        case,
        TTL + 2 * INTERVAL,
        true,
        |cluster, h| {
            let i = serving(h);
            paused.set(i);
            // The leader is paused here only when asked for: see
            // fault_serving_leader_paused.
            if leader {
                cluster.move_leader(i);
            } else if cluster.leader() == i {
                cluster.move_leader((i + 1) % cluster.members.len());
            }
            thread::sleep(random_phase());
            let cut = system_now();
            signal(cluster.pid(i), libc::SIGSTOP);
            cut
        },
        |cluster, h| {
            let i = paused.get();
            signal(cluster.pid(i), libc::SIGCONT);
            let end = system_now() + EVENT;
            while !cluster.member_healthy(i) {
                assert!(
                    system_now() < end,
                    "member {} unhealthy after SIGCONT",
                    i + 1
                );
                thread::sleep(Duration::from_millis(100));
            }
            // A resumed member must not take the lease away either.
            let resumed = system_now();
            h.wait(INTERVAL, |t, e| t >= resumed && fenced(e));
        },
    );
}

/// A blip shorter than TTL − margin − interval (1.8 s < 2 s), starting
/// right after a confirmed keepalive: the holder drains, resumes when the
/// link is back, and is never fenced.
#[test]
fn fault_blip() {
    let blip = Duration::from_millis(1800);
    assert!(blip < TTL - MARGIN - INTERVAL);
    survive(
        "blip_1800ms",
        TTL + INTERVAL,
        true,
        |_, h| {
            // Cut right after a keepalive is confirmed (the deadline moves).
            let before = h.lock.deadline();
            let end = system_now() + EVENT;
            while h.lock.deadline() == before {
                assert!(system_now() < end, "no keepalive confirmed");
                thread::sleep(Duration::from_millis(1));
            }
            let cut = h.cut(Mode::Blackhole);
            thread::sleep(blip);
            h.heal();
            cut
        },
        |_, _| {},
    );
}

/// An operator revokes the holder's lease: the next keepalive (or the
/// watch on the lock key) tells, and the holder fences within one
/// keepalive interval. The server gives the lock to the contender at
/// once, so on_fence cannot lead it here: its lead is printed, not
/// required (writes are then protected by the token alone).
#[test]
fn fault_lease_revoked() {
    operator("lease_revoked", |cluster, _, lease, _| {
        cluster.etcdctl(&["lease", "revoke", &format!("{lease:x}")]);
    });
}

/// An operator deletes the lock key while the lease lives: the watch fences
/// the holder at once (keepalives alone would never tell).
#[test]
fn fault_lock_key_deleted() {
    operator("lock_key_deleted", |cluster, _, _, key| {
        cluster.etcdctl(&["del", key]);
    });
}

/// An operator's action `act(cluster, name, lease, key)`; the holder must
/// fence within one keepalive interval (lease revoked) or at once
/// (key deleted) of the command's return (reason `lease_lost` or
/// `lock_lost`) and acquire again, higher, once the contender releases.
fn operator(case: &'static str, act: impl Fn(&Cluster, &str, i64, &str)) {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let bound = if case == "lease_revoked" {
        INTERVAL + SLACK
    } else {
        SLACK
    };
    repeat(case, "etcdctl start->fence", |run| {
        let name = unique(case, run);
        let mut h = Holder::start(&cluster, &name);
        let c = Contender::start(&cluster, &name, EVENT);
        let (lease, key) = cluster.lock_key(&name, h.token);
        thread::sleep(random_phase());
        let start = system_now();
        act(&cluster, &name, lease, &key);
        let done = system_now();
        let mut r = Run::default();
        let t1 = h.token;
        let fence = h.wait(EVENT, |t, e| {
            t >= start && matches!(e, Ev::Fence(f, 0) if *f == t1)
        });
        let contender = c.result(EVENT);
        // Figures from the command's start (etcdctl's own start-up
        // included); the bound from its return, when the deed is done.
        r.other = fence.map(|f| ms(start, f));
        r.drain = h.first(start, draining).map(|(t, _)| ms(start, t));
        if let (Some(f), Some((Ok(_), tc))) = (fence, &contender) {
            r.lead = Some(ms(f, *tc));
        }
        let after = fence.map(|f| ms(done, f));
        r.check(
            after.is_some_and(|f| f <= ms_of(bound)),
            format!("fence {after:?} ms after etcdctl returned, bound {bound:?}"),
        );
        let why = h.first(
            start,
            |e| matches!(e, Ev::Change(c) if c.to == State::Fenced),
        );
        r.check(
            matches!(why, Some((_, Ev::Change(c))) if matches!(c.reason, Reason::LeaseLost | Reason::LockLost)),
            format!("fence reason {why:?}"),
        );
        r.check(
            matches!(contender, Some((Ok(_), _))),
            format!("the contender did not acquire: {contender:?}"),
        );
        c.finish();
        let again = h.wait(EVENT, |_, e| matches!(e, Ev::Acquired(t) if *t > t1));
        r.check(again.is_some(), format!("no reacquisition above {t1}"));
        if !r.broken.is_empty() {
            r.broken.push(format!(
                "events (ms from the command's start):{}",
                h.story(start)
            ));
        }
        r
    });
}

/// The holder's process is killed (SIGKILL): nobody revokes its lease, the
/// server lets it expire, and the contender acquires within TTL + 1.5 s.
#[test]
fn fault_holder_killed() {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let bound = TTL + Duration::from_millis(1500);
    repeat("holder_killed", "kill->contender", |run| {
        let name = unique("holder-killed", run);
        let mut child = Killed(
            Command::new(std::env::current_exe().expect("test binary"))
                .args(["--exact", "child_holder", "--nocapture", "--test-threads=1"])
                .env(CHILD, &name)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn the holder process"),
        );
        // The child's libtest prints around the line; read it in a thread
        // so a child that never gets there fails the test instead of hanging it.
        let stdout = child.0.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("DLOCK_CHILD_HOLDING") {
                    let _ = tx.send(line);
                }
            }
        });
        let held = rx.recv_timeout(EVENT).ok();
        assert!(held.is_some(), "the holder process did not acquire {name}");
        let c = Contender::start(&cluster, &name, EVENT);
        thread::sleep(random_phase());
        let cut = system_now();
        child.0.kill().expect("SIGKILL the holder");
        let _ = child.0.wait();
        let mut r = Run::default();
        let contender = c.result(EVENT);
        match &contender {
            Some((Ok(_), t)) => r.other = Some(ms(cut, *t)),
            _ => r.check(
                false,
                format!("the contender did not acquire: {contender:?}"),
            ),
        }
        r.check(
            r.other.is_some_and(|d| d <= ms_of(bound)),
            format!(
                "contender acquired {:?} ms after the kill, bound {bound:?}",
                r.other
            ),
        );
        c.finish();
        r
    });
}

const CHILD: &str = "DLOCK_FAULT_CHILD_LOCK";

/// A child process killed (SIGKILL) when dropped, also when a test fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Not a test on its own: with `DLOCK_FAULT_CHILD_LOCK` set (by
/// `fault_holder_killed`), holds that lock until the process is killed
/// (or its parent goes away).
#[test]
fn child_holder() {
    let Ok(name) = std::env::var(CHILD) else {
        return;
    };
    let cluster = Cluster::from_env();
    let client = Client::etcd(
        EtcdConfig::new(cluster.members.clone()),
        dlock_testkit::backend_options(),
    )
    .expect("child connects");
    let lock = client.lock(&name).expect("lock handle");
    let token = lock.acquire(EVENT).expect("child acquires");
    println!("DLOCK_CHILD_HOLDING {token}");
    // Held until killed; should the test process die first, its end of
    // stdin closes and the child leaves too instead of lingering.
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    std::process::exit(1);
}

fn signal(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) with a pid of the test cluster's member.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// The member whose proxy carries the holder's traffic: the most bytes
/// over two keepalive intervals.
fn serving(h: &Holder) -> usize {
    let total = |p: &Proxy| {
        let (u, d) = p.bytes();
        u + d
    };
    let before: Vec<u64> = h.proxies.iter().map(total).collect();
    thread::sleep(2 * INTERVAL);
    let grew: Vec<u64> = h
        .proxies
        .iter()
        .zip(&before)
        .map(|(p, b)| total(p) - b)
        .collect();
    let (i, most) = grew
        .iter()
        .enumerate()
        .max_by_key(|(_, g)| **g)
        .expect("proxies");
    assert!(*most > 0, "no holder traffic on any proxy: {grew:?}");
    i
}

// ---------------------------------------------------------------------------
// The proxy itself, against a tiny echo server (no etcd needed).

mod proxy_tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::proxy::{Mode, Proxy};

    /// An echo server on a free port; counts the bytes it received.
    /// A proxy on an address of its own (see `Proxy::start_on`).
    fn proxy(upstream: SocketAddr) -> Proxy {
        Proxy::start_on("127.0.0.77", upstream)
    }

    fn echo() -> (SocketAddr, Arc<AtomicU64>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let r = received.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let r = r.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 {
                            return;
                        }
                        r.fetch_add(n as u64, Ordering::SeqCst);
                        if s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, received)
    }

    fn connect(p: &Proxy) -> TcpStream {
        let s = TcpStream::connect(p.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s
    }

    fn read_n(s: &mut TcpStream, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf).unwrap();
        buf
    }

    /// Nothing arrives within `d`.
    fn silent(s: &mut TcpStream, d: Duration) {
        s.set_read_timeout(Some(d)).unwrap();
        let mut buf = [0u8; 16];
        match s.read(&mut buf) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected silence, got {other:?}"),
        }
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    }

    fn wait_until(what: &str, f: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(2);
        while !f() {
            assert!(Instant::now() < end, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn pass_forwards_both_ways() {
        let (up, _) = echo();
        let p = proxy(up);
        let mut s = connect(&p);
        s.write_all(b"hello").unwrap();
        assert_eq!(read_n(&mut s, 5), b"hello");
        // Counted just after the write that delivered them.
        wait_until("the byte counts", || p.bytes() == (5, 5));
        assert_eq!(p.open(), 1);
        drop(s);
        wait_until("the connection to close", || p.open() == 0);
    }

    #[test]
    fn blackhole_holds_bytes_until_healed() {
        let (up, received) = echo();
        let p = proxy(up);
        let mut s = connect(&p);
        s.write_all(b"a").unwrap();
        assert_eq!(read_n(&mut s, 1), b"a");
        p.set(Mode::Blackhole);
        s.write_all(b"bc").unwrap();
        // A connection opened during the cut is accepted and held too.
        let mut late = connect(&p);
        late.write_all(b"d").unwrap();
        silent(&mut s, Duration::from_millis(300));
        silent(&mut late, Duration::from_millis(10));
        assert_eq!(
            received.load(Ordering::SeqCst),
            1,
            "held bytes reached the server"
        );
        assert_eq!(p.open(), 2, "connections stay open");
        p.set(Mode::Pass);
        assert_eq!(read_n(&mut s, 2), b"bc");
        assert_eq!(read_n(&mut late, 1), b"d");
    }

    #[test]
    fn delay_delays_replies_only() {
        let (up, received) = echo();
        let p = proxy(up);
        let mut s = connect(&p);
        let d = Duration::from_millis(300);
        p.set(Mode::Delay(d));
        let t0 = Instant::now();
        s.write_all(b"xy").unwrap();
        wait_until("the request to arrive", || {
            received.load(Ordering::SeqCst) == 2
        });
        assert!(t0.elapsed() < d, "the request was delayed too");
        assert_eq!(read_n(&mut s, 2), b"xy");
        let took = t0.elapsed();
        assert!(
            took >= d && took < d + Duration::from_millis(500),
            "{took:?}"
        );
    }

    #[test]
    fn drop_replies_passes_requests() {
        let (up, received) = echo();
        let p = proxy(up);
        let mut s = connect(&p);
        p.set(Mode::DropReplies);
        s.write_all(b"abc").unwrap();
        wait_until("the request to arrive", || {
            received.load(Ordering::SeqCst) == 3
        });
        silent(&mut s, Duration::from_millis(300));
        p.set(Mode::Pass);
        s.write_all(b"d").unwrap();
        assert_eq!(read_n(&mut s, 1), b"d", "the dropped reply stays dropped");
    }

    #[test]
    fn reset_resets_open_connections_only() {
        let (up, _) = echo();
        let p = proxy(up);
        let mut s = connect(&p);
        s.write_all(b"a").unwrap();
        assert_eq!(read_n(&mut s, 1), b"a");
        p.reset();
        let mut buf = [0u8; 1];
        let r = s.read(&mut buf);
        assert_eq!(
            r.as_ref().map_err(|e| e.kind()).err(),
            Some(ErrorKind::ConnectionReset),
            "{r:?}"
        );
        let mut fresh = connect(&p);
        fresh.write_all(b"b").unwrap();
        assert_eq!(read_n(&mut fresh, 1), b"b");
    }

    #[test]
    fn upstream_down_closes_the_client() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        let p = proxy(dead);
        let mut s = connect(&p);
        let mut buf = [0u8; 1];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    }
}
