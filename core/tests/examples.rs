//! The examples' stories on the embedded backend, checked on their typed
//! output (the JSON events of `DLOCK_STORY=json`): the examples' own code
//! runs here, included as modules, its events captured in memory.
//! `examples_etcd.rs` runs the same on etcd; `c_worker.rs` checks the C
//! worker.

// Each example includes its own copy of examples/rust/support/*.rs, as in
// its own binary.
#![allow(clippy::duplicate_mod)]

// Each example's `main` is not called here, only its `run`.
#[allow(dead_code)]
#[path = "../../examples/rust/fence_gate.rs"]
mod fence_gate;
#[allow(dead_code)]
#[path = "../../examples/rust/guarded_write.rs"]
mod guarded_write;
#[allow(dead_code)]
#[path = "../../examples/rust/quickstart.rs"]
mod quickstart;

use dlock_testkit::story;
use story::Capture;

// The longest story (7 s), named to sort, and so start, first.
#[test]
fn drains_fences_then_b_acquires_quickstart() {
    let capture = Capture::default();
    quickstart::run(capture.sink(), None).expect("the quickstart runs");
    story::quickstart(&capture.events(), "embedded");
}

#[test]
fn fence_gate_refuses_the_stale_write() {
    let capture = Capture::default();
    fence_gate::run(capture.sink()).expect("fence_gate runs");
    story::fence_gate(&capture.events());
}

#[test]
fn guarded_write_is_refused_by_the_service() {
    let capture = Capture::default();
    guarded_write::run(capture.sink(), None).expect("guarded_write runs");
    story::guarded_write(&capture.events(), "embedded");
}
