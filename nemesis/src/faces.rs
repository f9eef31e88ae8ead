//! The history by face (the `face` of each holder's `start` record: rust,
//! c, python, node, run): what each face's holders did, and the smallest
//! G1 lead of each face's fences. It reads the same records as the checker
//! ([`crate::check`]) and judges nothing: the checker's verdict covers
//! every face at once; this table shows that every face took part and how
//! close each came.

use std::collections::{BTreeMap, HashMap};

use serde_json::Value;

/// One face's figures.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Face {
    /// Holder processes started.
    pub holders: u64,
    /// Acquisitions.
    pub acquisitions: u64,
    /// Fences.
    pub fences: u64,
    /// Permits recorded (`dlock run` records none: one permit spans its
    /// command's life).
    pub permits: u64,
    /// Writes acknowledged: (etcd, gate).
    pub accepted: (u64, u64),
    /// Writes refused as stale: (etcd, gate).
    pub refused: (u64, u64),
    /// Writes of unknown outcome: (etcd, gate).
    pub unknown: (u64, u64),
    /// Smallest G1 lead (ms): a fence of this face before the first
    /// accepted write of a higher token.
    pub min_lead_ms: Option<f64>,
    /// Fences after a higher token's first write (the checker judges
    /// them: gaps of a paused holder or an operator, or violations).
    pub late_fences: u64,
    /// `dlock run` only: smallest lead (ms) of "the command's process
    /// group is gone" over the first accepted write of a higher token.
    pub min_gone_lead_ms: Option<f64>,
    /// `dlock run` only: groups gone after a higher token's first write
    /// (an operator's revoke or delete frees the lock at once, and a
    /// stopped dlock cannot stop its group: the checker's gaps).
    pub late_gone: u64,
}

/// One lock's first accepted writes: (token, time) sorted by token, and
/// the suffix minimum of the times.
type Firsts = (Vec<(u64, u64)>, Vec<u64>);

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

fn min(a: Option<f64>, b: f64) -> Option<f64> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// The figures of every face of `records` (sorted by `t`, as
/// [`crate::history::read_dir`] gives them), by face name.
pub fn faces(records: &[Value]) -> BTreeMap<String, Face> {
    let face_of: HashMap<&str, &str> = records
        .iter()
        .filter(|v| s(v, "ev") == "start")
        .map(|v| (s(v, "p"), s(v, "face")))
        .collect();
    // Per lock (`li`; none in the one-lock mode): the first accepted write
    // of each token, gate accept times and send times of acknowledged etcd
    // writes, sorted by token, with a suffix minimum.
    let mut firsts: HashMap<Option<u64>, Vec<(u64, u64)>> = HashMap::new();
    for v in records {
        let li = v["li"].as_u64();
        match s(v, "ev") {
            "gate_accept" => firsts
                .entry(li)
                .or_default()
                .push((u(v, "token"), u(v, "t"))),
            "write" if s(v, "res") != "gate" && s(v, "out") == "ok" => firsts
                .entry(li)
                .or_default()
                .push((u(v, "token"), u(v, "sent"))),
            _ => {}
        }
    }
    let firsts: HashMap<Option<u64>, Firsts> = firsts
        .into_iter()
        .map(|(li, mut f)| {
            f.sort_unstable();
            let mut suffix = vec![u64::MAX; f.len() + 1];
            for i in (0..f.len()).rev() {
                suffix[i] = suffix[i + 1].min(f[i].1);
            }
            (li, (f, suffix))
        })
        .collect();
    let first_above = |li: Option<u64>, tok: u64| -> Option<u64> {
        let (f, suffix) = firsts.get(&li)?;
        let i = f.partition_point(|(t, _)| *t <= tok);
        (suffix[i] != u64::MAX).then_some(suffix[i])
    };
    let lead = |v: &Value| {
        first_above(v["li"].as_u64(), u(v, "token"))
            .map(|next| (next as f64 - u(v, "at") as f64) / 1e6)
    };
    let mut out: BTreeMap<String, Face> = BTreeMap::new();
    for v in records {
        let Some(face) = face_of.get(s(v, "p")) else {
            continue;
        };
        let f = out.entry((*face).to_owned()).or_default();
        let pair = |p: &mut (u64, u64), etcd: bool| {
            if etcd { p.0 += 1 } else { p.1 += 1 }
        };
        match s(v, "ev") {
            "start" => f.holders += 1,
            "acquired" => f.acquisitions += 1,
            "permit" => f.permits += 1,
            "fence" => {
                f.fences += 1;
                match lead(v) {
                    Some(l) if l > 0.0 => f.min_lead_ms = min(f.min_lead_ms, l),
                    Some(_) => f.late_fences += 1,
                    None => {}
                }
            }
            "group_gone" => match lead(v) {
                Some(l) if l > 0.0 => f.min_gone_lead_ms = min(f.min_gone_lead_ms, l),
                Some(_) => f.late_gone += 1,
                None => {}
            },
            "write" => {
                let etcd = s(v, "res") != "gate";
                match s(v, "out") {
                    "ok" => pair(&mut f.accepted, etcd),
                    "fenced" | "refused" => pair(&mut f.refused, etcd),
                    "unknown" => pair(&mut f.unknown, etcd),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    out
}

/// The table, one row per face.
pub fn table(faces: &BTreeMap<String, Face>) -> String {
    let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} ms"));
    let mut out = format!(
        "{:<7} {:>7} {:>5} {:>6} {:>8} {:>15} {:>13} {:>11} {:>12} {:>10}\n",
        "face",
        "holders",
        "acq",
        "fences",
        "permits",
        "accepted e / g",
        "refused e / g",
        "unknown e/g",
        "min G1 lead",
        "late fence"
    );
    for (name, f) in faces {
        out.push_str(&format!(
            "{:<7} {:>7} {:>5} {:>6} {:>8} {:>15} {:>13} {:>11} {:>12} {:>10}\n",
            name,
            f.holders,
            f.acquisitions,
            f.fences,
            f.permits,
            format!("{} / {}", f.accepted.0, f.accepted.1),
            format!("{} / {}", f.refused.0, f.refused.1),
            format!("{} / {}", f.unknown.0, f.unknown.1),
            ms(f.min_lead_ms),
            f.late_fences,
        ));
    }
    if let Some(f) = faces.get("run") {
        out.push_str(&format!(
            "run: smallest lead of the command's group gone over the next token's first write: {} ({} after it)\n",
            ms(f.min_gone_lead_ms),
            f.late_gone
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn leads_and_counts_go_to_the_fenced_holders_face() {
        let h = vec![
            json!({"t": 1, "p": "a", "ev": "start", "face": "python"}),
            json!({"t": 1, "p": "b", "ev": "start", "face": "run"}),
            json!({"t": 10, "p": "a", "ev": "acquired", "at": 10, "token": 10}),
            json!({"t": 20, "p": "a", "ev": "permit", "t0": 20, "token": 10, "deadline": 900}),
            json!({"t": 30, "p": "a", "ev": "write", "res": "etcd", "token": 10, "seq": 1, "sent": 25, "out": "ok"}),
            json!({"t": 40, "p": "gate", "ev": "gate_accept", "h": "a", "token": 10, "seq": 1}),
            json!({"t": 1000, "p": "a", "ev": "fence", "at": 1000, "token": 10, "in_flight": 0}),
            json!({"t": 1100, "p": "b", "ev": "acquired", "at": 1100, "token": 12}),
            json!({"t": 1210, "p": "b", "ev": "write", "res": "etcd", "token": 12, "seq": 1, "sent": 3_001_000, "out": "ok"}),
            json!({"t": 1300, "p": "gate", "ev": "gate_accept", "h": "b", "token": 12, "seq": 1}),
            json!({"t": 1301, "p": "b", "ev": "write", "res": "gate", "token": 12, "seq": 1, "sent": 1250, "out": "refused"}),
            json!({"t": 5000, "p": "b", "ev": "fence", "at": 5000, "token": 12, "in_flight": 1}),
            json!({"t": 5001, "p": "b", "ev": "group_gone", "at": 5001, "token": 12}),
            json!({"t": 6000, "p": "gate", "ev": "gate_accept", "h": "a", "token": 14, "seq": 2}),
        ];
        let f = faces(&h);
        let py = &f["python"];
        assert_eq!(
            (py.holders, py.acquisitions, py.fences, py.permits),
            (1, 1, 1, 1)
        );
        assert_eq!(py.accepted, (1, 0));
        // The first write above 10: the gate accept at 1300.
        assert_eq!(py.min_lead_ms, Some(300.0 / 1e6));
        let run = &f["run"];
        assert_eq!(run.refused, (0, 1));
        assert_eq!(run.min_lead_ms, Some(1000.0 / 1e6));
        assert_eq!(run.min_gone_lead_ms, Some(999.0 / 1e6));
        assert!(table(&f).contains("python"));
    }
}
