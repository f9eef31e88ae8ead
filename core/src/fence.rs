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
///
/// For read/write locks (docs/design.md §27) it keeps two watermarks per
/// name, W (the highest admitted write token) and R (the highest admitted
/// read token): a write with T is admitted iff T ≥ W and T ≥ R, a read iff
/// T ≥ W. Readers and writers draw tokens from one order, so a higher
/// reader was granted only after a writer's grant ended, and a higher
/// writer only after a reader's. A plain [`FenceGate::admit`] is a write.
#[derive(Debug, Default)]
pub struct FenceGate {
    marks: Mutex<HashMap<String, Marks>>,
}

/// The watermarks of one name.
#[derive(Copy, Clone, Debug, Default)]
struct Marks {
    write: Option<Token>,
    read: Option<Token>,
}

impl FenceGate {
    /// An empty gate.
    pub fn new() -> FenceGate {
        FenceGate::default()
    }

    /// Accepts `token` for `name` (and remembers it) or refuses it as stale.
    /// Atomic: of two concurrent writers the lower token can never pass
    /// after the higher. The same as [`FenceGate::admit_write`].
    pub fn admit(&self, name: &str, token: Token) -> Result<(), Stale> {
        self.admit_write(name, token)
    }

    /// Admits a write with `token` iff it is at least both the highest
    /// write and the highest read token admitted for `name` (and raises W),
    /// else [`Stale`] naming the higher watermark. Atomic.
    pub fn admit_write(&self, name: &str, token: Token) -> Result<(), Stale> {
        let mut all = crate::sync::lock(&self.marks);
        let marks = all.get(name).copied().unwrap_or_default();
        let highest = marks.write.max(marks.read);
        if let Some(highest) = highest.filter(|h| *h > token) {
            return Err(Stale { token, highest });
        }
        all.entry(name.to_string()).or_default().write = Some(token);
        Ok(())
    }

    /// Admits a read with `token` iff it is at least the highest write
    /// token admitted for `name` (and raises R), else [`Stale`]. Readers
    /// never refuse each other. Atomic.
    pub fn admit_read(&self, name: &str, token: Token) -> Result<(), Stale> {
        let mut all = crate::sync::lock(&self.marks);
        let marks = all.entry(name.to_string()).or_default();
        if let Some(highest) = marks.write.filter(|w| *w > token) {
            return Err(Stale { token, highest });
        }
        marks.read = marks.read.max(Some(token));
        Ok(())
    }

    /// The highest token admitted for `name`, read or write.
    pub fn highest(&self, name: &str) -> Option<Token> {
        let m = crate::sync::lock(&self.marks).get(name).copied()?;
        m.write.max(m.read)
    }

    /// The two watermarks of `name`: the highest write token and the
    /// highest read token admitted (`None`: none of that mode yet).
    pub fn watermarks(&self, name: &str) -> (Option<Token>, Option<Token>) {
        let m = crate::sync::lock(&self.marks)
            .get(name)
            .copied()
            .unwrap_or_default();
        (m.write, m.read)
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

    #[test]
    fn reads_share_and_fence_by_mode() {
        let g = FenceGate::new();
        // Readers 3 and 5 share; neither refuses the other.
        g.admit_read("r", Token(5)).unwrap();
        g.admit_read("r", Token(3)).unwrap();
        // A writer below the highest reader was granted before it: stale.
        assert_eq!(
            g.admit_write("r", Token(4)),
            Err(Stale {
                token: Token(4),
                highest: Token(5)
            })
        );
        g.admit_write("r", Token(6)).unwrap();
        // A reader below the writer was cut off before it: stale.
        assert!(g.admit_read("r", Token(5)).is_err());
        g.admit_read("r", Token(6)).unwrap(); // a downgraded writer reads
        g.admit_read("r", Token(7)).unwrap();
        assert_eq!(g.watermarks("r"), (Some(Token(6)), Some(Token(7))));
        assert_eq!(g.highest("r"), Some(Token(7)));
        assert!(g.admit("r", Token(6)).is_err(), "a plain admit is a write");
        // A refused read leaves no mark.
        assert_eq!(g.watermarks("other"), (None, None));
        assert!(g.admit_read("x", Token(1)).is_ok());
    }
}
