//! A read/write lock holder's mode and the one rule of who holds
//! (docs/design.md §27): what the engines, the driver and the gate need of
//! read/write locks, apart from the handles in [`crate::rwlock`] (which
//! need the driver: this file needs nothing).

/// The value of a reader's key. Any other value (empty, as `etcdctl lock`
/// and Go's `concurrency.Mutex` put, or a plain dlock lock's) is a writer.
pub const READ_MARKER: &[u8] = b"dlock:read";

/// A read/write lock holder's mode.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shares the name with other readers; excludes writers.
    Read,
    /// Excludes every other holder.
    Write,
}

impl Mode {
    /// `"read"` or `"write"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }

    /// The mode a key's value says: [`READ_MARKER`] is a reader, anything
    /// else a writer.
    pub fn of_value(value: &[u8]) -> Mode {
        if value == READ_MARKER {
            Mode::Read
        } else {
            Mode::Write
        }
    }

    /// The value a key of this mode is put with.
    pub const fn value(self) -> &'static [u8] {
        match self {
            Mode::Read => READ_MARKER,
            Mode::Write => b"",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Mode {
    /// Its byte in the lock's gate (`LockMetrics::mode`): the one copy,
    /// which the handle, the driver (it puts the key in that mode at each
    /// acquisition; a committed downgrade changes it) and the metrics
    /// snapshot read. 0 is a plain lock.
    pub(crate) fn byte(self) -> u8 {
        match self {
            Mode::Read => 1,
            Mode::Write => 2,
        }
    }

    /// A gate's byte back: `None` for a plain lock.
    pub(crate) fn of_byte(b: u8) -> Option<Mode> {
        match b {
            1 => Some(Mode::Read),
            2 => Some(Mode::Write),
            _ => None,
        }
    }
}

/// Whether a reader whose key has create revision `mine` holds, given the
/// other keys of the name as `(create revision, mode)`: no earlier key is a
/// writer. A writer holds when no earlier key is left at all. The one rule
/// every engine applies (the embedded one and etcd here; PostgreSQL in SQL).
pub fn holds(mine: u64, mode: Mode, keys: impl IntoIterator<Item = (u64, Mode)>) -> bool {
    keys.into_iter()
        .filter(|(rev, _)| *rev < mine)
        .all(|(_, other)| mode == Mode::Read && other == Mode::Read)
}
