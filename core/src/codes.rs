//! The one code table (docs/design.md §18): every status word an error, a
//! refusal or a gate answers with, in one place. The C face's `lk_status`,
//! Python's exception `.code` and Node's error `.code` are these words; the
//! C numbers are [`Code::value`].

use std::ffi::CStr;
use std::fmt;

use crate::machine::{Reason, Refused, State};

macro_rules! codes {
    ($( $(#[$doc:meta])* $name:ident = $value:literal, $word:literal; )*) => {
        /// A status word of dlock's one vocabulary, with its C number.
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        #[repr(i32)]
        pub enum Code {
            $( $(#[$doc])* $name = $value, )*
        }

        impl Code {
            /// Every code, in C order (`Code::ALL[i].value() == i`).
            pub const ALL: &'static [Code] = &[$(Code::$name),*];

            /// The snake_case word (`"fenced"`, `"would_block"`, …).
            pub const fn as_str(self) -> &'static str {
                match self { $(Code::$name => $word,)* }
            }

            /// The word as a static C string, for the C face.
            pub const fn as_cstr(self) -> &'static CStr {
                match self {
                    $(Code::$name => match CStr::from_bytes_with_nul(concat!($word, "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("a code word holds no NUL"),
                    },)*
                }
            }
        }
    };
}

codes! {
    /// Success (C only: other faces return normally).
    Ok = 0, "ok";
    /// `permit()`: a keepalive failed; no new work until one is confirmed.
    Draining = 1, "draining";
    /// `permit()`: the deadline passed or the lease was lost. Guarded
    /// writes: the token no longer holds the lock.
    Fenced = 2, "fenced";
    /// The lock was released (or closed).
    Released = 3, "released";
    /// The lock is not held (not acquired yet).
    NotHeld = 4, "not_held";
    /// The wait for one's turn ran out.
    Timeout = 5, "timeout";
    /// `try_acquire`: another holder has the lock.
    WouldBlock = 6, "would_block";
    /// This handle holds the lock, or an acquire of it is in progress.
    AlreadyHeld = 7, "already_held";
    /// A setting breaks a rule of docs/design.md §14.
    InvalidOption = 8, "invalid_option";
    /// An argument is not acceptable.
    InvalidArgument = 9, "invalid_argument";
    /// C only: a required pointer was NULL.
    NullParameter = 10, "null_parameter";
    /// The lock service failed or could not be reached.
    Backend = 11, "backend";
    /// The driver thread is gone (the process is shutting down).
    Shutdown = 12, "shutdown";
    /// Called in a child of `fork()`: the handles belong to the parent.
    Forked = 13, "forked";
    /// `FenceGate`: a higher token was already seen.
    Stale = 14, "stale";
    /// A bug in dlock: a panic was caught at a face's boundary.
    Panic = 15, "panic";
}

/// The word table of an enum of the machine ([`State`], [`Reason`]): its
/// C order (`ALL`, `index`) and its words (`as_str`, `as_cstr`), written
/// once here. The enums themselves live in `machine/types.rs`: the table
/// reads the machine, never the other way round.
macro_rules! words {
    ($ty:ident { $( $name:ident = $word:literal, )* }) => {
        impl $ty {
            /// Every value, in C order (`ALL[i].index() == i`).
            pub const ALL: [$ty; [$(stringify!($name)),*].len()] = [$($ty::$name),*];

            /// The index in `ALL` (the C number).
            pub fn index(self) -> usize {
                $ty::ALL
                    .iter()
                    .position(|v| *v == self)
                    .expect("every value is in ALL")
            }

            /// The name used in traces and every binding.
            pub const fn as_str(self) -> &'static str {
                match self { $($ty::$name => $word,)* }
            }

            /// The name as a static C string, for the C face.
            pub const fn as_cstr(self) -> &'static CStr {
                match self {
                    $($ty::$name => match CStr::from_bytes_with_nul(concat!($word, "\0").as_bytes()) {
                        Ok(c) => c,
                        Err(_) => panic!("a word holds no NUL"),
                    },)*
                }
            }
        }
    };
}

words!(State {
    Idle = "Idle",
    Acquiring = "Acquiring",
    Holding = "Holding",
    Draining = "Draining",
    Fenced = "Fenced",
    Reacquiring = "Reacquiring",
    Released = "Released",
});

impl State {
    /// The state stored as `index() as u8` (an unknown value reads `Idle`).
    pub(crate) const fn from_u8(v: u8) -> State {
        if (v as usize) < State::ALL.len() {
            State::ALL[v as usize]
        } else {
            State::Idle
        }
    }
}

words!(Reason {
    Acquire = "acquire",
    Acquired = "acquired",
    KeepaliveTimeout = "keepalive_timeout",
    KeepaliveFailed = "keepalive_failed",
    Resumed = "resumed",
    Deadline = "deadline",
    LeaseLost = "lease_lost",
    Reacquire = "reacquire",
    Reacquired = "reacquired",
    Release = "release",
    AcquireTimeout = "acquire_timeout",
    WouldBlock = "would_block",
    AcquireFailed = "acquire_failed",
    LockLost = "lock_lost",
});

impl Refused {
    /// The refusal's entry in the code table.
    pub const fn status(self) -> Code {
        match self {
            Refused::Draining => Code::Draining,
            Refused::Fenced => Code::Fenced,
            Refused::Released => Code::Released,
            Refused::NotHeld => Code::NotHeld,
        }
    }

    /// The snake_case name shared by every binding: its code's word.
    pub const fn as_str(self) -> &'static str {
        self.status().as_str()
    }
}

impl Code {
    /// The C number of the code.
    pub const fn value(self) -> i32 {
        self as i32
    }

    /// The code with C number `v`.
    pub fn from_value(v: i32) -> Option<Code> {
        usize::try_from(v)
            .ok()
            .and_then(|i| Code::ALL.get(i))
            .copied()
    }

    /// The code called `word`.
    pub fn from_word(word: &str) -> Option<Code> {
        Code::ALL.iter().copied().find(|c| c.as_str() == word)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, Refused, Stale};

    #[test]
    fn values_are_indices_and_words_are_unique() {
        for (i, c) in Code::ALL.iter().enumerate() {
            assert_eq!(c.value() as usize, i);
            assert_eq!(Code::from_value(c.value()), Some(*c));
            assert_eq!(Code::from_word(c.as_str()), Some(*c));
            assert_eq!(c.as_cstr().to_str().unwrap(), c.as_str());
        }
        assert_eq!(Code::from_value(-1), None);
        assert_eq!(Code::from_value(Code::ALL.len() as i32), None);
    }

    #[test]
    fn every_error_refusal_and_gate_word_is_in_the_table() {
        let errors = [
            Error::InvalidOption {
                setting: "ttl",
                rule: String::new(),
            },
            Error::InvalidArgument(String::new()),
            Error::Timeout,
            Error::WouldBlock,
            Error::AlreadyHeld,
            Error::Released,
            Error::Fenced(1),
            Error::Backend(String::new()),
            Error::Shutdown,
            Error::Forked,
        ];
        for e in errors {
            assert_eq!(Code::from_word(e.code()), Some(e.status()), "{e}");
        }
        for r in [
            Refused::Draining,
            Refused::Fenced,
            Refused::Released,
            Refused::NotHeld,
        ] {
            assert_eq!(Code::from_word(r.as_str()), Some(r.status()));
        }
        let stale = Stale {
            token: crate::Token(1),
            highest: crate::Token(2),
        };
        assert_eq!(stale.status(), Code::Stale);
        assert_eq!(Code::Stale.as_str(), "stale");
    }

    #[test]
    fn state_and_reason_words_follow_c_order_and_are_unique() {
        for (i, s) in State::ALL.iter().enumerate() {
            assert_eq!((s.index(), *s as usize), (i, i));
            assert_eq!(State::from_u8(i as u8), *s);
            assert_eq!(s.as_cstr().to_str().unwrap(), s.as_str());
        }
        assert_eq!(State::from_u8(200), State::Idle);
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
            assert_eq!(r.as_cstr().to_str().unwrap(), r.as_str());
        }
        let words: std::collections::HashSet<_> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(words.len(), Reason::ALL.len());
        assert_eq!(Reason::LockLost.as_str(), "lock_lost");
        assert_eq!(Reason::LockLost.index(), 13);
        assert_eq!(State::Holding.as_str(), "Holding");
    }
}
