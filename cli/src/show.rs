//! `dlock show NAME` and `dlock list PREFIX`: read-only looks at etcd's
//! lock keys. A lock `NAME` is the queue of keys `NAME/<lease hex>` (etcd's
//! lock protocol, as the core and `etcdctl lock` write them): the key with
//! the lowest create revision holds, its create revision is the token, the
//! others wait in that order.

use std::time::Duration;

use clap::Args;
use etcd_client::{
    Certificate, Client, ConnectOptions, GetOptions, Identity, KeyValue, SortOrder, SortTarget,
    TlsOptions,
};
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
}

#[derive(Serialize, Debug)]
struct Listed {
    name: String,
    holder: Key,
    waiters: usize,
}

fn backend(what: &str, e: impl std::fmt::Display) -> Fail {
    Fail::new(
        exit::BACKEND,
        format!("backend: {what}: {}", one_line(&e.to_string())),
    )
}

fn runtime() -> Result<tokio::runtime::Runtime, Fail> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Fail::new(exit::OTHER, format!("cannot start a runtime: {e}")))
}

/// A plain etcd client for the configuration (TLS, user), with the same
/// timeouts; `limit` bounds connecting plus one request.
async fn connect(conn: &Conn) -> Result<(Client, Duration), Fail> {
    let config = conn.etcd()?;
    let read = |what: &str, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| {
            Fail::new(
                exit::INVALID,
                format!(
                    "invalid_argument: cannot read the {what} `{}`: {e}",
                    p.display()
                ),
            )
        })
    };
    let mut options = ConnectOptions::new()
        .with_connect_timeout(config.connect_timeout)
        .with_timeout(config.request_timeout);
    let tls = config.tls();
    if tls {
        let mut t = TlsOptions::new();
        if let Some(ca) = &config.ca_file {
            t = t.ca_certificate(Certificate::from_pem(read("CA file", ca)?));
        }
        if let (Some(c), Some(k)) = (&config.cert_file, &config.key_file) {
            t = t.identity(Identity::from_pem(
                read("certificate file", c)?,
                read("key file", k)?,
            ));
        }
        options = options.with_tls(t);
    }
    if let (Some(u), Some(p)) = (&config.user, &config.password) {
        options = options.with_user(u.clone(), p.clone());
    }
    let scheme = if tls { "https" } else { "http" };
    let urls: Vec<String> = config
        .endpoints
        .iter()
        .map(|e| {
            let hostport = e.split_once("://").map_or(e.as_str(), |(_, r)| r);
            format!("{scheme}://{}", hostport.trim_end_matches('/'))
        })
        .collect();
    let limit = config.connect_timeout + config.request_timeout;
    let client = tokio::time::timeout(limit, Client::connect(&urls, Some(options)))
        .await
        .map_err(|_| {
            backend(
                "connect",
                format!("no answer from {} within {limit:?}", urls.join(",")),
            )
        })?
        .map_err(|e| backend("connect", e))?;
    Ok((client, limit))
}

/// The keys under `prefix`, oldest first.
async fn keys(client: &mut Client, limit: Duration, prefix: &str) -> Result<Vec<KeyValue>, Fail> {
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let got = tokio::time::timeout(limit, client.get(prefix, Some(opts)))
        .await
        .map_err(|_| backend("get", format!("no answer within {limit:?}")))?
        .map_err(|e| backend("get", e))?;
    Ok(got.kvs().to_vec())
}

fn key(kv: &KeyValue) -> Key {
    Key {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        token: kv.create_revision(),
        lease: format!("{:x}", kv.lease()),
    }
}

fn check_name(name: &str) -> Result<(), Fail> {
    if name.is_empty() || name.len() > dlock::MAX_NAME_LEN {
        return Err(Fail::new(
            exit::INVALID,
            format!(
                "invalid_argument: lock name must be 1 to {} bytes, got {}",
                dlock::MAX_NAME_LEN,
                name.len()
            ),
        ));
    }
    Ok(())
}

pub fn show(args: ShowArgs) -> Result<i32, Fail> {
    check_name(&args.name)?;
    let shown = runtime()?.block_on(async {
        let (mut client, limit) = connect(&args.conn).await?;
        let kvs = keys(&mut client, limit, &format!("{}/", args.name)).await?;
        let mut queue = kvs.iter();
        let holder = match queue.next() {
            None => None,
            Some(kv) => {
                let ttl = tokio::time::timeout(limit, client.lease_time_to_live(kv.lease(), None))
                    .await
                    .map_err(|_| {
                        backend("lease time-to-live", format!("no answer within {limit:?}"))
                    })?
                    .map_err(|e| backend("lease time-to-live", e))?;
                Some(Holder {
                    key: key(kv),
                    ttl_left_s: ttl.ttl(),
                    ttl_granted_s: ttl.granted_ttl(),
                })
            }
        };
        Ok::<_, Fail>(Shown {
            name: args.name.clone(),
            held: holder.is_some(),
            holder,
            waiters: queue.map(key).collect(),
        })
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&shown).expect("serializable"));
    } else if let Some(h) = &shown.holder {
        println!("lock      {}", shown.name);
        println!("holder    {}", h.key.key);
        println!("token     {}", h.key.token);
        println!(
            "lease     {} (ttl left {}s of {}s)",
            h.key.lease, h.ttl_left_s, h.ttl_granted_s
        );
        println!("waiters   {}", shown.waiters.len());
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
    let listed = runtime()?.block_on(async {
        let (mut client, limit) = connect(&args.conn).await?;
        let kvs = keys(&mut client, limit, &args.prefix).await?;
        // Lock keys: `<name>/<lease hex>` under a lease. Grouped by name,
        // oldest first, so each name's first key is its holder.
        let mut locks: Vec<Listed> = Vec::new();
        for kv in &kvs {
            let k = String::from_utf8_lossy(kv.key()).into_owned();
            let Some((name, lease)) = k.rsplit_once('/') else {
                continue;
            };
            if kv.lease() == 0 || lease != format!("{:x}", kv.lease()) {
                continue;
            }
            match locks.iter_mut().find(|l| l.name == name) {
                Some(l) => l.waiters += 1,
                None => locks.push(Listed {
                    name: name.to_owned(),
                    holder: key(kv),
                    waiters: 0,
                }),
            }
        }
        locks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok::<_, Fail>(locks)
    })?;
    if args.json {
        println!("{}", serde_json::to_string(&listed).expect("serializable"));
    } else {
        for l in &listed {
            println!(
                "{}  token {}  lease {}  waiters {}",
                l.name, l.holder.token, l.holder.lease, l.waiters
            );
        }
    }
    Ok(0)
}
