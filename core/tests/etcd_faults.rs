//! Fault cases of the etcd backend against the real test cluster
//! (`scripts/test-etcd.sh`).

#[path = "common/proxy.rs"]
mod proxy;

#[path = "common/etcd.rs"]
mod etcd_cluster;

#[test]
fn cluster_env_and_etcdctl() {
    let Some(cluster) = etcd_cluster::cluster() else {
        return;
    };
    cluster.etcdctl(&["put", "dlock-test/smoke", "1"]);
    assert!(cluster.etcdctl(&["get", "dlock-test/smoke"]).contains('1'));
    cluster.etcdctl_tls(&["put", "dlock-test/smoke", "1"]);
    assert!(cluster.leader() < 3);
}

/// etcdctl through a proxy: served in Pass, cut off in Blackhole.
#[test]
fn etcdctl_through_the_proxy() {
    let Some(cluster) = etcd_cluster::cluster() else {
        return;
    };
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
// The proxy itself, against a tiny echo server (no etcd needed).

mod proxy_tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::{SocketAddr, TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use super::proxy::{Mode, Proxy};

    /// An echo server on a free port; counts the bytes it received.
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
        let p = Proxy::start(up);
        let mut s = connect(&p);
        s.write_all(b"hello").unwrap();
        assert_eq!(read_n(&mut s, 5), b"hello");
        assert_eq!(p.bytes(), (5, 5));
        assert_eq!(p.open(), 1);
        drop(s);
        wait_until("the connection to close", || p.open() == 0);
    }

    #[test]
    fn blackhole_holds_bytes_until_healed() {
        let (up, received) = echo();
        let p = Proxy::start(up);
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
        let p = Proxy::start(up);
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
        let p = Proxy::start(up);
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
        let p = Proxy::start(up);
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
        let p = Proxy::start(dead);
        let mut s = connect(&p);
        let mut buf = [0u8; 1];
        assert!(matches!(s.read(&mut buf), Ok(0) | Err(_)));
    }
}
