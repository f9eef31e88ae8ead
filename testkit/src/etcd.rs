//! The etcd test cluster of `scripts/etcd-cluster.sh`, read from the
//! environment (`target/etcd/env`), and the one switch that says it exists:
//! `DLOCK_TEST_ETCD=1` (written by the env file).
//!
//! An etcd test is never run and counted as passed without a cluster: it is
//! left out of a plain `cargo test` (a `test = false` target run by name, or
//! `#[ignore]`), and once run it starts with [`cluster()`], which fails it
//! when `DLOCK_TEST_ETCD` is unset. `scripts/test-etcd.sh` (and the other
//! scripts that start the cluster) source the env file and run them.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// The running test cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Client URLs of the plaintext members m1, m2, m3, in that order.
    pub members: Vec<String>,
    /// Their pids, same order (kept current by [`Cluster::restart_member`]).
    pub pids: Vec<i32>,
    /// The single TLS member (client-certificate auth and etcd user auth).
    pub tls_endpoint: String,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub user: String,
    pub password: String,
    /// How long an auth token of the TLS member lives.
    pub auth_token_ttl: Duration,
    /// `scripts/etcd-cluster.sh`, for restarting members.
    pub script: PathBuf,
}

/// Whether the test cluster exists (`DLOCK_TEST_ETCD` is set and not
/// empty): the one switch of every etcd test in every language.
pub fn present() -> bool {
    std::env::var_os("DLOCK_TEST_ETCD").is_some_and(|v| !v.is_empty())
}

/// The test cluster; panics (fails the test) when there is none, so a
/// missing cluster can never pass as a skipped test.
pub fn cluster() -> Cluster {
    assert!(
        present(),
        "no etcd test cluster (DLOCK_TEST_ETCD is unset): run scripts/test-etcd.sh, or `scripts/etcd-cluster.sh start` and `source target/etcd/env`"
    );
    Cluster::from_env()
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is unset: source target/etcd/env (scripts/etcd-cluster.sh start)")
    })
}

impl Cluster {
    /// Reads the `DLOCK_TEST_*` variables; panics naming a missing one.
    pub fn from_env() -> Cluster {
        let list = |s: String| -> Vec<String> { s.split(',').map(str::to_owned).collect() };
        let members = list(var("DLOCK_TEST_MEMBERS"));
        assert_eq!(members.len(), 3, "DLOCK_TEST_MEMBERS lists 3 members");
        let pids = list(var("DLOCK_TEST_PIDS"))
            .iter()
            .map(|p| p.parse().expect("DLOCK_TEST_PIDS holds pids"))
            .collect();
        let ttl = std::env::var("DLOCK_TEST_AUTH_TOKEN_TTL").map_or(3, |s| {
            s.parse().expect("DLOCK_TEST_AUTH_TOKEN_TTL is seconds")
        });
        let script = std::env::var("DLOCK_TEST_CLUSTER_SCRIPT").map_or_else(
            |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/etcd-cluster.sh"),
            PathBuf::from,
        );
        Cluster {
            members,
            pids,
            tls_endpoint: var("DLOCK_TEST_TLS_ENDPOINT"),
            ca: var("DLOCK_TEST_CA").into(),
            cert: var("DLOCK_TEST_CERT").into(),
            key: var("DLOCK_TEST_KEY").into(),
            user: var("DLOCK_TEST_USER"),
            password: var("DLOCK_TEST_PASSWORD"),
            auth_token_ttl: Duration::from_secs(ttl),
            script,
        }
    }

    /// The socket address of member `i` (0-based).
    pub fn member_addr(&self, i: usize) -> SocketAddr {
        let url = &self.members[i];
        let hostport = url.split_once("://").map_or(url.as_str(), |(_, r)| r);
        hostport
            .trim_end_matches('/')
            .parse()
            .unwrap_or_else(|e| panic!("member URL {url}: {e}"))
    }

    /// Runs `etcdctl` against the plaintext members; returns its stdout,
    /// panics with its stderr when it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        run_etcdctl(&[&format!("--endpoints={}", self.members.join(","))], args)
    }

    /// The lease and the key under which `token` holds `name` (the queued
    /// key whose create_revision is the token), as an operator finds them.
    pub fn lock_key(&self, name: &str, token: dlock::Token) -> (i64, String) {
        let out = self.etcdctl(&["get", "--prefix", &format!("{name}/"), "-w", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("etcdctl json");
        let kv = v["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|kv| kv["create_revision"].as_u64() == Some(token.get()))
            .unwrap_or_else(|| panic!("no key of {name} with create_revision {token}: {out}"));
        let lease = kv["lease"].as_i64().expect("lease id");
        (lease, format!("{name}/{lease:x}"))
    }

    /// `etcdctl` on the plaintext members, to spawn (a watch, a held
    /// `etcdctl lock`).
    pub fn etcdctl_cmd(&self) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.members.join(",")))
            .arg("--dial-timeout=2s");
        c
    }

    /// A client of the plaintext members with `options`.
    pub fn client(&self, options: dlock::Options) -> dlock::Client {
        dlock::Client::etcd(dlock::EtcdConfig::new(self.members.clone()), options)
            .expect("connect to etcd")
    }

    /// Runs `etcdctl` against the TLS member as the root user.
    pub fn etcdctl_tls(&self, args: &[&str]) -> String {
        let tls = [
            format!("--endpoints={}", self.tls_endpoint),
            format!("--cacert={}", self.ca.display()),
            format!("--cert={}", self.cert.display()),
            format!("--key={}", self.key.display()),
            format!("--user={}:{}", self.user, self.password),
        ];
        let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
        run_etcdctl(&tls, args)
    }

    /// The pid of member `i` (0-based) now: read again from the env file,
    /// which `etcd-cluster.sh restart-member` keeps current (another test of
    /// this process may have restarted the member).
    pub fn pid(&self, i: usize) -> i32 {
        let fresh = std::env::var("DLOCK_TEST_ENV_FILE")
            .ok()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|env| {
                env.lines()
                    .find_map(|l| l.strip_prefix("export DLOCK_TEST_PIDS="))
                    .and_then(|p| p.split(',').nth(i)?.trim().parse().ok())
            });
        fresh.unwrap_or(self.pids[i])
    }

    /// Whether member `i` (0-based) answers a health check.
    pub fn member_healthy(&self, i: usize) -> bool {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--dial-timeout=1s", "--command-timeout=2s"])
            .arg(format!("--endpoints={}", self.members[i]))
            .args(["endpoint", "health"])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    /// The index (0-based) of the current leader of m1..m3.
    pub fn leader(&self) -> usize {
        let out = self.script(&["leader"]);
        let n: usize = out
            .trim()
            .parse()
            .expect("etcd-cluster.sh leader prints 1..3");
        n - 1
    }

    /// Makes member `i` (0-based) the leader (`etcdctl move-leader`) and
    /// waits until it is.
    pub fn move_leader(&self, i: usize) {
        let name = format!("m{}", i + 1);
        let list = self.etcdctl(&["member", "list", "-w", "simple"]);
        let id = list
            .lines()
            .map(|l| l.split(", ").collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&name.as_str()))
            .map(|f| f[0].to_owned())
            .unwrap_or_else(|| panic!("no member {name} in {list}"));
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while self.leader() != i {
            assert!(
                std::time::Instant::now() < end,
                "{name} did not become the leader"
            );
            // Fails while an election is on; then try again.
            let _ = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args(["--dial-timeout=2s", "--command-timeout=5s"])
                .arg(format!("--endpoints={}", self.members.join(",")))
                .args(["move-leader", &id])
                .output();
        }
    }

    /// Kills member `i` (0-based) if it runs, also when stopped, starts it
    /// again on its data and waits until it is healthy.
    pub fn restart_member(&mut self, i: usize) {
        let out = self.script(&["restart-member", &(i + 1).to_string()]);
        self.pids[i] = out
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .expect("restart-member prints the new pid");
    }

    fn script(&self, args: &[&str]) -> String {
        let out = Command::new(&self.script)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", self.script.display()));
        assert!(
            out.status.success(),
            "etcd-cluster.sh {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn run_etcdctl(conn: &[&str], args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .args(conn)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("etcdctl: {e} (scripts/etcd-cluster.sh installs it)"));
    assert!(
        out.status.success(),
        "etcdctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// How many times each fault case runs: `DLOCK_FAULT_RUNS` (default 3).
pub fn fault_runs() -> usize {
    std::env::var("DLOCK_FAULT_RUNS").map_or(3, |s| {
        s.parse()
            .ok()
            .filter(|&n| n > 0)
            .expect("DLOCK_FAULT_RUNS is a count > 0")
    })
}
