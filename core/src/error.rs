//! The one error vocabulary, shared by every binding.

/// Why a dlock call failed. [`Error::code`] gives the stable name that the C,
/// Python and Node faces use too.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting breaks a rule of DESIGN.md section 6.
    #[error("invalid option `{setting}`: {rule}")]
    InvalidOption {
        /// The setting's name.
        setting: &'static str,
        /// The rule it breaks, with its value.
        rule: String,
    },
    /// An argument is not acceptable (an empty lock name, say).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The lock was not acquired within the timeout.
    #[error("timed out waiting for the lock")]
    Timeout,
    /// `try_acquire`: another holder has the lock.
    #[error("the lock is held by another holder")]
    WouldBlock,
    /// This handle already holds the lock.
    #[error("this handle already holds the lock")]
    AlreadyHeld,
    /// The lock was released while the call waited.
    #[error("the lock was released")]
    Released,
    /// A guarded write was refused: the token is no longer the lock's.
    #[error("fenced: token {0} no longer holds the lock")]
    Fenced(u64),
    /// The lock service failed or could not be reached.
    #[error("backend error: {0}")]
    Backend(String),
    /// The driver thread is gone (the process is shutting down).
    #[error("the dlock driver has stopped")]
    Shutdown,
    /// Called in a child of `fork()`: only the parent holds its locks.
    #[error("called in a forked child process; dlock handles belong to the parent")]
    Forked,
}

impl Error {
    /// Stable snake_case name of the error kind.
    pub const fn code(&self) -> &'static str {
        match self {
            Error::InvalidOption { .. } => "invalid_option",
            Error::InvalidArgument(_) => "invalid_argument",
            Error::Timeout => "timeout",
            Error::WouldBlock => "would_block",
            Error::AlreadyHeld => "already_held",
            Error::Released => "released",
            Error::Fenced(_) => "fenced",
            Error::Backend(_) => "backend",
            Error::Shutdown => "shutdown",
            Error::Forked => "forked",
        }
    }
}
