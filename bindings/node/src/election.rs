//! Elections (docs/elections.md): `NativeElection` converts campaign,
//! proclaim, resign and leader to the core's `dlock::Election`. Its lock
//! API is a [`NativeLock`] on the same core handle (`lock()`), so permits,
//! events, stats and close are the lock's, unchanged. Bad input, timing and
//! cancellation are the core's: a campaign is `Election::campaign_then`,
//! cancelled through the core's `Acquisition` as the lock's acquire is.

// napi-derive registers nothing in a test build (clippy --all-targets checks one).
#![cfg_attr(test, allow(dead_code))]

use std::ops::Deref;
use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi_derive::napi;

use crate::{NativeAcquisition, NativeLock, NativeSession, Outcome, complete, invalid, ms, thrown};

/// What a [`NativeLock`] works on: a lock of its own, or an election's
/// (`dlock::Election` derefs to its lock).
#[derive(Clone)]
pub(crate) enum LockRef {
    Lock(Arc<dlock::Lock>),
    Election(Arc<dlock::Election>),
}

impl Deref for LockRef {
    type Target = dlock::Lock;
    fn deref(&self) -> &dlock::Lock {
        match self {
            LockRef::Lock(l) => l,
            LockRef::Election(e) => e.lock(),
        }
    }
}

/// The leader as the service sees it (`dlock::Leader`).
#[napi(object)]
pub struct NativeLeader {
    /// `<name>/<lease hex>`.
    pub key: String,
    pub value: Buffer,
    /// The key's create revision: the leader's fencing token.
    pub token: BigInt,
    pub lease: BigInt,
}

pub(crate) fn leader_record(l: dlock::Leader) -> NativeLeader {
    NativeLeader {
        key: l.key,
        value: Buffer::from(l.value),
        token: BigInt::from(l.token.get()),
        lease: BigInt::from(l.lease),
    }
}

/// The result of `leader()`: `code` is `"ok"` (then `leader` is the
/// leader, or absent when nobody leads) or the core's code word.
#[napi(object)]
pub struct LeaderOutcome {
    pub code: String,
    pub message: String,
    pub leader: Option<NativeLeader>,
}

/// A candidate in one election (`session.election(name)`).
#[napi]
pub struct NativeElection {
    inner: Arc<dlock::Election>,
}

#[napi]
impl NativeElection {
    /// A candidate handle in the election `name` on `session`, not
    /// campaigning yet (the lock's name rules).
    #[napi(factory)]
    pub fn of_session(session: &NativeSession, name: String) -> Result<NativeElection> {
        let inner = session.inner.election(&name).map_err(thrown)?;
        Ok(NativeElection {
            inner: Arc::new(inner),
        })
    }

    /// The election's lock API, on the same core handle. Each call is a
    /// new handle (its own event id and permit slots): call it once.
    #[napi]
    pub fn lock(&self) -> NativeLock {
        NativeLock::of(LockRef::Election(self.inner.clone()))
    }

    /// Campaigns with `value`, waiting up to `timeout` ms (`null`: as long
    /// as it takes): the core's `campaign_then`. `handle` (when given)
    /// gets the acquisition, whose `cancel()` leaves nothing held. Bad
    /// input and a closed session are thrown before anything starts.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn campaign<'e>(
        &self,
        env: &'e Env,
        value: Buffer,
        timeout: Option<f64>,
        handle: Option<&NativeAcquisition>,
    ) -> Result<Object<'e>> {
        let timeout = timeout.map(|t| ms("timeout", t)).transpose()?;
        if handle.is_some_and(|h| h.inner.get().is_some()) {
            return Err(invalid("this acquisition handle is in use"));
        }
        let (deferred, promise) = env.create_deferred()?;
        // A refusal before anything started drops the completion: its
        // deferred is settled here instead (an unsettled one would keep
        // the process alive).
        let slot = Arc::new(std::sync::Mutex::new(Some(deferred)));
        let settle = move |outcome: Outcome| {
            if let Some(d) = slot.lock().ok().and_then(|mut d| d.take()) {
                d.resolve(move |_| Ok(outcome));
            }
        };
        let refused = settle.clone();
        match self.inner.campaign_then(&value, timeout, move |r| {
            settle(Outcome::of(r.map(|t| Some(t.get()))));
        }) {
            Ok(acquisition) => {
                if let Some(h) = handle {
                    let _ = h.inner.set(acquisition);
                }
            }
            Err(e) => refused(Outcome::of(Err(e))),
        }
        Ok(promise)
    }

    /// Puts `value` in the leader's key, guarded by its token.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn proclaim<'e>(&self, env: &'e Env, value: Buffer) -> Result<Object<'e>> {
        let election = self.inner.clone();
        let value = value.to_vec();
        complete(env, async move {
            election.proclaim_async(&value).await.map(|()| None)
        })
    }

    /// Steps down: no permit from now on; the key goes once the permits in
    /// flight end, or after `grace` ms.
    #[napi(ts_return_type = "Promise<Outcome>")]
    pub fn resign<'e>(&self, env: &'e Env, grace: f64) -> Result<Object<'e>> {
        let grace = ms("grace", grace)?;
        let election = self.inner.clone();
        complete(env, async move {
            election.resign_async(grace).await.map(|()| None)
        })
    }

    /// The current leader, read from the service.
    #[napi(ts_return_type = "Promise<LeaderOutcome>")]
    pub fn leader<'e>(&self, env: &'e Env) -> Result<Object<'e>> {
        let election = self.inner.clone();
        let (deferred, promise) = env.create_deferred()?;
        dlock::spawn_then(async move { election.leader_async().await }, move |r| {
            deferred.resolve(move |_| {
                Ok(match r {
                    Ok(l) => LeaderOutcome {
                        code: dlock::Code::Ok.as_str().into(),
                        message: String::new(),
                        leader: l.map(leader_record),
                    },
                    Err(e) => LeaderOutcome {
                        code: e.code().into(),
                        message: e.to_string(),
                        leader: None,
                    },
                })
            });
        });
        Ok(promise)
    }
}

/// The grace of a resign that names none, in ms (`dlock::election::RESIGN_GRACE`).
#[napi]
pub fn resign_grace_ms() -> u32 {
    dlock::election::RESIGN_GRACE.as_millis() as u32
}

/// The longest value a candidate may carry (`dlock::election::MAX_VALUE_LEN`).
#[napi]
pub fn max_value_len() -> u32 {
    dlock::election::MAX_VALUE_LEN as u32
}
