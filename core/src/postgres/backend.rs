//! [`PostgresBackend`]: the [`Backend`] trait on the parts of this module.
//! Three connections: one for keepalives alone (a keepalive never queues
//! behind another statement, nor behind an earlier keepalive still
//! unanswered: it goes on a new connection), one for every other statement (so they run
//! in the order sent), and the listener's (to `dlock_listen` when the URL
//! names one: the server itself behind a pooler in transaction mode).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::PostgresConfig;
use super::conn::{Connector, Slot, listen_config};
use super::watch::Listener;
use super::{election, guarded, lease, mutex, schema, semaphore};
use crate::Error;
use crate::backend::{Backend, BackendError, Bounds, BoxFuture, Grant, KeyGone, KeyWatch, Leader};
use crate::identity::{Identity, LockHolder};
use crate::machine::{LeaseId, Token};

/// A PostgreSQL server as a lock service.
#[derive(Clone)]
pub(crate) struct PostgresBackend(Arc<Shared>);

struct Shared {
    ops: Arc<Slot>,
    keepalives: Slot,
    listener: Listener,
    timeout: Duration,
}

impl PostgresBackend {
    /// Opens every connection and checks the server and the schema: a
    /// clear error before anything is held.
    pub async fn connect(config: PostgresConfig) -> Result<PostgresBackend, Error> {
        let connector = Arc::new(Connector::new(&config)?);
        let listen = match listen_config(&config)? {
            Some(l) => Arc::new(Connector::new(&l)?),
            None => connector.clone(),
        };
        let first = connector.open(None).await?;
        schema::ensure(&first, &connector.target).await?;
        connector.check_timeline(&first).await?;
        connector
            .schema_ready
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let ops = Arc::new(Slot::new(connector.clone(), false));
        ops.set(first);
        let keepalives = Slot::new(connector.clone(), true);
        keepalives.set(connector.open(None).await?);
        let timeout = config.request_timeout;
        listen
            .schema_ready
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let listener = Listener::start(listen, ops.clone(), timeout).await?;
        Ok(PostgresBackend(Arc::new(Shared {
            ops,
            keepalives,
            listener,
            timeout,
        })))
    }

    /// A mutex's lock or, with `value`, a candidate's campaign: one
    /// protocol ([`mutex::lock`]).
    fn mutex_lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        value: Option<&'a [u8]>,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        let s = &self.0;
        let wake = s.listener.wake();
        Box::pin(mutex::lock(
            &s.ops, wake, name, lease, value, wait, s.timeout,
        ))
    }
}

impl Backend for PostgresBackend {
    /// On the statements' connection, so bounded by the request timeout
    /// as they are: a statement that runs out of time closes its
    /// connection, which the session's shorter bound must not do to every
    /// statement queued on it. The machine counts the grant failed after
    /// `bounds.timeout` all the same.
    fn grant<'a>(
        &'a self,
        ttl: Duration,
        _bounds: Bounds,
        identity: Option<&'a Identity>,
    ) -> BoxFuture<'a, Result<Grant, BackendError>> {
        Box::pin(lease::grant(&self.0.ops, ttl, identity, self.0.timeout))
    }

    fn holder<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<LockHolder>, BackendError>> {
        Box::pin(lease::holder(&self.0.ops, name, self.0.timeout))
    }

    /// Bounded by the session's keepalive timeout (a new connection
    /// included), not by the request timeout: the machine counts it failed
    /// then.
    fn keepalive(
        &self,
        lease: LeaseId,
        bounds: Bounds,
    ) -> BoxFuture<'_, Result<Duration, BackendError>> {
        Box::pin(lease::keepalive(&self.0.keepalives, lease, bounds.timeout))
    }

    fn lock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        self.mutex_lock(name, lease, None, wait)
    }

    fn lock_rw<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        mode: crate::mode::Mode,
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        let s = &self.0;
        Box::pin(super::rwlock::lock_rw(
            &s.ops,
            s.listener.wake(),
            name,
            lease,
            mode,
            wait,
            s.timeout,
        ))
    }

    fn campaign<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        value: &'a [u8],
        wait: bool,
    ) -> BoxFuture<'a, Result<Token, BackendError>> {
        self.mutex_lock(name, lease, Some(value), wait)
    }

    fn put_if_absent<'a>(
        &'a self,
        key: &'a [u8],
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<Vec<u8>, BackendError>> {
        Box::pin(guarded::put_if_absent(
            &self.0.ops,
            key,
            value,
            self.0.timeout,
        ))
    }

    fn proclaim<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        value: &'a [u8],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(election::proclaim(
            &self.0.ops,
            name,
            lease,
            token,
            value,
            self.0.timeout,
        ))
    }

    fn free_slot<'a>(
        &'a self,
        name: &'a str,
        limit: u32,
        wait: bool,
    ) -> BoxFuture<'a, Result<Option<u32>, BackendError>> {
        let s = &self.0;
        Box::pin(semaphore::free_slot(
            &s.ops,
            s.listener.wake(),
            name,
            limit,
            wait,
            s.timeout,
        ))
    }

    fn next_leader<'a>(
        &'a self,
        name: &'a str,
        last: Option<&'a Option<Leader>>,
    ) -> BoxFuture<'a, Result<Option<Leader>, BackendError>> {
        let s = &self.0;
        Box::pin(election::next_leader(
            &s.ops,
            s.listener.wake(),
            name,
            last,
            s.timeout,
        ))
    }

    fn revoke(&self, lease: LeaseId) -> BoxFuture<'_, Result<(), BackendError>> {
        Box::pin(lease::revoke(&self.0.ops, lease, self.0.timeout))
    }

    fn unlock<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Option<Token>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(mutex::unlock(
            &self.0.ops,
            name,
            lease,
            token,
            self.0.timeout,
        ))
    }

    /// The listener's: one LISTEN for every session, so it runs on the
    /// backend's own timeouts, not a session's `bounds`.
    fn watch_keys(
        &self,
        lease: LeaseId,
        _bounds: Bounds,
        gone: UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch> {
        self.0.listener.watch(lease, gone)
    }

    fn guarded_write<'a>(
        &'a self,
        name: &'a str,
        lease: LeaseId,
        token: Token,
        key: &'a [u8],
        value: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        Box::pin(guarded::write(
            &self.0.ops,
            name,
            lease,
            token,
            key,
            value,
            self.0.timeout,
        ))
    }
}
