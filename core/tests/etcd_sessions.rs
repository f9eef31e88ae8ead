//! Sessions on the real 3-member test cluster (`scripts/test-etcd.sh`):
//! 1,000 locks on one lease through a leader kill (none fences) and
//! through a blackhole (each fences once, before the server's expiry, and
//! all come back on a new lease); a live session's acquire and release
//! grant and revoke no lease; an operator's plain delete of one key fences
//! that lock alone.
//!
//! Settings: as `etcd_faults.rs`, TTL 4 s, keepalive every 1 s, keepalive
//! timeout 0.5 s, retry every 0.25 s, margin 1 s. Times are read from
//! dlock's clock (`dlock::clock::system_now`), also in the callbacks.

use std::io::{Read, Write};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread;
use std::time::Duration;

use dlock::clock::system_now;
use dlock::{Client, EtcdConfig, Instant, Lock, Reason, State, StateChange, Token};

// This binary uses only a part of the proxy.
use dlock_testkit::TTL;
use dlock_testkit::faults::{Ev, ms};
use dlock_testkit::proxy;
use dlock_testkit::{INTERVAL, MARGIN};

use dlock_testkit::etcd as etcd_cluster;

use etcd_cluster::Cluster;
use proxy::{Mode, Proxy};

/// The locks of the big cases.
const N: usize = 1000;
/// The longest wait for something that must happen (1,000 acquisitions on
/// a loaded two-core machine included).
const EVENT: Duration = Duration::from_secs(60);

/// Cases that disturb the cluster (a member killed) or count its requests
/// run alone; the others share it.
static CLUSTER: RwLock<()> = RwLock::new(());

fn shared() -> RwLockReadGuard<'static, ()> {
    CLUSTER.read().unwrap_or_else(|e| e.into_inner())
}

fn exclusive() -> RwLockWriteGuard<'static, ()> {
    CLUSTER.write().unwrap_or_else(|e| e.into_inner())
}

/// A lock-name prefix of this run only.
fn unique(case: &str) -> String {
    format!(
        "dlock-sessions/{case}-{}-{}",
        std::process::id(),
        system_now().as_nanos()
    )
}

fn direct(cluster: &Cluster) -> Client {
    Client::etcd(
        EtcdConfig::new(cluster.members.clone()),
        dlock_testkit::backend_options(),
    )
    .expect("connect to etcd")
}

/// `n` locks of distinct names on one session of `client`, all held, with
/// every callback report (lock index, time, event) on one channel.
struct Many {
    names: Vec<String>,
    locks: Vec<Lock>,
    /// The token each lock first acquired.
    tokens: Vec<Token>,
    rx: Receiver<(usize, Instant, Ev)>,
    log: Vec<(usize, Instant, Ev)>,
}

impl Many {
    fn start(client: &Client, prefix: &str, n: usize) -> Many {
        let session = client
            .session(dlock_testkit::backend_options())
            .expect("session");
        let (tx, rx) = mpsc::channel();
        let names: Vec<String> = (0..n).map(|i| format!("{prefix}/{i}")).collect();
        let locks: Vec<Lock> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let lock = session.lock(name).expect("lock handle");
                listen(&lock, i, &tx);
                lock
            })
            .collect();
        // 16 threads of blocking acquisitions: ~60 requests in flight.
        let tokens: Vec<Token> = thread::scope(|s| {
            let chunks: Vec<_> = locks
                .chunks(n.div_ceil(16))
                .map(|chunk| {
                    s.spawn(move || {
                        chunk
                            .iter()
                            .map(|l| l.acquire(EVENT).expect("acquire"))
                            .collect::<Vec<Token>>()
                    })
                })
                .collect();
            chunks
                .into_iter()
                .flat_map(|h| h.join().expect("acquiring thread"))
                .collect()
        });
        Many {
            names,
            locks,
            tokens,
            rx,
            log: Vec::new(),
        }
    }

    fn lease(&self) -> Option<i64> {
        self.locks[0].session().lease()
    }

    fn keepalives(&self) -> u64 {
        self.locks[0].session().stats().keepalives
    }

    fn collect(&mut self) {
        self.log.extend(self.rx.try_iter());
    }

    /// Waits up to `within` until `k` reports match `f`; returns how many did.
    fn wait_count(
        &mut self,
        within: Duration,
        k: usize,
        mut f: impl FnMut(&(usize, Instant, Ev)) -> bool,
    ) -> usize {
        self.collect();
        let mut seen = self.log.iter().filter(|e| f(e)).count();
        let end = system_now() + within;
        while seen < k {
            let left = end.saturating_since(system_now());
            let Ok(e) = self.rx.recv_timeout(left) else {
                break;
            };
            self.log.push(e);
            if f(&e) {
                seen += 1;
            }
        }
        seen
    }

    fn fences(&mut self) -> Vec<(usize, Instant, Token)> {
        self.collect();
        self.log
            .iter()
            .filter_map(|&(i, t, e)| match e {
                Ev::Fence(token, _) => Some((i, t, token)),
                _ => None,
            })
            .collect()
    }

    /// Locks whose state or token is not what they first acquired.
    fn not_holding_first(&self) -> Vec<String> {
        self.locks
            .iter()
            .zip(&self.tokens)
            .enumerate()
            .filter(|(_, (l, t))| l.state() != State::Holding || l.token() != Some(**t))
            .map(|(i, (l, t))| format!("{i}: {:?} {:?} (was {t})", l.state(), l.token()))
            .collect()
    }
}

fn listen(lock: &Lock, i: usize, tx: &Sender<(usize, Instant, Ev)>) {
    let t = tx.clone();
    lock.on_state_change(move |c| {
        let _ = t.send((i, system_now(), Ev::Change(c)));
    });
    let t = tx.clone();
    lock.on_fence(move |token, n| {
        let _ = t.send((i, system_now(), Ev::Fence(token, n)));
    });
    let t = tx.clone();
    lock.on_acquired(move |token| {
        let _ = t.send((i, system_now(), Ev::Acquired(token)));
    });
}

/// `etcd_client` on the members, for what dlock must not be asked about.
struct Etcd {
    rt: tokio::runtime::Runtime,
    c: etcd_client::Client,
}

impl Etcd {
    fn connect(cluster: &Cluster) -> Etcd {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let c = rt
            .block_on(etcd_client::Client::connect(&cluster.members, None))
            .expect("etcd_client connects");
        Etcd { rt, c }
    }

    /// Runs a read; a failure (a connection to a member that was killed
    /// and restarted, say) is tried again, for up to 10 s.
    fn read<T, F, Fut>(&self, what: &str, f: F) -> T
    where
        F: Fn(etcd_client::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let end = system_now() + Duration::from_secs(10);
        loop {
            match self.rt.block_on(f(self.c.clone())) {
                Ok(r) => return r,
                Err(e) if system_now() < end => {
                    eprintln!("{what}: {e}; trying again");
                    thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }

    /// The lock keys attached to `lease` (none when it is gone): its
    /// holder identity's key left out.
    fn lease_keys(&self, lease: i64) -> Vec<String> {
        let opts = etcd_client::LeaseTimeToLiveOptions::new().with_keys();
        let r = self.read("lease time to live", |mut c| {
            let opts = opts.clone();
            async move { c.lease_time_to_live(lease, Some(opts)).await }
        });
        r.keys()
            .iter()
            .filter(|k| !k.starts_with(dlock::identity::IDENTITY_PREFIX))
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect()
    }

    /// Keys under `prefix`.
    fn count(&self, prefix: &str) -> usize {
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        self.read("get", |mut c| {
            let opts = opts.clone();
            async move { c.get(prefix, Some(opts)).await }
        })
        .kvs()
        .len()
    }

    /// The create revision of `key`, if it exists.
    fn create_revision(&self, key: &str) -> Option<i64> {
        let r = self.read("get", |mut c| async move { c.get(key, None).await });
        r.kvs().first().map(|kv| kv.create_revision())
    }

    /// A plain delete, as an operator's (not tried again); returns how
    /// many keys went.
    fn delete(&self, key: &str) -> i64 {
        let mut c = self.c.clone();
        self.rt
            .block_on(c.delete(key, None))
            .expect("delete")
            .deleted()
    }
}

/// The lock key of `name` under `lease` (etcd's Mutex: `<name>/<lease hex>`).
fn lock_key(name: &str, lease: i64) -> String {
    format!("{name}/{lease:x}")
}

/// The sum over the members of etcd's `/metrics` counter `metric` for
/// the gRPC method `method`.
fn metric(cluster: &Cluster, metric: &str, method: &str) -> f64 {
    let line_start = format!("{metric}{{");
    let m = format!("grpc_method=\"{method}\"");
    (0..cluster.members.len())
        .map(|i| {
            let addr = cluster.member_addr(i);
            let mut s = std::net::TcpStream::connect(addr).expect("connect /metrics");
            s.set_read_timeout(Some(Duration::from_secs(5))).ok();
            write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("GET");
            let mut resp = String::new();
            s.read_to_string(&mut resp).expect("read /metrics");
            resp.lines()
                .filter(|l| l.starts_with(&line_start) && l.contains(&m))
                .map(|l| {
                    l.rsplit(' ')
                        .next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .expect("a metric value")
                })
                .sum::<f64>()
        })
        .sum()
}

/// One line of `scripts/test-etcd.sh`'s fault figures table (one run), as
/// `etcd_faults.rs` prints them: case, runs, cut->drain, drained, the
/// smallest on_fence lead over a contender, other.
fn fault_line(case: &str, drain: Option<f64>, lead: Option<f64>, other: &str) {
    let d = drain.map_or("-".into(), |d| format!("{d:.0}/{d:.0}/{d:.0}"));
    let lead = lead.map_or("n/a (no fence)".into(), |l| format!("{l:.0}"));
    println!(
        "FAULT|{case}|1|{d}|{}/1|{lead}|{other}",
        u8::from(drain.is_some())
    );
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

/// The leader's member id as member `i` (0-based) sees it, asked with a
/// 1 s timeout; `None` while it knows none (or does not answer).
fn leader_seen_by(cluster: &Cluster, i: usize) -> Option<u64> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(1));
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([cluster.members[i].as_str()], Some(opts))
            .await
            .ok()?;
        let s = c.status().await.ok()?;
        (s.leader() != 0).then_some(s.leader())
    })
}

/// Restarts a killed member when dropped, also when the test fails.
struct Restart {
    cluster: Cluster,
    member: usize,
    done: bool,
}

impl Restart {
    fn now(&mut self) {
        if !self.done {
            self.done = true;
            self.cluster.restart_member(self.member);
        }
    }
}

impl Drop for Restart {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.cluster.restart_member(self.member)
            }));
        }
    }
}

/// Polls `f` (a state with no event of its own) every 20 ms for up to
/// `within`; whether it came true.
fn until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = system_now() + within;
    loop {
        if f() {
            return true;
        }
        if system_now() >= end {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------

/// 1,000 locks on one session while the leader is killed (SIGKILL): the
/// session rides out the election on the other members. No lock fences,
/// every lock still holds its first token and grants permits, the lease is
/// the same, and keepalives go on being confirmed after the kill and after
/// the member's restart.
#[test]
fn leader_kill_fences_none_of_1000_locks_on_one_session() {
    let cluster = etcd_cluster::cluster();
    let _alone = exclusive();
    let client = direct(&cluster);
    let mut m = Many::start(&client, &unique("leader-kill"), N);
    let lease = m.lease().expect("a lease");
    let etcd = Etcd::connect(&cluster);
    assert_eq!(
        etcd.lease_keys(lease).len(),
        N,
        "every key on the one lease"
    );

    let killed = cluster.leader();
    let old_leader = leader_seen_by(&cluster, killed).expect("the leader knows itself");
    let mut restart = Restart {
        cluster: cluster.clone(),
        member: killed,
        done: false,
    };
    let keepalives_before = m.keepalives();
    let cut = system_now();
    signal(cluster.pid(killed), libc::SIGKILL);
    let others: Vec<usize> = (0..cluster.members.len())
        .filter(|&i| i != killed)
        .collect();
    assert!(
        until(Duration::from_secs(20), || others.iter().all(|&i| {
            leader_seen_by(&cluster, i).is_some_and(|l| l != old_leader)
        })),
        "no new leader within 20 s of killing member {}",
        killed + 1
    );
    let elected = system_now();
    // A fence would come within TTL − margin of the last confirmed
    // keepalive: watch for one for TTL + 2 intervals from the election.
    let window = TTL + 2 * INTERVAL;
    let fenced = m.wait_count(window, 1, |e| matches!(e.2, Ev::Fence(..)));
    let keepalives_window = m.keepalives() - keepalives_before;
    // Confirmed after the kill: the deadline is the send time of the last
    // confirmed keepalive + TTL − margin.
    let confirmed_after_kill = m.locks[0]
        .deadline()
        .is_some_and(|d| d > cut + (TTL - MARGIN));
    restart.now();
    let restarted = system_now();
    let confirmed_after_restart = until(Duration::from_secs(10), || {
        m.locks[0]
            .deadline()
            .is_some_and(|d| d > restarted + (TTL - MARGIN))
    });

    let fences = m.fences();
    let drains = m
        .log
        .iter()
        .filter(|e| matches!(e.2, Ev::Change(c) if c.to == State::Draining))
        .count();
    let drain = m
        .log
        .iter()
        .find(|e| e.1 >= cut && matches!(e.2, Ev::Change(c) if c.to == State::Draining))
        .map(|e| ms(cut, e.1));
    println!(
        "leader_kill: new leader seen {:.0} ms after the kill; {keepalives_window} keepalives sent from the kill to {window:?} after the election; {drains} lock drains; {} fences",
        ms(cut, elected),
        fences.len()
    );
    fault_line(
        "sessions_leader_killed_1000",
        drain,
        None,
        &format!("kill->leader seen {:.0}", ms(cut, elected)),
    );
    assert_eq!(
        fenced,
        0,
        "fences after the leader kill: {:?}",
        &fences[..fences.len().min(5)]
    );
    let wrong = m.not_holding_first();
    assert!(
        wrong.is_empty(),
        "{} locks changed: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
    let refused = m.locks.iter().filter(|l| l.permit().is_err()).count();
    assert_eq!(refused, 0, "locks refusing permits after the kill");
    assert_eq!(m.lease(), Some(lease), "the lease changed");
    assert_eq!(etcd.lease_keys(lease).len(), N, "keys left the lease");
    assert!(
        keepalives_window >= 3,
        "only {keepalives_window} keepalives sent from the kill to {window:?} after the election"
    );
    assert!(
        confirmed_after_kill,
        "no keepalive confirmed after the kill"
    );
    assert!(
        confirmed_after_restart,
        "no keepalive confirmed after the restart"
    );
    m.locks[0].session().close().expect("close");
}

/// 1,000 locks on one session through the fault proxies, then every proxy
/// blackholed: each lock fences exactly once, at the session's deadline and
/// before the server's expiry (TTL after the last confirmed keepalive's
/// send); contenders on another client, connected directly, acquire their
/// names only after those fences. After the heal all 1,000 acquire again,
/// each with a higher token, on a new lease.
#[test]
fn blackhole_fences_each_of_1000_locks_once_before_the_server_expiry() {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let proxies: Vec<Proxy> = (0..cluster.members.len())
        .map(|i| Proxy::start(cluster.member_addr(i)))
        .collect();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let holder = Client::etcd(EtcdConfig::new(urls), dlock_testkit::backend_options())
        .expect("holder connects");
    let prefix = unique("blackhole");
    let mut m = Many::start(&holder, &prefix, N);
    let lease = m.lease().expect("a lease");
    let etcd = Etcd::connect(&cluster);

    // Heals the proxies when dropped (a failing test too), before the
    // locks are dropped.
    struct Heal<'a>(&'a [Proxy]);
    impl Drop for Heal<'_> {
        fn drop(&mut self) {
            for p in self.0 {
                p.set(Mode::Pass);
            }
        }
    }
    let heal = Heal(&proxies);

    // Contenders on a few of the names, queued behind the holder.
    let contender = direct(&cluster);
    let picks = [0, N / 2, N - 1];
    let (ctx, crx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Arc::new(std::sync::Mutex::new(release_rx));
    let mut threads = Vec::new();
    for &i in &picks {
        let lock = contender.lock(&m.names[i]).expect("contender lock");
        let (ctx, release_rx) = (ctx.clone(), release_rx.clone());
        threads.push(thread::spawn(move || {
            let r = lock.acquire(EVENT);
            let _ = ctx.send((i, r.clone(), system_now()));
            if r.is_ok() {
                let _ = release_rx.lock().unwrap().recv();
            }
            let _ = lock.release();
        }));
        let queue = format!("{}/", m.names[i]);
        assert!(
            until(Duration::from_secs(20), || etcd.count(&queue) >= 2),
            "the contender never queued on {queue}"
        );
    }
    drop(ctx);

    let cut = system_now();
    for p in &proxies {
        p.set(Mode::Blackhole);
    }
    // The session's deadline, read once a keepalive failed (draining): no
    // reply can move it any more.
    let drained = m.wait_count(Duration::from_secs(10), 1, |e| {
        e.0 == 0 && matches!(e.2, Ev::Change(c) if c.to == State::Draining)
    });
    assert_eq!(drained, 1, "lock 0 did not drain within 10 s of the cut");
    let deadline = m.locks[0].deadline().expect("draining, so a deadline");
    let expiry = deadline + MARGIN;
    let fenced = m.wait_count(TTL + EVENT, N, |e| matches!(e.2, Ev::Fence(..)));
    let fences = m.fences();
    let in_flight = m
        .log
        .iter()
        .filter(|e| matches!(e.2, Ev::Fence(_, n) if n != 0))
        .count();
    let mut contenders: Vec<(usize, Result<Token, dlock::Error>, Instant)> = Vec::new();
    for _ in picks {
        contenders.push(crx.recv_timeout(EVENT).expect("a contender's outcome"));
    }
    let first = fences.iter().map(|f| f.1).min();
    let last = fences.iter().map(|f| f.1).max();
    let drain = m
        .log
        .iter()
        .find(|e| e.0 == 0 && matches!(e.2, Ev::Change(c) if c.to == State::Draining))
        .map(|e| ms(cut, e.1));
    let (first, last) = (
        first.map_or(f64::NAN, |t| ms(deadline, t)),
        last.map_or(f64::NAN, |t| ms(deadline, t)),
    );
    let lead = contenders
        .iter()
        .filter_map(|(i, _, at)| {
            let f = fences.iter().find(|f| f.0 == *i)?;
            Some(ms(f.1, *at))
        })
        .min_by(f64::total_cmp);
    println!(
        "blackhole: drained {drain:?} ms after the cut; {} fences from {first:.0} to {last:.0} ms after the deadline (server expiry at +{:.0} ms); contenders {:?} ms after the deadline",
        fences.len(),
        MARGIN.as_secs_f64() * 1e3,
        contenders
            .iter()
            .map(|c| format!("{}: {:.0}", c.0, ms(deadline, c.2)))
            .collect::<Vec<_>>()
    );
    fault_line(
        "sessions_blackhole_1000",
        drain,
        lead,
        &format!("deadline->fences {first:.0}..{last:.0}"),
    );
    assert_eq!(fenced, N, "{fenced} of {N} locks fenced");
    assert_eq!(
        in_flight, 0,
        "fences with permits in flight (none was taken)"
    );
    // Each lock once, its first token, at the deadline, before the expiry.
    let mut per_lock = vec![0usize; N];
    let mut fence_at = vec![None; N];
    for &(i, t, token) in &fences {
        per_lock[i] += 1;
        fence_at[i] = Some(t);
        assert_eq!(token, m.tokens[i], "lock {i} fenced another token");
        assert!(
            t >= deadline,
            "lock {i} fenced {:.1} ms before the deadline",
            ms(t, deadline)
        );
        assert!(
            t < expiry,
            "lock {i} fenced {:.1} ms after the server's expiry (deadline + margin)",
            ms(expiry, t)
        );
    }
    let twice: Vec<usize> = (0..N).filter(|&i| per_lock[i] != 1).collect();
    assert!(twice.is_empty(), "locks not fenced exactly once: {twice:?}");
    for (i, r, at) in &contenders {
        assert!(r.is_ok(), "contender on lock {i}: {r:?}");
        let f = fence_at[*i].expect("fenced");
        assert!(
            *at > f,
            "the contender acquired lock {i} {:.1} ms before its fence",
            ms(*at, f)
        );
    }

    // Heal: every lock acquires again, higher, on a new lease (the
    // contended names once their contenders let go).
    drop(heal);
    drop(release_tx);
    for t in threads {
        t.join().expect("contender thread");
    }
    let tokens = m.tokens.clone();
    let again = m.wait_count(
        EVENT,
        N,
        |e| matches!(e.2, Ev::Acquired(t) if t > tokens[e.0]),
    );
    assert_eq!(
        again, N,
        "{again} of {N} locks acquired again after the heal"
    );
    let new_lease = m.lease().expect("a new lease");
    assert_ne!(new_lease, lease, "reacquired on the fenced lease");
    // Holding, or draining on a keepalive slower than the 0.5 s timeout
    // (1,000 reacquisitions load a two-core machine): a confirmed
    // keepalive resumes it, and a fence would be counted below.
    assert!(
        until(EVENT, || m
            .locks
            .iter()
            .all(|l| l.state() == State::Holding)),
        "locks not holding after the heal: {:?}",
        m.locks
            .iter()
            .enumerate()
            .filter(|(_, l)| l.state() != State::Holding)
            .map(|(i, l)| (i, l.state()))
            .take(5)
            .collect::<Vec<_>>()
    );
    for (i, l) in m.locks.iter().enumerate() {
        assert!(
            l.token().is_some_and(|t| t > m.tokens[i]),
            "lock {i}: {:?}",
            l.token()
        );
    }
    assert_eq!(
        etcd.lease_keys(new_lease).len(),
        N,
        "every key on the new lease"
    );
    // Still one fence each, after the reacquisition.
    let fences = m.fences();
    assert_eq!(
        fences.len(),
        N,
        "fences after the heal: {}",
        fences.len() - N
    );
    m.locks[0].session().close().expect("close");
}

/// Acquire + release on a live session: one put, one delete, never a
/// lease. The lease is the same through 100 cycles, each token higher, the
/// key gone after each release; and etcd's own counters of LeaseGrant and
/// LeaseRevoke requests (summed over the members, this case alone on the
/// cluster) grew by far less than the 100 a grant or revoke per cycle
/// would add (the slack: other cases' sessions closing meanwhile).
#[test]
fn live_session_acquire_release_grants_and_revokes_no_lease() {
    let cluster = etcd_cluster::cluster();
    let _alone = exclusive();
    let etcd = Etcd::connect(&cluster);
    let client = direct(&cluster);
    let session = client
        .session(dlock_testkit::backend_options())
        .expect("session");
    let name = unique("cycles");
    let lock = session.lock(&name).expect("lock");
    let mut last = lock.acquire(EVENT).expect("first acquire");
    let lease = session.lease().expect("a lease");
    lock.release().expect("release");
    let grants = metric(&cluster, "grpc_server_started_total", "LeaseGrant");
    let revokes = metric(&cluster, "grpc_server_started_total", "LeaseRevoke");
    for cycle in 0..100 {
        let t = lock.acquire(EVENT).expect("acquire");
        assert!(t > last, "cycle {cycle}: token {t} after {last}");
        assert_eq!(session.lease(), Some(lease), "cycle {cycle}: another lease");
        assert_eq!(
            etcd.create_revision(&lock_key(&name, lease)),
            Some(t.get() as i64),
            "cycle {cycle}: the key is not the token's"
        );
        lock.release().expect("release");
        assert_eq!(
            etcd.count(&format!("{name}/")),
            0,
            "cycle {cycle}: key left after release"
        );
        last = t;
    }
    let grants = metric(&cluster, "grpc_server_started_total", "LeaseGrant") - grants;
    let revokes = metric(&cluster, "grpc_server_started_total", "LeaseRevoke") - revokes;
    println!(
        "live_session: 100 cycles on lease {lease:x}: {grants} LeaseGrant, {revokes} LeaseRevoke requests cluster-wide"
    );
    assert_eq!(session.lease(), Some(lease));
    assert!(
        grants < 10.0 && revokes < 10.0,
        "{grants} grants, {revokes} revokes over 100 cycles"
    );
    session.close().expect("close");
}

/// An operator deletes one lock's key with a plain etcd delete while the
/// lease lives: that lock alone fences (reason lock_lost), within a
/// keepalive interval of the delete (keepalives cannot tell: only the key
/// watch does), and acquires again on the same lease with a higher token;
/// the session's other locks keep their tokens, unfenced.
///
/// Needs the etcd backend's key watch (branch etcdw, merged into sessions):
/// without it nothing notices the delete and this case fails on the
/// missing fence.
#[test]
fn plain_delete_of_a_key_fences_only_its_lock() {
    let cluster = etcd_cluster::cluster();
    let _shared = shared();
    let etcd = Etcd::connect(&cluster);
    let client = direct(&cluster);
    let mut m = Many::start(&client, &unique("deleted"), 5);
    let lease = m.lease().expect("a lease");
    let victim = 2;
    let key = lock_key(&m.names[victim], lease);
    let start = system_now();
    assert_eq!(etcd.delete(&key), 1, "the lock key {key} was not there");
    let done = system_now();
    let fenced = m.wait_count(Duration::from_secs(10), 1, |e| matches!(e.2, Ev::Fence(..)));
    let fences = m.fences();
    println!(
        "deleted_key: fences {:?} ms after the delete returned",
        fences
            .iter()
            .map(|f| (f.0, ms(done, f.1)))
            .collect::<Vec<_>>()
    );
    assert_eq!(fenced, 1, "no fence within 10 s of deleting {key}");
    let (i, at, token) = fences[0];
    assert_eq!(
        (i, token),
        (victim, m.tokens[victim]),
        "the wrong lock fenced"
    );
    assert!(
        ms(done, at) <= INTERVAL.as_secs_f64() * 1e3,
        "fenced {:.0} ms after the delete returned ({:.0} ms after it began)",
        ms(done, at),
        ms(start, at)
    );
    let reason = m.log.iter().find_map(|e| match e.2 {
        Ev::Change(c) if e.0 == victim && c.to == State::Fenced => Some(c.reason),
        _ => None,
    });
    assert_eq!(reason, Some(Reason::LockLost));
    let t1 = m.tokens[victim];
    let again = m.wait_count(Duration::from_secs(10), 1, |e| {
        e.0 == victim && matches!(e.2, Ev::Acquired(t) if t > t1)
    });
    assert_eq!(again, 1, "the fenced lock did not acquire again");
    assert_eq!(m.lease(), Some(lease), "acquired again on another lease");
    let t2 = m.locks[victim].token().expect("holding again");
    assert_eq!(etcd.create_revision(&key), Some(t2.get() as i64));
    assert_eq!(m.locks[victim].stats().fences_lock_lost, 1);
    // The others: untouched, then and now.
    let fences = m.fences();
    assert_eq!(fences.len(), 1, "more fences: {fences:?}");
    for (i, l) in m.locks.iter().enumerate().filter(|(i, _)| *i != victim) {
        assert_eq!(l.state(), State::Holding, "lock {i}");
        assert_eq!(l.token(), Some(m.tokens[i]), "lock {i}");
    }
    m.locks[0].session().close().expect("close");
}
