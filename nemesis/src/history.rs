//! The history: JSON lines, one file per process, every record stamped
//! `t` (nanoseconds of `CLOCK_BOOTTIME`, the clock dlock's deadlines are
//! on, which reads the same in every process of the machine) and `p` (who
//! wrote it).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::Mutex;

use serde_json::{Map, Value};

/// Now on the shared clock, in nanoseconds.
pub fn now() -> u64 {
    dlock::clock::system_now().as_nanos()
}

/// One process's history file: each record is one `write(2)` of one line
/// to a file opened for append, so a killed process loses nothing it
/// recorded.
pub struct Writer {
    who: String,
    file: Mutex<File>,
}

impl Writer {
    /// Opens (creates) `path` for appending records of `who`.
    pub fn open(path: &Path, who: &str) -> std::io::Result<Writer> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Writer {
            who: who.to_owned(),
            file: Mutex::new(file),
        })
    }

    /// Appends `{"t": now, "p": who, "ev": ev, ...fields}`.
    pub fn record(&self, ev: &str, fields: Value) {
        self.record_at(now(), ev, fields);
    }

    /// [`Writer::record`] stamped `t`.
    pub fn record_at(&self, t: u64, ev: &str, fields: Value) {
        let mut m = Map::new();
        m.insert("t".into(), t.into());
        m.insert("p".into(), self.who.clone().into());
        m.insert("ev".into(), ev.into());
        if let Value::Object(f) = fields {
            m.extend(f);
        }
        let mut line = Value::Object(m).to_string();
        line.push('\n');
        let mut f = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // A full disk loses the record; the checker then misses it (and
        // may flag what it cannot see), it never invents one.
        let _ = f.write_all(line.as_bytes());
    }
}

/// Every record of every `*.jsonl` file of `dir`, sorted by `t` (ties keep
/// each file's order).
pub fn read_dir(dir: &Path) -> std::io::Result<Vec<Value>> {
    let mut all = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    names.sort();
    for path in names {
        for (n, line) in BufReader::new(File::open(&path)?).lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            // A process killed in the middle of a write leaves a torn last
            // line: skip it, anything else is an error.
            match serde_json::from_str::<Value>(&line) {
                Ok(v) => all.push(v),
                Err(e) => eprintln!("{}:{}: skipped ({e}): {line}", path.display(), n + 1),
            }
        }
    }
    all.sort_by_key(|v| v["t"].as_u64().unwrap_or(0));
    Ok(all)
}
