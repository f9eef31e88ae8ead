//! Semaphores on the real cluster (`scripts/test-etcd.sh` runs this
//! `test = false` target by name; without `DLOCK_TEST_ETCD` every test
//! fails): N+1 contenders and exactly N hold, the loser's timeout leaving
//! no key under any slot; a release wakes one waiter through etcd's watch;
//! the limit is one etcd key, `<name>/limit`, and a mismatch is refused;
//! `etcdctl lock <name>/slot/0` and a dlock holder exclude each other both
//! ways; a slot holder whose key an operator deletes fences and takes its
//! own slot again, higher, while the other holders are untouched; a slot
//! holder cut off by the fault proxy (blackhole, or replies lost with a
//! permit in flight) fences before its slot's next holder acquires, and
//! the other holders keep their permits (sem_faults/mod.rs).
//!
//! Settings: TTL 4 s, keepalive every 1 s, timeout 0.5 s, margin 1 s.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::Duration;

use dlock::{Client, Error, EtcdConfig, Options, State};
use dlock_testkit::etcd::{Cluster, cluster};
use dlock_testkit::proxy::{Mode, Proxy};

mod sem_cases;
mod sem_faults;

/// The longest wait for something that must happen.
const EVENT: Duration = Duration::from_secs(20);

fn client(env: &Cluster) -> Client {
    env.client(dlock_testkit::backend_options())
}

/// A client on the default timings, for a case about waking, not timing:
/// a 0.5 s keepalive timeout under CI's load could fence a holder and free
/// its slot for a waiter the case does not expect.
fn calm(env: &Cluster) -> Client {
    env.client(Options::default())
}

fn name(test: &str) -> String {
    dlock_testkit::fresh(&format!("dlock-test/sem-{test}"))
}

/// The keys under `prefix`.
fn keys(env: &Cluster, prefix: &str) -> Vec<String> {
    env.etcdctl(&["get", "--prefix", "--keys-only", prefix])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn until(what: &str, cond: impl FnMut() -> bool) {
    dlock_testkit::watch::until(what, EVENT, cond);
}

#[test]
fn n_plus_one_contenders_exactly_n_hold_and_the_limit_is_one_key() {
    let env = cluster();
    let name = name("n");
    let n = 3;
    let results =
        dlock_testkit::n_plus_one_contend(|| client(&env), &name, n, Duration::from_secs(3));
    let held = dlock_testkit::exactly_n_hold(&results, n);
    let mut slots: Vec<u32> = held.iter().map(|l| l.slot().unwrap()).collect();
    slots.sort();
    assert_eq!(slots, [0, 1, 2]);
    // One key per slot: the loser's queued keys were deleted with its wait.
    let slot_keys = keys(&env, &format!("{name}/slot/"));
    assert_eq!(slot_keys.len(), n as usize, "{slot_keys:?}");
    for l in &held {
        assert!(
            slot_keys
                .iter()
                .any(|k| k.starts_with(&format!("{}/", l.name())))
        );
    }
    // The limit: one plain key, outside every slot's prefix.
    let limit = env.etcdctl(&["get", &format!("{name}/limit"), "--print-value-only"]);
    assert_eq!(limit.trim(), "3");
    let err = client(&env).semaphore(&name, 2).unwrap_err();
    assert_eq!(err.code(), "invalid_argument");
    assert!(err.to_string().contains("limit 3"), "{err}");
    drop(results);
    until("every slot key gone", || {
        keys(&env, &format!("{name}/slot/")).is_empty()
    });
    env.etcdctl(&["del", &format!("{name}/limit")]);
}

#[test]
fn a_release_wakes_one_waiter_onto_that_slot() {
    let env = cluster();
    let name = name("wake");
    sem_cases::a_release_wakes_one_waiter_onto_that_slot(&|| calm(&env), &name, EVENT);
    env.etcdctl(&["del", &format!("{name}/limit")]);
}

#[test]
fn etcdctl_lock_on_a_slot_waits_for_a_dlock_holder() {
    let env = cluster();
    let name = name("ctl-waits");
    let sem = client(&env).semaphore(&name, 1).unwrap();
    let held = sem.acquire(EVENT).unwrap();
    assert_eq!(held.name(), sem.slot_name(0));
    let mut ctl: Child = env
        .etcdctl_cmd()
        .args(["lock", &sem.slot_name(0), "echo", "etcdctl-got-it"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    until("etcdctl queued on slot 0", || {
        keys(&env, &format!("{}/", sem.slot_name(0))).len() == 2
    });
    thread::sleep(Duration::from_millis(500));
    assert!(
        ctl.try_wait().unwrap().is_none(),
        "etcdctl took a held slot"
    );
    held.release().unwrap();
    let out = ctl.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("etcdctl-got-it"));
    env.etcdctl(&["del", &format!("{name}/limit")]);
}

#[test]
fn a_dlock_waiter_waits_for_an_etcdctl_holder_of_a_slot() {
    let env = cluster();
    let name = name("dlock-waits");
    let sem = client(&env).semaphore(&name, 1).unwrap();
    let mut ctl = env
        .etcdctl_cmd()
        .args(["lock", &sem.slot_name(0)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // etcdctl prints its key once it holds the lock.
    let mut first = String::new();
    std::io::BufReader::new(ctl.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.starts_with(&sem.slot_name(0)), "{first}");
    assert_eq!(sem.try_acquire().unwrap_err(), Error::WouldBlock);
    assert_eq!(
        sem.acquire(Duration::from_secs(2)).unwrap_err(),
        Error::Timeout
    );
    // The cancelled wait's delete is a request of its own, sent as the
    // call returns (design.md §19: nothing stays held, the key goes): a
    // read at once may still see it (a clean-clone CI run did).
    until("the timed-out wait left no key", || {
        keys(&env, &format!("{}/", sem.slot_name(0))).len() == 1
    });
    let _ = Command::new("kill")
        .args(["-INT", &ctl.id().to_string()])
        .status();
    let held = sem.acquire(EVENT).unwrap();
    let _ = ctl.wait();
    assert_eq!(held.slot(), Some(0));
    assert_eq!(held.state(), State::Holding);
    held.release().unwrap();
    env.etcdctl(&["del", &format!("{name}/limit")]);
}

#[test]
fn a_slot_key_deleted_by_an_operator_fences_that_holder_alone() {
    let env = cluster();
    let name = name("fence");
    sem_cases::a_slot_deleted_by_an_operator_fences_that_holder_alone(
        &|| client(&env),
        &name,
        EVENT,
        &|cut| {
            env.etcdctl(&["del", "--prefix", &format!("{}/", cut.name())]);
        },
    );
    env.etcdctl(&["del", &format!("{name}/limit")]);
}

/// The engine of the fault cases: the cut-off holder reaches the three
/// members through one proxy each; the contender queues a key on every
/// slot (the holders' N keys, then its own N).
fn fault_engine(env: &Cluster, run: impl FnOnce(&sem_faults::Engine)) {
    let cut_off = || {
        let proxies: Vec<Proxy> = (0..env.members.len())
            .map(|i| Proxy::start(env.member_addr(i)))
            .collect();
        let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let c = Client::etcd(EtcdConfig::new(urls), dlock_testkit::backend_options())
            .expect("connect via the proxies");
        (c, proxies)
    };
    let direct = || client(env);
    let queued = |name: &str| {
        until("the contender heads the semaphore's queue", || {
            !keys(env, &format!("{name}/queue/")).is_empty()
        });
    };
    run(&sem_faults::Engine {
        label: "",
        cut_off: &cut_off,
        direct: &direct,
        calm: &|| calm(env),
        queued: &queued,
        reset_after_lost: false,
    });
}

/// Issue 29 (a): one of N slot holders blackholed drains and fences
/// before the N + 1st contender gets its slot (etcd expires the lease a
/// margin after the holder's deadline); the other N − 1 keep their permits.
#[test]
fn fault_slot_holder_blackhole() {
    fault_engine(&cluster(), |e| {
        sem_faults::slot_holder_cut_off(e, "slot holder blackhole", Mode::Blackhole, false)
    });
}

/// Issue 29 (b): replies lost with a permit in flight: etcd keeps the
/// lease, so the slot passes on only through the revoke, after the permit
/// ended; the slot's permit intervals never overlap.
#[test]
fn fault_slot_holder_replies_lost_with_work_in_flight() {
    fault_engine(&cluster(), |e| {
        sem_faults::slot_holder_cut_off(
            e,
            "slot holder replies lost, permit in flight",
            Mode::DropReplies,
            true,
        )
    });
}
