//! The independent checker: reads a history (every process's records, see
//! `docs/nemesis.md`) and nothing else, and checks
//!
//! - G1: every fence of a token comes before the first write accepted from
//!   a higher token (unless an operator revoked the lease or deleted the
//!   key, or the holder was paused or killed: then the gap is reported);
//! - G2: no resource accepts a token lower than one it accepted before
//!   (the etcd key, by revision; the gate, in its order), and the writes a
//!   paused holder sends after it resumes are refused once a higher token
//!   was accepted;
//! - G3: tokens strictly increase across acquisitions;
//! - G4: no permit granted at or after its deadline;
//! - liveness: after each heal the lock is held again (a live write
//!   accepted, or a holder entering Holding) within TTL + 2 s; no
//!   holder drains longer than TTL + 1 s unless paused; at the end exactly
//!   one holder holds and none drains;
//! - every acknowledged write is in its resource's history, no write
//!   reported refused is; writes of unknown outcome are counted apart;
//! - in the election mode also E1: one leader at a time (no permit of a
//!   lower token runs past a higher token's election, unless an operator
//!   cut the lower one), and E2: the observer's leader tokens rise, and its
//!   last report names the leader that holds at the end;
//! - in the semaphore mode (records tagged `li`: the slot) every slot is
//!   checked as a lock of its own (G1–G4: tokens rise per slot, a slot's
//!   resource never accepts a lower token, no permit after a deadline),
//!   and S1: at no instant more than N holders with valid permits (a
//!   `dlock run` holder's: its command's start to its last write, unless
//!   a pause of that holder fell inside).
//!
//! - in the read/write mode (the gate's two-key register, records
//!   `rw_read` / `rw_write` / `rw_refuse`; on PostgreSQL the holders'
//!   own records of `app.register`) also RW1: no admitted read sees a torn
//!   pair; RW2: no admitted read returns a value older than the last
//!   admitted write of a lower token that completed before the read
//!   started; RW3: the gate's watermarks W and R never go backwards.
//!
//! As etcd's `tests/robustness/validate`: the records are read once into a
//! typed `History`, then each invariant is one short function over it.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Fences, resumes (draining → holding), acquisitions.
    pub fences: u64,
    /// Keepalives confirmed in time after a drain.
    pub resumes: u64,
    /// Acquisitions (first and reacquisitions).
    pub acquisitions: u64,
    /// Permits granted.
    pub permits: u64,
    /// Writes accepted: (etcd, gate).
    pub accepted: (u64, u64),
    /// Writes refused as stale: (etcd, gate).
    pub refused: (u64, u64),
    /// Writes of unknown outcome: (etcd, gate), and how many of them the
    /// resource did commit.
    pub unknown: (u64, u64),
    /// Of the unknown ones, committed: (etcd, gate).
    pub unknown_committed: (u64, u64),
    /// Stale writes a paused holder sent after resuming, with a permit from
    /// before the pause, once a higher token had been accepted; and how
    /// many of them were refused (all, or G2 breaks).
    pub paused_writes: (u64, u64),
    /// Gate writes accepted after their own token's fence, while no higher
    /// token had been accepted (a unit in flight at the fence, or a paused
    /// holder's, that the gate cannot tell from a live one; not a
    /// violation: the next higher token refuses it).
    pub late_accepted: u64,
    /// Smallest G1 lead (ms) of a fence over the first accepted write of a
    /// higher token.
    pub min_lead_ms: Option<f64>,
    /// G1 gaps that cannot be avoided (operator, paused or killed holder),
    /// with the smallest (most negative) lead in ms.
    pub gaps: BTreeMap<String, (u64, f64)>,
    /// Longest time (ms) from a heal until the lock is held again (a live
    /// write accepted, or a holder entering Holding).
    pub max_heal_ms: Option<f64>,
    /// Heals checked for liveness.
    pub heals: u64,
    /// The election mode (a `start` or `run` record says `election`): the
    /// table lists E1 and E2 and the figures below.
    pub election: bool,
    /// Election mode: events the observer reported, and of them `leader`.
    pub observed: (u64, u64),
    /// Election mode: proclaims that succeeded, and those refused.
    pub proclaims: (u64, u64),
    /// Election mode: the smallest lead (ms) of a leader's last permit
    /// deadline over the next leader's election (E1's margin).
    pub min_handover_ms: Option<f64>,
    /// The PostgreSQL mode (a `run` record says `backend` `postgres`, or
    /// a holder writes `res` `pg`): the fenced resource beside the gate is
    /// the user table `app.writes` (`pg_row` records, by id) instead of the
    /// etcd key; the rules are the same.
    pub postgres: bool,
    /// The semaphore mode's limit N (a `run` or `start` record's
    /// `semaphore`): the table lists S1 and the figure below.
    pub semaphore: Option<u64>,
    /// Semaphore mode: the most holders with valid permits at one instant.
    pub max_valid_holders: u64,
    /// The read/write mode (the history has register records): the table
    /// lists RW1–RW3 and the counts below.
    pub rwlock: bool,
    /// Read/write mode: register reads admitted, writes admitted, refused.
    pub rw_ops: (u64, u64, u64),
    /// Violations by invariant, each with its evidence.
    pub violations: BTreeMap<&'static str, Vec<String>>,
}

/// The invariants the table always lists (0 when nothing broke).
pub const INVARIANTS: &[&str] = &[
    "G1 fence before successor",
    "G2 no lower token accepted",
    "G3 tokens increase",
    "G4 no permit at/after deadline",
    "liveness",
    "acknowledged writes kept",
    "refused writes not applied",
];

/// The election mode's own invariants (listed only in that mode).
pub const ELECTION_INVARIANTS: &[&str] =
    &["E1 one leader at a time", "E2 observed leader tokens rise"];

/// The semaphore mode's own invariant (listed only in that mode).
pub const SEMAPHORE_INVARIANTS: &[&str] = &["S1 at most N holders with valid permits"];

/// The read/write mode's own invariants (listed only in that mode).
pub const RWLOCK_INVARIANTS: &[&str] = &[
    "RW1 no torn read",
    "RW2 no read older than a lower write before it",
    "RW3 watermarks never go back",
];

impl Report {
    /// Total violations.
    pub fn violation_count(&self) -> usize {
        self.violations.values().map(Vec::len).sum()
    }

    fn violate(&mut self, what: &'static str, evidence: String) {
        self.violations.entry(what).or_default().push(evidence);
    }

    /// The resource beside the gate: `etcd` or `postgres`.
    pub fn store(&self) -> &'static str {
        if self.postgres { "postgres" } else { "etcd" }
    }

    /// The table.
    pub fn table(&self) -> String {
        let store = self.store();
        let mut rows: Vec<(String, String)> = Vec::new();
        let total: u64 = self.faults.values().sum();
        rows.push(("faults injected".into(), total.to_string()));
        for (k, v) in &self.faults {
            rows.push((format!("  {k}"), v.to_string()));
        }
        rows.push(("acquisitions".into(), self.acquisitions.to_string()));
        rows.push(("fences".into(), self.fences.to_string()));
        rows.push(("resumes".into(), self.resumes.to_string()));
        rows.push(("permits".into(), self.permits.to_string()));
        rows.push((
            format!("writes accepted ({store} / gate)"),
            format!("{} / {}", self.accepted.0, self.accepted.1),
        ));
        rows.push((
            format!("stale writes refused ({store} / gate)"),
            format!("{} / {}", self.refused.0, self.refused.1),
        ));
        rows.push((
            "stale writes of a paused holder after resume (refused / sent)".into(),
            format!("{} / {}", self.paused_writes.1, self.paused_writes.0),
        ));
        rows.push((
            format!("writes of unknown outcome ({store} / gate)"),
            format!(
                "{} / {} (committed: {} / {})",
                self.unknown.0, self.unknown.1, self.unknown_committed.0, self.unknown_committed.1
            ),
        ));
        rows.push((
            "gate writes accepted after their token's fence (still highest)".into(),
            self.late_accepted.to_string(),
        ));
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
        rows.push(("smallest G1 lead".into(), ms(self.min_lead_ms)));
        for (k, (n, worst)) in &self.gaps {
            let v = if k == "holder killed" {
                format!("{n} (no fence: the process died)")
            } else {
                format!("{n} (worst {worst:.1} ms)")
            };
            rows.push((format!("G1 gap ({k}, unavoidable)"), v));
        }
        rows.push((
            "heals checked, longest heal -> held again".to_owned(),
            format!("{}, {}", self.heals, ms(self.max_heal_ms)),
        ));
        if self.election {
            rows.push((
                "observer events (leader changes)".into(),
                format!("{} ({})", self.observed.0, self.observed.1),
            ));
            rows.push((
                "proclaims (ok / refused)".into(),
                format!("{} / {}", self.proclaims.0, self.proclaims.1),
            ));
            rows.push((
                "smallest handover (last permit deadline -> next election)".into(),
                ms(self.min_handover_ms),
            ));
        }
        if let Some(n) = self.semaphore {
            rows.push((
                format!("most holders with valid permits at once (limit {n})"),
                self.max_valid_holders.to_string(),
            ));
        }
        if self.rwlock {
            rows.push((
                "register reads / writes admitted / refused".into(),
                format!("{} / {} / {}", self.rw_ops.0, self.rw_ops.1, self.rw_ops.2),
            ));
        }
        let listed = INVARIANTS
            .iter()
            .chain(ELECTION_INVARIANTS.iter().filter(|_| self.election))
            .chain(RWLOCK_INVARIANTS.iter().filter(|_| self.rwlock))
            .chain(
                SEMAPHORE_INVARIANTS
                    .iter()
                    .filter(|_| self.semaphore.is_some()),
            );
        for inv in listed {
            let n = self.violations.get(inv).map_or(0, Vec::len);
            rows.push((format!("violations: {inv}"), n.to_string()));
        }
        let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        let mut out = String::new();
        for (k, v) in rows {
            out.push_str(&format!("{k:<w$}  {v}\n"));
        }
        for (inv, ev) in &self.violations {
            for e in ev.iter().take(10) {
                out.push_str(&format!("VIOLATION {inv}: {e}\n"));
            }
        }
        out
    }
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn ms(a: u64, b: u64) -> f64 {
    (b as f64 - a as f64) / 1e6
}

/// Checks the records of one run (as [`crate::history::read_dir`] gives
/// them: sorted by `t`). In the many-locks mode (records tagged `li`) each
/// lock is checked on its own records plus the shared ones (the nemesis's,
/// the holders' `start` and pauses), and the reports are summed.
pub fn check(records: &[Value]) -> Report {
    let mut r = check_locks(records);
    if records.iter().any(|v| s(v, "ev").starts_with("rw_")) {
        rw_counts(records, &mut r);
        rw1_no_torn_read(records, &mut r);
        rw2_no_read_older_than_a_lower_write(records, &mut r);
        rw3_watermarks_never_go_back(records, &mut r);
    }
    r
}

fn check_locks(records: &[Value]) -> Report {
    let mut locks: Vec<u64> = records.iter().filter_map(|v| v["li"].as_u64()).collect();
    locks.sort_unstable();
    locks.dedup();
    if locks.is_empty() {
        return check_one(records);
    }
    let limit = records
        .iter()
        .filter(|v| matches!(s(v, "ev"), "run" | "start"))
        .find_map(|v| v["semaphore"].as_u64())
        .filter(|&n| n > 0);
    // A revoke of a session's lease (tagged with lock 0, whose holder it
    // was read from) deletes every key of that session: every lock sees it.
    let session_wide = |v: &Value| s(v, "p") == "nemesis" && v["session"].as_bool() == Some(true);
    let shared = |v: &Value| {
        (v.get("li").is_none()
            && (s(v, "p") == "nemesis"
                || matches!(s(v, "ev"), "start" | "self_pause" | "self_resume")))
            || session_wide(v)
    };
    let mut total = Report::default();
    for (n, li) in locks.iter().enumerate() {
        let part: Vec<Value> = records
            .iter()
            .filter(|v| v["li"].as_u64() == Some(*li) || shared(v))
            .cloned()
            .collect();
        let mut r = check_one(&part);
        for ev in r.violations.values_mut() {
            for e in ev.iter_mut() {
                *e = format!("lock {li}: {e}");
            }
        }
        total.add(r, n == 0);
    }
    if let Some(limit) = limit {
        s1_at_most_n_valid_holders(records, limit, &mut total);
    }
    total
}

impl Report {
    /// Adds `r` (another lock's report); the faults and heals, shared by
    /// every lock, are taken from the `first` only.
    fn add(&mut self, r: Report, first: bool) {
        if first {
            self.faults = r.faults;
        }
        self.heals += r.heals;
        self.fences += r.fences;
        self.resumes += r.resumes;
        self.acquisitions += r.acquisitions;
        self.permits += r.permits;
        let pair = |a: &mut (u64, u64), b: (u64, u64)| {
            a.0 += b.0;
            a.1 += b.1;
        };
        pair(&mut self.accepted, r.accepted);
        pair(&mut self.refused, r.refused);
        pair(&mut self.unknown, r.unknown);
        pair(&mut self.unknown_committed, r.unknown_committed);
        pair(&mut self.paused_writes, r.paused_writes);
        self.late_accepted += r.late_accepted;
        self.election |= r.election;
        self.postgres |= r.postgres;
        pair(&mut self.observed, r.observed);
        pair(&mut self.proclaims, r.proclaims);
        self.min_handover_ms = match (self.min_handover_ms, r.min_handover_ms) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        self.min_lead_ms = match (self.min_lead_ms, r.min_lead_ms) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        };
        self.max_heal_ms = match (self.max_heal_ms, r.max_heal_ms) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        for (k, (n, worst)) in r.gaps {
            let g = self.gaps.entry(k).or_insert((0, 0.0));
            g.0 += n;
            g.1 = g.1.min(worst);
        }
        for (k, v) in r.violations {
            self.violations.entry(k).or_default().extend(v);
        }
    }
}

// --- typed records ------------------------------------------------------

/// A write a resource accepted: a gate accept, or an etcd put.
struct Accepted<'a> {
    /// The holder that sent it, and its sequence number.
    h: &'a str,
    seq: u64,
    token: u64,
    /// The gate's accept time; the etcd key's revision.
    t: u64,
    v: &'a Value,
}

/// A write as its holder reports it.
struct Write<'a> {
    p: &'a str,
    etcd: bool,
    seq: u64,
    token: u64,
    sent: u64,
    out: &'a str,
    /// When the holder's last permit before this write was asked.
    permit_t0: u64,
    v: &'a Value,
}

struct Permit<'a> {
    p: &'a str,
    t0: u64,
    deadline: u64,
    v: &'a Value,
}

/// A fence, or an acquisition: who, which token, when.
struct TokenAt<'a> {
    p: &'a str,
    token: u64,
    at: u64,
}

struct StateChange<'a> {
    p: &'a str,
    from: &'a str,
    to: &'a str,
    reason: &'a str,
    at: u64,
}

/// A time a holder could not run.
struct Pause {
    who: String,
    from: u64,
    to: u64,
}

/// The writes a resource holds, by (holder, seq).
type Applied<'a> = HashSet<(&'a str, u64)>;

/// One lock's history, read once into typed records.
#[derive(Default)]
struct History<'a> {
    ttl_ns: u64,
    faults: BTreeMap<String, u64>,
    faults_at: Vec<u64>,
    heals: Vec<u64>,
    /// Tokens whose lease an operator revoked or whose key it deleted.
    operator: HashSet<u64>,
    killed: HashSet<&'a str>,
    /// Times the operator revoked a lease: every lock of that session
    /// loses its lease (reason lease_lost) at once.
    revokes: Vec<u64>,
    paused: Vec<Pause>,
    gate_accepts: Vec<Accepted<'a>>,
    etcd_puts: Vec<Accepted<'a>>,
    /// (holder, seq) of every write each resource holds: (etcd, gate).
    applied: (Applied<'a>, Applied<'a>),
    gate_refused: u64,
    permits: Vec<Permit<'a>>,
    writes: Vec<Write<'a>>,
    fences: Vec<TokenAt<'a>>,
    acquired: Vec<TokenAt<'a>>,
    states: Vec<StateChange<'a>>,
    /// Each holder's state at the end.
    finals: HashMap<&'a str, &'a str>,
    /// Each holder's token at the end (when it holds one).
    final_tokens: HashMap<&'a str, u64>,
    /// The election mode.
    election: bool,
    /// The PostgreSQL mode (the etcd key's place is `app.writes`').
    postgres: bool,
    /// The read/write mode (a `run` record's `rwlock`): readers share.
    rwlock: bool,
    /// Read/write mode: when a holder's register read or write was
    /// admitted (the lock is held: liveness).
    register_ok: Vec<u64>,
    /// Read/write mode: when a holder let go of its own accord (`release`,
    /// a handover to the other mode).
    releases: Vec<u64>,
    /// When the first `final` was recorded.
    first_final: Option<u64>,
    /// The observer's events: (t, kind, token).
    observed: Vec<(u64, &'a str, u64)>,
    /// Proclaims: (ok, refused).
    proclaims: (u64, u64),
}

impl<'a> History<'a> {
    fn read(records: &'a [Value]) -> History<'a> {
        let mut h = History {
            ttl_ns: records
                .iter()
                .filter(|v| s(v, "ev") == "start")
                .map(|v| u(v, "ttl_ms"))
                .max()
                .unwrap_or(4000)
                * 1_000_000,
            ..History::default()
        };
        let mut open_pause: HashMap<String, u64> = HashMap::new();
        let mut last_permit: HashMap<&str, u64> = HashMap::new();
        for v in records {
            let (p, t) = (s(v, "p"), u(v, "t"));
            let token_at = |at: &str| TokenAt {
                p,
                token: u(v, "token"),
                at: u(v, at),
            };
            let accepted = |t: u64| Accepted {
                h: s(v, "h"),
                seq: u(v, "seq"),
                token: u(v, "token"),
                t,
                v,
            };
            match (p, s(v, "ev")) {
                ("nemesis", "fault") => {
                    let kind = s(v, "kind");
                    *h.faults.entry(kind.to_owned()).or_default() += 1;
                    h.faults_at.push(t);
                    match kind {
                        "lease_revoked" | "key_deleted" => {
                            h.operator.insert(u(v, "token"));
                            if kind == "lease_revoked" {
                                h.revokes.push(t);
                            }
                        }
                        "holder_killed" => {
                            h.killed.insert(s(v, "target"));
                        }
                        "pause_short" | "pause_long" => {
                            open_pause.insert(s(v, "target").to_owned(), t);
                        }
                        _ => {}
                    }
                }
                ("nemesis", "resume") => {
                    let who = s(v, "target").to_owned();
                    if let Some(from) = open_pause.remove(&who) {
                        h.paused.push(Pause { who, from, to: t });
                    }
                }
                ("nemesis", "heal" | "settle") => h.heals.push(t),
                (_, "self_pause") => {
                    open_pause.insert(p.to_owned(), t);
                }
                (_, "self_resume") => {
                    if let Some(from) = open_pause.remove(p) {
                        let who = p.to_owned();
                        h.paused.push(Pause { who, from, to: t });
                    }
                }
                (_, "gate_accept") => h.gate_accepts.push(accepted(t)),
                // The store's history: the etcd key's puts by revision, or
                // the rows of app.writes by id.
                (_, "etcd_put" | "pg_row") => {
                    h.postgres |= s(v, "ev") == "pg_row";
                    h.etcd_puts.push(accepted(u(v, "rev")))
                }
                (_, "gate_refuse") => h.gate_refused += 1,
                (_, "permit") => {
                    last_permit.insert(p, u(v, "t0"));
                    h.permits.push(Permit {
                        p,
                        t0: u(v, "t0"),
                        deadline: u(v, "deadline"),
                        v,
                    });
                }
                // A register read or write (read/write mode): judged by
                // RW1-RW3 from the gate's own records, not as a lock's write.
                (_, "write") if s(v, "res") == "register" && s(v, "out") == "ok" => {
                    h.register_ok.push(t);
                }
                (_, "write") if s(v, "res") == "register" => {}
                (_, "write") => h.writes.push(Write {
                    p,
                    etcd: s(v, "res") != "gate",
                    seq: u(v, "seq"),
                    token: u(v, "token"),
                    sent: u(v, "sent"),
                    out: s(v, "out"),
                    permit_t0: last_permit.get(p).copied().unwrap_or(0),
                    v,
                }),
                (_, "fence") => h.fences.push(token_at("at")),
                (_, "acquired") => h.acquired.push(token_at("at")),
                (_, "state") => h.states.push(StateChange {
                    p,
                    from: s(v, "from"),
                    to: s(v, "to"),
                    reason: s(v, "reason"),
                    at: u(v, "at"),
                }),
                (_, "release") => h.releases.push(t),
                (_, "final") => {
                    h.first_final = Some(h.first_final.map_or(t, |f| f.min(t)));
                    h.finals.insert(p, s(v, "state"));
                    if let Some(tok) = v["token"].as_u64() {
                        h.final_tokens.insert(p, tok);
                    }
                }
                (_, "start" | "run") if v["election"].as_bool() == Some(true) => {
                    h.election = true;
                }
                (_, "start" | "run") if s(v, "backend") == "postgres" => {
                    h.postgres = true;
                    h.rwlock |= v["rwlock"].as_bool() == Some(true);
                }
                (_, "run") if v["rwlock"].as_bool() == Some(true) => h.rwlock = true,
                ("observer", "observed") => h.observed.push((t, s(v, "kind"), u(v, "token"))),
                (_, "proclaim") => bump(&mut h.proclaims, s(v, "out") == "ok"),
                _ => {}
            }
        }
        // The etcd key's history is in revision order.
        h.etcd_puts.sort_by_key(|a| a.t);
        let set = |list: &[Accepted<'a>]| list.iter().map(|a| (a.h, a.seq)).collect();
        h.applied = (set(&h.etcd_puts), set(&h.gate_accepts));
        // A pause never ended in the history lasts to its end.
        let last_t = records.iter().map(|v| u(v, "t")).max().unwrap_or(0);
        for (who, from) in open_pause {
            h.paused.push(Pause {
                who,
                from,
                to: last_t,
            });
        }
        h
    }

    /// Whether `who` was paused at some time in `a..=b`.
    fn was_paused(&self, who: &str, a: u64, b: u64) -> bool {
        self.paused
            .iter()
            .any(|p| p.who == who && p.from <= b && p.to >= a)
    }

    /// The fence of each token.
    fn fence_of(&self) -> HashMap<u64, &TokenAt<'a>> {
        self.fences.iter().map(|f| (f.token, f)).collect()
    }

    /// Whether resource `etcd` (or the gate) holds the write `seq` of `h`.
    fn applied(&self, etcd: bool, h: &str, seq: u64) -> bool {
        let set = if etcd {
            &self.applied.0
        } else {
            &self.applied.1
        };
        set.contains(&(h, seq))
    }
}

/// The first accepted write of a token above T, in either resource: gate
/// accept times, and the send times of acknowledged etcd writes (the
/// commit came after the send).
struct FirstAbove {
    /// (token, time), by token.
    firsts: Vec<(u64, u64)>,
    /// Suffix minimum of the time.
    suffix: Vec<u64>,
}

impl FirstAbove {
    fn new(h: &History<'_>) -> FirstAbove {
        let mut firsts: Vec<(u64, u64)> = h.gate_accepts.iter().map(|a| (a.token, a.t)).collect();
        firsts.extend(
            h.writes
                .iter()
                .filter(|w| w.etcd && w.out == "ok")
                .map(|w| (w.token, w.sent)),
        );
        firsts.sort_unstable();
        let mut suffix = vec![u64::MAX; firsts.len() + 1];
        for i in (0..firsts.len()).rev() {
            suffix[i] = suffix[i + 1].min(firsts[i].1);
        }
        FirstAbove { firsts, suffix }
    }

    fn after(&self, token: u64) -> Option<u64> {
        let i = self.firsts.partition_point(|(t, _)| *t <= token);
        (self.suffix[i] != u64::MAX).then_some(self.suffix[i])
    }
}

// --- one function per invariant -------------------------------------------

fn check_one(records: &[Value]) -> Report {
    let h = History::read(records);
    let first_above = FirstAbove::new(&h);
    let mut r = Report::default();
    counts(&h, &mut r);
    g2_no_lower_token_accepted(&h, &mut r);
    g4_no_permit_at_deadline(&h, &mut r);
    writes_kept_and_refused(&h, &mut r);
    paused_writes_refused(&h, &first_above, &mut r);
    g1_fence_before_successor(&h, &first_above, &mut r);
    g3_tokens_increase(&h, &mut r);
    liveness_after_heals(&h, &mut r);
    liveness_no_long_drain(&h, &mut r);
    liveness_at_the_end(&h, &mut r);
    if h.election {
        e1_one_leader_at_a_time(&h, &mut r);
        e2_observed_tokens_rise(&h, &mut r);
    }
    r
}

/// What happened, counted.
fn counts(h: &History<'_>, r: &mut Report) {
    r.faults = h.faults.clone();
    r.permits = h.permits.len() as u64;
    r.fences = h.fences.len() as u64;
    r.acquisitions = h.acquired.len() as u64;
    r.resumes = h
        .states
        .iter()
        .filter(|c| c.from == "draining" && c.to == "holding")
        .count() as u64;
    r.refused.1 = h.gate_refused;
    r.election = h.election;
    r.postgres = h.postgres || h.writes.iter().any(|w| s(w.v, "res") == "pg");
    r.observed = (
        h.observed.len() as u64,
        h.observed.iter().filter(|o| o.1 == "leader").count() as u64,
    );
    r.proclaims = h.proclaims;
    let fence_of = h.fence_of();
    r.late_accepted = h
        .gate_accepts
        .iter()
        .filter(|a| fence_of.get(&a.token).is_some_and(|f| a.t > f.at))
        .count() as u64;
}

/// G2: no resource accepts a token lower than one it accepted before.
fn g2_no_lower_token_accepted(h: &History<'_>, r: &mut Report) {
    let store = if h.postgres { "app.writes" } else { "etcd" };
    for (res, list) in [("gate", &h.gate_accepts), (store, &h.etcd_puts)] {
        let mut hi = 0u64;
        for a in list {
            if a.token < hi {
                r.violate(
                    "G2 no lower token accepted",
                    format!("{res} accepted token {} after token {hi}: {}", a.token, a.v),
                );
            }
            hi = hi.max(a.token);
        }
    }
}

/// G4: no permit granted at or after its deadline.
fn g4_no_permit_at_deadline(h: &History<'_>, r: &mut Report) {
    for p in h.permits.iter().filter(|p| p.t0 >= p.deadline) {
        r.violate(
            "G4 no permit at/after deadline",
            format!(
                "{}: permit asked at {} ns, deadline {}: {}",
                p.p, p.t0, p.deadline, p.v
            ),
        );
    }
}

/// Every acknowledged write is in its resource, none reported refused is;
/// writes of unknown outcome are counted apart.
fn writes_kept_and_refused(h: &History<'_>, r: &mut Report) {
    for w in &h.writes {
        let here = h.applied(w.etcd, w.p, w.seq);
        match w.out {
            "ok" => {
                bump(&mut r.accepted, w.etcd);
                if !here {
                    r.violate(
                        "acknowledged writes kept",
                        format!("{}: acknowledged, not in the resource: {}", w.p, w.v),
                    );
                }
            }
            "fenced" | "refused" => {
                if w.etcd {
                    r.refused.0 += 1;
                }
                if here {
                    r.violate(
                        "refused writes not applied",
                        format!("{}: reported refused, applied: {}", w.p, w.v),
                    );
                }
            }
            "unknown" => {
                bump(&mut r.unknown, w.etcd);
                if here {
                    bump(&mut r.unknown_committed, w.etcd);
                }
            }
            _ => {}
        }
    }
}

/// Adds one to the etcd or the gate count of `pair`.
fn bump(pair: &mut (u64, u64), etcd: bool) {
    if etcd {
        pair.0 += 1;
    } else {
        pair.1 += 1;
    }
}

/// G2 for a paused holder: the writes it sends after it resumes, with a
/// permit from before the pause, once a higher token's write was accepted,
/// are counted, and each must be refused.
fn paused_writes_refused(h: &History<'_>, first_above: &FirstAbove, r: &mut Report) {
    for w in &h.writes {
        let after_pause = h
            .paused
            .iter()
            .any(|p| p.who == w.p && w.permit_t0 < p.from && w.sent > p.to);
        if after_pause && first_above.after(w.token).is_some_and(|t| t < w.sent) {
            r.paused_writes.0 += 1;
            if !h.applied(w.etcd, w.p, w.seq) {
                r.paused_writes.1 += 1;
            }
        }
    }
}

/// G1: every fence of a token comes before the first write accepted from a
/// higher token (a gap an operator, a pause or a kill explains is reported,
/// not a violation), and a superseded token is fenced.
fn g1_fence_before_successor(h: &History<'_>, first_above: &FirstAbove, r: &mut Report) {
    let fence_reason: HashMap<(&str, u64), &str> = h
        .states
        .iter()
        .filter(|c| c.to == "fenced")
        .map(|c| ((c.p, c.at), c.reason))
        .collect();
    for f in &h.fences {
        let Some(next) = first_above.after(f.token) else {
            continue;
        };
        let lead = ms(f.at, next);
        if lead > 0.0 {
            r.min_lead_ms = Some(r.min_lead_ms.map_or(lead, |m: f64| m.min(lead)));
            continue;
        }
        // A revoked lease deletes the session's keys with it: a lock may
        // learn it from its key's delete (lock_lost) before the keepalive
        // says the lease is gone (lease_lost).
        let revoked = matches!(
            fence_reason.get(&(f.p, f.at)),
            Some(&"lease_lost" | &"lock_lost")
        ) && h.revokes.iter().any(|&t| t <= f.at && f.at <= t + h.ttl_ns);
        let why = if h.operator.contains(&f.token) || revoked {
            Some("operator")
        } else if h.was_paused(f.p, next.saturating_sub(h.ttl_ns), f.at) {
            Some("holder paused")
        } else {
            None
        };
        match why {
            Some(w) => {
                let g = r.gaps.entry(w.to_owned()).or_insert((0, 0.0));
                g.0 += 1;
                g.1 = g.1.min(lead);
            }
            None => r.violate(
                "G1 fence before successor",
                format!(
                    "{}: fence of {} at {}, a higher token's write accepted {lead:.1} ms before",
                    f.p, f.token, f.at
                ),
            ),
        }
    }
    let fence_of = h.fence_of();
    for a in &h.acquired {
        if fence_of.contains_key(&a.token) || first_above.after(a.token).is_none() {
            continue;
        }
        if h.killed.contains(a.p) {
            r.gaps.entry("holder killed".into()).or_insert((0, 0.0)).0 += 1;
            continue;
        }
        r.violate(
            "G1 fence before successor",
            format!("{}: token {} superseded and never fenced", a.p, a.token),
        );
    }
}

/// G3: tokens strictly increase across acquisitions: no token twice, and
/// none lower than a token fenced before it was acquired.
fn g3_tokens_increase(h: &History<'_>, r: &mut Report) {
    let mut seen: HashMap<u64, &str> = HashMap::new();
    for a in &h.acquired {
        if let Some(other) = seen.insert(a.token, a.p) {
            r.violate(
                "G3 tokens increase",
                format!("token {} acquired by {other} and {}", a.token, a.p),
            );
        }
    }
    let fence_of = h.fence_of();
    for a in &h.acquired {
        let Some(f) = fence_of.get(&a.token) else {
            continue;
        };
        for b in h
            .acquired
            .iter()
            .filter(|b| b.token < a.token && b.at > f.at)
        {
            r.violate(
                "G3 tokens increase",
                format!(
                    "{} acquired {} after {} was fenced with {}",
                    b.p, b.token, a.p, a.token
                ),
            );
        }
    }
}

/// Liveness: after each heal the lock is held again (a gate accept of a
/// live token, or a holder entering Holding) within TTL + 2 s, unless the
/// next fault cut the heal's window short.
fn liveness_after_heals(h: &History<'_>, r: &mut Report) {
    let fence_of = h.fence_of();
    // A late unit of a token already fenced proves nobody holds.
    let mut work: Vec<u64> = h
        .gate_accepts
        .iter()
        .filter(|a| fence_of.get(&a.token).is_none_or(|f| a.t <= f.at))
        .map(|a| a.t)
        .chain(h.states.iter().filter(|c| c.to == "holding").map(|c| c.at))
        .chain(h.register_ok.iter().copied())
        .collect();
    work.sort_unstable();
    let bound = h.ttl_ns + 2_000_000_000;
    for &heal in &h.heals {
        r.heals += 1;
        let i = work.partition_point(|&t| t < heal);
        match work.get(i) {
            Some(&t) if t - heal <= bound => {
                let d = ms(heal, t);
                r.max_heal_ms = Some(r.max_heal_ms.map_or(d, |m: f64| m.max(d)));
            }
            other => {
                // The next fault began inside the bound, before the lock was
                // held again (a killed holder's lease still running out,
                // say): the heal proves nothing either way.
                let next = h.faults_at.iter().copied().filter(|&f| f > heal).min();
                if next.is_some_and(|f| f - heal <= bound && other.is_none_or(|&t| t > f)) {
                    continue;
                }
                r.violate(
                    "liveness",
                    format!(
                        "heal at {heal}: held again {:?} ms later (bound TTL + 2 s)",
                        other.map(|&t| ms(heal, t))
                    ),
                )
            }
        }
    }
}

/// Liveness: no holder drains longer than TTL + 1 s unless paused.
fn liveness_no_long_drain(h: &History<'_>, r: &mut Report) {
    let mut draining: HashMap<&str, u64> = HashMap::new();
    for c in &h.states {
        if let Some(from) = draining.remove(c.p) {
            if c.at - from > h.ttl_ns + 1_000_000_000 && !h.was_paused(c.p, from, c.at) {
                r.violate(
                    "liveness",
                    format!("{} drained {:.0} ms", c.p, ms(from, c.at)),
                );
            }
        }
        if c.to == "draining" {
            draining.insert(c.p, c.at);
        }
    }
}

/// Liveness: at the end exactly one holder holds and none drains.
fn liveness_at_the_end(h: &History<'_>, r: &mut Report) {
    if h.finals.is_empty() {
        return;
    }
    let n = |state: &str| h.finals.values().filter(|s| **s == state).count();
    let (holding, drain) = (n("holding"), n("draining"));
    // Read/write mode: readers share, so at least one holds; or none, the
    // finals taken in a handover: a holder let go (`release`) less than a
    // TTL before them and nobody entered Holding since.
    let handover = || {
        let end = h.first_final.unwrap_or(0);
        h.releases.iter().any(|&t| {
            t <= end
                && end - t <= h.ttl_ns
                && !h.states.iter().any(|c| c.to == "holding" && c.at > t)
        })
    };
    let held = if h.rwlock {
        holding >= 1 || handover()
    } else {
        holding == 1
    };
    if !held || drain != 0 {
        r.violate(
            "liveness",
            format!("at the end {holding} holders hold and {drain} drain (want 1 and 0)"),
        );
    }
}

/// E1: one leader at a time. A leader believes it leads until its
/// permits' deadlines (the core's, a margin before its lease can expire),
/// so every permit of a token must end before a higher token is elected
/// (its `acquired`): no two candidates believe they lead at once. A token
/// whose lease an operator revoked or whose key it deleted is exempt (the
/// next one is elected at once, by design). Pauses are not: a paused
/// leader's deadlines do not move.
fn e1_one_leader_at_a_time(h: &History<'_>, r: &mut Report) {
    let mut last_deadline: BTreeMap<u64, (u64, &str)> = BTreeMap::new();
    for p in &h.permits {
        let e = last_deadline.entry(u(p.v, "token")).or_insert((0, p.p));
        if p.deadline > e.0 {
            *e = (p.deadline, p.p);
        }
    }
    let revoked = |tok: u64| h.operator.contains(&tok);
    for a in &h.acquired {
        // The latest deadline of any lower token that no operator cut.
        let Some((&tok, &(deadline, who))) = last_deadline
            .range(..a.token)
            .filter(|(t, _)| !revoked(**t))
            .max_by_key(|(_, d)| d.0)
        else {
            continue;
        };
        let lead = ms(deadline, a.at);
        if lead >= 0.0 {
            r.min_handover_ms = Some(r.min_handover_ms.map_or(lead, |m: f64| m.min(lead)));
        } else {
            r.violate(
                "E1 one leader at a time",
                format!(
                    "{} elected with {} at {}, {:.1} ms before the deadline of a permit of {tok} ({who})",
                    a.p, a.token, a.at, -lead
                ),
            );
        }
    }
}

/// S1 (semaphore mode): at no instant more than N holders with valid
/// permits. A permit is valid from its `t0` until its deadline, or its
/// token's fence if that comes first (the core's own bound, on the one
/// clock: stricter than the permit's end). A holder's intervals are merged
/// (one holder holds one slot); the most holders whose intervals cover one
/// instant must be ≤ N. A token whose lease an operator revoked or whose
/// key it deleted is exempt, as in E1 (the slot is handed on at once, by
/// design); pauses are not (a paused holder's deadlines do not move).
fn s1_at_most_n_valid_holders(records: &[Value], limit: u64, r: &mut Report) {
    r.semaphore = Some(limit);
    let slot = |v: &Value| v["li"].as_u64();
    let operator: HashSet<(Option<u64>, u64)> = records
        .iter()
        .filter(|v| {
            s(v, "p") == "nemesis" && matches!(s(v, "kind"), "lease_revoked" | "key_deleted")
        })
        .filter(|v| s(v, "ev") == "fault")
        .map(|v| (slot(v), u(v, "token")))
        .collect();
    let fences: HashMap<(&str, Option<u64>, u64), u64> = records
        .iter()
        .filter(|v| s(v, "ev") == "fence")
        .map(|v| ((s(v, "p"), slot(v), u(v, "token")), u(v, "at")))
        .collect();
    // Each holder's valid intervals, merged.
    let mut by_holder: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for v in records.iter().filter(|v| s(v, "ev") == "permit") {
        let (p, li, token) = (s(v, "p"), slot(v), u(v, "token"));
        if operator.contains(&(li, token)) {
            continue;
        }
        let end = fences
            .get(&(p, li, token))
            .map_or(u(v, "deadline"), |&f| f.min(u(v, "deadline")));
        by_holder.entry(p).or_default().push((u(v, "t0"), end));
    }
    // A holder without permits (`dlock run`: its command knows no
    // deadline) counts from its command's start to its last write of a
    // token: a lower bound of that hold, so an overlap found is real.
    let with_permits: HashSet<&str> = by_holder.keys().copied().collect();
    let mut work: BTreeMap<(&str, Option<u64>, u64), (u64, u64)> = BTreeMap::new();
    for v in records.iter().filter(|v| !with_permits.contains(s(v, "p"))) {
        let at = match s(v, "ev") {
            "child_started" => u(v, "at"),
            "write" => u(v, "sent"),
            _ => continue,
        };
        let e = work
            .entry((s(v, "p"), slot(v), u(v, "token")))
            .or_insert((at, at));
        (e.0, e.1) = (e.0.min(at), e.1.max(at));
    }
    // A pause stops `dlock run` alone (SIGSTOP to its pid), not its
    // command's group, which works on unfenced: a hold across a pause of
    // its holder is not checked (the gate's G checks still are).
    let paused: Vec<(&str, u64)> = records
        .iter()
        .filter(|v| s(v, "p") == "nemesis" && s(v, "ev") == "fault")
        .filter(|v| s(v, "kind").starts_with("pause_"))
        .map(|v| (s(v, "target"), u(v, "t")))
        .collect();
    for ((p, li, token), (a, b)) in work {
        let across_pause = paused.iter().any(|&(who, t)| who == p && a <= t && t <= b);
        if !operator.contains(&(li, token)) && !across_pause {
            by_holder.entry(p).or_default().push((a, b + 1));
        }
    }
    let mut edges: Vec<(u64, i64, &str)> = Vec::new();
    for (p, mut iv) in by_holder {
        iv.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (a, b) in iv {
            match merged.last_mut() {
                Some(last) if a <= last.1 => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        for (a, b) in merged.into_iter().filter(|(a, b)| a < b) {
            edges.push((a, 1, p));
            edges.push((b, -1, p));
        }
    }
    // Ends before starts at one instant: an interval is half-open.
    edges.sort_unstable_by_key(|&(t, d, _)| (t, d));
    let mut live: BTreeMap<&str, ()> = BTreeMap::new();
    for (t, d, p) in edges {
        if d < 0 {
            live.remove(p);
            continue;
        }
        live.insert(p, ());
        let n = live.len() as u64;
        r.max_valid_holders = r.max_valid_holders.max(n);
        if n > limit {
            let who: Vec<&str> = live.keys().copied().collect();
            r.violate(
                "S1 at most N holders with valid permits",
                format!("at {t}: {n} holders with valid permits, limit {limit}: {who:?}"),
            );
        }
    }
}

/// A register value `<token>.<seq>` as (token, seq); (0, 0) is unwritten.
fn rw_value(v: &Value, k: &str) -> (u64, u64) {
    let (t, q) = s(v, k).split_once('.').unwrap_or(("0", "0"));
    (t.parse().unwrap_or(0), q.parse().unwrap_or(0))
}

fn rw_counts(records: &[Value], r: &mut Report) {
    r.rwlock = true;
    for v in records {
        match s(v, "ev") {
            "rw_read" => r.rw_ops.0 += 1,
            "rw_write" => r.rw_ops.1 += 1,
            "rw_refuse" => r.rw_ops.2 += 1,
            _ => {}
        }
    }
}

/// RW1: an admitted read sees both keys from one write (a writer and a
/// reader, or two writers, admitted at once would tear the pair).
fn rw1_no_torn_read(records: &[Value], r: &mut Report) {
    for v in records.iter().filter(|v| s(v, "ev") == "rw_read") {
        if rw_value(v, "a") != rw_value(v, "b") {
            r.violate(
                "RW1 no torn read",
                format!(
                    "{} token {} read a={} b={}",
                    s(v, "h"),
                    u(v, "token"),
                    s(v, "a"),
                    s(v, "b")
                ),
            );
        }
    }
}

/// RW2: a read returns at least the value of the last admitted write of a
/// lower token that completed (`t`) before the read started (`t0`). (A
/// write of a higher token may legitimately come after a stale read: the
/// read is linearised first, design §15.)
fn rw2_no_read_older_than_a_lower_write(records: &[Value], r: &mut Report) {
    let writes: Vec<&Value> = records
        .iter()
        .filter(|v| s(v, "ev") == "rw_write")
        .collect();
    for rd in records.iter().filter(|v| s(v, "ev") == "rw_read") {
        let (token, start) = (u(rd, "token"), u(rd, "t0"));
        let last = writes
            .iter()
            .filter(|w| u(w, "token") < token && u(w, "t") < start)
            .max_by_key(|w| u(w, "t"));
        let Some(w) = last else { continue };
        let wrote = (u(w, "token"), u(w, "seq"));
        let seen = rw_value(rd, "a").min(rw_value(rd, "b"));
        if seen < wrote {
            r.violate(
                "RW2 no read older than a lower write before it",
                format!(
                    "{} token {} read {}.{} after {} wrote {}.{} ({:.1} ms before the read)",
                    s(rd, "h"),
                    token,
                    seen.0,
                    seen.1,
                    s(w, "h"),
                    wrote.0,
                    wrote.1,
                    ms(u(w, "t"), start)
                ),
            );
        }
    }
}

/// RW3: in the gate's decision order (`dn`), W and R never decrease.
/// Only the gate's decisions carry `dn` and the watermarks: the records
/// without `dn` (PostgreSQL's register, recorded by its holders: the
/// database keeps no watermarks, its guards check the lock rows) are
/// skipped.
fn rw3_watermarks_never_go_back(records: &[Value], r: &mut Report) {
    let mut ds: Vec<&Value> = records
        .iter()
        .filter(|v| s(v, "ev").starts_with("rw_") && v.get("dn").is_some())
        .collect();
    ds.sort_by_key(|v| u(v, "dn"));
    let mut prev = (0, 0, 0);
    for v in ds {
        let (w, rd) = (u(v, "wm_w"), u(v, "wm_r"));
        if w < prev.0 || rd < prev.1 {
            r.violate(
                "RW3 watermarks never go back",
                format!(
                    "decision {}: W {} R {} after decision {}: W {} R {}",
                    u(v, "dn"),
                    w,
                    rd,
                    prev.2,
                    prev.0,
                    prev.1
                ),
            );
        }
        prev = (prev.0.max(w), prev.1.max(rd), u(v, "dn"));
    }
}

/// E2: the observer's leader tokens rise. A `leader` event names a higher
/// token than the one before (after `reconnecting` the same may repeat),
/// a `proclaimed` one the same; and its last event before the end names
/// the leader that holds at the end (never a leader already gone).
fn e2_observed_tokens_rise(h: &History<'_>, r: &mut Report) {
    let mut last: Option<u64> = None;
    let mut reconnected = false;
    for &(t, kind, token) in &h.observed {
        let bad = match kind {
            "leader" => last.is_some_and(|l| token < l || (token == l && !reconnected)),
            "proclaimed" => last != Some(token),
            _ => false,
        };
        if bad {
            r.violate(
                "E2 observed leader tokens rise",
                format!("observer at {t}: {kind} {token} after leader {last:?}"),
            );
        }
        match kind {
            "leader" | "proclaimed" => {
                last = Some(token);
                reconnected = false;
            }
            "reconnecting" => reconnected = true,
            _ => {}
        }
    }
    let holding: Vec<u64> = h
        .finals
        .iter()
        .filter(|(_, s)| **s == "holding")
        .filter_map(|(p, _)| h.final_tokens.get(p).copied())
        .collect();
    let seen = h.observed.last().map(|o| (o.1, o.2));
    if let ([tok], Some((kind, token))) = (holding.as_slice(), seen) {
        if !matches!(kind, "leader" | "proclaimed") || token != *tok {
            r.violate(
                "E2 observed leader tokens rise",
                format!("the observer's last report is {kind} {token}; {tok} holds at the end"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A clean history: `a` holds token 10 and writes; it is fenced at
    /// 1000; `b` acquires 12 at 1100 and writes from 1200. Times in ns.
    fn clean() -> Vec<Value> {
        vec![
            json!({"t": 1, "p": "a", "ev": "start", "ttl_ms": 4000}),
            json!({"t": 1, "p": "b", "ev": "start", "ttl_ms": 4000}),
            json!({"t": 10, "p": "a", "ev": "acquired", "at": 10, "token": 10}),
            json!({"t": 20, "p": "a", "ev": "permit", "t0": 20, "token": 10, "deadline": 900}),
            json!({"t": 30, "p": "a", "ev": "write", "res": "etcd", "token": 10, "seq": 1, "sent": 25, "out": "ok"}),
            json!({"t": 40, "p": "gate", "ev": "gate_accept", "h": "a", "token": 10, "seq": 1}),
            json!({"t": 41, "p": "a", "ev": "write", "res": "gate", "token": 10, "seq": 1, "sent": 35, "out": "ok"}),
            json!({"t": 1000, "p": "a", "ev": "fence", "at": 1000, "token": 10, "in_flight": 0}),
            json!({"t": 1100, "p": "b", "ev": "acquired", "at": 1100, "token": 12}),
            json!({"t": 1150, "p": "b", "ev": "permit", "t0": 1150, "token": 12, "deadline": 5000}),
            json!({"t": 1210, "p": "b", "ev": "write", "res": "etcd", "token": 12, "seq": 1, "sent": 1200, "out": "ok"}),
            json!({"t": 1300, "p": "gate", "ev": "gate_accept", "h": "b", "token": 12, "seq": 1}),
            json!({"t": 1301, "p": "b", "ev": "write", "res": "gate", "token": 12, "seq": 1, "sent": 1250, "out": "ok"}),
            json!({"t": 0, "p": "etcd", "ev": "etcd_put", "rev": 11, "h": "a", "seq": 1, "token": 10}),
            json!({"t": 0, "p": "etcd", "ev": "etcd_put", "rev": 13, "h": "b", "seq": 1, "token": 12}),
        ]
    }

    fn run(mut h: Vec<Value>) -> Report {
        h.sort_by_key(|v| v["t"].as_u64().unwrap_or(0));
        check(&h)
    }

    fn count(r: &Report, what: &str) -> usize {
        r.violations.get(what).map_or(0, Vec::len)
    }

    /// The clean history as an election with an observer that saw a, then
    /// b (who holds at the end).
    fn election() -> Vec<Value> {
        let mut h = clean();
        h[0]["election"] = true.into();
        h.push(json!({"t": 15, "p": "observer", "ev": "observed", "kind": "leader", "token": 10}));
        h.push(json!({"t": 500, "p": "a", "ev": "proclaim", "token": 10, "out": "ok"}));
        h.push(
            json!({"t": 510, "p": "observer", "ev": "observed", "kind": "proclaimed", "token": 10}),
        );
        h.push(
            json!({"t": 1120, "p": "observer", "ev": "observed", "kind": "leader", "token": 12}),
        );
        h.push(json!({"t": 3000, "p": "b", "ev": "final", "state": "holding", "token": 12}));
        h
    }

    #[test]
    fn e1_a_leader_elected_before_the_last_permit_ends_breaks() {
        let r = run(election());
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert!(r.table().contains("E1 one leader at a time"));
        assert_eq!(r.min_handover_ms, Some(ms(900, 1100)));
        assert_eq!(r.proclaims, (1, 0));
        let mut h = election();
        // a's permit runs to 1105: b elected at 1100 while a believes.
        h.push(
            json!({"t": 990, "p": "a", "ev": "permit", "t0": 990, "token": 10, "deadline": 1105}),
        );
        assert_eq!(count(&run(h.clone()), "E1 one leader at a time"), 1);
        // Unless an operator cut token 10 (its key deleted).
        h.push(
            json!({"t": 995, "p": "nemesis", "ev": "fault", "kind": "key_deleted", "token": 10}),
        );
        assert_eq!(count(&run(h), "E1 one leader at a time"), 0);
        // Not judged outside the election mode.
        let mut h = clean();
        h.push(
            json!({"t": 990, "p": "a", "ev": "permit", "t0": 990, "token": 10, "deadline": 1105}),
        );
        let r = run(h);
        assert_eq!(count(&r, "E1 one leader at a time"), 0);
        assert!(!r.table().contains("E1"));
    }

    #[test]
    fn e2_the_observer_never_goes_back_and_names_the_last_leader() {
        let mut h = election();
        h.push(
            json!({"t": 1130, "p": "observer", "ev": "observed", "kind": "leader", "token": 10}),
        );
        // Back to 10, and the last report is not the leader at the end.
        assert_eq!(count(&run(h), "E2 observed leader tokens rise"), 2);
        let mut h = election();
        h.push(
            json!({"t": 1130, "p": "observer", "ev": "observed", "kind": "no_leader", "token": 0}),
        );
        assert_eq!(count(&run(h), "E2 observed leader tokens rise"), 1);
        // The same leader again only after a reconnect.
        let mut h = election();
        h.push(
            json!({"t": 1130, "p": "observer", "ev": "observed", "kind": "leader", "token": 12}),
        );
        assert_eq!(count(&run(h), "E2 observed leader tokens rise"), 1);
        let mut h = election();
        h.push(json!({"t": 1125, "p": "observer", "ev": "observed", "kind": "reconnecting", "token": 0}));
        h.push(
            json!({"t": 1130, "p": "observer", "ev": "observed", "kind": "leader", "token": 12}),
        );
        assert_eq!(count(&run(h), "E2 observed leader tokens rise"), 0);
        // A proclaim names the leader it follows.
        let mut h = election();
        h.push(json!({"t": 1130, "p": "observer", "ev": "observed", "kind": "proclaimed", "token": 10}));
        assert_eq!(count(&run(h), "E2 observed leader tokens rise"), 2);
    }

    #[test]
    fn a_clean_history_passes() {
        let r = run(clean());
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!(r.accepted, (2, 2));
        assert_eq!(r.min_lead_ms, Some((1200.0 - 1000.0) / 1e6));
    }

    #[test]
    fn g1_a_successor_write_before_the_fence() {
        let mut h = clean();
        h.push(
            json!({"t": 900, "p": "gate", "ev": "gate_accept", "h": "b", "token": 12, "seq": 9}),
        );
        assert_eq!(count(&run(h), "G1 fence before successor"), 1);
    }

    #[test]
    fn g1_an_operator_gap_is_reported_not_a_violation() {
        let mut h = clean();
        h.push(
            json!({"t": 900, "p": "gate", "ev": "gate_accept", "h": "b", "token": 12, "seq": 9}),
        );
        h.push(
            json!({"t": 850, "p": "nemesis", "ev": "fault", "kind": "lease_revoked", "token": 10}),
        );
        let r = run(h);
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!(r.gaps["operator"].0, 1);
    }

    #[test]
    fn g1_a_superseded_token_never_fenced() {
        let h: Vec<Value> = clean().into_iter().filter(|v| v["ev"] != "fence").collect();
        assert_eq!(count(&run(h), "G1 fence before successor"), 1);
    }

    #[test]
    fn g2_a_lower_token_accepted() {
        let mut h = clean();
        h.push(
            json!({"t": 1400, "p": "gate", "ev": "gate_accept", "h": "a", "token": 10, "seq": 2}),
        );
        h.push(json!({"t": 0, "p": "etcd", "ev": "etcd_put", "rev": 14, "h": "a", "seq": 2, "token": 10}));
        assert_eq!(count(&run(h), "G2 no lower token accepted"), 2);
    }

    #[test]
    fn postgres_rows_are_the_stores_history() {
        // The clean history on PostgreSQL: the etcd key's place is taken
        // by app.writes (writes `res` `pg`, read back as `pg_row` by id).
        let pg = || {
            clean().into_iter().map(|mut v| {
                if v["res"] == "etcd" {
                    v["res"] = "pg".into();
                }
                if v["ev"] == "etcd_put" {
                    v["ev"] = "pg_row".into();
                    v["p"] = "postgres".into();
                }
                v
            })
        };
        let h: Vec<Value> = pg().collect();
        let r = run(h.clone());
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!(r.accepted, (2, 2));
        assert!(r.postgres && r.table().contains("writes accepted (postgres / gate)"));
        // A stale row committed after a higher token's (by id), and a
        // refused write whose row is there.
        let mut bad = h;
        bad.push(json!({"t": 1400, "p": "a", "ev": "write", "res": "pg", "token": 10, "seq": 2, "sent": 1390, "out": "fenced"}));
        bad.push(json!({"t": 0, "p": "postgres", "ev": "pg_row", "rev": 20, "h": "a", "seq": 2, "token": 10}));
        let r = run(bad);
        assert_eq!(count(&r, "G2 no lower token accepted"), 1);
        assert!(r.violations["G2 no lower token accepted"][0].starts_with("app.writes"));
        assert_eq!(count(&r, "refused writes not applied"), 1);
    }

    #[test]
    fn g3_one_token_twice_and_a_lower_one_later() {
        let mut h = clean();
        h.push(json!({"t": 1500, "p": "c", "ev": "acquired", "at": 1500, "token": 12}));
        h.push(json!({"t": 1600, "p": "c", "ev": "acquired", "at": 1600, "token": 8}));
        assert_eq!(count(&run(h), "G3 tokens increase"), 2);
    }

    #[test]
    fn g4_a_permit_at_its_deadline() {
        let mut h = clean();
        h.push(
            json!({"t": 901, "p": "a", "ev": "permit", "t0": 900, "token": 10, "deadline": 900}),
        );
        assert_eq!(count(&run(h), "G4 no permit at/after deadline"), 1);
    }

    #[test]
    fn writes_acknowledged_missing_refused_applied_and_unknown() {
        let mut h = clean();
        // Acknowledged by the gate's client, absent from the gate.
        h.push(json!({"t": 1310, "p": "b", "ev": "write", "res": "gate", "token": 12, "seq": 2, "sent": 1305, "out": "ok"}));
        // Reported fenced, yet in etcd's history.
        h.push(json!({"t": 1320, "p": "b", "ev": "write", "res": "etcd", "token": 12, "seq": 3, "sent": 1315, "out": "fenced"}));
        h.push(json!({"t": 0, "p": "etcd", "ev": "etcd_put", "rev": 15, "h": "b", "seq": 3, "token": 12}));
        // Unknown outcome, committed.
        h.push(json!({"t": 1330, "p": "b", "ev": "write", "res": "etcd", "token": 12, "seq": 4, "sent": 1325, "out": "unknown"}));
        h.push(json!({"t": 0, "p": "etcd", "ev": "etcd_put", "rev": 16, "h": "b", "seq": 4, "token": 12}));
        let r = run(h);
        assert_eq!(count(&r, "acknowledged writes kept"), 1);
        assert_eq!(count(&r, "refused writes not applied"), 1);
        assert_eq!((r.unknown.0, r.unknown_committed.0), (1, 1));
    }

    #[test]
    fn liveness_a_heal_with_no_work_after() {
        let mut h = clean();
        h.push(json!({"t": 2000, "p": "nemesis", "ev": "heal", "kind": "blackhole"}));
        assert_eq!(count(&run(h), "liveness"), 1);
        let mut h = clean();
        h.push(json!({"t": 1250, "p": "nemesis", "ev": "heal", "kind": "blackhole"}));
        assert_eq!(run(h).violation_count(), 0);
    }

    #[test]
    fn liveness_a_heal_cut_short_by_the_next_fault_proves_nothing() {
        let mut h = clean();
        h.push(json!({"t": 2000, "p": "nemesis", "ev": "heal", "kind": "holder_killed"}));
        h.push(json!({"t": 2500, "p": "nemesis", "ev": "fault", "kind": "quorum_lost"}));
        assert_eq!(count(&run(h), "liveness"), 0);
    }

    #[test]
    fn liveness_at_the_end_one_holder_holds() {
        let mut h = clean();
        h.push(json!({"t": 3000, "p": "a", "ev": "final", "state": "reacquiring"}));
        h.push(json!({"t": 3000, "p": "b", "ev": "final", "state": "holding"}));
        assert_eq!(run(h.clone()).violation_count(), 0);
        h.push(json!({"t": 3000, "p": "c", "ev": "final", "state": "draining"}));
        assert_eq!(count(&run(h), "liveness"), 1);
    }

    #[test]
    fn liveness_at_the_end_read_write_none_holds_only_in_a_handover() {
        let mut h = clean();
        h.push(json!({"t": 1, "p": "nemesis", "ev": "run", "rwlock": true}));
        h.push(json!({"t": 2000, "p": "b", "ev": "state", "at": 2000, "from": "holding", "to": "released", "reason": "release"}));
        h.push(json!({"t": 3000, "p": "a", "ev": "final", "state": "acquiring"}));
        h.push(json!({"t": 3000, "p": "b", "ev": "final", "state": "acquiring"}));
        assert_eq!(count(&run(h.clone()), "liveness"), 1, "nobody holds");
        let mut released = h.clone();
        released.push(json!({"t": 2001, "p": "b", "ev": "release", "token": 12, "mode": "w"}));
        assert_eq!(
            count(&run(released.clone()), "liveness"),
            0,
            "b handed over"
        );
        released.push(json!({"t": 2500, "p": "a", "ev": "state", "at": 2500, "from": "acquiring", "to": "holding", "reason": "acquired"}));
        assert_eq!(
            count(&run(released), "liveness"),
            1,
            "a held after the release, not at the end"
        );
        // A release more than a TTL (4 s) before the finals excuses nothing.
        for v in h.iter_mut().filter(|v| v["ev"] == "final") {
            v["t"] = 4_000_003_000u64.into();
        }
        h.push(json!({"t": 2001, "p": "b", "ev": "release", "token": 12, "mode": "w"}));
        assert_eq!(
            count(&run(h), "liveness"),
            1,
            "a release long before the end"
        );
    }

    #[test]
    fn a_paused_holders_late_writes_are_counted() {
        let mut h = clean();
        h.push(json!({"t": 500, "p": "a", "ev": "self_pause", "token": 10}));
        h.push(json!({"t": 1500, "p": "a", "ev": "self_resume", "token": 10}));
        h.push(json!({"t": 1510, "p": "a", "ev": "write", "res": "etcd", "token": 10, "seq": 2, "sent": 1505, "out": "fenced"}));
        h.push(json!({"t": 1520, "p": "gate", "ev": "gate_refuse", "h": "a", "token": 10, "seq": 2, "highest": 12}));
        h.push(json!({"t": 1521, "p": "a", "ev": "write", "res": "gate", "token": 10, "seq": 2, "sent": 1515, "out": "refused"}));
        let r = run(h);
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!(r.paused_writes, (2, 2));
        assert_eq!(r.refused, (1, 1));
    }

    #[test]
    fn many_locks_a_session_revoke_excuses_every_lock_of_it() {
        // The nemesis revoked lock 0's lease: the session's other keys went
        // with it, so lock 1's successor wrote before lock 1 saw its key
        // deleted (lock_lost). A gap an operator made, on every lock.
        let mut h: Vec<Value> = clean()
            .into_iter()
            .map(|mut v| {
                if v["ev"] != "start" {
                    v["li"] = 1.into();
                }
                v
            })
            .collect();
        h.push(json!({"t": 900, "p": "gate", "ev": "gate_accept", "h": "b", "token": 12, "seq": 9, "li": 1}));
        h.push(json!({"t": 1000, "p": "a", "ev": "state", "at": 1000, "from": "held", "to": "fenced", "reason": "lock_lost", "li": 1}));
        let mut revoke = json!({"t": 850, "p": "nemesis", "ev": "fault", "kind": "lease_revoked", "token": 99, "li": 0});
        let mut lock0_only = h.clone();
        lock0_only.push(revoke.clone());
        assert_eq!(count(&run(lock0_only), "G1 fence before successor"), 1);
        revoke["session"] = true.into();
        h.push(revoke);
        let r = run(h);
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!(r.gaps["operator"].0, 1);
    }

    #[test]
    fn many_locks_are_checked_each_on_its_own() {
        // Lock 0 and lock 1 each have the clean history (same tokens: each
        // lock has its own), and one stale accept breaks lock 1 alone.
        let tag = |li: u64| {
            clean().into_iter().map(move |mut v| {
                if v["ev"] != "start" {
                    v["li"] = li.into();
                }
                v
            })
        };
        let mut h: Vec<Value> = tag(0).chain(tag(1)).collect();
        let r = run(h.clone());
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!(r.accepted, (4, 4));
        h.push(json!({"t": 1400, "p": "gate", "ev": "gate_accept", "h": "a", "token": 10, "seq": 2, "li": 1}));
        let r = run(h);
        let g2 = &r.violations["G2 no lower token accepted"];
        assert_eq!(g2.len(), 1);
        assert!(g2[0].starts_with("lock 1:"), "{g2:?}");
    }

    /// A semaphore of limit 2: slot 0 the clean history (a, then b), slot
    /// 1 the same with holders c, then d. The `start` records carry the
    /// limit.
    fn semaphore() -> Vec<Value> {
        let slot = |li: u64, rename: &'static [(&'static str, &'static str)]| {
            clean().into_iter().map(move |mut v| {
                for key in ["p", "h"] {
                    if let Some(to) = rename.iter().find(|(from, _)| v[key] == *from) {
                        v[key] = to.1.into();
                    }
                }
                if v["ev"] == "start" {
                    v["semaphore"] = 2.into();
                } else {
                    v["li"] = li.into();
                }
                v
            })
        };
        slot(0, &[])
            .chain(slot(1, &[("a", "c"), ("b", "d")]))
            .collect()
    }

    #[test]
    fn s1_more_holders_with_valid_permits_than_the_limit_breaks() {
        let r = run(semaphore());
        assert_eq!(r.violation_count(), 0, "{}", r.table());
        assert_eq!((r.semaphore, r.max_valid_holders), (Some(2), 2));
        // A third holder's permit on slot 0 while b and d hold theirs.
        let mut h = semaphore();
        h.push(json!({"t": 1200, "p": "e", "ev": "permit", "t0": 1200, "token": 14, "deadline": 3000, "li": 0}));
        let r = run(h);
        assert_eq!(
            count(&r, "S1 at most N holders with valid permits"),
            1,
            "{}",
            r.table()
        );
        assert_eq!(r.max_valid_holders, 3);
    }

    /// A `dlock run` holder (no permits: its command's start and writes)
    /// counts in S1 from its command's start to its last write.
    #[test]
    fn s1_counts_a_dlock_run_holders_command_by_its_writes() {
        let mut h = semaphore();
        h.push(
            json!({"t": 1200, "p": "e", "ev": "child_started", "at": 1200, "token": 14, "li": 0}),
        );
        for sent in [1300, 1400] {
            h.push(json!({"t": sent, "p": "e", "ev": "write", "res": "gate", "token": 14, "seq": 1, "sent": sent, "out": "ok", "li": 0}));
        }
        let r = run(h.clone());
        assert_eq!(
            count(&r, "S1 at most N holders with valid permits"),
            1,
            "{}",
            r.table()
        );
        assert_eq!(r.max_valid_holders, 3);
        // A pause of e (its dlock alone stopped) exempts that hold.
        let mut paused = h.clone();
        paused.push(
            json!({"t": 1350, "p": "nemesis", "ev": "fault", "kind": "pause_long", "target": "e"}),
        );
        let r = run(paused);
        assert_eq!(
            count(&r, "S1 at most N holders with valid permits"),
            0,
            "{}",
            r.table()
        );
        // Its command started once b's and d's holds were over: no breach
        // (the gate never saw its writes: only S1 is read here).
        for v in h.iter_mut().filter(|v| v["p"] == "e") {
            for k in ["t", "at", "sent"] {
                if let Some(t) = v[k].as_u64() {
                    v[k] = (t + 10_000).into();
                }
            }
        }
        let r = run(h);
        assert_eq!(
            count(&r, "S1 at most N holders with valid permits"),
            0,
            "{}",
            r.table()
        );
    }

    #[test]
    fn s1_a_permit_is_valid_until_its_tokens_fence() {
        // a's permit runs to 5000 on paper, but a is fenced at 1000: from
        // then on it holds no valid permit, so b and d make 2, not 3.
        let mut h = semaphore();
        let permit = h
            .iter_mut()
            .find(|v| v["ev"] == "permit" && v["p"] == "a")
            .unwrap();
        permit["deadline"] = 5000.into();
        let r = run(h.clone());
        assert_eq!(
            count(&r, "S1 at most N holders with valid permits"),
            0,
            "{}",
            r.table()
        );
        // Without its fence it would be the third.
        h.retain(|v| !(v["ev"] == "fence" && v["p"] == "a"));
        let r = run(h);
        assert_eq!(
            count(&r, "S1 at most N holders with valid permits"),
            1,
            "{}",
            r.table()
        );
    }

    /// A clean register history: w1 (token 5) writes 5.1 over [10, 20],
    /// reader token 6 reads 5.1 over [30, 40], w2 (token 7) writes 7.1 over
    /// [50, 60]; a stale reader (token 6, refused below W 7) at 70.
    fn register() -> Vec<Value> {
        let rec = |t: u64, ev: &str, f: Value| {
            let mut v = json!({"t": t, "p": "gate", "ev": ev});
            v.as_object_mut()
                .unwrap()
                .extend(f.as_object().unwrap().clone());
            v
        };
        vec![
            rec(
                20,
                "rw_write",
                json!({"h": "w1", "token": 5, "seq": 1, "a": "5.1", "b": "5.1", "t0": 10, "wm_w": 5, "wm_r": 0, "dn": 0}),
            ),
            rec(
                40,
                "rw_read",
                json!({"h": "r1", "token": 6, "seq": 1, "a": "5.1", "b": "5.1", "t0": 30, "wm_w": 5, "wm_r": 6, "dn": 1}),
            ),
            rec(
                60,
                "rw_write",
                json!({"h": "w2", "token": 7, "seq": 1, "a": "7.1", "b": "7.1", "t0": 50, "wm_w": 7, "wm_r": 6, "dn": 2}),
            ),
            rec(
                70,
                "rw_refuse",
                json!({"h": "r1", "token": 6, "seq": 2, "mode": "r", "highest": 7, "t0": 70, "wm_w": 7, "wm_r": 6, "dn": 3}),
            ),
        ]
    }

    fn rw_violations(h: &[Value]) -> BTreeMap<&'static str, usize> {
        let r = check(h);
        assert!(r.rwlock);
        RWLOCK_INVARIANTS
            .iter()
            .map(|k| (*k, r.violations.get(k).map_or(0, Vec::len)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    #[test]
    fn a_clean_register_history_breaks_nothing() {
        assert!(rw_violations(&register()).is_empty());
        assert_eq!(check(&register()).rw_ops, (1, 2, 1));
    }

    #[test]
    fn rw1_finds_a_torn_read() {
        let mut h = register();
        h[1]["b"] = "4.9".into();
        assert_eq!(rw_violations(&h).get("RW1 no torn read"), Some(&1));
    }

    #[test]
    fn rw2_finds_a_read_older_than_a_lower_write_before_it() {
        let mut h = register();
        // A reader of token 8 that starts after w2 (token 7) finished but
        // sees w1's value.
        let mut late = h[1].clone();
        late["token"] = 8.into();
        late["t0"] = 65.into();
        late["t"] = 66.into();
        late["dn"] = 4.into();
        late["wm_r"] = 8.into();
        late["wm_w"] = 7.into();
        h.push(late.clone());
        let v = rw_violations(&h);
        assert_eq!(
            v.get("RW2 no read older than a lower write before it"),
            Some(&1)
        );
        // The same read started before w2 finished is not judged stale.
        let mut h = register();
        late["t0"] = 55.into();
        h.push(late);
        assert!(rw_violations(&h).is_empty());
    }

    #[test]
    fn rw3_finds_a_watermark_going_back() {
        let mut h = register();
        h[2]["wm_r"] = 5.into();
        assert_eq!(
            rw_violations(&h).get("RW3 watermarks never go back"),
            Some(&1)
        );
        let mut h = register();
        h[3]["wm_w"] = 6.into();
        assert_eq!(
            rw_violations(&h).get("RW3 watermarks never go back"),
            Some(&1)
        );
    }

    /// PostgreSQL's register: the holders record their own transactions
    /// (`p` the holder, no `dn` nor watermarks); RW1 and RW2 judge them as
    /// the gate's, RW3 has nothing to judge.
    fn pg_register() -> Vec<Value> {
        register()
            .into_iter()
            .map(|mut v| {
                let m = v.as_object_mut().unwrap();
                for k in ["dn", "wm_w", "wm_r"] {
                    m.remove(k);
                }
                let who = m["h"].clone();
                m.insert("p".into(), who);
                v
            })
            .collect()
    }

    #[test]
    fn a_postgres_register_history_is_judged_by_rw1_and_rw2() {
        let clean = pg_register();
        assert!(rw_violations(&clean).is_empty());
        assert_eq!(check(&clean).rw_ops, (1, 2, 1));
        // A torn read: a reader that saw key a before w2's commit and key
        // b after it.
        let mut torn = pg_register();
        let mut read = torn[1].clone();
        read["token"] = 8.into();
        read["t0"] = 55.into();
        read["t"] = 62.into();
        read["a"] = "5.1".into();
        read["b"] = "7.1".into();
        torn.push(read);
        let v = rw_violations(&torn);
        assert_eq!(v.get("RW1 no torn read"), Some(&1), "{v:?}");
        assert_eq!(v.len(), 1, "{v:?}");
    }
}
