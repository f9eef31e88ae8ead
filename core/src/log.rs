//! The core's log for a face (issue 22): Python's `logging`, Node's
//! `onLog`. [`forward`] installs a small `tracing` subscriber (no new
//! dependency) that takes dlock's own events up to a level and hands each
//! to the face's sink on a thread of its own, `dlock-log`: a slow sink
//! (the GIL, the event loop) never holds the driver. A Rust application
//! keeps its own subscriber instead (the command's is `DLOCK_LOG`).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

pub use tracing::Level;
use tracing::field::{Field, Visit};
use tracing::{Event, Metadata, Subscriber, span};

/// One event of the core's log.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Record {
    /// Its level.
    pub level: Level,
    /// Where it comes from (`dlock::driver`, ...).
    pub target: String,
    /// The message, then its fields as `name=value`.
    pub message: String,
}

/// A face's sink of log records.
pub type Sink = Box<dyn Fn(Record) + Send>;

/// The face's sink; `None`: events are dropped (and not formatted).
static SINK: Mutex<Option<Sink>> = Mutex::new(None);
/// Whether [`SINK`] holds a sink (read without its lock, which the
/// `dlock-log` thread of a parent may have held at a fork).
static SINK_ON: AtomicBool = AtomicBool::new(false);
/// Whether the subscriber could be installed.
static INSTALLED: OnceLock<bool> = OnceLock::new();
/// The channel to the `dlock-log` thread (a child of fork() starts its own).
static TX: crate::fork::PerFork<mpsc::Sender<Record>> = crate::fork::PerFork::new();

/// The `dlock-log` thread's channel, starting the thread on first use.
fn log_thread() -> &'static mpsc::Sender<Record> {
    TX.get(mpsc::channel::<Record>, |rx| {
        let _ = std::thread::Builder::new()
            .name("dlock-log".into())
            .spawn(move || {
                crate::signals::block_stop();
                for r in rx {
                    if let Some(sink) = crate::sync::lock(&SINK).as_ref() {
                        sink(r);
                    }
                }
            });
    })
}

struct Forward {
    max: Level,
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }
}

impl Subscriber for Forward {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= self.max && m.target().starts_with("dlock")
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(self.max))
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, e: &Event<'_>) {
        // A forked child has no `dlock-log` thread, and the parent's may
        // have held the sink's lock at the fork.
        if crate::forked() || !SINK_ON.load(Ordering::SeqCst) {
            return;
        }
        let mut f = Fields::default();
        e.record(&mut f);
        let record = Record {
            level: *e.metadata().level(),
            target: e.metadata().target().to_owned(),
            message: f.message + &f.rest,
        };
        let _ = log_thread().send(record);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// Sends dlock's log events up to `max` (`DEBUG`: keepalive failures
/// too) to `sink`, called on the `dlock-log` thread in order; `None` stops.
/// The first call installs the process's global `tracing` subscriber:
/// [`crate::Error::InvalidArgument`] if another one is installed already.
/// A later call replaces the sink (the level stays the first one's). The
/// sink runs under a lock that `forward` takes too: a face calls it
/// without holding what its sink waits for (Python: the GIL released).
pub fn forward(max: Level, sink: Option<Sink>) -> Result<(), crate::Error> {
    if crate::forked() {
        return Err(crate::Error::Forked);
    }
    crate::fork::watch();
    let installed =
        *INSTALLED.get_or_init(|| tracing::subscriber::set_global_default(Forward { max }).is_ok());
    log_thread();
    if !installed {
        return Err(crate::Error::InvalidArgument(
            "dlock cannot route its log: another tracing subscriber is the process's global one"
                .into(),
        ));
    }
    let mut now = crate::sync::lock(&SINK);
    SINK_ON.store(sink.is_some(), Ordering::SeqCst);
    *now = sink;
    Ok(())
}
