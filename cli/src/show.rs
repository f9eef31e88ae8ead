//! `dlock show NAME` and `dlock list PREFIX`: read-only looks at the lock
//! keys. A lock `NAME` is the queue of keys `NAME/<lease hex>` (etcd's
//! lock protocol, as the core and `etcdctl lock` write them): the key with
//! the lowest create revision holds, its create revision is the token, the
//! others wait in that order. On PostgreSQL only the holder has a row
//! (`dlock.locks`; waiters wait on a notification), so waiters are not
//! known there: `waiters_known` is false.

use clap::Args;
use dlock::{LockKey, Reader};
use serde::Serialize;

use crate::Conn;
use crate::exit::{self, Fail, one_line};

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON
    #[arg(long)]
    json: bool,
    /// Print the Prometheus text format (docs/metrics.md)
    #[arg(long, conflicts_with = "json")]
    metrics: bool,
    /// The lock's name
    name: String,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    conn: Conn,
    /// Print JSON
    #[arg(long)]
    json: bool,
    /// Lock names starting with this (empty: every lock)
    #[arg(default_value = "")]
    prefix: String,
}

/// One key of a lock's queue.
#[derive(Serialize, Debug)]
struct Key {
    key: String,
    /// The key's create revision: the holder's fencing token.
    token: i64,
    /// The lease, in hex as in the key.
    lease: String,
}

#[derive(Serialize, Debug)]
struct Holder {
    #[serde(flatten)]
    key: Key,
    /// Seconds left on the lease (etcd's TTL), -1 if it is gone.
    ttl_left_s: i64,
    /// The lease's granted TTL in seconds.
    ttl_granted_s: i64,
}

#[derive(Serialize, Debug)]
struct Shown {
    name: String,
    held: bool,
    holder: Option<Holder>,
    waiters: Vec<Key>,
    /// False on PostgreSQL, where waiters hold no rows.
    waiters_known: bool,
}

#[derive(Serialize, Debug)]
struct Listed {
    name: String,
    holder: Key,
    waiters: usize,
    /// False on PostgreSQL, where waiters hold no rows.
    waiters_known: bool,
}

fn backend(what: &str, e: impl std::fmt::Display) -> Fail {
    Fail::new(
        exit::BACKEND,
        format!("backend: {what}: {}", one_line(&e.to_string())),
    )
}

/// The core's read-only connection for the configuration (etcd: TLS, user
/// auth with token refresh, require-leader, fail-over; PostgreSQL: TLS and
/// the server checks of a client).
fn connect(conn: &Conn) -> Result<Reader, Fail> {
    Reader::connect(conn.endpoints()?).map_err(|e| match e {
        dlock::Error::Backend(m) => backend("connect", m),
        e => Fail::from(e),
    })
}

/// A failed read: the core's backend error names the request.
fn read_failed(e: dlock::Error) -> Fail {
    match e {
        dlock::Error::Backend(m) => Fail::new(exit::BACKEND, format!("backend: {}", one_line(&m))),
        e => Fail::from(e),
    }
}

fn key(k: &LockKey) -> Key {
    Key {
        key: k.key.clone(),
        token: k.create_revision,
        lease: format!("{:x}", k.lease),
    }
}

fn check_name(name: &str) -> Result<(), Fail> {
    dlock::options::check_name("lock", name.as_bytes())
        .map(drop)
        .map_err(Fail::from)
}

pub fn show(args: ShowArgs) -> Result<i32, Fail> {
    check_name(&args.name)?;
    let reader = connect(&args.conn)?;
    let mut queue = reader
        .lock_keys(&format!("{}/", args.name))
        .map_err(read_failed)?
        .into_iter()
        .filter(|k| k.name == args.name);
    let holder = match queue.next() {
        None => None,
        Some(k) => {
            let ttl = reader.lease_ttl(k.lease).map_err(read_failed)?;
            Some(Holder {
                key: key(&k),
                ttl_left_s: ttl.left_s,
                ttl_granted_s: ttl.granted_s,
            })
        }
    };
    let shown = Shown {
        name: args.name.clone(),
        held: holder.is_some(),
        holder,
        waiters: queue.map(|k| key(&k)).collect(),
        waiters_known: reader.lists_waiters(),
    };
    if args.metrics {
        let token = shown.holder.as_ref().map(|h| h.key.token);
        print!(
            "{}",
            crate::metrics::show_text(
                &shown.name,
                token,
                shown.waiters_known.then_some(shown.waiters.len())
            )
        );
    } else if args.json {
        println!("{}", serde_json::to_string(&shown).expect("serializable"));
    } else if let Some(h) = &shown.holder {
        println!("lock      {}", shown.name);
        println!("holder    {}", h.key.key);
        println!("token     {}", h.key.token);
        println!(
            "lease     {} (ttl left {}s of {}s)",
            h.key.lease, h.ttl_left_s, h.ttl_granted_s
        );
        if shown.waiters_known {
            println!("waiters   {}", shown.waiters.len());
        } else {
            println!("waiters   unknown (PostgreSQL: waiters hold no rows)");
        }
        for w in &shown.waiters {
            println!("  {}  (create revision {})", w.key, w.token);
        }
    } else {
        println!("lock      {}", shown.name);
        println!("holder    none (not held)");
    }
    Ok(if shown.held { 0 } else { exit::NOT_HELD })
}

pub fn list(args: ListArgs) -> Result<i32, Fail> {
    let reader = connect(&args.conn)?;
    let waiters_known = reader.lists_waiters();
    let keys = reader.lock_keys(&args.prefix).map_err(read_failed)?;
    // Grouped by name, oldest first, so each name's first key is its holder.
    let mut listed: Vec<Listed> = Vec::new();
    for k in &keys {
        match listed.iter_mut().find(|l| l.name == k.name) {
            Some(l) => l.waiters += 1,
            None => listed.push(Listed {
                name: k.name.clone(),
                holder: key(k),
                waiters: 0,
                waiters_known,
            }),
        }
    }
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    if args.json {
        println!("{}", serde_json::to_string(&listed).expect("serializable"));
    } else {
        for l in &listed {
            let waiters = match l.waiters_known {
                true => l.waiters.to_string(),
                false => "unknown".into(),
            };
            println!(
                "{}  token {}  lease {}  waiters {waiters}",
                l.name, l.holder.token, l.holder.lease
            );
        }
    }
    Ok(0)
}
