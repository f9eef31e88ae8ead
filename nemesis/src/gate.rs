//! The second fenced resource: a small TCP server behind a
//! [`dlock::FenceGate`], which refuses a token lower than the highest it
//! admitted (per lock). Protocol, one line each way: `<holder> <token>
//! <seq> [<lock index>]` → `ok` or `stale <highest>`. Every decision is recorded (`gate_accept`,
//! `gate_refuse`) under the gate's lock, so the records are in the order
//! the gate decided.

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
    /// Time of the last accepted write (0: none yet).
    last_accept: AtomicU64,
    /// Who wrote it.
    last_holder: Mutex<Option<String>>,
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
}
