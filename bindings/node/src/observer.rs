//! Observers (`client.observe(name)`, docs/elections.md): the core's
//! callback form (`Client::observe_with`) hands every event to JavaScript
//! through a threadsafe function of the observer's own.
//! That function is weak (unref'd): an observer never keeps the process
//! alive by itself. The JavaScript side refs it (`hold(true)`) only while
//! someone awaits the next event (`for await`), as a pending read would.

// napi-derive registers nothing in a test build (clippy --all-targets checks one).
#![cfg_attr(test, allow(dead_code))]

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use crate::election::{NativeLeader, leader_record};
use crate::{NativeClient, thrown};

/// One observer event as JavaScript gets it.
#[napi(object)]
pub struct NativeObserved {
    /// The observer's `id`.
    pub observer: u32,
    /// `leader`, `proclaimed`, `no-leader` or `reconnecting`.
    pub kind: String,
    pub leader: Option<NativeLeader>,
    /// What it counts for in a backlog's bound (the core's
    /// `Observed::backlog_bytes`).
    pub bytes: u32,
}

fn observed_record(observer: u32, e: dlock::Observed) -> NativeObserved {
    let (kind, leader) = (e.kind(), e.leader().cloned());
    NativeObserved {
        observer,
        kind: kind.into(),
        leader: leader.map(leader_record),
        bytes: u32::try_from(e.backlog_bytes()).unwrap_or(u32::MAX),
    }
}

/// The core's bound of the events an observer keeps unread
/// (`dlock::election::OBSERVER_BACKLOG`, `OBSERVER_BACKLOG_BYTES`): the
/// states JavaScript keeps for `next()` are bounded alike (issue 32).
#[napi(object)]
pub struct NativeBacklog {
    pub events: u32,
    pub bytes: u32,
}

#[napi]
pub fn observer_backlog() -> NativeBacklog {
    NativeBacklog {
        events: dlock::election::OBSERVER_BACKLOG as u32,
        bytes: dlock::election::OBSERVER_BACKLOG_BYTES as u32,
    }
}

type ObservedSink =
    ThreadsafeFunction<(u32, dlock::Observed), (), NativeObserved, Status, false, true>;

static NEXT_OBSERVER: AtomicU32 = AtomicU32::new(1);

/// An observer of one election.
#[napi]
pub struct NativeObserver {
    id: u32,
    /// The core's observer (its callback form).
    observer: dlock::Observer,
    sink: Arc<ObservedSink>,
    held: Cell<bool>,
}

#[napi]
impl NativeObserver {
    /// Observes the election `name` on `client` (no lease, no key): the
    /// core's `Client::observe`; every event goes to `sink`.
    #[napi(
        factory,
        ts_args_type = "client: NativeClient, name: string, sink: (event: NativeObserved) => void"
    )]
    pub fn start(
        client: &NativeClient,
        name: String,
        sink: Function<NativeObserved, ()>,
    ) -> Result<NativeObserver> {
        let id = NEXT_OBSERVER.fetch_add(1, Ordering::Relaxed);
        let sink = Arc::new(
            sink.build_threadsafe_function::<(u32, dlock::Observed)>()
                .weak::<true>()
                .callee_handled::<false>()
                .build_callback(|ctx| Ok(observed_record(ctx.value.0, ctx.value.1)))?,
        );
        let to_js = sink.clone();
        let observer = client
            .inner
            .observe_with(&name, move |e| {
                let _ = to_js.call((id, e), ThreadsafeFunctionCallMode::NonBlocking);
            })
            .map_err(thrown)?;
        Ok(NativeObserver {
            id,
            observer,
            sink,
            held: Cell::new(false),
        })
    }

    /// The number this observer's events carry.
    #[napi(getter)]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Keeps the process alive (`true`: someone awaits an event) or lets
    /// it exit (`false`, the start).
    #[napi]
    pub fn hold(&self, env: &Env, on: bool) -> Result<()> {
        if self.held.get() == on || self.sink.aborted() {
            return Ok(());
        }
        // SAFETY: the function lives while `self.sink` does and is not
        // aborted (checked above); both calls are made on the JavaScript
        // thread, as N-API asks.
        let status = unsafe {
            if on {
                napi::sys::napi_ref_threadsafe_function(env.raw(), self.sink.raw())
            } else {
                napi::sys::napi_unref_threadsafe_function(env.raw(), self.sink.raw())
            }
        };
        if status != napi::sys::Status::napi_ok {
            return Err(Error::from_status(Status::from(status)));
        }
        self.held.set(on);
        Ok(())
    }

    /// Ends the observation (the core observer's watch with it); the
    /// process is no longer held. Idempotent.
    #[napi]
    pub fn close(&self, env: &Env) -> Result<()> {
        self.observer.close();
        self.hold(env, false)
    }
}
