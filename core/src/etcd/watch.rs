//! The key watch of one lease ([`KeyWatch`]): one task and one Watch
//! stream per lease, one watcher (a map entry here, a watch id on the
//! stream) per key, however many keys (etcd's `client/v3/watch.go`).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    EventType, Txn, TxnOp, TxnOpResponse, WatchOptions, WatchRequestSender, WatchResponse,
    WatchResponseStream,
};
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::{Instant as TokioInstant, timeout};

use super::conn::{ABANDONED, EtcdBackend, classify};
use crate::backend::{BackendError, Bounds, BoxFuture, KeyGone, KeyWatch, LockGone};
use crate::lock_key;
use crate::machine::{LeaseId, Token};
use crate::sync::lock;

/// Keys read back per transaction when their watchers were canceled
/// (etcd's `--max-txn-ops` defaults to 128).
const CHECK_BATCH: usize = 64;

/// Watch requests sent in one go (the stream's request queue holds 100).
const SEND_BATCH: usize = 64;

/// A key is watched once it has been held this long: most short holds are
/// released before, and so cost no watcher (a create and a cancel on the
/// stream, and the server's work for them). Nothing is missed: a watcher
/// starts from the revision after the acquisition, so it replays a delete
/// that came meanwhile, at most this much later.
pub(super) const WATCH_AFTER: Duration = Duration::from_millis(20);

impl EtcdBackend {
    /// Spawns a key watch of `lease` (see [`crate::Backend::watch_keys`]).
    pub(super) fn spawn_key_watch(
        &self,
        lease: LeaseId,
        bounds: Bounds,
        gone: UnboundedSender<KeyGone>,
    ) -> Box<dyn KeyWatch> {
        let keys = Arc::new(Keys {
            state: Mutex::new(KeysState::default()),
            wake: tokio::sync::Notify::new(),
        });
        let task = KeysTask {
            backend: self.clone(),
            lease,
            bounds,
            keys: keys.clone(),
            gone,
            endpoint: 0,
            abandoned: None,
            opening: None,
            replies: None,
            sender: None,
            sending: None,
            reopen_at: None,
            checking: None,
            check_at: None,
            create_at: None,
            asking: None,
            lease_lost: false,
            refusals: 0,
        };
        tokio::spawn(task.run());
        Box::new(EtcdKeyWatch { keys, lease })
    }

    /// Reads the keys back: whether each still exists with its token as
    /// create revision, and the revision read at.
    pub(super) async fn check_keys(
        &self,
        keys: &[(Token, String)],
    ) -> Result<(i64, Vec<bool>), BackendError> {
        #[cfg(test)]
        self.0.read_back.fetch_add(keys.len(), Ordering::Relaxed);
        let resp = self
            .unary(self.0.request_timeout, |mut c| {
                let gets: Vec<TxnOp> = keys
                    .iter()
                    .map(|(_, k)| TxnOp::get(k.as_str(), None))
                    .collect();
                let txn = Txn::new().and_then(gets);
                async move { c.txn(txn).await }
            })
            .await?;
        let ops = resp.op_responses();
        let (Some(header), true) = (resp.header(), ops.len() == keys.len()) else {
            return Err(BackendError::Unavailable(
                "unexpected read-back transaction reply".into(),
            ));
        };
        let alive = ops
            .iter()
            .zip(keys)
            .map(|(op, (token, _))| {
                matches!(op, TxnOpResponse::Get(g)
                    if g.kvs().first().is_some_and(|kv| kv.create_revision() == token.0 as i64))
            })
            .collect();
        Ok((header.revision(), alive))
    }

    /// Opens the Watch stream of a [`KeyWatch`] on endpoint `i`, with the
    /// watcher of its first key; with `fresh_token`, authenticates again
    /// first (a stream keeps the token it opened with).
    async fn open_keys(
        &self,
        i: usize,
        key: String,
        options: WatchOptions,
        fresh_token: bool,
    ) -> Result<(WatchRequestSender, WatchResponseStream), BackendError> {
        let mut conn = timeout(
            self.0.connect_timeout + self.0.request_timeout,
            self.conn(i),
        )
        .await
        .map_err(|_| BackendError::Unavailable("connect timed out".into()))??;
        if fresh_token {
            // Without credentials, this only drops a token there is none of.
            timeout(self.0.request_timeout, conn.refresh_token())
                .await
                .map_err(|_| BackendError::Unavailable("authentication timed out".into()))?
                .map_err(classify)?;
        }
        let stream = timeout(self.0.request_timeout, conn.watch(key, Some(options)))
            .await
            .map_err(|_| BackendError::Unavailable("watch did not open in time".into()))?
            .map_err(classify)?;
        Ok(stream.split())
    }
}

/// The key watches of one lease ([`Backend::watch_keys`]): the keys live in
/// [`Keys`], one [`KeysTask`] keeps one Watch stream for all of them.
/// Dropping it ends the task, which closes the stream.
struct EtcdKeyWatch {
    keys: Arc<Keys>,
    lease: LeaseId,
}

/// What a [`KeyWatch`] shares with its task.
struct Keys {
    state: Mutex<KeysState>,
    /// Wakes the task: a key added or removed, or the watch dropped.
    wake: tokio::sync::Notify,
}

/// The bookkeeping of one [`KeyWatch`]: one map entry per key, plus the
/// work queued for the task.
#[derive(Default)]
struct KeysState {
    keys: HashMap<Token, KeyEntry>,
    /// The watchers on the current stream: watch id → token.
    by_watch: HashMap<i64, Token>,
    /// Keys waiting for a watcher on the current stream. May hold tokens
    /// removed or no longer waiting since: skipped.
    queued: VecDeque<Token>,
    /// Keys added, with when they join `queued` ([`WATCH_AFTER`]).
    fresh: VecDeque<(Token, TokioInstant)>,
    /// Watchers to cancel on the current stream.
    cancels: Vec<i64>,
    /// Keys to read back: their watcher was canceled (history compacted).
    checks: VecDeque<Token>,
    /// Keys seen gone, not yet reported: waiting for a lease lookup.
    doomed: Vec<Token>,
    /// The last watch id handed out: ids are chosen here (etcd ≥ 3.4) and
    /// never reused, so no reply of an old watcher is taken for a new one.
    last_id: i64,
    closed: bool,
}

struct KeyEntry {
    /// `<name>/<lease hex>`.
    key: String,
    /// The next revision to watch from: every revision before it is known
    /// to leave the key alive.
    from: i64,
    phase: Phase,
}

/// What a reply on a [`KeyWatch`]'s stream means for the stream.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// A watcher of ours created.
    Created,
    /// A create refused, the key unknown: the stream opens again.
    Refused(String),
    Other,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a watcher on the current stream (in `queued`).
    Queued,
    /// Watched by this watch id on the current stream.
    Watching(i64),
    /// Being read back (in `checks` or a read in flight).
    Checking,
    /// Seen gone; reported once the lease lookup answers.
    Gone,
}

impl KeysState {
    /// Takes the next key waiting for a watcher and gives it a watch id:
    /// the key and the create request's options.
    fn next_create(&mut self) -> Option<(String, WatchOptions)> {
        while let Some(token) = self.queued.pop_front() {
            let Some(e) = self.keys.get_mut(&token) else {
                continue;
            };
            if e.phase != Phase::Queued {
                continue;
            }
            self.last_id += 1;
            let id = self.last_id;
            e.phase = Phase::Watching(id);
            self.by_watch.insert(id, token);
            let options = WatchOptions::new()
                .with_start_revision(e.from)
                .with_watch_id(id)
                // Periodic progress (etcd: every 10 min, synced watchers
                // only) moves `from` on, so a re-open after a fail-over
                // replays little history.
                .with_progress_notify();
            return Some((e.key.clone(), options));
        }
        None
    }

    /// The stream is gone: every watched key waits for a watcher on the
    /// next one, from its own `from`.
    fn reset(&mut self) {
        self.by_watch.clear();
        self.cancels.clear();
        self.queued.clear();
        for (token, e) in &mut self.keys {
            if matches!(e.phase, Phase::Queued | Phase::Watching(_)) {
                e.phase = Phase::Queued;
                self.queued.push_back(*token);
            }
        }
    }

    /// One reply on the stream.
    fn on_reply(&mut self, r: &WatchResponse) -> Reply {
        if r.created() && r.canceled() {
            // A create refused. etcd says which only by the id -1 (an auth
            // token expired since the stream opened, or permission
            // denied): the stream must open again, with a fresh token.
            return Reply::Refused(r.cancel_reason().to_owned());
        }
        let id = r.watch_id();
        // Not ours (any more): removed, or already gone.
        let Some(&token) = self.by_watch.get(&id) else {
            return Reply::Other;
        };
        let Some(e) = self.keys.get_mut(&token) else {
            self.by_watch.remove(&id);
            return Reply::Other;
        };
        if r.created() {
            return Reply::Created;
        }
        if r.canceled() {
            // History compacted past `from` (or another reason of the
            // server's): the key itself tells whether it still stands.
            tracing::debug!(key = %e.key, reason = r.cancel_reason(), compacted = r.compact_revision(), "etcd key watcher canceled: reading the key back");
            self.by_watch.remove(&id);
            // Frees the watcher on the server.
            self.cancels.push(id);
            e.phase = Phase::Checking;
            self.checks.push_back(token);
            return Reply::Other;
        }
        let mut deleted = false;
        for ev in r.events() {
            if ev.event_type() == EventType::Delete {
                deleted = true;
                break;
            }
            if let Some(kv) = ev.kv() {
                e.from = e.from.max(kv.mod_revision() + 1);
            }
        }
        if deleted {
            self.by_watch.remove(&id);
            self.cancels.push(id);
            e.phase = Phase::Gone;
            self.doomed.push(token);
        } else if r.events().is_empty() {
            // A progress notification: the watcher is synced up to it.
            if let Some(h) = r.header() {
                e.from = e.from.max(h.revision() + 1);
            }
        }
        Reply::Other
    }

    /// Reports the keys of `tokens` still gone (not removed meanwhile).
    fn report(&mut self, tokens: &[Token], why: LockGone, gone: &UnboundedSender<KeyGone>) {
        for token in tokens {
            if self.keys.get(token).is_some_and(|e| e.phase == Phase::Gone) {
                self.keys.remove(token);
                let _ = gone.send(KeyGone { token: *token, why });
            }
        }
    }
}

impl KeyWatch for EtcdKeyWatch {
    fn add(&self, name: &str, token: Token) {
        let mut s = lock(&self.keys.state);
        if s.closed || s.keys.contains_key(&token) {
            return;
        }
        s.keys.insert(
            token,
            KeyEntry {
                key: lock_key(name, self.lease),
                from: token.0 as i64 + 1,
                phase: Phase::Queued,
            },
        );
        s.fresh
            .push_back((token, TokioInstant::now() + WATCH_AFTER));
        // Tokens removed while waiting stay queued until popped; keep them
        // from piling up while no stream takes them.
        if s.queued.len() + s.fresh.len() > 2 * s.keys.len() + 64 {
            let KeysState {
                keys,
                queued,
                fresh,
                ..
            } = &mut *s;
            queued.retain(|t| keys.get(t).is_some_and(|e| e.phase == Phase::Queued));
            fresh.retain(|(t, _)| keys.get(t).is_some_and(|e| e.phase == Phase::Queued));
        }
        drop(s);
        self.keys.wake.notify_one();
    }

    fn remove(&self, token: Token) {
        let mut s = lock(&self.keys.state);
        if let Some(e) = s.keys.remove(&token) {
            if let Phase::Watching(id) = e.phase {
                s.by_watch.remove(&id);
                s.cancels.push(id);
                drop(s);
                self.keys.wake.notify_one();
            }
        }
    }
}

impl Drop for EtcdKeyWatch {
    fn drop(&mut self) {
        lock(&self.keys.state).closed = true;
        self.keys.wake.notify_one();
    }
}

type Job<T> = Option<(Vec<Token>, BoxFuture<'static, T>)>;

/// The task of one [`KeyWatch`]: owns its Watch stream, sends the
/// watchers' create and cancel requests on it (a batch at a time), reads
/// its replies, and runs the reads the replies call for (a lease lookup for
/// the keys gone, a read-back of the keys whose watchers were canceled),
/// one of each at a time, while it goes on reading the stream.
struct KeysTask {
    backend: EtcdBackend,
    lease: LeaseId,
    /// The session's: lookups bounded by its keepalive timeout, streams
    /// opened again after its retry interval.
    bounds: Bounds,
    keys: Arc<Keys>,
    gone: UnboundedSender<KeyGone>,
    /// The endpoint of the stream open or opening.
    endpoint: usize,
    /// Ends the stream when another call abandons its endpoint.
    abandoned: Option<tokio::sync::watch::Receiver<u64>>,
    opening:
        Option<BoxFuture<'static, Result<(WatchRequestSender, WatchResponseStream), BackendError>>>,
    replies: Option<WatchResponseStream>,
    /// The stream's request side, while no request is being sent.
    sender: Option<WatchRequestSender>,
    /// The requests being sent; gives the sender back.
    sending: Option<BoxFuture<'static, (WatchRequestSender, Result<(), etcd_client::Error>)>>,
    /// No stream opens before (after a failure of the stream's own).
    reopen_at: Option<TokioInstant>,
    checking: Job<Result<(i64, Vec<bool>), BackendError>>,
    /// No read-back starts before (after one failed).
    check_at: Option<TokioInstant>,
    /// When the oldest fresh key is due for a watcher.
    create_at: Option<TokioInstant>,
    asking: Job<LockGone>,
    /// The lease is known gone: every key gone since went with it.
    lease_lost: bool,
    /// Streams that had a create refused since a create last succeeded:
    /// the next stream authenticates again first, and after a second
    /// refusal in a row opens only after a pause.
    refusals: u32,
}

/// A request on a [`KeyWatch`]'s stream.
enum Request {
    Cancel(i64),
    Create(String, WatchOptions),
}

enum Wake {
    Poked,
    Opened(Result<(WatchRequestSender, WatchResponseStream), BackendError>),
    Reply(Result<WatchResponse, BackendError>),
    Sent(WatchRequestSender, Result<(), etcd_client::Error>),
    Checked(Result<(i64, Vec<bool>), BackendError>),
    Answered(LockGone),
}

/// Awaits the future in `slot`, or forever if there is none.
async fn slot<F: Future + Unpin>(slot: &mut Option<F>) -> F::Output {
    match slot {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn job<T>(job: &mut Job<T>) -> T {
    match job {
        Some((_, f)) => f.await,
        None => std::future::pending().await,
    }
}

async fn next_reply(
    replies: &mut Option<WatchResponseStream>,
) -> Result<WatchResponse, BackendError> {
    match replies {
        Some(r) => r
            .message()
            .await
            .map_err(classify)?
            .ok_or_else(|| BackendError::Unavailable("watch stream closed".into())),
        None => std::future::pending().await,
    }
}

async fn abandoned(rx: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    if let Some(rx) = rx {
        if rx.changed().await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

async fn until(at: Option<TokioInstant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl KeysTask {
    async fn run(mut self) {
        while self.step() {
            let wake = self.wait().await;
            self.handle(wake);
        }
    }

    /// Starts whatever can start; false once the watch is dropped (or no
    /// one listens any more).
    fn step(&mut self) -> bool {
        let now = TokioInstant::now();
        if self.reopen_at.is_some_and(|t| t <= now) {
            self.reopen_at = None;
        }
        if self.check_at.is_some_and(|t| t <= now) {
            self.check_at = None;
        }
        let mut s = lock(&self.keys.state);
        if s.closed || self.gone.is_closed() {
            return false;
        }
        // Keys held for WATCH_AFTER now wait for a watcher.
        while let Some(&(token, at)) = s.fresh.front() {
            if at > now {
                break;
            }
            s.fresh.pop_front();
            s.queued.push_back(token);
        }
        self.create_at = s.fresh.front().map(|(_, at)| *at);
        // A stream opens with the first key to watch (etcd's create
        // request opens it).
        if self.replies.is_none() && self.opening.is_none() && self.reopen_at.is_none() {
            if let Some((key, options)) = s.next_create() {
                #[cfg(test)]
                self.backend.0.creates.fetch_add(1, Ordering::Relaxed);
                let i = self.backend.current();
                self.endpoint = i;
                // Subscribed first: an abandonment while opening counts.
                self.abandoned = Some(self.backend.0.abandoned[i].subscribe());
                let b = self.backend.clone();
                let fresh_token = self.refusals > 0;
                self.opening = Some(Box::pin(async move {
                    b.open_keys(i, key, options, fresh_token).await
                }));
            }
        }
        // One batch of requests on the stream at a time, cancels first. A
        // request taken is sent unless the stream goes (and then all
        // starts over).
        if self.sending.is_none() {
            if let Some(mut tx) = self.sender.take() {
                let mut batch = Vec::new();
                while batch.len() < SEND_BATCH {
                    match s.cancels.pop() {
                        Some(id) => batch.push(Request::Cancel(id)),
                        None => match s.next_create() {
                            Some((key, options)) => {
                                #[cfg(test)]
                                self.backend.0.creates.fetch_add(1, Ordering::Relaxed);
                                batch.push(Request::Create(key, options))
                            }
                            None => break,
                        },
                    }
                }
                if batch.is_empty() {
                    self.sender = Some(tx);
                } else {
                    self.sending = Some(Box::pin(async move {
                        for request in batch {
                            let r = match request {
                                Request::Cancel(id) => tx.cancel(id).await,
                                Request::Create(key, options) => tx.watch(key, Some(options)).await,
                            };
                            if r.is_err() {
                                return (tx, r);
                            }
                        }
                        (tx, Ok(()))
                    }));
                }
            }
        }
        if self.checking.is_none() && self.check_at.is_none() {
            let mut batch = Vec::new();
            while batch.len() < CHECK_BATCH {
                let Some(token) = s.checks.pop_front() else {
                    break;
                };
                if let Some(e) = s.keys.get(&token) {
                    if e.phase == Phase::Checking {
                        batch.push((token, e.key.clone()));
                    }
                }
            }
            if !batch.is_empty() {
                let tokens = batch.iter().map(|(t, _)| *t).collect();
                let b = self.backend.clone();
                self.checking = Some((tokens, Box::pin(async move { b.check_keys(&batch).await })));
            }
        }
        if !s.doomed.is_empty() {
            if self.lease_lost {
                let doomed = std::mem::take(&mut s.doomed);
                s.report(&doomed, LockGone::LeaseLost, &self.gone);
            } else if self.asking.is_none() {
                // One lookup for every key seen gone so far.
                let batch = std::mem::take(&mut s.doomed);
                let b = self.backend.clone();
                let (lease, timeout) = (self.lease, self.bounds.timeout);
                self.asking = Some((
                    batch,
                    Box::pin(async move { b.why_gone(lease, timeout).await }),
                ));
            }
        }
        true
    }

    async fn wait(&mut self) -> Wake {
        let timer = self
            .reopen_at
            .into_iter()
            .chain(self.check_at)
            .chain(self.create_at)
            .min();
        tokio::select! {
            _ = self.keys.wake.notified() => Wake::Poked,
            _ = until(timer) => Wake::Poked,
            _ = abandoned(&mut self.abandoned) => {
                Wake::Reply(Err(BackendError::Unavailable(ABANDONED.into())))
            }
            r = slot(&mut self.opening) => Wake::Opened(r),
            r = next_reply(&mut self.replies) => Wake::Reply(r),
            (tx, r) = slot(&mut self.sending) => Wake::Sent(tx, r),
            r = job(&mut self.checking) => Wake::Checked(r),
            why = job(&mut self.asking) => Wake::Answered(why),
        }
    }

    fn handle(&mut self, wake: Wake) {
        match wake {
            Wake::Poked => {}
            Wake::Opened(Ok((tx, replies))) => {
                self.opening = None;
                self.sender = Some(tx);
                self.replies = Some(replies);
            }
            Wake::Opened(Err(e)) | Wake::Reply(Err(e)) => self.lost(e),
            Wake::Reply(Ok(r)) => {
                let reply = lock(&self.keys.state).on_reply(&r);
                match reply {
                    Reply::Created => self.refusals = 0,
                    Reply::Refused(why) => self.refused(&why),
                    Reply::Other => {}
                }
            }
            Wake::Sent(tx, Ok(())) => {
                self.sending = None;
                self.sender = Some(tx);
            }
            Wake::Sent(_, Err(e)) => self.lost(BackendError::Unavailable(e.to_string())),
            Wake::Checked(r) => {
                let Some((tokens, _)) = self.checking.take() else {
                    return;
                };
                let mut s = lock(&self.keys.state);
                match r {
                    Ok((revision, alive)) => {
                        for (token, alive) in tokens.into_iter().zip(alive) {
                            let Some(e) = s.keys.get_mut(&token) else {
                                continue;
                            };
                            if e.phase != Phase::Checking {
                                continue;
                            }
                            if alive {
                                // Alive at `revision`: watch what follows.
                                e.from = revision + 1;
                                e.phase = Phase::Queued;
                                s.queued.push_back(token);
                            } else {
                                e.phase = Phase::Gone;
                                s.doomed.push(token);
                            }
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "etcd: reading watched keys back failed; retrying");
                        for token in tokens.into_iter().rev() {
                            s.checks.push_front(token);
                        }
                        self.check_at = Some(TokioInstant::now() + self.bounds.retry);
                    }
                }
            }
            Wake::Answered(why) => {
                let Some((tokens, _)) = self.asking.take() else {
                    return;
                };
                if why == LockGone::LeaseLost {
                    // For good: a lease never comes back.
                    self.lease_lost = true;
                }
                lock(&self.keys.state).report(&tokens, why, &self.gone);
            }
        }
    }

    /// The stream failed, closed or was abandoned: every watcher re-opens
    /// together on the next stream, each from its own next revision.
    fn lost(&mut self, e: BackendError) {
        let i = self.endpoint;
        tracing::debug!(endpoint = %self.backend.0.urls[i], error = %e, "etcd key watch failed: re-opening its watchers");
        self.close();
        if self.backend.watch_failed(i, &e) {
            self.reopen_at = Some(TokioInstant::now() + self.bounds.retry);
        }
    }

    /// A create was refused: the stream's auth token expired (its token is
    /// the one it opened with), or permission is denied. Every watcher
    /// re-opens on a new stream (on the current endpoint), with a fresh
    /// token.
    fn refused(&mut self, why: &str) {
        tracing::debug!(endpoint = %self.backend.0.urls[self.endpoint], reason = why, "etcd key watch: a watcher was refused; re-opening with a fresh token");
        self.close();
        self.refusals += 1;
        if self.refusals > 1 {
            tracing::warn!(endpoint = %self.backend.0.urls[self.endpoint], reason = why, "etcd refuses to watch a lock key; retrying");
            self.reopen_at = Some(TokioInstant::now() + self.bounds.retry);
        }
    }

    /// Drops the stream; every key waits for the next one.
    fn close(&mut self) {
        self.opening = None;
        self.replies = None;
        self.sender = None;
        self.sending = None;
        self.abandoned = None;
        lock(&self.keys.state).reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_state_hands_out_fresh_watch_ids_and_requeues_on_reset() {
        let mut s = KeysState::default();
        for t in [10, 20, 30] {
            s.keys.insert(
                Token(t),
                KeyEntry {
                    key: format!("k{t}/1"),
                    from: t as i64 + 1,
                    phase: Phase::Queued,
                },
            );
            s.queued.push_back(Token(t));
        }
        // A token removed while queued is skipped.
        s.keys.remove(&Token(20));
        let (k1, _) = s.next_create().unwrap();
        let (k2, _) = s.next_create().unwrap();
        assert_eq!((k1.as_str(), k2.as_str()), ("k10/1", "k30/1"));
        assert!(s.next_create().is_none());
        assert_eq!(s.keys[&Token(10)].phase, Phase::Watching(1));
        assert_eq!(s.keys[&Token(30)].phase, Phase::Watching(2));
        // The stream goes: both wait for the next one, with new ids there.
        s.cancels.push(7);
        s.reset();
        assert!(s.by_watch.is_empty() && s.cancels.is_empty());
        let mut ids = vec![];
        while s.next_create().is_some() {}
        for t in [10, 30] {
            let Phase::Watching(id) = s.keys[&Token(t)].phase else {
                panic!("{t} not watched again");
            };
            ids.push(id);
        }
        ids.sort();
        assert_eq!(ids, [3, 4]);
        // Gone keys are reported once, and not once removed.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for t in [10, 30] {
            s.keys.get_mut(&Token(t)).unwrap().phase = Phase::Gone;
        }
        s.keys.remove(&Token(30));
        s.report(&[Token(10), Token(30)], LockGone::KeyDeleted, &tx);
        s.report(&[Token(10)], LockGone::KeyDeleted, &tx);
        assert_eq!(
            rx.try_recv(),
            Ok(KeyGone {
                token: Token(10),
                why: LockGone::KeyDeleted
            })
        );
        assert!(rx.try_recv().is_err());
    }
}
