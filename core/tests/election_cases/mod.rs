//! Election cases every engine plays alike (etcd_election.rs and
//! postgres_election.rs).

use std::sync::mpsc;
use std::time::Duration;

use dlock::clock::system_now;
use dlock::{Client, Election, Error, Observed, Observer};
use dlock_testkit::MARGIN;
use dlock_testkit::proxy::Mode;

/// Scheduling slack of a timing bound on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(300);

fn next(o: &mut Observer, event: Duration) -> Observed {
    o.recv_blocking(Some(event))
        .expect("an observer event")
        .expect("the observer is live")
}

/// A leader on `cut_off` (a client behind the fault proxy, which `cut`
/// sets) is cut off while a candidate on `client()` waits: the leader
/// fences at least the margin (less the slack) before the candidate is
/// elected with a higher token, an observer never shows the old leader
/// again, and the fenced leader's proclaim is refused. `label` starts the
/// ELECTION| line. Returns the old leader, the proxy passing again.
pub fn a_leader_cut_off_fences_the_margin_before_the_next_is_elected(
    cut_off: &Client,
    client: &dyn Fn() -> Client,
    name: &str,
    cut: &dyn Fn(Mode),
    label: &str,
    event: Duration,
) -> Election {
    let leader = cut_off.election(name).unwrap();
    let (fence_tx, fenced) = mpsc::channel();
    leader.on_fence(move |t, _| {
        let _ = fence_tx.send((system_now(), t));
    });
    let t1 = leader.campaign(b"old", event).unwrap();
    let mut obs = client().observe(name).unwrap();
    assert!(matches!(next(&mut obs, event), Observed::Leader(l) if l.token == t1));
    let cc = client();
    let n2 = name.to_owned();
    let candidate = std::thread::spawn(move || {
        let e = cc.election(&n2).unwrap();
        let t = e.campaign(b"new", Duration::from_secs(30));
        (system_now(), t, e, cc)
    });
    std::thread::sleep(Duration::from_millis(500));
    cut(Mode::Blackhole);
    let (fence_at, fenced_token) = fenced.recv_timeout(event).expect("the leader fenced");
    assert_eq!(fenced_token, t1);
    let (elected_at, t2, _e, _cc) = candidate.join().unwrap();
    let t2 = t2.expect("the candidate elected");
    assert!(t2 > t1);
    let lead = elected_at.saturating_since(fence_at);
    println!(
        "ELECTION|{label}cut-off: on_fence led the next leader by {lead:?} (margin {MARGIN:?})"
    );
    assert!(
        elected_at > fence_at && lead + SLACK >= MARGIN,
        "the old leader fenced only {lead:?} before the next was elected"
    );
    // The observer: no leader once the old key went or its lease expired,
    // or the new one directly; never the old one again.
    loop {
        match next(&mut obs, event) {
            Observed::Leader(l) if l.token == t2 => break,
            Observed::Leader(l) | Observed::Proclaimed(l) => {
                assert_ne!(l.token, t1, "the old leader after its key or lease went")
            }
            Observed::NoLeader | Observed::Reconnecting => {}
            other => panic!("{other:?}"),
        }
    }
    // A fenced leader's proclaim is refused.
    assert!(matches!(
        leader.proclaim(b"stale"),
        Err(Error::Fenced(_)) | Err(Error::NotHeld)
    ));
    cut(Mode::Pass);
    leader
}
