//! The core's log for Node (issue 22): `dlock.onLog(fn)`. The core hands
//! each record to its `dlock-log` thread, which queues it to the
//! JavaScript thread through a weak (unref'd) threadsafe function: it
//! never keeps the process alive, and no driver thread waits for the loop.

use napi::bindgen_prelude::*;
use napi::threadsafe_function::ThreadsafeFunctionCallMode;
use napi_derive::napi;

use dlock::log::{Level, Record};

use crate::thrown;

/// One record of the core's log.
#[napi(object)]
pub struct NativeLogRecord {
    /// `error`, `warn`, `info`, `debug` or `trace`.
    pub level: String,
    /// Where it comes from (`dlock::driver`, ...).
    pub target: String,
    /// The message, then its fields as `name=value`.
    pub message: String,
}

/// Sends the core's log (up to DEBUG) to `sink` on the JavaScript thread;
/// `null` stops.
#[napi(ts_args_type = "sink: ((record: NativeLogRecord) => void) | null")]
pub fn set_log_sink(sink: Option<Function<NativeLogRecord, ()>>) -> Result<()> {
    let sink: Option<dlock::log::Sink> = match sink {
        None => None,
        Some(f) => {
            let tsfn = f
                .build_threadsafe_function::<Record>()
                .weak::<true>()
                .callee_handled::<false>()
                .build_callback(|ctx| {
                    let r = ctx.value;
                    Ok(NativeLogRecord {
                        level: match r.level {
                            Level::ERROR => "error",
                            Level::WARN => "warn",
                            Level::INFO => "info",
                            Level::DEBUG => "debug",
                            _ => "trace",
                        }
                        .into(),
                        target: r.target,
                        message: r.message,
                    })
                })?;
            Some(Box::new(move |r: Record| {
                let _ = tsfn.call(r, ThreadsafeFunctionCallMode::NonBlocking);
            }))
        }
    };
    dlock::log::forward(Level::DEBUG, sink).map_err(thrown)
}
