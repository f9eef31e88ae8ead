//! Plays every file in `scenarios/` through the Rust API on the memory
//! backend with real time. The runner (parsing, timing, waits, the trace
//! check) is the shared `dlock-scenarios` crate; this file is only the step
//! dispatch. The C, Python and Node suites play the same files; see
//! `scenarios/README.md` for the format.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dlock::{
    Acquisition, Client, ClientConfig, Election, EventStream, Lock, MemoryBackend, MemoryService,
    Options, OwnedPermit, Semaphore,
};
use dlock_scenarios::{Config, Face, Fault, Observed, Role, Scenario, Step, TraceSink, WAIT_LIMIT};

/// A holder's handle: a lock, an election candidate or a semaphore (whose
/// lock, a semaphore's once it won a slot, every lock step uses).
enum Handle {
    Lock(Lock),
    Election(Election),
    /// The semaphore and the slot its acquire won (one per scenario).
    Semaphore(Semaphore, OnceLock<Lock>),
}

impl Handle {
    fn lock(&self) -> Result<&Lock, String> {
        match self {
            Handle::Lock(l) => Ok(l),
            Handle::Election(e) => Ok(e.lock()),
            Handle::Semaphore(_, won) => won.get().ok_or_else(|| "no slot won yet".into()),
        }
    }

    /// A semaphore holder's slot won (`try_acquire` or `acquire`): traced
    /// as `took slot=I lock=NAME`, then its events as a lock's.
    fn took(
        &self,
        won: Result<Lock, dlock::Error>,
        trace: &TraceSink,
        holder: &str,
    ) -> &'static str {
        let Handle::Semaphore(_, slot) = self else {
            return "not a semaphore holder";
        };
        let lock = match won {
            Ok(lock) => lock,
            Err(e) => {
                trace.push(format!("{holder} acquire failed: {}", e.code()));
                return e.code();
            }
        };
        let line = format!(
            "{holder} took slot={} lock={}",
            lock.slot().map_or(-1, i64::from),
            lock.name()
        );
        // Kept before the line is traced: a `wait` on it may be followed
        // by a step on the slot at once.
        if slot.set(lock).is_err() {
            return "a second slot for one holder";
        }
        trace.push(line);
        let (t, n) = (trace.clone(), holder.to_string());
        if let Some(lock) = slot.get() {
            lock.on_event(move |e| t.push(format!("{n} {e}")));
        }
        "ok"
    }
}

/// A lock or election holder's part.
struct Held {
    /// The last `acquire_start`'s acquisition.
    acquisition: Option<Acquisition>,
    /// On the holder's session (`lock.session()`).
    handle: Arc<Handle>,
    /// The lock's pull-style events, opened before anything happens (not a
    /// semaphore holder's: it has no lock then).
    events: Option<EventStream>,
}

struct Holder {
    /// The holder's client (shared with the other holders of that client).
    client: Client,
    /// The link of the holder's client (shared with the other holders of
    /// that client).
    link: MemoryBackend,
    /// `None` for an observer.
    held: Option<Held>,
    /// An observer's election name.
    observes: String,
}

/// An observer started by `observe`: a thread turning its events into
/// trace lines until `stop`.
struct Watching {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// The trace line of an observer's event (without the holder).
fn observed_line(e: &dlock::Observed) -> String {
    let show = |what: &str, l: &dlock::Leader| {
        format!(
            "observed {what} value={} token={}",
            String::from_utf8_lossy(&l.value),
            l.token.get()
        )
    };
    match e {
        dlock::Observed::Leader(l) => show("leader", l),
        dlock::Observed::Proclaimed(l) => show("proclaimed", l),
        dlock::Observed::NoLeader => "observed no-leader".into(),
        dlock::Observed::Reconnecting => "observed reconnecting".into(),
        other => format!("observed {other:?}"),
    }
}

#[derive(Default)]
struct RustFace {
    service: Option<MemoryService>,
    holders: HashMap<String, Holder>,
    permits: HashMap<String, OwnedPermit>,
    trace: Option<TraceSink>,
    observers: Vec<Watching>,
}

impl RustFace {
    fn holder(&self, name: &str) -> Result<&Holder, String> {
        self.holders
            .get(name)
            .ok_or_else(|| format!("no holder {name}"))
    }

    fn held(&self, name: &str) -> Result<&Held, String> {
        self.holder(name)?
            .held
            .as_ref()
            .ok_or_else(|| format!("{name} is an observer"))
    }

    fn handle(&self, name: &str) -> Result<&Arc<Handle>, String> {
        Ok(&self.held(name)?.handle)
    }

    fn lock(&self, name: &str) -> Result<&Lock, String> {
        self.handle(name)?
            .lock()
            .map_err(|e| format!("{name}: {e}"))
    }

    fn semaphore(&self, name: &str) -> Result<&Semaphore, String> {
        match &**self.handle(name)? {
            Handle::Semaphore(s, _) => Ok(s),
            _ => Err(format!("{name} is not a semaphore holder")),
        }
    }

    fn election(&self, name: &str) -> Result<&Election, String> {
        match &**self.handle(name)? {
            Handle::Election(e) => Ok(e),
            _ => Err(format!("{name} is not an election candidate")),
        }
    }

    fn permit(&self, label: &str) -> Result<&OwnedPermit, String> {
        self.permits
            .get(label)
            .ok_or_else(|| format!("no permit {label}"))
    }
}

impl Face for RustFace {
    fn setup(&mut self, scenario: &Scenario, trace: TraceSink) -> Result<(), String> {
        let ms = std::time::Duration::from_millis;
        let s = &scenario.settings;
        let options = Options {
            ttl: ms(s.ttl_ms),
            keepalive_interval: ms(s.keepalive_interval_ms),
            keepalive_timeout: ms(s.keepalive_timeout_ms),
            retry_interval: ms(s.retry_interval_ms),
            margin: ms(s.margin_ms),
            reacquire: true,
        };
        let service = MemoryService::new();
        // Per client word one client; per client and session word one
        // session; made in holder order, as are the locks.
        let mut clients: HashMap<String, Client> = HashMap::new();
        let mut sessions: HashMap<(String, String), dlock::Session> = HashMap::new();
        for (i, h) in scenario.holders.iter().enumerate() {
            let place = scenario.placement_at(i);
            let client = match clients.get(&place.client) {
                Some(c) => c.clone(),
                None => {
                    // The backend choice as every face makes it: a config,
                    // and the embedded link's fault switches from the client.
                    let c = Client::connect(
                        ClientConfig::embedded_in(service.clone()).with_options(options.clone()),
                    )
                    .map_err(|e| e.to_string())?;
                    clients.insert(place.client.clone(), c.clone());
                    c
                }
            };
            let link = client
                .link()
                .ok_or("an embedded client has a link")?
                .clone();
            let key = (place.client.clone(), place.session.clone());
            let session = match sessions.get(&key) {
                Some(s) => s.clone(),
                None => {
                    let s = if place.default_session() {
                        client.default_session().clone()
                    } else {
                        client.session(options.clone()).map_err(|e| e.to_string())?
                    };
                    sessions.insert(key, s.clone());
                    s
                }
            };
            let handle = match place.role {
                Role::Observer => None,
                Role::Lock => Some(Handle::Lock(
                    session.lock(&place.lock).map_err(|e| e.to_string())?,
                )),
                Role::Election => Some(Handle::Election(
                    session.election(&place.lock).map_err(|e| e.to_string())?,
                )),
                Role::Reader | Role::Writer => {
                    let rw = session.rwlock(&place.lock).map_err(|e| e.to_string())?;
                    let lock = if place.role == Role::Reader {
                        rw.read()
                    } else {
                        rw.write()
                    };
                    Some(Handle::Lock(lock.map_err(|e| e.to_string())?))
                }
                Role::Semaphore => {
                    let limit = place.limit.ok_or("a semaphore holder has a limit")?;
                    let sem = session
                        .semaphore(&place.lock, limit)
                        .map_err(|e| e.to_string())?;
                    Some(Handle::Semaphore(sem, OnceLock::new()))
                }
            };
            let held = handle.map(|handle| {
                // The event's Display is the trace line; a semaphore
                // holder's lock listens once it won a slot (`took`).
                let events = handle.lock().ok().map(|lock| {
                    let (t, n) = (trace.clone(), h.clone());
                    lock.on_event(move |e| t.push(format!("{n} {e}")));
                    lock.events()
                });
                Held {
                    handle: Arc::new(handle),
                    events,
                    acquisition: None,
                }
            });
            self.holders.insert(
                h.clone(),
                Holder {
                    client,
                    link,
                    held,
                    observes: place.lock.clone(),
                },
            );
        }
        self.service = Some(service);
        self.trace = Some(trace);
        Ok(())
    }

    fn elections(&self) -> bool {
        true
    }

    fn rwlocks(&self) -> bool {
        true
    }

    fn semaphores(&self) -> bool {
        true
    }

    fn perform(&mut self, step: &Step) -> Result<Observed, String> {
        Ok(match step {
            Step::Acquire { holder } => {
                let handle = self.handle(holder)?.clone();
                let (trace, n) = (self.trace.clone().ok_or("no trace")?, holder.clone());
                std::thread::spawn(move || match &*handle {
                    Handle::Semaphore(sem, _) => {
                        handle.took(sem.acquire(WAIT_LIMIT), &trace, &n);
                    }
                    _ => {
                        if let Ok(lock) = handle.lock() {
                            let _ = lock.acquire(WAIT_LIMIT);
                        }
                    }
                });
                Observed::Done
            }
            Step::Campaign { holder, value } => {
                self.election(holder)?;
                let handle = self.handle(holder)?.clone();
                let value = value.clone().into_bytes();
                std::thread::spawn(move || {
                    if let Handle::Election(e) = &*handle {
                        let _ = e.campaign(&value, WAIT_LIMIT);
                    }
                });
                Observed::Done
            }
            Step::Proclaim { holder, value, .. } => Observed::Word(
                match self.election(holder)?.proclaim(value.as_bytes()) {
                    Ok(()) => "ok",
                    Err(e) => e.code(),
                }
                .into(),
            ),
            Step::Resign { holder, grace_ms } => {
                self.election(holder)?;
                let handle = self.handle(holder)?.clone();
                let grace = Duration::from_millis(*grace_ms);
                std::thread::spawn(move || {
                    if let Handle::Election(e) = &*handle {
                        let _ = e.resign(grace);
                    }
                });
                Observed::Done
            }
            Step::Leader { holder, .. } => {
                let leader = self.election(holder)?.leader().map_err(|e| e.to_string())?;
                Observed::Leader {
                    value: leader
                        .as_ref()
                        .map(|l| String::from_utf8_lossy(&l.value).into_owned()),
                    token: leader.map(|l| l.token.get()),
                }
            }
            Step::Observe { holder } => {
                let h = self.holder(holder)?;
                let observer = h.client.observe(&h.observes).map_err(|e| e.to_string())?;
                let trace = self.trace.clone().ok_or("no trace")?;
                let stop = Arc::new(AtomicBool::new(false));
                let (n, halt) = (holder.clone(), stop.clone());
                // Pulls with a short limit so that teardown can stop it.
                let thread = std::thread::spawn(move || {
                    while !halt.load(Ordering::SeqCst) {
                        match observer.recv_blocking(Some(Duration::from_millis(20))) {
                            Ok(Some(e)) => trace.push(format!("{n} {}", observed_line(&e))),
                            Ok(None) => break,
                            Err(_) => {}
                        }
                    }
                });
                self.observers.push(Watching { stop, thread });
                Observed::Done
            }
            Step::TryAcquire { holder, .. } => Observed::Word(
                match &**self.handle(holder)? {
                    Handle::Semaphore(sem, _) => {
                        let trace = self.trace.as_ref().ok_or("no trace")?;
                        // A refusal is no acquire that failed: not traced.
                        match sem.try_acquire() {
                            Ok(lock) => self.handle(holder)?.took(Ok(lock), trace, holder),
                            Err(e) => e.code(),
                        }
                    }
                    _ => match self.lock(holder)?.try_acquire() {
                        Ok(_) => "ok",
                        Err(e) => e.code(),
                    },
                }
                .into(),
            ),
            Step::Slot { holder, .. } => {
                let won = self.semaphore(holder).and(self.lock(holder)).ok();
                Observed::Slot {
                    slot: won.and_then(|l| l.slot()),
                    lock: won.map(|l| l.name().to_string()),
                }
            }
            Step::Semaphore { holder, limit, .. } => {
                let sem = self.semaphore(holder)?;
                Observed::Word(
                    match sem.session().semaphore(sem.name(), *limit) {
                        Ok(_) => "ok",
                        Err(e) => e.code(),
                    }
                    .into(),
                )
            }
            Step::Permit { holder, label, .. } => match self.lock(holder)?.permit_owned() {
                Ok(p) => {
                    let token = Some(p.token().get());
                    if let Some(label) = label {
                        self.permits.insert(label.clone(), p);
                    }
                    Observed::Permit {
                        word: "granted".into(),
                        token,
                    }
                }
                Err(r) => Observed::Permit {
                    word: r.as_str().into(),
                    token: None,
                },
            },
            Step::End { permit } => {
                self.permits
                    .remove(permit)
                    .ok_or_else(|| format!("no permit {permit}"))?
                    .end();
                Observed::Done
            }
            Step::Valid { permit, .. } => Observed::Bool(self.permit(permit)?.valid()),
            Step::State { holder, .. } => {
                Observed::Word(self.lock(holder)?.state().as_str().into())
            }
            Step::Token { holder, .. } => {
                Observed::Token(self.lock(holder)?.token().map(|t| t.get()))
            }
            Step::Release { holder } => {
                self.lock(holder)?.release().map_err(|e| e.to_string())?;
                Observed::Done
            }
            Step::StallDriver { ms } => {
                dlock::memory::stall_driver(std::time::Duration::from_millis(*ms));
                Observed::Done
            }
            Step::Fault { holder, fault, ms } => {
                let link = &self.holder(holder)?.link;
                let service = self.service.as_ref().ok_or("no service")?;
                match fault {
                    Fault::Partition => link.partition(),
                    Fault::Heal => link.heal(),
                    Fault::DropReplies => link.drop_keepalive_replies(true),
                    Fault::KeepReplies => link.drop_keepalive_replies(false),
                    Fault::DelayReplies => link
                        .delay_keepalive_replies(std::time::Duration::from_millis(ms.unwrap_or(0))),
                    Fault::FailKeepalives => link.fail_keepalives(Some("injected failure")),
                    Fault::StopFailing => link.fail_keepalives(None),
                    Fault::LeaseLost => link.declare_lease_lost(),
                    Fault::FreezeExpiry => service.freeze_expiry(true),
                    Fault::ThawExpiry => service.freeze_expiry(false),
                    Fault::DeleteKey => {
                        let name = self.lock(holder)?.name();
                        if !link.service().delete_lock_key(name) {
                            return Err(format!("delete_key: nobody holds `{name}`"));
                        }
                    }
                    Fault::RevokeLease => {
                        let lock = self.lock(holder)?;
                        let lease = lock
                            .session()
                            .lease()
                            .ok_or("revoke_lease: the holder's session has no lease")?;
                        if !link.service().revoke_lease(lease) {
                            return Err(format!("revoke_lease: no lease {lease} on the service"));
                        }
                    }
                }
                Observed::Done
            }
            Step::Close { holder } => {
                self.lock(holder)?.close().map_err(|e| e.to_string())?;
                Observed::Done
            }
            Step::Events { holder, expect } => {
                // The next events of the stream, as many as expected.
                let h = self
                    .holders
                    .get_mut(holder)
                    .and_then(|h| h.held.as_mut())
                    .ok_or_else(|| format!("no lock holder {holder}"))?;
                let events = h
                    .events
                    .as_mut()
                    .ok_or_else(|| format!("{holder} has no event stream"))?;
                let mut got = Vec::new();
                while got.len() < expect.len() {
                    match events.recv_blocking(Some(WAIT_LIMIT)) {
                        Ok(Some(e)) => got.push(e.to_string()),
                        Ok(None) => break,
                        Err(()) => return Err(format!("no event within {WAIT_LIMIT:?}")),
                    }
                }
                Observed::Events(got)
            }
            Step::AcquireStart { holder } => {
                let h = self
                    .holders
                    .get_mut(holder)
                    .and_then(|h| h.held.as_mut())
                    .ok_or_else(|| format!("no lock holder {holder}"))?;
                // The outcome shows in the trace.
                h.acquisition = Some(
                    h.handle
                        .lock()?
                        .acquire_then(true, Some(WAIT_LIMIT), |_| {}),
                );
                Observed::Done
            }
            Step::Cancel { holder } => {
                self.held(holder)?
                    .acquisition
                    .as_ref()
                    .ok_or_else(|| format!("no acquire_start of {holder}"))?
                    .cancel();
                Observed::Done
            }
            Step::Shutdown { holder } => {
                self.holder(holder)?.client.shutdown();
                Observed::Done
            }
            Step::Downgrade { holder, .. } => Observed::Word(
                match self.lock(holder)?.downgrade() {
                    Ok(()) => "ok",
                    Err(e) => e.code(),
                }
                .into(),
            ),
            Step::Mode { holder, .. } => Observed::Word(
                self.lock(holder)?
                    .mode()
                    .ok_or_else(|| format!("{holder} is not a read/write lock holder"))?
                    .as_str()
                    .into(),
            ),
            Step::Wait { .. } => return Err("`wait` is the runner's".into()),
        })
    }

    fn teardown(&mut self) {
        for w in self.observers.drain(..) {
            w.stop.store(true, Ordering::SeqCst);
            let _ = w.thread.join();
        }
        self.permits.clear();
        self.holders.clear();
        self.trace = None;
        self.service = None;
    }
}

/// One test plays the files one after another: scenario `g` stalls the
/// process-wide driver thread, which would disturb scenarios played beside it.
#[test]
fn scenarios() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .canonicalize()
        .unwrap();
    let files = dlock_scenarios::scenario_files(&dir).unwrap();
    assert!(
        files.len() >= 22,
        "expected the twenty-two scenarios, found {files:?}"
    );
    let summary = dlock_scenarios::play_dir(&dir, &mut RustFace::default(), &Config::from_env());
    assert_eq!(summary.failed, 0, "\n{}", summary.failures.join("\n"));
    assert_eq!(summary.skipped, 0, "the Rust face plays every file");
}
