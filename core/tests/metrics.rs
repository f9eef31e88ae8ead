//! Metrics (issue 22) on the embedded backend in real time: the snapshot's
//! counters and histograms move with the lifecycle (acquire, drain and
//! resume, a deleted key, a deadline fence), refused permits are counted,
//! per-lock series are capped, and the text renderer says it all in the
//! Prometheus format.

use std::time::{Duration, Instant};

use dlock::metrics::{Family, Kind, Value};
use dlock::{Client, MemoryService, Refused, State};

use dlock_testkit as common;
use dlock_testkit::embedded::{client, eventually, ms};
use dlock_testkit::metric;

fn family<'a>(fs: &'a [Family], name: &str) -> &'a Family {
    fs.iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("no family {name}"))
}

#[test]
fn the_lifecycle_moves_the_counters_and_histograms() {
    let service = MemoryService::new();
    let c = client(&service);
    let lock = c.lock("metrics/life").unwrap();
    assert_eq!(lock.permit().unwrap_err(), Refused::NotHeld);
    assert_eq!(
        metric(&c, "dlock_permits_refused_total", &["not_held"]),
        1.0
    );
    assert_eq!(metric(&c, "dlock_lock_held", &["metrics/life"]), 0.0);
    assert_eq!(
        metric(&c, "dlock_lock_state", &["metrics/life", "idle"]),
        1.0
    );

    let token = lock.acquire(ms(2000)).unwrap();
    assert_eq!(metric(&c, "dlock_lock_held", &["metrics/life"]), 1.0);
    assert_eq!(
        metric(&c, "dlock_lock_token", &["metrics/life"]),
        token.0 as f64
    );
    assert_eq!(
        metric(&c, "dlock_lock_state", &["metrics/life", "holding"]),
        1.0
    );
    assert_eq!(
        metric(&c, "dlock_lock_state", &["metrics/life", "idle"]),
        0.0
    );
    assert_eq!(metric(&c, "dlock_acquisitions_total", &[]), 1.0);
    assert_eq!(metric(&c, "dlock_acquire_wait_seconds", &["acquired"]), 1.0);
    assert_eq!(metric(&c, "dlock_session_locks", &[]), 1.0);
    let slack = metric(&c, "dlock_deadline_slack_seconds", &[]);
    assert!(slack > 0.0 && slack <= 2.0, "slack {slack}");
    {
        let _p = lock.permit().unwrap();
        assert_eq!(metric(&c, "dlock_permits_in_flight", &[]), 1.0);
    }
    assert_eq!(metric(&c, "dlock_permits_in_flight", &[]), 0.0);
    assert!(lock.healthy(Duration::ZERO));
    assert!(
        eventually(ms(3000), || metric(&c, "dlock_keepalive_rtt_seconds", &[])
            >= 1.0),
        "a confirmed keepalive fills the round-trip histogram"
    );
    assert!(metric(&c, "dlock_keepalives_total", &["ok"]) >= 1.0);

    // A blip: a failed keepalive drains, the next confirmed one resumes.
    c.link().unwrap().fail_keepalives(Some("blip"));
    assert!(eventually(ms(3000), || lock.state() == State::Draining));
    assert_eq!(lock.permit().unwrap_err(), Refused::Draining);
    c.link().unwrap().fail_keepalives(None);
    assert!(eventually(ms(3000), || lock.state() == State::Holding));
    assert_eq!(metric(&c, "dlock_drains_total", &[]), 1.0);
    assert_eq!(metric(&c, "dlock_resumes_total", &[]), 1.0);
    assert!(metric(&c, "dlock_keepalives_total", &["failed"]) >= 1.0);
    assert_eq!(
        metric(&c, "dlock_permits_refused_total", &["draining"]),
        1.0
    );

    // An operator deletes the key: a fence for `lock_lost`, and a hold ends.
    assert!(service.delete_lock_key("metrics/life"));
    assert!(eventually(ms(3000), || {
        metric(&c, "dlock_fences_total", &["lock_lost"]) == 1.0
    }));
    assert!(eventually(ms(3000), || {
        metric(&c, "dlock_hold_duration_seconds", &[]) >= 1.0
    }));
    assert!(
        eventually(ms(3000), || lock.state() == State::Holding),
        "reacquired"
    );
    assert_eq!(metric(&c, "dlock_acquisitions_total", &[]), 2.0);

    // A cut: keepalive replies lost until the deadline fences.
    let fenced_at = metric(&c, "dlock_fence_lateness_seconds", &[]);
    c.link().unwrap().drop_keepalive_replies(true);
    assert!(eventually(ms(5000), || {
        metric(&c, "dlock_fences_total", &["deadline"]) == 1.0
    }));
    c.link().unwrap().drop_keepalive_replies(false);
    // Every fence dispatched is one lateness observation.
    let fences = |c: &Client| {
        ["deadline", "lease_lost", "lock_lost"]
            .iter()
            .map(|r| metric(c, "dlock_fences_total", &[r]))
            .sum::<f64>()
    };
    assert!(
        eventually(ms(3000), || {
            metric(&c, "dlock_fence_lateness_seconds", &[]) == fences(&c)
        }),
        "{} lateness observations for {} fences",
        metric(&c, "dlock_fence_lateness_seconds", &[]),
        fences(&c)
    );
    assert!(metric(&c, "dlock_fence_lateness_seconds", &[]) > fenced_at);
    lock.release().unwrap();
    assert_eq!(metric(&c, "dlock_lock_held", &["metrics/life"]), 0.0);
}

#[test]
fn healthy_is_false_only_past_the_deadline_while_holding() {
    let service = MemoryService::new();
    let c = client(&service);
    let lock = c.lock("metrics/health").unwrap();
    assert!(lock.healthy(Duration::ZERO), "not holding is no fault");
    lock.acquire(ms(2000)).unwrap();
    assert!(lock.healthy(Duration::ZERO));
    // Stall the driver past the deadline: the fence that is due cannot run.
    let deadline = lock.time_left().unwrap();
    let stall = std::thread::spawn(move || dlock::memory::stall_driver(deadline + ms(600)));
    std::thread::sleep(deadline + ms(300));
    assert!(!lock.healthy(ms(100)), "holding 300 ms past the deadline");
    assert!(lock.healthy(ms(5000)), "within a generous bound");
    stall.join().unwrap();
}

#[test]
fn per_lock_series_are_capped_and_the_rest_folded() {
    let service = MemoryService::new();
    let c = client(&service);
    let locks: Vec<_> = (0..5)
        .map(|i| c.lock(&format!("metrics/cap/{i}")).unwrap())
        .collect();
    locks[3].acquire(ms(2000)).unwrap();
    locks[4].acquire(ms(2000)).unwrap();
    let fs = c.snapshot().families_capped(2);
    let held = family(&fs, "dlock_lock_held");
    let names: Vec<_> = held.series.iter().map(|(l, _)| l[0].as_str()).collect();
    assert_eq!(names, ["metrics/cap/0", "metrics/cap/1", "_other"]);
    assert_eq!(
        held.series[2].1,
        Value::Number(2.0),
        "two held among the folded"
    );
    assert_eq!(held.kind, Kind::Gauge);
}

#[test]
fn the_text_is_the_prometheus_format() {
    let service = MemoryService::new();
    let c = client(&service);
    let lock = c.lock("metrics/\"text\"").unwrap();
    lock.acquire(ms(2000)).unwrap();
    let text = c.snapshot().to_text();
    for line in [
        "# TYPE dlock_fences_total counter",
        "dlock_fences_total{reason=\"deadline\"} 0",
        "# TYPE dlock_keepalive_rtt_seconds histogram",
        "dlock_acquire_wait_seconds_bucket{outcome=\"acquired\",le=\"+Inf\"} 1",
        "dlock_acquire_wait_seconds_count{outcome=\"acquired\"} 1",
        "dlock_lock_held{lock=\"metrics/\\\"text\\\"\"} 1",
        "dlock_acquisitions_total 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
    // Every sample line is `name{labels} value` with a number value.
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let v = l.rsplit(' ').next().unwrap();
        assert!(v.parse::<f64>().is_ok() || v == "+Inf", "{l}");
    }
}

/// The `prometheus` feature: the application's registry encodes the same
/// families (prometheus-client's OpenMetrics text), read back here.
#[cfg(feature = "prometheus")]
#[test]
fn the_prometheus_client_collector_encodes_the_same_families() {
    let service = MemoryService::new();
    let c = client(&service);
    let lock = c.lock("metrics/collector").unwrap();
    let token = lock.acquire(ms(2000)).unwrap();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(dlock::metrics::Collector::new(c.clone())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    for line in [
        "# TYPE dlock_fences counter".to_owned(),
        "dlock_fences_total{reason=\"deadline\"} 0".to_owned(),
        "# TYPE dlock_lock_held gauge".to_owned(),
        "dlock_lock_held{lock=\"metrics/collector\"} 1".to_owned(),
        format!("dlock_lock_token{{lock=\"metrics/collector\"}} {}", token.0),
        "# TYPE dlock_acquire_wait_seconds histogram".to_owned(),
        "dlock_acquire_wait_seconds_count{outcome=\"acquired\"} 1".to_owned(),
        "dlock_acquire_wait_seconds_bucket{le=\"+Inf\",outcome=\"acquired\"} 1".to_owned(),
        "# EOF".to_owned(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
    // Every family of the core's own text is there, with the same type.
    let own = c.snapshot().families();
    for f in &own {
        let name = match f.kind {
            dlock::metrics::Kind::Counter => f.name.strip_suffix("_total").unwrap(),
            _ => f.name,
        };
        assert!(text.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    // Read strictly, every family of the fixture, typed and labelled alike
    // (with an election led, so every family has samples).
    let e = c.election("metrics/collector-election").unwrap();
    e.campaign(b"me", ms(2000)).unwrap();
    let sem = c.semaphore("metrics/collector-semaphore", 2).unwrap();
    let _slot = sem.acquire(ms(2000)).unwrap();
    let reader = c
        .rwlock("metrics/collector-rwlock")
        .unwrap()
        .read()
        .unwrap();
    reader.acquire(ms(2000)).unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert_matches_fixture("prometheus-client", &parse(&text));
}

/// One family as parsed: its type and label names (without `le`).
type Parsed = std::collections::BTreeMap<String, (String, Vec<String>)>;
/// As read from a text: no label names for a family without samples.
type Read = std::collections::BTreeMap<String, (String, Option<Vec<String>>)>;

/// The checked-in list every face compares with
/// (`core/tests/fixtures/metric-families.txt`).
fn fixture() -> Parsed {
    let text = include_str!("fixtures/metric-families.txt");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut w = l.split_whitespace().map(str::to_owned);
            let name = w.next().unwrap();
            let kind = w.next().expect("a type");
            (name, (kind, w.collect()))
        })
        .collect()
}

/// A strict reader of the Prometheus text format (0.0.4) and of
/// OpenMetrics text: every line is a `# HELP`, `# TYPE`, `# UNIT`, `# EOF`
/// or a sample `name{label="value",...} value` of the family last typed;
/// label values are quoted with their escapes; values are numbers. Names
/// are canonical: a counter by its sample name (`_total`). Panics on
/// anything else. A family without samples has no label names to read:
/// they are `None`.
fn parse(text: &str) -> Read {
    let mut out = std::collections::BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    for line in text.lines() {
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut w = rest.splitn(3, ' ');
            let (what, name) = (w.next().unwrap(), w.next().expect("a name"));
            assert!(name_ok(name), "bad name in {line:?}");
            match what {
                "HELP" | "UNIT" => {}
                "TYPE" => {
                    let kind = w.next().expect("a type").to_owned();
                    assert!(
                        ["counter", "gauge", "histogram"].contains(&kind.as_str()),
                        "{line:?}"
                    );
                    let canonical = if kind == "counter" && !name.ends_with("_total") {
                        format!("{name}_total")
                    } else {
                        name.to_owned()
                    };
                    assert!(!out.contains_key(&canonical), "{canonical} typed twice");
                    out.insert(canonical, (kind.clone(), None));
                    current = Some((name.to_owned(), kind));
                }
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        let (fam, kind) = current
            .clone()
            .unwrap_or_else(|| panic!("untyped {line:?}"));
        let end = line.find(['{', ' ']).unwrap_or_else(|| panic!("{line:?}"));
        let sample = &line[..end];
        let suffix = sample
            .strip_prefix(fam.as_str())
            .unwrap_or_else(|| panic!("{sample} is not of family {fam}"));
        let allowed: &[&str] = match kind.as_str() {
            "counter" if fam.ends_with("_total") => &[""],
            "counter" => &["_total", "_created"],
            "gauge" => &[""],
            _ => &["_bucket", "_sum", "_count", "_created"],
        };
        assert!(allowed.contains(&suffix), "{sample} in {kind} {fam}");
        let mut rest = &line[end..];
        let mut names = Vec::new();
        if let Some(r) = rest.strip_prefix('{') {
            let mut r = r;
            loop {
                if let Some(after) = r.strip_prefix('}') {
                    r = after;
                    break;
                }
                let eq = r.find('=').unwrap_or_else(|| panic!("{line:?}"));
                let label = &r[..eq];
                assert!(name_ok(label), "label {label:?} in {line:?}");
                r = r[eq + 1..]
                    .strip_prefix('"')
                    .unwrap_or_else(|| panic!("unquoted value in {line:?}"));
                let mut chars = r.char_indices();
                let close = loop {
                    match chars.next() {
                        Some((_, '\\')) => {
                            let (_, e) = chars.next().expect("an escape");
                            assert!(['\\', '"', 'n'].contains(&e), "escape {e} in {line:?}");
                        }
                        Some((i, '"')) => break i,
                        Some((_, '\n')) | None => panic!("open value in {line:?}"),
                        _ => {}
                    }
                };
                r = &r[close + 1..];
                r = r.strip_prefix(',').unwrap_or(r);
                if label == "le" {
                    assert_eq!(suffix, "_bucket", "le outside a bucket: {line:?}");
                } else {
                    names.push(label.to_owned());
                }
            }
            rest = r;
        }
        let value = rest.strip_prefix(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value = value.split(' ').next().unwrap();
        assert!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "value {value:?} in {line:?}"
        );
        let canonical = if kind == "counter" && !fam.ends_with("_total") {
            format!("{fam}_total")
        } else {
            fam.clone()
        };
        let slot = &mut out.get_mut(&canonical).unwrap().1;
        match slot {
            None => *slot = Some(names),
            Some(seen) => assert_eq!(*seen, names, "label names differ in {line:?}"),
        }
    }
    out
}

/// Every family of the fixture, typed and labelled as it says, and no
/// other; every family has samples (so its label names are read).
fn assert_matches_fixture(face: &str, parsed: &Read) {
    let want = fixture();
    let got: Parsed = parsed
        .iter()
        .map(|(n, (k, l))| {
            let l = l
                .clone()
                .unwrap_or_else(|| panic!("{face}: {n} has no sample"));
            (n.clone(), (k.clone(), l))
        })
        .collect();
    assert_eq!(
        got, want,
        "{face}: the families differ from core/tests/fixtures/metric-families.txt"
    );
}

/// A client with every family filled: a lock held (slack), an election
/// led (`dlock_election_leader`), a semaphore's slot held
/// (`dlock_semaphore_*`) and a read/write lock's reader
/// (`dlock_rwlock_held`).
fn every_family(
    service: &MemoryService,
) -> (
    Client,
    dlock::Lock,
    dlock::Election,
    dlock::Lock,
    dlock::Lock,
) {
    let c = client(service);
    let lock = c.lock("metrics/fixture").unwrap();
    lock.acquire(ms(2000)).unwrap();
    let e = c.election("metrics/fixture-election").unwrap();
    e.campaign(b"me", ms(2000)).unwrap();
    let sem = c.semaphore("metrics/fixture-semaphore", 3).unwrap();
    let slot = sem.acquire(ms(2000)).unwrap();
    let reader = c.rwlock("metrics/fixture-rwlock").unwrap().read().unwrap();
    reader.acquire(ms(2000)).unwrap();
    (c, lock, e, slot, reader)
}

#[test]
fn the_core_text_has_the_fixtures_families() {
    let service = MemoryService::new();
    let (c, _lock, _e, _slot, _reader) = every_family(&service);
    assert_matches_fixture("to_text", &parse(&c.snapshot().to_text()));
    // The families' own declarations say the same, samples or none.
    let declared: Parsed = c
        .snapshot()
        .families()
        .into_iter()
        .map(|f| {
            let kind = f.kind.as_str();
            (
                f.name.to_owned(),
                (
                    kind.to_owned(),
                    f.labels.iter().map(|l| (*l).to_owned()).collect(),
                ),
            )
        })
        .collect();
    assert_eq!(declared, fixture());
}

/// The strict reader refuses what it must (so the comparisons above can
/// fail).
#[test]
fn the_reader_is_strict() {
    for bad in [
        "dlock_x 1\n",
        "# TYPE dlock_x gauge\ndlock_y 1\n",
        "# TYPE dlock_x gauge\ndlock_x{a=b} 1\n",
        "# TYPE dlock_x gauge\ndlock_x{a=\"b} 1\n",
        "# TYPE dlock_x gauge\ndlock_x one\n",
        "# TYPE dlock_x gauge\ndlock_x{a=\"1\"} 1\ndlock_x{b=\"1\"} 1\n",
        "# TYPE dlock_x summary\n",
        "# TYPE dlock_x gauge\ndlock_x{le=\"1\"} 1\n",
    ] {
        let r = std::panic::catch_unwind(|| parse(bad));
        assert!(r.is_err(), "read {bad:?}");
    }
    let mut fixture_minus_one = fixture();
    fixture_minus_one.pop_last();
    assert_ne!(fixture_minus_one, fixture());
}

#[test]
fn an_election_leader_is_one_and_a_follower_zero() {
    let service = MemoryService::new();
    let (a, b) = (client(&service), client(&service));
    let ea = a.election("metrics/elect").unwrap();
    let eb = b.election("metrics/elect").unwrap();
    assert_eq!(metric(&a, "dlock_election_leader", &["metrics/elect"]), 0.0);
    ea.campaign(b"a", ms(2000)).unwrap();
    assert_eq!(metric(&a, "dlock_election_leader", &["metrics/elect"]), 1.0);
    assert_eq!(
        eb.campaign(b"b", Duration::ZERO).unwrap_err().code(),
        "would_block"
    );
    assert_eq!(metric(&b, "dlock_election_leader", &["metrics/elect"]), 0.0);
    // A lock is no election: no series for it.
    let lock = a.lock("metrics/not-an-election").unwrap();
    lock.acquire(ms(2000)).unwrap();
    let fs = a.snapshot().families();
    let leader = family(&fs, "dlock_election_leader");
    assert_eq!(leader.series.len(), 1, "{:?}", leader.series);
    ea.resign(ms(1000)).unwrap();
    assert_eq!(metric(&a, "dlock_election_leader", &["metrics/elect"]), 0.0);
}

/// The fence lateness is `on_fence` start − deadline: a callback thread
/// kept busy by another lock's callback past the deadline makes the fence
/// that late, although the driver dispatched it on time.
#[test]
fn fence_lateness_is_measured_when_on_fence_starts() {
    let service = MemoryService::new();
    let c = client(&service);
    let other = client(&service);
    let lock = c.lock("metrics/late").unwrap();
    let (fenced_tx, fenced_rx) = std::sync::mpsc::channel();
    lock.on_fence(move |_, _| {
        let _ = fenced_tx.send(());
    });
    lock.acquire(ms(2000)).unwrap();
    // Another client's callback holds the process's one callback thread.
    let busy = other.lock("metrics/busy").unwrap();
    let (hold_tx, hold_rx) = std::sync::mpsc::channel::<()>();
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let hold_rx = std::sync::Mutex::new(hold_rx);
    busy.on_acquired(move |_| {
        let _ = held_tx.send(());
        let _ = hold_rx.lock().unwrap().recv_timeout(ms(10_000));
    });
    busy.acquire(ms(2000)).unwrap();
    held_rx
        .recv_timeout(ms(2000))
        .expect("the callback thread is held");
    c.link().unwrap().drop_keepalive_replies(true);
    assert!(
        eventually(ms(5000), || metric(&c, "dlock_fences_total", &["deadline"])
            == 1.0),
        "the driver fenced at the deadline"
    );
    // The driver has dispatched the fence; on_fence cannot start yet.
    let held = ms(400);
    std::thread::sleep(held);
    assert_eq!(metric(&c, "dlock_fence_lateness_seconds", &[]), 0.0);
    hold_tx.send(()).unwrap();
    fenced_rx.recv_timeout(ms(5000)).expect("on_fence ran");
    let fs = c.snapshot().families();
    let Value::Histogram(h) = &family(&fs, "dlock_fence_lateness_seconds").series[0].1 else {
        panic!("a histogram")
    };
    assert_eq!(h.count, 1);
    assert!(
        h.sum >= held.as_secs_f64(),
        "lateness {} s, on_fence started more than {held:?} after the fence",
        h.sum
    );
    c.link().unwrap().drop_keepalive_replies(false);
}

/// `dlock::log::forward`: the core's events reach a face's sink on the
/// `dlock-log` thread, with their level, target and fields.
#[test]
fn the_log_reaches_a_faces_sink() {
    let (tx, rx) = std::sync::mpsc::channel::<dlock::log::Record>();
    let tx = std::sync::Mutex::new(tx);
    dlock::log::forward(
        dlock::log::Level::DEBUG,
        Some(Box::new(move |r| {
            assert_eq!(std::thread::current().name(), Some("dlock-log"));
            let _ = tx.lock().unwrap().send(r);
        })),
    )
    .unwrap();
    let service = MemoryService::new();
    let c = client(&service);
    let lock = c.lock("metrics/log").unwrap();
    lock.acquire(ms(2000)).unwrap();
    let until = Instant::now() + ms(5000);
    let acquired = loop {
        let r = rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .expect("an acquired record");
        if r.message.starts_with("acquired") && r.message.contains("metrics/log") {
            break r;
        }
    };
    assert_eq!(acquired.level, dlock::log::Level::INFO);
    assert!(acquired.target.starts_with("dlock"), "{}", acquired.target);
    dlock::log::forward(dlock::log::Level::DEBUG, None).unwrap();
    lock.release().unwrap();
}

/// Every counter's series and every histogram's count of `c`, by family
/// and label values.
fn counts(c: &Client) -> Vec<(String, Vec<String>, f64)> {
    let mut out = Vec::new();
    for f in c.snapshot().families() {
        for (l, v) in f.series {
            match (f.kind, v) {
                (Kind::Counter, Value::Number(n)) => out.push((f.name.to_owned(), l, n)),
                (Kind::Histogram, Value::Histogram(h)) => {
                    out.push((format!("{}_count", f.name), l, h.count as f64))
                }
                _ => {}
            }
        }
    }
    out
}

/// Issue 32, item 1: a client's counters never go down, whatever happens
/// to its handles: locks and sessions dropped or closed keep their counts
/// in the client's figures (Prometheus reads a drop as a reset).
#[test]
fn counters_never_go_down_when_handles_are_dropped() {
    let service = MemoryService::new();
    let c = client(&service);
    let session = c.session(common::short()).unwrap();
    let mut locks = Vec::new();
    for i in 0..3 {
        let lock = c.lock(&format!("metrics/gone/{i}")).unwrap();
        lock.acquire(ms(2000)).unwrap();
        locks.push(lock);
    }
    let other = session.lock("metrics/gone/session").unwrap();
    assert_eq!(other.permit().unwrap_err(), Refused::NotHeld);
    other.acquire(ms(2000)).unwrap();
    // An operator deletes a key: a `lock_lost` fence, then a reacquisition.
    assert!(service.delete_lock_key("metrics/gone/0"));
    assert!(eventually(ms(3000), || {
        metric(&c, "dlock_fences_total", &["lock_lost"]) == 1.0
            && metric(&c, "dlock_acquisitions_total", &[]) == 5.0
    }));
    assert!(eventually(ms(3000), || metric(
        &c,
        "dlock_keepalives_total",
        &["ok"]
    ) >= 2.0));
    let before = counts(&c);
    locks[1].release().unwrap();
    drop(locks);
    drop(other);
    session.close().unwrap();
    drop(session);
    // Every handle but the client's default session is gone.
    assert!(eventually(ms(3000), || {
        metric(&c, "dlock_session_locks", &[]) == 0.0 && metric(&c, "dlock_sessions", &[]) == 1.0
    }));
    let after = counts(&c);
    for (name, labels, was) in &before {
        let now = after
            .iter()
            .find(|(n, l, _)| n == name && l == labels)
            .map_or(0.0, |(_, _, v)| *v);
        assert!(now >= *was, "{name}{labels:?} went down: {was} -> {now}");
    }
    assert_eq!(metric(&c, "dlock_acquisitions_total", &[]), 5.0);
    assert_eq!(metric(&c, "dlock_fences_total", &["lock_lost"]), 1.0);
    assert_eq!(
        metric(&c, "dlock_permits_refused_total", &["not_held"]),
        1.0
    );
}

/// Issue 32, item 2: every client of the process as one page (what the
/// Python and Node collectors export): each family once, both clients'
/// locks in it, and its counters never go down when a client is dropped.
#[test]
fn the_process_snapshot_is_every_client_as_one() {
    let service = MemoryService::new();
    let (a, b) = (client(&service), client(&service));
    let la = a.lock("metrics/process/a").unwrap();
    la.acquire(ms(2000)).unwrap();
    let lb = b.lock("metrics/process/b").unwrap();
    lb.acquire(ms(2000)).unwrap();
    let e = a.election("metrics/process/e").unwrap();
    e.campaign(b"a", ms(2000)).unwrap();
    let _slot = b
        .semaphore("metrics/process/s", 2)
        .unwrap()
        .acquire(ms(2000))
        .unwrap();
    let reader = a.rwlock("metrics/process/rw").unwrap().read().unwrap();
    reader.acquire(ms(2000)).unwrap();
    let snap = dlock::metrics::process_snapshot();
    // The strict reader refuses a family typed twice.
    assert_matches_fixture("process_snapshot", &parse(&snap.to_text()));
    let fs = snap.families();
    let held = family(&fs, "dlock_lock_held");
    for name in ["metrics/process/a", "metrics/process/b"] {
        assert!(
            held.series
                .iter()
                .any(|(l, v)| l[0] == name && *v == Value::Number(1.0)),
            "{name} not in {:?}",
            held.series
        );
    }
    let acquisitions = || {
        let fs = dlock::metrics::process_snapshot().families();
        match family(&fs, "dlock_acquisitions_total").series[0].1 {
            Value::Number(n) => n,
            _ => unreachable!(),
        }
    };
    let before = acquisitions();
    drop(lb);
    drop(b);
    assert!(eventually(ms(3000), || {
        let fs = dlock::metrics::process_snapshot().families();
        !family(&fs, "dlock_lock_state")
            .series
            .iter()
            .any(|(l, _)| l[0] == "metrics/process/b")
    }));
    // Other tests of this process only add to it.
    assert!(acquisitions() >= before, "{} < {before}", acquisitions());
}
