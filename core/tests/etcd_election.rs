//! Elections on the real cluster (`scripts/test-etcd.sh` runs this
//! `test = false` target by name; without `DLOCK_TEST_ETCD` every test
//! fails): interop both ways with `etcdctl elect` and `etcdctl elect -l`,
//! a leader cut off by the fault proxy fences at least the margin before
//! the next one is elected, an observer says NoLeader once the leader's
//! lease expired (where `etcdctl elect -l`, Go's `Observe`, says nothing),
//! resign with a unit in flight, proclaim refused once fenced or resigned.
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, retry 250 ms,
//! margin 1 s.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use dlock::clock::system_now;
use dlock::{Client, Error, EtcdConfig, Observed, Observer, Options, State};

use dlock_testkit::TTL;
use dlock_testkit::etcd::{Cluster, cluster};
use dlock_testkit::proxy::{Mode, Proxy};

mod election_cases;

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(20);

fn client(env: &Cluster) -> Client {
    env.client(dlock_testkit::backend_options())
}

/// A client whose every connection goes through one proxy per member.
fn proxied(env: &Cluster) -> (Client, Vec<Proxy>) {
    let proxies: Vec<Proxy> = (0..env.members.len())
        .map(|i| Proxy::start(env.member_addr(i)))
        .collect();
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let c = Client::etcd(EtcdConfig::new(urls), dlock_testkit::backend_options())
        .expect("connect through the proxies");
    (c, proxies)
}

/// An election name of this run only.
fn name(test: &str) -> String {
    format!(
        "dlock-test/elect-{test}-{}-{}",
        std::process::id(),
        system_now().as_nanos()
    )
}

/// `etcdctl elect ARGS`, its stdout lines on a channel.
struct Etcdctl {
    child: Child,
    /// Each line with the instant it was read.
    lines: Receiver<(std::time::Instant, String)>,
}

impl Etcdctl {
    fn spawn(env: &Cluster, args: &[&str]) -> Etcdctl {
        let mut child = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", env.members.join(",")))
            .arg("--dial-timeout=2s")
            .arg("elect")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcdctl runs");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((std::time::Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        Etcdctl { child, lines }
    }

    fn line(&self, within: Duration) -> Option<String> {
        self.line_at(within).map(|(_, l)| l)
    }

    fn line_at(&self, within: Duration) -> Option<(std::time::Instant, String)> {
        self.lines.recv_timeout(within).ok()
    }

    /// SIGINT: `etcdctl elect` resigns and exits.
    fn interrupt(mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn next(o: &mut Observer) -> Observed {
    o.recv_blocking(Some(EVENT))
        .expect("an observer event")
        .expect("the observer is live")
}

/// The create revision of `key`.
fn create_revision(env: &Cluster, key: &str) -> u64 {
    let out = env.etcdctl(&["get", key, "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["kvs"][0]["create_revision"]
        .as_u64()
        .expect("the key exists")
}

#[test]
fn dlock_campaigns_while_etcdctl_leads_and_observes_it() {
    let env = cluster();
    let name = name("after-etcdctl");
    let ctl = Etcdctl::spawn(&env, &[&name, "ctl-value"]);
    // etcdctl prints its key (then its value) once elected.
    let key = ctl.line(EVENT).expect("etcdctl elected");
    assert!(key.starts_with(&format!("{name}/")), "{key}");
    let ctl_rev = create_revision(&env, &key);

    let c = client(&env);
    let mut obs = c.observe(&name).unwrap();
    match next(&mut obs) {
        Observed::Leader(l) => {
            assert_eq!(l.key, key);
            assert_eq!(l.value, b"ctl-value");
            assert_eq!(l.token.get(), ctl_rev);
        }
        other => panic!("expected etcdctl's leader, got {other:?}"),
    }
    let e = c.election(&name).unwrap();
    assert_eq!(
        e.campaign(b"dlock", Duration::from_secs(2)),
        Err(Error::Timeout)
    );
    // A campaign in progress while etcdctl resigns.
    let waiting = std::thread::spawn(move || {
        let t = e.campaign(b"dlock", EVENT);
        (e, t)
    });
    std::thread::sleep(Duration::from_millis(300));
    ctl.interrupt();
    let (e, token) = waiting.join().unwrap();
    let token = token.expect("elected once etcdctl resigned");
    assert!(token.get() > ctl_rev);
    // The observer: etcdctl's leader went, dlock's came (never etcdctl's
    // again).
    loop {
        match next(&mut obs) {
            Observed::Leader(l) if l.token == token => {
                assert_eq!(l.value, b"dlock");
                break;
            }
            Observed::Leader(l) => assert_ne!(l.token.get(), ctl_rev, "{l:?}"),
            Observed::NoLeader | Observed::Reconnecting => {}
            other => panic!("{other:?}"),
        }
    }
    e.resign(Duration::ZERO).unwrap();
}

#[test]
fn etcdctl_sees_dlocks_leader_and_values_and_waits_for_its_resign() {
    let env = cluster();
    let name = name("etcdctl-after");
    let c = client(&env);
    let e = c.election(&name).unwrap();
    let token = e.campaign(b"d1", Duration::from_secs(5)).unwrap();
    let key = dlock::lock_key(&name, c.default_session().lease().unwrap());
    assert_eq!(create_revision(&env, &key), token.get());

    let listen = Etcdctl::spawn(&env, &["-l", &name]);
    assert_eq!(listen.line(EVENT).as_deref(), Some(key.as_str()));
    assert_eq!(listen.line(EVENT).as_deref(), Some("d1"));
    e.proclaim(b"d2").unwrap();
    assert_eq!(listen.line(EVENT).as_deref(), Some(key.as_str()));
    assert_eq!(listen.line(EVENT).as_deref(), Some("d2"));
    assert_eq!(e.token(), Some(token), "a proclaim keeps the token");
    assert_eq!(create_revision(&env, &key), token.get());

    // etcdctl campaigns and waits while dlock leads, with a unit in flight
    // through the resignation: the key goes only once the unit ended.
    let ctl = Etcdctl::spawn(&env, &[&name, "ctl"]);
    assert_eq!(ctl.line(Duration::from_millis(1500)), None, "etcdctl led");
    let unit = e.permit_owned().unwrap();
    let (done_tx, done) = mpsc::channel();
    let resigner = std::thread::spawn(move || {
        e.resign(Duration::from_secs(60)).unwrap();
        done_tx.send(system_now()).unwrap();
        e
    });
    assert_eq!(
        ctl.line(Duration::from_millis(1500)),
        None,
        "etcdctl elected while a unit was in flight"
    );
    assert!(done.try_recv().is_err());
    let ended = system_now();
    unit.end();
    let ctl_key = ctl.line(EVENT).expect("etcdctl elected after the resign");
    assert!(done.recv_timeout(EVENT).unwrap() >= ended);
    assert!(create_revision(&env, &ctl_key) > token.get());
    let e = resigner.join().unwrap();
    assert_eq!(e.proclaim(b"late"), Err(Error::NotHeld));
    ctl.interrupt();
}

#[test]
fn a_leader_cut_off_fences_at_least_the_margin_before_the_next_is_elected() {
    let env = cluster();
    let (lc, proxies) = proxied(&env);
    let leader = election_cases::a_leader_cut_off_fences_the_margin_before_the_next_is_elected(
        &lc,
        &|| client(&env),
        &name("cut-off"),
        &|mode| proxies.iter().for_each(|p| p.set(mode)),
        "",
        EVENT,
    );
    leader.close().unwrap();
}

#[test]
fn an_observer_says_no_leader_once_the_leaders_lease_expired_where_etcdctl_is_silent() {
    let env = cluster();
    let name = name("no-leader");
    let (lc, proxies) = proxied(&env);
    let leader = lc.election(&name).unwrap();
    let t1 = leader.campaign(b"only", Duration::from_secs(5)).unwrap();
    let oc = client(&env);
    let mut obs = oc.observe(&name).unwrap();
    assert!(matches!(next(&mut obs), Observed::Leader(l) if l.token == t1));
    let listen = Etcdctl::spawn(&env, &["-l", &name]);
    assert!(listen.line(EVENT).is_some_and(|k| k.starts_with(&name)));
    assert_eq!(listen.line(EVENT).as_deref(), Some("only"));

    let cut = system_now();
    for p in &proxies {
        p.set(Mode::Blackhole);
    }
    assert_eq!(next(&mut obs), Observed::NoLeader);
    let took = system_now().saturating_since(cut);
    assert!(took <= TTL + Duration::from_secs(3), "{took:?}");
    assert_ne!(leader.state(), State::Holding);
    // Go's Observe (etcdctl elect -l) reports nothing when the leader goes.
    assert_eq!(listen.line(Duration::from_secs(1)), None);
    for p in &proxies {
        p.set(Mode::Pass);
    }
    leader.close().unwrap();
}

/// Issue 32, 6: the longest name with the longest value fits etcd's
/// default request limit: the campaign and a proclaim succeed (the old
/// limit, 1.5 MiB − 4 KiB, made etcd answer "request is too large" to
/// names over about 560 bytes, and the campaign retried until its
/// timeout); a value over the limit is refused before anything is sent.
#[test]
fn the_longest_name_with_the_longest_value_fits_etcd() {
    let env = cluster();
    let c = client(&env);
    let prefix = name("longest");
    let long = format!("{prefix}{}", "n".repeat(dlock::MAX_NAME_LEN - prefix.len()));
    let e = c.election(&long).unwrap();
    let max = vec![b'v'; dlock::election::MAX_VALUE_LEN];
    let started = std::time::Instant::now();
    e.campaign(&max, Duration::from_secs(10))
        .expect("the largest campaign fits etcd's request limit");
    e.proclaim(&max).expect("so does the largest proclaim");
    let over = vec![b'v'; dlock::election::MAX_VALUE_LEN + 1];
    let err = e.proclaim(&over).unwrap_err();
    assert_eq!(err.code(), "invalid_argument", "{err}");
    assert!(err.to_string().contains("1048576"), "{err}");
    e.resign(Duration::ZERO).unwrap();
    let other = c.election(&format!("{long:.1000}-x")).unwrap();
    let err = other.campaign(&over, Duration::from_secs(10)).unwrap_err();
    assert_eq!(err.code(), "invalid_argument", "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn proclaim_from_a_fenced_leader_is_refused() {
    let env = cluster();
    let name = name("fenced-proclaim");
    let c = Client::etcd(
        EtcdConfig::new(env.members.clone()),
        Options {
            reacquire: false,
            ..dlock_testkit::backend_options()
        },
    )
    .unwrap();
    let e = c.election(&name).unwrap();
    let t = e.campaign(b"v", Duration::from_secs(5)).unwrap();
    let key = dlock::lock_key(&name, c.default_session().lease().unwrap());
    env.etcdctl(&["del", &key]);
    let until = std::time::Instant::now() + EVENT;
    while e.state() != State::Fenced && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(e.state(), State::Fenced);
    assert_eq!(e.proclaim(b"w"), Err(Error::Fenced(t.get())));
    // Nothing was written: the key stays gone.
    assert_eq!(env.etcdctl(&["get", &key, "--print-value-only"]).trim(), "");
}

/// Figure, beside `etcdctl elect -l` in the same run: from the start of a
/// proclaim to each observer's report of its value (both include the
/// proclaim's round trip; etcdctl's line is timed by its reader thread as
/// it arrives), over 50 proclaims. Checks only that every value is
/// reported, in order.
#[test]
fn observer_latency_beside_etcdctl_elect_listen() {
    let env = cluster();
    let name = name("latency");
    let c = client(&env);
    let e = c.election(&name).unwrap();
    e.campaign(b"v0", Duration::from_secs(5)).unwrap();
    let mut obs = client(&env).observe(&name).unwrap();
    assert!(matches!(next(&mut obs), Observed::Leader(_)));
    let listen = Etcdctl::spawn(&env, &["-l", &name]);
    assert!(listen.line(EVENT).is_some());
    assert_eq!(listen.line(EVENT).as_deref(), Some("v0"));
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for i in 1..=50 {
        let value = format!("v{i}");
        let start = std::time::Instant::now();
        e.proclaim(value.as_bytes()).unwrap();
        match next(&mut obs) {
            Observed::Proclaimed(l) => assert_eq!(l.value, value.as_bytes()),
            other => panic!("{other:?}"),
        }
        ours.push(start.elapsed());
        // etcdctl prints the key, then the value.
        assert!(listen.line(EVENT).is_some());
        let (at, line) = listen.line_at(EVENT).expect("etcdctl's value");
        assert_eq!(line, value);
        theirs.push(at.saturating_duration_since(start));
    }
    let pct = |v: &mut Vec<Duration>, p: usize| {
        v.sort();
        v[(v.len() * p / 100).min(v.len() - 1)]
    };
    println!(
        "ELECTION|observer latency (proclaim start -> event, 50 proclaims): dlock p50 {:?} p99 {:?}; etcdctl elect -l p50 {:?} p99 {:?}",
        pct(&mut ours, 50),
        pct(&mut ours, 99),
        pct(&mut theirs, 50),
        pct(&mut theirs, 99)
    );
    e.resign(Duration::ZERO).unwrap();
}
