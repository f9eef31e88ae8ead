//! `dlock._dlock.Client`: a connection to a lock service (etcd,
//! PostgreSQL or an embedded service), built from keywords; the core
//! decides which from `endpoints` (`dlock::Endpoints`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::convert::seconds;
use crate::error::{OrRaise, invalid_argument, not_forked};
use crate::link::Link;
use crate::memory::MemoryService;
use crate::options::{Timing, options_dict};
use crate::session::Session;

/// The keywords of `Client(...)`, named by the error for any other.
const KEYWORDS: &[&str] = &[
    "endpoints",
    "ttl",
    "keepalive_interval",
    "keepalive_timeout",
    "retry_interval",
    "margin",
    "reacquire",
    "memory",
    "ca_file",
    "cert_file",
    "key_file",
    "user",
    "password",
    "allow_plaintext_password",
    "connect_timeout",
    "request_timeout",
    "description",
];

/// A keyword no face knows is the core's `invalid_option`, as in every
/// face (not Python's TypeError); `known` are the ones the call takes.
fn refuse_unknown(
    py: Python<'_>,
    unknown: Option<&Bound<'_, PyDict>>,
    known: &[&str],
) -> PyResult<()> {
    match unknown.and_then(|u| u.iter().next()) {
        Some((name, _)) => {
            let name: String = name.extract()?;
            Err(dlock::options::unknown_setting(&name, known)).or_raise(py)
        }
        None => Ok(()),
    }
}

/// A connection to a lock service (see `dlock.Client`).
#[pyclass(module = "dlock._dlock", subclass, frozen)]
pub(crate) struct Client {
    pub(crate) inner: dlock::Client,
}

#[pymethods]
impl Client {
    #[new]
    #[pyo3(signature = (endpoints=None, *, ttl=None, keepalive_interval=None,
        keepalive_timeout=None, retry_interval=None, margin=None, reacquire=None,
        memory=None, ca_file=None, cert_file=None, key_file=None, user=None,
        password=None, allow_plaintext_password=None, connect_timeout=None,
        request_timeout=None, description=None, **unknown))]
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
        description: Option<String>,
        unknown: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Client> {
        not_forked(py)?;
        refuse_unknown(py, unknown, KEYWORDS)?;
        let timing = Timing {
            ttl,
            keepalive_interval,
            keepalive_timeout,
            retry_interval,
            margin,
            reacquire,
        };
        let options = timing.options(py, &dlock::Options::default())?;
        let invalid = |m: &str| invalid_argument(py, m);
        let config = match (endpoints, memory) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "give endpoints (etcd) or memory (embedded), not both",
                ));
            }
            (None, memory) => {
                // Connection settings without endpoints: the core refuses
                // them (as in every face) instead of ignoring them.
                let mut c = dlock::Endpoints::default();
                c.ca_file = ca_file;
                c.cert_file = cert_file;
                c.key_file = key_file;
                c.user = user;
                c.password = password;
                c.allow_plaintext_password = allow_plaintext_password;
                c.connect_timeout = connect_timeout
                    .map(|t| seconds(py, "connect_timeout", t))
                    .transpose()?;
                c.request_timeout = request_timeout
                    .map(|t| seconds(py, "request_timeout", t))
                    .transpose()?;
                c.check_without_list().or_raise(py)?;
                match memory {
                    Some(m) => dlock::ClientConfig::embedded_in(m.inner.clone()),
                    None => dlock::ClientConfig::from_env(),
                }
            }
            (Some(e), None) => {
                let list: Vec<String> = if let Ok(s) = e.cast::<PyString>() {
                    vec![s.to_cow()?.to_string()]
                } else {
                    e.extract().map_err(|_| {
                        PyTypeError::new_err("endpoints must be a str or a sequence of str")
                    })?
                };
                let mut c = dlock::Endpoints::new(list);
                c.ca_file = ca_file;
                c.cert_file = cert_file;
                c.key_file = key_file;
                c.user = user;
                c.password = password;
                c.allow_plaintext_password = allow_plaintext_password;
                if let Some(t) = connect_timeout {
                    c.connect_timeout = Some(seconds(py, "connect_timeout", t)?);
                }
                if let Some(t) = request_timeout {
                    c.request_timeout = Some(seconds(py, "request_timeout", t)?);
                }
                let mut config = dlock::ClientConfig::from_env();
                config.backend = c.backend().or_raise(py)?;
                config
            }
        };
        let mut config = config
            .with_options(options)
            .with_face("python", env!("CARGO_PKG_VERSION"));
        if let Some(d) = description {
            config = config.with_description(d);
        }
        let inner = py.detach(|| dlock::Client::connect(config)).or_raise(py)?;
        Ok(Client { inner })
    }

    /// The timing settings of the default session, in seconds.
    fn options<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        options_dict(py, self.inner.options())
    }

    /// Ends this client's sessions at once, as `dlock.shutdown()` does for
    /// the whole process (bounded by one keepalive timeout); its handles
    /// then behave as closed. Idempotent.
    fn shutdown(&self, py: Python<'_>) {
        let c = &self.inner;
        py.detach(|| c.shutdown());
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
        Session::from(self.inner.default_session())
    }

    /// A new session (its own lease); settings default to the client's.
    #[pyo3(signature = (*, ttl=None, keepalive_interval=None, keepalive_timeout=None,
        retry_interval=None, margin=None, reacquire=None, **unknown))]
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
        unknown: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Session> {
        not_forked(py)?;
        refuse_unknown(py, unknown, &KEYWORDS[1..7])?;
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
