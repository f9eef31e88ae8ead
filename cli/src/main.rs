//! `dlock`: run a command under a distributed lock, and stop its whole
//! process group before the lock can be given to anyone else.
//!
//! The lock, its deadline and its fence are the core's (crate `dlock`);
//! this binary turns them into signals to a process group. Guide:
//! `docs/cli.md`.

mod elect;
mod exit;
mod metrics;
mod postgres;
mod run;
mod show;

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use exit::Fail;

#[derive(Parser, Debug)]
#[command(
    name = "dlock",
    version,
    about = "Run a command under a distributed lock (etcd or PostgreSQL); stop its whole process group before the lock can move on",
    after_help = "Exit codes: docs/cli.md (the command's own status, 128+n for a signal; 2 usage, 120 held (--try), 121 timeout, 122 lock service, 123 invalid option or name, 124 fenced, 125 other, 126 cannot execute, 127 not found)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Acquire NAME, run CMD in a process group of its own, stop the group at the fence.
    Run(run::RunArgs),
    /// Who holds NAME (key, token, lease, TTL left) and who waits.
    Show(show::ShowArgs),
    /// Every lock under PREFIX with its holder and number of waiters.
    List(show::ListArgs),
    /// Campaign in election NAME with VALUE, run CMD while leading (as `run`); or --observe NAME.
    Elect(elect::ElectArgs),
    /// PostgreSQL's `dlock` schema: `migrate` creates or upgrades it, `schema` prints its SQL.
    #[command(subcommand)]
    Postgres(postgres::PostgresCmd),
}

/// Where the lock service is: each flag overrides its `DLOCK_*` variable
/// (read by the core's `EtcdConfig::from_vars`, as the library does).
#[derive(Args, Debug, Clone, Default)]
pub struct Conn {
    /// etcd endpoints, comma-separated `host:port` or `http(s)://host:port`, or one `postgresql://` URL [env: DLOCK_ENDPOINTS]
    #[arg(long, value_name = "LIST")]
    endpoints: Option<String>,
    /// CA certificate (PEM); turns TLS on [env: DLOCK_CA_FILE]
    #[arg(long, value_name = "PATH")]
    ca_file: Option<String>,
    /// Client certificate (PEM) for mutual TLS [env: DLOCK_CERT_FILE]
    #[arg(long, value_name = "PATH")]
    cert_file: Option<String>,
    /// Client key (PEM) for mutual TLS [env: DLOCK_KEY_FILE]
    #[arg(long, value_name = "PATH")]
    key_file: Option<String>,
    /// etcd user; the password is read from DLOCK_PASSWORD only [env: DLOCK_USER]
    #[arg(long)]
    user: Option<String>,
    /// Time to open a connection to one member, e.g. 2s [env: DLOCK_CONNECT_TIMEOUT_MS, in ms]
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    connect_timeout: Option<Duration>,
    /// Time for one request, e.g. 3s [env: DLOCK_REQUEST_TIMEOUT_MS, in ms]
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    request_timeout: Option<Duration>,
}

impl Conn {
    /// What the flags over the `DLOCK_*` environment name (the core's
    /// `Endpoints::from_vars`, as the library reads them).
    pub fn endpoints(&self) -> Result<dlock::Endpoints, Fail> {
        let flags = [
            ("DLOCK_ENDPOINTS", self.endpoints.clone()),
            ("DLOCK_CA_FILE", self.ca_file.clone()),
            ("DLOCK_CERT_FILE", self.cert_file.clone()),
            ("DLOCK_KEY_FILE", self.key_file.clone()),
            ("DLOCK_USER", self.user.clone()),
        ];
        let endpoints = dlock::Endpoints::from_vars(|name| {
            if let Some((_, Some(v))) = flags.iter().find(|(n, _)| *n == name) {
                return Ok(Some(v.clone()));
            }
            match std::env::var(name) {
                Ok(v) => Ok(Some(v)),
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => Err(dlock::Error::InvalidArgument(
                    format!("{name} is not valid UTF-8"),
                )),
            }
        })
        .map_err(Fail::from)?;
        // The timeout flags are durations already: set, not spelled as
        // the variables' milliseconds and read back.
        let endpoints = endpoints.map(|mut e| {
            e.connect_timeout = self.connect_timeout.or(e.connect_timeout);
            e.request_timeout = self.request_timeout.or(e.request_timeout);
            e
        });
        endpoints.ok_or_else(|| {
            Fail::new(
                exit::INVALID,
                "invalid_argument: no lock service: set DLOCK_ENDPOINTS or --endpoints",
            )
        })
    }

    /// The client configuration: etcd or PostgreSQL, as the endpoints
    /// name (the core decides), with `options`; its identity says "cli"
    /// and `--description` (the core checks it).
    pub fn client(
        &self,
        options: dlock::Options,
        description: Option<&str>,
    ) -> Result<dlock::ClientConfig, Fail> {
        let mut config = dlock::ClientConfig::from_env()
            .with_options(options)
            .with_face("cli", env!("CARGO_PKG_VERSION"));
        if let Some(d) = description {
            config = config.with_description(d);
        }
        config.backend = self.endpoints()?.backend().map_err(Fail::from)?;
        Ok(config)
    }
}

/// A duration with its unit: `6s`, `500ms`, `1m 30s`; else why not.
fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}`: {e} (a duration with its unit, e.g. 6s or 500ms)"))
}

/// A number of seconds or milliseconds that is no duration (`-1s`,
/// `-500ms`, `NaN`, `inf`), for the core to judge: `(value, in ms)`.
fn number(s: &str) -> Option<(f64, bool)> {
    let s = s.trim();
    let (digits, in_ms) = match (s.strip_suffix("ms"), s.strip_suffix('s')) {
        (Some(d), _) => (d, true),
        (None, Some(d)) => (d, false),
        (None, None) => (s, false),
    };
    let v: f64 = digits.trim().parse().ok()?;
    // A bare finite number needs its unit (humantime's message says so).
    (!v.is_finite() || digits.len() != s.len()).then_some((v, in_ms))
}

/// A duration argument (`--timeout`, `--grace`, `--connect-timeout`, ...):
/// negative, NaN or infinite is the core's `invalid_argument`, as in
/// every face; text that is no duration too.
pub fn duration(s: &str) -> Result<Duration, dlock::Error> {
    parse_duration(s).or_else(|why| match number(s) {
        Some((v, true)) => dlock::options::argument_millis(&format!("duration `{s}`"), v),
        Some((v, false)) => dlock::options::argument_secs(&format!("duration `{s}`"), v),
        None => Err(dlock::Error::InvalidArgument(why)),
    })
}

/// A timing setting's flag (`--ttl`, ...): as [`duration`], the error
/// the core's `invalid_option` naming the setting.
pub fn setting(
    name: &'static str,
) -> impl Fn(&str) -> Result<Duration, dlock::Error> + Clone + Send + Sync + 'static {
    move |s| {
        parse_duration(s).or_else(|why| match number(s) {
            Some((v, true)) => dlock::options::setting_millis(name, v),
            Some((v, false)) => dlock::options::setting_secs(name, v),
            None => Err(dlock::Error::InvalidOption {
                setting: name,
                rule: why,
            }),
        })
    }
}

/// A parse error of clap as the core's error where the vocabulary has a
/// word for it (as in every face): a bad value of a flag (the core's
/// error from [`duration`] or [`setting`]), and an unknown flag
/// (`invalid_option`). Other usage errors stay clap's.
fn core_error(e: &clap::Error) -> Option<dlock::Error> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    use std::error::Error as _;
    match e.kind() {
        ErrorKind::ValueValidation => match e.source()?.downcast_ref::<dlock::Error>()? {
            // The flag's name with the argument's error (the setting's
            // error names the setting itself).
            dlock::Error::InvalidArgument(m) => match e.get(ContextKind::InvalidArg) {
                Some(ContextValue::String(flag)) => {
                    Some(dlock::Error::InvalidArgument(format!("{flag}: {m}")))
                }
                _ => Some(dlock::Error::InvalidArgument(m.clone())),
            },
            other => Some(other.clone()),
        },
        ErrorKind::UnknownArgument => match e.get(ContextKind::InvalidArg)? {
            ContextValue::String(flag) if flag.starts_with('-') => {
                let flag = flag.split('=').next().unwrap_or(flag);
                Some(dlock::options::unknown_setting(flag, &[]))
            }
            _ => None,
        },
        _ => None,
    }
}

fn main() {
    // The core's log (tracing), for an operator who asks: DLOCK_LOG=debug,
    // or any filter such as `dlock=debug`.
    if let Ok(filter) = std::env::var("DLOCK_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if matches!(e.kind(), DisplayHelp | DisplayVersion) {
                let _ = e.print();
                std::process::exit(0);
            }
            if let Some(core) = core_error(&e) {
                let fail = Fail::from(core);
                say(format_args!("{}", fail.message));
                std::process::exit(fail.code);
            }
            // One line: clap's first, without its usage block.
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let line = first.join(" ");
            let line = line.strip_prefix("error: ").unwrap_or(&line);
            say(format_args!("usage: {line} (dlock --help)"));
            std::process::exit(exit::USAGE);
        }
    };
    let code = match cli.cmd {
        Cmd::Run(args) => run::main(args),
        Cmd::Show(args) => show::show(args),
        Cmd::List(args) => show::list(args),
        Cmd::Elect(args) => elect::main(args),
        Cmd::Postgres(cmd) => postgres::main(cmd),
    };
    // On the way out, whatever the outcome: the core's shutdown (a no-op
    // when nothing is held; `run` has already called it while its handles
    // were alive).
    dlock::shutdown();
    std::process::exit(match code {
        Ok(code) => code,
        Err(fail) => {
            say(format_args!("{}", fail.message));
            fail.code
        }
    });
}

/// Writes `dlock: WHAT` to stderr. Never panics (unlike `eprintln!`): a
/// closed stderr must not end dlock while it supervises a process group.
pub fn say(what: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "dlock: {what}");
}

/// The command after `--`, never empty (clap requires it).
pub fn split_command(command: &[OsString]) -> (&OsString, &[OsString]) {
    (&command[0], &command[1..])
}
