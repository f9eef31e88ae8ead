//! README.md's examples as written (issue 32, item 9). Rust cannot compile
//! a README block at run time, so the Rust block lives here, in
//! `readme_rust` between the `README` markers, and a test holds it equal
//! to the README's; another runs it on the embedded backend, fenced (its
//! lock key deleted, the default reacquire) at its third unit, and checks
//! that the loop stops as its comment says: no unit under the new token.
//! The C and C++ blocks live the same way in ffi-c/tests/c/readme.c and
//! ffi-c/tests/cpp/readme.cpp (compiled and run by scripts/test-c.sh and
//! scripts/test-cpp.sh); their text is checked here too.
//!
//! Issue 28: the sessions block (`### Many locks, one lease: sessions`),
//! `## Elections and observers`, `## Semaphores` (issue 29), `## Read/write
//! locks` (issue 30) and `## Metrics` live here too, each run once on the embedded backend; the
//! `## PostgreSQL` block lives in core/tests/postgres_readme.rs (run on the
//! PostgreSQL test servers by scripts/test-postgres.sh), its text checked
//! here.

use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dlock::{MemoryService, Token};

const README: &str = include_str!("../../README.md");

/// The first ```LANG block under README.md's `HEADING` (`## Rust`, `###
/// Many locks, ...`), before the next `##` or `###` heading; panics
/// (naming what is missing) when the heading or the block moved.
fn readme_block(heading: &str, lang: &str) -> String {
    let section = README
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| {
            panic!("README.md has no `{heading}` heading: update core/tests/readme.rs")
        })
        .1;
    let end = ["\n## ", "\n### "]
        .iter()
        .filter_map(|h| section.find(h))
        .min()
        .unwrap_or(section.len());
    let fence = format!("```{lang}\n");
    let block = section[..end]
        .split_once(&fence)
        .unwrap_or_else(|| {
            panic!("README.md's `{heading}` has no ```{lang} block: update core/tests/readme.rs")
        })
        .1;
    block
        .split_once("```")
        .unwrap_or_else(|| panic!("README.md's `{heading}` ```{lang} block is not closed"))
        .0
        .to_owned()
}

/// The lines of `source` between the line holding ``README: begin
/// (README.md, `HEADING` `` and the next one holding `README: end`, with
/// `indent` leading spaces taken off each.
fn marked_region(source: &str, file: &str, heading: &str, indent: usize) -> String {
    let begin = format!("README: begin (README.md, `{heading}`");
    let mut out = String::new();
    let mut inside = false;
    let mut closed = false;
    for line in source.lines() {
        let marker = line
            .trim_start()
            .trim_start_matches("//")
            .trim_start_matches("/*")
            .trim_start();
        if !inside && marker.starts_with(&begin) {
            inside = true;
        } else if inside && marker.starts_with("README: end") {
            closed = true;
            break;
        } else if inside {
            let line = if line.trim().is_empty() {
                ""
            } else {
                line.get(indent..).unwrap_or(line)
            };
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(
        closed,
        "{file} has no `README: begin (README.md, `{heading}`` ... `README: end` region"
    );
    out
}

// ---- the Rust block, as README.md's `## Rust` has it ---------------------

static UNITS: Mutex<Vec<Token>> = Mutex::new(Vec::new());

fn do_one_unit(token: Token) {
    let n = {
        let mut units = UNITS.lock().unwrap();
        units.push(token);
        units.len()
    };
    if n == 3 {
        // The fence: an operator deletes the key; the lock reacquires
        // (the service's holder is the new token once it has).
        let service = MemoryService::shared();
        assert!(service.delete_lock_key("orders"));
        let start = Instant::now();
        while service.holder("orders").is_none() || service.holder("orders") == Some(token) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no reacquisition after the fence"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(n < 50, "the loop did not stop at the fence");
}

fn commit() {}

// As README.md has it, so rustfmt leaves it alone.
#[rustfmt::skip]
fn readme_rust() -> Result<(), dlock::Error> {
    // README: begin (README.md, `## Rust`, the first ```rust block)
    use std::time::Duration;

    let client = dlock::Client::memory(); // embedded backend, default options
    let lock = client.lock("orders")?;
    lock.on_fence(|token, in_flight| eprintln!("lost token {token}; {in_flight} units in flight"));
    let token = lock.acquire(Duration::from_secs(10))?;

    while let Ok(permit) = lock.permit() {
        if permit.token() != token { break } // fenced and acquired again meanwhile: stop too
        do_one_unit(permit.token());         // every write carries permit.token()
        if permit.valid() { commit() }       // re-reads the clock
    }   // refused: draining, fenced, released or not_held: no new work
    lock.release()?;
    // README: end
    Ok(())
}

#[test]
fn the_rust_block_here_is_the_readmes() {
    let here = marked_region(
        include_str!("readme.rs"),
        "core/tests/readme.rs",
        "## Rust",
        4,
    );
    assert_eq!(
        here,
        readme_block("## Rust", "rust"),
        "README.md's Rust block and core/tests/readme.rs differ"
    );
}

#[test]
fn the_readme_rust_loop_stops_at_a_fence_as_its_comment_says() {
    for run in 0..30 {
        UNITS.lock().unwrap().clear();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || tx.send(readme_rust()));
        let result = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("run {run}: the loop did not stop within 20 s"));
        result.unwrap_or_else(|e| panic!("run {run}: {e}"));
        let units = UNITS.lock().unwrap().clone();
        assert_eq!(
            units.len(),
            3,
            "run {run}: {} units ({units:?}): worked after the fence",
            units.len()
        );
        assert!(
            units.iter().all(|t| *t == units[0]),
            "run {run}: worked under {units:?} (the new token)"
        );
    }
}

// ---- `### Many locks, one lease: sessions`, under `## Rust` ---------------

#[rustfmt::skip]
fn readme_session(client: &dlock::Client) -> Result<(dlock::Session, dlock::Lock), dlock::Error> {
    // README: begin (README.md, `### Many locks, one lease: sessions`, the first ```rust block)
    let batch = client.session(dlock::Options::default())?; // its own lease
    let shard = batch.lock("shards/17")?;
    shard.acquire(Duration::from_secs(10))?;
    batch.close()?; // releases every lock of it, revokes its lease
    // README: end
    Ok((batch, shard))
}

#[test]
fn the_session_block_here_is_the_readmes() {
    let heading = "### Many locks, one lease: sessions";
    let here = marked_region(
        include_str!("readme.rs"),
        "core/tests/readme.rs",
        heading,
        4,
    );
    assert_eq!(
        here,
        readme_block(heading, "rust"),
        "README.md's session block and core/tests/readme.rs differ"
    );
}

#[test]
fn the_readme_session_holds_on_a_lease_of_its_own_and_close_releases_it() {
    let client = dlock::Client::memory();
    let on_default = client.lock("readme-sessions-default").unwrap();
    on_default.acquire(Duration::from_secs(10)).unwrap();
    let (batch, shard) = readme_session(&client).expect("the session block runs");
    assert_eq!(
        MemoryService::shared().holder("shards/17"),
        None,
        "close released the session's lock"
    );
    assert!(batch.lease().is_none(), "close revoked the session's lease");
    assert!(matches!(
        shard.acquire(Duration::from_secs(1)),
        Err(dlock::Error::Released)
    ));
    // Its own lease: revoking it left the default session's lock held.
    assert_eq!(on_default.state(), dlock::State::Holding);
    assert!(on_default.permit().is_ok());
    on_default.release().unwrap();
}

#[test]
fn the_c_block_is_ffi_c_tests_c_readme_c() {
    let here = marked_region(
        include_str!("../../ffi-c/tests/c/readme.c"),
        "ffi-c/tests/c/readme.c",
        "## C",
        2,
    );
    assert_eq!(
        here,
        readme_block("## C", "c"),
        "README.md's C block and ffi-c/tests/c/readme.c differ"
    );
}

#[test]
fn the_cpp_block_is_ffi_c_tests_cpp_readme_cpp() {
    let here = marked_region(
        include_str!("../../ffi-c/tests/cpp/readme.cpp"),
        "ffi-c/tests/cpp/readme.cpp",
        "## C++",
        2,
    );
    assert_eq!(
        here,
        readme_block("## C++", "cpp"),
        "README.md's C++ block and ffi-c/tests/cpp/readme.cpp differ"
    );
}

// ---- `## Elections and observers` -----------------------------------------

/// One event the block's observer reported: its kind, and the leader's
/// value and token.
type Seen = (String, Option<(Vec<u8>, Token)>);

/// What the block's observer reported, in order.
static OBSERVED: Mutex<Vec<Seen>> = Mutex::new(Vec::new());
static OBSERVED_GREW: std::sync::Condvar = std::sync::Condvar::new();
/// The tokens the block's leader worked under.
static LED: Mutex<Vec<Token>> = Mutex::new(Vec::new());

fn route(kind: &str, leader: Option<&dlock::Leader>) {
    let mut seen = OBSERVED.lock().unwrap();
    seen.push((kind.to_owned(), leader.map(|l| (l.value.clone(), l.token))));
    OBSERVED_GREW.notify_all();
}

/// Waits (at most 10 s) until the observer's events satisfy `done`.
fn observed_until(what: &str, done: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let limit = Instant::now() + Duration::from_secs(10);
    let mut seen = OBSERVED.lock().unwrap();
    while !done(&seen) {
        let left = limit.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "the observer never reported {what}: {seen:?}"
        );
        seen = OBSERVED_GREW.wait_timeout(seen, left).unwrap().0;
    }
    seen.clone()
}

/// Leader work: runs while leading, so the observer must have reported
/// this leader by now (the block does not go on until it has, so the
/// proclaim cannot hide the first value).
fn lead(token: Token) {
    LED.lock().unwrap().push(token);
    observed_until("the leader", |seen| {
        seen.iter()
            .any(|(k, l)| k == "leader" && l == &Some((b"host-a:8080".to_vec(), token)))
    });
}

#[rustfmt::skip]
/// Gives the block's observer back: dropping it ends its watch, and the
/// test reads on until the resign's no-leader.
fn readme_election() -> Result<dlock::Observer, dlock::Error> {
    // README: begin (README.md, `## Elections and observers`, the first ```rust block)
    let client = dlock::Client::memory();
    let observer = client.observe_with("leaders", |event| {  // any process may watch
        route(event.kind(), event.leader()); // the state first, then each change: "leader", "proclaimed", "no-leader", "reconnecting"
    })?;                                     // keep it: close() or drop ends it; or observe(..) and recv()

    let election = client.election("leaders")?;              // or session.election(..)
    election.campaign(b"host-a:8080", Duration::from_secs(30))?; // waits its turn; returns the token
    if let Ok(permit) = election.permit() { lead(permit.token()) } // leader work, as under a lock
    election.proclaim(b"host-a:9090")?;                      // a new value, the same token
    election.resign(Duration::from_secs(5))?;                // the key goes once the units in flight end
    // README: end
    Ok(observer)
}

#[test]
fn the_election_block_here_is_the_readmes() {
    let here = marked_region(
        include_str!("readme.rs"),
        "core/tests/readme.rs",
        "## Elections and observers",
        4,
    );
    assert_eq!(
        here,
        readme_block("## Elections and observers", "rust"),
        "README.md's election block and core/tests/readme.rs differ"
    );
}

#[test]
fn the_readme_election_leads_and_its_observer_sees_each_state_as_its_comments_say() {
    let _observer = readme_election().expect("the election block runs");
    let led = LED.lock().unwrap().clone();
    assert_eq!(led.len(), 1, "one unit of leader work: {led:?}");
    let token = led[0];
    // The state first (nobody leads "leaders" yet, unless the campaign won
    // before the observer's first read), then the leader, its proclaim
    // (unless the resign came before the observer read it: an observer
    // reports states), then nobody once resigned.
    let seen = observed_until("no leader after the resign", |seen| {
        seen.iter().any(|(k, _)| k == "leader")
            && seen.last().is_some_and(|(k, _)| k == "no-leader")
    });
    let rest = match seen.first() {
        Some((k, _)) if k == "no-leader" => &seen[1..],
        _ => &seen[..],
    };
    assert_eq!(
        rest.first(),
        Some(&("leader".to_owned(), Some((b"host-a:8080".to_vec(), token)))),
        "{seen:?}"
    );
    let between = &rest[1..rest.len() - 1];
    assert!(
        between
            == [(
                "proclaimed".to_owned(),
                Some((b"host-a:9090".to_vec(), token))
            )]
            || between.is_empty(),
        "after the leader, only its proclaim (same token) before no-leader: {seen:?}"
    );
}

// ---- `## Semaphores` ------------------------------------------------------

/// What the block's unit of work got: its slot, the slot's lock name and
/// the token.
static USED: Mutex<Vec<(u32, String, Token)>> = Mutex::new(Vec::new());

fn use_gpu(slot: u32, name: &str, token: Token) {
    USED.lock().unwrap().push((slot, name.to_owned(), token));
}

#[rustfmt::skip]
fn readme_semaphore() -> Result<(), dlock::Error> {
    // README: begin (README.md, `## Semaphores`, the first ```rust block)
    let client = dlock::Client::memory();
    let gpus = client.semaphore("gpu", 4)?;                  // at most 4 holders; or session.semaphore(..)
    let held = gpus.acquire(Duration::from_secs(30))?;       // waits for any free slot: a held Lock
    let slot = held.slot().expect("a semaphore's lock");     // 0..4; its lock name is "gpu/slot/<slot>"
    if let Ok(permit) = held.permit() { use_gpu(slot, held.name(), permit.token()) } // fence per slot
    held.release()?;                                         // the slot passes to one waiter
    // README: end
    Ok(())
}

#[test]
fn the_semaphore_block_here_is_the_readmes() {
    let here = marked_region(
        include_str!("readme.rs"),
        "core/tests/readme.rs",
        "## Semaphores",
        4,
    );
    assert_eq!(
        here,
        readme_block("## Semaphores", "rust"),
        "README.md's semaphore block and core/tests/readme.rs differ"
    );
}

#[test]
fn the_readme_semaphore_holds_a_slot_and_releases_it() {
    readme_semaphore().expect("the semaphore block runs");
    let used = USED.lock().unwrap().clone();
    assert_eq!(used.len(), 1, "one unit of work: {used:?}");
    let (slot, name, _) = &used[0];
    assert!(*slot < 4);
    assert_eq!(name, &format!("gpu/slot/{slot}"));
    let service = dlock::MemoryService::shared();
    assert_eq!(service.holder(name), None, "released");
}

// ---- `## Metrics` ----------------------------------------------------------

#[cfg(feature = "prometheus")]
#[rustfmt::skip]
fn readme_metrics(
    client: &dlock::Client,
    lock: &dlock::Lock,
    registry: &mut prometheus_client::registry::Registry,
) -> (String, bool) {
    // README: begin (README.md, `## Metrics`, the first ```rust block)
    let page: String = client.snapshot().to_text(); // Prometheus text format: serve it as /metrics
    // or, with the cargo feature `prometheus`, in your own prometheus-client registry:
    registry.register_collector(Box::new(dlock::metrics::Collector::new(client.clone())));
    let ok: bool = lock.healthy(Duration::from_secs(5)); // your health check: false once a due fence did not happen
    // README: end
    (page, ok)
}

#[test]
fn the_metrics_block_here_is_the_readmes() {
    let here = marked_region(
        include_str!("readme.rs"),
        "core/tests/readme.rs",
        "## Metrics",
        4,
    );
    assert_eq!(
        here,
        readme_block("## Metrics", "rust"),
        "README.md's metrics block and core/tests/readme.rs differ"
    );
}

#[cfg(feature = "prometheus")]
#[test]
fn the_readme_metrics_page_and_collector_show_the_held_lock_and_it_is_healthy() {
    let client = dlock::Client::memory();
    let lock = client.lock("readme-metrics").unwrap();
    let token = lock.acquire(Duration::from_secs(10)).unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    let (page, ok) = readme_metrics(&client, &lock, &mut registry);
    assert!(ok, "a lock held within its deadline is healthy");
    let mut collected = String::new();
    prometheus_client::encoding::text::encode(&mut collected, &registry).unwrap();
    for (text, what) in [(&page, "to_text()"), (&collected, "the collector")] {
        let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        for sample in [
            "dlock_lock_held{lock=\"readme-metrics\"} 1".to_owned(),
            format!("dlock_lock_token{{lock=\"readme-metrics\"}} {token}"),
        ] {
            assert!(
                samples.contains(&sample.as_str()),
                "{what} has no `{sample}`:\n{text}"
            );
        }
    }
    lock.release().unwrap();
}

// ---- `## PostgreSQL` -------------------------------------------------------

#[test]
fn the_postgres_block_is_core_tests_postgres_readme_rs() {
    let here = marked_region(
        include_str!("postgres_readme.rs"),
        "core/tests/postgres_readme.rs",
        "## PostgreSQL",
        4,
    );
    assert_eq!(
        here,
        readme_block("## PostgreSQL", "rust"),
        "README.md's PostgreSQL block and core/tests/postgres_readme.rs differ"
    );
}

// ---- `## Read/write locks` --------------------------------------------------

/// The block's units of work, in order: whether each was a write.
static RW_USED: Mutex<Vec<bool>> = Mutex::new(Vec::new());

fn write_config(admitted: Result<(), dlock::Stale>) {
    admitted.expect("the writer's token is admitted for writing");
    RW_USED.lock().unwrap().push(true);
}

fn read_config(admitted: Result<(), dlock::Stale>) {
    admitted.expect("the reader's token is admitted for reading");
    RW_USED.lock().unwrap().push(false);
}

#[rustfmt::skip]
fn readme_rwlock() -> Result<(), dlock::Error> {
    // README: begin (README.md, `## Read/write locks`, the first ```rust block)
    let client = dlock::Client::memory();
    let gate = dlock::FenceGate::new();                      // the resource's side
    let config = client.rwlock("config")?;                   // or session.rwlock(..); sends nothing
    let writer = config.write()?;                            // a Lock in Mode::Write, not held yet
    writer.acquire(Duration::from_secs(30))?;                // alone: after every earlier holder
    if let Ok(p) = writer.permit() { write_config(gate.admit_write("config", p.token())) }
    writer.downgrade()?;                                     // a reader now: same key, same token
    let other = client.session(client.options().clone())?.rwlock("config")?.read()?;
    other.acquire(Duration::from_secs(30))?;                 // readers share (holders on two sessions)
    if let Ok(p) = other.permit() { read_config(gate.admit_read("config", p.token())) }
    writer.release()?;
    // README: end
    assert_eq!(writer.mode(), Some(dlock::Mode::Read));
    let (w, r) = gate.watermarks("config");
    assert!(w.is_some() && r > w, "{w:?} {r:?}");
    Ok(())
}

#[test]
fn the_rwlock_block_here_is_the_readmes_and_runs() {
    let here = marked_region(
        include_str!("readme.rs"),
        "core/tests/readme.rs",
        "## Read/write locks",
        4,
    );
    assert_eq!(
        here,
        readme_block("## Read/write locks", "rust"),
        "README.md's read/write lock block and core/tests/readme.rs differ"
    );
    readme_rwlock().unwrap();
    assert_eq!(*RW_USED.lock().unwrap(), [true, false]);
}
