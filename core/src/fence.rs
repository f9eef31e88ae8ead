//! The resource side of fencing (docs/design.md §12).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::machine::Token;

/// A write carried a token lower than one the resource has already seen: its
/// writer lost the lock.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stale token {token}: token {highest} was already seen")]
pub struct Stale {
    /// The token refused.
    pub token: Token,
    /// The highest token seen for that lock name.
    pub highest: Token,
}

impl Stale {
    /// The refusal's entry in the code table (`stale`).
    pub const fn status(&self) -> crate::Code {
        crate::Code::Stale
    }
}

/// A checker a resource server embeds: a write is accepted only if its token
/// is at least the highest seen for its lock name. A holder paused past its
/// deadline (GC, SIGSTOP) wakes with a lower token and is refused here.
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: Mutex<HashMap<String, Token>>,
}

impl FenceGate {
    /// An empty gate.
    pub fn new() -> FenceGate {
        FenceGate::default()
    }

    /// Accepts `token` for `name` (and remembers it) or refuses it as stale.
    /// Atomic: of two concurrent writers the lower token can never pass
    /// after the higher.
    pub fn admit(&self, name: &str, token: Token) -> Result<(), Stale> {
        let mut all = crate::sync::lock(&self.highest);
        match all.get_mut(name) {
            Some(highest) if *highest > token => Err(Stale {
                token,
                highest: *highest,
            }),
            Some(highest) => {
                *highest = token;
                Ok(())
            }
            None => {
                all.insert(name.to_string(), token);
                Ok(())
            }
        }
    }

    /// The highest token seen for `name`.
    pub fn highest(&self, name: &str) -> Option<Token> {
        crate::sync::lock(&self.highest).get(name).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_lower_tokens_per_name() {
        let g = FenceGate::new();
        assert!(g.admit("jobs", Token(5)).is_ok());
        assert!(g.admit("jobs", Token(5)).is_ok());
        assert_eq!(
            g.admit("jobs", Token(4)),
            Err(Stale {
                token: Token(4),
                highest: Token(5)
            })
        );
        assert!(g.admit("other", Token(1)).is_ok());
        assert!(g.admit("jobs", Token(7)).is_ok());
        assert_eq!(g.highest("jobs"), Some(Token(7)));
    }
}
