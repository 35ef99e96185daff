//! [`TcpProxy`]: a loopback TCP relay in front of the test registry, for pulls that must be
//! slow (so a test can `kill -9` the puller in the middle of a layer), cut (a registry
//! whose connection drops in the middle of a blob) or dropped
//! at first (closed before any byte). It relays bytes, TLS included, so the registry's
//! certificate (SAN 127.0.0.1) stays valid through it.
//!
//! ```text
//!  client ──► 127.0.0.1:<proxy> ──► upstream (registry)
//!         ✕   the first drop_first connections: closed on accept
//!         ◄── throttled to bytes_per_sec; the first connection that carries more than
//!             cut_once_after bytes downstream is shut down there
//! ```
//!
//! Threads, blocking sockets; dropping the proxy stops it and shuts every connection.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the relay treats the bytes from upstream to the client.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProxySettings {
    /// At most this many bytes per second per connection; `None`: as fast as it goes.
    pub bytes_per_sec: Option<u64>,
    /// The first connection to carry more than this many bytes downstream is cut there
    /// (then the setting clears itself).
    pub cut_once_after: Option<u64>,
    /// This many new connections are closed as soon as they are accepted, before any byte
    /// (a registry whose listener is up but drops connections); then the rest are relayed.
    pub drop_first: usize,
}

#[derive(Debug, Default)]
struct Shared {
    settings: Mutex<ProxySettings>,
    stop: AtomicBool,
    cuts: AtomicUsize,
    dropped: AtomicUsize,
    /// Connections relayed.
    relayed: AtomicUsize,
    /// Bytes relayed downstream, every connection.
    down: AtomicU64,
    open: Mutex<Vec<TcpStream>>,
}

/// A running relay; stopped on drop.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl TcpProxy {
    /// Listens on a free loopback port and relays every connection to `upstream`.
    pub fn start(upstream: &str, settings: ProxySettings) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            settings: Mutex::new(settings),
            ..Shared::default()
        });
        let upstream = upstream.to_owned();
        let s = Arc::clone(&shared);
        let accept = std::thread::spawn(move || {
            while !s.stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        if s.drop_one() {
                            let _ = client.shutdown(Shutdown::Both);
                            continue;
                        }
                        let _ = client.set_nonblocking(false);
                        if let Ok(server) = TcpStream::connect(&upstream) {
                            s.relayed.fetch_add(1, Ordering::SeqCst);
                            relay(&s, client, server);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
        })
    }

    /// `127.0.0.1:<port>`: the registry host to pull from through the relay.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// New settings, for connections and bytes from now on.
    pub fn set(&self, settings: ProxySettings) {
        *self
            .shared
            .settings
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = settings;
    }

    /// How many connections were cut.
    pub fn cuts(&self) -> usize {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// How many connections were relayed (opened by clients and passed upstream).
    pub fn connections(&self) -> usize {
        self.shared.relayed.load(Ordering::SeqCst)
    }

    /// How many connections were closed unrelayed ([`ProxySettings::drop_first`]).
    pub fn dropped(&self) -> usize {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// Bytes relayed from upstream to clients so far (TLS records included).
    pub fn bytes_down(&self) -> u64 {
        self.shared.down.load(Ordering::SeqCst)
    }
}

impl Shared {
    /// Whether to drop the connection just accepted (and count it).
    fn drop_one(&self) -> bool {
        let mut s = self.settings.lock().unwrap_or_else(|p| p.into_inner());
        if s.drop_first == 0 {
            return false;
        }
        s.drop_first -= 1;
        self.dropped.fetch_add(1, Ordering::SeqCst);
        true
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for s in self
            .shared
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn relay(shared: &Arc<Shared>, client: TcpStream, server: TcpStream) {
    let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    {
        let mut open = shared.open.lock().unwrap_or_else(|p| p.into_inner());
        for s in [&client, &server] {
            if let Ok(s) = s.try_clone() {
                open.push(s);
            }
        }
    }
    // Upstream: as is.
    std::thread::spawn(move || {
        let (mut from, mut to) = (c2, s2);
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
    // Downstream: throttled, maybe cut.
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        let (mut from, mut to) = (server, client);
        let mut sent: u64 = 0;
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let settings = *shared.settings.lock().unwrap_or_else(|p| p.into_inner());
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some(limit) = settings.cut_once_after {
                if sent + n as u64 > limit {
                    let mut s = shared.settings.lock().unwrap_or_else(|p| p.into_inner());
                    if s.cut_once_after.is_some() {
                        s.cut_once_after = None;
                        drop(s);
                        let keep = (limit - sent.min(limit)) as usize;
                        if to.write_all(&buf[..keep]).is_ok() {
                            shared.down.fetch_add(keep as u64, Ordering::SeqCst);
                        }
                        shared.cuts.fetch_add(1, Ordering::SeqCst);
                        let _ = to.shutdown(Shutdown::Both);
                        let _ = from.shutdown(Shutdown::Both);
                        return;
                    }
                }
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
            sent += n as u64;
            shared.down.fetch_add(n as u64, Ordering::SeqCst);
            // Per chunk, so an idle keep-alive connection earns no burst.
            if let Some(rate) = settings.bytes_per_sec.filter(|r| *r > 0) {
                std::thread::sleep(Duration::from_secs_f64(n as f64 / rate as f64));
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
