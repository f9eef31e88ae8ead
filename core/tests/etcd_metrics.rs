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

use dlock::{Client, EtcdConfig, Options, State};

use dlock_testkit::etcd as etcd_cluster;
use dlock_testkit::metric;
use dlock_testkit::proxy::{Mode, Proxy};

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(20);

fn options() -> Options {
    dlock_testkit::options(Duration::from_secs(4), true)
}

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + EVENT;
    while !f() {
        assert!(Instant::now() < until, "{what}: not within {EVENT:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
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
    assert_eq!(metric(&c, "dlock_lock_held", &[&name]), 1.0);
    eventually("a confirmed keepalive", || {
        metric(&c, "dlock_keepalives_total", &["ok"]) >= 1.0
    });

    // A blip: replies lost until the holder drains, then back.
    set(Mode::DropReplies);
    eventually("drained", || lock.state() == State::Draining);
    set(Mode::Pass);
    eventually("resumed", || lock.state() == State::Holding);
    assert_eq!(metric(&c, "dlock_drains_total", &[]), 1.0);
    assert_eq!(metric(&c, "dlock_resumes_total", &[]), 1.0);
    assert!(metric(&c, "dlock_keepalives_total", &["failed"]) >= 1.0);
    assert_eq!(metric(&c, "dlock_fences_total", &["deadline"]), 0.0);

    // A cut: nothing through until the deadline fences.
    set(Mode::Blackhole);
    let fenced = fenced_rx
        .recv_timeout(EVENT)
        .expect("on_fence at the deadline");
    assert_eq!(fenced, token);
    assert_eq!(metric(&c, "dlock_fences_total", &["deadline"]), 1.0);
    eventually("the lateness observed", || {
        metric(&c, "dlock_fence_lateness_seconds", &[]) == 1.0
    });
    set(Mode::Pass);
    eventually("reacquired after the heal", || {
        lock.state() == State::Holding && lock.token().is_some_and(|t| t > token)
    });
    assert_eq!(metric(&c, "dlock_acquisitions_total", &[]), 2.0);

    // An operator deletes the key.
    let again = lock.token().expect("holding");
    let (_, key) = cluster.lock_key(&name, again);
    cluster.etcdctl(&["del", &key]);
    assert_eq!(
        fenced_rx.recv_timeout(EVENT).expect("on_fence for the key"),
        again
    );
    assert_eq!(metric(&c, "dlock_fences_total", &["lock_lost"]), 1.0);
    assert_eq!(metric(&c, "dlock_fences_total", &["deadline"]), 1.0);
    eventually("two lateness observations", || {
        metric(&c, "dlock_fence_lateness_seconds", &[]) == 2.0
    });
    let _ = lock.release();
}
