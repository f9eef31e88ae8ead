//! The one error vocabulary, shared by every binding (docs/design.md §18).

/// Why a dlock call failed. [`Error::code`] gives the stable name that the C,
/// Python and Node faces use too.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting breaks a rule of docs/design.md §14.
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
    /// The wait for one's turn ran out: someone else held the lock all
    /// along. (An unreachable service is [`Error::Backend`].)
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
    /// A guarded write was refused: the token is not (or no longer) the one
    /// this handle holds.
    #[error("fenced: token {0} does not hold the lock")]
    Fenced(u64),
    /// The lock service failed or could not be reached. For a guarded write
    /// the outcome is unknown: the write may have committed.
    #[error("backend error: {0}")]
    Backend(String),
    /// The driver thread is gone (the process is shutting down).
    #[error("the dlock driver has stopped")]
    Shutdown,
    /// Called in a child of `fork()`: only the parent holds its locks.
    #[error("called in a forked child process; dlock handles belong to the parent")]
    Forked,
    /// The call needs the lock held (an election's proclaim): it is not
    /// (never won, resigned or released).
    #[error("the lock is not held")]
    NotHeld,
}

impl Error {
    /// The error's entry in the code table ([`crate::Code`]).
    pub const fn status(&self) -> crate::Code {
        use crate::Code;
        match self {
            Error::InvalidOption { .. } => Code::InvalidOption,
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::Timeout => Code::Timeout,
            Error::WouldBlock => Code::WouldBlock,
            Error::AlreadyHeld => Code::AlreadyHeld,
            Error::Released => Code::Released,
            Error::Fenced(_) => Code::Fenced,
            Error::Backend(_) => Code::Backend,
            Error::Shutdown => Code::Shutdown,
            Error::Forked => Code::Forked,
            Error::NotHeld => Code::NotHeld,
        }
    }

    /// Stable snake_case name of the error kind (the code table's word).
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
            Error::NotHeld => "not_held",
        }
    }
}

/// An acquisition's failure as the application sees it; the service's text
/// says why it failed, when it said anything.
impl From<crate::machine::AcquireError> for Error {
    fn from(e: crate::machine::AcquireError) -> Error {
        use crate::machine::AcquireError;
        match e {
            AcquireError::Timeout => Error::Timeout,
            AcquireError::WouldBlock => Error::WouldBlock,
            AcquireError::AlreadyHeld => Error::AlreadyHeld,
            AcquireError::Released => Error::Released,
            AcquireError::Backend(Some(e)) => {
                Error::Backend(format!("the lock service failed: {e}"))
            }
            AcquireError::Backend(None) => {
                Error::Backend("the lock service did not answer in time".into())
            }
            AcquireError::Refused(e) => Error::InvalidArgument(format!(
                "the lock service refused the request as too large (trying again cannot succeed): {e}"
            )),
        }
    }
}
