//! Metrics for the command (issue 22): `dlock run --metrics-textfile PATH`
//! rewrites the core's Prometheus text atomically (write a temporary file
//! beside it, then rename) for node_exporter's textfile collector (a batch
//! job has no port to scrape), and `dlock show --metrics` prints what etcd
//! says of a lock with the same names.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use clap::Args;

use crate::duration;

#[derive(Args, Debug, Clone, Default)]
pub struct TextfileArgs {
    /// Keep PATH rewritten (atomically) with the lock's metrics in the
    /// Prometheus text format, for node_exporter's textfile collector
    #[arg(long, value_name = "PATH")]
    metrics_textfile: Option<PathBuf>,
    /// Time between rewrites of --metrics-textfile
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "5s", requires = "metrics_textfile")]
    metrics_interval: Duration,
}

/// Rewrites the text file until dropped (then once more: the last word
/// is the run's end).
pub struct Textfile {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    client: dlock::Client,
    path: PathBuf,
}

/// Writes `text` to `path` through a temporary file in the same directory
/// and a rename: a scrape never reads half a file.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.tmp", std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

impl TextfileArgs {
    /// Starts the rewrites, if asked.
    pub fn start(&self, client: &dlock::Client) -> Option<Textfile> {
        let path = self.metrics_textfile.clone()?;
        let stop = Arc::new(AtomicBool::new(false));
        let (c, p, s, every) = (
            client.clone(),
            path.clone(),
            stop.clone(),
            self.metrics_interval,
        );
        let thread = std::thread::Builder::new()
            .name("dlock-metrics".into())
            .spawn(move || {
                while !s.load(SeqCst) {
                    write(&c, &p);
                    std::thread::park_timeout(every);
                }
            })
            .ok();
        Some(Textfile {
            stop,
            thread,
            client: client.clone(),
            path,
        })
    }
}

fn write(client: &dlock::Client, path: &Path) {
    if let Err(e) = write_atomically(path, &client.snapshot().to_text()) {
        crate::say(format_args!("--metrics-textfile {}: {e}", path.display()));
    }
}

impl Drop for Textfile {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        write(&self.client, &self.path);
    }
}

/// `dlock show NAME --metrics`: the lock as the engine has it, in the
/// core's names (docs/metrics.md); `waiters` is `None` where the engine
/// does not know them (PostgreSQL).
pub fn show_text(name: &str, token: Option<i64>, waiters: Option<usize>) -> String {
    let token = token.map(|t| t as u64);
    dlock::metrics::prometheus::render(&dlock::metrics::prometheus::engine_view(
        name, token, waiters,
    ))
}
