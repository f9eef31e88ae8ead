//! `dlock elect` on the test cluster (scripts/test-cli.sh runs this
//! `test = false` target by name): CMD runs while leading with
//! `DLOCK_TOKEN`, `dlock elect --observe --json` reports the leader, its
//! end (no-leader) and the next leader; `etcdctl elect -l` sees dlock's
//! leader.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Duration;

use dlock_testkit::etcd::cluster;

const BIN: &str = env!("CARGO_BIN_EXE_dlock");
const EVENT: Duration = Duration::from_secs(20);

struct Proc {
    child: Child,
    out: Receiver<String>,
}

impl Proc {
    fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn");
        let stdout = child.stdout.take().unwrap();
        let (tx, out) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc { child, out }
    }

    fn line(&self) -> String {
        self.out.recv_timeout(EVENT).expect("a line within 20 s")
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.line()).expect("a JSON line")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn elect_runs_cmd_while_leading_and_observers_see_it() {
    let env = cluster();
    let endpoints = env.members.join(",");
    let name = format!("cli-elect-{}", std::process::id());
    let observer = Proc::spawn(Command::new(BIN).env("DLOCK_ENDPOINTS", &endpoints).args([
        "elect",
        "--observe",
        "--json",
        &name,
    ]));
    assert_eq!(observer.json()["event"], "no-leader");

    let mut first = Proc::spawn(
        Command::new(BIN)
            .env("DLOCK_ENDPOINTS", &endpoints)
            .args(["elect", &name, "one", "--", "sh", "-c"])
            .arg("echo token=$DLOCK_TOKEN; exec sleep 60"),
    );
    let token: u64 = first
        .line()
        .strip_prefix("token=")
        .expect("CMD saw DLOCK_TOKEN")
        .parse()
        .unwrap();
    let seen = observer.json();
    assert_eq!(seen["event"], "leader");
    assert_eq!(seen["value"], "one");
    assert_eq!(seen["token"], token);

    // etcdctl elect -l (Go's Observe) sees dlock's leader and value.
    let mut listen = Proc::spawn(
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={endpoints}"))
            .args(["elect", "-l", &name]),
    );
    assert_eq!(listen.line(), seen["key"].as_str().unwrap());
    assert_eq!(listen.line(), "one");

    // A second candidate waits; once the first ends (SIGTERM: dlock ends
    // CMD's group and resigns), it leads with a higher token.
    let mut second = Proc::spawn(
        Command::new(BIN)
            .env("DLOCK_ENDPOINTS", &endpoints)
            .args(["elect", &name, "two", "--", "sh", "-c"])
            .arg("echo token=$DLOCK_TOKEN; exec sleep 60"),
    );
    assert!(
        second.out.recv_timeout(Duration::from_secs(1)).is_err(),
        "the second ran CMD while the first led"
    );
    let _ = Command::new("kill")
        .args(["-TERM", &first.child.id().to_string()])
        .status();
    let status = first.child.wait().unwrap();
    assert!(status.code().is_some(), "{status:?}");
    let t2: u64 = second
        .line()
        .strip_prefix("token=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(t2 > token);
    loop {
        let e = observer.json();
        assert_ne!(e["token"], token, "the old leader again: {e}");
        if e["event"] == "leader" {
            assert_eq!(e["value"], "two");
            assert_eq!(e["token"], t2);
            break;
        }
    }
    let _ = second.child.kill();
    let _ = listen.child.kill();
}
