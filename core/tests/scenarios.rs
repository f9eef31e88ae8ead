//! Plays every file in `scenarios/` through the Rust API on the memory
//! backend with real time. The runner (parsing, timing, waits, the trace
//! check) is the shared `dlock-scenarios` crate; this file is only the step
//! dispatch. The C, Python and Node suites play the same files; see
//! `scenarios/README.md` for the format.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use dlock::{
    Client, ClientConfig, EventStream, Lock, MemoryBackend, MemoryService, Options, OwnedPermit,
};
use dlock_scenarios::{Config, Face, Fault, Observed, Scenario, Step, TraceSink, WAIT_LIMIT};

struct Holder {
    /// The link of the holder's client (shared with the other holders of
    /// that client).
    link: MemoryBackend,
    /// On the holder's session (`lock.session()`).
    lock: Arc<Lock>,
    /// The lock's pull-style events, opened before anything happens.
    events: EventStream,
}

#[derive(Default)]
struct RustFace {
    service: Option<MemoryService>,
    holders: HashMap<String, Holder>,
    permits: HashMap<String, OwnedPermit>,
}

impl RustFace {
    fn holder(&self, name: &str) -> Result<&Holder, String> {
        self.holders
            .get(name)
            .ok_or_else(|| format!("no holder {name}"))
    }

    fn lock(&self, name: &str) -> Result<&Arc<Lock>, String> {
        Ok(&self.holder(name)?.lock)
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
            let lock = Arc::new(session.lock(&place.lock).map_err(|e| e.to_string())?);
            // The event's Display is the trace line.
            let (t, n) = (trace.clone(), h.clone());
            lock.on_event(move |e| t.push(format!("{n} {e}")));
            let events = lock.events();
            self.holders
                .insert(h.clone(), Holder { link, lock, events });
        }
        self.service = Some(service);
        Ok(())
    }

    fn perform(&mut self, step: &Step) -> Result<Observed, String> {
        Ok(match step {
            Step::Acquire { holder } => {
                let lock = self.lock(holder)?.clone();
                std::thread::spawn(move || lock.acquire(WAIT_LIMIT));
                Observed::Done
            }
            Step::TryAcquire { holder, .. } => Observed::Word(
                match self.lock(holder)?.try_acquire() {
                    Ok(_) => "ok",
                    Err(e) => e.code(),
                }
                .into(),
            ),
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
                    .ok_or_else(|| format!("no holder {holder}"))?;
                let mut got = Vec::new();
                while got.len() < expect.len() {
                    match h.events.recv_blocking(Some(WAIT_LIMIT)) {
                        Ok(Some(e)) => got.push(e.to_string()),
                        Ok(None) => break,
                        Err(()) => return Err(format!("no event within {WAIT_LIMIT:?}")),
                    }
                }
                Observed::Events(got)
            }
            Step::Wait { .. } => return Err("`wait` is the runner's".into()),
        })
    }

    fn teardown(&mut self) {
        self.permits.clear();
        self.holders.clear();
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
        files.len() >= 14,
        "expected the fourteen scenarios, found {files:?}"
    );
    let summary = dlock_scenarios::play_dir(&dir, &mut RustFace::default(), &Config::from_env());
    assert_eq!(summary.failed, 0, "\n{}", summary.failures.join("\n"));
}
