//! Metrics under real faults (issue 22): a holder on the real 3-member test
//! cluster (`scripts/test-etcd.sh`) behind one fault proxy per member. A
//! blip moves `dlock_drains_total` and `dlock_resumes_total`; a cut moves
//! `dlock_fences_total{reason="deadline"}` and fills
//! `dlock_fence_lateness_seconds`; an operator's `etcdctl del` of the key
//! shows `reason="lock_lost"`. Read through the client's snapshot, as every
//! face's exporter reads it. About 15 s.
//!
//! Settings: TTL 4 s, keepalive every 1 s, keepalive timeout 0.5 s, retry
//! every 0.25 s, margin 1 s.

use std::time::{Duration, Instant};

use dlock::metrics::Value;
use dlock::{Client, EtcdConfig, Options, State, Token};

use dlock_testkit::etcd as etcd_cluster;
use dlock_testkit::proxy::{Mode, Proxy};

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(20);

fn options() -> Options {
    dlock_testkit::options(Duration::from_secs(4), true)
}

/// The value of the series of `name` with label values `labels` (a
/// histogram's count).
fn value(c: &Client, name: &str, labels: &[&str]) -> f64 {
    let fs = c.snapshot().families();
    let f = fs
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name}"));
    for (l, v) in &f.series {
        if l.iter().map(String::as_str).eq(labels.iter().copied()) {
            return match v {
                Value::Number(n) => *n,
                Value::Histogram(h) => h.count as f64,
            };
        }
    }
    panic!("{name}{labels:?}: no such series in {:?}", f.series)
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + EVENT;
    while !f() {
        assert!(Instant::now() < until, "{what}: not within {EVENT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The key under which `token` holds `name` (its create_revision is the
/// token), as an operator finds it.
fn lock_key(cluster: &etcd_cluster::Cluster, name: &str, token: Token) -> String {
    let out = cluster.etcdctl(&["get", "--prefix", &format!("{name}/"), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("etcdctl json");
    let kv = v["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|kv| kv["create_revision"].as_u64() == Some(token.get()))
        .unwrap_or_else(|| panic!("no key of {name} with create_revision {token}: {out}"));
    let lease = kv["lease"].as_i64().expect("lease id");
    format!("{name}/{lease:x}")
}

#[test]
fn a_blip_a_cut_and_an_operators_delete_move_the_metrics() {
    let cluster = etcd_cluster::cluster();
    let proxies: Vec<Proxy> = (0..cluster.members.len())
        .map(|i| Proxy::start(cluster.member_addr(i)))
        .collect();
    let set = |m: Mode| proxies.iter().for_each(|p| p.set(m));
    let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
    let c = Client::etcd(EtcdConfig::new(urls), options()).expect("connects");
    let name = format!(
        "dlock-metrics/{}-{}",
        std::process::id(),
        dlock::clock::system_now().as_nanos()
    );
    let lock = c.lock(&name).expect("lock handle");
    let (fenced_tx, fenced_rx) = std::sync::mpsc::channel();
    lock.on_fence(move |t, _| {
        let _ = fenced_tx.send(t);
    });
    let token = lock.acquire(EVENT).expect("acquires");
    assert_eq!(value(&c, "dlock_lock_held", &[&name]), 1.0);
    eventually("a confirmed keepalive", || {
        value(&c, "dlock_keepalives_total", &["ok"]) >= 1.0
    });

    // A blip: replies lost until the holder drains, then back.
    set(Mode::DropReplies);
    eventually("drained", || lock.state() == State::Draining);
    set(Mode::Pass);
    eventually("resumed", || lock.state() == State::Holding);
    assert_eq!(value(&c, "dlock_drains_total", &[]), 1.0);
    assert_eq!(value(&c, "dlock_resumes_total", &[]), 1.0);
    assert!(value(&c, "dlock_keepalives_total", &["failed"]) >= 1.0);
    assert_eq!(value(&c, "dlock_fences_total", &["deadline"]), 0.0);

    // A cut: nothing through until the deadline fences.
    set(Mode::Blackhole);
    let fenced = fenced_rx
        .recv_timeout(EVENT)
        .expect("on_fence at the deadline");
    assert_eq!(fenced, token);
    assert_eq!(value(&c, "dlock_fences_total", &["deadline"]), 1.0);
    eventually("the lateness observed", || {
        value(&c, "dlock_fence_lateness_seconds", &[]) == 1.0
    });
    set(Mode::Pass);
    eventually("reacquired after the heal", || {
        lock.state() == State::Holding && lock.token().is_some_and(|t| t > token)
    });
    assert_eq!(value(&c, "dlock_acquisitions_total", &[]), 2.0);

    // An operator deletes the key.
    let again = lock.token().expect("holding");
    let key = lock_key(&cluster, &name, again);
    cluster.etcdctl(&["del", &key]);
    assert_eq!(
        fenced_rx.recv_timeout(EVENT).expect("on_fence for the key"),
        again
    );
    assert_eq!(value(&c, "dlock_fences_total", &["lock_lost"]), 1.0);
    assert_eq!(value(&c, "dlock_fences_total", &["deadline"]), 1.0);
    eventually("two lateness observations", || {
        value(&c, "dlock_fence_lateness_seconds", &[]) == 2.0
    });
    let _ = lock.release();
}
