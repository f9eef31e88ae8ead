//! The native half of the Node face (`require('dlock')`): classes that
//! convert between JavaScript and the core and decide nothing. The public
//! JavaScript API (`src/index.ts` → `index.js`, `index.d.ts`) wraps these;
//! see `docs/node.md`.
//!
//! - Async calls return a promise of an [`Outcome`] (a code word, a token,
//!   a message) resolved from the core's callback thread through the core's
//!   one completion form (`Lock::acquire_then`, `dlock::spawn_then`): no
//!   executor here. The JavaScript side turns a failure into its typed
//!   error.
//! - Exit and cancel are the core's: `shutdown()` at `process.on('exit')`,
//!   `NativeAcquisition.cancel()` for an aborted signal (a semaphore's:
//!   `NativeSemaphoreAcquisition.cancel()`, `semaphore.rs`).
//! - `permit()` is one synchronous call into the core, which reads the
//!   clock itself; it answers a slot number (or a negative code) so that
//!   nothing is allocated on the native side.
//! - Events go through one weak (unref'd) threadsafe function for the
//!   whole process, so they arrive in the core's order and never keep the
//!   process alive.

#![deny(clippy::all)]

mod election;
pub mod log;
pub mod metrics;
mod observer;
mod rwlock;
#[cfg(feature = "scenarios")]
mod scenarios;
mod semaphore;

use election::LockRef;

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use dlock::{Code, Error as CoreError, LockEvent};

/// The result of an async call: `code` is `"ok"` or the core's code word.
#[napi(object)]
pub struct Outcome {
    pub code: String,
    pub message: String,
    pub token: Option<BigInt>,
}

impl Outcome {
    fn ok(token: Option<u64>) -> Outcome {
        Outcome {
            code: Code::Ok.as_str().into(),
            message: String::new(),
            token: token.map(BigInt::from),
        }
    }

    fn of(r: std::result::Result<Option<u64>, CoreError>) -> Outcome {
        match r {
            Ok(t) => Outcome::ok(t),
            Err(e) => Outcome {
                code: e.code().into(),
                message: e.to_string(),
                token: None,
            },
        }
    }
}

/// A core error thrown synchronously: the JS error's `code` is the word.
fn thrown(e: CoreError) -> napi::Error {
    napi::Error::new(Status::GenericFailure, format!("{}\u{1f}{}", e.code(), e))
}

fn invalid(message: impl Into<String>) -> napi::Error {
    thrown(CoreError::InvalidArgument(message.into()))
}

/// A duration argument in ms: the core's rule (`invalid_argument`).
fn ms(name: &str, v: f64) -> Result<Duration> {
    dlock::options::argument_millis(name, v).map_err(thrown)
}

/// A timing setting in ms: the core's rule (`invalid_option`).
fn setting_ms(name: &'static str, v: f64) -> Result<Duration> {
    dlock::options::setting_millis(name, v).map_err(thrown)
}

/// An option key no function of this face knows: the core's
/// `invalid_option`, thrown (as in every face).
#[napi]
pub fn unknown_setting(name: String, known: Vec<String>) -> Result<()> {
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    Err(thrown(dlock::options::unknown_setting(&name, &known)))
}

/// The core's constants the face exports: the longest name and guarded
/// write key (bytes), the largest semaphore limit, the metrics' per-lock
/// series, `healthy()`'s default allowance (ms).
#[napi(object)]
pub struct Constants {
    pub max_name_len: u32,
    pub max_key_len: u32,
    pub max_semaphore_limit: u32,
    pub default_lock_series: u32,
    pub default_max_overdue_ms: f64,
}

#[napi]
pub fn constants() -> Constants {
    Constants {
        max_name_len: dlock::MAX_NAME_LEN as u32,
        max_key_len: dlock::MAX_KEY_LEN as u32,
        max_semaphore_limit: dlock::MAX_SEMAPHORE_LIMIT,
        default_lock_series: dlock::metrics::DEFAULT_LOCK_SERIES as u32,
        default_max_overdue_ms: millis(dlock::DEFAULT_MAX_OVERDUE),
    }
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn token_of(v: BigInt) -> Result<dlock::Token> {
    let (signed, value, lossless) = v.get_u64();
    if signed || !lossless {
        return Err(invalid("a token is a bigint from 0 to 2^64-1"));
    }
    Ok(dlock::Token(value))
}

/// The core's message of a `fenced` error for `token` (a guarded write's,
/// or `withLock`'s signal at the fence).
#[napi]
pub fn fenced_message(token: BigInt) -> Result<String> {
    Ok(CoreError::Fenced(token_of(token)?.get()).to_string())
}

/// Every code word, in C order: the JavaScript side maps a negative
/// `permit()` answer back to its word.
#[napi]
pub fn code_words() -> Vec<String> {
    Code::ALL.iter().map(|c| c.as_str().to_string()).collect()
}

/// Timing settings, in milliseconds; unset ones are derived by the core.
#[napi(object)]
#[derive(Default)]
pub struct NativeOptions {
    pub ttl: Option<f64>,
    pub keepalive_interval: Option<f64>,
    pub keepalive_timeout: Option<f64>,
    pub retry_interval: Option<f64>,
    pub margin: Option<f64>,
    pub reacquire: Option<bool>,
}

impl NativeOptions {
    /// The settings given; the core derives the ones left out (design §14).
    fn to_core(&self) -> Result<dlock::Options> {
        let given = |name: &'static str, v: Option<f64>| v.map(|v| setting_ms(name, v)).transpose();
        dlock::PartialOptions {
            ttl: given("ttl", self.ttl)?,
            keepalive_interval: given("keepaliveInterval", self.keepalive_interval)?,
            keepalive_timeout: given("keepaliveTimeout", self.keepalive_timeout)?,
            retry_interval: given("retryInterval", self.retry_interval)?,
            margin: given("margin", self.margin)?,
            reacquire: self.reacquire,
        }
        .resolve()
        .map_err(thrown)
    }
}

/// Where the client connects: endpoints (etcd, or one PostgreSQL URL; the
/// core decides) and their settings, every one optional.
#[napi(object)]
#[derive(Default)]
pub struct NativeEtcd {
    /// None: no endpoints (the service given, or the `DLOCK_*` environment's).
    pub endpoints: Option<Vec<String>>,
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub allow_plaintext_password: Option<bool>,
    pub connect_timeout: Option<f64>,
    pub request_timeout: Option<f64>,
}

impl NativeEtcd {
    /// The endpoints and settings as the core takes them.
    fn endpoints(&self) -> Result<dlock::Endpoints> {
        let mut c = dlock::Endpoints::new(self.endpoints.iter().flatten().cloned());
        c.ca_file = self.ca_file.clone().map(Into::into);
        c.cert_file = self.cert_file.clone().map(Into::into);
        c.key_file = self.key_file.clone().map(Into::into);
        c.user = self.user.clone();
        c.password = self.password.clone();
        c.allow_plaintext_password = self.allow_plaintext_password;
        let given = |name: &str, v: Option<f64>| v.map(|v| ms(name, v)).transpose();
        c.connect_timeout = given("connectTimeout", self.connect_timeout)?;
        c.request_timeout = given("requestTimeout", self.request_timeout)?;
        Ok(c)
    }
}

/// An embedded lock service of one's own (tests of one's fence handling):
/// its clients get fault switches.
#[napi]
pub struct NativeService {
    inner: dlock::MemoryService,
}

#[napi]
impl NativeService {
    #[napi(constructor)]
    pub fn new() -> NativeService {
        NativeService {
            inner: dlock::MemoryService::new(),
        }
    }

    /// Pauses (true) or resumes server-side lease expiry.
    #[napi]
    pub fn freeze_expiry(&self, frozen: bool) {
        self.inner.freeze_expiry(frozen);
    }

    /// The whole service down (true) or up.
    #[napi]
    pub fn outage(&self, down: bool) {
        self.inner.outage(down);
    }

    /// Deletes the key holding `name` (its lease living on), as
    /// `etcdctl del`; false if nobody holds it.
    #[napi]
    pub fn delete_lock_key(&self, name: String) -> bool {
        self.inner.delete_lock_key(&name)
    }

    /// Revokes a lease, as `etcdctl lease revoke`; false if there is none.
    #[napi]
    pub fn revoke_lease(&self, lease: BigInt) -> Result<bool> {
        let (value, lossless) = lease.get_i64();
        if !lossless {
            return Err(invalid("a lease is a bigint that fits in 64 bits"));
        }
        Ok(self.inner.revoke_lease(value as dlock::machine::LeaseId))
    }

    /// The token holding `name`, if any.
    #[napi]
    pub fn holder(&self, name: String) -> Option<BigInt> {
        self.inner.holder(&name).map(|t| BigInt::from(t.get()))
    }

    /// The value of `key` in the service's key-value store.
    #[napi]
    pub fn get(&self, key: Buffer) -> Option<Buffer> {
        self.inner.get(&key).map(Buffer::from)
    }
}

impl Default for NativeService {
    fn default() -> Self {
        NativeService::new()
    }
}

#[napi]
pub struct NativeClient {
    inner: dlock::Client,
}

#[napi]
impl NativeClient {
    /// Connects: `etcd` given → what its endpoints name (etcd or
    /// PostgreSQL); `service` given → that embedded
    /// service; neither → the `DLOCK_*` environment, else the process-wide
    /// embedded service. Blocks while connecting.
    #[napi(factory)]
    pub fn connect(
        options: NativeOptions,
        etcd: Option<NativeEtcd>,
        service: Option<&NativeService>,
        description: Option<String>,
    ) -> Result<NativeClient> {
        let options = options.to_core()?;
        let etcd = etcd.map(|e| Ok::<_, napi::Error>((e.endpoints.is_some(), e.endpoints()?)));
        let backend = match (etcd.transpose()?, service) {
            (Some((true, _)), Some(_)) => {
                return Err(invalid("give either endpoints or a service"));
            }
            (Some((true, e)), None) => e.backend().map_err(thrown)?,
            (without, service) => {
                // TLS or credentials without endpoints: the core refuses
                // them, as in every face.
                if let Some((_, e)) = without {
                    e.check_without_list().map_err(thrown)?;
                }
                match service {
                    Some(s) => dlock::BackendConfig::Embedded(s.inner.clone()),
                    None => dlock::BackendConfig::FromEnv,
                }
            }
        };
        let mut config = dlock::ClientConfig::from_env()
            .with_options(options)
            .with_face("node", env!("CARGO_PKG_VERSION"));
        config.backend = backend;
        if let Some(d) = description {
            config = config.with_description(d);
        }
        let inner = dlock::Client::connect(config).map_err(thrown)?;
        Ok(NativeClient { inner })
    }

    /// A handle on the lock `name` on the default session.
    #[napi]
    pub fn lock(&self, name: String) -> Result<NativeLock> {
        NativeLock::new(self.inner.lock(&name))
    }

    #[napi]
    pub fn default_session(&self) -> NativeSession {
        NativeSession {
            inner: self.inner.default_session().clone(),
        }
    }

    /// A session of its own (its own lease) with `options`.
    #[napi]
    pub fn session(&self, options: NativeOptions) -> Result<NativeSession> {
        let o = options.to_core()?;
        let inner = self.inner.session(o).map_err(thrown)?;
        Ok(NativeSession { inner })
    }

    /// The effective options, in milliseconds.
    #[napi]
    pub fn options(&self) -> NativeOptions {
        let o = self.inner.options();
        NativeOptions {
            ttl: Some(millis(o.ttl)),
            keepalive_interval: Some(millis(o.keepalive_interval)),
            keepalive_timeout: Some(millis(o.keepalive_timeout)),
            retry_interval: Some(millis(o.retry_interval)),
            margin: Some(millis(o.margin)),
            reacquire: Some(o.reacquire),
        }
    }

    /// Ends every session of this client at once (`Client::shutdown`): what
    /// `process.on('exit')` does for every client.
    #[napi]
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }

    /// The embedded link of this client (every session of it): its fault
    /// switches. `null` on etcd.
    #[napi]
    pub fn link(&self) -> Option<NativeLink> {
        self.inner.link().map(|l| NativeLink { inner: l.clone() })
    }
}

/// The core's embedded link (`dlock::MemoryBackend`), method for method.
#[napi]
pub struct NativeLink {
    inner: dlock::MemoryBackend,
}

#[napi]
impl NativeLink {
    #[napi]
    pub fn partition(&self) {
        self.inner.partition();
    }

    #[napi]
    pub fn heal(&self) {
        self.inner.heal();
    }

    #[napi]
    pub fn drop_keepalive_replies(&self, on: bool) {
        self.inner.drop_keepalive_replies(on);
    }

    /// Replies arrive `delay` ms late (0: on time).
    #[napi]
    pub fn delay_keepalive_replies(&self, delay: f64) -> Result<()> {
        self.inner.delay_keepalive_replies(ms("ms", delay)?);
        Ok(())
    }

    /// Keepalives fail at once with `error` (`null`: they work again).
    #[napi]
    pub fn fail_keepalives(&self, error: Option<String>) {
        self.inner.fail_keepalives(error.as_deref());
    }

    #[napi]
    pub fn declare_lease_lost(&self) {
        self.inner.declare_lease_lost();
    }
}

#[napi(object)]
pub struct NativeSessionStats {
    pub lease: Option<BigInt>,
    pub keepalives_sent: f64,
    pub locks: f64,
    pub last_keepalive_rtt: Option<f64>,
}

#[napi]
pub struct NativeSession {
    inner: dlock::Session,
}

#[napi]
impl NativeSession {
    #[napi]
    pub fn lock(&self, name: String) -> Result<NativeLock> {
        NativeLock::new(self.inner.lock(&name))
    }

    #[napi(getter)]
    pub fn lease(&self) -> Option<BigInt> {
        self.inner.lease().map(BigInt::from)
    }

    #[napi(getter)]
    pub fn is_default(&self) -> bool {
        self.inner.is_default()
    }

    #[napi]
    pub fn stats(&self) -> NativeSessionStats {
        let s = self.inner.stats();
        NativeSessionStats {
            lease: s.lease.map(BigInt::from),
            keepalives_sent: s.keepalives as f64,
            locks: s.locks as f64,
            last_keepalive_rtt: s.last_keepalive_rtt.map(millis),
        }
    }

    /// Releases every lock of the session and revokes its lease.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn close<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let session = self.inner.clone();
        complete(
            env,
            async move { session.close_async().await.map(|()| None) },
        )
    }
}

/// Runs `future` (a core call) on the core's driver and resolves the
/// returned promise with its outcome (`dlock::spawn_then`). The deferred
/// is a normal one: a pending call keeps the process alive, as any pending
/// I/O does.
fn complete<'e>(
    env: &'e Env,
    future: impl std::future::Future<Output = std::result::Result<Option<u64>, CoreError>>
    + Send
    + 'static,
) -> Result<Object<'e>> {
    let (deferred, promise) = env.create_deferred()?;
    dlock::spawn_then(future, move |r| {
        let outcome = Outcome::of(r);
        deferred.resolve(move |_| Ok(outcome));
    });
    Ok(promise)
}

/// Who holds a lease (`dlock::Identity`).
#[napi(object)]
pub struct NativeIdentity {
    pub host: String,
    pub pid: u32,
    /// Unix seconds.
    pub started: Option<i64>,
    pub face: String,
    pub version: String,
    pub description: Option<String>,
}

/// A lock's holder (`dlock::LockHolder`).
#[napi(object)]
pub struct NativeHolder {
    pub key: String,
    pub token: BigInt,
    pub lease: BigInt,
    pub identity: Option<NativeIdentity>,
}

/// The result of `holder()`: `code` is `"ok"` (then `holder` is the
/// holder, or absent when nothing holds the lock) or the core's code word.
#[napi(object)]
pub struct HolderOutcome {
    pub code: String,
    pub message: String,
    pub holder: Option<NativeHolder>,
}

impl HolderOutcome {
    fn of(r: std::result::Result<Option<dlock::LockHolder>, CoreError>) -> HolderOutcome {
        match r {
            Ok(h) => HolderOutcome {
                code: dlock::Code::Ok.as_str().into(),
                message: String::new(),
                holder: h.map(|h| NativeHolder {
                    key: h.key,
                    token: BigInt::from(h.token.get()),
                    lease: BigInt::from(h.lease),
                    identity: h.identity.map(|i| NativeIdentity {
                        host: i.host.clone(),
                        pid: i.pid,
                        started: i.started.map(|t| i64::try_from(t).unwrap_or(i64::MAX)),
                        face: i.face.clone(),
                        version: i.version.clone(),
                        description: i.description.clone(),
                    }),
                }),
            },
            Err(e) => HolderOutcome {
                code: e.code().into(),
                message: e.to_string(),
                holder: None,
            },
        }
    }
}

static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// A lock handle. Permits live in `permits` (a slot per permit in flight)
/// so that `permit()` allocates nothing on the JavaScript heap.
#[napi]
pub struct NativeLock {
    lock: LockRef,
    id: u32,
    listening: Cell<bool>,
    permits: RefCell<Slots>,
    /// The last `permit()` refusal, for its message (`refusal()`).
    refused: Cell<Option<dlock::Refused>>,
}

#[derive(Default)]
struct Slots {
    slots: Vec<Option<dlock::OwnedPermit>>,
    free: Vec<u32>,
}

#[napi(object)]
pub struct NativeLockStats {
    pub acquisitions: f64,
    pub drains: f64,
    pub resumes: f64,
    pub fences_deadline: f64,
    pub fences_lease_lost: f64,
    pub fences_lock_lost: f64,
    pub last_keepalive_rtt: Option<f64>,
    pub slack: Option<f64>,
    pub in_flight: f64,
}

impl NativeLock {
    fn new(lock: std::result::Result<dlock::Lock, CoreError>) -> Result<NativeLock> {
        Ok(NativeLock::of(LockRef::Lock(Arc::new(
            lock.map_err(thrown)?,
        ))))
    }

    /// A handle on `lock` (a lock of its own, or an election's).
    fn of(lock: LockRef) -> NativeLock {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        NativeLock {
            lock,
            id,
            listening: Default::default(),
            permits: Default::default(),
            refused: Default::default(),
        }
    }

    fn with_permit<T>(&self, slot: u32, f: impl FnOnce(&dlock::OwnedPermit) -> T) -> Result<T> {
        let p = self.permits.borrow();
        match p.slots.get(slot as usize) {
            Some(Some(permit)) => Ok(f(permit)),
            _ => Err(invalid("this permit has ended")),
        }
    }
}

#[napi]
impl NativeLock {
    /// The number the events of this lock carry.
    #[napi(getter)]
    pub fn id(&self) -> u32 {
        self.id
    }

    #[napi(getter)]
    pub fn name(&self) -> String {
        self.lock.name().to_string()
    }

    /// The semaphore slot this lock is (`null` for a plain lock).
    #[napi(getter)]
    pub fn slot(&self) -> Option<u32> {
        self.lock.slot()
    }

    /// Who holds the lock now, read from the service (any process).
    #[napi(ts_return_type = "Promise<HolderOutcome>")]
    pub fn holder<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let lock = self.lock.clone();
        let (deferred, promise) = env.create_deferred()?;
        dlock::spawn_then(async move { lock.holder_async().await }, move |r| {
            deferred.resolve(move |_| Ok(HolderOutcome::of(r)))
        });
        Ok(promise)
    }

    /// `'read'` or `'write'` for a read/write lock's holder (`null` for a
    /// plain lock).
    #[napi(getter, ts_return_type = "'read' | 'write' | null")]
    pub fn mode(&self) -> Option<&'static str> {
        self.lock.mode().map(dlock::Mode::as_str)
    }

    /// A held writer becomes a reader, keeping its key and token (the
    /// core's `downgrade`).
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn downgrade<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let lock = self.lock.clone();
        complete(
            env,
            async move { lock.downgrade_async().await.map(|()| None) },
        )
    }

    /// Always `invalid_argument` (the core's `upgrade`).
    #[napi]
    pub fn upgrade(&self) -> Result<()> {
        self.lock.upgrade().map_err(thrown)
    }

    #[napi]
    pub fn session(&self) -> NativeSession {
        NativeSession {
            inner: self.lock.session().clone(),
        }
    }

    /// Acquires, waiting up to `timeout` ms (`null`: as long as it takes):
    /// the core's `acquire_then`. `handle` (when given) gets the
    /// acquisition, whose `cancel()` leaves nothing held.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn acquire<'e>(
        &self,
        env: &'e Env,
        timeout: Option<f64>,
        handle: Option<&NativeAcquisition>,
    ) -> Result<Object<'e>> {
        let timeout = timeout.map(|t| ms("timeout", t)).transpose()?;
        if handle.is_some_and(|h| h.inner.get().is_some()) {
            return Err(invalid("this acquisition handle is in use"));
        }
        let (deferred, promise) = env.create_deferred()?;
        let acquisition = self.lock.acquire_then(true, timeout, move |r| {
            let outcome = Outcome::of(r.map(|t| Some(t.get())));
            deferred.resolve(move |_| Ok(outcome));
        });
        if let Some(h) = handle {
            let _ = h.inner.set(acquisition);
        }
        Ok(promise)
    }

    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn try_acquire<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let lock = self.lock.clone();
        complete(env, async move {
            lock.try_acquire_async().await.map(|t| Some(t.get()))
        })
    }

    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn release<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let lock = self.lock.clone();
        complete(
            env,
            async move { lock.release_async().await.map(|()| None) },
        )
    }

    /// Releases and ends the lock's events: once the core has delivered
    /// every event up to the close, a `closed` event follows them through
    /// the same sink (the end of the JavaScript event streams).
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn close<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let lock = self.lock.clone();
        let sink = self
            .listening
            .get()
            .then(|| EVENTS.get().cloned())
            .flatten();
        let id = self.id;
        complete(env, async move {
            let r = lock.close_async().await;
            if let Some(sink) = sink {
                let _ = sink.call((id, None), ThreadsafeFunctionCallMode::NonBlocking);
            }
            r.map(|()| None)
        })
    }

    #[napi(getter)]
    pub fn closed(&self) -> bool {
        self.lock.is_closed()
    }

    #[napi(getter)]
    pub fn state(&self) -> &'static str {
        self.lock.state().as_str()
    }

    #[napi(getter)]
    pub fn token(&self) -> Option<BigInt> {
        self.lock.token().map(|t| BigInt::from(t.get()))
    }

    /// Milliseconds left before the deadline, while holding or draining.
    #[napi(getter)]
    pub fn time_left(&self) -> Option<f64> {
        self.lock.time_left().map(millis)
    }

    #[napi(getter)]
    pub fn in_flight(&self) -> f64 {
        self.lock.in_flight() as f64
    }

    #[napi]
    pub fn stats(&self) -> NativeLockStats {
        let s = self.lock.stats();
        NativeLockStats {
            acquisitions: s.acquisitions as f64,
            drains: s.drains as f64,
            resumes: s.resumes as f64,
            fences_deadline: s.fences_deadline as f64,
            fences_lease_lost: s.fences_lease_lost as f64,
            fences_lock_lost: s.fences_lock_lost as f64,
            last_keepalive_rtt: s.last_keepalive_rtt.map(millis),
            slack: s.slack.map(millis),
            in_flight: s.in_flight as f64,
        }
    }

    /// One unit of work: a slot number >= 0, or minus the refusal's code
    /// number (`codeWords()[-answer]`).
    #[napi]
    pub fn permit(&self) -> i32 {
        match self.lock.permit_owned() {
            Ok(p) => {
                let mut s = self.permits.borrow_mut();
                match s.free.pop() {
                    Some(i) => {
                        s.slots[i as usize] = Some(p);
                        i as i32
                    }
                    None => {
                        s.slots.push(Some(p));
                        (s.slots.len() - 1) as i32
                    }
                }
            }
            Err(r) => {
                self.refused.set(Some(r));
                -r.status().value()
            }
        }
    }

    /// The core's message for the last `permit()` refusal of this lock.
    #[napi]
    pub fn refusal(&self) -> String {
        self.refused
            .get()
            .map(|r| r.to_string())
            .unwrap_or_default()
    }

    #[napi]
    pub fn permit_token(&self, slot: u32) -> Result<BigInt> {
        self.with_permit(slot, |p| BigInt::from(p.token().get()))
    }

    #[napi]
    pub fn permit_valid(&self, slot: u32) -> Result<bool> {
        self.with_permit(slot, |p| p.valid())
    }

    /// Milliseconds left while the permit's token still holds, else 0.
    #[napi]
    pub fn permit_remaining(&self, slot: u32) -> Result<f64> {
        self.with_permit(slot, |p| millis(p.remaining()))
    }

    /// Ends the permit in `slot`; false if it had ended already.
    #[napi]
    pub fn permit_end(&self, slot: u32) -> bool {
        let ended = {
            let mut s = self.permits.borrow_mut();
            match s.slots.get_mut(slot as usize).and_then(Option::take) {
                Some(p) => {
                    s.free.push(slot);
                    Some(p)
                }
                None => None,
            }
        };
        ended.is_some()
    }

    /// Starts delivering this lock's events to the process's event sink
    /// (`setEventSink`); once is enough.
    #[napi]
    pub fn listen(&self) -> Result<()> {
        if self.listening.replace(true) {
            return Ok(());
        }
        let sink = EVENTS
            .get()
            .ok_or_else(|| invalid("setEventSink was not called"))?;
        let sink = sink.clone();
        let id = self.id;
        self.lock.on_event(move |e| {
            let _ = sink.call((id, Some(*e)), ThreadsafeFunctionCallMode::NonBlocking);
        });
        Ok(())
    }

    /// Puts `key` = `value` only while `token` holds the lock (the service
    /// decides).
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn guarded_put<'e>(
        &self,
        env: &'e Env,
        token: BigInt,
        key: Buffer,
        value: Buffer,
    ) -> Result<Object<'e>> {
        let token = token_of(token)?;
        let lock = self.lock.clone();
        let (key, value) = (key.to_vec(), value.to_vec());
        complete(env, async move {
            lock.guarded_put_async(token, &key, &value)
                .await
                .map(|()| None)
        })
    }

    /// Deletes `key` only while `token` holds the lock.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn guarded_delete<'e>(
        &self,
        env: &'e Env,
        token: BigInt,
        key: Buffer,
    ) -> Result<Object<'e>> {
        let token = token_of(token)?;
        let lock = self.lock.clone();
        let key = key.to_vec();
        complete(env, async move {
            lock.guarded_delete_async(token, &key).await.map(|()| None)
        })
    }
}

/// One event as the JavaScript sink gets it.
#[napi(object)]
pub struct NativeEvent {
    /// The lock's `id`.
    pub lock: u32,
    /// `state`, `fence`, `acquired`, `drained`, or `closed` (the lock was
    /// closed: no event follows).
    pub kind: String,
    pub from: Option<String>,
    pub to: Option<String>,
    pub reason: Option<String>,
    pub token: Option<BigInt>,
    pub in_flight: Option<f64>,
}

fn event_record(lock: u32, e: Option<&LockEvent>) -> NativeEvent {
    let mut r = NativeEvent {
        lock,
        kind: e.map_or("closed", LockEvent::kind).into(),
        from: None,
        to: None,
        reason: None,
        token: None,
        in_flight: None,
    };
    let Some(e) = e else {
        return r;
    };
    match *e {
        LockEvent::State { change, .. } => {
            r.from = Some(change.from.as_str().into());
            r.to = Some(change.to.as_str().into());
            r.reason = Some(change.reason.as_str().into());
        }
        LockEvent::Fence {
            token, in_flight, ..
        } => {
            r.token = Some(BigInt::from(token.get()));
            r.in_flight = Some(in_flight as f64);
        }
        LockEvent::Acquired { token, .. } => r.token = Some(BigInt::from(token.get())),
        LockEvent::Drained { .. } => {}
        _ => {}
    }
    r
}

/// A lock's id and its event (`None`: closed).
type EventSink = ThreadsafeFunction<(u32, Option<LockEvent>), (), NativeEvent, Status, false, true>;

static EVENTS: OnceLock<Arc<EventSink>> = OnceLock::new();

/// Sets the one function every lock's events are delivered to, on the
/// JavaScript thread, in the core's order. Weak: it never keeps the
/// process alive. Once per process.
#[napi(ts_args_type = "sink: (event: NativeEvent) => void")]
pub fn set_event_sink(sink: Function<NativeEvent, ()>) -> Result<()> {
    let tsfn = sink
        .build_threadsafe_function::<(u32, Option<LockEvent>)>()
        .weak::<true>()
        .callee_handled::<false>()
        .build_callback(|ctx| Ok(event_record(ctx.value.0, ctx.value.1.as_ref())))?;
    EVENTS.set(Arc::new(tsfn)).map_err(|_| {
        invalid(
            "dlock serves one JavaScript environment per process (the main thread); \
                 worker_threads are not supported",
        )
    })
}

/// A stale write's refusal: the highest token seen and the core's message.
#[napi(object)]
pub struct NativeStale {
    pub highest: BigInt,
    pub message: String,
}

impl NativeStale {
    fn of(s: dlock::Stale) -> NativeStale {
        NativeStale {
            highest: BigInt::from(s.highest.get()),
            message: s.to_string(),
        }
    }
}

/// `FenceGate`: refuses a token lower than the highest seen for a name.
#[napi]
pub struct NativeFenceGate {
    inner: dlock::FenceGate,
}

#[napi]
impl NativeFenceGate {
    #[napi(constructor)]
    pub fn new() -> NativeFenceGate {
        NativeFenceGate {
            inner: dlock::FenceGate::new(),
        }
    }

    /// `null` when admitted, else the refusal (the write is stale).
    #[napi]
    pub fn admit(&self, name: String, token: BigInt) -> Result<Option<NativeStale>> {
        let token = token_of(token)?;
        Ok(self.inner.admit(&name, token).err().map(|s| NativeStale {
            highest: BigInt::from(s.highest.get()),
            message: s.to_string(),
        }))
    }

    /// `admit` for a read: admitted iff at least the highest write.
    #[napi]
    pub fn admit_read(&self, name: String, token: BigInt) -> Result<Option<NativeStale>> {
        let token = token_of(token)?;
        Ok(self
            .inner
            .admit_read(&name, token)
            .err()
            .map(NativeStale::of))
    }

    /// `admit` for a write: admitted iff at least the highest write and
    /// the highest read.
    #[napi]
    pub fn admit_write(&self, name: String, token: BigInt) -> Result<Option<NativeStale>> {
        let token = token_of(token)?;
        Ok(self
            .inner
            .admit_write(&name, token)
            .err()
            .map(NativeStale::of))
    }

    #[napi]
    pub fn highest(&self, name: String) -> Option<BigInt> {
        self.inner.highest(&name).map(|t| BigInt::from(t.get()))
    }

    /// The highest write and the highest read token admitted for `name`
    /// (`null`: none of that mode yet).
    #[napi(ts_return_type = "[bigint | null, bigint | null]")]
    pub fn watermarks(&self, name: String) -> Vec<Option<BigInt>> {
        let (w, r) = self.inner.watermarks(&name);
        [w, r]
            .into_iter()
            .map(|t| t.map(|t| BigInt::from(t.get())))
            .collect()
    }
}

impl Default for NativeFenceGate {
    fn default() -> Self {
        NativeFenceGate::new()
    }
}

/// Blocks dlock's driver thread for `ms` without blocking the caller
/// (tests of a starved keepalive).
#[napi]
pub fn stall_driver(ms_value: f64) -> Result<()> {
    dlock::memory::stall_driver(ms("ms", ms_value)?);
    Ok(())
}

/// Whether the addon was built with the test-only scenario runner.
#[napi]
pub fn has_scenario_runner() -> bool {
    cfg!(feature = "scenarios")
}

/// The core's process-wide shutdown (`dlock::shutdown`): every session of
/// every client ends at once, bounded by one keepalive timeout in total.
/// Called from `process.on('exit')` (the end of the script and
/// `process.exit`) and from the environment's cleanup hook (an embedder's
/// teardown).
#[napi]
pub fn shutdown() {
    dlock::shutdown();
}

/// A pending acquisition (`lock.acquire(timeout, handle)`): `cancel()` is
/// the core's `Acquisition::cancel`.
#[napi]
#[derive(Default)]
pub struct NativeAcquisition {
    inner: OnceLock<dlock::Acquisition>,
}

#[napi]
impl NativeAcquisition {
    #[napi(constructor)]
    pub fn new() -> NativeAcquisition {
        NativeAcquisition::default()
    }

    /// Leaves nothing held by the acquisition, whenever called: a wait
    /// ends (`released`), a lock won meanwhile is let go. Idempotent.
    #[napi]
    pub fn cancel(&self) {
        if let Some(a) = self.inner.get() {
            a.cancel();
        }
    }
}

#[napi(module_exports)]
pub fn init(_exports: Object, env: Env) -> Result<()> {
    env.add_env_cleanup_hook((), |()| dlock::shutdown())?;
    Ok(())
}
