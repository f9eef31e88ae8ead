//! One holder's network, with a switch to cut it: a link of the embedded
//! service, or (on etcd) a TCP relay in front of the first endpoint whose
//! bytes stop flowing while cut, as over a partition (held, delivered late).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use dlock::{Client, Error, EtcdConfig, MemoryBackend, MemoryService, Options};

pub enum Network {
    Memory(MemoryBackend),
    Relay(Arc<AtomicBool>),
}

impl Network {
    pub fn cut(&self) {
        match self {
            Network::Memory(link) => link.partition(),
            Network::Relay(cut) => cut.store(true, Ordering::Relaxed),
        }
    }

    pub fn heal(&self) {
        match self {
            Network::Memory(link) => link.heal(),
            Network::Relay(cut) => cut.store(false, Ordering::Relaxed),
        }
    }
}

/// Two clients of the same lock service: the first behind a network that
/// can be cut. etcd with `etcd` (the examples pass
/// `EtcdConfig::from_env()`: `DLOCK_ENDPOINTS` set), else the embedded
/// service.
pub fn clients(
    options: Options,
    etcd: Option<EtcdConfig>,
) -> Result<(Client, Network, Client, &'static str), Error> {
    match etcd {
        Some(config) => {
            let first = config.endpoints[0].clone();
            let (scheme, target) = match first.split_once("://") {
                Some((s, rest)) => (format!("{s}://"), rest.trim_end_matches('/').to_string()),
                None => (String::new(), first),
            };
            let cut = Arc::new(AtomicBool::new(false));
            let addr = relay(target, cut.clone())
                .map_err(|e| Error::Backend(format!("cannot start the relay: {e}")))?;
            let mut behind = config.clone();
            behind.endpoints = vec![format!("{scheme}{addr}")];
            let a = Client::etcd(behind, options.clone())?;
            let b = Client::etcd(config, options)?;
            Ok((a, Network::Relay(cut), b, "etcd"))
        }
        None => {
            let service = MemoryService::new();
            let link = service.link();
            let a = Client::new(link.clone(), options.clone())?;
            let b = Client::new(service.link(), options)?;
            Ok((a, Network::Memory(link), b, "embedded"))
        }
    }
}

fn relay(target: String, cut: Arc<AtomicBool>) -> std::io::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    thread::spawn(move || {
        for down in listener.incoming().flatten() {
            let Ok(up) = TcpStream::connect(&target) else {
                continue;
            };
            let (Ok(down2), Ok(up2)) = (down.try_clone(), up.try_clone()) else {
                continue;
            };
            for (from, to) in [(down, up), (up2, down2)] {
                let cut = cut.clone();
                thread::spawn(move || pump(from, to, &cut));
            }
        }
    });
    Ok(addr)
}

fn pump(mut from: TcpStream, mut to: TcpStream, cut: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while cut.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(10));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}
