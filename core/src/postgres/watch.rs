//! LISTEN/NOTIFY on a dedicated connection: wakes waiting acquisitions
//! when a lock row goes, and tells a session's key watch when one of its
//! rows is deleted or changed (an operator, or its lease went). Notifications
//! are lost while disconnected, so after every (re)connect the watched rows
//! are read again.
//!
//! At connect a probe notification, sent on the statement connection, must
//! reach the listener: a pooler in transaction mode (PgBouncer) hands the
//! LISTEN's server connection to other clients, so notifications never
//! come; that is refused with an error naming `dlock_listen`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};
use tokio_postgres::types::Type;

use super::conn::{Connector, Slot};
use crate::Error;
use crate::backend::{KeyGone, KeyWatch, LockGone};
use crate::machine::{LeaseId, Token};
use crate::sync::lock;

/// How many recent deletions are remembered for a watch added after its
/// key's notification arrived.
const RECENT: usize = 4096;
/// Pause before reconnecting the listener.
const RECONNECT: Duration = Duration::from_millis(250);

/// The listener of one backend.
pub(crate) struct Listener {
    inner: Arc<Inner>,
    /// Dropping it stops the listener's task.
    _stop: tokio::sync::oneshot::Sender<()>,
}

struct Inner {
    state: Mutex<State>,
    /// Woken on every notification and reconnect: waiting acquisitions
    /// look again.
    wake: Notify,
    live: AtomicBool,
    timeout: Duration,
}

#[derive(Default)]
struct State {
    next_id: u64,
    watches: HashMap<u64, Reg>,
    /// Watched token -> watch id.
    by_token: HashMap<u64, u64>,
    /// Tokens whose rows went lately, with why.
    recent: VecDeque<(u64, LockGone)>,
    /// Between a disconnect and a completed re-read.
    syncing: bool,
    /// A watch was added while syncing: read again.
    dirty: bool,
}

struct Reg {
    lease: LeaseId,
    gone: UnboundedSender<KeyGone>,
}

impl State {
    /// Reports the row of `token` gone, once, to its watch.
    fn report(&mut self, token: u64, why: LockGone) {
        if let Some(id) = self.by_token.remove(&token) {
            if let Some(w) = self.watches.get(&id) {
                let _ = w.gone.send(KeyGone {
                    token: Token(token),
                    why,
                });
            }
        }
    }
}

impl Listener {
    /// Opens the listening connection (an error here is the connect's) and
    /// starts the task that keeps it.
    pub async fn start(
        connector: Arc<Connector>,
        ops: Arc<Slot>,
        timeout: Duration,
    ) -> Result<Listener, Error> {
        let inner = Arc::new(Inner {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            live: AtomicBool::new(false),
            timeout,
        });
        let (tx, mut rx) = unbounded_channel();
        let conn = connector.open(Some(tx)).await?;
        let exec = |what: &'static str, sql: String| {
            let (client, target) = (&conn.client, &connector.target);
            async move {
                match tokio::time::timeout(timeout, client.batch_execute(&sql)).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(Error::Backend(format!(
                        "PostgreSQL at {target}: {what}: {}",
                        super::conn::describe(&e)
                    ))),
                    Err(_) => Err(Error::Backend(format!(
                        "PostgreSQL at {target}: {what}: no reply within {} ms",
                        timeout.as_millis()
                    ))),
                }
            }
        };
        let probe = probe_channel();
        exec("LISTEN", format!("LISTEN dlock; LISTEN {probe}")).await?;
        // The probe goes through the statement connection, as every
        // NOTIFY of the lock rows does. Not waiting for the standby: its
        // commit carries no lock state.
        let sent = ops
            .run(timeout, |c| {
                let sql =
                    format!("BEGIN; SET LOCAL synchronous_commit = local; NOTIFY {probe}; COMMIT");
                async move { c.client.batch_execute(&sql).await }
            })
            .await;
        if let Err(e) = sent {
            return Err(Error::Backend(format!(
                "PostgreSQL at {}: NOTIFY: {e}",
                connector.target
            )));
        }
        let heard = tokio::time::timeout(timeout, async {
            while let Some(n) = rx.recv().await {
                if n.channel() == probe {
                    return true;
                }
            }
            false
        })
        .await;
        if heard != Ok(true) {
            return Err(Error::Backend(format!(
                "PostgreSQL at {}: the LISTEN connection received no notification within {} ms \
                 (a connection pooler in transaction mode, such as PgBouncer, cannot carry \
                 LISTEN): give the server's own address for the listener with \
                 dlock_listen=HOST:PORT in the URL (every other statement may stay on the pooler); \
                 if the URL has one, it must name the server the statements reach",
                connector.target,
                timeout.as_millis()
            )));
        }
        exec("UNLISTEN", format!("UNLISTEN {probe}")).await?;
        inner.live.store(true, Ordering::SeqCst);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        tokio::spawn(run(inner.clone(), connector, ops, conn, rx, stopped));
        Ok(Listener { inner, _stop: stop })
    }

    /// Waiting acquisitions enable this before each look.
    pub fn wake(&self) -> &Notify {
        &self.inner.wake
    }

    /// A new key watch of `lease`.
    pub fn watch(&self, lease: LeaseId, gone: UnboundedSender<KeyGone>) -> Box<dyn KeyWatch> {
        let mut st = lock(&self.inner.state);
        st.next_id += 1;
        let id = st.next_id;
        st.watches.insert(id, Reg { lease, gone });
        Box::new(PgKeyWatch {
            inner: self.inner.clone(),
            id,
        })
    }
}

/// A channel name of this listener only.
fn probe_channel() -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = crate::clock::system_now().as_nanos();
    format!("dlock_probe_{}_{n}_{t}", std::process::id())
}

async fn run(
    inner: Arc<Inner>,
    connector: Arc<Connector>,
    ops: Arc<Slot>,
    mut conn: super::conn::Conn,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    loop {
        // Connected and listening: read what was lost, then follow.
        resync(&inner, &ops).await;
        inner.wake.notify_waiters();
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                n = rx.recv() => match n {
                    Some(n) => on_notification(&inner, n.payload()),
                    None => break,
                },
            }
        }
        drop(conn);
        inner.live.store(false, Ordering::SeqCst);
        lock(&inner.state).syncing = true;
        loop {
            tokio::select! {
                _ = &mut stopped => return,
                _ = tokio::time::sleep(RECONNECT) => {}
            }
            let (tx, new_rx) = unbounded_channel();
            let Ok(c) = connector.open(Some(tx)).await else {
                continue;
            };
            let listen =
                tokio::time::timeout(inner.timeout, c.client.batch_execute("LISTEN dlock"));
            if matches!(listen.await, Ok(Ok(()))) {
                conn = c;
                rx = new_rx;
                break;
            }
        }
        inner.live.store(true, Ordering::SeqCst);
    }
}

/// `<token> <D|L|V>` from the trigger on dlock.locks (V: an election's
/// value changed, the row stays: it only wakes observers).
fn on_notification(inner: &Inner, payload: &str) {
    let mut it = payload.split(' ');
    let token = it.next().and_then(|t| t.parse::<u64>().ok());
    let why = match it.next() {
        Some("L") => Some(LockGone::LeaseLost),
        Some("V") => None,
        _ => Some(LockGone::KeyDeleted),
    };
    if let (Some(token), Some(why)) = (token, why) {
        let mut st = lock(&inner.state);
        if st.recent.len() == RECENT {
            st.recent.pop_front();
        }
        st.recent.push_back((token, why));
        st.report(token, why);
    }
    inner.wake.notify_waiters();
}

/// Reads every watched row again (notifications were lost while
/// disconnected) and reports the ones gone; again while watches were
/// added meanwhile. A failed read leaves `syncing` set: the next
/// reconnect reads again.
async fn resync(inner: &Inner, ops: &Slot) {
    loop {
        let (tokens, leases): (Vec<i64>, Vec<i64>) = {
            let mut st = lock(&inner.state);
            st.dirty = false;
            let tokens: Vec<i64> = st.by_token.keys().map(|t| *t as i64).collect();
            let leases: HashSet<i64> = st.watches.values().map(|w| w.lease).collect();
            (tokens, leases.into_iter().collect())
        };
        if !tokens.is_empty() {
            let read = ops
                .run(inner.timeout, |c| {
                    let (tokens, leases) = (tokens.clone(), leases.clone());
                    async move {
                        let held = c
                            .client
                            .query_typed(
                                "SELECT k.token FROM dlock.locks k JOIN dlock.leases l ON l.id = k.lease \
                                 WHERE k.token = ANY($1) AND l.expires_at > clock_timestamp()",
                                &[(&tokens, Type::INT8_ARRAY)],
                            )
                            .await?;
                        let alive = c
                            .client
                            .query_typed(
                                "SELECT id FROM dlock.leases WHERE id = ANY($1) AND expires_at > clock_timestamp()",
                                &[(&leases, Type::INT8_ARRAY)],
                            )
                            .await?;
                        let held = held
                            .iter()
                            .map(|r| r.try_get(0))
                            .collect::<Result<HashSet<i64>, _>>()?;
                        let alive = alive
                            .iter()
                            .map(|r| r.try_get(0))
                            .collect::<Result<HashSet<i64>, _>>()?;
                        Ok((held, alive))
                    }
                })
                .await;
            let Ok((held, alive)) = read else {
                return;
            };
            let mut st = lock(&inner.state);
            for t in tokens.iter().filter(|t| !held.contains(t)) {
                let token = *t as u64;
                let Some(lease) = st
                    .by_token
                    .get(&token)
                    .and_then(|id| st.watches.get(id))
                    .map(|w| w.lease)
                else {
                    continue;
                };
                let why = if alive.contains(&lease) {
                    LockGone::KeyDeleted
                } else {
                    LockGone::LeaseLost
                };
                st.report(token, why);
            }
        }
        let mut st = lock(&inner.state);
        if !st.dirty {
            st.syncing = false;
            return;
        }
    }
}

struct PgKeyWatch {
    inner: Arc<Inner>,
    id: u64,
}

impl KeyWatch for PgKeyWatch {
    fn add(&self, _name: &str, token: Token) {
        let mut st = lock(&self.inner.state);
        if let Some(&(_, why)) = st.recent.iter().rev().find(|(t, _)| *t == token.0) {
            if let Some(w) = st.watches.get(&self.id) {
                let _ = w.gone.send(KeyGone { token, why });
            }
            return;
        }
        st.by_token.insert(token.0, self.id);
        if st.syncing || !self.inner.live.load(Ordering::SeqCst) {
            st.dirty = true;
        }
    }

    fn remove(&self, token: Token) {
        let mut st = lock(&self.inner.state);
        if st.by_token.get(&token.0) == Some(&self.id) {
            st.by_token.remove(&token.0);
        }
    }
}

impl Drop for PgKeyWatch {
    fn drop(&mut self) {
        let mut st = lock(&self.inner.state);
        st.watches.remove(&self.id);
        let id = self.id;
        st.by_token.retain(|_, w| *w != id);
    }
}
