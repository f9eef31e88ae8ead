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
//!   reported refused is; writes of unknown outcome are counted apart.

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

impl Report {
    /// Total violations.
    pub fn violation_count(&self) -> usize {
        self.violations.values().map(Vec::len).sum()
    }

    fn violate(&mut self, what: &'static str, evidence: String) {
        self.violations.entry(what).or_default().push(evidence);
    }

    /// The table.
    pub fn table(&self) -> String {
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
            "writes accepted (etcd / gate)".into(),
            format!("{} / {}", self.accepted.0, self.accepted.1),
        ));
        rows.push((
            "stale writes refused (etcd / gate)".into(),
            format!("{} / {}", self.refused.0, self.refused.1),
        ));
        rows.push((
            "stale writes of a paused holder after resume (refused / sent)".into(),
            format!("{} / {}", self.paused_writes.1, self.paused_writes.0),
        ));
        rows.push((
            "writes of unknown outcome (etcd / gate)".into(),
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
        for inv in INVARIANTS {
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
    let mut locks: Vec<u64> = records.iter().filter_map(|v| v["li"].as_u64()).collect();
    locks.sort_unstable();
    locks.dedup();
    if locks.is_empty() {
        return check_one(records);
    }
    let shared = |v: &Value| {
        v.get("li").is_none()
            && (s(v, "p") == "nemesis"
                || matches!(s(v, "ev"), "start" | "self_pause" | "self_resume"))
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

fn check_one(records: &[Value]) -> Report {
    let mut r = Report::default();
    let ev = |e: &'static str| records.iter().filter(move |v| s(v, "ev") == e);
    let ttl_ns = ev("start").map(|v| u(v, "ttl_ms")).max().unwrap_or(4000) * 1_000_000;

    // --- the nemesis's own records --------------------------------------
    let mut operator: HashSet<u64> = HashSet::new();
    let mut killed: HashSet<String> = HashSet::new();
    // (holder, from, to): times a holder could not run.
    let mut paused: Vec<(String, u64, u64)> = Vec::new();
    let mut open_pause: HashMap<String, u64> = HashMap::new();
    let mut heals: Vec<u64> = Vec::new();
    let mut faults_at: Vec<u64> = Vec::new();
    // Times the operator revoked a lease: every lock of that session loses
    // its lease (reason lease_lost) at once.
    let mut revokes: Vec<u64> = Vec::new();
    for v in records {
        let (p, e, t) = (s(v, "p"), s(v, "ev"), u(v, "t"));
        match (p, e) {
            ("nemesis", "fault") => {
                *r.faults.entry(s(v, "kind").to_owned()).or_default() += 1;
                faults_at.push(t);
                match s(v, "kind") {
                    "lease_revoked" | "key_deleted" => {
                        operator.insert(u(v, "token"));
                        if s(v, "kind") == "lease_revoked" {
                            revokes.push(t);
                        }
                    }
                    "holder_killed" => {
                        killed.insert(s(v, "target").to_owned());
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
                    paused.push((who, from, t));
                }
            }
            ("nemesis", "heal") | ("nemesis", "settle") => heals.push(t),
            (_, "self_pause") => {
                open_pause.insert(p.to_owned(), t);
            }
            (_, "self_resume") => {
                if let Some(from) = open_pause.remove(p) {
                    paused.push((p.to_owned(), from, t));
                }
            }
            _ => {}
        }
    }
    // A pause never ended in the history lasts to its end.
    let last_t = records.iter().map(|v| u(v, "t")).max().unwrap_or(0);
    for (who, from) in open_pause {
        paused.push((who, from, last_t));
    }
    let was_paused = |who: &str, a: u64, b: u64| {
        paused
            .iter()
            .any(|(p, from, to)| p == who && *from <= b && *to >= a)
    };

    // --- the resources' histories ---------------------------------------
    let gate_accepts: Vec<&Value> = ev("gate_accept").collect();
    let mut etcd_puts: Vec<&Value> = ev("etcd_put").collect();
    etcd_puts.sort_by_key(|v| u(v, "rev"));
    let key = |v: &Value, h: &str| (h.to_owned(), u(v, "seq"));
    let gate_set: HashSet<(String, u64)> = gate_accepts.iter().map(|v| key(v, s(v, "h"))).collect();
    let etcd_set: HashSet<(String, u64)> = etcd_puts.iter().map(|v| key(v, s(v, "h"))).collect();
    r.refused.1 = ev("gate_refuse").count() as u64;
    for (res, list) in [("gate", &gate_accepts), ("etcd", &etcd_puts)] {
        let mut hi = 0u64;
        for v in list.iter() {
            let t = u(v, "token");
            if t < hi {
                r.violate(
                    "G2 no lower token accepted",
                    format!("{res} accepted token {t} after token {hi}: {v}"),
                );
            }
            hi = hi.max(t);
        }
    }

    // --- the holders' records -------------------------------------------
    // G4, acknowledged writes, unknown outcomes, paused holders' writes.
    let mut last_permit: HashMap<&str, u64> = HashMap::new(); // holder -> t0
    let mut after_pause: Vec<(&Value, bool)> = Vec::new();
    for v in records {
        let p = s(v, "p");
        match s(v, "ev") {
            "permit" => {
                r.permits += 1;
                last_permit.insert(p, u(v, "t0"));
                if u(v, "t0") >= u(v, "deadline") {
                    r.violate(
                        "G4 no permit at/after deadline",
                        format!(
                            "{p}: permit asked at {} ns, deadline {}: {v}",
                            u(v, "t0"),
                            u(v, "deadline")
                        ),
                    );
                }
            }
            "write" => {
                let etcd = s(v, "res") == "etcd";
                let present = if etcd { &etcd_set } else { &gate_set };
                let here = present.contains(&key(v, p));
                let (acc, unk, unk_c) = if etcd {
                    (
                        &mut r.accepted.0,
                        &mut r.unknown.0,
                        &mut r.unknown_committed.0,
                    )
                } else {
                    (
                        &mut r.accepted.1,
                        &mut r.unknown.1,
                        &mut r.unknown_committed.1,
                    )
                };
                match s(v, "out") {
                    "ok" => {
                        *acc += 1;
                        if !here {
                            r.violate(
                                "acknowledged writes kept",
                                format!("{p}: acknowledged, not in the resource: {v}"),
                            );
                        }
                    }
                    "fenced" | "refused" => {
                        if etcd {
                            r.refused.0 += 1;
                        }
                        if here {
                            r.violate(
                                "refused writes not applied",
                                format!("{p}: reported refused, applied: {v}"),
                            );
                        }
                    }
                    "unknown" => {
                        *unk += 1;
                        if here {
                            *unk_c += 1;
                        }
                    }
                    _ => {}
                }
                // Sent after a pause, with a permit from before it.
                let permit_t = last_permit.get(p).copied().unwrap_or(0);
                if paused
                    .iter()
                    .any(|(who, from, to)| who == p && permit_t < *from && u(v, "sent") > *to)
                {
                    after_pause.push((v, here));
                }
            }
            "state" if s(v, "from") == "draining" && s(v, "to") == "holding" => {
                r.resumes += 1;
            }
            _ => {}
        }
    }

    // G1, G3.
    let fences: Vec<&Value> = ev("fence").collect();
    r.fences = fences.len() as u64;
    let acquired: Vec<&Value> = ev("acquired").collect();
    r.acquisitions = acquired.len() as u64;
    let fence_reason: HashMap<(&str, u64), &str> = ev("state")
        .filter(|v| s(v, "to") == "fenced")
        .map(|v| ((s(v, "p"), u(v, "at")), s(v, "reason")))
        .collect();
    let fence_of: HashMap<u64, &Value> = fences.iter().map(|v| (u(v, "token"), *v)).collect();
    r.late_accepted = gate_accepts
        .iter()
        .filter(|v| {
            fence_of
                .get(&u(v, "token"))
                .is_some_and(|f| u(v, "t") > u(f, "at"))
        })
        .count() as u64;
    // The first accepted write of a token above T, in either resource: gate
    // accept times, and the send times of acknowledged etcd writes (the
    // commit came after the send).
    let mut firsts: Vec<(u64, u64)> = gate_accepts
        .iter()
        .map(|v| (u(v, "token"), u(v, "t")))
        .collect();
    firsts.extend(
        ev("write")
            .filter(|v| s(v, "res") == "etcd" && s(v, "out") == "ok")
            .map(|v| (u(v, "token"), u(v, "sent"))),
    );
    firsts.sort_unstable();
    // Suffix minimum of the time by token.
    let mut suffix = vec![u64::MAX; firsts.len() + 1];
    for i in (0..firsts.len()).rev() {
        suffix[i] = suffix[i + 1].min(firsts[i].1);
    }
    let first_above = |tok: u64| -> Option<u64> {
        let i = firsts.partition_point(|(t, _)| *t <= tok);
        (suffix[i] != u64::MAX).then_some(suffix[i])
    };
    // A paused holder's write is stale when a higher token's write was
    // accepted before it was sent.
    for (w, applied) in after_pause {
        if first_above(u(w, "token")).is_some_and(|t| t < u(w, "sent")) {
            r.paused_writes.0 += 1;
            if !applied {
                r.paused_writes.1 += 1;
            }
        }
    }
    for f in &fences {
        let (p, tok, at) = (s(f, "p"), u(f, "token"), u(f, "at"));
        let Some(next) = first_above(tok) else {
            continue;
        };
        let lead = ms(at, next);
        if lead > 0.0 {
            r.min_lead_ms = Some(r.min_lead_ms.map_or(lead, |m: f64| m.min(lead)));
            continue;
        }
        let revoked = fence_reason.get(&(p, at)) == Some(&"lease_lost")
            && revokes.iter().any(|&t| t <= at && at <= t + ttl_ns);
        let why = if operator.contains(&tok) || revoked {
            Some("operator")
        } else if was_paused(p, next.saturating_sub(ttl_ns), at) {
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
                format!("{p}: fence of {tok} at {at}, a higher token's write accepted {lead:.1} ms before"),
            ),
        }
    }
    let mut finals: HashMap<&str, &Value> = HashMap::new();
    for v in ev("final") {
        finals.insert(s(v, "p"), v);
    }
    for a in &acquired {
        let (p, tok) = (s(a, "p"), u(a, "token"));
        if fence_of.contains_key(&tok) || first_above(tok).is_none() {
            continue;
        }
        if killed.contains(p) {
            let g = r.gaps.entry("holder killed".into()).or_insert((0, 0.0));
            g.0 += 1;
            continue;
        }
        r.violate(
            "G1 fence before successor",
            format!("{p}: token {tok} superseded and never fenced"),
        );
    }
    let mut seen: HashMap<u64, &str> = HashMap::new();
    for a in &acquired {
        let (p, tok) = (s(a, "p"), u(a, "token"));
        if let Some(other) = seen.insert(tok, p) {
            r.violate(
                "G3 tokens increase",
                format!("token {tok} acquired by {other} and {p}"),
            );
        }
    }
    for a in &acquired {
        let Some(f) = fence_of.get(&u(a, "token")) else {
            continue;
        };
        for b in &acquired {
            if u(b, "token") < u(a, "token") && u(b, "at") > u(f, "at") {
                r.violate(
                    "G3 tokens increase",
                    format!(
                        "{} acquired {} after {} was fenced with {}",
                        s(b, "p"),
                        u(b, "token"),
                        s(a, "p"),
                        u(a, "token")
                    ),
                );
            }
        }
    }

    // Liveness.
    // Someone holds: a gate accept of a live token (not one already fenced:
    // a late unit proves nobody holds), or a holder entering Holding (its
    // first write may wait its turn among many locks).
    let mut work: Vec<u64> = gate_accepts
        .iter()
        .filter(|v| {
            fence_of
                .get(&u(v, "token"))
                .is_none_or(|f| u(v, "t") <= u(f, "at"))
        })
        .map(|v| u(v, "t"))
        .chain(
            ev("state")
                .filter(|v| s(v, "to") == "holding")
                .map(|v| u(v, "at")),
        )
        .collect();
    work.sort_unstable();
    let bound = ttl_ns + 2_000_000_000;
    for h in heals {
        r.heals += 1;
        let i = work.partition_point(|&t| t < h);
        match work.get(i) {
            Some(&t) if t - h <= bound => {
                let d = ms(h, t);
                r.max_heal_ms = Some(r.max_heal_ms.map_or(d, |m: f64| m.max(d)));
            }
            other => {
                // The next fault began inside the bound, before the lock was
                // held again: the heal's window was cut short (a killed
                // holder's lease still running out, say), so it proves
                // nothing either way.
                let next = faults_at.iter().copied().filter(|&f| f > h).min();
                if next.is_some_and(|f| f - h <= bound && other.is_none_or(|&t| t > f)) {
                    continue;
                }
                r.violate(
                    "liveness",
                    format!(
                        "heal at {h}: held again {:?} ms later (bound TTL + 2 s)",
                        other.map(|&t| ms(h, t))
                    ),
                )
            }
        }
    }
    let mut draining: HashMap<&str, u64> = HashMap::new();
    for v in ev("state") {
        let p = s(v, "p");
        if let Some(from) = draining.remove(p) {
            let to = u(v, "at");
            if to - from > ttl_ns + 1_000_000_000 && !was_paused(p, from, to) {
                r.violate("liveness", format!("{p} drained {:.0} ms", ms(from, to)));
            }
        }
        if s(v, "to") == "draining" {
            draining.insert(p, u(v, "at"));
        }
    }
    if !finals.is_empty() {
        let holding = finals
            .values()
            .filter(|v| s(v, "state") == "holding")
            .count();
        let drain = finals
            .values()
            .filter(|v| s(v, "state") == "draining")
            .count();
        if holding != 1 || drain != 0 {
            r.violate(
                "liveness",
                format!("at the end {holding} holders hold and {drain} drain (want 1 and 0)"),
            );
        }
    }
    r
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
}
