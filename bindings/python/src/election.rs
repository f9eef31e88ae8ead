//! `dlock._dlock.Election` and `Leader`: a candidate in a leader election
//! (docs/elections.md). `Election` extends `Lock` with the election's own
//! lock as its handle, so the whole lock API (permit, on_fence, events,
//! stats, close) works on it as the core's `Deref` gives it. Blocking calls
//! without the GIL; async calls completed by the core (`campaign_then`,
//! `spawn_then`), as the lock's.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::acquisition::Acquisition;
use crate::client::Client;
use crate::complete::{Outcome, Pending, spawn};
use crate::convert::{bytes_arg, seconds, timeout_arg, type_name};
use crate::error::{OrRaise, not_forked};
use crate::lock::{Lock, LockHandle};
use crate::session::Session;
use crate::wait::blocking;

/// The leader of an election as the service saw it (see `dlock.Leader`).
#[pyclass(module = "dlock._dlock", frozen, eq, hash)]
#[derive(PartialEq, Eq, Hash)]
pub(crate) struct Leader {
    key: String,
    value: Vec<u8>,
    token: u64,
    lease: i64,
}

impl From<dlock::Leader> for Leader {
    fn from(l: dlock::Leader) -> Leader {
        Leader {
            key: l.key,
            value: l.value,
            token: l.token.get(),
            lease: l.lease,
        }
    }
}

#[pymethods]
impl Leader {
    /// The leader's key, `<name>/<lease hex>` (etcd's election key).
    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// The value the leader proclaims, as bytes.
    #[getter]
    fn value<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.value)
    }

    /// The leader key's create revision: the fencing token, unchanged by
    /// a proclaim.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// The lease the leader's key is held under.
    #[getter]
    fn lease(&self) -> i64 {
        self.lease
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        Ok(format!(
            "Leader(key={}, value={}, token={}, lease={:#x})",
            PyString::new(py, &self.key).repr()?.to_cow()?,
            PyBytes::new(py, &self.value).repr()?.to_cow()?,
            self.token,
            self.lease
        ))
    }
}

/// A candidate in the election `name` (see `dlock.Election`).
#[pyclass(module = "dlock._dlock", extends = Lock, subclass, frozen)]
pub(crate) struct Election {
    /// Dropped without the GIL, as `Lock`'s handle.
    inner: ManuallyDrop<Arc<dlock::Election>>,
}

impl Drop for Election {
    fn drop(&mut self) {
        // SAFETY: taken once, here.
        let inner = unsafe { ManuallyDrop::take(&mut self.inner) };
        Python::attach(|py| py.detach(move || drop(inner)));
    }
}

/// `grace` checked as `resign` checks it (`InvalidArgument` for a
/// negative, NaN or infinite one): `campaign(grace=...)` refuses a bad
/// grace before campaigning, not on leaving its block (issue 32).
#[pyfunction]
pub(crate) fn check_grace(py: Python<'_>, grace: f64) -> PyResult<f64> {
    seconds(py, "grace", grace).map(|d| d.as_secs_f64())
}

/// A candidate's value: bytes, bytearray or str (UTF-8).
fn value_arg(v: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    bytes_arg("an election value", v)
}

#[pymethods]
impl Election {
    /// A candidate in the election `name` on `owner`, a Client (its
    /// default session) or a Session; not campaigning yet.
    #[new]
    fn new(
        py: Python<'_>,
        owner: &Bound<'_, PyAny>,
        name: &Bound<'_, PyAny>,
    ) -> PyResult<PyClassInitializer<Election>> {
        let name = name.cast::<PyString>().map_err(|_| {
            PyTypeError::new_err(format!(
                "an election name must be a str, not {}",
                type_name(name)
            ))
        })?;
        let name = name.to_cow()?;
        not_forked(py)?;
        let election = if let Ok(c) = owner.cast::<Client>() {
            c.get().inner.election(&name)
        } else if let Ok(s) = owner.cast::<Session>() {
            s.get().inner.election(&name)
        } else {
            return Err(PyTypeError::new_err(
                "an election's owner must be a dlock.Client or a dlock.Session",
            ));
        };
        let election = Arc::new(election.or_raise(py)?);
        let handle: LockHandle = election.clone();
        Ok(PyClassInitializer::from(Lock {
            inner: ManuallyDrop::new(handle),
            handlers: Default::default(),
        })
        .add_subclass(Election {
            inner: ManuallyDrop::new(election),
        }))
    }

    /// Campaigns with `value`, waiting up to `timeout` seconds (None: as
    /// long as it takes; 0: one try); returns the leader's token (the
    /// package's `campaign` wraps it in a `Leadership`). Releases
    /// the GIL; Ctrl-C interrupts it and cancels the campaign.
    #[pyo3(signature = (value, timeout=None))]
    fn _campaign(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        timeout: Option<f64>,
    ) -> PyResult<u64> {
        let value = value_arg(value)?;
        let timeout = timeout_arg(py, timeout)?;
        blocking(py, || self.inner.campaign_async(&value, timeout)).map(|t| t.get())
    }

    /// Puts a new value in the leader's key (same token); `Fenced` once
    /// the leadership was lost, `NotHeld` when not leading.
    fn proclaim(&self, py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = value_arg(value)?;
        not_forked(py)?;
        let e = Arc::clone(&self.inner);
        py.detach(move || e.proclaim(&value)).or_raise(py)
    }

    /// Steps down: no permit from now on; the key is deleted once the
    /// permits in flight end, or after `grace` seconds with some still in
    /// flight. Returns once the delete had its first try.
    fn resign(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let grace = seconds(py, "grace", grace)?;
        blocking(py, || self.inner.resign_async(grace))
    }

    /// The current leader (one read), or None when nobody leads.
    fn leader(&self, py: Python<'_>) -> PyResult<Option<Leader>> {
        not_forked(py)?;
        let e = Arc::clone(&self.inner);
        let got = py.detach(move || e.leader()).or_raise(py)?;
        Ok(got.map(Leader::from))
    }

    /// Starts a campaign whose token (or error) completes `fut` on `loop`;
    /// the `Acquisition` cancels it. Bad input raises here.
    fn _campaign_start(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        timeout: Option<f64>,
        r#loop: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<Acquisition> {
        let value = value_arg(value)?;
        let timeout = timeout_arg(py, timeout)?;
        let pending = Pending::new(py, r#loop, fut)?;
        let inner = self
            .inner
            .campaign_then(&value, timeout, move |got| {
                pending.complete(Outcome::Token(got.map(|t| t.get())));
            })
            .or_raise(py)?;
        Ok(Acquisition { inner })
    }

    /// Starts a proclaim that completes `fut` on `loop`.
    fn _proclaim_start(
        &self,
        py: Python<'_>,
        value: &Bound<'_, PyAny>,
        r#loop: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<()> {
        let value = value_arg(value)?;
        let e = Arc::clone(&self.inner);
        spawn(py, r#loop, fut, async move {
            Outcome::Unit(e.proclaim_async(&value).await)
        })
    }

    /// Starts a resign that completes `fut` on `loop`.
    fn _resign_start(
        &self,
        py: Python<'_>,
        grace: f64,
        r#loop: Py<PyAny>,
        fut: Py<PyAny>,
    ) -> PyResult<()> {
        let grace = seconds(py, "grace", grace)?;
        let e = Arc::clone(&self.inner);
        spawn(py, r#loop, fut, async move {
            Outcome::Unit(e.resign_async(grace).await)
        })
    }

    fn __repr__(&self) -> String {
        format!("{:?}", **self.inner)
    }
}
