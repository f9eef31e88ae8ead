//! Where and how to reach PostgreSQL: a libpq-style URL and dlock's own
//! parameters in it.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::Error;

/// A PostgreSQL server, from a `postgres://` or `postgresql://` URL
/// (libpq's URL syntax). dlock reads these parameters itself and takes
/// them out before the URL reaches the driver:
///
/// - `sslmode`: `disable`/`allow`/`prefer` (no TLS), `require`,
///   `verify-ca` or `verify-full` (TLS, always verifying the server's
///   certificate and name against `sslrootcert`: there are no built-in
///   roots);
/// - `sslrootcert`: the CA file (PEM), also `DLOCK_CA_FILE`;
/// - `dlock_single_node=true`: accept a server without a synchronous
///   standby (one node, no failover). Without it such a server is refused:
///   asynchronous replication can lose a confirmed keepalive or reissue a
///   token after a failover.
///
/// Its `Debug` output hides the password.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// The URL without dlock's own parameters.
    pub url: String,
    /// TLS to the server (see `sslmode`).
    pub tls: bool,
    /// CA certificate (PEM) that signs the server's certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept a server without synchronous replication.
    pub single_node: bool,
    /// Time allowed to open one connection. Default 2 s.
    pub connect_timeout: Duration,
    /// Time allowed for one statement (other than a keepalive, which the
    /// core times). Default 3 s.
    pub request_timeout: Duration,
    /// `dlock_listen`: where the LISTEN connection goes instead (a pooler
    /// in transaction mode, PgBouncer, cannot carry LISTEN):
    /// `HOST[:PORT][,...]` or a whole `postgres://` URL. `None`: the URL.
    pub listen: Option<String>,
    /// The user, instead of the URL's.
    pub user: Option<String>,
    /// The password, instead of the URL's (never printed).
    pub password: Option<String>,
    /// The URL's `sslmode` turned TLS off in so many words: a CA file
    /// given beside it is then a contradiction, not a request for TLS.
    plain_asked: bool,
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &hide_password(&self.url))
            .field("tls", &self.tls)
            .field("ca_file", &self.ca_file)
            .field("single_node", &self.single_node)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("listen", &self.listen.as_deref().map(hide_password))
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<hidden>"))
            .finish()
    }
}

/// Whether `s` is a PostgreSQL URL (what selects this backend).
pub(crate) fn is_postgres_url(s: &str) -> bool {
    let s = s.trim();
    ["postgres://", "postgresql://"]
        .iter()
        .any(|p| s.len() >= p.len() && s[..p.len()].eq_ignore_ascii_case(p))
}

fn hide_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (auth, host) = match rest.rsplit_once('@') {
        Some(p) => p,
        None => return url.to_string(),
    };
    match auth.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:<hidden>@{host}"),
        None => url.to_string(),
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
            if let Some(v) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl PostgresConfig {
    /// Parses a `postgres://` / `postgresql://` URL (see the type's doc).
    pub fn parse(url: &str) -> Result<PostgresConfig, Error> {
        let bad = |why: String| Error::InvalidArgument(format!("PostgreSQL URL: {why}"));
        let url = url.trim();
        if !is_postgres_url(url) {
            return Err(bad("must start with postgres:// or postgresql://".into()));
        }
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut kept = Vec::new();
        let mut tls = false;
        let mut ca_file = None;
        let mut single_node = false;
        let mut listen = None;
        let mut plain_asked = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            match k {
                "sslmode" => {
                    plain_asked = matches!(v.as_str(), "disable" | "allow" | "prefer");
                    tls = match v.as_str() {
                        "disable" | "allow" | "prefer" => false,
                        "require" | "verify-ca" | "verify-full" => true,
                        _ => {
                            return Err(bad(format!(
                                "sslmode `{v}`: expected disable, allow, prefer, require, verify-ca or verify-full"
                            )));
                        }
                    }
                }
                "sslrootcert" => ca_file = Some(PathBuf::from(v)),
                "dlock_single_node" => {
                    single_node = match v.to_ascii_lowercase().as_str() {
                        "1" | "true" | "yes" | "on" => true,
                        "0" | "false" | "no" | "off" => false,
                        _ => {
                            return Err(bad(format!(
                                "dlock_single_node must be true or false, got `{v}`"
                            )));
                        }
                    }
                }
                "dlock_listen" if !v.trim().is_empty() => listen = Some(v),
                k if k.starts_with("dlock_") => {
                    return Err(bad(format!(
                        "unknown dlock parameter `{k}`, or one without a value (known: dlock_single_node, dlock_listen)"
                    )));
                }
                _ => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        // The driver's own parse: host, port, user, database, options.
        tokio_postgres::Config::from_str(&url).map_err(|e| bad(format!("{e}")))?;
        Ok(PostgresConfig {
            url,
            tls,
            ca_file,
            single_node,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(3),
            listen,
            user: None,
            password: None,
            plain_asked,
        })
    }

    /// The CA file given beside the URL (a face's `ca_file`,
    /// `DLOCK_CA_FILE`): as on etcd, it turns TLS on (verify-full), unless
    /// the URL's `sslmode` turned TLS off, which is refused as a
    /// contradiction. A `sslrootcert` in the URL wins.
    pub fn set_ca_file(&mut self, ca: PathBuf) -> Result<(), Error> {
        if self.plain_asked {
            return Err(Error::InvalidArgument(format!(
                "CA file {} given but the PostgreSQL URL says sslmode=disable/allow/prefer: drop one of them",
                ca.display()
            )));
        }
        self.ca_file.get_or_insert(ca);
        self.tls = true;
        Ok(())
    }

    /// Checks the rules: the URL parses, TLS has a CA file, timeouts above
    /// zero. The CA file is read when connecting.
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if let Err(e) = tokio_postgres::Config::from_str(&self.url) {
            return bad(format!("PostgreSQL URL: {e}"));
        }
        if self.tls && self.ca_file.is_none() {
            return bad(
                "PostgreSQL TLS needs a CA file (sslrootcert=... or DLOCK_CA_FILE); no system roots are built in"
                    .into(),
            );
        }
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout must be above zero".into());
        }
        if self.request_timeout.is_zero() {
            return bad("request_timeout must be above zero".into());
        }
        Ok(())
    }

    /// The driver's configuration, with the connect timeout.
    pub(crate) fn driver_config(&self) -> tokio_postgres::Config {
        let mut c = tokio_postgres::Config::from_str(&self.url).expect("validated");
        c.connect_timeout(self.connect_timeout);
        c.ssl_mode(if self.tls {
            tokio_postgres::config::SslMode::Require
        } else {
            tokio_postgres::config::SslMode::Disable
        });
        if c.get_application_name().is_none() {
            c.application_name("dlock");
        }
        if let Some(u) = &self.user {
            c.user(u);
        }
        if let Some(p) = &self.password {
            c.password(p);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(url: &str) -> String {
        match PostgresConfig::parse(url).and_then(|c| c.validate().map(|_| c)) {
            Err(e @ Error::InvalidArgument(_)) => e.to_string(),
            other => panic!("{url}: expected invalid_argument, got {other:?}"),
        }
    }

    #[test]
    fn parses_dlock_parameters_and_keeps_the_rest() {
        let c = PostgresConfig::parse(
            "postgresql://u:secret@127.0.0.1:5432/db?application_name=x&dlock_single_node=true&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem",
        )
        .unwrap();
        assert!(c.single_node && c.tls);
        assert_eq!(c.ca_file, Some("/tmp/ca.pem".into()));
        assert_eq!(
            c.url,
            "postgresql://u:secret@127.0.0.1:5432/db?application_name=x"
        );
        c.validate().unwrap();
        let debug = format!("{c:?}");
        assert!(
            debug.contains("<hidden>") && !debug.contains("secret"),
            "{debug}"
        );
        let c = PostgresConfig::parse("postgres://h/db").unwrap();
        assert!(!c.single_node && !c.tls);
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        assert!(err("http://h/db").contains("postgres://"));
        assert!(err("postgres://h/db?sslmode=bogus").contains("sslmode"));
        assert!(err("postgres://h/db?dlock_single_node=maybe").contains("dlock_single_node"));
        assert!(err("postgres://h/db?dlock_bogus=1").contains("dlock_bogus"));
        assert!(err("postgres://h:notaport/db").contains("URL"));
        assert!(err("postgres://h/db?nosuchoption=1").contains("URL"));
        assert!(err("postgres://h/db?sslmode=require").contains("CA file"));
    }

    #[test]
    fn selects_by_scheme() {
        assert!(is_postgres_url("postgres://h"));
        assert!(is_postgres_url(" PostgreSQL://h"));
        assert!(!is_postgres_url("127.0.0.1:2379"));
        assert!(!is_postgres_url("http://h:1"));
    }
}
