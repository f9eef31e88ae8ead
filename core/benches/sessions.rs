//! Sessions: what many locks on one lease cost. Figures only, never a gate.
//!
//! a. etcd, uncontended acquire + release per second on one live session,
//!    beside the floor: one put (with a lease) + one delete of a key through
//!    `etcd_client`, from this process, to the same member. Rounds
//!    alternate dlock / floors (the order turns every round); per-round
//!    ops/s, the medians and their ratio (target >= 0.9). Two more
//!    baselines tell the protocol's share of the gap from dlock's own: the
//!    two transactions dlock sends (etcd's Mutex) through `etcd_client`,
//!    and the same with a watcher of the key created and canceled on one
//!    Watch stream, as a session's key watch does.
//! b. etcd, 10,000 locks held on one session (default options: keepalive
//!    every 5 s): keepalive messages reaching etcd per interval (every
//!    member's `/metrics`, `grpc_server_msg_received_total` of
//!    `LeaseKeepAlive`, summed; target 1 per session), client RSS per held
//!    lock (target <= 1 KiB) and the time to acquire them all, sequentially
//!    and with bounded concurrency (`acquire_async` on a tokio runtime).
//!    Beside them: the RSS of an empty process, of the handles alone, after
//!    `malloc_trim`; a bare thread round trip (the floor of any blocking
//!    call on this machine); sequential times per tenth of the locks.
//! c. the same 10,000 locks on the embedded backend: RSS per lock and time.
//!
//! Every part runs in a child process of its own (this binary, `--part`),
//! so that no part's RSS is measured on memory an earlier part freed.
//!
//! Run: `scripts/bench-sessions.sh` (starts a private etcd cluster), or
//! `cargo bench -p dlock --bench sessions` with `DLOCK_TEST_MEMBERS` (the
//! cluster's client URLs, as `target/etcd/env` exports them) set; without
//! it only part c runs.
//!
//! Settings (environment): `DLOCK_BENCH_ROUNDS` (7), `DLOCK_BENCH_CYCLES`
//! (300 acquire+release per round), `DLOCK_BENCH_LOCKS` (10000),
//! `DLOCK_BENCH_CONCURRENCY` (64 acquisitions in flight),
//! `DLOCK_BENCH_HOLD_INTERVALS` (3 keepalive intervals held).

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use dlock::memory::MemoryService;
use dlock::{Client, ClientConfig, EtcdConfig, Lock, Options};
use dlock_testkit::bench::{median, rss_kib, thread_round_trip};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(30);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs this without `--bench`: nothing to test.
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("sessions: benchmarks only (cargo bench -p dlock --bench sessions)");
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--part") {
        let part = args.get(i + 1).expect("--part NAME");
        let out = child(part);
        println!("RESULT {out}");
        return;
    }
    parent();
}

// ---------------------------------------------------------------------------
// Settings and small helpers.

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| {
        v.parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{name} must be a count > 0, got {v}"))
    })
}

fn members() -> Option<Vec<String>> {
    std::env::var("DLOCK_TEST_MEMBERS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').map(|m| m.trim().to_owned()).collect())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A name of this process only.
fn name(part: &str, i: usize) -> String {
    format!("dlock-bench/{part}-{}/{i}", std::process::id())
}

// ---------------------------------------------------------------------------
// The parent: runs every part in a child, prints the figures and the table.

fn run_part(part: &str) -> Value {
    let exe = std::env::current_exe().expect("bench binary");
    let out = Command::new(exe)
        .args(["--bench", "--part", part])
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("part {part}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines().filter(|l| !l.starts_with("RESULT ")) {
        println!("{line}");
    }
    assert!(out.status.success(), "part {part} failed: {}", out.status);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("part {part} printed no RESULT line"));
    serde_json::from_str(line).expect("RESULT json")
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("no figure {k} in {v}"))
}

fn parent() {
    let locks = setting("DLOCK_BENCH_LOCKS", 10_000);
    let etcd = members();
    let mut table: Vec<[String; 4]> = Vec::new();
    let row = |t: &mut Vec<[String; 4]>, a: &str, b: String, c: String, d: &str| {
        t.push([a.into(), b, c, d.into()])
    };

    println!("== baseline: an empty process");
    let empty = run_part("empty");
    println!(
        "VmRSS of the empty bench process: {} KiB",
        f(&empty, "rss_kib")
    );

    if let Some(members) = &etcd {
        println!("\n== a. etcd: uncontended acquire+release on one live session vs the floor");
        let a = run_part("a");
        let ratio = f(&a, "median_dlock") / f(&a, "median_floor");
        let txn_ratio = f(&a, "median_dlock") / f(&a, "median_txn_floor");
        println!(
            "medians: dlock {:.0} ops/s, floor {:.0} ops/s, ratio {ratio:.3} (target >= 0.9); median of per-round ratios {:.3}; txn floor {:.0} ops/s (dlock / it {txn_ratio:.3}); txn+watch floor {:.0} ops/s (dlock / it {:.3})",
            f(&a, "median_dlock"),
            f(&a, "median_floor"),
            f(&a, "median_round_ratio"),
            f(&a, "median_txn_floor"),
            f(&a, "median_watch_floor"),
            f(&a, "median_dlock") / f(&a, "median_watch_floor"),
        );
        row(
            &mut table,
            "a. etcd acquire+release, one session (ops/s, median)",
            format!("{:.0}", f(&a, "median_dlock")),
            format!("{:.0} (put+delete floor)", f(&a, "median_floor")),
            &format!("ratio {ratio:.3}, target >= 0.9"),
        );
        row(
            &mut table,
            "a. the same two txns without dlock (ops/s, median)",
            format!("{:.0}", f(&a, "median_dlock")),
            format!("{:.0} (txn floor)", f(&a, "median_txn_floor")),
            &format!("ratio {txn_ratio:.3}"),
        );
        let watch_ratio = f(&a, "median_dlock") / f(&a, "median_watch_floor");
        row(
            &mut table,
            "a. the txns + a watcher per hold, without dlock",
            format!("{:.0}", f(&a, "median_dlock")),
            format!("{:.0} (txn+watch floor)", f(&a, "median_watch_floor")),
            &format!("ratio {watch_ratio:.3}: dlock's own share"),
        );

        println!("\n== b. etcd: {locks} locks on one session, default options");
        let interval = Options::default().keepalive_interval;
        let before = keepalive_msgs(members);
        std::thread::sleep(interval);
        let idle = keepalive_msgs(members) - before;
        println!(
            "cluster's own LeaseKeepAlive traffic, nothing of this bench holding: {idle:.0} msg over one interval ({interval:?})"
        );
        row(
            &mut table,
            "b. cluster's other keepalives (msg/interval)",
            format!("{idle:.0}"),
            "-".into(),
            "measured before part b",
        );
        for mode in ["seq", "conc"] {
            let b = run_part(&format!("b-{mode}"));
            let how = how(mode);
            row(
                &mut table,
                &format!("b. etcd keepalives reaching etcd ({how})"),
                format!("{:.2} /session/interval", f(&b, "server_per_interval")),
                format!("client sent {:.2}/interval", f(&b, "client_per_interval")),
                "target 1",
            );
            row(
                &mut table,
                &format!("b. etcd RSS per held lock ({how})"),
                format!("{:.0} B", f(&b, "rss_per_lock_bytes")),
                format!(
                    "empty process {} KiB; handle alone {:.0} B; trimmed {:.0} B",
                    f(&empty, "rss_kib"),
                    f(&b, "rss_per_handle_bytes"),
                    f(&b, "rss_per_lock_trimmed_bytes")
                ),
                "target <= 1024 B",
            );
            row(
                &mut table,
                &format!("b. etcd time to acquire {locks} ({how})"),
                format!("{:.2} s", f(&b, "acquire_s")),
                format!(
                    "{:.0} locks/s; {:.1} µs each, thread round trip {:.1} µs",
                    locks as f64 / f(&b, "acquire_s"),
                    f(&b, "acquire_s") * 1e6 / locks as f64,
                    f(&b, "round_trip_us")
                ),
                &format!("release all {:.2} s", f(&b, "release_s")),
            );
        }
    } else {
        println!("\n(DLOCK_TEST_MEMBERS unset: no etcd, parts a and b skipped)");
    }

    println!("\n== c. embedded backend: {locks} locks on one session");
    for mode in ["seq", "conc"] {
        let c = run_part(&format!("c-{mode}"));
        let how = how(mode);
        row(
            &mut table,
            &format!("c. embedded RSS per held lock ({how})"),
            format!("{:.0} B", f(&c, "rss_per_lock_bytes")),
            format!(
                "empty process {} KiB; handle alone {:.0} B; trimmed {:.0} B",
                f(&empty, "rss_kib"),
                f(&c, "rss_per_handle_bytes"),
                f(&c, "rss_per_lock_trimmed_bytes")
            ),
            "target <= 1024 B",
        );
        row(
            &mut table,
            &format!("c. embedded time to acquire {locks} ({how})"),
            format!("{:.3} s", f(&c, "acquire_s")),
            format!(
                "{:.0} locks/s; {:.1} µs each, thread round trip {:.1} µs",
                locks as f64 / f(&c, "acquire_s"),
                f(&c, "acquire_s") * 1e6 / locks as f64,
                f(&c, "round_trip_us")
            ),
            &format!("release all {:.3} s", f(&c, "release_s")),
        );
    }

    println!("\n== summary");
    let head = ["figure", "dlock", "baseline", "note"].map(String::from);
    let mut w = [0usize; 4];
    for r in std::iter::once(&head).chain(&table) {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    for r in std::iter::once(&head).chain(&table) {
        println!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {}",
            r[0],
            r[1],
            r[2],
            r[3],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2]
        );
    }
}

fn how(mode: &str) -> String {
    match mode {
        "seq" => "sequential acquire".into(),
        _ => format!(
            "acquire_async, {} in flight",
            setting("DLOCK_BENCH_CONCURRENCY", 64)
        ),
    }
}

// ---------------------------------------------------------------------------
// The children.

fn child(part: &str) -> Value {
    match part {
        "empty" => json!({ "rss_kib": rss_kib() }),
        "a" => part_a(),
        "b-seq" => part_many(true, false),
        "b-conc" => part_many(true, true),
        "c-seq" => part_many(false, false),
        "c-conc" => part_many(false, true),
        other => panic!("unknown part {other}"),
    }
}

fn etcd_client() -> Client {
    let members = members().expect("DLOCK_TEST_MEMBERS");
    Client::etcd(EtcdConfig::new(members), Options::default()).expect("connect to etcd")
}

/// a: rounds of `cycles` acquire+release on one live session, alternating
/// with as many put (with a lease) + delete through `etcd_client` on the
/// member dlock talks to (the first that answers: the first listed).
fn part_a() -> Value {
    let rounds = setting("DLOCK_BENCH_ROUNDS", 7);
    let cycles = setting("DLOCK_BENCH_CYCLES", 300);
    let members = members().expect("DLOCK_TEST_MEMBERS");
    let client = etcd_client();
    let session = client.session(Options::default()).expect("session");
    let lock = session.lock(&name("a", 0)).expect("lock");
    // Warm-up: the lease is granted, the connection open.
    lock.acquire(TIMEOUT).expect("warm-up acquire");
    lock.release().expect("warm-up release");
    let lease = session.lease().expect("a lease after the warm-up");

    let rt = runtime();
    let floor_key = name("a-floor", 0);
    let (mut etcd, floor_lease) = rt.block_on(async {
        let mut c = etcd_client::Client::connect([members[0].as_str()], None)
            .await
            .expect("etcd_client connects");
        let l = c.lease_grant(60, None).await.expect("lease grant").id();
        (c, l)
    });
    let put = etcd_client::PutOptions::new().with_lease(floor_lease);
    let txn_name = name("a-txn", 0);
    rt.block_on(floor_cycle(&mut etcd, &floor_key, &put));
    rt.block_on(txn_cycle(&mut etcd, &txn_name, floor_lease, None));
    // One Watch stream, as a session's key watch keeps: a watcher per key
    // held, created after the lock txn, canceled before the delete.
    let watch_name = name("a-watch", 0);
    let mut watch = rt.block_on(async {
        let (sender, mut replies) = etcd
            .watch(
                name("a-watch-anchor", 0),
                Some(etcd_client::WatchOptions::new().with_watch_id(1)),
            )
            .await
            .expect("watch stream")
            .split();
        tokio::spawn(async move { while let Ok(Some(_)) = replies.message().await {} });
        (sender, 1i64)
    });
    rt.block_on(txn_cycle(
        &mut etcd,
        &watch_name,
        floor_lease,
        Some(&mut watch),
    ));

    // ops/s per round: dlock, the put+delete floor, the txn floor, the
    // txn + watcher floor.
    let mut runs: [Vec<f64>; 4] = Default::default();
    println!(
        "round  dlock ops/s  floor ops/s  ratio  txn-floor ops/s  ratio  txn+watch ops/s  ratio"
    );
    println!(
        "       (op = acquire+release | put+delete | dlock's two txns | the txns and a watcher created and canceled; {cycles} per round)"
    );
    for r in 0..rounds {
        // The order turns every round.
        for k in 0..4 {
            let kind = (r + k) % 4;
            let t = Instant::now();
            match kind {
                0 => {
                    for _ in 0..cycles {
                        lock.acquire(TIMEOUT).expect("acquire");
                        lock.release().expect("release");
                    }
                }
                1 => rt.block_on(async {
                    for _ in 0..cycles {
                        floor_cycle(&mut etcd, &floor_key, &put).await;
                    }
                }),
                2 => rt.block_on(async {
                    for _ in 0..cycles {
                        txn_cycle(&mut etcd, &txn_name, floor_lease, None).await;
                    }
                }),
                _ => rt.block_on(async {
                    for _ in 0..cycles {
                        txn_cycle(&mut etcd, &watch_name, floor_lease, Some(&mut watch)).await;
                    }
                }),
            }
            runs[kind].push(cycles as f64 / t.elapsed().as_secs_f64());
        }
        let (d, fo, tx, tw) = (runs[0][r], runs[1][r], runs[2][r], runs[3][r]);
        println!(
            "{r:>5}  {d:>11.0}  {fo:>11.0}  {:.3}  {tx:>15.0}  {:.3}  {tw:>15.0}  {:.3}",
            d / fo,
            d / tx,
            d / tw
        );
    }
    let same_lease = session.lease() == Some(lease);
    println!(
        "dlock's lease the same through every round: {same_lease} (no grant/revoke per cycle); floors on {}",
        members[0]
    );
    rt.block_on(async {
        let _ = etcd.lease_revoke(floor_lease).await;
    });
    session.close().expect("close");
    let [dl, fl, tl, wl] = &runs;
    let ratios: Vec<f64> = dl.iter().zip(fl).map(|(d, f)| d / f).collect();
    json!({
        "median_dlock": median(dl),
        "median_floor": median(fl),
        "median_txn_floor": median(tl),
        "median_watch_floor": median(wl),
        "median_round_ratio": median(&ratios),
        "same_lease": same_lease,
    })
}

/// The floor of one acquire+release: one put with a lease, one delete.
async fn floor_cycle(etcd: &mut etcd_client::Client, key: &str, put: &etcd_client::PutOptions) {
    etcd.put(key, "", Some(put.clone())).await.expect("put");
    etcd.delete(key, None).await.expect("delete");
}

/// The two transactions an uncontended acquire+release sends (etcd's
/// Mutex: put our key if absent and read the oldest key under the
/// prefix; delete our key if its create revision is still ours), without
/// dlock: tells the protocol's cost from dlock's own.
/// With `watch`, also creates a watcher of the key on that stream after
/// the lock txn and cancels it before the delete, as a session does.
async fn txn_cycle(
    etcd: &mut etcd_client::Client,
    name: &str,
    lease: i64,
    watch: Option<&mut (etcd_client::WatchRequestSender, i64)>,
) {
    use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};
    let key = format!("{name}/{lease:x}");
    let prefix = format!("{name}/");
    let first = || {
        TxnOp::get(
            prefix.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_sort(SortTarget::Create, SortOrder::Ascend)
                    .with_limit(1),
            ),
        )
    };
    let lock = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(
                key.as_str(),
                "",
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            ),
            first(),
        ])
        .or_else([TxnOp::get(key.as_str(), None), first()]);
    let r = etcd.txn(lock).await.expect("lock txn");
    assert!(r.succeeded(), "the txn floor's key was there already");
    let rev = r.header().expect("a header").revision();
    let watch = watch.map(|(sender, id)| {
        *id += 1;
        (sender, *id)
    });
    if let Some((sender, id)) = watch {
        let opts = etcd_client::WatchOptions::new()
            .with_start_revision(rev + 1)
            .with_watch_id(id);
        sender
            .watch(key.as_str(), Some(opts))
            .await
            .expect("watch create");
        sender.cancel(id).await.expect("watch cancel");
    }
    let unlock = Txn::new()
        .when([Compare::create_revision(
            key.as_str(),
            CompareOp::Equal,
            rev,
        )])
        .and_then([TxnOp::delete(key.as_str(), None)]);
    etcd.txn(unlock).await.expect("unlock txn");
}

/// b / c: `DLOCK_BENCH_LOCKS` locks of distinct names on one session,
/// acquired sequentially or `DLOCK_BENCH_CONCURRENCY` at a time; RSS per
/// lock, times; on etcd also the keepalives over the hold.
fn part_many(etcd: bool, concurrent: bool) -> Value {
    let n = setting("DLOCK_BENCH_LOCKS", 10_000);
    let client = if etcd {
        etcd_client()
    } else {
        Client::connect(ClientConfig::embedded_in(MemoryService::new())).expect("embedded")
    };
    let session = client.session(Options::default()).expect("session");
    let tag = format!(
        "{}-{}",
        if etcd { "b" } else { "c" },
        if concurrent { "conc" } else { "seq" }
    );
    // Warm-up: lease granted, connection (and the driver) up.
    let warm = session.lock(&name(&tag, n)).expect("lock");
    warm.acquire(TIMEOUT).expect("warm-up acquire");
    warm.release().expect("warm-up release");
    drop(warm);
    let lease = session.lease();

    // The machine's own floor for a blocking call: a round trip between
    // two threads (every sequential acquire is at least one, to the
    // driver thread and back).
    let round_trip_us = thread_round_trip().as_secs_f64() * 1e6;
    let mut tenths: Vec<f64> = Vec::new();
    let rss_before = rss_kib();
    let t = Instant::now();
    let locks: Vec<Lock> = (0..n)
        .map(|i| session.lock(&name(&tag, i)).expect("lock"))
        .collect();
    let rss_handles = rss_kib();
    let locks = if concurrent {
        acquire_concurrently(locks, setting("DLOCK_BENCH_CONCURRENCY", 64))
    } else {
        // Per tenth: does an acquisition cost more with more locks held?
        for tenth in locks.chunks(n.div_ceil(10)) {
            let t = Instant::now();
            for l in tenth {
                l.acquire(TIMEOUT).expect("acquire");
            }
            tenths.push(t.elapsed().as_secs_f64() * 1e6 / tenth.len() as f64);
        }
        locks
    };
    let acquire_s = t.elapsed().as_secs_f64();
    let rss_after = rss_kib();
    // The same with the allocator's free memory handed back first: the
    // part of the growth that is garbage, not held.
    // SAFETY: glibc's malloc_trim, no arguments to get wrong.
    unsafe { libc::malloc_trim(0) };
    let rss_trimmed = rss_kib();
    let per_lock_trimmed = (rss_trimmed.saturating_sub(rss_before) * 1024) as f64 / n as f64;
    let per_lock = (rss_after.saturating_sub(rss_before) * 1024) as f64 / n as f64;
    assert_eq!(session.lease(), lease, "the lease changed while acquiring");
    let label = if etcd { "etcd" } else { "embedded" };
    let per_handle = (rss_handles.saturating_sub(rss_before) * 1024) as f64 / n as f64;
    println!(
        "{label} {tag}: {n} acquired in {acquire_s:.3} s ({:.0}/s); VmRSS {rss_before} KiB before, {rss_handles} KiB with the handles ({per_handle:.0} B each), {rss_after} KiB all held: {per_lock:.0} B per held lock",
        n as f64 / acquire_s
    );

    println!(
        "{label} {tag}: after malloc_trim(0) VmRSS {rss_trimmed} KiB: {per_lock_trimmed:.0} B per held lock"
    );
    println!(
        "{label} {tag}: {:.1} µs per acquisition; a bare thread round trip (std mpsc) {round_trip_us:.1} µs in this run",
        acquire_s * 1e6 / n as f64
    );
    if !tenths.is_empty() {
        let list: Vec<String> = tenths.iter().map(|t| format!("{t:.0}")).collect();
        println!(
            "{label} {tag}: µs per acquisition by tenth of the {n} (more locks held each tenth): {}",
            list.join(" ")
        );
    }
    let mut out = json!({
        "round_trip_us": round_trip_us,
        "acquire_s": acquire_s,
        "rss_before_kib": rss_before,
        "rss_after_kib": rss_after,
        "rss_per_lock_bytes": per_lock,
        "rss_per_handle_bytes": per_handle,
        "rss_per_lock_trimmed_bytes": per_lock_trimmed,
    });
    if etcd {
        let members = members().expect("DLOCK_TEST_MEMBERS");
        let interval = session.options().keepalive_interval;
        let intervals = setting("DLOCK_BENCH_HOLD_INTERVALS", 3);
        let window = interval * intervals as u32;
        let (s0, k0) = (keepalive_msgs(&members), session.stats().keepalives);
        std::thread::sleep(window);
        let (s1, k1) = (keepalive_msgs(&members), session.stats().keepalives);
        let held = locks
            .iter()
            .filter(|l| l.state() == dlock::State::Holding)
            .count();
        let server = (s1 - s0) / intervals as f64;
        let client_side = (k1 - k0) as f64 / intervals as f64;
        println!(
            "{label} {tag}: held {window:?} ({intervals} intervals of {interval:?}), {held}/{n} Holding at the end: LeaseKeepAlive received by etcd {:.0} ({server:.2}/interval), sent by the session {} ({client_side:.2}/interval)",
            s1 - s0,
            k1 - k0
        );
        assert_eq!(held, n, "locks lost their hold during the window");
        out["server_per_interval"] = json!(server);
        out["client_per_interval"] = json!(client_side);
    }
    let t = Instant::now();
    for l in &locks {
        l.release().expect("release");
    }
    let release_s = t.elapsed().as_secs_f64();
    out["release_s"] = json!(release_s);
    drop(locks);
    session.close().expect("close");
    out
}

/// Acquires every lock with `acquire_async` on a current-thread tokio
/// runtime, at most `limit` in flight.
fn acquire_concurrently(locks: Vec<Lock>, limit: usize) -> Vec<Lock> {
    let n = locks.len();
    let rt = runtime();
    rt.block_on(async move {
        let mut out: Vec<Option<Lock>> = (0..n).map(|_| None).collect();
        let mut todo = locks.into_iter().enumerate();
        let mut set = tokio::task::JoinSet::new();
        loop {
            while set.len() < limit {
                let Some((i, l)) = todo.next() else { break };
                set.spawn(async move {
                    let r = l.acquire_async(Some(TIMEOUT)).await;
                    (i, l, r)
                });
            }
            let Some(done) = set.join_next().await else {
                break;
            };
            let (i, l, r) = done.expect("acquire task");
            r.expect("acquire_async");
            out[i] = Some(l);
        }
        out.into_iter().map(|l| l.expect("acquired")).collect()
    })
}

// ---------------------------------------------------------------------------
// etcd's /metrics.

/// `grpc_server_msg_received_total` of `LeaseKeepAlive`, summed over the
/// members: every keepalive message any client sent the cluster.
fn keepalive_msgs(members: &[String]) -> f64 {
    members
        .iter()
        .map(|m| {
            let body = http_get(m, "/metrics");
            body.lines()
                .filter(|l| {
                    l.starts_with("grpc_server_msg_received_total{")
                        && l.contains("grpc_method=\"LeaseKeepAlive\"")
                })
                .map(|l| {
                    l.rsplit(' ')
                        .next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or_else(|| panic!("metric line {l}"))
                })
                .sum::<f64>()
        })
        .sum()
}

/// A plain HTTP/1.0 GET of `path` on `url` (`http://host:port`).
fn http_get(url: &str, path: &str) -> String {
    let hostport = url
        .split_once("://")
        .map_or(url, |(_, r)| r)
        .trim_end_matches('/');
    let mut s = std::net::TcpStream::connect(hostport).unwrap_or_else(|e| panic!("{url}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n").expect("send GET");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read /metrics");
    let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    body.to_owned()
}
