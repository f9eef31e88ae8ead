//! `dlock elect NAME VALUE -- CMD`: campaign in the election NAME with
//! VALUE (etcd's election keys: `etcdctl elect` and Go's
//! `concurrency.Election` take part in the same election), run CMD while
//! leading, exactly as `dlock run` (run.rs's machinery: a process group of
//! its own, gone at the fence before anyone else can be elected;
//! `DLOCK_TOKEN` exported). `dlock elect --observe NAME [--json]`: one line
//! per change of leader, `no-leader` included.

use std::ffi::OsString;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use dlock::{Observed, Token};

use crate::exit::{self, Fail};
use crate::run::{Held, OnDrain, RunArgs, Timing};
use crate::{Conn, duration};

#[derive(Args, Debug)]
pub struct ElectArgs {
    #[command(flatten)]
    conn: Conn,
    #[command(flatten)]
    timing: Timing,
    /// Wait at most this long to be elected (default: as long as it takes)
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    timeout: Option<Duration>,
    /// Time between SIGTERM and SIGKILL to the group at the fence; must be
    /// at most --margin - 250ms
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "500ms")]
    grace: Duration,
    /// After a fence, campaign again (higher token) and start CMD again
    #[arg(long)]
    restart: bool,
    /// Observe the election instead: one line per change
    #[arg(long, conflicts_with_all = ["timeout", "restart"])]
    observe: bool,
    /// With --observe: one JSON object a line
    #[arg(long, requires = "observe")]
    json: bool,
    /// The election's name
    name: String,
    /// The value to proclaim while leading (not with --observe)
    value: Option<String>,
    #[command(flatten)]
    metrics: crate::metrics::TextfileArgs,
    /// The command and its arguments, after `--` (not with --observe)
    #[arg(last = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// An election's candidate held by `run`'s machinery: it campaigns with
/// its value where a lock acquires.
struct Candidate {
    election: dlock::Election,
    value: Vec<u8>,
}

impl Held for Candidate {
    fn lock(&self) -> &dlock::Lock {
        self.election.lock()
    }

    fn start(
        &self,
        _wait: bool,
        timeout: Option<Duration>,
        done: Box<dyn FnOnce(Result<Token, dlock::Error>) + Send>,
    ) -> Result<Box<dyn crate::run::Cancel>, dlock::Error> {
        Ok(Box::new(self.election.campaign_then(
            &self.value,
            timeout,
            done,
        )?))
    }
}

pub fn main(args: ElectArgs) -> Result<i32, Fail> {
    if args.observe {
        if args.value.is_some() || !args.command.is_empty() {
            return Err(Fail::new(
                exit::USAGE,
                "usage: --observe takes the election's name only (dlock --help)",
            ));
        }
        return observe(&args);
    }
    let (Some(value), false) = (args.value.clone(), args.command.is_empty()) else {
        return Err(Fail::new(
            exit::USAGE,
            "usage: dlock elect NAME VALUE -- CMD (or dlock elect --observe NAME)",
        ));
    };
    let run = RunArgs {
        conn: args.conn,
        timing: args.timing,
        timeout: args.timeout,
        try_only: false,
        grace: args.grace,
        on_drain: OnDrain::Nothing,
        restart: args.restart,
        restart_limit: None,
        limit: None,
        read: false,
        metrics: args.metrics,
        name: args.name,
        command: args.command,
    };
    crate::run::main_with(run, move |session, name| {
        let election = session.election(name)?;
        Ok(Arc::new(Candidate {
            election,
            value: value.into_bytes(),
        }))
    })
}

/// One line of an observer's event.
fn line(e: &Observed, json: bool) -> String {
    let (kind, leader) = (e.kind(), e.leader());
    match (leader, json) {
        (Some(l), true) => serde_json::json!({
            "event": kind,
            "key": l.key,
            "value": String::from_utf8_lossy(&l.value),
            "token": l.token.get(),
            "lease": format!("{:x}", l.lease),
        })
        .to_string(),
        (None, true) => serde_json::json!({ "event": kind }).to_string(),
        (Some(l), false) => format!(
            "{kind} {} token={} lease={:x} value={}",
            l.key,
            l.token,
            l.lease,
            String::from_utf8_lossy(&l.value)
        ),
        (None, false) => kind.to_string(),
    }
}

fn observe(args: &ElectArgs) -> Result<i32, Fail> {
    let client = dlock::Client::connect(args.conn.client(dlock::Options::default(), None)?)?;
    let observer = client.observe(&args.name)?;
    let mut out = std::io::stdout();
    loop {
        let Some(e) = observer.recv_blocking(None)? else {
            return Ok(0);
        };
        // A closed stdout (the reader went): done.
        if writeln!(out, "{}", line(&e, args.json))
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observer_lines_name_every_event() {
        let l = dlock::Leader {
            key: "e/1f".into(),
            value: b"v".to_vec(),
            token: Token(9),
            lease: 0x1f,
        };
        assert_eq!(
            line(&Observed::Leader(l.clone()), false),
            "leader e/1f token=9 lease=1f value=v"
        );
        assert_eq!(line(&Observed::NoLeader, false), "no-leader");
        let j: serde_json::Value =
            serde_json::from_str(&line(&Observed::Proclaimed(l), true)).unwrap();
        assert_eq!(j["event"], "proclaimed");
        assert_eq!(j["token"], 9);
        assert_eq!(j["lease"], "1f");
        assert_eq!(line(&Observed::NoLeader, true), r#"{"event":"no-leader"}"#);
    }
}
