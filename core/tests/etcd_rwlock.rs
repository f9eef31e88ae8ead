//! Read/write locks on the real cluster (`scripts/test-etcd.sh` runs this
//! `test = false` target by name; without `DLOCK_TEST_ETCD` every test
//! fails; docs/design.md §27): readers share and a plain lock is a writer;
//! a queued writer blocks later readers; a downgrade keeps the token and
//! wakes queued readers through the watch; `etcdctl lock` excludes both
//! modes (and its key is a writer to dlock's readers); a reader's key holds
//! the read marker; a reader cut off (its members blackholed through the
//! fault proxy) fences before a waiting writer acquires, and a writer cut
//! off before waiting readers do (`DLOCK_FAULT_RUNS` runs each); an
//! operator deleting a reader's key fences that reader alone; a waiting
//! reader whose lease an operator revoked never holds with its gone key
//! (every wake re-reads it: etcd #16221).
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use dlock::rwlock::{Mode, READ_MARKER};
use dlock::{Client, Error, EtcdConfig, State};
use dlock_testkit::etcd::{Cluster, cluster, fault_runs};
use dlock_testkit::proxy::{self, Proxy};

mod rw_cases;
use rw_cases::{EVENT, until};

fn client(env: &Cluster) -> Client {
    env.client(dlock_testkit::backend_options())
}

fn name(test: &str) -> String {
    dlock_testkit::fresh(&format!("dlock-test/rw-{test}"))
}

/// The keys under `name/`, oldest first.
fn queue(env: &Cluster, name: &str) -> Vec<String> {
    env.etcdctl(&[
        "get",
        "--prefix",
        "--keys-only",
        "--sort-by=CREATE",
        "--order=ASCEND",
        &format!("{name}/"),
    ])
    .lines()
    .filter(|l| !l.is_empty())
    .map(str::to_owned)
    .collect()
}

#[test]
fn readers_share_and_a_plain_lock_is_a_writer() {
    let env = cluster();
    rw_cases::readers_share(&|| client(&env), &name("share"));
}

#[test]
fn a_queued_writer_blocks_later_readers() {
    let env = cluster();
    rw_cases::a_queued_writer_blocks_later_readers(&|| client(&env), &name("fifo"));
}

#[test]
fn a_downgrade_keeps_the_token_and_wakes_queued_readers() {
    let env = cluster();
    let name = name("downgrade");
    rw_cases::a_downgrade_keeps_the_token(&|| client(&env), &name);
    assert!(queue(&env, &name).is_empty(), "nothing left behind");
}

#[test]
fn a_readers_key_is_the_lock_key_holding_the_read_marker() {
    let env = cluster();
    let name = name("marker");
    let c = client(&env);
    let r = c.rwlock(&name).unwrap().read().unwrap();
    r.try_acquire().unwrap();
    let keys = queue(&env, &name);
    assert_eq!(keys.len(), 1, "{keys:?}");
    let value = env.etcdctl(&["get", "--print-value-only", &keys[0]]);
    assert_eq!(value.trim_end().as_bytes(), READ_MARKER);
    let w = client(&env).rwlock(&name).unwrap().write().unwrap();
    assert_eq!(w.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(queue(&env, &name).len(), 1, "a refused try leaves no key");
}

/// `etcdctl lock` waits for a dlock reader and for a dlock writer.
#[test]
fn etcdctl_lock_waits_for_either_mode() {
    let env = cluster();
    for mode in [Mode::Read, Mode::Write] {
        let name = name(&format!("ctl-waits-{mode}"));
        let c = client(&env);
        let held = c.rwlock(&name).unwrap().holder(mode).unwrap();
        held.acquire(EVENT).unwrap();
        let mut ctl = env
            .etcdctl_cmd()
            .args(["lock", &name, "echo", "etcdctl-got-it"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        until("etcdctl queued", || queue(&env, &name).len() == 2);
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            ctl.try_wait().unwrap().is_none(),
            "etcdctl took a name a dlock {mode} holds"
        );
        held.release().unwrap();
        let out = ctl.wait_with_output().unwrap();
        assert!(String::from_utf8_lossy(&out.stdout).contains("etcdctl-got-it"));
    }
}

/// An `etcdctl lock` holder is a writer: a dlock reader waits for it.
#[test]
fn a_dlock_reader_waits_for_an_etcdctl_holder() {
    let env = cluster();
    let name = name("ctl-holds");
    let mut ctl = env
        .etcdctl_cmd()
        .args(["lock", &name])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(ctl.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with(&name), "{first}");
    let r = client(&env).rwlock(&name).unwrap().read().unwrap();
    assert_eq!(r.try_acquire(), Err(Error::WouldBlock));
    assert_eq!(r.acquire(Duration::from_secs(1)), Err(Error::Timeout));
    until("the timed-out wait left no key", || {
        queue(&env, &name).len() == 1
    });
    let _ = Command::new("kill")
        .args(["-INT", &ctl.id().to_string()])
        .status();
    r.acquire(EVENT)
        .expect("the reader holds once etcdctl let go");
    let _ = ctl.wait();
    assert_eq!(r.state(), State::Holding);
}

#[test]
fn an_operator_deleting_a_readers_key_fences_that_reader_alone() {
    let env = cluster();
    let name = name("operator");
    rw_cases::an_operator_deleting_a_readers_key_fences_that_reader_alone(
        &|| client(&env),
        &name,
        // Reader a queued first: its key is the oldest.
        &|_| {
            let oldest = queue(&env, &name).remove(0);
            env.etcdctl(&["del", &oldest]);
        },
        &|| {},
    );
}

/// A holder whose every member is blackholed (one fault proxy per member)
/// fences before a waiter of the other mode acquires; `DLOCK_FAULT_RUNS`
/// runs.
fn cut_off(held: Mode, waits: Mode) {
    let env = cluster();
    for run in 0..fault_runs() {
        let proxies: Vec<Proxy> = (0..env.members.len())
            .map(|i| Proxy::start(env.member_addr(i)))
            .collect();
        let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let cut_client =
            Client::etcd(EtcdConfig::new(urls), dlock_testkit::backend_options()).unwrap();
        let m = rw_cases::cut_off(
            &|| client(&env),
            &cut_client,
            &|| proxies.iter().for_each(|p| p.set(proxy::Mode::Blackhole)),
            &|| proxies.iter().for_each(|p| p.set(proxy::Mode::Pass)),
            &name(&format!("cut-{held}-{waits}")),
            held,
            waits,
        );
        println!(
            "rwlock cut-off ({held} holder, {waits} waiters) run {run}: fenced {} ms before a waiter acquired",
            m.acquired.saturating_since(m.fenced).as_millis()
        );
    }
}

#[test]
fn a_reader_cut_off_fences_before_a_waiting_writer_acquires() {
    cut_off(Mode::Read, Mode::Write);
}

#[test]
fn a_writer_cut_off_fences_before_waiting_readers_acquire() {
    cut_off(Mode::Write, Mode::Read);
}

/// etcd #16221: a reader waiting behind a writer, whose lease (and key) an
/// operator revokes, is never told it holds with that key: every round
/// reads its own key again, so it holds only with a key that exists (here
/// a new one, under the session's new lease, with a higher token).
#[test]
fn a_waiting_reader_whose_lease_went_never_holds_with_its_gone_key() {
    let env = cluster();
    let name = name("phantom");
    let prefix = format!("{name}/");
    let view = EtcdConfig::new(env.members.clone())
        .connect_reader()
        .unwrap();
    let (wc, rc) = (client(&env), client(&env));
    let w = wc.rwlock(&name).unwrap().write().unwrap();
    w.acquire(EVENT).unwrap();
    let r = Arc::new(rc.rwlock(&name).unwrap().read().unwrap());
    let read = rw_cases::in_background(r.clone());
    until("the reader queued", || {
        view.lock_keys(&prefix).unwrap().len() == 2
    });
    let queued = view.lock_keys(&prefix).unwrap().remove(1);
    env.etcdctl(&["lease", "revoke", &format!("{:x}", queued.lease)]);
    until("its key went with its lease", || {
        view.lock_keys(&prefix).unwrap().len() == 1
    });
    w.release().unwrap();
    let t = read
        .recv_timeout(EVENT)
        .unwrap()
        .expect("the reader holds, on a new lease");
    assert!(
        t.get() as i64 > queued.create_revision,
        "not the gone key's token"
    );
    let keys = view.lock_keys(&prefix).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    assert_eq!(
        keys[0].create_revision,
        t.get() as i64,
        "it holds with a key that exists"
    );
    assert_eq!(r.state(), State::Holding);
}
