//! The etcd backend against the test cluster of `scripts/etcd-cluster.sh`:
//! ignored by a plain `cargo test` (never counted as passed);
//! `scripts/test-etcd.sh` runs them with `--ignored`, and then a missing
//! cluster fails them (see [`dlock_testkit::etcd::cluster`]).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Certificate, Client as Etcd, ConnectOptions, EventType, Identity, TlsOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tokio::time::{Instant as TokioInstant, timeout};

use super::watch::WATCH_AFTER;
use super::{EtcdBackend, EtcdConfig};
use crate::backend::Bounds;
use crate::backend::{Backend, KeyGone, LockGone};
use crate::lock_key;
use crate::machine::{LeaseId, Token};
use crate::sync::lock;

/// The bounds of the default options (a 2 s keepalive timeout, 1 s retries).
const BOUNDS: Bounds = Bounds {
    timeout: Duration::from_secs(2),
    retry: Duration::from_secs(1),
};
use dlock_testkit::etcd::Cluster;

/// Tests that stop a member, compact the history or count the
/// cluster's requests run alone; the others share the cluster.
static CLUSTER: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The bound on every wait for an event.
const WAIT: Duration = Duration::from_secs(30);

struct Fixture {
    cluster: Cluster,
    backend: EtcdBackend,
    /// A plain client, for what an operator would do.
    raw: Etcd,
    endpoints: Vec<String>,
    /// Names under it are this test run's own.
    prefix: String,
}

/// The backend on the test cluster's plaintext members; fails the test
/// when there is no cluster.
async fn fixture(test: &str) -> Fixture {
    let cluster = dlock_testkit::etcd::cluster();
    let endpoints = cluster.members.clone();
    let mut config = EtcdConfig::new(endpoints.clone());
    config.connect_timeout = Duration::from_secs(1);
    config.request_timeout = Duration::from_secs(2);
    let backend = EtcdBackend::new(&config).unwrap();
    backend.connect_first().await.unwrap();
    let raw = Etcd::connect(&endpoints, None).await.unwrap();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Fixture {
        cluster,
        backend,
        raw,
        endpoints,
        prefix: format!("dlock-test/{test}/{}-{nanos}", std::process::id()),
    }
}

/// The identity the raw grants of these tests record.
static ANON: std::sync::LazyLock<crate::Identity> =
    std::sync::LazyLock::new(|| crate::Identity::of_process(&Default::default()));

impl Fixture {
    async fn lease(&self) -> LeaseId {
        self.backend
            .grant(Duration::from_secs(120), BOUNDS, Some(&ANON))
            .await
            .unwrap()
            .lease
    }

    /// Locks `n` names under `lease`: token → (name, key).
    async fn lock_many(&self, lease: LeaseId, n: usize) -> HashMap<Token, (String, String)> {
        let mut set = tokio::task::JoinSet::new();
        let workers = 32.min(n.max(1));
        for w in 0..workers {
            let b = self.backend.clone();
            let prefix = self.prefix.clone();
            set.spawn(async move {
                let mut out = vec![];
                for i in (w..n).step_by(workers) {
                    let name = format!("{prefix}/k{i}");
                    let t = b.lock(&name, lease, false).await.unwrap();
                    out.push((t, (name.clone(), lock_key(&name, lease))));
                }
                out
            });
        }
        let mut all = HashMap::new();
        while let Some(r) = set.join_next().await {
            all.extend(r.unwrap());
        }
        assert_eq!(all.len(), n, "tokens are unique");
        all
    }

    /// The create revision of `key`, if it exists.
    async fn key_rev(&mut self, key: &str) -> Option<i64> {
        let r = self.raw.get(key, None).await.unwrap();
        r.kvs().first().map(|kv| kv.create_revision())
    }

    /// A plain delete (an operator's `etcdctl del`).
    async fn delete(&mut self, key: &str) {
        let r = self.raw.delete(key, None).await.unwrap();
        assert_eq!(r.deleted(), 1, "{key} was there to delete");
    }
}

async fn recv(rx: &mut UnboundedReceiver<KeyGone>) -> KeyGone {
    timeout(WAIT, rx.recv())
        .await
        .expect("no key reported gone in time")
        .expect("the report channel closed")
}

/// Asserts nothing more is reported for a while.
async fn quiet(rx: &mut UnboundedReceiver<KeyGone>) {
    if let Ok(g) = timeout(Duration::from_secs(1), rx.recv()).await {
        panic!("unexpected report {g:?}");
    }
}

/// Polls `f` once.
async fn poll_once<F: Future + Unpin>(f: &mut F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        Poll::Ready(match Pin::new(&mut *f).poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

/// `grpc_server_started_total` of `method` summed over the members
/// (their `/metrics`).
async fn started(endpoints: &[String], method: &str) -> u64 {
    let mut total = 0;
    for e in endpoints {
        let host = e.trim_start_matches("http://").trim_end_matches('/');
        let mut c = tokio::net::TcpStream::connect(host).await.unwrap();
        c.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut body = String::new();
        c.read_to_string(&mut body).await.unwrap();
        let tag = format!("grpc_method=\"{method}\"");
        total += body
            .lines()
            .filter(|l| l.starts_with("grpc_server_started_total{") && l.contains(&tag))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
            .sum::<u64>();
    }
    total
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_unlock_with_a_token_deletes_only_that_acquisition() {
    let _shared = CLUSTER.read().await;
    let mut f = fixture("unlock-token").await;
    let lease = f.lease().await;
    let name = format!("{}/a", f.prefix);
    let key = lock_key(&name, lease);
    let t1 = f.backend.lock(&name, lease, false).await.unwrap();
    assert_eq!(f.key_rev(&key).await, Some(t1.0 as i64));
    f.backend.unlock(&name, lease, Some(t1)).await.unwrap();
    assert_eq!(f.key_rev(&key).await, None);
    let t2 = f.backend.lock(&name, lease, false).await.unwrap();
    assert!(t2 > t1);
    // A late release of the first acquisition leaves the second alone.
    f.backend.unlock(&name, lease, Some(t1)).await.unwrap();
    assert_eq!(f.key_rev(&key).await, Some(t2.0 as i64));
    f.backend.unlock(&name, lease, Some(t2)).await.unwrap();
    assert_eq!(f.key_rev(&key).await, None);
    // Absent: still Ok.
    f.backend.unlock(&name, lease, Some(t2)).await.unwrap();
    f.backend.unlock(&name, lease, None).await.unwrap();
    f.backend.revoke(lease).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_unlock_without_a_token_lands_after_a_dropped_lock_request() {
    let _shared = CLUSTER.read().await;
    let mut f = fixture("unlock-race").await;
    let lease = f.lease().await;
    for n in 0..20 {
        let name = format!("{}/r{n}", f.prefix);
        let key = lock_key(&name, lease);
        // What lands on the key, in order.
        let mut w = f.raw.watch(key.as_str(), None).await.unwrap();
        let created = timeout(WAIT, w.message()).await.unwrap().unwrap().unwrap();
        assert!(created.created());
        let mut request = f.backend.lock(&name, lease, false);
        // One poll sends the lock request on its way; then the caller
        // gives up on it and releases.
        assert!(poll_once(&mut request).await.is_none());
        drop(request);
        f.backend.unlock(&name, lease, None).await.unwrap();
        // The put, then the delete; a put landing last shows as no
        // second event (the delete found nothing).
        let mut seen = vec![];
        while seen.len() < 2 {
            match timeout(Duration::from_secs(3), w.message()).await {
                Ok(m) => seen.extend(m.unwrap().unwrap().events().iter().map(|e| e.event_type())),
                Err(_) => break,
            }
        }
        assert_eq!(
            seen,
            [EventType::Put, EventType::Delete],
            "round {n}: the lock request must land before the release"
        );
        assert_eq!(f.key_rev(&key).await, None, "round {n}: a key was left");
    }
    assert!(lock(&f.backend.0.puts).is_empty(), "no entry left behind");
    f.backend.revoke(lease).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_tells_a_deleted_key_from_a_lost_lease() {
    // Alone: counts the cluster's Watch streams.
    let _alone = CLUSTER.write().await;
    let mut f = fixture("watch-200").await;
    let lease = f.lease().await;
    let held = f.lock_many(lease, 200).await;
    let streams = started(&f.endpoints, "Watch").await;
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    for (t, (name, _)) in &held {
        watch.add(name, *t);
    }
    // An operator deletes one key.
    let (&victim, (_, vkey)) = held.iter().nth(17).unwrap();
    let vkey = vkey.clone();
    f.delete(&vkey).await;
    assert_eq!(
        recv(&mut rx).await,
        KeyGone {
            token: victim,
            why: LockGone::KeyDeleted
        }
    );
    let asked = f.backend.0.why_asked.load(Ordering::Relaxed);
    assert_eq!(asked, 1);
    // The lease goes: every other key with it, each reported once.
    f.backend.revoke(lease).await.unwrap();
    let mut lost = HashSet::new();
    while lost.len() < held.len() - 1 {
        let g = recv(&mut rx).await;
        assert_eq!(g.why, LockGone::LeaseLost, "{g:?}");
        assert!(held.contains_key(&g.token) && g.token != victim, "{g:?}");
        assert!(lost.insert(g.token), "{g:?} reported twice");
    }
    quiet(&mut rx).await;
    let lookups = f.backend.0.why_asked.load(Ordering::Relaxed) - asked;
    assert!(lookups <= 3, "{lookups} lease lookups for one revocation");
    // Every watcher on one stream.
    assert_eq!(started(&f.endpoints, "Watch").await - streams, 1);
    drop(watch);
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_reports_neither_removed_keys_nor_twice() {
    let _shared = CLUSTER.read().await;
    let mut f = fixture("watch-remove").await;
    let lease = f.lease().await;
    let names: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| format!("{}/{n}", f.prefix))
        .collect();
    let mut tokens = vec![];
    for n in &names {
        tokens.push(f.backend.lock(n, lease, false).await.unwrap());
    }
    let key = |i: usize| lock_key(&names[i], lease);
    // d is deleted before it is watched: the watch starts at its token.
    f.delete(&key(3)).await;
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    for (n, t) in names.iter().zip(&tokens) {
        watch.add(n, *t);
    }
    watch.add(&names[0], tokens[0]); // twice: one watcher
    watch.remove(tokens[1]);
    watch.remove(Token(1)); // unknown: ignored
    f.delete(&key(1)).await;
    f.delete(&key(0)).await;
    f.delete(&key(2)).await;
    let mut got = HashSet::new();
    for _ in 0..3 {
        let g = recv(&mut rx).await;
        assert_eq!(g.why, LockGone::KeyDeleted, "{g:?}");
        assert!(got.insert(g.token), "{g:?} reported twice");
    }
    assert_eq!(got, HashSet::from([tokens[0], tokens[2], tokens[3]]));
    quiet(&mut rx).await;
    f.backend.revoke(lease).await.unwrap();
    // Nothing left to report.
    quiet(&mut rx).await;
    drop(watch);
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_reopens_on_an_abandoned_endpoint() {
    let _shared = CLUSTER.read().await;
    let mut f = fixture("watch-abandon").await;
    let lease = f.lease().await;
    let held = f.lock_many(lease, 20).await;
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    for (t, (name, _)) in &held {
        watch.add(name, *t);
    }
    let mut order: Vec<_> = held.iter().map(|(t, (_, k))| (*t, k.clone())).collect();
    order.sort();
    // The stream is open once a delete is reported.
    f.delete(&order[0].1).await;
    assert_eq!(recv(&mut rx).await.token, order[0].0);
    for (round, (token, key)) in order.iter().enumerate().take(4).skip(1) {
        // Every endpoint abandoned (as a timed-out call does): the
        // stream moves wherever it is, all its watchers with it.
        for i in 0..f.endpoints.len() {
            f.backend.fail(i);
        }
        f.delete(key).await;
        assert_eq!(
            recv(&mut rx).await,
            KeyGone {
                token: *token,
                why: LockGone::KeyDeleted
            },
            "round {round}"
        );
    }
    quiet(&mut rx).await;
    drop(watch);
    f.backend.revoke(lease).await.unwrap();
}

/// Stops a process until dropped.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Stopped {
        assert_eq!(
            unsafe { libc::kill(pid, libc::SIGSTOP) },
            0,
            "SIGSTOP {pid}"
        );
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_misses_no_delete_while_its_member_hangs() {
    let _alone = CLUSTER.write().await;
    let mut f = fixture("watch-member").await;
    let lease = f.lease().await;
    let held = f.lock_many(lease, 20).await;
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    for (t, (name, _)) in &held {
        watch.add(name, *t);
    }
    let mut order: Vec<_> = held.iter().map(|(t, (_, k))| (*t, k.clone())).collect();
    order.sort();
    f.delete(&order[0].1).await;
    assert_eq!(recv(&mut rx).await.token, order[0].0);
    // The stream opened on the current endpoint (nothing failed since).
    let i = f.backend.current();
    let stopped = Stopped::new(f.cluster.pid(i));
    // Deleted while the stream hangs on the stopped member: the next
    // stream must find it in the history.
    let others: Vec<&String> = (0..f.endpoints.len())
        .filter(|&j| j != i)
        .map(|j| &f.endpoints[j])
        .collect();
    let mut raw = Etcd::connect(others, None).await.unwrap();
    let deadline = TokioInstant::now() + WAIT;
    loop {
        match timeout(
            Duration::from_secs(2),
            raw.delete(order[1].1.as_str(), None),
        )
        .await
        {
            Ok(Ok(r)) => {
                assert_eq!(r.deleted(), 1);
                break;
            }
            other => {
                assert!(TokioInstant::now() < deadline, "delete failed: {other:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(
        recv(&mut rx).await,
        KeyGone {
            token: order[1].0,
            why: LockGone::KeyDeleted
        }
    );
    drop(stopped);
    // Still watching, elsewhere.
    f.raw = raw;
    f.delete(&order[2].1).await;
    assert_eq!(recv(&mut rx).await.token, order[2].0);
    quiet(&mut rx).await;
    drop(watch);
    f.backend.revoke(lease).await.unwrap();
    // The member back before the next test.
    let mut m = Etcd::connect([&f.endpoints[i]], None).await.unwrap();
    timeout(WAIT, async {
        while m.status().await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_reads_keys_back_after_a_compaction() {
    let _alone = CLUSTER.write().await;
    let mut f = fixture("watch-compact").await;
    let lease = f.lease().await;
    let a = format!("{}/a", f.prefix);
    let b = format!("{}/b", f.prefix);
    let ta = f.backend.lock(&a, lease, false).await.unwrap();
    let tb = f.backend.lock(&b, lease, false).await.unwrap();
    f.delete(&lock_key(&b, lease)).await;
    // History compacted past both tokens and b's delete (etcd keeps the
    // revision compacted at): both watchers are canceled; a reads back
    // alive, b gone.
    let scratch = format!("{}/scratch", f.prefix);
    let put = f.raw.put(scratch.as_str(), "", None).await.unwrap();
    f.raw
        .compact(put.header().unwrap().revision(), None)
        .await
        .unwrap();
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    watch.add(&a, ta);
    watch.add(&b, tb);
    assert_eq!(
        recv(&mut rx).await,
        KeyGone {
            token: tb,
            why: LockGone::KeyDeleted
        }
    );
    quiet(&mut rx).await;
    assert_eq!(f.backend.0.read_back.load(Ordering::Relaxed), 2);
    // a is watched again, from after the read.
    f.delete(&lock_key(&a, lease)).await;
    assert_eq!(
        recv(&mut rx).await,
        KeyGone {
            token: ta,
            why: LockGone::KeyDeleted
        }
    );
    drop(watch);
    f.backend.revoke(lease).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_acquire_and_release_cost_one_txn_each() {
    let _alone = CLUSTER.write().await;
    let f = fixture("cost").await;
    let lease = f.lease().await;
    let (tx, _rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    let name = format!("{}/one", f.prefix);
    // Warm: the watch stream open.
    let t0 = f.backend.lock(&name, lease, false).await.unwrap();
    watch.add(&name, t0);
    watch.remove(t0);
    f.backend.unlock(&name, lease, Some(t0)).await.unwrap();
    let methods = ["Txn", "Range", "DeleteRange", "Put", "LeaseTimeToLive"];
    let mut before = vec![];
    for m in methods {
        before.push(started(&f.endpoints, m).await);
    }
    let t = f.backend.lock(&name, lease, false).await.unwrap();
    watch.add(&name, t);
    watch.remove(t);
    f.backend.unlock(&name, lease, Some(t)).await.unwrap();
    let mut after = vec![];
    for m in methods {
        after.push(started(&f.endpoints, m).await);
    }
    let spent: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(spent, [2, 0, 0, 0, 0], "requests by method {methods:?}");
    drop(watch);
    f.backend.revoke(lease).await.unwrap();
}

/// A key released within WATCH_AFTER costs no watcher; one held longer
/// gets one, and a delete made before it started is still reported.
#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_watches_only_keys_held_past_watch_after() {
    let _alone = CLUSTER.write().await;
    let mut f = fixture("watch-after").await;
    let lease = f.lease().await;
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    let backend = f.backend.clone();
    let creates = || backend.0.creates.load(Ordering::Relaxed);
    let name = format!("{}/short", f.prefix);
    let before = creates();
    for _ in 0..20 {
        let t = f.backend.lock(&name, lease, false).await.unwrap();
        watch.add(&name, t);
        // Held while the watch's task runs (it shares this runtime),
        // released well within WATCH_AFTER.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        watch.remove(t);
        f.backend.unlock(&name, lease, Some(t)).await.unwrap();
    }
    tokio::time::sleep(WATCH_AFTER * 5).await;
    assert_eq!(creates(), before, "short holds created watchers");
    // Held: deleted at once by an operator, before its watcher exists.
    let name = format!("{}/held", f.prefix);
    let t = f.backend.lock(&name, lease, false).await.unwrap();
    watch.add(&name, t);
    f.delete(&lock_key(&name, lease)).await;
    let g = recv(&mut rx).await;
    assert_eq!((g.token, g.why), (t, LockGone::KeyDeleted));
    assert_eq!(creates(), before + 1, "one watcher for the held key");
    drop(watch);
    f.backend.revoke(lease).await.unwrap();
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_scales_to_10k_keys_on_one_stream() {
    let _alone = CLUSTER.write().await;
    let f = fixture("watch-10k").await;
    let n: usize = std::env::var("DLOCK_TEST_WATCH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let lease = f.lease().await;
    let start = TokioInstant::now();
    let held = f.lock_many(lease, n).await;
    eprintln!("{n} keys locked in {:?}", start.elapsed());
    let streams = started(&f.endpoints, "Watch").await;
    let (tx, mut rx) = unbounded_channel();
    let watch = f.backend.watch_keys(lease, BOUNDS, tx);
    for (t, (name, _)) in &held {
        watch.add(name, *t);
    }
    // One more key, deleted: once it is reported, every watcher before
    // it on the stream is in place.
    let last = format!("{}/last", f.prefix);
    let t = f.backend.lock(&last, lease, false).await.unwrap();
    let start = TokioInstant::now();
    watch.add(&last, t);
    f.backend.unlock(&last, lease, None).await.unwrap();
    assert_eq!(recv(&mut rx).await.token, t);
    eprintln!("{n} watchers created in {:?}", start.elapsed());
    let start = TokioInstant::now();
    f.backend.revoke(lease).await.unwrap();
    let mut lost = HashSet::new();
    while lost.len() < n {
        let g = recv(&mut rx).await;
        assert_eq!(g.why, LockGone::LeaseLost, "{g:?}");
        assert!(held.contains_key(&g.token), "{g:?}");
        assert!(lost.insert(g.token), "{g:?} reported twice");
    }
    eprintln!("{n} keys reported lost in {:?}", start.elapsed());
    quiet(&mut rx).await;
    let lookups = f.backend.0.why_asked.load(Ordering::Relaxed) - 1;
    assert!(lookups <= 3, "{lookups} lease lookups for one revocation");
    assert_eq!(started(&f.endpoints, "Watch").await - streams, 1);
    drop(watch);
}

#[tokio::test]
#[ignore = "needs the etcd cluster: scripts/test-etcd.sh"]
async fn etcd_key_watch_adds_keys_after_its_auth_token_expired() {
    let _shared = CLUSTER.read().await;
    // The TLS member, with client certificates and user auth.
    let f = fixture("watch-auth").await;
    let Cluster {
        tls_endpoint: endpoint,
        ca,
        cert,
        key,
        user,
        password,
        auth_token_ttl,
        ..
    } = f.cluster.clone();
    let mut config = EtcdConfig::new([endpoint.clone()]);
    config.ca_file = Some(ca.clone());
    config.cert_file = Some(cert.clone());
    config.key_file = Some(key.clone());
    config.user = Some(user.clone());
    config.password = Some(password.clone());
    let b = EtcdBackend::new(&config).unwrap();
    b.connect_first().await.unwrap();
    // The operator, with a connection (and token) of its own.
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(&ca).unwrap()))
        .identity(Identity::from_pem(
            std::fs::read(&cert).unwrap(),
            std::fs::read(&key).unwrap(),
        ));
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_user(user, password)
        .with_auto_token_refresh(true);
    let mut raw = Etcd::connect([endpoint], Some(options)).await.unwrap();
    let lease = b
        .grant(Duration::from_secs(120), BOUNDS, Some(&ANON))
        .await
        .unwrap()
        .lease;
    let prefix = format!("dlock-test/watch-auth/{}", std::process::id());
    let (a, c) = (format!("{prefix}/a"), format!("{prefix}/c"));
    let ta = b.lock(&a, lease, false).await.unwrap();
    let tc = b.lock(&c, lease, false).await.unwrap();
    let (tx, mut rx) = unbounded_channel();
    let watch = b.watch_keys(lease, BOUNDS, tx);
    watch.add(&a, ta);
    raw.delete(lock_key(&a, lease), None).await.unwrap();
    // Reported: the stream is open.
    assert_eq!(recv(&mut rx).await.token, ta);
    // The token the stream (and the backend) authenticated with
    // expires: a time, no event to wait for.
    tokio::time::sleep(auth_token_ttl + Duration::from_secs(1)).await;
    // Nothing of the backend's refreshes it but the watch itself.
    watch.add(&c, tc);
    raw.delete(lock_key(&c, lease), None).await.unwrap();
    assert_eq!(
        recv(&mut rx).await,
        KeyGone {
            token: tc,
            why: LockGone::KeyDeleted
        }
    );
    // Re-opened, not read back in a loop.
    assert_eq!(b.0.read_back.load(Ordering::Relaxed), 0);
    drop(watch);
    b.revoke(lease).await.unwrap();
}
