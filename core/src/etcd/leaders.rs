//! The keys of one election as its watch reports them, so that an
//! observer names the leader at each watch response's revision without a
//! read of its own (a read after every change cost a round trip, and made
//! observers slower than `etcdctl elect -l`, issue 31). The whole prefix
//! is kept, not the first key alone: the leader is the key with the lowest
//! create revision at that revision, never one already deleted
//! (etcd-io/etcd#18163, where Go's `Observe` follows the first key only).
//! Sans-IO: the events in, the leader out; its tests are below.

use std::collections::{BTreeMap, HashMap};

use crate::backend::Leader;
use crate::machine::{LeaseId, Token};

/// One key under the election's prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) key: String,
    pub(super) value: Vec<u8>,
    pub(super) create_revision: i64,
    pub(super) lease: LeaseId,
}

/// What a watch says of one key.
pub(super) enum Change {
    Put(Key),
    Delete(String),
}

/// The candidates' keys by create revision (the queue order).
#[derive(Default)]
pub(super) struct Leaders {
    by_rev: BTreeMap<i64, Key>,
    rev_of: HashMap<String, i64>,
}

impl Leaders {
    /// The keys a read of the whole prefix returned.
    pub(super) fn new(keys: impl IntoIterator<Item = Key>) -> Leaders {
        let mut l = Leaders::default();
        for k in keys {
            l.put(k);
        }
        l
    }

    /// Applies one event, in the watch's order.
    pub(super) fn apply(&mut self, c: Change) {
        match c {
            Change::Put(k) => self.put(k),
            Change::Delete(key) => {
                if let Some(rev) = self.rev_of.remove(&key) {
                    self.by_rev.remove(&rev);
                }
            }
        }
    }

    fn put(&mut self, k: Key) {
        // A put on a live key keeps its create revision (a proclaim); a
        // key deleted and put again comes back with a new one.
        if let Some(old) = self.rev_of.insert(k.key.clone(), k.create_revision) {
            if old != k.create_revision {
                self.by_rev.remove(&old);
            }
        }
        self.by_rev.insert(k.create_revision, k);
    }

    /// The leader: the key with the lowest create revision, if any.
    pub(super) fn leader(&self) -> Option<Leader> {
        self.by_rev.values().next().map(|k| Leader {
            key: k.key.clone(),
            value: k.value.clone(),
            token: Token(k.create_revision as u64),
            lease: k.lease,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, rev: i64, value: &str) -> Key {
        Key {
            key: name.into(),
            value: value.into(),
            create_revision: rev,
            lease: rev * 10,
        }
    }

    fn leader(l: &Leaders) -> Option<(String, u64, String)> {
        l.leader()
            .map(|l| (l.key, l.token.0, String::from_utf8(l.value).expect("utf-8")))
    }

    #[test]
    fn the_lowest_create_revision_leads_and_a_proclaim_keeps_the_token() {
        let mut l = Leaders::new([key("e/b", 7, "b"), key("e/a", 5, "a")]);
        assert_eq!(leader(&l), Some(("e/a".into(), 5, "a".into())));
        l.apply(Change::Put(key("e/a", 5, "a2")));
        assert_eq!(leader(&l), Some(("e/a".into(), 5, "a2".into())));
        // A later candidate's key changes nothing.
        l.apply(Change::Put(key("e/c", 9, "c")));
        assert_eq!(leader(&l), Some(("e/a".into(), 5, "a2".into())));
    }

    #[test]
    fn a_deleted_leader_passes_to_the_next_key_and_none_is_left_at_the_end() {
        let mut l = Leaders::new([key("e/a", 5, "a"), key("e/b", 7, "b")]);
        l.apply(Change::Delete("e/a".into()));
        assert_eq!(leader(&l), Some(("e/b".into(), 7, "b".into())));
        // A delete of a key never seen (it came and went between the read
        // and the watch's start) changes nothing.
        l.apply(Change::Delete("e/zz".into()));
        l.apply(Change::Delete("e/b".into()));
        assert_eq!(leader(&l), None);
    }

    #[test]
    fn a_key_put_again_after_its_delete_queues_at_its_new_revision() {
        let mut l = Leaders::new([key("e/a", 5, "a"), key("e/b", 7, "b")]);
        l.apply(Change::Delete("e/a".into()));
        l.apply(Change::Put(key("e/a", 11, "a")));
        assert_eq!(leader(&l), Some(("e/b".into(), 7, "b".into())));
        l.apply(Change::Delete("e/b".into()));
        assert_eq!(leader(&l), Some(("e/a".into(), 11, "a".into())));
    }
}
