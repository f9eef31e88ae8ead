//! Settings of a holder, with the rules of docs/design.md §14.

use std::time::Duration;

use crate::Error;

/// The longest TTL a lock service grants: etcd's maximum lease TTL
/// (9,000,000,000 s). A longer one is refused up front, on every backend.
pub const MAX_TTL: Duration = Duration::from_secs(9_000_000_000);

/// `Lock::healthy`'s allowance when a face's caller gives none (Node's
/// `healthy()`, Python's `healthy()`, C's `LK_DEFAULT_MAX_OVERDUE_MS`): no
/// time past the deadline at all.
pub const DEFAULT_MAX_OVERDUE: Duration = Duration::ZERO;

/// The one rule for a duration a face got as a number: finite, not NaN,
/// ≥ 0 and within `Duration`'s range. `unit` is the number's unit in
/// seconds (1 or 0.001); the error is the rule broken.
fn duration_of(v: f64, unit: f64, unit_name: &str) -> Result<Duration, String> {
    if v.is_nan() {
        return Err(format!("must be a number of {unit_name}, got NaN"));
    }
    if v < 0.0 {
        return Err(format!("must be >= 0 {unit_name}, got {v}"));
    }
    Duration::try_from_secs_f64(v * unit)
        .map_err(|_| format!("must be a finite number of {unit_name}, got {v}"))
}

/// A timing setting a face got in seconds (Python): negative, NaN,
/// infinite or out of range is [`Error::InvalidOption`] naming it. The
/// setting's own rules (≥ 2 s TTL, …) are [`PartialOptions::resolve`]'s.
pub fn setting_secs(setting: &'static str, secs: f64) -> Result<Duration, Error> {
    duration_of(secs, 1.0, "seconds").map_err(|rule| Error::InvalidOption { setting, rule })
}

/// [`setting_secs`] for a setting given in milliseconds (Node, C++).
pub fn setting_millis(setting: &'static str, ms: f64) -> Result<Duration, Error> {
    duration_of(ms, 1e-3, "milliseconds").map_err(|rule| Error::InvalidOption { setting, rule })
}

/// A duration argument (an acquire timeout, a grace, a connect timeout)
/// a face got in seconds: the rule of [`setting_secs`], the error
/// [`Error::InvalidArgument`] naming `what`.
pub fn argument_secs(what: &str, secs: f64) -> Result<Duration, Error> {
    duration_of(secs, 1.0, "seconds")
        .map_err(|rule| Error::InvalidArgument(format!("{what} {rule}")))
}

/// [`argument_secs`] for an argument given in milliseconds.
pub fn argument_millis(what: &str, ms: f64) -> Result<Duration, Error> {
    duration_of(ms, 1e-3, "milliseconds")
        .map_err(|rule| Error::InvalidArgument(format!("{what} {rule}")))
}

/// A setting a face does not know (a misspelt keyword, option key or
/// flag): [`Error::InvalidOption`], in every face, naming it and the
/// settings it knows (`known` may be empty).
pub fn unknown_setting(name: &str, known: &[&str]) -> Error {
    let known = if known.is_empty() {
        String::new()
    } else {
        format!(" (known: {})", known.join(", "))
    };
    Error::InvalidOption {
        setting: "unknown",
        rule: format!("`{name}` is not a setting of dlock{known}"),
    }
}

/// The one rule for a lock's or an election's name (`what`: "lock",
/// "election"), on every engine and in every face: 1 to
/// [`crate::MAX_NAME_LEN`] bytes of UTF-8 without NUL, else
/// [`Error::InvalidArgument`]. Faces whose strings may hold a NUL or
/// bytes that are not UTF-8 (C++'s `std::string`) pass the bytes.
pub fn check_name<'a>(what: &str, name: &'a [u8]) -> Result<&'a str, Error> {
    let max = crate::MAX_NAME_LEN;
    let rule = |why: String| {
        Err(Error::InvalidArgument(format!(
            "{what} name must be 1 to {max} bytes of UTF-8 without NUL: {why}"
        )))
    };
    if name.is_empty() {
        return rule("it is empty".into());
    }
    if name.len() > max {
        return rule(format!("got {} bytes", name.len()));
    }
    if let Some(at) = name.iter().position(|b| *b == 0) {
        return rule(format!("a NUL at byte {at}"));
    }
    std::str::from_utf8(name).or_else(|e| rule(format!("not UTF-8 ({e})")))
}

/// How a holder keeps its session alive and when it gives up.
///
/// Every field has the default of the design brief; [`Options::validate`]
/// (called by [`crate::Client::new`]) rejects a combination that could not
/// keep the local deadline ahead of the server's expiry. A face that lets
/// users leave settings out builds a [`PartialOptions`] instead: the rest
/// are derived from the ones given.
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

/// The settings a user gave, each `None` when left out; [`resolve`]
/// derives the rest from them by the one rule of docs/design.md §14, so a
/// face passes "unset" through instead of filling in defaults.
///
/// [`resolve`]: PartialOptions::resolve
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PartialOptions {
    /// [`Options::ttl`].
    pub ttl: Option<Duration>,
    /// [`Options::keepalive_interval`].
    pub keepalive_interval: Option<Duration>,
    /// [`Options::keepalive_timeout`].
    pub keepalive_timeout: Option<Duration>,
    /// [`Options::retry_interval`].
    pub retry_interval: Option<Duration>,
    /// [`Options::margin`].
    pub margin: Option<Duration>,
    /// [`Options::reacquire`].
    pub reacquire: Option<bool>,
}

impl PartialOptions {
    /// The settings given, the others derived from them over the defaults
    /// (see [`PartialOptions::resolve_over`]).
    pub fn resolve(&self) -> Result<Options, Error> {
        self.resolve_over(&Options::default())
    }

    /// The settings given, the others derived from them (docs/design.md
    /// §14), over `base` (the defaults, or a client's options for one of
    /// its sessions). A setting left out whose inputs are all `base`'s is
    /// `base`'s; otherwise:
    ///
    /// - `ttl`: the largest of `base.ttl` and 3 × each of
    ///   `keepalive_interval`, `margin`, `keepalive_timeout` given;
    /// - `keepalive_interval`: `ttl / 3`, at most half of what `margin`
    ///   (if given) leaves of `ttl`, and above a given `keepalive_timeout`
    ///   (halfway from it to `ttl − margin` if `ttl / 3` is not);
    /// - `margin`: `min(base.margin, (ttl − keepalive_interval) / 2)`;
    /// - `keepalive_timeout`: `min(base.keepalive_timeout, keepalive_interval × 2/5)`;
    /// - `retry_interval`: `min(base.retry_interval, keepalive_interval / 5)`.
    ///
    /// With the default 15 s TTL this gives exactly the defaults (5 s, 2 s,
    /// 1 s, 1 s). Only settings the user gave can contradict each other:
    /// the error names both.
    pub fn resolve_over(&self, base: &Options) -> Result<Options, Error> {
        let g = self;
        let bad = |setting: &'static str, rule: String| Err(Error::InvalidOption { setting, rule });
        // A setting given that breaks a rule of its own is the error, before
        // anything is derived from it.
        if let Some(t) = g
            .ttl
            .filter(|t| *t < Duration::from_secs(2) || *t > MAX_TTL)
        {
            return bad(
                "ttl",
                format!(
                    "must be >= 2s and at most {} s, got {t:?}",
                    MAX_TTL.as_secs()
                ),
            );
        }
        for (setting, v) in [
            ("keepalive_interval", g.keepalive_interval),
            ("keepalive_timeout", g.keepalive_timeout),
            ("retry_interval", g.retry_interval),
        ] {
            if v.is_some_and(|v| v.is_zero()) {
                return bad(setting, "must be > 0".into());
            }
        }
        let ttl = match g.ttl {
            Some(t) => t,
            None => [g.keepalive_interval, g.margin, g.keepalive_timeout]
                .into_iter()
                .flatten()
                .map(|d| d.saturating_mul(3).min(MAX_TTL))
                .fold(base.ttl, Duration::max),
        };
        let keepalive_interval = match g.keepalive_interval {
            Some(i) => i,
            None if ttl == base.ttl && g.margin.is_none() && g.keepalive_timeout.is_none() => {
                base.keepalive_interval
            }
            None => {
                let margin = g.margin.unwrap_or_default();
                if g.margin.is_some() && margin >= ttl {
                    return bad("margin", format!("must be < ttl ({ttl:?}), got {margin:?}"));
                }
                let room = ttl - margin;
                let mut i = (ttl / 3).min(room / 2);
                if let Some(t) = g.keepalive_timeout.filter(|t| *t >= i) {
                    if t >= room {
                        return bad(
                            "keepalive_timeout",
                            format!("must be < ttl - margin ({room:?}), got {t:?}"),
                        );
                    }
                    i = t + (room - t) / 2;
                }
                i
            }
        };
        let margin = match g.margin {
            Some(m) => m,
            None if ttl == base.ttl && keepalive_interval == base.keepalive_interval => base.margin,
            None => {
                if keepalive_interval >= ttl {
                    return bad(
                        "keepalive_interval",
                        format!("must be < ttl ({ttl:?}), got {keepalive_interval:?}"),
                    );
                }
                base.margin.min((ttl - keepalive_interval) / 2)
            }
        };
        let same_interval = keepalive_interval == base.keepalive_interval;
        let keepalive_timeout = match g.keepalive_timeout {
            Some(t) => t,
            None if same_interval => base.keepalive_timeout,
            None => base
                .keepalive_timeout
                .min(keepalive_interval.saturating_mul(2) / 5),
        };
        let retry_interval = match g.retry_interval {
            Some(r) => r,
            None if same_interval => base.retry_interval,
            None => base.retry_interval.min(keepalive_interval / 5),
        };
        let o = Options {
            ttl,
            keepalive_interval,
            keepalive_timeout,
            retry_interval,
            margin,
            reacquire: g.reacquire.unwrap_or(base.reacquire),
        };
        o.validate()?;
        Ok(o)
    }
}

impl From<Options> for PartialOptions {
    /// Every setting given.
    fn from(o: Options) -> PartialOptions {
        PartialOptions {
            ttl: Some(o.ttl),
            keepalive_interval: Some(o.keepalive_interval),
            keepalive_timeout: Some(o.keepalive_timeout),
            retry_interval: Some(o.retry_interval),
            margin: Some(o.margin),
            reacquire: Some(o.reacquire),
        }
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

    fn given(fields: &[(&str, u64)]) -> PartialOptions {
        let mut p = PartialOptions::default();
        for (name, ms) in fields {
            let d = Some(Duration::from_millis(*ms));
            match *name {
                "ttl" => p.ttl = d,
                "keepalive_interval" => p.keepalive_interval = d,
                "keepalive_timeout" => p.keepalive_timeout = d,
                "retry_interval" => p.retry_interval = d,
                "margin" => p.margin = d,
                _ => unreachable!("{name}"),
            }
        }
        p
    }

    #[test]
    fn nothing_given_or_the_defaults_given_is_the_defaults() {
        let d = Options::default();
        assert_eq!(PartialOptions::default().resolve().unwrap(), d);
        assert_eq!(PartialOptions::from(d.clone()).resolve().unwrap(), d);
        // The rule itself gives the defaults from the default TTL.
        assert_eq!(given(&[("ttl", 15_000)]).resolve().unwrap(), d);
        assert_eq!(
            given(&[("keepalive_interval", 5_000)]).resolve().unwrap(),
            d
        );
    }

    #[test]
    fn left_out_settings_follow_the_given_ones() {
        let ms = Duration::from_millis;
        // The case: `dlock run --ttl 6s --keepalive-interval 2s`.
        let o = given(&[("ttl", 6_000), ("keepalive_interval", 2_000)])
            .resolve()
            .unwrap();
        assert_eq!(
            (
                o.ttl,
                o.keepalive_interval,
                o.keepalive_timeout,
                o.retry_interval,
                o.margin
            ),
            (ms(6000), ms(2000), ms(800), ms(400), ms(1000))
        );
        // Only a TTL: the interval a third of it, the rest from the interval.
        let o = given(&[("ttl", 3_000)]).resolve().unwrap();
        assert_eq!(
            (
                o.keepalive_interval,
                o.keepalive_timeout,
                o.retry_interval,
                o.margin
            ),
            (ms(1000), ms(400), ms(200), ms(1000))
        );
        let o = given(&[("ttl", 60_000)]).resolve().unwrap();
        assert_eq!(
            (
                o.keepalive_interval,
                o.keepalive_timeout,
                o.retry_interval,
                o.margin
            ),
            (ms(20_000), ms(2000), ms(1000), ms(1000))
        );
        // Only an interval past the default TTL's: the TTL grows with it.
        let o = given(&[("keepalive_interval", 20_000)]).resolve().unwrap();
        assert_eq!((o.ttl, o.margin), (ms(60_000), ms(1000)));
        // A timeout past the derived interval: the interval makes room.
        let o = given(&[("keepalive_timeout", 6_000)]).resolve().unwrap();
        assert!(o.keepalive_interval > ms(6000), "{o:?}");
        // A margin that leaves little of the TTL: the interval fits under it.
        let o = given(&[("ttl", 6_000), ("margin", 5_000)])
            .resolve()
            .unwrap();
        assert_eq!(o.keepalive_interval, ms(500));
        // Over a session's base: what the session leaves out is the client's.
        let base = given(&[("ttl", 30_000), ("retry_interval", 3_000)])
            .resolve()
            .unwrap();
        let o = given(&[("margin", 2_000)]).resolve_over(&base).unwrap();
        assert_eq!((o.ttl, o.retry_interval), (base.ttl, ms(3000)));
        let o = given(&[("ttl", 6_000)]).resolve_over(&base).unwrap();
        assert_eq!(
            (o.keepalive_interval, o.retry_interval),
            (ms(2000), ms(400))
        );
    }

    #[test]
    fn a_contradiction_the_user_wrote_names_both_settings() {
        for (fields, setting, other) in [
            (
                &[("ttl", 6_000), ("keepalive_interval", 6_000)][..],
                "keepalive_interval",
                "ttl",
            ),
            (&[("ttl", 6_000), ("margin", 6_000)][..], "margin", "ttl"),
            (
                &[("keepalive_interval", 2_000), ("keepalive_timeout", 2_000)][..],
                "keepalive_timeout",
                "keepalive_interval",
            ),
            (
                &[("ttl", 6_000), ("keepalive_timeout", 6_000)][..],
                "keepalive_timeout",
                "ttl",
            ),
        ] {
            match given(fields).resolve() {
                Err(e @ Error::InvalidOption { .. }) => {
                    let Error::InvalidOption {
                        setting: s,
                        ref rule,
                    } = e
                    else {
                        unreachable!()
                    };
                    assert_eq!(s, setting, "{fields:?}: {e}");
                    assert!(rule.contains(other), "{fields:?}: {e}");
                }
                other => panic!("{fields:?}: expected an invalid option, got {other:?}"),
            }
        }
    }

    #[test]
    fn bad_numbers_are_the_settings_or_the_arguments_error() {
        for v in [
            -1.0,
            -0.001,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
        ] {
            assert!(
                matches!(
                    setting_secs("ttl", v),
                    Err(Error::InvalidOption { setting: "ttl", .. })
                ),
                "{v}"
            );
            assert!(
                matches!(
                    setting_millis("ttl", v),
                    Err(Error::InvalidOption { setting: "ttl", .. })
                ),
                "{v}"
            );
            assert!(
                matches!(argument_secs("timeout", v), Err(Error::InvalidArgument(m)) if m.starts_with("timeout")),
                "{v}"
            );
            assert!(matches!(
                argument_millis("timeout", v),
                Err(Error::InvalidArgument(_))
            ));
        }
        assert_eq!(
            setting_secs("ttl", 1.5).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            setting_millis("ttl", 1500.0).unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(argument_millis("timeout", 0.0).unwrap(), Duration::ZERO);
        let e = unknown_setting("tll", &["ttl", "margin"]);
        assert_eq!(e.code(), "invalid_option");
        assert!(
            e.to_string().contains("`tll`") && e.to_string().contains("ttl, margin"),
            "{e}"
        );
    }

    #[test]
    fn a_name_is_1_to_max_bytes_of_utf8_without_nul() {
        assert_eq!(check_name("lock", b"jobs").unwrap(), "jobs");
        let long = vec![b'a'; crate::MAX_NAME_LEN];
        assert!(check_name("lock", &long).is_ok());
        let longer = vec![b'a'; crate::MAX_NAME_LEN + 1];
        for bad in [&b""[..], b"a\0b", &longer, b"\xff"] {
            assert!(
                matches!(check_name("lock", bad), Err(Error::InvalidArgument(m)) if m.starts_with("lock name")),
                "{bad:?}"
            );
        }
    }

    /// Every combination of a grid of values: what the rule derives is
    /// valid, and an error names a setting the user gave.
    #[test]
    fn derived_settings_are_never_the_error() {
        let names = [
            "ttl",
            "keepalive_interval",
            "keepalive_timeout",
            "retry_interval",
            "margin",
        ];
        let values = [0, 100, 700, 2_000, 6_000, 40_000];
        let mut combos = 0;
        for mask in 0u32..(1 << names.len()) {
            let picked: Vec<&str> = (0..names.len())
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| names[i])
                .collect();
            let mut idx = vec![0; picked.len()];
            loop {
                let fields: Vec<(&str, u64)> = picked
                    .iter()
                    .zip(&idx)
                    .map(|(n, i)| (*n, values[*i]))
                    .collect();
                combos += 1;
                match given(&fields).resolve() {
                    Ok(o) => o.validate().unwrap(),
                    Err(Error::InvalidOption { setting, rule }) => assert!(
                        picked.contains(&setting),
                        "{fields:?}: {setting} was derived, yet is the error ({rule})"
                    ),
                    Err(e) => panic!("{fields:?}: {e}"),
                }
                // The next combination of values.
                let mut k = 0;
                while k < idx.len() {
                    idx[k] += 1;
                    if idx[k] < values.len() {
                        break;
                    }
                    idx[k] = 0;
                    k += 1;
                }
                if k == idx.len() {
                    break;
                }
            }
        }
        assert_eq!(combos, 7usize.pow(5));
    }
}
