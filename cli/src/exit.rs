//! The exit codes of `dlock` (docs/cli.md), and the one-line failure.

/// Bad usage: an unknown flag, no `--`, no command (clap's code).
pub const USAGE: i32 = 2;
/// `--try`: another holder has the lock (`would_block`).
pub const WOULD_BLOCK: i32 = 120;
/// `--timeout` ran out while waiting (`timeout`).
pub const TIMEOUT: i32 = 121;
/// The lock service failed or could not be reached (`backend`).
pub const BACKEND: i32 = 122;
/// A setting or the name was refused (`invalid_option`,
/// `invalid_argument`), or `--grace` does not fit inside `--margin`.
pub const INVALID: i32 = 123;
/// The run ended because the lock was fenced (and not restarted).
pub const FENCED: i32 = 124;
/// Any other failure of dlock itself.
pub const OTHER: i32 = 125;
/// The command exists but cannot be executed.
pub const CANNOT_EXEC: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;
/// `dlock show`: the lock is not held.
pub const NOT_HELD: i32 = 1;

/// A failure of dlock itself: printed as `dlock: MESSAGE`, one line.
#[derive(Debug)]
pub struct Fail {
    pub code: i32,
    pub message: String,
}

impl Fail {
    pub fn new(code: i32, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }
}

impl From<dlock::Error> for Fail {
    /// The core's error with its code word first (`timeout: …`).
    fn from(e: dlock::Error) -> Fail {
        use dlock::Code;
        let code = match e.status() {
            Code::WouldBlock => WOULD_BLOCK,
            Code::Timeout => TIMEOUT,
            Code::Backend => BACKEND,
            Code::InvalidOption | Code::InvalidArgument => INVALID,
            Code::Fenced => FENCED,
            _ => OTHER,
        };
        Fail::new(code, format!("{}: {}", e.code(), one_line(&e.to_string())))
    }
}

/// `s` on one line.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}
