//! examples/c/worker on the embedded backend, checked on its typed output
//! (`DLOCK_STORY=json`): commits, then the drain, then the fence, then a
//! clean stop with nothing in flight, and no commit after the fence.
//!
//! A `test = false` target: `scripts/test-c.sh` builds the worker and runs
//! this by name with `DLOCK_C_WORKER` naming the binary; without it the test
//! fails (it never passes as a skip).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_testkit::story;

#[test]
fn worker_stops_cleanly_at_the_fence() {
    let bin = std::env::var_os("DLOCK_C_WORKER")
        .expect("DLOCK_C_WORKER names the C worker binary (scripts/test-c.sh builds it)");
    let mut child = Command::new(&bin)
        // cargo test puts target/debug/deps first on the library path: the
        // worker must load the release libdlock.so it was linked with.
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("DLOCK_ENDPOINTS")
        .env("DLOCK_STORY", "json")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.to_string_lossy()));
    // The story takes about 3 s; a hung worker fails the test.
    let end = Instant::now() + Duration::from_secs(30);
    while child.try_wait().expect("wait for the worker").is_none() {
        if Instant::now() > end {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("the worker's output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the worker exited with {}",
        out.status
    );
    story::c_worker_embedded(&story::Events::parse(&stdout));
}
