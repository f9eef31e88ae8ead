//! What every face's `endpoints` argument says, and the one place that
//! decides the backend from it: a `postgres://` or `postgresql://` URL
//! selects PostgreSQL, anything else is an etcd endpoint list. C's
//! `lk_client_options`, Python's and Node's `endpoints=` and the CLI's
//! `--endpoints` all build an [`Endpoints`] and call
//! [`Endpoints::backend`]; none of them decides it.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::BackendConfig;
use crate::etcd::{parse_bool, parse_ms};
use crate::postgres::is_postgres_url;
use crate::{Error, EtcdConfig, PostgresConfig};

/// The `DLOCK_*` variables that only mean something with `DLOCK_ENDPOINTS`.
const CONNECTION_VARS: [&str; 8] = [
    "DLOCK_CA_FILE",
    "DLOCK_CERT_FILE",
    "DLOCK_KEY_FILE",
    "DLOCK_USER",
    "DLOCK_PASSWORD",
    "DLOCK_ALLOW_PLAINTEXT_PASSWORD",
    "DLOCK_CONNECT_TIMEOUT_MS",
    "DLOCK_REQUEST_TIMEOUT_MS",
];

/// A lock service's address and the settings that go with it, as a face
/// takes them. Every setting is optional; unset ones keep the backend's
/// default.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Endpoints {
    /// One PostgreSQL URL, or etcd endpoints (each item may itself be a
    /// comma-separated list).
    pub list: Vec<String>,
    /// CA certificate (PEM). etcd: turns TLS on. PostgreSQL: the
    /// `sslrootcert`, and TLS (verify-full) unless the URL's `sslmode`
    /// says otherwise.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), etcd only.
    pub cert_file: Option<PathBuf>,
    /// Client key (PEM), etcd only.
    pub key_file: Option<PathBuf>,
    /// The user (PostgreSQL: instead of the URL's).
    pub user: Option<String>,
    /// The password (PostgreSQL: instead of the URL's).
    pub password: Option<String>,
    /// etcd: allow a password over plaintext. PostgreSQL ignores it: the
    /// password goes through SCRAM, never in the clear.
    pub allow_plaintext_password: Option<bool>,
    /// Time to open one connection.
    pub connect_timeout: Option<Duration>,
    /// Time for one request (other than a keepalive, which the core times).
    pub request_timeout: Option<Duration>,
}

impl Endpoints {
    /// `list`'s items, with every other setting unset.
    pub fn new<S: Into<String>>(list: impl IntoIterator<Item = S>) -> Endpoints {
        Endpoints {
            list: list.into_iter().map(Into::into).collect(),
            ..Endpoints::default()
        }
    }

    /// The names of the settings given (each only means something with
    /// endpoints), in the order of the fields.
    fn settings_given(&self) -> Vec<&'static str> {
        [
            ("ca_file", self.ca_file.is_some()),
            ("cert_file", self.cert_file.is_some()),
            ("key_file", self.key_file.is_some()),
            ("user", self.user.is_some()),
            ("password", self.password.is_some()),
            (
                "allow_plaintext_password",
                self.allow_plaintext_password.is_some(),
            ),
            ("connect_timeout", self.connect_timeout.is_some()),
            ("request_timeout", self.request_timeout.is_some()),
        ]
        .into_iter()
        .filter_map(|(name, given)| given.then_some(name))
        .collect()
    }

    /// For a face given no endpoints (the embedded service, or the
    /// `DLOCK_*` environment's): TLS, credentials and connection timeouts
    /// are refused ([`Error::InvalidArgument`] naming them) instead of
    /// being silently ignored, in every face.
    pub fn check_without_list(&self) -> Result<(), Error> {
        let given = self.settings_given();
        if given.is_empty() {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "{} given without endpoints: TLS, credentials and connection timeouts go with endpoints (give endpoints too, or set DLOCK_ENDPOINTS and the other DLOCK_* variables)",
            given.join(", ")
        )))
    }

    /// The `DLOCK_*` environment: `None` when `DLOCK_ENDPOINTS` is unset
    /// or empty (and then no other `DLOCK_*` connection variable may be
    /// set: one without endpoints is refused, as in every face). `DLOCK_CA_FILE`, `DLOCK_CERT_FILE`, `DLOCK_KEY_FILE`,
    /// `DLOCK_USER`, `DLOCK_PASSWORD`, `DLOCK_ALLOW_PLAINTEXT_PASSWORD`,
    /// `DLOCK_CONNECT_TIMEOUT_MS`, `DLOCK_REQUEST_TIMEOUT_MS`.
    pub fn from_env() -> Result<Option<Endpoints>, Error> {
        Endpoints::from_vars(|name| match std::env::var(name) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::InvalidArgument(format!("{name} is not valid UTF-8")))
            }
        })
    }

    /// [`Endpoints::from_env`] over any source of variables (an empty
    /// value counts as unset): the CLI puts its flags over the
    /// environment this way.
    pub fn from_vars(
        get: impl Fn(&str) -> Result<Option<String>, Error>,
    ) -> Result<Option<Endpoints>, Error> {
        let var = |name: &str| -> Result<Option<String>, Error> {
            Ok(get(name)?.filter(|v| !v.trim().is_empty()))
        };
        let Some(list) = var("DLOCK_ENDPOINTS")? else {
            let alone: Vec<&str> = CONNECTION_VARS
                .iter()
                .copied()
                .filter(|name| var(name).is_ok_and(|v| v.is_some()))
                .collect();
            if alone.is_empty() {
                return Ok(None);
            }
            return Err(Error::InvalidArgument(format!(
                "{} set without DLOCK_ENDPOINTS: TLS, credentials and connection timeouts go with endpoints",
                alone.join(", ")
            )));
        };
        let ms = |name: &str| var(name)?.map(|v| parse_ms(name, &v)).transpose();
        Ok(Some(Endpoints {
            list: vec![list],
            ca_file: var("DLOCK_CA_FILE")?.map(PathBuf::from),
            cert_file: var("DLOCK_CERT_FILE")?.map(PathBuf::from),
            key_file: var("DLOCK_KEY_FILE")?.map(PathBuf::from),
            user: var("DLOCK_USER")?,
            password: get("DLOCK_PASSWORD")?.filter(|p| !p.is_empty()),
            allow_plaintext_password: var("DLOCK_ALLOW_PLAINTEXT_PASSWORD")?
                .map(|v| parse_bool("DLOCK_ALLOW_PLAINTEXT_PASSWORD", &v))
                .transpose()?,
            connect_timeout: ms("DLOCK_CONNECT_TIMEOUT_MS")?,
            request_timeout: ms("DLOCK_REQUEST_TIMEOUT_MS")?,
        }))
    }

    /// The backend these endpoints name, every setting checked: one clear
    /// `invalid_argument` error for anything that does not fit, before
    /// anything connects.
    pub fn backend(self) -> Result<BackendConfig, Error> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.list.iter().all(|s| s.trim().is_empty()) {
            self.check_without_list()?;
        }
        let items: Vec<&str> = self.list.iter().map(|s| s.trim()).collect();
        if let Some(url) = items.iter().find(|i| is_postgres_url(i)) {
            if items.len() != 1 {
                return bad(format!(
                    "a PostgreSQL URL must be the only endpoint, got {} of them (several hosts go inside the one URL: postgresql://h1:5432,h2:5432/db)",
                    items.len()
                ));
            }
            return self.postgres(url).map(BackendConfig::Postgres);
        }
        let joined = items.join(",");
        if let Some(pg) = joined
            .split(',')
            .map(str::trim)
            .find(|e| is_postgres_url(e))
        {
            return bad(format!(
                "`{}…` is a PostgreSQL URL: it must be the only endpoint, not part of an etcd list",
                &pg[..pg.find("://").map_or(pg.len(), |i| i + 3)]
            ));
        }
        let mut c = EtcdConfig::parse(&joined)?;
        c.ca_file = self.ca_file;
        c.cert_file = self.cert_file;
        c.key_file = self.key_file;
        c.user = self.user;
        c.password = self.password;
        if let Some(a) = self.allow_plaintext_password {
            c.allow_plaintext_password = a;
        }
        if let Some(t) = self.connect_timeout {
            c.connect_timeout = t;
        }
        if let Some(t) = self.request_timeout {
            c.request_timeout = t;
        }
        c.validate()?;
        Ok(BackendConfig::Etcd(c))
    }

    fn postgres(&self, url: &str) -> Result<PostgresConfig, Error> {
        let etcd_only = [
            ("cert_file", self.cert_file.is_some()),
            ("key_file", self.key_file.is_some()),
        ];
        if let Some((name, _)) = etcd_only.iter().find(|(_, given)| *given) {
            return Err(Error::InvalidArgument(format!(
                "{name}: client certificates are not supported on PostgreSQL (authenticate with a password: SCRAM)"
            )));
        }
        let mut c = PostgresConfig::parse(url)?;
        if let Some(ca) = &self.ca_file {
            c.set_ca_file(ca.clone())?;
        }
        if self.user.is_some() {
            c.user.clone_from(&self.user);
        }
        if self.password.is_some() {
            c.password.clone_from(&self.password);
        }
        if let Some(t) = self.connect_timeout {
            c.connect_timeout = t;
        }
        if let Some(t) = self.request_timeout {
            c.request_timeout = t;
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(e: Endpoints) -> String {
        match e.backend() {
            Err(e @ Error::InvalidArgument(_)) => e.to_string(),
            other => panic!("expected invalid_argument, got {other:?}"),
        }
    }

    #[test]
    fn a_postgres_url_selects_postgres_with_the_settings() {
        let mut e = Endpoints::new([" postgresql://app@127.0.0.1:5432/db "]);
        e.password = Some("s3cret".into());
        e.user = Some("other".into());
        e.request_timeout = Some(Duration::from_millis(750));
        e.allow_plaintext_password = Some(false);
        let BackendConfig::Postgres(c) = e.backend().unwrap() else {
            panic!("not postgres")
        };
        assert_eq!(c.user.as_deref(), Some("other"));
        assert_eq!(c.password.as_deref(), Some("s3cret"));
        assert_eq!(c.request_timeout, Duration::from_millis(750));
        assert!(!c.tls);
        assert!(!format!("{c:?}").contains("s3cret"));
        let cfg = c.driver_config();
        assert_eq!(cfg.get_user(), Some("other"));
        assert_eq!(cfg.get_password(), Some(&b"s3cret"[..]));
    }

    #[test]
    fn a_ca_file_turns_postgres_tls_on_unless_the_url_turns_it_off() {
        let mut e = Endpoints::new(["postgres://h/db"]);
        e.ca_file = Some("/tmp/ca.pem".into());
        let BackendConfig::Postgres(c) = e.clone().backend().unwrap() else {
            panic!("not postgres")
        };
        assert!(c.tls);
        assert_eq!(c.ca_file, Some("/tmp/ca.pem".into()));
        e.list = vec!["postgres://h/db?sslmode=disable".into()];
        assert!(err(e).contains("sslmode=disable"));
    }

    #[test]
    fn an_etcd_list_stays_etcd() {
        let mut e = Endpoints::new(["127.0.0.1:2379,https://a:1", "https://b:2"]);
        e.ca_file = Some("/tmp/ca.pem".into());
        e.connect_timeout = Some(Duration::from_millis(100));
        let BackendConfig::Etcd(c) = e.backend().unwrap() else {
            panic!("not etcd")
        };
        assert_eq!(c.endpoints.len(), 3);
        assert_eq!(c.connect_timeout, Duration::from_millis(100));
    }

    #[test]
    fn the_environment_names_either_backend() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| -> Result<Option<String>, Error> {
                Ok(pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string()))
            }
        };
        assert!(
            Endpoints::from_vars(env(&[("DLOCK_ENDPOINTS", " ")]))
                .unwrap()
                .is_none()
        );
        let e = Endpoints::from_vars(env(&[
            ("DLOCK_ENDPOINTS", "postgres://h/db"),
            ("DLOCK_PASSWORD", "pw"),
            ("DLOCK_CONNECT_TIMEOUT_MS", "250"),
        ]))
        .unwrap()
        .unwrap();
        let BackendConfig::Postgres(c) = e.backend().unwrap() else {
            panic!("not postgres")
        };
        assert_eq!(c.password.as_deref(), Some("pw"));
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        let bad = Endpoints::from_vars(env(&[
            ("DLOCK_ENDPOINTS", "a:1"),
            ("DLOCK_REQUEST_TIMEOUT_MS", "soon"),
        ]));
        assert!(
            matches!(bad, Err(Error::InvalidArgument(m)) if m.contains("DLOCK_REQUEST_TIMEOUT_MS"))
        );
    }

    #[test]
    fn settings_without_endpoints_are_refused_everywhere() {
        let mut e = Endpoints::default();
        e.check_without_list().unwrap();
        e.ca_file = Some("/tmp/ca.pem".into());
        e.user = Some("u".into());
        let m = e.check_without_list().unwrap_err().to_string();
        assert!(m.contains("ca_file, user given without endpoints"), "{m}");
        assert!(err(e).contains("without endpoints"));
        let env = |name: &str| -> Result<Option<String>, Error> {
            Ok((name == "DLOCK_CA_FILE").then(|| "/tmp/ca.pem".to_string()))
        };
        assert!(
            matches!(Endpoints::from_vars(env), Err(Error::InvalidArgument(m)) if m.contains("DLOCK_CA_FILE set without DLOCK_ENDPOINTS"))
        );
    }

    #[test]
    fn mixed_or_misplaced_settings_are_clear_errors() {
        assert!(err(Endpoints::new(["postgres://h/db", "a:1"])).contains("only endpoint"));
        assert!(err(Endpoints::new(["a:1,postgresql://h/db"])).contains("PostgreSQL URL"));
        let mut e = Endpoints::new(["postgres://h/db"]);
        e.cert_file = Some("/tmp/c.pem".into());
        assert!(err(e).contains("cert_file"));
        assert!(err(Endpoints::new(["postgres://h:x/db"])).contains("PostgreSQL URL"));
        assert!(err(Endpoints::new(Vec::<String>::new())).contains("no etcd endpoint"));
        let mut e = Endpoints::new(["postgres://h/db"]);
        e.request_timeout = Some(Duration::ZERO);
        assert!(err(e).contains("request_timeout"));
    }
}
