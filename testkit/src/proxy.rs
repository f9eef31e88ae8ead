//! A TCP fault proxy: listens on a loopback port and forwards every
//! connection to one upstream (an etcd member). Its [`Mode`] can be switched
//! while connections are open, and [`Proxy::reset`] resets them, so a test
//! can cut a client off the way networks fail: silently, slowly, one way, or
//! abruptly.
//!
//! Each proxy runs on a current-thread tokio runtime of its own thread;
//! dropping the proxy closes the listener and every connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

/// What the proxy does with the bytes of open and new connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Forwards both ways.
    Pass,
    /// Holds bytes both ways (stops reading; connections stay open, new ones
    /// are accepted). Held bytes flow again when the mode changes.
    Blackhole,
    /// Forwards requests at once and replies `Duration` after they were
    /// read from the server.
    Delay(Duration),
    /// Forwards requests; discards replies.
    DropReplies,
}

/// One direction of a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Client to server: requests.
    Up,
    /// Server to client: replies.
    Down,
}

#[derive(Default)]
struct Counters {
    /// Connections currently open.
    open: AtomicUsize,
    /// Bytes delivered to the server.
    up: AtomicU64,
    /// Bytes delivered to the client.
    down: AtomicU64,
}

/// A running proxy. See the module documentation.
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    reset: watch::Sender<u64>,
    counters: Arc<Counters>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free loopback port, in [`Mode::Pass`].
    pub fn start(upstream: SocketAddr) -> Proxy {
        Proxy::start_on("127.0.0.1", upstream)
    }

    /// [`Proxy::start`] listening on the loopback address `ip` (any of
    /// 127/8): the proxy's own unit tests take one that no dlock client of
    /// the other tests dials, so a client still retrying a closed proxy's
    /// port cannot land in their counts.
    pub fn start_on(ip: &str, upstream: SocketAddr) -> Proxy {
        let std_listener = std::net::TcpListener::bind((ip, 0)).expect("bind proxy");
        std_listener.set_nonblocking(true).expect("nonblocking");
        let addr = std_listener.local_addr().expect("proxy address");
        let (mode, _) = watch::channel(Mode::Pass);
        let (reset, _) = watch::channel(0u64);
        let counters = Arc::new(Counters::default());
        let (stop, stopped) = oneshot::channel();
        let accept = Accept {
            upstream,
            mode: mode.clone(),
            reset: reset.clone(),
            counters: counters.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("proxy runtime");
                rt.block_on(async move {
                    let listener = TcpListener::from_std(std_listener).expect("proxy listener");
                    tokio::select! {
                        _ = stopped => {}
                        _ = accept.run(listener) => {}
                    }
                });
                // Dropping the runtime drops every connection task.
            })
            .expect("proxy thread");
        Proxy {
            addr,
            mode,
            reset,
            counters,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://` URL of [`Proxy::addr`], for an etcd endpoint list.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Switches every open and future connection to `mode`.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// Resets every connection open now, both ways (SO_LINGER 0, then
    /// close: the peers see RST). Later connections are served as usual.
    pub fn reset(&self) {
        self.reset.send_modify(|g| *g += 1);
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.counters.open.load(Ordering::Relaxed)
    }

    /// Bytes delivered so far: (to the server, to the client).
    pub fn bytes(&self) -> (u64, u64) {
        (
            self.counters.up.load(Ordering::Relaxed),
            self.counters.down.load(Ordering::Relaxed),
        )
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Accept {
    upstream: SocketAddr,
    mode: watch::Sender<Mode>,
    reset: watch::Sender<u64>,
    counters: Arc<Counters>,
}

impl Accept {
    async fn run(self, listener: TcpListener) {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                // Out of descriptors, say: try again a little later.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let upstream = self.upstream;
            let mode = self.mode.subscribe();
            let mut reset = self.reset.subscribe();
            reset.mark_unchanged();
            let counters = self.counters.clone();
            tokio::spawn(async move {
                counters.open.fetch_add(1, Ordering::Relaxed);
                serve(client, upstream, mode, reset, &counters).await;
                counters.open.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }
}

/// Forwards one connection until both ways end, an error, or a reset.
async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mode: watch::Receiver<Mode>,
    mut reset: watch::Receiver<u64>,
    counters: &Counters,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return; // the member is down: the client sees its connection close
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let was_reset = tokio::select! {
        _ = async {
            tokio::try_join!(
                pump(Way::Up, &mut cr, &mut sw, mode.clone(), &counters.up),
                pump(Way::Down, &mut sr, &mut cw, mode, &counters.down),
            )
        } => false,
        _ = reset.changed() => true,
    };
    if was_reset {
        // No FIN first: forget the write halves (a dropped one would shut
        // its side down), then close with SO_LINGER 0, which sends RST.
        let _ = cr.as_ref().set_zero_linger();
        let _ = sr.as_ref().set_zero_linger();
        cw.forget();
        sw.forget();
    }
}

/// Bytes read at one instant, due at another; `None` is the end of stream.
type Chunk = (Instant, Option<Vec<u8>>);

/// Copies `from` to `to` under the current mode: a reader that stops while
/// blackholed and stamps each chunk with its due time, and a writer that
/// delivers chunks in order when due (and not blackholed).
async fn pump(
    way: Way,
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    mode: watch::Receiver<Mode>,
    delivered: &AtomicU64,
) -> std::io::Result<()> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
    let mut read_mode = mode.clone();
    let read = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let m = *read_mode
                .wait_for(|m| *m != Mode::Blackhole)
                .await
                .map_err(|_| std::io::ErrorKind::BrokenPipe)?;
            let n = tokio::select! {
                r = from.read(&mut buf) => r?,
                // A mode change (e.g. to Blackhole) while waiting: look again.
                _ = read_mode.changed() => continue,
            };
            if n == 0 {
                let _ = tx.send((Instant::now(), None));
                return Ok::<(), std::io::Error>(());
            }
            let now = Instant::now();
            let due = match (way, m) {
                (Way::Down, Mode::DropReplies) => continue,
                (Way::Down, Mode::Delay(d)) => now + d,
                _ => now,
            };
            if tx.send((due, Some(buf[..n].to_vec()))).is_err() {
                return Ok(());
            }
        }
    };
    let mut write_mode = mode;
    let write = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            write_mode
                .wait_for(|m| *m != Mode::Blackhole)
                .await
                .map_err(|_| std::io::ErrorKind::BrokenPipe)?;
            match bytes {
                Some(b) => {
                    to.write_all(&b).await?;
                    delivered.fetch_add(b.len() as u64, Ordering::Relaxed);
                }
                None => {
                    to.shutdown().await?;
                    return Ok(());
                }
            }
        }
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}
