//! The driver's side of one lock: its gate, its callbacks, the calls that
//! wait on it (acquires and releases, answered as the machine decides),
//! its watched token and an election's value.

use std::sync::Arc;

use super::command::{Candidate, Reply, Ticket};
use crate::Error;
use crate::callbacks::Callbacks;
use crate::clock::{Clock, Instant};
use crate::gate::Gate;
use crate::machine::Token;
use crate::metrics::Shared;

/// An acquire call waiting for its outcome.
pub(super) struct Acquirer {
    pub(super) reply: Reply<Result<Token, Error>>,
    /// Set for a cancellable acquisition.
    pub(super) ticket: Option<Arc<Ticket>>,
    /// When it was asked, and where its wait is counted.
    pub(super) since: Instant,
    pub(super) clock: Clock,
    pub(super) shared: Arc<Shared>,
}

impl Acquirer {
    pub(super) fn send(self, r: Result<Token, Error>) {
        let waited = self.clock.now().saturating_since(self.since);
        self.shared.metrics.acquire_answered(&r, waited);
        if let (Some(t), Ok(token)) = (&self.ticket, &r) {
            *crate::sync::lock(&t.won) = Some(*token);
        }
        self.reply.send(r);
    }
}

/// The driver's side of one lock.
pub(super) struct Entry {
    pub(super) gate: Arc<Gate>,
    /// None until the handle's first callback or stream: no trip to the
    /// callback thread for a lock nobody listens to.
    pub(super) callbacks: Option<Arc<Callbacks>>,
    /// The calls waiting on this lock, while any does (a held lock keeps
    /// nothing here).
    pub(super) waiting: Option<Box<Waiting>>,
    /// The token whose key is watched.
    pub(super) watched: Option<Token>,
    /// An election's value: its key is put holding it.
    pub(super) candidate: Option<Candidate>,
}

/// The calls waiting on one lock.
#[derive(Default)]
pub(super) struct Waiting {
    pub(super) acquires: Vec<Acquirer>,
    pub(super) releases: Vec<Reply<()>>,
}

impl Entry {
    pub(super) fn waiting(&mut self) -> &mut Waiting {
        self.waiting.get_or_insert_with(Box::default)
    }

    /// Drops the box once nothing waits.
    pub(super) fn tidy(&mut self) {
        if self
            .waiting
            .as_ref()
            .is_some_and(|w| w.acquires.is_empty() && w.releases.is_empty())
        {
            self.waiting = None;
        }
    }

    pub(super) fn take_acquires(&mut self) -> Vec<Acquirer> {
        let taken = self
            .waiting
            .as_mut()
            .map(|w| std::mem::take(&mut w.acquires))
            .unwrap_or_default();
        self.tidy();
        taken
    }

    pub(super) fn pop_acquire(&mut self) -> Option<Acquirer> {
        let popped = self.waiting.as_mut().and_then(|w| w.acquires.pop());
        self.tidy();
        popped
    }

    /// The waiting acquire call of `ticket`, taken out of the queue.
    pub(super) fn remove_acquire(&mut self, ticket: &Arc<Ticket>) -> Option<Acquirer> {
        let w = self.waiting.as_mut()?;
        let i = w
            .acquires
            .iter()
            .position(|a| a.ticket.as_ref().is_some_and(|t| Arc::ptr_eq(t, ticket)))?;
        let taken = w.acquires.remove(i);
        self.tidy();
        Some(taken)
    }

    pub(super) fn take_releases(&mut self) -> Vec<Reply<()>> {
        let taken = self
            .waiting
            .as_mut()
            .map(|w| std::mem::take(&mut w.releases))
            .unwrap_or_default();
        self.tidy();
        taken
    }
}
