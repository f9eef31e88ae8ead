use std::path::Path;
use std::time::Duration;

use super::*;

const SETTINGS: &str = r#""settings": {"ttl_ms": 2000, "keepalive_interval_ms": 500, "keepalive_timeout_ms": 200, "retry_interval_ms": 200, "margin_ms": 500}"#;

fn doc(holders: &str, steps: &str, trace: &str) -> String {
    format!(
        r#"{{"name": "t", "about": "a test", {SETTINGS}, "holders": {holders}, "steps": [{steps}], "trace": [{trace}]}}"#
    )
}

/// A file with a `layout` (no steps, no trace).
fn laid_out(holders: &str, layout: &str) -> Result<Scenario, String> {
    parse(&format!(
        r#"{{"name": "t", {SETTINGS}, "holders": {holders}, "layout": {layout}, "steps": [], "trace": []}}"#
    ))
}

fn place(client: &str, session: &str, lock: &str) -> Placement {
    Placement {
        client: client.into(),
        session: session.into(),
        lock: lock.into(),
        role: Role::Lock,
        limit: None,
    }
}

fn placed(role: Role, client: &str, session: &str, name: &str) -> Placement {
    Placement {
        role,
        ..place(client, session, name)
    }
}

fn ev(at_ms: u64, line: &str) -> Event {
    Event {
        at_ms,
        line: line.into(),
    }
}

fn exp(s: &str) -> Expected {
    Expected::parse(s).unwrap()
}

#[test]
fn parses_every_step() {
    let steps = r#"
        {"do": "acquire", "holder": "a"},
        {"do": "try_acquire", "holder": "b", "expect": "would_block"},
        {"at": 600, "do": "permit", "holder": "a", "as": "p1", "expect": "granted", "token": 1},
        {"do": "permit", "holder": "a", "expect": "draining"},
        {"do": "valid", "permit": "p1", "expect": true},
        {"do": "end", "permit": "p1"},
        {"do": "state", "holder": "a", "expect": "Holding"},
        {"do": "token", "holder": "a", "expect": 2},
        {"do": "token", "holder": "b", "expect": null},
        {"do": "release", "holder": "a"},
        {"do": "wait", "event": "a drained"},
        {"do": "fault", "holder": "a", "fault": "delay_replies", "ms": 1500},
        {"do": "fault", "holder": "a", "fault": "thaw_expiry"},
        {"do": "fault", "holder": "b", "fault": "delete_key"},
        {"do": "fault", "holder": "b", "fault": "revoke_lease"},
        {"do": "stall_driver", "ms": 2000},
        {"do": "close", "holder": "b"},
        {"do": "events", "holder": "a", "expect": ["drained", "acquired token=1"]},
        {"do": "acquire_start", "holder": "b"},
        {"do": "cancel", "holder": "b"},
        {"do": "shutdown", "holder": "a"}
    "#;
    let s = parse(&doc(
        r#"["a", "b"]"#,
        steps,
        r#""a drained @1250..1500", "b drained""#,
    ))
    .unwrap();
    assert_eq!(s.name, "t");
    assert_eq!(s.about, "a test");
    assert_eq!(s.settings.ttl_ms, 2000);
    assert_eq!(s.settings.margin_ms, 500);
    assert_eq!(s.holders, ["a", "b"]);
    let st: Vec<_> = s.steps.iter().map(|t| t.step.clone()).collect();
    let h = |n: &str| n.to_string();
    assert_eq!(
        st,
        vec![
            Step::Acquire { holder: h("a") },
            Step::TryAcquire {
                holder: h("b"),
                expect: h("would_block")
            },
            Step::Permit {
                holder: h("a"),
                expect: h("granted"),
                token: Some(1),
                above: None,
                label: Some(h("p1"))
            },
            Step::Permit {
                holder: h("a"),
                expect: h("draining"),
                token: None,
                above: None,
                label: None
            },
            Step::Valid {
                permit: h("p1"),
                expect: true
            },
            Step::End { permit: h("p1") },
            Step::State {
                holder: h("a"),
                expect: h("Holding")
            },
            Step::Token {
                holder: h("a"),
                expect: Some(2)
            },
            Step::Token {
                holder: h("b"),
                expect: None
            },
            Step::Release { holder: h("a") },
            Step::Wait {
                event: h("a drained")
            },
            Step::Fault {
                holder: h("a"),
                fault: Fault::DelayReplies,
                ms: Some(1500)
            },
            Step::Fault {
                holder: h("a"),
                fault: Fault::ThawExpiry,
                ms: None
            },
            Step::Fault {
                holder: h("b"),
                fault: Fault::DeleteKey,
                ms: None
            },
            Step::Fault {
                holder: h("b"),
                fault: Fault::RevokeLease,
                ms: None
            },
            Step::StallDriver { ms: 2000 },
            Step::Close { holder: h("b") },
            Step::Events {
                holder: h("a"),
                expect: vec![h("drained"), h("acquired token=1")]
            },
            Step::AcquireStart { holder: h("b") },
            Step::Cancel { holder: h("b") },
            Step::Shutdown { holder: h("a") },
        ]
    );
    assert_eq!(s.steps[2].at, Some(600));
    assert_eq!(s.steps[0].at, None);
    assert!(s.steps[2].text.contains(r#""as":"p1""#));
    assert_eq!(
        s.trace,
        vec![
            Expected {
                line: h("a drained"),
                window: Some((1250, 1500))
            },
            Expected {
                line: h("b drained"),
                window: None
            },
        ]
    );
    let names: Vec<_> = st.iter().map(Step::name).collect();
    assert_eq!(names[17], "events");
    assert_eq!(st[0].holder(), Some("a"));
    assert_eq!(st[15].holder(), None);
    // No layout: every holder its own client, default session, one name.
    let shared = r#"scenario/"t""#;
    assert_eq!(s.default_lock(), shared);
    assert_eq!(
        s.layout,
        [place("a", "default", shared), place("b", "default", shared)]
    );
}

#[test]
fn layout_fills_defaults() {
    let s = laid_out(
        r#"["a", "b", "c", "d"]"#,
        r#"{"a": {"client": "s", "lock": "x"},
            "b": {"client": "s", "session": "two"},
            "c": {"session": "default", "lock": "x"}}"#,
    )
    .unwrap();
    let shared = r#"scenario/"t""#;
    assert_eq!(
        s.layout,
        [
            place("s", "default", "x"),
            place("s", "two", shared),
            place("c", "default", "x"),
            place("d", "default", shared),
        ]
    );
    assert!(s.layout[0].default_session() && !s.layout[1].default_session());
    assert_eq!(s.placement("b"), Some(place("s", "two", shared)));
    assert_eq!(s.placement("z"), None);
    // A scenario built by hand without a layout: the defaults.
    let bare = Scenario {
        layout: Vec::new(),
        ..s.clone()
    };
    assert_eq!(bare.placement_at(1), place("b", DEFAULT_SESSION, shared));
    // An empty layout is no layout.
    assert_eq!(
        laid_out(r#"["a"]"#, "{}").unwrap().layout,
        [place("a", "default", shared)]
    );
}

#[test]
fn layout_refuses_bad_entries() {
    let bad =
        |holders: &str, layout: &str| laid_out(holders, layout).expect_err("should not parse");
    let e = bad(r#"["a"]"#, r#"{"z": {"client": "s"}}"#);
    assert!(e.contains("layout: no holder `z`"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"clinet": "s"}}"#);
    assert!(e.contains("clinet"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"lock": ""}}"#);
    assert!(e.contains("`a`: an empty `lock`"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"session": 2}}"#);
    assert!(e.starts_with("bad JSON"), "{e}");
    let e = bad(r#"["a"]"#, r#"["a"]"#);
    assert!(e.starts_with("bad JSON"), "{e}");
    let e = bad(r#"["a", "a"]"#, "{}");
    assert!(e.contains("`a` twice"), "{e}");
}

/// The C header's `enum lks_fault` has the numbers `ffi` hands a C face.
#[test]
fn header_fault_numbers() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ffi-c/tests/c/scenario_runner.h"),
    )
    .unwrap();
    let all = [
        Fault::Partition,
        Fault::Heal,
        Fault::DropReplies,
        Fault::KeepReplies,
        Fault::DelayReplies,
        Fault::FailKeepalives,
        Fault::StopFailing,
        Fault::LeaseLost,
        Fault::FreezeExpiry,
        Fault::ThawExpiry,
        Fault::DeleteKey,
        Fault::RevokeLease,
    ];
    for f in all {
        let line = format!(
            "LKS_FAULT_{} = {}",
            f.as_str().to_uppercase(),
            ffi::fault_code(f)
        );
        assert!(header.contains(&line), "the header lacks `{line}`");
    }
}

#[test]
fn refuses_bad_files() {
    let bad = |holders: &str, steps: &str, trace: &str| {
        parse(&doc(holders, steps, trace)).expect_err("should not parse")
    };
    assert!(bad(r#"["a"]"#, r#"{"do": "jump", "holder": "a"}"#, "").contains("step 0"));
    assert!(bad(r#"["a"]"#, r#"{"do": "acquire", "holder": "z"}"#, "").contains("no holder `z`"));
    assert!(
        bad(
            r#"["a"]"#,
            r#"{"do": "acquire", "holder": "a", "expekt": 1}"#,
            ""
        )
        .contains("expekt")
    );
    assert!(bad(r#"["a"]"#, r#"{"do": "end", "permit": "p9"}"#, "").contains("p9"));
    assert!(
        bad(
            r#"["a"]"#,
            r#"{"at": "soon", "do": "acquire", "holder": "a"}"#,
            ""
        )
        .contains("`at`")
    );
    assert!(
        bad(
            r#"["a"]"#,
            r#"{"do": "fault", "holder": "a", "fault": "delay_replies"}"#,
            ""
        )
        .contains("needs `ms`")
    );
    assert!(
        bad(
            r#"["a"]"#,
            r#"{"do": "fault", "holder": "a", "fault": "melt"}"#,
            ""
        )
        .contains("melt")
    );
    assert!(
        bad(
            r#"["a"]"#,
            r#"{"do": "fault", "holder": "z", "fault": "delete_key"}"#,
            ""
        )
        .contains("no holder `z`")
    );
    assert!(bad(r#"["a"]"#, "", r#""a drained @5..x""#).contains("trace entry 0"));
    assert!(bad(r#"["a"]"#, "", r#""a drained @9..5""#).contains("lo..hi"));
    assert!(parse("{").unwrap_err().starts_with("bad JSON"));
    assert!(parse(r#"{"name": "t"}"#).unwrap_err().contains("settings"));
}

#[test]
fn loads_the_repository_files() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = scenario_files(&dir).unwrap();
    assert!(files.len() >= 14, "{files:?}");
    for f in files {
        let s = load(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            !s.steps.is_empty() && !s.trace.is_empty(),
            "{}",
            f.display()
        );
    }
}

#[test]
fn trace_windows() {
    let want = [exp("a x @100..200")];
    assert!(check_trace(&want, &[ev(100, "a x")], 0).is_ok());
    assert!(check_trace(&want, &[ev(200, "a x")], 0).is_ok());
    let e = check_trace(&want, &[ev(99, "a x")], 0).unwrap_err();
    assert!(e.contains("at 99 ms, expected 100..200"), "{e}");
    assert!(check_trace(&want, &[ev(201, "a x")], 0).is_err());
    // The slack widens the upper end only.
    assert!(check_trace(&want, &[ev(450, "a x")], 300).is_ok());
    assert!(check_trace(&want, &[ev(99, "a x")], 300).is_err());
    assert!(check_trace(&want, &[ev(501, "a x")], 300).is_err());
    // No window: any time.
    assert!(check_trace(&[exp("a x")], &[ev(99_999, "a x")], 0).is_ok());
}

#[test]
fn trace_order_missing_extra() {
    let want = [exp("a x"), exp("a y"), exp("b z")];
    let ok = [ev(1, "a x"), ev(2, "a y"), ev(3, "b z")];
    assert!(check_trace(&want, &ok, 0).is_ok());
    let e = check_trace(&want, &[ev(1, "a y"), ev(2, "a x"), ev(3, "b z")], 0).unwrap_err();
    assert!(
        e.contains("trace event 0: expected `a x`, got `a y`"),
        "{e}"
    );
    let e = check_trace(&want, &ok[..2], 0).unwrap_err();
    assert!(
        e.contains("has 2 events, expected 3: missing from event 2 `b z`"),
        "{e}"
    );
    let mut extra = ok.to_vec();
    extra.push(ev(4, "a w"));
    let e = check_trace(&want, &extra, 0).unwrap_err();
    assert!(e.contains("extra event 3 `a w` at 4 ms"), "{e}");
    assert!(check_trace(&[], &[], 0).is_ok());
}

#[test]
fn sink_waits_and_stamps() {
    let t = TraceSink::new();
    let t2 = t.clone();
    let th = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(30));
        t2.push("a one");
        t2.push("a two");
        t2.push("a one");
    });
    let lim = Duration::from_secs(5);
    assert_eq!(t.wait_for("a two", 0, lim), Some(1));
    assert_eq!(t.wait_for("a one", 1, lim), Some(2));
    // At or after the previous match.
    assert_eq!(t.wait_for("a one", 2, lim), Some(2));
    assert_eq!(t.wait_for("a none", 0, Duration::from_millis(20)), None);
    th.join().unwrap();
    let all = t.wait_len(3, lim);
    assert_eq!(all.len(), 3);
    assert!(all[0].at_ms >= 30 && all[0].at_ms <= all[2].at_ms);
    assert_eq!(
        show(&all[..1]),
        format!("  {:>5} ms  a one\n", all[0].at_ms)
    );
}

/// A face over a toy lock: acquire grants at once and pushes the events.
#[derive(Default)]
struct Toy {
    trace: Option<TraceSink>,
    /// How long setup takes (a client's connection under a sanitizer).
    setup_delay: Duration,
    held: bool,
    performed: Vec<String>,
    torn_down: usize,
}

impl Face for Toy {
    fn setup(&mut self, _: &Scenario, trace: TraceSink) -> Result<(), String> {
        std::thread::sleep(self.setup_delay);
        self.trace = Some(trace);
        Ok(())
    }

    fn perform(&mut self, step: &Step) -> Result<Observed, String> {
        self.performed.push(step.name().into());
        let t = self.trace.as_ref().unwrap();
        Ok(match step {
            Step::Acquire { holder } => {
                let t = t.clone();
                let h = holder.clone();
                self.held = true;
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    t.push(format!("{h} acquired token=1"));
                });
                Observed::Done
            }
            Step::Permit { .. } => Observed::Permit {
                word: if self.held { "granted" } else { "released" }.into(),
                token: self.held.then_some(1),
            },
            Step::State { .. } => Observed::Word("Holding".into()),
            Step::Token { .. } => Observed::Token(self.held.then_some(1)),
            Step::Release { holder } | Step::Close { holder } => {
                self.held = false;
                t.push(format!("{holder} released"));
                Observed::Done
            }
            Step::Events { .. } => Observed::Unsupported,
            _ => return Err("not in the toy".into()),
        })
    }

    fn teardown(&mut self) {
        self.torn_down += 1;
    }
}

fn toy(steps: &str, trace: &str) -> (Outcome, Toy) {
    let s = parse(&doc(r#"["a"]"#, steps, trace)).unwrap();
    let mut face = Toy::default();
    let cfg = Config {
        wait_limit: Duration::from_millis(500),
        ..Config::default()
    };
    (play(&s, &mut face, &cfg), face)
}

#[test]
fn plays_through_a_face() {
    let (o, face) = toy(
        r#"{"do": "acquire", "holder": "a"},
           {"do": "wait", "event": "a acquired token=1"},
           {"at": 50, "do": "permit", "holder": "a", "expect": "granted", "token": 1},
           {"do": "state", "holder": "a", "expect": "Holding"},
           {"do": "token", "holder": "a", "expect": 1},
           {"do": "events", "holder": "a", "expect": ["acquired token=1"]},
           {"do": "close", "holder": "a"},
           {"do": "token", "holder": "a", "expect": null},
           {"do": "permit", "holder": "a", "expect": "released"}"#,
        r#""a acquired token=1 @0..400", "a released @50..450""#,
    );
    assert_eq!(o.result, Ok(()), "{}", o.report("toy"));
    assert_eq!(face.torn_down, 1);
    // `wait` is the runner's: the face never sees it.
    assert!(!face.performed.iter().any(|p| p == "wait"));
    assert_eq!(o.notes.len(), 1);
    assert!(o.notes[0].contains("step 5") && o.notes[0].contains("unsupported"));
    assert_eq!(o.trace.len(), 2);
    assert!(o.trace[1].at_ms >= 50);
    assert!(o.report("toy").starts_with("toy: ok\n"));
}

/// A slow setup (C under ASan took 388 ms to connect) does not move the
/// first event out of its window: time zero is when the steps begin.
#[test]
fn the_clock_starts_after_the_faces_setup() {
    let s = parse(&doc(
        r#"["a"]"#,
        r#"{"do": "acquire", "holder": "a"}, {"do": "wait", "event": "a acquired token=1"}"#,
        r#""a acquired token=1 @0..150""#,
    ))
    .unwrap();
    let mut face = Toy {
        setup_delay: Duration::from_millis(400),
        ..Toy::default()
    };
    let o = play(&s, &mut face, &Config::default());
    assert_eq!(o.result, Ok(()), "{}", o.report("toy"));
    assert!(o.trace[0].at_ms < 150, "{:?}", o.trace);
}

#[test]
fn judges_what_the_face_saw() {
    let acquire =
        r#"{"do": "acquire", "holder": "a"}, {"do": "wait", "event": "a acquired token=1"}"#;
    let fails = |step: &str| {
        let (o, face) = toy(&format!("{acquire}, {step}"), r#""a acquired token=1""#);
        assert_eq!(face.torn_down, 1);
        let e = o.result.clone().unwrap_err();
        assert!(e.starts_with("step 2 "), "{e}");
        assert!(
            o.report("toy").contains("a acquired token=1"),
            "the report shows the trace"
        );
        e
    };
    assert!(
        fails(r#"{"do": "permit", "holder": "a", "expect": "draining"}"#)
            .ends_with("permit gave granted")
    );
    assert!(
        fails(r#"{"do": "permit", "holder": "a", "expect": "granted", "token": 2}"#)
            .ends_with("permit token 1")
    );
    assert!(
        fails(r#"{"do": "state", "holder": "a", "expect": "Fenced"}"#)
            .ends_with("state was Holding")
    );
    assert!(fails(r#"{"do": "token", "holder": "a", "expect": 3}"#).ends_with("token was Some(1)"));
    assert!(
        fails(r#"{"do": "try_acquire", "holder": "a", "expect": "ok"}"#)
            .ends_with("not in the toy")
    );
    // A wait that times out.
    let (o, _) = toy(r#"{"do": "wait", "event": "a never"}"#, "");
    assert!(o.result.unwrap_err().contains("no `a never` within"));
    // The final comparison.
    let (o, _) = toy(acquire, r#""a acquired token=1", "a released""#);
    assert!(
        o.result
            .unwrap_err()
            .contains("missing from event 1 `a released`")
    );
}

/// A file with an election: candidates `a`, `b` and observer `o`.
fn election_doc(steps: &str, trace: &str) -> String {
    format!(
        r#"{{"name": "t", {SETTINGS}, "holders": ["a", "b", "o"],
            "layout": {{"a": {{"election": "e"}}, "b": {{"election": "e", "client": "a", "session": "s2"}}, "o": {{"observe": "e"}}}},
            "steps": [{steps}], "trace": [{trace}]}}"#
    )
}

#[test]
fn parses_election_layout_and_steps() {
    let steps = r#"
        {"do": "campaign", "holder": "a", "value": "v1"},
        {"do": "proclaim", "holder": "a", "value": "v2", "expect": "ok"},
        {"do": "proclaim", "holder": "b", "value": "v3", "expect": "not_held"},
        {"do": "resign", "holder": "a", "grace_ms": 500},
        {"do": "leader", "holder": "b", "expect": "v2", "token": 1},
        {"do": "leader", "holder": "b", "expect": null},
        {"do": "observe", "holder": "o"},
        {"do": "permit", "holder": "a", "expect": "released"},
        {"do": "fault", "holder": "o", "fault": "partition"},
        {"do": "shutdown", "holder": "o"}
    "#;
    let s = parse(&election_doc(steps, r#""o observed no-leader""#)).unwrap();
    assert_eq!(
        s.layout,
        [
            placed(Role::Election, "a", "default", "e"),
            placed(Role::Election, "a", "s2", "e"),
            placed(Role::Observer, "o", "default", "e"),
        ]
    );
    assert!(s.uses_elections());
    assert_eq!(s.observers(), ["o"]);
    let h = |n: &str| n.to_string();
    let st: Vec<_> = s.steps.iter().map(|t| t.step.clone()).collect();
    assert_eq!(
        st[..7],
        [
            Step::Campaign {
                holder: h("a"),
                value: h("v1")
            },
            Step::Proclaim {
                holder: h("a"),
                value: h("v2"),
                expect: h("ok")
            },
            Step::Proclaim {
                holder: h("b"),
                value: h("v3"),
                expect: h("not_held")
            },
            Step::Resign {
                holder: h("a"),
                grace_ms: 500
            },
            Step::Leader {
                holder: h("b"),
                expect: Some(h("v2")),
                token: Some(1)
            },
            Step::Leader {
                holder: h("b"),
                expect: None,
                token: None
            },
            Step::Observe { holder: h("o") },
        ]
    );
    let names: Vec<_> = st.iter().map(Step::name).collect();
    assert_eq!(
        names[..7],
        [
            "campaign", "proclaim", "proclaim", "resign", "leader", "leader", "observe"
        ]
    );
    assert_eq!(st[0].value(), Some("v1"));
    assert_eq!(st[1].value(), Some("v2"));
    assert_eq!(st[3].value(), None);
    assert_eq!(st[6].holder(), Some("o"));
    // A file without elections says so.
    let plain = parse(&doc(r#"["a"]"#, "", "")).unwrap();
    assert!(!plain.uses_elections() && plain.observers().is_empty());
    assert_eq!(Role::Observer.as_str(), "observe");
}

#[test]
fn refuses_bad_election_files() {
    let bad =
        |holders: &str, layout: &str| laid_out(holders, layout).expect_err("should not parse");
    let e = bad(r#"["a"]"#, r#"{"a": {"lock": "x", "election": "x"}}"#);
    assert!(e.contains("one of `lock`, `election`, `observe`"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"election": "x", "observe": "x"}}"#);
    assert!(e.contains("one of"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"election": ""}}"#);
    assert!(e.contains("an empty `election`"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"observe": "x", "session": "s"}}"#);
    assert!(e.contains("an observer has no session"), "{e}");
    // Each step on the holder it needs.
    let step = |s: &str| parse(&election_doc(s, "")).expect_err("should not parse");
    let e = step(r#"{"do": "permit", "holder": "o", "expect": "granted"}"#);
    assert!(
        e.contains("`o` is a observe holder; `permit` needs lock or election or read or write"),
        "{e}"
    );
    let e = step(r#"{"do": "observe", "holder": "a"}"#);
    assert!(e.contains("`observe` needs observe"), "{e}");
    let e = step(r#"{"do": "fault", "holder": "o", "fault": "delete_key"}"#);
    assert!(
        e.contains("`fault` needs lock or election or read or write"),
        "{e}"
    );
    let e = parse(&doc(
        r#"["a"]"#,
        r#"{"do": "campaign", "holder": "a", "value": "v"}"#,
        "",
    ))
    .unwrap_err();
    assert!(
        e.contains("`a` is a lock holder; `campaign` needs election"),
        "{e}"
    );
    let e = step(r#"{"do": "proclaim", "holder": "a", "value": "v"}"#);
    assert!(e.contains("expect"), "{e}");
    let e = step(r#"{"do": "resign", "holder": "a"}"#);
    assert!(e.contains("grace_ms"), "{e}");
}

/// A face over a toy election: a campaign elects at once, the observer's
/// line comes before the candidate's (as it may, from another thread).
#[derive(Default)]
struct ElectionToy {
    trace: Option<TraceSink>,
    elections: bool,
    set_up: usize,
    torn_down: usize,
}

impl Face for ElectionToy {
    fn elections(&self) -> bool {
        self.elections
    }

    fn setup(&mut self, _: &Scenario, trace: TraceSink) -> Result<(), String> {
        self.set_up += 1;
        self.trace = Some(trace);
        Ok(())
    }

    fn perform(&mut self, step: &Step) -> Result<Observed, String> {
        let t = self.trace.as_ref().unwrap();
        Ok(match step {
            Step::Observe { holder } => {
                t.push(format!("{holder} observed no-leader"));
                Observed::Done
            }
            Step::Campaign { holder, value } => {
                t.push(format!("o observed leader value={value} token=1"));
                t.push(format!("{holder} acquired token=1"));
                Observed::Done
            }
            Step::Proclaim { .. } => Observed::Word("not_held".into()),
            Step::Leader { .. } => Observed::Leader {
                value: Some("v1".into()),
                token: Some(1),
            },
            _ => return Err("not in the toy".into()),
        })
    }

    fn teardown(&mut self) {
        self.torn_down += 1;
    }
}

fn election_toy(steps: &str, trace: &str, elections: bool) -> (Outcome, ElectionToy) {
    let s = parse(&election_doc(steps, trace)).unwrap();
    let mut face = ElectionToy {
        elections,
        ..ElectionToy::default()
    };
    let cfg = Config {
        wait_limit: Duration::from_millis(300),
        ..Config::default()
    };
    (play(&s, &mut face, &cfg), face)
}

#[test]
fn an_observers_lines_are_ordered_apart() {
    let steps = r#"{"do": "observe", "holder": "o"},
        {"do": "campaign", "holder": "a", "value": "v1"},
        {"do": "wait", "event": "a acquired token=1"},
        {"do": "wait", "event": "o observed leader value=v1 token=1"},
        {"do": "leader", "holder": "b", "expect": "v1", "token": 1},
        {"do": "proclaim", "holder": "b", "value": "v2", "expect": "not_held"}"#;
    // The observer's lines interleave with the candidate's either way.
    let (o, face) = election_toy(
        steps,
        r#""a acquired token=1", "o observed no-leader @0..300", "o observed leader value=v1 token=1""#,
        true,
    );
    assert_eq!(o.result, Ok(()), "{}", o.report("toy"));
    assert_eq!((face.set_up, face.torn_down), (1, 1));
    // Within the observer's own lines the order is exact.
    let (o, _) = election_toy(
        steps,
        r#""a acquired token=1", "o observed leader value=v1 token=1", "o observed no-leader""#,
        true,
    );
    let e = o.result.unwrap_err();
    assert!(e.contains("(observer o's lines)"), "{e}");
    // A candidate's missing line is named as such.
    let (o, _) = election_toy(
        steps,
        r#""a acquired token=1", "b acquired token=2", "o observed no-leader", "o observed leader value=v1 token=1""#,
        true,
    );
    let e = o.result.unwrap_err();
    assert!(
        e.contains("missing from event 1 `b acquired token=2`"),
        "{e}"
    );
    assert!(e.contains("every holder but the observers"), "{e}");
}

#[test]
fn judges_leader_and_proclaim() {
    let campaign = r#"{"do": "campaign", "holder": "a", "value": "v1"}"#;
    let fails = |step: &str| {
        let (o, _) = election_toy(&format!("{campaign}, {step}"), "", true);
        o.result.unwrap_err()
    };
    let e = fails(r#"{"do": "leader", "holder": "a", "expect": "v9"}"#);
    assert!(e.ends_with(r#"the leader's value was Some("v1")"#), "{e}");
    let e = fails(r#"{"do": "leader", "holder": "a", "expect": null}"#);
    assert!(e.contains("value was Some"), "{e}");
    let e = fails(r#"{"do": "leader", "holder": "a", "expect": "v1", "token": 2}"#);
    assert!(e.ends_with("the leader's token was Some(1)"), "{e}");
    let e = fails(r#"{"do": "proclaim", "holder": "a", "value": "v", "expect": "ok"}"#);
    assert!(e.ends_with("proclaim gave not_held"), "{e}");
}

#[test]
fn a_face_without_elections_skips_their_files_visibly() {
    let (o, face) = election_toy(r#"{"do": "observe", "holder": "o"}"#, "", false);
    assert_eq!(o.result, Ok(()));
    assert_eq!(o.skipped.as_deref(), Some("elections"));
    assert_eq!((face.set_up, face.torn_down), (0, 0), "not set up at all");
    let report = o.report("q.json");
    assert!(
        report.starts_with("q.json: SKIPPED, unsupported: this face does not play elections yet"),
        "{report}"
    );
    // The default of a face: no elections.
    assert!(!Toy::default().elections());
    // play_dir counts it apart.
    let dir = std::env::temp_dir().join(format!("dlock-scenarios-skip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("q.json"),
        election_doc(r#"{"do": "observe", "holder": "o"}"#, ""),
    )
    .unwrap();
    let summary = play_dir(&dir, &mut Toy::default(), &Config::default());
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!((summary.played, summary.skipped, summary.failed), (1, 1, 0));
}

/// The C header's numbers of the election steps and the leader answer.
#[test]
fn header_election_numbers() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ffi-c/tests/c/scenario_runner.h"),
    )
    .unwrap();
    for (name, n) in [
        ("LKS_DO_CAMPAIGN", ffi::LKS_DO_CAMPAIGN),
        ("LKS_DO_PROCLAIM", ffi::LKS_DO_PROCLAIM),
        ("LKS_DO_RESIGN", ffi::LKS_DO_RESIGN),
        ("LKS_DO_LEADER", ffi::LKS_DO_LEADER),
        ("LKS_DO_OBSERVE", ffi::LKS_DO_OBSERVE),
        ("LKS_SAW_LEADER", ffi::LKS_SAW_LEADER),
    ] {
        let line = format!("{name} = {n}");
        assert!(header.contains(&line), "the header lacks `{line}`");
    }
    let plays = format!("LKS_PLAYS_ELECTIONS {}u", ffi::LKS_PLAYS_ELECTIONS);
    assert!(header.contains(&plays), "the header lacks `{plays}`");
}

/// A file with a read/write lock: readers `r` and `q`, writer `w`.
fn rwlock_doc(steps: &str, trace: &str) -> String {
    format!(
        r#"{{"name": "t", {SETTINGS}, "holders": ["r", "q", "w"],
            "layout": {{"r": {{"rwlock": "v", "mode": "read"}}, "q": {{"rwlock": "v", "mode": "read", "client": "r", "session": "s2"}}, "w": {{"rwlock": "v", "mode": "write"}}}},
            "steps": [{steps}], "trace": [{trace}]}}"#
    )
}

#[test]
fn parses_rwlock_layout_and_steps() {
    let text =
        rwlock_doc("", "").replace(r#"{"rwlock": "v"}"#, r#"{"rwlock": "v", "mode": "read"}"#);
    let steps = r#"
        {"do": "acquire", "holder": "w"},
        {"do": "mode", "holder": "w", "expect": "write"},
        {"do": "downgrade", "holder": "w", "expect": "ok"},
        {"do": "downgrade", "holder": "r", "expect": "not_held"},
        {"do": "permit", "holder": "q", "expect": "granted", "token": 2}
    "#;
    let s = parse(&text.replace(r#""steps": []"#, &format!(r#""steps": [{steps}]"#))).unwrap();
    assert_eq!(
        s.layout,
        [
            placed(Role::Reader, "r", "default", "v"),
            placed(Role::Reader, "r", "s2", "v"),
            placed(Role::Writer, "w", "default", "v"),
        ]
    );
    assert!(s.uses_rwlocks() && !s.uses_elections());
    let names: Vec<_> = s.steps.iter().map(|t| t.step.name()).collect();
    assert_eq!(
        names,
        ["acquire", "mode", "downgrade", "downgrade", "permit"]
    );
    assert_eq!(
        s.steps[2].step,
        Step::Downgrade {
            holder: "w".into(),
            expect: "ok".into()
        }
    );
    assert_eq!(
        (Role::Reader.as_str(), Role::Writer.as_str()),
        ("read", "write")
    );
    let plain = parse(&doc(r#"["a"]"#, "", "")).unwrap();
    assert!(!plain.uses_rwlocks());
}

#[test]
fn refuses_bad_rwlock_files() {
    let bad = |h: &str, l: &str| laid_out(h, l).expect_err("should not parse");
    let e = bad(r#"["a"]"#, r#"{"a": {"rwlock": "x"}}"#);
    assert!(e.contains("an `rwlock` needs `mode`"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"rwlock": "x", "mode": "upgrade"}}"#);
    assert!(e.contains("an `rwlock` needs `mode`"), "{e}");
    let e = bad(r#"["a"]"#, r#"{"a": {"lock": "x", "mode": "read"}}"#);
    assert!(e.contains("`mode` is for an `rwlock`"), "{e}");
    let e = bad(
        r#"["a"]"#,
        r#"{"a": {"lock": "x", "rwlock": "x", "mode": "read"}}"#,
    );
    assert!(
        e.contains("one of `lock`, `election`, `observe`, `rwlock`"),
        "{e}"
    );
    let e = bad(r#"["a"]"#, r#"{"a": {"rwlock": "", "mode": "read"}}"#);
    assert!(e.contains("an empty `rwlock`"), "{e}");
    let e = bad(
        r#"["a"]"#,
        r#"{"a": {"rwlock": "x", "mode": "read", "slots": 2}}"#,
    );
    assert!(e.contains("unknown field"), "{e}");
    // downgrade and mode only on a reader or a writer.
    let e = parse(&doc(
        r#"["a"]"#,
        r#"{"do": "downgrade", "holder": "a", "expect": "ok"}"#,
        "",
    ))
    .unwrap_err();
    assert!(
        e.contains("`a` is a lock holder; `downgrade` needs read or write"),
        "{e}"
    );
    let e = parse(&rwlock_doc(r#"{"do": "mode", "holder": "w"}"#, "")).unwrap_err();
    assert!(e.contains("expect"), "{e}");
}

#[test]
fn judges_downgrade_and_mode() {
    let w = |expect: &str| Step::Downgrade {
        holder: "w".into(),
        expect: expect.into(),
    };
    assert_eq!(play::judge(&w("ok"), Observed::Word("ok".into())), Ok(()));
    assert!(play::judge(&w("ok"), Observed::Word("fenced".into())).is_err());
    let m = Step::Mode {
        holder: "w".into(),
        expect: "read".into(),
    };
    assert_eq!(play::judge(&m, Observed::Word("read".into())), Ok(()));
    assert!(play::judge(&m, Observed::Word("write".into())).is_err());
    assert!(play::judge(&m, Observed::Done).is_err());
}

#[test]
fn a_face_without_rwlocks_skips_their_files_visibly() {
    let s = parse(&rwlock_doc(r#"{"do": "acquire", "holder": "w"}"#, "")).unwrap();
    let o = play(&s, &mut Toy::default(), &Config::default());
    assert_eq!(o.result, Ok(()));
    assert_eq!(o.skipped.as_deref(), Some("read/write locks"));
    assert!(!Toy::default().rwlocks());
    let report = o.report("v.json");
    assert!(
        report.starts_with(
            "v.json: SKIPPED, unsupported: this face does not play read/write locks yet"
        ),
        "{report}"
    );
}

/// The C header's numbers of the read/write lock steps.
#[test]
fn header_rwlock_numbers() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ffi-c/tests/c/scenario_runner.h"),
    )
    .unwrap();
    for (name, n) in [
        ("LKS_DO_DOWNGRADE", ffi::LKS_DO_DOWNGRADE),
        ("LKS_DO_MODE", ffi::LKS_DO_MODE),
    ] {
        let line = format!("{name} = {n}");
        assert!(header.contains(&line), "the header lacks `{line}`");
    }
    let plays = format!("LKS_PLAYS_RWLOCKS {}u", ffi::LKS_PLAYS_RWLOCKS);
    assert!(header.contains(&plays), "the header lacks `{plays}`");
}

/// A file with a semaphore `w/sem` of limit 2: holders `a` and `b`.
fn semaphore_doc(steps: &str) -> String {
    format!(
        r#"{{"name": "t", {SETTINGS}, "holders": ["a", "b"],
            "layout": {{"a": {{"semaphore": "w/sem", "limit": 2}}, "b": {{"semaphore": "w/sem", "limit": 2, "client": "a", "session": "s2"}}}},
            "steps": [{steps}], "trace": []}}"#
    )
}

#[test]
fn parses_semaphore_layout_and_steps() {
    let steps = r#"
        {"do": "try_acquire", "holder": "a", "expect": "ok"},
        {"do": "slot", "holder": "a", "expect": 0, "lock": "w/sem/slot/0"},
        {"do": "slot", "holder": "b", "expect": null},
        {"do": "acquire", "holder": "b"},
        {"do": "permit", "holder": "b", "expect": "granted", "above": 2},
        {"do": "semaphore", "holder": "b", "limit": 3, "expect": "invalid_argument"},
        {"do": "release", "holder": "a"}
    "#;
    let s = parse(&semaphore_doc(steps)).unwrap();
    let sem = |client: &str, session: &str| Placement {
        limit: Some(2),
        ..placed(Role::Semaphore, client, session, "w/sem")
    };
    assert_eq!(s.layout, [sem("a", "default"), sem("a", "s2")]);
    assert!(s.uses_semaphores() && !s.uses_rwlocks() && !s.uses_elections());
    let names: Vec<_> = s.steps.iter().map(|t| t.step.name()).collect();
    assert_eq!(
        names,
        [
            "try_acquire",
            "slot",
            "slot",
            "acquire",
            "permit",
            "semaphore",
            "release"
        ]
    );
    assert_eq!(
        s.steps[1].step,
        Step::Slot {
            holder: "a".into(),
            expect: Some(0),
            lock: Some("w/sem/slot/0".into())
        }
    );
    assert_eq!(
        s.steps[2].step,
        Step::Slot {
            holder: "b".into(),
            expect: None,
            lock: None
        }
    );
    assert_eq!(
        s.steps[5].step,
        Step::Semaphore {
            holder: "b".into(),
            limit: 3,
            expect: "invalid_argument".into()
        }
    );
    assert_eq!(Role::Semaphore.as_str(), "semaphore");
    let plain = parse(&doc(r#"["a"]"#, "", "")).unwrap();
    assert!(!plain.uses_semaphores());
    assert_eq!(plain.placement_at(0).limit, None);
}

#[test]
fn refuses_bad_semaphore_files() {
    let bad = |l: &str| laid_out(r#"["a"]"#, l).expect_err("should not parse");
    let e = bad(r#"{"a": {"semaphore": "x"}}"#);
    assert!(e.contains("a `semaphore` needs `limit`"), "{e}");
    let e = bad(r#"{"a": {"lock": "x", "limit": 2}}"#);
    assert!(e.contains("`limit` is for a `semaphore`"), "{e}");
    let e = bad(r#"{"a": {"semaphore": "x", "limit": -1}}"#);
    assert!(e.contains("bad JSON"), "{e}");
    let e = bad(r#"{"a": {"semaphore": "x", "rwlock": "x", "mode": "read", "limit": 2}}"#);
    assert!(
        e.contains("one of `lock`, `election`, `observe`, `rwlock`, `semaphore`"),
        "{e}"
    );
    let e = bad(r#"{"a": {"semaphore": "", "limit": 2}}"#);
    assert!(e.contains("an empty `semaphore`"), "{e}");
    // slot and semaphore only on a semaphore holder; the handle's own
    // steps (no lock before a slot is won) not on one.
    let e = parse(&doc(
        r#"["a"]"#,
        r#"{"do": "slot", "holder": "a", "expect": 0}"#,
        "",
    ))
    .unwrap_err();
    assert!(
        e.contains("`a` is a lock holder; `slot` needs semaphore"),
        "{e}"
    );
    for step in [
        r#"{"do": "acquire_start", "holder": "a"}"#,
        r#"{"do": "events", "holder": "a", "expect": []}"#,
        r#"{"do": "fault", "holder": "a", "fault": "delete_key"}"#,
        r#"{"do": "downgrade", "holder": "a", "expect": "ok"}"#,
    ] {
        let e = parse(&semaphore_doc(step)).unwrap_err();
        assert!(e.contains("`a` is a semaphore holder"), "{step}: {e}");
    }
    let e = parse(&semaphore_doc(
        r#"{"do": "semaphore", "holder": "a", "expect": "ok"}"#,
    ))
    .unwrap_err();
    assert!(e.contains("limit"), "{e}");
    // A link fault and a slot's lock steps are a semaphore holder's too.
    parse(&semaphore_doc(
        r#"{"do": "fault", "holder": "a", "fault": "partition"},
           {"do": "state", "holder": "a", "expect": "Holding"},
           {"do": "token", "holder": "a", "expect": 2},
           {"do": "close", "holder": "a"}"#,
    ))
    .unwrap();
}

#[test]
fn judges_slot_semaphore_and_permit_above() {
    let slot = |expect: Option<u32>, lock: Option<&str>| Step::Slot {
        holder: "a".into(),
        expect,
        lock: lock.map(Into::into),
    };
    let saw = |slot: Option<u32>, lock: Option<&str>| Observed::Slot {
        slot,
        lock: lock.map(Into::into),
    };
    let name = Some("w/sem/slot/1");
    assert_eq!(
        play::judge(&slot(Some(1), name), saw(Some(1), name)),
        Ok(())
    );
    assert_eq!(
        play::judge(&slot(Some(1), None), saw(Some(1), name)),
        Ok(())
    );
    assert_eq!(play::judge(&slot(None, None), saw(None, None)), Ok(()));
    let e = play::judge(&slot(Some(0), None), saw(Some(1), name)).unwrap_err();
    assert!(e.contains("the slot was Some(1)"), "{e}");
    let e = play::judge(&slot(Some(1), Some("w/sem/slot/0")), saw(Some(1), name)).unwrap_err();
    assert!(e.contains("the slot's lock was"), "{e}");
    assert!(play::judge(&slot(None, None), saw(Some(0), name)).is_err());
    assert!(play::judge(&slot(None, None), Observed::Token(None)).is_err());

    let sem = Step::Semaphore {
        holder: "a".into(),
        limit: 3,
        expect: "invalid_argument".into(),
    };
    let w = |w: &str| Observed::Word(w.into());
    assert_eq!(play::judge(&sem, w("invalid_argument")), Ok(()));
    let e = play::judge(&sem, w("ok")).unwrap_err();
    assert!(e.contains("the semaphore handle gave ok"), "{e}");

    let permit = |token: Option<u64>, above: Option<u64>| Step::Permit {
        holder: "a".into(),
        expect: "granted".into(),
        token,
        above,
        label: None,
    };
    let granted = |t: u64| Observed::Permit {
        word: "granted".into(),
        token: Some(t),
    };
    assert_eq!(play::judge(&permit(None, Some(2)), granted(3)), Ok(()));
    let e = play::judge(&permit(None, Some(2)), granted(2)).unwrap_err();
    assert!(e.contains("permit token 2, not above 2"), "{e}");
    assert!(play::judge(&permit(Some(3), Some(2)), granted(4)).is_err());
    let e = play::judge(
        &permit(None, Some(2)),
        Observed::Permit {
            word: "granted".into(),
            token: None,
        },
    )
    .unwrap_err();
    assert!(e.contains("no token"), "{e}");
    // A refusal has no token to compare.
    let refused = Step::Permit {
        holder: "a".into(),
        expect: "fenced".into(),
        token: None,
        above: Some(2),
        label: None,
    };
    let fenced = Observed::Permit {
        word: "fenced".into(),
        token: None,
    };
    assert_eq!(play::judge(&refused, fenced), Ok(()));
}

#[test]
fn a_face_without_semaphores_skips_their_files_visibly() {
    let s = parse(&semaphore_doc(r#"{"do": "acquire", "holder": "a"}"#)).unwrap();
    let o = play(&s, &mut Toy::default(), &Config::default());
    assert_eq!(o.result, Ok(()));
    assert_eq!(o.skipped.as_deref(), Some("semaphores"));
    assert!(!Toy::default().semaphores());
    let report = o.report("w.json");
    assert!(
        report.starts_with("w.json: SKIPPED, unsupported: this face does not play semaphores yet"),
        "{report}"
    );
}

/// The C header's numbers of the semaphore steps, observation and bit.
#[test]
fn header_semaphore_numbers() {
    let header = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ffi-c/tests/c/scenario_runner.h"),
    )
    .unwrap();
    for (name, n) in [
        ("LKS_DO_SLOT", ffi::LKS_DO_SLOT),
        ("LKS_DO_SEMAPHORE", ffi::LKS_DO_SEMAPHORE),
        ("LKS_SAW_SLOT", ffi::LKS_SAW_SLOT),
    ] {
        let line = format!("{name} = {n}");
        assert!(header.contains(&line), "the header lacks `{line}`");
    }
    let plays = format!("LKS_PLAYS_SEMAPHORES {}u", ffi::LKS_PLAYS_SEMAPHORES);
    assert!(header.contains(&plays), "the header lacks `{plays}`");
    assert!(header.contains("const uint32_t *holder_limit;"));
}
