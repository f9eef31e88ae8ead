//! The second fenced resource: a small TCP server behind a
//! [`dlock::FenceGate`], which refuses a token lower than the highest it
//! admitted (per lock). Protocol, one line each way: `<holder> <token>
//! <seq> [<lock index>]` → `ok` or `stale <highest>`. Every decision is recorded (`gate_accept`,
//! `gate_refuse`) under the gate's lock, so the records are in the order
//! the gate decided.
//!
//! The read/write mode's resource is a two-key register behind the same
//! gate's two watermarks ([`dlock::FenceGate::admit_write`] /
//! [`dlock::FenceGate::admit_read`]): `<holder> <token> <seq> w` writes
//! both keys (value `<token>.<seq>`) → `ok` or `stale <highest>`;
//! `<holder> <token> <seq> r` reads both → `ok <a> <b>` or `stale
//! <highest>`. The two keys are written (and read) one at a time, with the
//! gate's lock let go in between, so only the lock and the watermarks keep
//! a read from seeing a torn pair. Records: `rw_write` / `rw_read` with the
//! values, `t0` (request in) and `t` (done), and the watermarks `wm_w` /
//! `wm_r` after the decision; `rw_refuse` for a stale one.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::json;

use crate::history::{Writer, now};

/// A running gate.
pub struct Gate {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    gate: Mutex<dlock::FenceGate>,
    history: Writer,
    /// Time of the last accepted write or register operation (0: none yet).
    last_accept: AtomicU64,
    /// Who wrote it.
    last_holder: Mutex<Option<String>>,
    /// The read/write mode's register: keys a and b as (token, seq).
    register: Mutex<[(u64, u64); 2]>,
    /// Register decisions, numbered under the gate's lock (`dn`): the
    /// order the watermarks moved in, whatever order the records land in.
    decisions: AtomicU64,
}

impl Gate {
    /// Starts the gate on a free loopback port, recording to `history`.
    pub fn start(history: &Path) -> std::io::Result<Gate> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            gate: Mutex::new(dlock::FenceGate::new()),
            history: Writer::open(history, "gate")?,
            last_accept: AtomicU64::new(0),
            last_holder: Mutex::new(None),
            register: Mutex::new([(0, 0); 2]),
            decisions: AtomicU64::new(0),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("gate".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let s = s.clone();
                    std::thread::spawn(move || serve(conn, &s));
                }
            })?;
        Ok(Gate { addr, shared })
    }

    /// Where holders connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// When the gate last accepted a write (0: never).
    pub fn last_accept(&self) -> u64 {
        self.shared.last_accept.load(Ordering::Relaxed)
    }

    /// The holder of the last accepted write.
    pub fn last_holder(&self) -> Option<String> {
        self.shared
            .last_holder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn serve(conn: TcpStream, s: &Shared) {
    let _ = conn.set_nodelay(true);
    let Ok(mut out) = conn.try_clone() else {
        return;
    };
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let f: Vec<&str> = line.split_whitespace().collect();
        let num = |w: &str| w.parse::<u64>().ok();
        let parsed = match f.as_slice() {
            [h, t, q] => num(t).zip(num(q)).map(|(t, q)| (*h, t, q, None)),
            [h, t, q, i] => num(t)
                .zip(num(q))
                .zip(num(i))
                .map(|((t, q), i)| (*h, t, q, Some(i))),
            _ => None,
        };
        if let [h, t, q, m @ ("r" | "w")] = f.as_slice() {
            let reply = match num(t).zip(num(q)) {
                Some((token, seq)) => register(s, h, token, seq, *m == "w"),
                None => "error expected: <holder> <token> <seq> r|w\n".to_owned(),
            };
            if out.write_all(reply.as_bytes()).is_err() {
                return;
            }
            continue;
        }
        let reply = match parsed {
            None => "error expected: <holder> <token> <seq> [<lock index>]\n".to_owned(),
            Some((h, token, seq, li)) => {
                let g = s.gate.lock().unwrap_or_else(|e| e.into_inner());
                let t = now();
                let name = li.map_or_else(|| "nemesis".to_owned(), |i| format!("nemesis-{i}"));
                let mut fields = json!({"h": h, "token": token, "seq": seq});
                if let Some(i) = li {
                    fields["li"] = i.into();
                }
                match g.admit(&name, dlock::Token(token)) {
                    Ok(()) => {
                        s.history.record_at(t, "gate_accept", fields);
                        s.last_accept.store(t, Ordering::Relaxed);
                        *s.last_holder.lock().unwrap_or_else(|e| e.into_inner()) =
                            Some(h.to_owned());
                        "ok\n".to_owned()
                    }
                    Err(stale) => {
                        let highest = stale.highest.get();
                        fields["highest"] = highest.into();
                        s.history.record_at(t, "gate_refuse", fields);
                        format!("stale {highest}\n")
                    }
                }
            }
        };
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// One read or write of the two-key register, admitted by the gate's
/// read or write watermark (the register's name is `nemesis`).
fn register(s: &Shared, h: &str, token: u64, seq: u64, write: bool) -> String {
    let t0 = now();
    let admitted = {
        let g = s.gate.lock().unwrap_or_else(|e| e.into_inner());
        let r = if write {
            g.admit_write("nemesis", dlock::Token(token))
        } else {
            g.admit_read("nemesis", dlock::Token(token))
        };
        let (w, rd) = g.watermarks("nemesis");
        let dn = s.decisions.fetch_add(1, Ordering::Relaxed);
        (r, w.map_or(0, |t| t.get()), rd.map_or(0, |t| t.get()), dn)
    };
    let mode = if write { "w" } else { "r" };
    let (res, wm_w, wm_r, dn) = admitted;
    if let Err(stale) = res {
        let highest = stale.highest.get();
        s.history.record(
            "rw_refuse",
            json!({"h": h, "token": token, "seq": seq, "mode": mode, "highest": highest,
                   "t0": t0, "wm_w": wm_w, "wm_r": wm_r, "dn": dn}),
        );
        return format!("stale {highest}\n");
    }
    // Work, as an admitted `admit`: the driver's wait_for_work and target.
    s.last_accept.store(now(), Ordering::Relaxed);
    *s.last_holder.lock().unwrap_or_else(|e| e.into_inner()) = Some(h.to_owned());
    let mut pair = [(0, 0); 2];
    for (k, slot) in pair.iter_mut().enumerate() {
        // One key at a time, the lock let go in between: a second
        // admitted holder could interleave here (a torn pair).
        let mut reg = s.register.lock().unwrap_or_else(|e| e.into_inner());
        if write {
            reg[k] = (token, seq);
        }
        *slot = reg[k];
        drop(reg);
        std::thread::yield_now();
    }
    let val = |(t, q): (u64, u64)| format!("{t}.{q}");
    let ev = if write { "rw_write" } else { "rw_read" };
    s.history.record(
        ev,
        json!({"h": h, "token": token, "seq": seq, "a": val(pair[0]), "b": val(pair[1]),
               "t0": t0, "wm_w": wm_w, "wm_r": wm_r, "dn": dn}),
    );
    if write {
        "ok\n".to_owned()
    } else {
        format!("ok {} {}\n", val(pair[0]), val(pair[1]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(conn: &mut (TcpStream, BufReader<TcpStream>), line: &str) -> String {
        conn.0.write_all(line.as_bytes()).unwrap();
        let mut reply = String::new();
        conn.1.read_line(&mut reply).unwrap();
        reply
    }

    #[test]
    fn the_gate_refuses_a_lower_token_per_lock_and_records_in_order() {
        let dir =
            std::env::temp_dir().join(format!("nemesis-gate-{}-{}", std::process::id(), now()));
        std::fs::create_dir_all(&dir).unwrap();
        let g = Gate::start(&dir.join("gate.jsonl")).unwrap();
        let s = TcpStream::connect(g.addr()).unwrap();
        let mut c = (s.try_clone().unwrap(), BufReader::new(s));
        assert_eq!(ask(&mut c, "a 5 1\n"), "ok\n");
        assert_eq!(ask(&mut c, "b 7 1\n"), "ok\n");
        assert_eq!(ask(&mut c, "a 5 2\n"), "stale 7\n");
        assert_eq!(
            ask(&mut c, "a 5 3 0\n"),
            "ok\n",
            "lock 0 has its own highest"
        );
        assert!(ask(&mut c, "nonsense\n").starts_with("error"));
        assert_eq!(g.last_holder().as_deref(), Some("a"));
        let recs = crate::history::read_dir(&dir).unwrap();
        let evs: Vec<(&str, u64)> = recs
            .iter()
            .map(|v| (v["ev"].as_str().unwrap(), v["token"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            evs,
            [
                ("gate_accept", 5),
                ("gate_accept", 7),
                ("gate_refuse", 5),
                ("gate_accept", 5)
            ]
        );
        assert_eq!(recs[3]["li"], 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_register_admits_by_the_two_watermarks() {
        let dir = std::env::temp_dir().join(format!("nemesis-rw-{}-{}", std::process::id(), now()));
        std::fs::create_dir_all(&dir).unwrap();
        let g = Gate::start(&dir.join("gate.jsonl")).unwrap();
        let s = TcpStream::connect(g.addr()).unwrap();
        let mut c = (s.try_clone().unwrap(), BufReader::new(s));
        assert_eq!(ask(&mut c, "w 5 1 w\n"), "ok\n");
        assert_eq!(ask(&mut c, "r 6 1 r\n"), "ok 5.1 5.1\n");
        assert_eq!(ask(&mut c, "r 4 1 r\n"), "stale 5\n", "a read below W");
        assert_eq!(ask(&mut c, "r 5 2 r\n"), "ok 5.1 5.1\n", "a read at W");
        assert_eq!(ask(&mut c, "w 5 2 w\n"), "stale 6\n", "a write below R");
        assert_eq!(ask(&mut c, "w 7 1 w\n"), "ok\n");
        assert_eq!(g.last_holder().as_deref(), Some("w"), "a write is work");
        assert!(g.last_accept() > 0);
        let recs = crate::history::read_dir(&dir).unwrap();
        let evs: Vec<&str> = recs.iter().map(|v| v["ev"].as_str().unwrap()).collect();
        assert_eq!(
            evs,
            [
                "rw_write",
                "rw_read",
                "rw_refuse",
                "rw_read",
                "rw_refuse",
                "rw_write"
            ]
        );
        assert_eq!(
            (recs[5]["wm_w"].as_u64(), recs[5]["wm_r"].as_u64()),
            (Some(7), Some(6))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
