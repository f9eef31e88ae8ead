//! Holder identity (issue 31): who holds a lock — host, process id, the
//! process's start time, the face and its version, and the application's
//! description. It belongs to a session's lease, written once when the
//! lease is granted (never per acquire): a lock key's lease names its
//! session, and the lease names its identity. Built here, from the
//! process and [`IdentityOptions`]; never from the environment or the
//! command line, so it carries no secret the application did not put in
//! its description.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::machine::{LeaseId, Token};

/// Longest description, in bytes: an identity stays one small value.
pub const MAX_DESCRIPTION_LEN: usize = 256;

/// Longest face name and face version, in bytes.
const MAX_FACE_LEN: usize = 64;

/// Where etcd keeps identities: `IDENTITY_PREFIX` + the lease in hex,
/// under that lease. The first byte, 0xff, never occurs in UTF-8, so no
/// lock name (UTF-8, checked) has a key prefix `<name>/` that covers it:
/// no lock, semaphore or election of dlock can collide with it.
pub const IDENTITY_PREFIX: &[u8] = b"\xffdlock/holder/";

/// The etcd key of `lease`'s identity ([`IDENTITY_PREFIX`] + lease hex).
pub fn identity_key(lease: LeaseId) -> Vec<u8> {
    let mut k = IDENTITY_PREFIX.to_vec();
    k.extend_from_slice(format!("{lease:x}").as_bytes());
    k
}

/// What a client says about itself beyond what the process tells: the
/// face that built it and the application's description. Every face
/// passes its own name and version; only the description comes from the
/// application ([`crate::ClientConfig::with_description`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityOptions {
    /// Free text from the application (a job name, a build id), at most
    /// [`MAX_DESCRIPTION_LEN`] bytes, no control characters.
    pub description: Option<String>,
    /// The face: "rust", "c", "cpp", "python", "node", "cli".
    pub face: String,
    /// The face's version.
    pub version: String,
    /// Records the identity (the default). False: nothing is recorded
    /// beside the leases (holders read the lease only), and a session's
    /// grant costs no write for it (the benchmark's baseline).
    pub record: bool,
}

impl Default for IdentityOptions {
    fn default() -> Self {
        IdentityOptions {
            description: None,
            face: "rust".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            record: true,
        }
    }
}

impl IdentityOptions {
    /// The rules, every face's: a description of at most
    /// [`MAX_DESCRIPTION_LEN`] bytes without control characters (NUL, a
    /// newline: it is printed on one line by `dlock show`), a face name
    /// and version of 1 to 64 such bytes. [`Error::InvalidOption`].
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(d) = &self.description {
            check("description", d, 0, MAX_DESCRIPTION_LEN)?;
        }
        check("face", &self.face, 1, MAX_FACE_LEN)?;
        check("face_version", &self.version, 1, MAX_FACE_LEN)
    }
}

fn check(setting: &'static str, v: &str, min: usize, max: usize) -> Result<(), Error> {
    let bad = |why: String| {
        Err(Error::InvalidOption {
            setting,
            rule: format!(
                "must be {min} to {max} bytes of UTF-8 without control characters: {why}"
            ),
        })
    };
    if v.len() < min || v.len() > max {
        return bad(format!("got {} bytes", v.len()));
    }
    if let Some((at, c)) = v.char_indices().find(|(_, c)| c.is_control()) {
        return bad(format!("{c:?} at byte {at}"));
    }
    Ok(())
}

/// Who holds a lease: recorded by the engine beside it, read back by
/// [`crate::Lock::holder`] and `dlock show`. Serialized as a small JSON
/// object; unknown fields are ignored on reading, so later versions may
/// add some.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Identity {
    /// The host name (`gethostname`).
    #[serde(default)]
    pub host: String,
    /// The process id.
    #[serde(default)]
    pub pid: u32,
    /// When the process started, Unix seconds (Linux: from `/proc`);
    /// with `pid`, names the process even after its pid is reused.
    #[serde(default)]
    pub started: Option<u64>,
    /// The face that made the client ("rust", "c", "python", …).
    #[serde(default)]
    pub face: String,
    /// The face's version.
    #[serde(default)]
    pub version: String,
    /// The application's description, if it gave one.
    #[serde(default)]
    pub description: Option<String>,
}

impl Identity {
    /// This process's identity with `options` (validated by the caller),
    /// `record` aside.
    /// Read when a client is made, not once per process: a forked child's
    /// client has its own pid.
    pub fn of_process(options: &IdentityOptions) -> Identity {
        Identity {
            host: host_name(),
            pid: std::process::id(),
            started: process_started(),
            face: options.face.clone(),
            version: options.version.clone(),
            description: options.description.clone(),
        }
    }

    /// The JSON that engines store.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an identity serializes")
    }

    /// An identity read from an engine; `None` for what is not one.
    pub fn from_json(bytes: &[u8]) -> Option<Identity> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The holder of a lock as the engine sees it ([`crate::Lock::holder`]):
/// the lock key with the lowest token under the name, its lease, and the
/// identity of that lease's session. `identity` is `None` for a holder
/// that records none (`etcdctl lock`, a Go client, an older dlock).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockHolder {
    /// The holder's key, `<name>/<lease hex>`.
    pub key: String,
    /// Its token (the key's create revision).
    pub token: Token,
    /// The lease it is held under.
    pub lease: LeaseId,
    /// Who holds that lease, when recorded.
    pub identity: Option<Arc<Identity>>,
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is ours and its length is given.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// The process's start, Unix seconds: boot time (`btime` of `/proc/stat`)
/// plus field 22 of `/proc/self/stat` (clock ticks after boot). `None`
/// where there is no `/proc`.
fn process_started() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'. Field 3 is the first after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let ticks: u64 = rest.split_whitespace().nth(22 - 3)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime ")?.trim().parse().ok())?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    Some(boot + ticks / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_keys_are_outside_every_lock_name() {
        assert_eq!(identity_key(0x694d), b"\xffdlock/holder/694d".to_vec());
        // No lock name can cover the key: its first byte is not UTF-8.
        assert!(std::str::from_utf8(&identity_key(1)).is_err());
    }

    #[test]
    fn this_process() {
        let id = Identity::of_process(&IdentityOptions {
            description: Some("nightly".into()),
            ..IdentityOptions::default()
        });
        assert_eq!(id.pid, std::process::id());
        assert!(!id.host.is_empty());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let started = id.started.expect("Linux has /proc");
        assert!(started <= now && started + 3600 > now, "{started} vs {now}");
        assert_eq!(Identity::from_json(id.to_json().as_bytes()), Some(id));
    }

    #[test]
    fn only_these_fields() {
        // No environment, no command line: the fields are these six.
        let id = Identity::of_process(&IdentityOptions::default());
        let v: serde_json::Value = serde_json::from_str(&id.to_json()).unwrap();
        let mut keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            ["description", "face", "host", "pid", "started", "version"]
        );
    }

    #[test]
    fn descriptions_are_checked() {
        let with = |d: &str| IdentityOptions {
            description: Some(d.into()),
            ..IdentityOptions::default()
        };
        assert!(with("").validate().is_ok());
        assert!(with(&"x".repeat(MAX_DESCRIPTION_LEN)).validate().is_ok());
        for bad in [
            "a\0b".to_string(),
            "two\nlines".into(),
            "x".repeat(MAX_DESCRIPTION_LEN + 1),
        ] {
            match with(&bad).validate() {
                Err(Error::InvalidOption { setting, rule }) => {
                    assert_eq!(setting, "description");
                    assert!(rule.contains("256 bytes"), "{rule}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        let no_face = IdentityOptions {
            face: String::new(),
            ..IdentityOptions::default()
        };
        assert!(no_face.validate().is_err());
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let id = Identity::from_json(br#"{"host":"h","pid":7,"later":1}"#).unwrap();
        assert_eq!((id.host.as_str(), id.pid, id.started), ("h", 7, None));
        assert_eq!(Identity::from_json(b"not json"), None);
    }
}
