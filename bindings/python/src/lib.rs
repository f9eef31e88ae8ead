//! `dlock._dlock`: the native module under the Python package `dlock`.
//!
//! It converts between Python and the core and decides nothing about
//! leases, deadlines or tokens (docs/design.md §19). Durations are seconds
//! as floats; errors are the classes of `dlock._errors`, one per code word
//! of the core's table (`dlock::Code`). Blocking calls release the GIL;
//! the ones that wait for another holder wait in short slices and check
//! for signals between them, so Ctrl-C interrupts them (and releases what
//! they were acquiring). Async calls complete from the core's driver: the
//! core's futures are polled by one small bridge thread that hands each
//! outcome to its asyncio loop with `call_soon_threadsafe`, so neither the
//! driver nor the callback thread ever waits for the GIL on their behalf.

use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::{Pin, pin};
use std::sync::{Arc, Mutex, OnceLock, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple};

// ---------------------------------------------------------------- errors

/// `dlock._errors.BY_CODE`: code word -> exception class.
static ERRORS: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
/// `logging.getLogger("dlock")`.
static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
/// `dlock._aio.complete(fut, value, exc)`.
static COMPLETE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// The exception of the code table's `code` with `message`.
fn error(py: Python<'_>, code: &str, message: String) -> PyErr {
    let made = (|| -> PyResult<PyErr> {
        let by_code = ERRORS
            .get_or_try_init(py, || -> PyResult<Py<PyDict>> {
                Ok(py
                    .import("dlock._errors")?
                    .getattr("BY_CODE")?
                    .cast_into::<PyDict>()?
                    .unbind())
            })?
            .bind(py);
        let class = match by_code.get_item(code)? {
            Some(c) => c,
            None => by_code
                .get_item("panic")?
                .ok_or_else(|| PyTypeError::new_err("dlock._errors has no `panic`"))?,
        };
        Ok(PyErr::from_value(class.call1((message,))?))
    })();
    made.unwrap_or_else(|e| e)
}

/// A core error as its Python exception.
fn core_err(py: Python<'_>, e: dlock::Error) -> PyErr {
    let err = error(py, e.code(), e.to_string());
    if let dlock::Error::Fenced(token) = e {
        let _ = err.value(py).setattr("token", token);
    }
    err
}

trait OrRaise<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrRaise<T> for Result<T, dlock::Error> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| core_err(py, e))
    }
}

fn forked_err(py: Python<'_>) -> PyErr {
    core_err(py, dlock::Error::Forked)
}

/// Fails with `dlock.Forked` in a child of `fork()`.
fn not_forked(py: Python<'_>) -> PyResult<()> {
    if dlock::forked() {
        Err(forked_err(py))
    } else {
        Ok(())
    }
}

/// Seconds as a `Duration`: a finite number ≥ 0, else the error `code`
/// naming `what`.
fn seconds(py: Python<'_>, what: &str, code: &str, v: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(v).map_err(|_| {
        error(
            py,
            code,
            format!("{what} must be a finite number of seconds >= 0, got {v}"),
        )
    })
}

/// A timeout argument: `None` waits as long as it takes.
fn timeout_arg(py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout
        .map(|t| seconds(py, "timeout", "invalid_argument", t))
        .transpose()
}

/// `None` or the value, as Python prints it.
fn py_opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "None".to_string(), |v| v.to_string())
}

fn secs_f64(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// Bytes from `bytes`, `bytearray` or `str` (UTF-8).
fn bytes_arg(what: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(s) = v.cast::<PyString>() {
        return Ok(s.to_cow()?.as_bytes().to_vec());
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    v.extract::<Vec<u8>>().map_err(|_| {
        PyTypeError::new_err(format!("{what} must be bytes or str, not {}", type_name(v)))
    })
}

/// The name of `v`'s type, for a `TypeError`.
fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_default()
}

// ------------------------------------------------------------- callbacks

/// Reports an exception raised by a callback to the logger `dlock`; it
/// changes nothing else.
fn report(py: Python<'_>, what: &str, e: PyErr) {
    let logged = (|| -> PyResult<()> {
        let logger = LOGGER.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py
                .import("logging")?
                .call_method1("getLogger", ("dlock",))?
                .unbind())
        })?;
        let kwargs = PyDict::new(py);
        kwargs.set_item("exc_info", e.value(py))?;
        logger.bind(py).call_method(
            "error",
            ("exception in the %s callback of a dlock lock", what),
            Some(&kwargs),
        )?;
        Ok(())
    })();
    if let Err(unlogged) = logged {
        unlogged.write_unraisable(py, None);
    }
}

/// Calls `f(args)` with the GIL taken (skipped while the interpreter is
/// shutting down); an exception goes to `report`.
fn call_back(
    f: &Py<PyAny>,
    what: &'static str,
    args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
) {
    Python::try_attach(|py| {
        if let Err(e) = args(py).and_then(|a| f.bind(py).call1(a)) {
            report(py, what, e);
        }
    });
}

// ----------------------------------------------------------- async bridge

/// What a bridged future produced, turned into Python under the GIL.
enum Outcome {
    Token(Result<u64, dlock::Error>),
    Unit(Result<(), dlock::Error>),
    /// An event stream read: the event waits in its slot.
    Ready,
}

type BoxFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// One bridged future: polled on the bridge thread whenever woken.
struct Task {
    future: Mutex<Option<BoxFuture>>,
    event_loop: Py<PyAny>,
    py_future: Py<PyAny>,
}

impl Wake for Task {
    fn wake(self: Arc<Self>) {
        bridge().send(self);
    }
}

struct Bridge(Mutex<mpsc::Sender<Arc<Task>>>);

impl Bridge {
    fn send(&self, t: Arc<Task>) {
        let _ = self.0.lock().unwrap_or_else(|e| e.into_inner()).send(t);
    }
}

fn bridge() -> &'static Bridge {
    static BRIDGE: OnceLock<Bridge> = OnceLock::new();
    BRIDGE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Arc<Task>>();
        std::thread::Builder::new()
            .name("dlock-asyncio".into())
            .spawn(move || {
                for task in rx {
                    task.poll();
                }
            })
            .expect("cannot start dlock's asyncio bridge thread");
        Bridge(Mutex::new(tx))
    })
}

impl Task {
    fn poll(self: &Arc<Self>) {
        let mut slot = self.future.lock().unwrap_or_else(|e| e.into_inner());
        let Some(fut) = slot.as_mut() else { return };
        let waker = Waker::from(self.clone());
        let Poll::Ready(outcome) = fut.as_mut().poll(&mut Context::from_waker(&waker)) else {
            return;
        };
        *slot = None;
        drop(slot);
        Python::try_attach(|py| {
            let _closed_loop = self.deliver(py, outcome);
        });
    }

    /// Hands `outcome` to the future's loop. An error here means the loop is
    /// closed: nobody awaits the outcome any more.
    fn deliver(&self, py: Python<'_>, outcome: Outcome) -> PyResult<()> {
        let (value, exc): (Py<PyAny>, Py<PyAny>) = match outcome {
            Outcome::Token(Ok(t)) => (t.into_pyobject(py)?.into_any().unbind(), py.None()),
            Outcome::Unit(Ok(())) | Outcome::Ready => (py.None(), py.None()),
            Outcome::Token(Err(e)) | Outcome::Unit(Err(e)) => {
                (py.None(), core_err(py, e).into_value(py).into_any())
            }
        };
        let complete = COMPLETE.get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("dlock._aio")?.getattr("complete")?.unbind())
        })?;
        self.event_loop.bind(py).call_method1(
            "call_soon_threadsafe",
            (complete, &self.py_future, value, exc),
        )?;
        Ok(())
    }
}

/// Polls `future` on the bridge thread; its outcome completes `py_future`
/// on `event_loop`.
fn bridge_spawn(
    py: Python<'_>,
    event_loop: Py<PyAny>,
    py_future: Py<PyAny>,
    future: impl Future<Output = Outcome> + Send + 'static,
) -> PyResult<()> {
    not_forked(py)?;
    let task = Arc::new(Task {
        future: Mutex::new(Some(Box::pin(future))),
        event_loop,
        py_future,
    });
    bridge().send(task);
    Ok(())
}

// ------------------------------------------------------ interruptible wait

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// How long a blocking wait stays without the GIL before checking signals.
const SLICE: Duration = Duration::from_millis(50);

/// Runs `future` to completion on this thread without the GIL, checking
/// for signals (Ctrl-C) every slice; on a signal's exception calls
/// `interrupted` (detached) and raises it.
fn wait_interruptible<F>(
    py: Python<'_>,
    future: F,
    interrupted: impl FnOnce() + Send,
) -> PyResult<F::Output>
where
    F: Future + Send,
    F::Output: Send,
{
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    loop {
        let polled = py.detach(|| {
            let mut cx = Context::from_waker(&waker);
            let until = std::time::Instant::now() + SLICE;
            loop {
                if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
                    return Some(v);
                }
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        });
        if let Some(v) = polled {
            return Ok(v);
        }
        if let Err(e) = py.check_signals() {
            py.detach(interrupted);
            return Err(e);
        }
    }
}

// ------------------------------------------------------------- options

/// The timing settings of a client or session, each `None` for the base's.
#[derive(Default)]
struct Timing {
    ttl: Option<f64>,
    keepalive_interval: Option<f64>,
    keepalive_timeout: Option<f64>,
    retry_interval: Option<f64>,
    margin: Option<f64>,
    reacquire: Option<bool>,
}

impl Timing {
    fn options(&self, py: Python<'_>, base: &dlock::Options) -> PyResult<dlock::Options> {
        let mut o = base.clone();
        let set = |name: &str, v: Option<f64>, slot: &mut Duration| -> PyResult<()> {
            if let Some(v) = v {
                *slot = seconds(py, name, "invalid_option", v)?;
            }
            Ok(())
        };
        set("ttl", self.ttl, &mut o.ttl)?;
        set(
            "keepalive_interval",
            self.keepalive_interval,
            &mut o.keepalive_interval,
        )?;
        set(
            "keepalive_timeout",
            self.keepalive_timeout,
            &mut o.keepalive_timeout,
        )?;
        set("retry_interval", self.retry_interval, &mut o.retry_interval)?;
        set("margin", self.margin, &mut o.margin)?;
        if let Some(r) = self.reacquire {
            o.reacquire = r;
        }
        o.validate().or_raise(py)?;
        Ok(o)
    }
}

fn options_dict<'py>(py: Python<'py>, o: &dlock::Options) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("ttl", secs_f64(o.ttl))?;
    d.set_item("keepalive_interval", secs_f64(o.keepalive_interval))?;
    d.set_item("keepalive_timeout", secs_f64(o.keepalive_timeout))?;
    d.set_item("retry_interval", secs_f64(o.retry_interval))?;
    d.set_item("margin", secs_f64(o.margin))?;
    d.set_item("reacquire", o.reacquire)?;
    Ok(d)
}

// ---------------------------------------------------------------- client

/// A connection to a lock service (see `dlock.Client`).
#[pyclass(module = "dlock._dlock", subclass, frozen)]
struct Client {
    inner: dlock::Client,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (endpoints=None, *, ttl=None, keepalive_interval=None,
        keepalive_timeout=None, retry_interval=None, margin=None, reacquire=None,
        memory=None, ca_file=None, cert_file=None, key_file=None, user=None,
        password=None, allow_plaintext_password=None, connect_timeout=None,
        request_timeout=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoints: Option<&Bound<'_, PyAny>>,
        ttl: Option<f64>,
        keepalive_interval: Option<f64>,
        keepalive_timeout: Option<f64>,
        retry_interval: Option<f64>,
        margin: Option<f64>,
        reacquire: Option<bool>,
        memory: Option<PyRef<'_, MemoryService>>,
        ca_file: Option<std::path::PathBuf>,
        cert_file: Option<std::path::PathBuf>,
        key_file: Option<std::path::PathBuf>,
        user: Option<String>,
        password: Option<String>,
        allow_plaintext_password: Option<bool>,
        connect_timeout: Option<f64>,
        request_timeout: Option<f64>,
    ) -> PyResult<Client> {
        not_forked(py)?;
        let timing = Timing {
            ttl,
            keepalive_interval,
            keepalive_timeout,
            retry_interval,
            margin,
            reacquire,
        };
        let options = timing.options(py, &dlock::Options::default())?;
        let etcd_only = ca_file.is_some()
            || cert_file.is_some()
            || key_file.is_some()
            || user.is_some()
            || password.is_some()
            || allow_plaintext_password.is_some()
            || connect_timeout.is_some()
            || request_timeout.is_some();
        let invalid = |m: &str| error(py, "invalid_argument", m.to_string());
        let config = match (endpoints, memory) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "give endpoints (etcd) or memory (embedded), not both",
                ));
            }
            (None, memory) => {
                if etcd_only {
                    return Err(invalid(
                        "TLS, user and timeout settings are etcd settings: give endpoints too \
                         (or set DLOCK_ENDPOINTS and the DLOCK_* variables)",
                    ));
                }
                match memory {
                    Some(m) => dlock::ClientConfig::embedded_in(m.inner.clone()),
                    None => dlock::ClientConfig::from_env(),
                }
            }
            (Some(e), None) => {
                let list: String = if let Ok(s) = e.cast::<PyString>() {
                    s.to_cow()?.to_string()
                } else {
                    let items: Vec<String> = e.extract().map_err(|_| {
                        PyTypeError::new_err("endpoints must be a str or a sequence of str")
                    })?;
                    items.join(",")
                };
                let mut c = dlock::EtcdConfig::parse(&list).or_raise(py)?;
                c.ca_file = ca_file;
                c.cert_file = cert_file;
                c.key_file = key_file;
                c.user = user;
                c.password = password;
                if let Some(a) = allow_plaintext_password {
                    c.allow_plaintext_password = a;
                }
                if let Some(t) = connect_timeout {
                    c.connect_timeout = seconds(py, "connect_timeout", "invalid_argument", t)?;
                }
                if let Some(t) = request_timeout {
                    c.request_timeout = seconds(py, "request_timeout", "invalid_argument", t)?;
                }
                dlock::ClientConfig::etcd(c)
            }
        };
        let config = config.with_options(options);
        let inner = py.detach(|| dlock::Client::connect(config)).or_raise(py)?;
        Ok(Client { inner })
    }

    /// The timing settings of the default session, in seconds.
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        options_dict(py, self.inner.options())
    }

    /// The embedded backend's fault switches of this client; None on etcd.
    #[getter]
    fn link(&self) -> Option<Link> {
        self.inner.link().map(|l| Link { inner: l.clone() })
    }

    /// The embedded service of this client; None on etcd.
    #[getter]
    fn memory(&self) -> Option<MemoryService> {
        self.inner.link().map(|l| MemoryService {
            inner: l.service().clone(),
        })
    }

    /// The default session, shared by `client.lock(name)`'s locks.
    #[getter]
    fn _default_session(&self) -> Session {
        Session {
            inner: self.inner.default_session().clone(),
        }
    }

    /// A new session (its own lease); settings default to the client's.
    #[pyo3(signature = (*, ttl=None, keepalive_interval=None, keepalive_timeout=None,
        retry_interval=None, margin=None, reacquire=None))]
    #[allow(clippy::too_many_arguments)]
    fn _session(
        &self,
        py: Python<'_>,
        ttl: Option<f64>,
        keepalive_interval: Option<f64>,
        keepalive_timeout: Option<f64>,
        retry_interval: Option<f64>,
        margin: Option<f64>,
        reacquire: Option<bool>,
    ) -> PyResult<Session> {
        not_forked(py)?;
        let timing = Timing {
            ttl,
            keepalive_interval,
            keepalive_timeout,
            retry_interval,
            margin,
            reacquire,
        };
        let options = timing.options(py, self.inner.options())?;
        let inner = self.inner.session(options).or_raise(py)?;
        Ok(Session { inner })
    }
}

// --------------------------------------------------------------- session

/// One lease shared by any number of locks.
#[pyclass(module = "dlock._dlock", subclass, frozen)]
struct Session {
    inner: dlock::Session,
}

#[pymethods]
impl Session {
    /// The lease, while one is granted.
    #[getter]
    fn lease(&self, py: Python<'_>) -> PyResult<Option<i64>> {
        not_forked(py)?;
        Ok(self.inner.lease())
    }

    /// Whether this is its client's default session.
    #[getter]
    fn is_default(&self) -> bool {
        self.inner.is_default()
    }

    /// The session's timing settings, in seconds.
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        options_dict(py, self.inner.options())
    }

    /// The lease, keepalives sent, locks, last keepalive round trip.
    fn stats(&self, py: Python<'_>) -> PyResult<SessionStats> {
        not_forked(py)?;
        let s = self.inner.stats();
        Ok(SessionStats {
            lease: s.lease,
            keepalives: s.keepalives,
            locks: s.locks,
            last_keepalive_rtt: s.last_keepalive_rtt.map(secs_f64),
        })
    }

    /// Releases every lock of the session and revokes its lease.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let s = self.inner.clone();
        py.detach(move || s.close()).or_raise(py)
    }

    fn __repr__(&self) -> String {
        format!("{:?}", self.inner)
    }
}

/// What `Session.stats()` reports.
#[pyclass(module = "dlock._dlock", frozen, get_all)]
struct SessionStats {
    lease: Option<i64>,
    keepalives: u64,
    locks: u64,
    last_keepalive_rtt: Option<f64>,
}

#[pymethods]
impl SessionStats {
    fn __repr__(&self) -> String {
        format!(
            "SessionStats(lease={}, keepalives={}, locks={}, last_keepalive_rtt={})",
            py_opt(self.lease),
            self.keepalives,
            self.locks,
            py_opt(self.last_keepalive_rtt)
        )
    }
}

/// What `Lock.stats()` reports; durations in seconds.
#[pyclass(module = "dlock._dlock", frozen, get_all)]
struct LockStats {
    acquisitions: u64,
    drains: u64,
    resumes: u64,
    fences_deadline: u64,
    fences_lease_lost: u64,
    fences_lock_lost: u64,
    last_keepalive_rtt: Option<f64>,
    slack: Option<f64>,
    in_flight: u64,
}

#[pymethods]
impl LockStats {
    fn __repr__(&self) -> String {
        format!(
            "LockStats(acquisitions={}, drains={}, resumes={}, fences_deadline={}, \
             fences_lease_lost={}, fences_lock_lost={}, last_keepalive_rtt={}, slack={}, \
             in_flight={})",
            self.acquisitions,
            self.drains,
            self.resumes,
            self.fences_deadline,
            self.fences_lease_lost,
            self.fences_lock_lost,
            py_opt(self.last_keepalive_rtt),
            py_opt(self.slack),
            self.in_flight
        )
    }
}

// ------------------------------------------------------------------ lock

/// One named lock (see `dlock.Lock`).
#[pyclass(module = "dlock._dlock", subclass, frozen, weakref)]
struct Lock {
    /// Dropped without the GIL (the core's drop waits for a callback that
    /// may be waiting for the GIL).
    inner: ManuallyDrop<Arc<dlock::Lock>>,
}

impl Drop for Lock {
    fn drop(&mut self) {
        // SAFETY: taken once, here.
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        Python::attach(|py| py.detach(move || drop(inner)));
    }
}

fn refused(py: Python<'_>, r: dlock::Refused) -> PyErr {
    if dlock::forked() {
        return forked_err(py);
    }
    error(py, r.as_str(), r.to_string())
}

#[pymethods]
impl Lock {
    /// A lock called `name` on `owner`, a Client (its default session) or a
    /// Session; not acquired yet.
    #[new]
    fn new(py: Python<'_>, owner: &Bound<'_, PyAny>, name: &Bound<'_, PyAny>) -> PyResult<Lock> {
        let name = name.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "a lock name must be a str, not {}",
                type_name(name)
            ))
        })?;
        let name = name.to_cow()?;
        let lock = if let Ok(c) = owner.cast::<Client>() {
            c.get().inner.lock(&name)
        } else if let Ok(s) = owner.cast::<Session>() {
            s.get().inner.lock(&name)
        } else {
            return Err(PyTypeError::new_err(
                "a lock's owner must be a dlock.Client or a dlock.Session",
            ));
        };
        Ok(Lock {
            inner: ManuallyDrop::new(Arc::new(lock.or_raise(py)?)),
        })
    }

    /// The lock's name.
    #[getter]
    fn name(&self) -> &str {
        self.inner.name()
    }

    /// The session the lock is held under.
    #[getter]
    fn _session(&self) -> Session {
        Session {
            inner: self.inner.session().clone(),
        }
    }

    /// Acquires, waiting up to `timeout` seconds (None: as long as it
    /// takes; 0: one try); returns the token. Releases the GIL; Ctrl-C
    /// interrupts it and cancels the acquire.
    #[pyo3(signature = (timeout=None))]
    fn acquire(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<u64> {
        let timeout = timeout_arg(py, timeout)?;
        not_forked(py)?;
        let lock = &**self.inner;
        let got = wait_interruptible(py, lock.acquire_async(timeout), || {
            let _ = lock.release();
        })?;
        got.map(|t| t.get()).or_raise(py)
    }

    /// Acquires if nobody holds the lock, else raises `WouldBlock`.
    fn try_acquire(&self, py: Python<'_>) -> PyResult<u64> {
        not_forked(py)?;
        let lock = &**self.inner;
        let got = wait_interruptible(py, lock.try_acquire_async(), || {
            let _ = lock.release();
        })?;
        got.map(|t| t.get()).or_raise(py)
    }

    /// Releases the lock (deletes its key); no permit is valid from now on.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let lock = self.inner.clone();
        py.detach(move || lock.release()).or_raise(py)
    }

    /// Releases and ends the lock's callbacks and event streams.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        not_forked(py)?;
        let lock = self.inner.clone();
        py.detach(move || lock.close()).or_raise(py)
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The state's name (`"Holding"`, ...).
    #[getter]
    fn state_name(&self, py: Python<'_>) -> PyResult<&'static str> {
        not_forked(py)?;
        Ok(self.inner.state().as_str())
    }

    /// The token held, while Holding or Draining; else None.
    #[getter]
    fn token(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        not_forked(py)?;
        Ok(self.inner.token().map(|t| t.get()))
    }

    /// The local deadline, seconds on `time.CLOCK_BOOTTIME`, while Holding or
    /// Draining; else None.
    #[getter]
    fn deadline(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        not_forked(py)?;
        Ok(self.inner.deadline().map(|d| d.as_nanos() as f64 / 1e9))
    }

    /// Seconds left before the deadline (0 once passed), while Holding or
    /// Draining; else None.
    #[getter]
    fn time_left(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        not_forked(py)?;
        Ok(self.inner.time_left().map(secs_f64))
    }

    /// Permits in flight.
    #[getter]
    fn in_flight(&self) -> u64 {
        self.inner.in_flight()
    }

    /// Counters, the last keepalive's round trip, the slack, the permits in
    /// flight.
    fn stats(&self, py: Python<'_>) -> PyResult<LockStats> {
        not_forked(py)?;
        let s = self.inner.stats();
        Ok(LockStats {
            acquisitions: s.acquisitions,
            drains: s.drains,
            resumes: s.resumes,
            fences_deadline: s.fences_deadline,
            fences_lease_lost: s.fences_lease_lost,
            fences_lock_lost: s.fences_lock_lost,
            last_keepalive_rtt: s.last_keepalive_rtt.map(secs_f64),
            slack: s.slack.map(secs_f64),
            in_flight: s.in_flight,
        })
    }

    /// Permission for one unit of work, or the refusal (`Draining`,
    /// `Fenced`, `Released`, `NotHeld`) raised.
    fn permit(&self, py: Python<'_>) -> PyResult<Permit> {
        match self.inner.permit_owned() {
            Ok(p) => Ok(Permit {
                token: p.token().get(),
                inner: Some(p),
            }),
            Err(r) => Err(refused(py, r)),
        }
    }

    /// `fn(token, in_flight)` once per fenced token.
    fn on_fence(&self, py: Python<'_>, f: Py<PyAny>) -> Py<PyAny> {
        let g = f.clone_ref(py);
        self.inner.on_fence(move |token, in_flight| {
            call_back(&g, "on_fence", |py| {
                (token.get(), in_flight).into_pyobject(py)
            });
        });
        f
    }

    /// `fn(from_state, to_state, reason)` (words) on every state change.
    fn _on_state_change_words(&self, f: Py<PyAny>) {
        self.inner.on_state_change(move |c| {
            call_back(&f, "on_state_change", |py| {
                (c.from.as_str(), c.to.as_str(), c.reason.as_str()).into_pyobject(py)
            });
        });
    }

    /// `fn(token)` on every acquisition.
    fn on_acquired(&self, py: Python<'_>, f: Py<PyAny>) -> Py<PyAny> {
        let g = f.clone_ref(py);
        self.inner.on_acquired(move |token| {
            call_back(&g, "on_acquired", |py| (token.get(),).into_pyobject(py));
        });
        f
    }

    /// `fn()` once the lock left Holding and no permit is in flight.
    fn on_drained(&self, py: Python<'_>, f: Py<PyAny>) -> Py<PyAny> {
        let g = f.clone_ref(py);
        self.inner.on_drained(move || {
            call_back(&g, "on_drained", |py| Ok(PyTuple::empty(py)));
        });
        f
    }

    /// `fn(event)` with every event (an `Event`).
    fn on_event(&self, py: Python<'_>, f: Py<PyAny>) -> Py<PyAny> {
        let g = f.clone_ref(py);
        self.inner.on_event(move |e| {
            let e = Event::from(e);
            call_back(&g, "on_event", |py| (e,).into_pyobject(py));
        });
        f
    }

    /// The lock's events from now on (ends with the close).
    fn _events(&self) -> EventStream {
        EventStream {
            slot: Arc::new(Mutex::new(StreamSlot::new(self.inner.events()))),
        }
    }

    /// Puts `key` = `value` only while `token` holds the lock (decided by
    /// the service); `Fenced` otherwise.
    fn guarded_put(
        &self,
        py: Python<'_>,
        token: u64,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let key = bytes_arg("key", key)?;
        let value = bytes_arg("value", value)?;
        not_forked(py)?;
        let lock = self.inner.clone();
        py.detach(move || lock.guarded_put(dlock::Token(token), &key, &value))
            .or_raise(py)
    }

    /// Deletes `key` under the rules of `guarded_put`.
    fn guarded_delete(&self, py: Python<'_>, token: u64, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let key = bytes_arg("key", key)?;
        not_forked(py)?;
        let lock = self.inner.clone();
        py.detach(move || lock.guarded_delete(dlock::Token(token), &key))
            .or_raise(py)
    }

    /// Starts an acquire whose token (or error) completes `fut` on `loop`.
    fn _acquire_start(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        r#loop: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<()> {
        let timeout = timeout_arg(py, timeout)?;
        let lock = (*self.inner).clone();
        bridge_spawn(py, r#loop, fut, async move {
            Outcome::Token(lock.acquire_async(timeout).await.map(|t| t.get()))
        })
    }

    /// Starts a release that completes `fut` on `loop`.
    fn _release_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let lock = (*self.inner).clone();
        bridge_spawn(py, r#loop, fut, async move {
            Outcome::Unit(lock.release_async().await)
        })
    }

    /// Starts a close that completes `fut` on `loop`.
    fn _close_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let lock = (*self.inner).clone();
        bridge_spawn(py, r#loop, fut, async move {
            Outcome::Unit(lock.close_async().await)
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", **self.inner)
    }
}

// ---------------------------------------------------------------- permit

/// Permission for one unit of work; a context manager that ends it.
#[pyclass(module = "dlock._dlock")]
struct Permit {
    inner: Option<dlock::OwnedPermit>,
    token: u64,
}

#[pymethods]
impl Permit {
    /// The token every write of this unit of work carries.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// Whether the work may still commit (re-reads the clock); False once
    /// ended.
    fn valid(&self) -> bool {
        self.inner.as_ref().is_some_and(|p| p.valid())
    }

    /// Seconds left before the lock's deadline while this token holds; 0
    /// once it does not (or the permit ended).
    #[getter]
    fn remaining(&self) -> f64 {
        self.inner.as_ref().map_or(0.0, |p| secs_f64(p.remaining()))
    }

    /// Ends the unit of work (twice is harmless).
    fn end(&mut self) {
        self.inner = None;
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __exit__(
        &mut self,
        _ty: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
        _tb: &Bound<'_, PyAny>,
    ) -> bool {
        self.inner = None;
        false
    }

    fn __repr__(&self) -> String {
        format!(
            "Permit(token={}, live={})",
            self.token,
            self.inner.is_some()
        )
    }
}

// ---------------------------------------------------------------- events

/// One event of a lock; `str(event)` is the scenario trace line.
#[pyclass(module = "dlock._dlock", frozen, get_all)]
struct Event {
    /// `"state"`, `"fence"`, `"acquired"` or `"drained"`.
    kind: &'static str,
    /// fence, acquired: the token.
    token: Option<u64>,
    /// fence: permits in flight.
    in_flight: Option<u64>,
    /// state: the state left, the state entered, the reason (words).
    from_state: Option<&'static str>,
    to_state: Option<&'static str>,
    reason: Option<&'static str>,
    /// When the core decided it, seconds on `time.CLOCK_BOOTTIME`.
    at: f64,
    /// The trace line, as `str(event)`.
    line: String,
}

impl From<&dlock::LockEvent> for Event {
    fn from(e: &dlock::LockEvent) -> Event {
        let mut ev = Event {
            kind: e.kind(),
            token: None,
            in_flight: None,
            from_state: None,
            to_state: None,
            reason: None,
            at: e.at().as_nanos() as f64 / 1e9,
            line: e.to_string(),
        };
        match *e {
            dlock::LockEvent::State { change, .. } => {
                ev.from_state = Some(change.from.as_str());
                ev.to_state = Some(change.to.as_str());
                ev.reason = Some(change.reason.as_str());
            }
            dlock::LockEvent::Fence {
                token, in_flight, ..
            } => {
                ev.token = Some(token.get());
                ev.in_flight = Some(in_flight);
            }
            dlock::LockEvent::Acquired { token, .. } => ev.token = Some(token.get()),
            _ => {}
        }
        ev
    }
}

#[pymethods]
impl Event {
    fn __str__(&self) -> &str {
        &self.line
    }

    fn __repr__(&self) -> String {
        format!("<dlock.Event {}>", self.line)
    }
}

struct StreamSlot {
    /// None while a read has it.
    stream: Option<dlock::EventStream>,
    /// An event an async read got, waiting to be taken (kept if the read
    /// was cancelled, for the next read).
    ready: Option<dlock::LockEvent>,
    /// The stream gave its end.
    ended: bool,
    /// Bumped when an async read is done; wakes the reads that joined it.
    reads_done: u64,
    joined: Vec<Waker>,
}

impl StreamSlot {
    fn new(stream: dlock::EventStream) -> StreamSlot {
        StreamSlot {
            stream: Some(stream),
            ready: None,
            ended: false,
            reads_done: 0,
            joined: Vec::new(),
        }
    }

    /// Puts the stream back with what a read got.
    fn read_done(&mut self, stream: dlock::EventStream, got: Option<dlock::LockEvent>) {
        self.stream = Some(stream);
        match got {
            Some(e) => self.ready = Some(e),
            None => self.ended = true,
        }
        self.reads_done += 1;
        for w in self.joined.drain(..) {
            w.wake();
        }
    }
}

fn lock_slot(slot: &Mutex<StreamSlot>) -> std::sync::MutexGuard<'_, StreamSlot> {
    slot.lock().unwrap_or_else(|e| e.into_inner())
}

/// Completes once the async read in progress when it was made is done (a
/// read that a cancelled `async for` step left behind, say).
struct ReadDone {
    slot: Arc<Mutex<StreamSlot>>,
    seen: u64,
}

impl Future for ReadDone {
    type Output = Outcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let mut slot = lock_slot(&self.slot);
        if slot.reads_done != self.seen {
            return Poll::Ready(Outcome::Ready);
        }
        slot.joined.push(cx.waker().clone());
        Poll::Pending
    }
}

/// A lock's events, in order (see `dlock.Lock.events`).
#[pyclass(module = "dlock._dlock", frozen)]
struct EventStream {
    slot: Arc<Mutex<StreamSlot>>,
}

fn busy(py: Python<'_>) -> PyErr {
    error(
        py,
        "invalid_argument",
        "another read of this event stream is in progress".into(),
    )
}

#[pymethods]
impl EventStream {
    /// The next event, waiting up to `timeout` seconds (None: as long as it
    /// takes); None once the stream ended; `Timeout` when none came.
    /// Ctrl-C interrupts it.
    #[pyo3(signature = (timeout=None))]
    fn next_event(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Event>> {
        let timeout = timeout_arg(py, timeout)?;
        let until = timeout.map(|t| std::time::Instant::now() + t);
        let mut slot = lock_slot(&self.slot);
        if let Some(e) = slot.ready.take() {
            return Ok(Some(Event::from(&e)));
        }
        if slot.ended {
            return Ok(None);
        }
        let Some(mut stream) = slot.stream.take() else {
            return Err(busy(py));
        };
        drop(slot);
        let got = loop {
            let left = until.map(|u| u.saturating_duration_since(std::time::Instant::now()));
            let wait = left.map_or(SLICE, |l| l.min(SLICE));
            match py.detach(|| stream.recv_blocking(Some(wait))) {
                Ok(e) => break Ok(e),
                Err(()) if left.is_some_and(|l| l <= wait) => {
                    break Err(error(py, "timeout", "no event within the timeout".into()));
                }
                Err(()) => {
                    if let Err(e) = py.check_signals() {
                        break Err(e);
                    }
                }
            }
        };
        let mut slot = lock_slot(&self.slot);
        slot.stream = Some(stream);
        let got = got?;
        slot.ended |= got.is_none();
        Ok(got.as_ref().map(Event::from))
    }

    /// Starts an async read: `fut` completes (with None) once an event is
    /// ready for `_take_ready`, the stream ended (`_ended`), or the read in
    /// progress that this one joined is done (then read again).
    fn _next_start(&self, py: Python<'_>, r#loop: Py<PyAny>, fut: Py<PyAny>) -> PyResult<()> {
        let mut slot = lock_slot(&self.slot);
        if slot.ready.is_some() || slot.ended {
            drop(slot);
            return bridge_spawn(py, r#loop, fut, async { Outcome::Ready });
        }
        let Some(mut stream) = slot.stream.take() else {
            let done = ReadDone {
                slot: self.slot.clone(),
                seen: slot.reads_done,
            };
            drop(slot);
            return bridge_spawn(py, r#loop, fut, done);
        };
        drop(slot);
        let shared = self.slot.clone();
        bridge_spawn(py, r#loop, fut, async move {
            let got = stream.recv().await;
            lock_slot(&shared).read_done(stream, got);
            Outcome::Ready
        })
    }

    /// The event an async read made ready, if any.
    fn _take_ready(&self) -> Option<Event> {
        lock_slot(&self.slot).ready.take().as_ref().map(Event::from)
    }

    /// Whether the stream ended (and every event was taken).
    #[getter]
    fn _ended(&self) -> bool {
        let slot = lock_slot(&self.slot);
        slot.ended && slot.ready.is_none()
    }
}

// --------------------------------------------------- embedded service etc.

/// An embedded, in-process lock service (with server-side TTL expiry,
/// tokens and fault switches).
#[pyclass(module = "dlock._dlock", frozen)]
struct MemoryService {
    inner: dlock::MemoryService,
}

#[pymethods]
impl MemoryService {
    /// A new, isolated service.
    #[new]
    fn new() -> MemoryService {
        MemoryService {
            inner: dlock::MemoryService::new(),
        }
    }

    /// The process-wide service (the one `Client()` uses when no
    /// `DLOCK_ENDPOINTS` is set).
    #[staticmethod]
    fn shared() -> MemoryService {
        MemoryService {
            inner: dlock::MemoryService::shared(),
        }
    }

    /// The process-wide service called `name` (`""`: the shared one).
    #[staticmethod]
    fn named(name: String) -> MemoryService {
        MemoryService {
            inner: dlock::MemoryService::named(&name),
        }
    }

    /// The holder's token of the lock `name` as the service sees it.
    fn holder(&self, name: String) -> Option<u64> {
        self.inner.holder(&name).map(|t| t.get())
    }

    /// Stops (True) or restarts (False) server-side expiry.
    #[pyo3(signature = (frozen=true))]
    fn freeze_expiry(&self, frozen: bool) {
        self.inner.freeze_expiry(frozen);
    }

    /// Deletes the key holding `name` (as `etcdctl del`); False if nobody
    /// holds it.
    fn delete_lock_key(&self, name: String) -> bool {
        self.inner.delete_lock_key(&name)
    }

    /// Revokes `lease` (as `etcdctl lease revoke`); False if unknown.
    fn revoke_lease(&self, lease: i64) -> bool {
        self.inner.revoke_lease(lease)
    }

    /// Whether `lease` exists.
    fn lease_alive(&self, lease: i64) -> bool {
        self.inner.lease_alive(lease)
    }

    /// The value a guarded write put at `key`.
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let key = bytes_arg("key", key)?;
        Ok(self.inner.get(&key).map(|v| PyBytes::new(py, &v)))
    }

    /// A service-wide outage (every link's requests fail) or its end.
    #[pyo3(signature = (down=true))]
    fn outage(&self, down: bool) {
        self.inner.outage(down);
    }
}

/// One client's link to an embedded service: its fault switches.
#[pyclass(module = "dlock._dlock", frozen)]
struct Link {
    inner: dlock::MemoryBackend,
}

#[pymethods]
impl Link {
    /// The service this link talks to.
    #[getter]
    fn service(&self) -> MemoryService {
        MemoryService {
            inner: self.inner.service().clone(),
        }
    }

    /// Requests wait until `heal()`, then arrive late.
    fn partition(&self) {
        self.inner.partition();
    }

    /// Ends a partition.
    fn heal(&self) {
        self.inner.heal();
    }

    /// Keepalives renew the lease but their replies are lost (False: they
    /// arrive again).
    #[pyo3(signature = (on=true))]
    fn drop_keepalive_replies(&self, on: bool) {
        self.inner.drop_keepalive_replies(on);
    }

    /// Replies arrive `seconds` late (0: on time).
    fn delay_keepalive_replies(&self, py: Python<'_>, seconds: f64) -> PyResult<()> {
        let d = self::seconds(py, "delay", "invalid_argument", seconds)?;
        self.inner.delay_keepalive_replies(d);
        Ok(())
    }

    /// Keepalives fail at once with `message` (None: they work again).
    #[pyo3(signature = (message="injected failure"))]
    fn fail_keepalives(&self, message: Option<&str>) {
        self.inner.fail_keepalives(message);
    }

    /// The service drops this link's leases: its locks fence at once.
    fn declare_lease_lost(&self) {
        self.inner.declare_lease_lost();
    }
}

/// Accepts a write only if its token is >= the highest seen for its name.
#[pyclass(module = "dlock._dlock", frozen)]
struct FenceGate {
    inner: dlock::FenceGate,
}

#[pymethods]
impl FenceGate {
    #[new]
    fn new() -> FenceGate {
        FenceGate {
            inner: dlock::FenceGate::new(),
        }
    }

    /// Admits `token` for `name` (remembering it) or raises `Stale`.
    fn admit(&self, py: Python<'_>, name: String, token: u64) -> PyResult<()> {
        self.inner.admit(&name, dlock::Token(token)).map_err(|s| {
            let e = error(py, "stale", s.to_string());
            let _ = e.value(py).setattr("token", s.token.get());
            let _ = e.value(py).setattr("highest", s.highest.get());
            e
        })
    }

    /// The highest token seen for `name`, or None.
    fn highest(&self, name: String) -> Option<u64> {
        self.inner.highest(&name).map(|t| t.get())
    }
}

/// Blocks dlock's driver thread for `seconds` (as a starved process would),
/// without blocking the caller.
#[pyfunction]
fn stall_driver(py: Python<'_>, seconds: f64) -> PyResult<()> {
    let d = self::seconds(py, "seconds", "invalid_argument", seconds)?;
    not_forked(py)?;
    dlock::memory::stall_driver(d);
    Ok(())
}

/// Whether this process is a child of `fork()` of a process that used
/// dlock (every handle then raises `Forked`).
#[pyfunction]
fn forked() -> bool {
    dlock::forked()
}

/// Every code word of the core's table, in C order.
#[pyfunction]
fn codes() -> Vec<&'static str> {
    dlock::Code::ALL.iter().map(|c| c.as_str()).collect()
}

/// Every state name, in order.
#[pyfunction]
fn states() -> Vec<&'static str> {
    dlock::State::ALL.iter().map(|s| s.as_str()).collect()
}

/// Seconds on dlock's clock (`CLOCK_BOOTTIME` on Linux).
#[pyfunction]
fn now() -> f64 {
    dlock::Clock::system().now().as_nanos() as f64 / 1e9
}

#[pymodule]
fn _dlock(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("MAX_NAME_LEN", dlock::MAX_NAME_LEN)?;
    m.add_class::<Client>()?;
    m.add_class::<Session>()?;
    m.add_class::<SessionStats>()?;
    m.add_class::<Lock>()?;
    m.add_class::<LockStats>()?;
    m.add_class::<Permit>()?;
    m.add_class::<Event>()?;
    m.add_class::<EventStream>()?;
    m.add_class::<MemoryService>()?;
    m.add_class::<Link>()?;
    m.add_class::<FenceGate>()?;
    m.add_function(wrap_pyfunction!(stall_driver, m)?)?;
    m.add_function(wrap_pyfunction!(forked, m)?)?;
    m.add_function(wrap_pyfunction!(codes, m)?)?;
    m.add_function(wrap_pyfunction!(states, m)?)?;
    m.add_function(wrap_pyfunction!(now, m)?)?;
    Ok(())
}
