//! Settings of a holder, with the rules of docs/design.md §14.

use std::time::Duration;

use crate::Error;

/// The longest TTL a lock service grants: etcd's maximum lease TTL
/// (9,000,000,000 s). A longer one is refused up front, on every backend.
pub const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

/// How a holder keeps its session alive and when it gives up.
///
/// Every field has the default of the design brief; [`Options::validate`]
/// (called by [`crate::Client::new`]) rejects a combination that could not
/// keep the local deadline ahead of the server's expiry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Lease TTL asked of the server. Default 15 s; ≥ 2 s and
    /// > `keepalive_interval + margin`.
    pub ttl: Duration,
    /// Time between keepalives while holding. Default 5 s; > 0.
    pub keepalive_interval: Duration,
    /// How long a keepalive (or lease grant) may take before it counts as
    /// failed. Default 2 s; > 0 and < `keepalive_interval`.
    pub keepalive_timeout: Duration,
    /// Time between keepalive retries while draining. Default 1 s; > 0.
    pub retry_interval: Duration,
    /// Subtracted from every deadline. Default 1 s; < `ttl`.
    pub margin: Duration,
    /// Acquire again (new lease, higher token) after a fence. Default true.
    pub reacquire: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ttl: Duration::from_secs(15),
            keepalive_interval: Duration::from_secs(5),
            keepalive_timeout: Duration::from_secs(2),
            retry_interval: Duration::from_secs(1),
            margin: Duration::from_secs(1),
            reacquire: true,
        }
    }
}

impl Options {
    /// Checks the rules of docs/design.md §14; the error names the setting,
    /// the rule and the value.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |setting: &'static str, rule: String| Err(Error::InvalidOption { setting, rule });
        if self.keepalive_interval.is_zero() {
            return bad("keepalive_interval", "must be > 0".into());
        }
        if self.keepalive_timeout.is_zero() || self.keepalive_timeout >= self.keepalive_interval {
            return bad(
                "keepalive_timeout",
                format!(
                    "must be > 0 and < keepalive_interval ({:?}), got {:?}",
                    self.keepalive_interval, self.keepalive_timeout
                ),
            );
        }
        if self.retry_interval.is_zero() {
            return bad("retry_interval", "must be > 0".into());
        }
        if self.ttl < Duration::from_secs(2)
            || self.ttl <= self.keepalive_interval.saturating_add(self.margin)
        {
            return bad(
                "ttl",
                format!(
                    "must be >= 2s and > keepalive_interval + margin ({:?}), got {:?}",
                    self.keepalive_interval.saturating_add(self.margin),
                    self.ttl
                ),
            );
        }
        if self.ttl > MAX_TTL {
            return bad(
                "ttl",
                format!(
                    "must be at most {} s (etcd's largest lease), got {:?}",
                    MAX_TTL.as_secs(),
                    self.ttl
                ),
            );
        }
        // `margin < ttl` follows from the ttl rule above.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setting_of(o: Options) -> &'static str {
        match o.validate() {
            Err(Error::InvalidOption { setting, .. }) => setting,
            other => panic!("expected an invalid option, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_valid() {
        Options::default().validate().unwrap();
    }

    #[test]
    fn each_rule_names_its_setting() {
        let ms = Duration::from_millis;
        let d = Options::default;
        assert_eq!(
            setting_of(Options {
                ttl: ms(1999),
                keepalive_interval: ms(500),
                keepalive_timeout: ms(100),
                margin: ms(100),
                ..d()
            }),
            "ttl"
        );
        assert_eq!(
            setting_of(Options {
                ttl: ms(6000),
                ..d()
            }),
            "ttl"
        );
        assert_eq!(
            setting_of(Options {
                keepalive_interval: ms(0),
                ..d()
            }),
            "keepalive_interval"
        );
        assert_eq!(
            setting_of(Options {
                keepalive_timeout: ms(0),
                ..d()
            }),
            "keepalive_timeout"
        );
        assert_eq!(
            setting_of(Options {
                keepalive_timeout: ms(5000),
                ..d()
            }),
            "keepalive_timeout"
        );
        assert_eq!(
            setting_of(Options {
                retry_interval: ms(0),
                ..d()
            }),
            "retry_interval"
        );
        assert_eq!(
            setting_of(Options {
                ttl: MAX_TTL + ms(1000),
                ..d()
            }),
            "ttl"
        );
        Options {
            ttl: MAX_TTL,
            ..d()
        }
        .validate()
        .unwrap();
        let msg = Options {
            ttl: ms(6000),
            ..d()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("ttl") && msg.contains("keepalive_interval + margin"),
            "{msg}"
        );
    }
}
