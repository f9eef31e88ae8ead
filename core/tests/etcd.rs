//! The etcd backend against a real cluster: tokens, exclusion with
//! `etcdctl lock`, operator faults (lease revoked, key deleted),
//! reacquisition, guarded writes, TLS / mTLS / auth / re-auth.
//!
//! Needs the cluster of `scripts/etcd-cluster.sh` (run
//! `scripts/test-etcd.sh`, which runs this `test = false` target by name);
//! without `DLOCK_TEST_ETCD` every test fails.

use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use dlock::{Client, Error, EtcdConfig, Options, Reason, State, Token};

use dlock_testkit::etcd as etcd_cluster;
// This binary uses only a part of the proxy.
use dlock_testkit::proxy;
use etcd_cluster::{Cluster, cluster};

/// TTL 4 s, keepalive every 1 s, timeout 0.5 s, retry 250 ms, margin 1 s.
fn short() -> Options {
    Options {
        ttl: Duration::from_secs(4),
        keepalive_interval: Duration::from_secs(1),
        keepalive_timeout: Duration::from_millis(500),
        retry_interval: Duration::from_millis(250),
        margin: Duration::from_secs(1),
        reacquire: true,
    }
}

fn client(env: &Cluster) -> Client {
    env.client(short())
}

/// A lock name of this run only.
fn name(test: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("dlock-test/{test}-{}-{t}", std::process::id())
}

/// The lock keys under `name/` as (key, create_revision, lease), oldest first.
fn lock_keys(env: &Cluster, name: &str) -> Vec<(String, u64, i64)> {
    let out = env.etcdctl(&["get", "--prefix", &format!("{name}/"), "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut keys: Vec<(String, u64, i64)> = v["kvs"]
        .as_array()
        .map(|a| a.to_vec())
        .unwrap_or_default()
        .iter()
        .map(|kv| {
            let key = base64_decode(kv["key"].as_str().unwrap());
            (
                String::from_utf8(key).unwrap(),
                kv["create_revision"].as_u64().unwrap(),
                kv["lease"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    keys.sort_by_key(|k| k.1);
    keys
}

/// Waits (up to 10 s) until `n` keys queue under `name/`; returns them.
fn wait_keys(env: &Cluster, name: &str, n: usize) -> Vec<(String, u64, i64)> {
    let until = dlock::clock::system_now() + Duration::from_secs(10);
    loop {
        let keys = lock_keys(env, name);
        if keys.len() == n {
            return keys;
        }
        assert!(
            dlock::clock::system_now() < until,
            "expected {n} keys under {name}/, got {keys:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut buf, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|&c| c != b'=') {
        let v = A.iter().position(|&a| a == c).expect("base64") as u32;
        buf = (buf << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buf >> bits) as u8);
        }
    }
    out
}

/// Waits for `rx` up to `d`.
fn within<T>(rx: &mpsc::Receiver<T>, d: Duration) -> Option<T> {
    rx.recv_timeout(d).ok()
}

/// Fences as (token, instant of the callback).
fn watch_fences(lock: &dlock::Lock) -> mpsc::Receiver<(Token, dlock::Instant)> {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    lock.on_fence(move |t, _| {
        let _ = tx.lock().unwrap().send((t, dlock::clock::system_now()));
    });
    rx
}

fn watch_reasons(lock: &dlock::Lock) -> mpsc::Receiver<Reason> {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    lock.on_state_change(move |c| {
        if c.to == State::Fenced {
            let _ = tx.lock().unwrap().send(c.reason);
        }
    });
    rx
}

fn acquired(lock: &dlock::Lock) -> mpsc::Receiver<Token> {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    lock.on_acquired(move |t| {
        let _ = tx.lock().unwrap().send(t);
    });
    rx
}

#[test]
fn token_is_the_lock_keys_create_revision() {
    let env = cluster();
    let name = name("token");
    let lock = client(&env).lock(&name).unwrap();
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let keys = lock_keys(&env, &name);
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(keys[0].1, token.get());
    assert!(keys[0].0.starts_with(&format!("{name}/")));
    assert_eq!(keys[0].0, format!("{name}/{:x}", keys[0].2));
    assert!(lock.permit().is_ok());
    lock.release().unwrap();
    assert!(
        lock_keys(&env, &name).is_empty(),
        "release revokes the lease"
    );
}

#[test]
fn keepalives_hold_the_lock_past_its_ttl() {
    let env = cluster();
    let name = name("hold");
    let lock = client(&env).lock(&name).unwrap();
    let fences = watch_fences(&lock);
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_secs(6));
    assert!(fences.try_recv().is_err(), "fenced while healthy");
    assert_eq!(lock.state(), State::Holding);
    assert_eq!(lock_keys(&env, &name)[0].1, token.get());
    lock.release().unwrap();
}

#[test]
fn first_endpoints_dead_the_next_one_serves() {
    let env = cluster();
    let mut eps = vec!["127.0.0.1:1".to_string()];
    eps.extend(env.members.iter().cloned());
    let mut config = EtcdConfig::new(eps);
    config.connect_timeout = Duration::from_millis(300);
    let lock = Client::etcd(config, short())
        .unwrap()
        .lock(&name("failover"))
        .unwrap();
    lock.acquire(Duration::from_secs(5)).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(lock.state(), State::Holding);
    lock.release().unwrap();
}

#[test]
fn try_acquire_is_busy_then_release_lets_the_contender_in() {
    let env = cluster();
    let name = name("busy");
    let (a, b) = (
        client(&env).lock(&name).unwrap(),
        client(&env).lock(&name).unwrap(),
    );
    let ta = a.acquire(Duration::from_secs(5)).unwrap();
    assert_eq!(b.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(lock_keys(&env, &name).len(), 1, "a busy try leaves no key");
    assert_eq!(b.acquire(Duration::from_millis(1500)), Err(Error::Timeout));

    let b = std::sync::Arc::new(b);
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || b.acquire(Duration::from_secs(10)))
    };
    wait_keys(&env, &name, 2);
    a.release().unwrap();
    let tb = waiter.join().unwrap().unwrap();
    assert!(tb > ta, "{tb} > {ta}");
    assert_eq!(a.try_acquire(), Err(Error::WouldBlock));
    b.release().unwrap();
    let ta2 = a.try_acquire().unwrap();
    assert!(ta2 > tb);
    a.release().unwrap();
}

/// A waiting holder whose connection is reset retries (the machine's
/// LockFailed path) and keeps its key, so its place in the queue and its
/// token: the key's create_revision from before the reset.
#[test]
fn a_waiting_lock_keeps_its_place_when_its_connection_resets() {
    let env = cluster();
    let name = name("wait-reset");
    let a = client(&env).lock(&name).unwrap();
    let ta = a.acquire(Duration::from_secs(5)).unwrap();
    let p = proxy::Proxy::start(env.member_addr(0));
    let b = Client::etcd(EtcdConfig::new([p.url()]), short())
        .unwrap()
        .lock(&name)
        .unwrap();
    let fences = watch_fences(&b);
    let b = std::sync::Arc::new(b);
    let waiter = {
        let b = b.clone();
        std::thread::spawn(move || b.acquire(Duration::from_secs(20)))
    };
    let queued = wait_keys(&env, &name, 2)[1].clone();
    for _ in 0..3 {
        p.reset();
        std::thread::sleep(Duration::from_millis(700));
    }
    let keys = lock_keys(&env, &name);
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[1], queued, "the waiter kept its key");
    assert_eq!(b.state(), State::Acquiring);
    a.release().unwrap();
    let tb = waiter.join().unwrap().unwrap();
    assert_eq!(
        tb.get(),
        queued.1,
        "token = the queued key's create_revision"
    );
    assert!(tb > ta);
    assert!(fences.try_recv().is_err());
    b.release().unwrap();
}

#[test]
fn etcdctl_lock_waits_for_a_dlock_holder() {
    let env = cluster();
    let name = name("ctl-waits");
    let lock = client(&env).lock(&name).unwrap();
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let mut ctl: Child = {
        let mut c = env.etcdctl_cmd();
        c.args(["lock", &name, "echo", "etcdctl-got-it"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c.spawn().unwrap()
    };
    wait_keys(&env, &name, 2);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        ctl.try_wait().unwrap().is_none(),
        "etcdctl took a held lock"
    );
    let keys = lock_keys(&env, &name);
    assert_eq!(keys.len(), 2, "etcdctl queued behind us: {keys:?}");
    assert_eq!(keys[0].1, token.get());
    lock.release().unwrap();
    let out = ctl.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("etcdctl-got-it"));
}

#[test]
fn dlock_waits_for_an_etcdctl_holder() {
    let env = cluster();
    let name = name("dlock-waits");
    let mut ctl = {
        let mut c = env.etcdctl_cmd();
        c.args(["lock", &name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c.spawn().unwrap()
    };
    // etcdctl prints its key once it holds the lock.
    let mut first = String::new();
    {
        use std::io::BufRead;
        let out = ctl.stdout.as_mut().unwrap();
        std::io::BufReader::new(out).read_line(&mut first).unwrap();
    }
    assert!(first.starts_with(&name), "{first}");
    let lock = client(&env).lock(&name).unwrap();
    assert_eq!(lock.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(lock.acquire(Duration::from_secs(2)), Err(Error::Timeout));
    let ctl_rev = lock_keys(&env, &name)[0].1;
    let _ = Command::new("kill")
        .args(["-INT", &ctl.id().to_string()])
        .status();
    let token = lock.acquire(Duration::from_secs(10)).unwrap();
    let _ = ctl.wait();
    assert!(token.get() > ctl_rev);
    lock.release().unwrap();
}

#[test]
fn lease_revoked_by_an_operator_fences_within_one_keepalive() {
    let env = cluster();
    let name = name("revoked");
    let lock = client(&env).lock(&name).unwrap();
    let fences = watch_fences(&lock);
    let reasons = watch_reasons(&lock);
    let again = acquired(&lock);
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    assert_eq!(within(&again, Duration::from_secs(1)), Some(token));
    let lease = lock_keys(&env, &name)[0].2;
    let cut = dlock::clock::system_now();
    env.etcdctl(&["lease", "revoke", &format!("{lease:x}")]);
    let (t, at) = within(&fences, Duration::from_secs(3)).expect("no fence");
    assert_eq!(t, token);
    let took = at.saturating_since(cut);
    let bound = short().keepalive_interval + short().keepalive_timeout;
    assert!(
        took < bound,
        "fenced {took:?} after the revoke (bound {bound:?})"
    );
    // The watch sees the key go and the backend finds the lease gone too.
    let reason = within(&reasons, Duration::from_secs(1)).unwrap();
    assert_eq!(reason, Reason::LeaseLost);
    println!("lease revoked: fenced after {took:?} ({reason})");
    let t2 = within(&again, Duration::from_secs(5)).expect("no reacquisition");
    assert!(t2 > token);
    assert_eq!(lock.state(), State::Holding);
    lock.release().unwrap();
}

#[test]
fn lock_key_deleted_fences_at_once_and_reacquires_higher() {
    let env = cluster();
    let name = name("deleted");
    let lock = client(&env).lock(&name).unwrap();
    let fences = watch_fences(&lock);
    let reasons = watch_reasons(&lock);
    let again = acquired(&lock);
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    assert_eq!(within(&again, Duration::from_secs(1)), Some(token));
    let key = lock_keys(&env, &name)[0].0.clone();
    let old_lease = lock_keys(&env, &name)[0].2;
    let cut = dlock::clock::system_now();
    env.etcdctl(&["del", &key]);
    let (t, at) = within(&fences, Duration::from_secs(3)).expect("no fence");
    assert_eq!(t, token);
    let took = at.saturating_since(cut);
    assert!(
        took < Duration::from_millis(300),
        "fenced {took:?} after the delete"
    );
    assert_eq!(
        within(&reasons, Duration::from_secs(1)),
        Some(Reason::LockLost)
    );
    println!("lock key deleted: fenced after {took:?}");
    let t2 = within(&again, Duration::from_secs(5)).expect("no reacquisition");
    assert!(t2 > token, "{t2} > {token}");
    let keys = lock_keys(&env, &name);
    assert_eq!(keys.len(), 1, "{keys:?}");
    // Only the key went: the session's lease lives on, and the lock is
    // taken again under it (design §23).
    assert_eq!(keys[0].2, old_lease, "reacquired under the session's lease");
    lock.release().unwrap();
    assert!(
        lock_keys(&env, &name).is_empty(),
        "released: the key is gone"
    );
    let leases = env.etcdctl(&["lease", "list"]);
    assert!(leases.contains(&format!("{old_lease:x}")), "{leases}");
}

/// The watch of the lock key re-opens after its stream fails: a key deleted
/// after the holder's connection was reset still fences at once.
#[test]
fn the_watch_survives_a_reset_connection() {
    let env = cluster();
    let name = name("watch-reset");
    let p = proxy::Proxy::start(env.member_addr(0));
    let config = EtcdConfig::new([p.url(), env.members[1].clone()]);
    let lock = Client::etcd(config, short()).unwrap().lock(&name).unwrap();
    let fences = watch_fences(&lock);
    let reasons = watch_reasons(&lock);
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    p.reset();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(fences.try_recv().is_err(), "a reset fenced");
    let key = lock_keys(&env, &name)[0].0.clone();
    let cut = dlock::clock::system_now();
    env.etcdctl(&["del", &key]);
    let (t, at) = within(&fences, Duration::from_secs(3)).expect("no fence");
    assert_eq!(t, token);
    let took = at.saturating_since(cut);
    assert!(
        took < Duration::from_millis(300),
        "fenced {took:?} after the delete"
    );
    assert_eq!(
        within(&reasons, Duration::from_secs(1)),
        Some(Reason::LockLost)
    );
    lock.release().unwrap();
}

#[test]
fn guarded_writes_commit_while_held_and_are_fenced_after() {
    let env = cluster();
    let name = name("guarded");
    let data = format!("{name}-data");
    let lock = client(&env).lock(&name).unwrap();
    let again = acquired(&lock);
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let _ = within(&again, Duration::from_secs(1));
    lock.guarded_put(token, data.as_bytes(), b"v1").unwrap();
    let get = |env: &Cluster| env.etcdctl(&["get", "--print-value-only", &data]);
    assert_eq!(get(&env).trim(), "v1");
    lock.guarded_delete(token, data.as_bytes()).unwrap();
    assert_eq!(get(&env).trim(), "");
    assert_eq!(
        lock.guarded_put(Token(token.get() + 1000), data.as_bytes(), b"x"),
        Err(Error::Fenced(token.get() + 1000))
    );

    // An operator deletes the lock key: the old token's writes are refused,
    // the new token's go through. (The fence revoked the old lease, so the
    // backend refuses its token before asking the server.)
    let key = lock_keys(&env, &name)[0].0.clone();
    env.etcdctl(&["del", &key]);
    let t2 = within(&again, Duration::from_secs(5)).expect("no reacquisition");
    assert_eq!(
        lock.guarded_put(token, data.as_bytes(), b"stale"),
        Err(Error::Fenced(token.get()))
    );
    assert_eq!(
        lock.guarded_delete(token, data.as_bytes()),
        Err(Error::Fenced(token.get()))
    );
    assert_eq!(get(&env).trim(), "");
    lock.guarded_put(t2, data.as_bytes(), b"v2").unwrap();
    assert_eq!(get(&env).trim(), "v2");
    lock.release().unwrap();
    assert_eq!(
        lock.guarded_put(t2, data.as_bytes(), b"after release"),
        Err(Error::Fenced(t2.get()))
    );
    env.etcdctl(&["del", &data]);
}

/// The server itself refuses a stale token: the key is deleted while the
/// holder's replies are delayed, so the holder still believes it holds when
/// it sends the write; etcd's transaction finds no lock key with that
/// token and commits nothing. (The reply's delay proves the answer came
/// from the server: the backend's own check answers at once.)
#[test]
fn the_server_refuses_a_stale_token_the_holder_still_believes_in() {
    let env = cluster();
    let name = name("guarded-server");
    let data = format!("{name}-data");
    let p = proxy::Proxy::start(env.member_addr(0));
    // Long enough timeouts that a 1.5 s reply delay neither drains nor fences.
    let patient = Options {
        ttl: Duration::from_secs(10),
        keepalive_interval: Duration::from_secs(4),
        keepalive_timeout: Duration::from_secs(3),
        retry_interval: Duration::from_secs(1),
        margin: Duration::from_secs(1),
        reacquire: false,
    };
    let lock = Client::etcd(EtcdConfig::new([p.url()]), patient)
        .unwrap()
        .lock(&name)
        .unwrap();
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let key = lock_keys(&env, &name)[0].0.clone();
    let delay = Duration::from_millis(1500);
    p.set(proxy::Mode::Delay(delay));
    env.etcdctl(&["del", &key]);
    let sent = std::time::Instant::now();
    assert_eq!(
        lock.guarded_put(token, data.as_bytes(), b"stale"),
        Err(Error::Fenced(token.get()))
    );
    let took = sent.elapsed();
    assert!(
        took >= delay - Duration::from_millis(100),
        "refused after {took:?}: by the client, not by etcd"
    );
    assert_eq!(
        env.etcdctl(&["get", "--print-value-only", &data]).trim(),
        ""
    );
    p.set(proxy::Mode::Pass);
    let _ = lock.release();
}

/// A write etcd would refuse (a value above its 1.5 MiB request limit) is
/// refused by the core before anything is sent (`InvalidArgument` naming
/// `MAX_VALUE_LEN`, issue 32 item 6), at once, and leaves the holder's
/// endpoint and lock alone. (etcd's own "request is too large", on a
/// cluster with a smaller `--max-request-bytes`, is final too:
/// `etcd::conn::tests::a_request_too_large_is_final`.)
#[test]
fn a_refused_guarded_write_fails_at_once() {
    let env = cluster();
    let name = name("refused");
    let lock = client(&env).lock(&name).unwrap();
    let fences = watch_fences(&lock);
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let big = vec![b'x'; 1600 * 1024];
    let started = std::time::Instant::now();
    match lock.guarded_put(token, format!("{name}-data").as_bytes(), &big) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("MAX_VALUE_LEN"), "{m}"),
        other => panic!("expected invalid_argument naming MAX_VALUE_LEN, got {other:?}"),
    }
    let took = started.elapsed();
    // Retried over the endpoints it would take the request timeout (3 s).
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    lock.guarded_put(token, format!("{name}-data").as_bytes(), b"small")
        .unwrap();
    assert!(fences.try_recv().is_err(), "fenced by a refused write");
    assert_eq!(lock.state(), State::Holding);
    lock.release().unwrap();
    env.etcdctl(&["del", &format!("{name}-data")]);
}

/// TLS with a CA, a client certificate, user auth; the auth token expires
/// within seconds and the client authenticates again by itself.
#[test]
fn tls_mtls_auth_and_reauth() {
    let env = cluster();
    let mut config = EtcdConfig::new([env.tls_endpoint.clone()]);
    config.ca_file = Some(env.ca.clone());
    config.cert_file = Some(env.cert.clone());
    config.key_file = Some(env.key.clone());
    config.user = Some(env.user.clone());
    config.password = Some(env.password.clone());

    // Wrong password: a clear backend error.
    let mut bad = config.clone();
    bad.password = Some("wrong".into());
    match Client::etcd(bad, short()) {
        Err(Error::Backend(m)) => println!("wrong password: {m}"),
        other => panic!("expected a backend error, got {:?}", other.map(|_| ())),
    }
    // No client certificate: the member refuses the handshake.
    let mut anon = config.clone();
    anon.cert_file = None;
    anon.key_file = None;
    assert!(matches!(
        Client::etcd(anon, short()),
        Err(Error::Backend(_))
    ));

    let client = Client::etcd(config, short()).unwrap();
    let name = name("tls");
    let a = client.lock(&name).unwrap();
    let fences = watch_fences(&a);
    let token = a.acquire(Duration::from_secs(5)).unwrap();
    a.guarded_put(token, b"dlock-test/tls-data", b"1").unwrap();
    // Past the auth token's TTL: keepalives go on, new requests
    // re-authenticate.
    std::thread::sleep(env.auth_token_ttl + Duration::from_secs(2));
    assert!(fences.try_recv().is_err(), "fenced while healthy");
    a.guarded_put(token, b"dlock-test/tls-data", b"2").unwrap();
    let b = client.lock(&name).unwrap();
    assert_eq!(b.try_acquire(), Err(Error::WouldBlock));
    a.release().unwrap();
    let t2 = b.acquire(Duration::from_secs(5)).unwrap();
    assert!(t2 > token);
    b.guarded_delete(t2, b"dlock-test/tls-data").unwrap();
    b.release().unwrap();
}

/// Issue 32, item 6: the guarded-write limits fit etcd's default request
/// limit: under the longest name, a key of `MAX_KEY_LEN` bytes with a
/// value of `MAX_VALUE_LEN` commits; one byte more of either is refused
/// `InvalidArgument`, naming the limit, before anything is sent.
#[test]
fn guarded_writes_at_the_size_limits_commit_and_over_them_are_refused() {
    use dlock::MAX_KEY_LEN;
    use dlock::election::MAX_VALUE_LEN;
    let env = cluster();
    let prefix = name("sized");
    let long = format!("{prefix}{}", "n".repeat(dlock::MAX_NAME_LEN - prefix.len()));
    let lock = client(&env).lock(&long).unwrap();
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let key =
        format!("{prefix}-data-{}", "k".repeat(MAX_KEY_LEN)).into_bytes()[..MAX_KEY_LEN].to_vec();
    lock.guarded_put(token, &key, &vec![b'v'; MAX_VALUE_LEN])
        .unwrap();
    let mut longer = key.clone();
    longer.push(b'k');
    dlock_testkit::over_the_size_limits_refused(&lock, token, &key, &longer);
}

/// Issue 32, item 6: on a cluster with a smaller `--max-request-bytes`
/// (here a one-member etcd of this test's own, 8 KiB), etcd answers
/// "request is too large" to requests under dlock's limits. That answer is
/// final: a guarded write and a campaign fail at once with
/// `invalid_argument` instead of retrying until their timeout (the
/// campaign retried for its whole 10 s before), and the lock stays held.
#[test]
fn request_too_large_on_a_small_cluster_is_final() {
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (client_port, peer_port) = (free(), free());
    let dir = std::env::temp_dir().join(format!("dlock-small-etcd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let url = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    let mut etcd = Command::new("etcd")
        .args(["--name", "small", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("small={peer}")])
        .args(["--max-request-bytes", "8192"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcd on PATH");
    struct Stop<'a>(&'a mut Child, std::path::PathBuf);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }
    let _stop = Stop(&mut etcd, dir.clone());
    let client = (0..100)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            let c = Client::etcd(EtcdConfig::new([url.clone()]), short()).ok()?;
            c.lock("small/probe").ok()?.try_acquire().ok().map(|_| c)
        })
        .expect("the small etcd starts");
    let lock = client.lock("small/lock").unwrap();
    let token = lock.acquire(Duration::from_secs(5)).unwrap();
    let big = vec![b'v'; 16 * 1024]; // under MAX_VALUE_LEN, over this cluster's limit

    let started = std::time::Instant::now();
    match lock.guarded_put(token, b"small-data", &big) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("too large"), "{m}"),
        other => panic!("expected invalid_argument (too large), got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused after {:?}",
        started.elapsed()
    );
    assert_eq!(lock.state(), State::Holding);
    lock.guarded_put(token, b"small-data", b"small").unwrap();

    let e = client.election("small/election").unwrap();
    let started = std::time::Instant::now();
    match e.campaign(&big, Duration::from_secs(10)) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("too large"), "{m}"),
        other => panic!("expected invalid_argument (too large), got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the campaign gave up only after {took:?}"
    );
    e.campaign(b"small", Duration::from_secs(5))
        .expect("a small campaign still wins");
    e.resign(Duration::ZERO).unwrap();
    lock.release().unwrap();
}

/// The identity key of `lease` as `etcdctl get` sees it: (value, lease),
/// `None` when there is none.
fn identity_record(env: &Cluster, lease: i64) -> Option<(Vec<u8>, i64)> {
    use std::os::unix::ffi::OsStrExt;
    let key = dlock::identity::identity_key(lease);
    let out = env
        .etcdctl_cmd()
        .args(["get", "-w", "json"])
        .arg(std::ffi::OsStr::from_bytes(&key))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kv = v["kvs"].as_array()?.first()?.clone();
    Some((
        base64_decode(kv["value"].as_str().unwrap()),
        kv["lease"].as_i64().unwrap_or(0),
    ))
}

/// Holder identity (issue 31): another client's lock names its holder,
/// from one key beside the lease (outside every lock name, gone with the
/// lease), with no more than the six fields; the lock key is etcd's own.
#[test]
fn holder_names_another_clients_identity() {
    let env = cluster();
    let name = name("identity");
    let config = dlock::ClientConfig::etcd(EtcdConfig::new(env.members.clone()))
        .with_options(short())
        .with_description("batch 7");
    let a = Client::connect(config).unwrap();
    let held = a.lock(&name).unwrap();
    let other = client(&env).lock(&name).unwrap();
    assert_eq!(other.holder().unwrap(), None);
    let token = held.acquire(Duration::from_secs(5)).unwrap();
    let h = other.holder().unwrap().expect("held");
    let lease = held.session().lease().unwrap();
    assert_eq!((h.token, h.lease), (token, lease));
    assert_eq!(h.key, dlock::lock_key(&name, lease));
    let id = h.identity.expect("dlock records its identity");
    assert_eq!(Some(&*id), a.identity());
    assert_eq!(id.description.as_deref(), Some("batch 7"));
    assert_eq!((id.pid, id.face.as_str()), (std::process::id(), "rust"));

    let (value, under) = identity_record(&env, lease).expect("the identity key");
    assert_eq!(under, lease, "the identity key lives under the lease");
    let v: serde_json::Value = serde_json::from_slice(&value).unwrap();
    let mut fields: Vec<&str> = v.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    fields.sort();
    assert_eq!(
        fields,
        ["description", "face", "host", "pid", "started", "version"]
    );
    // The lock key is the one etcdctl lock writes: nothing else under the name.
    let keys = lock_keys(&env, &name);
    assert_eq!(keys, [(h.key.clone(), token.get(), lease)]);
    // `dlock list` over every key: identities are not lock keys; the
    // reader reads this one as `dlock show` prints it.
    let reader = dlock::Reader::connect(dlock::Endpoints::new(env.members.clone())).unwrap();
    let all = reader.lock_keys("").unwrap();
    assert!(all.iter().any(|k| k.key == h.key));
    assert!(
        !all.iter().any(|k| k.key.contains("dlock/holder/")),
        "{all:?}"
    );
    assert_eq!(reader.identity(lease).unwrap().as_ref(), a.identity());

    held.release().unwrap();
    assert_eq!(other.holder().unwrap(), None);
    // The session lives on (its identity with it) until its lease goes.
    assert!(identity_record(&env, lease).is_some());
    a.shutdown();
    assert_eq!(identity_record(&env, lease), None, "gone with the lease");
}

/// An `etcdctl lock` holder records no identity: `holder()` gives its key
/// and lease, `identity` none.
#[test]
fn an_etcdctl_holder_has_a_lease_and_no_identity() {
    let env = cluster();
    let name = name("identity-ctl");
    let mut ctl = {
        let mut c = env.etcdctl_cmd();
        c.args(["lock", &name])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        c.spawn().unwrap()
    };
    let mut first = String::new();
    {
        use std::io::BufRead;
        let out = ctl.stdout.as_mut().unwrap();
        std::io::BufReader::new(out).read_line(&mut first).unwrap();
    }
    let lock = client(&env).lock(&name).unwrap();
    let h = lock.holder().unwrap().expect("etcdctl holds it");
    assert_eq!(h.key, first.trim());
    assert_eq!(h.key, dlock::lock_key(&name, h.lease));
    assert_eq!(h.identity, None);
    let _ = Command::new("kill")
        .args(["-INT", &ctl.id().to_string()])
        .status();
    let _ = ctl.wait();
}
