//! examples/c/worker on the etcd test cluster, fenced by an operator: the
//! test starts the worker, waits for two guarded commits in its typed output
//! (`DLOCK_STORY=json`), deletes the lock key with `etcdctl del`, and checks
//! the story: the fence at once (lock_lost), etcd refusing a late write
//! under the old token, a clean stop; etcd keeps the last unit committed
//! before the fence.
//!
//! A `test = false` target: `scripts/test-c-etcd.sh` builds the worker and
//! runs this by name with `DLOCK_C_WORKER` naming the binary and the
//! cluster's env (target/etcd/env) exported; without them it fails.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock_testkit::etcd as etcd_cluster;
use dlock_testkit::story;

const RESULT_KEY: &str = "examples/worker-result";

#[test]
fn worker_on_etcd_is_fenced_by_etcdctl_del() {
    let bin = std::env::var_os("DLOCK_C_WORKER")
        .expect("DLOCK_C_WORKER names the C worker binary (scripts/test-c-etcd.sh builds it)");
    let cluster = etcd_cluster::Cluster::from_env();
    cluster.etcdctl(&["del", RESULT_KEY]);
    let mut child = Command::new(&bin)
        // cargo test puts target/debug/deps first on the library path: the
        // worker must load the release libdlock.so it was linked with.
        .env_remove("LD_LIBRARY_PATH")
        .env("DLOCK_ENDPOINTS", cluster.members.join(","))
        .env("DLOCK_STORY", "json")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.to_string_lossy()));
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            println!("{line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    // The worker works 40 units (8 s) unless fenced; it should be fenced
    // right after the delete.
    let end = Instant::now() + Duration::from_secs(30);
    let (mut out, mut commits, mut deleted) = (String::new(), 0, false);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                if line.starts_with('{') && line.contains(r#""event":"commit""#) {
                    commits += 1;
                }
                out.push_str(&line);
                out.push('\n');
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                panic!("the worker did not finish in 30 s; its story:\n{out}");
            }
        }
        if commits >= 2 && !deleted {
            let n = cluster.etcdctl(&["del", "--prefix", "examples/worker/"]);
            println!(
                "etcdctl del --prefix examples/worker/ (the lock key): {}",
                n.trim()
            );
            deleted = true;
        }
    }
    let status = child.wait().expect("wait for the worker");
    assert!(status.success(), "the worker exited with {status}");
    assert!(deleted, "the worker stopped before 2 commits:\n{out}");

    let committed = story::c_worker_etcd(&story::Events::parse(&out));
    let stored = cluster.etcdctl(&["get", RESULT_KEY, "--print-value-only"]);
    assert_eq!(
        stored.trim_end(),
        committed,
        "etcd keeps the last unit committed before the fence"
    );
    println!("etcd holds '{committed}', the last unit committed before the fence");
}
