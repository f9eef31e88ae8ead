//! `dlock show NAME` and `dlock list PREFIX`: read-only looks at the lock
//! keys. A lock `NAME` is the queue of keys `NAME/<lease hex>` (etcd's
//! lock protocol, as the core and `etcdctl lock` write them): the key with
//! the lowest create revision holds, its create revision is the token, the
//! others wait in that order. On PostgreSQL only the holder has a row
//! (`dlock.locks`; waiters wait on a notification), so waiters are not
//! known there: `waiters_known` is false.
//!
//! A semaphore `NAME` (docs/design.md §26) is its slots, the ordinary locks
//! `NAME/slot/<i>`: `show NAME` finds them under `NAME/` and shows each
//! held slot with its holder and waiters; `list` marks each slot's lock
//! with its semaphore and slot.

use clap::Args;
use dlock::{Identity, LockKey, Reader};
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
    /// Who holds the lease (host, pid, started, face, version,
    /// description); null for a holder that records none (`etcdctl lock`).
    identity: Option<Identity>,
}

#[derive(Serialize, Debug)]
struct Shown {
    name: String,
    held: bool,
    holder: Option<Holder>,
    waiters: Vec<Key>,
    /// False on PostgreSQL, where waiters hold no rows.
    waiters_known: bool,
    /// When NAME is a semaphore: its slots held (then `holder` is null
    /// and `waiters` empty: they are per slot).
    #[serde(skip_serializing_if = "Option::is_none")]
    semaphore: Option<SemaphoreShown>,
}

#[derive(Serialize, Debug)]
struct SemaphoreShown {
    /// The limit recorded under `NAME/limit` (by the semaphore's first
    /// handle); null: none is.
    limit: Option<u32>,
    /// Slots held now.
    held: usize,
    /// The held slots, lowest first.
    slots: Vec<SlotShown>,
    /// The semaphore's one queue (`NAME/queue`), its head first: on etcd
    /// every waiter; on PostgreSQL (waiters hold no rows) the head alone.
    queue: Vec<Key>,
}

#[derive(Serialize, Debug)]
struct SlotShown {
    slot: u32,
    /// The slot's lock name, `NAME/slot/<i>`.
    name: String,
    holder: Holder,
    /// Keys queued on this slot itself (an `etcdctl lock` of the slot's
    /// name); dlock's waiters queue in the semaphore's one queue instead.
    waiters: Vec<Key>,
}

#[derive(Serialize, Debug)]
struct Listed {
    name: String,
    holder: Key,
    /// As [`Holder::identity`].
    identity: Option<Identity>,
    waiters: usize,
    /// False on PostgreSQL, where waiters hold no rows.
    waiters_known: bool,
    /// When the lock is a semaphore's slot (`<semaphore>/slot/<i>`).
    #[serde(skip_serializing_if = "Option::is_none")]
    semaphore: Option<SlotOf>,
}

#[derive(Serialize, Debug)]
struct SlotOf {
    name: String,
    slot: u32,
}

/// `(semaphore, slot)` when `lock` is the lock of a semaphore's slot, as
/// the core names it (`dlock::semaphore::slot_name`).
fn slot_of(lock: &str) -> Option<(&str, u32)> {
    let (semaphore, i) = lock.rsplit_once("/slot/")?;
    let slot: u32 = i.parse().ok()?;
    (!semaphore.is_empty() && dlock::semaphore::slot_name(semaphore, slot) == lock)
        .then_some((semaphore, slot))
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

fn holder(reader: &Reader, k: &LockKey) -> Result<Holder, Fail> {
    let ttl = reader.lease_ttl(k.lease).map_err(read_failed)?;
    Ok(Holder {
        key: key(k),
        ttl_left_s: ttl.left_s,
        ttl_granted_s: ttl.granted_s,
        identity: reader.identity(k.lease).map_err(read_failed)?,
    })
}

/// One line for a holder's identity: `HOST pid PID started TIME, FACE
/// VERSION, "DESCRIPTION"`.
fn who(identity: &Option<Identity>) -> String {
    let Some(id) = identity else {
        return "none recorded (not a dlock holder, or an older one)".into();
    };
    let mut s = format!("{} pid {}", id.host, id.pid);
    if let Some(t) = id.started {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(t);
        s += &format!(" started {}", humantime::format_rfc3339_seconds(t));
    }
    s += &format!(", {} {}", id.face, id.version);
    if let Some(d) = &id.description {
        s += &format!(", {d:?}");
    }
    s
}

/// The held slots of the semaphore `name` among `keys` (oldest first).
fn slots(reader: &Reader, name: &str, keys: &[LockKey]) -> Result<Vec<SlotShown>, Fail> {
    let mut slots: Vec<SlotShown> = Vec::new();
    for k in keys {
        let Some((_, slot)) = slot_of(&k.name).filter(|(s, _)| *s == name) else {
            continue;
        };
        match slots.iter_mut().find(|s| s.slot == slot) {
            Some(s) => s.waiters.push(key(k)),
            None => slots.push(SlotShown {
                slot,
                name: k.name.clone(),
                holder: holder(reader, k)?,
                waiters: Vec::new(),
            }),
        }
    }
    slots.sort_by_key(|s| s.slot);
    Ok(slots)
}

pub fn show(args: ShowArgs) -> Result<i32, Fail> {
    check_name(&args.name)?;
    let reader = connect(&args.conn)?;
    let keys = reader
        .lock_keys(&format!("{}/", args.name))
        .map_err(read_failed)?;
    let mut queue = keys.iter().filter(|k| k.name == args.name);
    let holder = match queue.next() {
        None => None,
        Some(k) => Some(holder(&reader, k)?),
    };
    // No lock NAME: a semaphore NAME, if it has a limit recorded or a
    // slot held.
    let semaphore = match holder {
        Some(_) => None,
        None => {
            let limit = reader.semaphore_limit(&args.name).map_err(read_failed)?;
            let slots = slots(&reader, &args.name, &keys)?;
            let queue_name = dlock::semaphore::queue_name(&args.name);
            let queue = keys.iter().filter(|k| k.name == queue_name).map(key);
            (limit.is_some() || !slots.is_empty()).then_some(SemaphoreShown {
                limit,
                held: slots.len(),
                slots,
                queue: queue.collect(),
            })
        }
    };
    let shown = Shown {
        name: args.name.clone(),
        held: holder.is_some() || semaphore.as_ref().is_some_and(|s| s.held > 0),
        holder,
        waiters: queue.map(key).collect(),
        waiters_known: reader.lists_waiters(),
        semaphore,
    };
    if let Some(sem) = &shown.semaphore {
        if args.metrics {
            return Err(Fail::new(
                exit::INVALID,
                format!(
                    "invalid_argument: `{}` is a semaphore: each slot is a lock, `dlock show --metrics {}` shows one",
                    shown.name,
                    dlock::semaphore::slot_name(
                        &shown.name,
                        sem.slots.first().map_or(0, |s| s.slot)
                    )
                ),
            ));
        }
        if args.json {
            println!("{}", serde_json::to_string(&shown).expect("serializable"));
            return Ok(0);
        }
        println!("semaphore {}", shown.name);
        match sem.limit {
            Some(limit) => println!("limit     {limit}"),
            None => println!(
                "limit     none recorded (`{}`)",
                dlock::semaphore::limit_key(&shown.name)
            ),
        }
        println!("held      {} slot(s)", sem.held);
        match shown.waiters_known {
            true => println!("queued    {}", sem.queue.len()),
            false => println!("queued    {} (PostgreSQL: the head alone)", sem.queue.len()),
        }
        for s in &sem.slots {
            let waiters = match shown.waiters_known {
                true => s.waiters.len().to_string(),
                false => "unknown".into(),
            };
            println!(
                "slot {:<4} {}  token {}  lease {} (ttl left {}s of {}s)  waiters {waiters}  by {}",
                s.slot,
                s.holder.key.key,
                s.holder.key.token,
                s.holder.key.lease,
                s.holder.ttl_left_s,
                s.holder.ttl_granted_s,
                who(&s.holder.identity)
            );
        }
        return Ok(0);
    }
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
        println!("by        {}", who(&h.identity));
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
    // One read per session, not per lock: a session's locks share a lease.
    let mut identities = std::collections::HashMap::new();
    for k in &keys {
        match listed.iter_mut().find(|l| l.name == k.name) {
            Some(l) => l.waiters += 1,
            None => listed.push(Listed {
                name: k.name.clone(),
                holder: key(k),
                identity: match identities.get(&k.lease) {
                    Some(id) => Option::clone(id),
                    None => {
                        let id = reader.identity(k.lease).map_err(read_failed)?;
                        identities.insert(k.lease, id.clone());
                        id
                    }
                },
                waiters: 0,
                waiters_known,
                semaphore: slot_of(&k.name).map(|(name, slot)| SlotOf {
                    name: name.to_owned(),
                    slot,
                }),
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
            let of = match &l.semaphore {
                Some(s) => format!("  semaphore {} slot {}", s.name, s.slot),
                None => String::new(),
            };
            println!(
                "{}  token {}  lease {}  waiters {waiters}{of}  by {}",
                l.name,
                l.holder.token,
                l.holder.lease,
                who(&l.identity)
            );
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::slot_of;

    #[test]
    fn slot_locks_are_named_as_the_core_names_them() {
        assert_eq!(slot_of("gpu/slot/0"), Some(("gpu", 0)));
        assert_eq!(slot_of("a/b/slot/12"), Some(("a/b", 12)));
        assert_eq!(slot_of("gpu/slot/01"), None);
        assert_eq!(slot_of("gpu/slot/x"), None);
        assert_eq!(slot_of("/slot/1"), None);
        assert_eq!(slot_of("gpu"), None);
    }
}
