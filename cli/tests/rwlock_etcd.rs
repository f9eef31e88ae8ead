//! `dlock run --read NAME -- CMD` (read/write locks, issue 30) on the
//! 3-member test cluster (scripts/test-cli.sh starts it and runs this by
//! name): two readers run at once (each sees the other's mark before it
//! ends, and `DLOCK_MODE=read`); a writer (a plain `dlock run --try NAME`)
//! is refused while they hold (exit 120) and runs once they are gone.

use dlock_testkit::etcd as etcd_cluster;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_cluster::Cluster;

const BIN: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("DLOCK_ENDPOINTS", c.members.join(",")).args(args);
    cmd
}

fn until(what: &str, cond: impl Fn() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < end, "never: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A reader that writes its mode to `dir/<me>`, then waits (at most 20 s)
/// for `dir/<other>` and `dir/go`.
fn reader(c: &Cluster, name: &str, dir: &Path, me: &str, other: &str) -> Child {
    let d = dir.display();
    let script = format!(
        "echo \"$DLOCK_MODE\" > {d}/{me}; i=0; \
         while [ ! -e {d}/{other} ] || [ ! -e {d}/go ]; do \
           sleep 0.05; i=$((i+1)); [ $i -gt 400 ] && exit 9; done; exit 0"
    );
    dlock(c, &["run", "--read", name, "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("dlock run --read")
}

#[test]
fn readers_run_at_once_and_a_writer_waits_for_them() {
    let c = etcd_cluster::cluster();
    let name = dlock_testkit::fresh("cli-rw");
    let dir = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&dir).unwrap();
    let a = reader(&c, &name, &dir, "a", "b");
    let b = reader(&c, &name, &dir, "b", "a");
    until("both readers run", || {
        dir.join("a").exists() && dir.join("b").exists()
    });
    for who in ["a", "b"] {
        let mode = std::fs::read_to_string(dir.join(who)).unwrap();
        assert_eq!(mode.trim(), "read", "DLOCK_MODE of {who}");
    }
    let refused = dlock(&c, &["run", "--try", &name, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(
        refused.status.code(),
        Some(120),
        "a writer while readers hold: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    std::fs::write(dir.join("go"), "").unwrap();
    for (who, child) in [("a", a), ("b", b)] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "reader {who}: {:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let writer = dlock(&c, &["run", "--timeout", "10s", &name, "--", "true"])
        .output()
        .unwrap();
    assert!(
        writer.status.success(),
        "the writer runs once they are gone"
    );
    // --read and -n do not go together (usage).
    let usage = dlock(&c, &["run", "--read", "-n", "2", &name, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}
