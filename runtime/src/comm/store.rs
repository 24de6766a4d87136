//! A small key-value store over TCP at `MASTER_ADDR:MASTER_PORT`, as torch's `TCPStore`: rank 0
//! serves it, every rank (rank 0 included) is a client. It ships HCCL's root info from rank 0 to
//! the others (see [`super::rendezvous::Rendezvous`]).
//!
//! - Clients connect with retries until the timeout (ranks start in any order; the server may
//!   not listen yet). Every client says which world size it belongs to and its rank: the server
//!   refuses a different world size ([`CommError::WorldSizeMismatch`]) and a rank that is
//!   already connected, so a stale or foreign job on the port is an error, not a silent mix.
//! - `set` stores bytes; `get` waits (on the server, up to the timeout) until the key exists;
//!   `add` is an atomic counter (barriers). Waits past the timeout are
//!   [`CommError::StoreTimeout`].
//!
//! Wire format (little endian): a request is `op u8, key (u32 length + bytes), value (u32
//! length + bytes), arg u64`; a reply is `status u8, body (u32 length + bytes)`.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::error::{CommError, CommResult};

const OP_HELLO: u8 = 1;
const OP_SET: u8 = 2;
const OP_GET: u8 = 3;
const OP_ADD: u8 = 4;
const OP_DEL: u8 = 5;

const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_WORLD: u8 = 2;
const ST_ERR: u8 = 3;

/// A client of the store (and, on rank 0, its server).
#[derive(Debug)]
pub struct TcpStore {
    addr: String,
    conn: Mutex<TcpStream>,
    timeout: Duration,
    server: Option<Server>,
}

impl TcpStore {
    /// Connects rank `rank` of `world_size` to the store at `host:port`; rank 0 first starts
    /// the server there (listening on every interface, as torch's store does, so other hosts
    /// reach it). `timeout` bounds the connection attempts and every later wait.
    pub fn connect(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> CommResult<TcpStore> {
        let addr = format!("{host}:{port}");
        let server = if rank == 0 {
            Some(Server::start(port, world_size, &addr, timeout)?)
        } else {
            None
        };
        let target = resolve(&addr)?;
        let deadline = Instant::now() + timeout;
        let stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match TcpStream::connect_timeout(&target, left.max(Duration::from_millis(1))) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(CommError::StoreTimeout {
                        addr,
                        what: format!("connecting (is rank 0 running? last error: {e})"),
                        timeout,
                    })
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20).min(left)),
            }
        };
        let _ = stream.set_nodelay(true);
        let store = TcpStore {
            addr,
            conn: Mutex::new(stream),
            timeout,
            server,
        };
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(&(world_size as u64).to_le_bytes());
        hello.extend_from_slice(&(rank as u64).to_le_bytes());
        store.request(OP_HELLO, "", &hello, 0, "hello")?;
        Ok(store)
    }

    /// `host:port`, for messages.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// True on the rank that serves the store.
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    pub fn set(&self, key: &str, value: &[u8]) -> CommResult<()> {
        self.request(OP_SET, key, value, 0, "set").map(drop)
    }

    /// The value of `key`, waiting up to `timeout` for some rank to set it.
    pub fn get(&self, key: &str, timeout: Duration) -> CommResult<Vec<u8>> {
        self.request(OP_GET, key, &[], timeout.as_millis() as u64, "get")
    }

    /// Adds `delta` to the counter `key` (0 when new) and returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> CommResult<i64> {
        let b = self.request(OP_ADD, key, &[], delta as u64, "add")?;
        let w: [u8; 8] = b
            .as_slice()
            .try_into()
            .map_err(|_| self.bad("add: short reply"))?;
        Ok(i64::from_le_bytes(w))
    }

    /// Removes `key` (absent keys are fine).
    pub fn delete(&self, key: &str) -> CommResult<()> {
        self.request(OP_DEL, key, &[], 0, "delete").map(drop)
    }

    fn bad(&self, detail: impl Into<String>) -> CommError {
        CommError::Store {
            addr: self.addr.clone(),
            detail: detail.into(),
        }
    }

    fn request(
        &self,
        op: u8,
        key: &str,
        value: &[u8],
        arg: u64,
        what: &str,
    ) -> CommResult<Vec<u8>> {
        let mut conn = self.conn.lock();
        let mut req = Vec::with_capacity(17 + key.len() + value.len());
        req.push(op);
        put_bytes(&mut req, key.as_bytes());
        put_bytes(&mut req, value);
        req.extend_from_slice(&arg.to_le_bytes());
        let io = |e: std::io::Error| self.bad(format!("{what} {key:?}: {e} (did rank 0 exit?)"));
        // The server answers a get within its wait; allow a margin beyond it, never forever.
        let wait = if op == OP_GET {
            Duration::from_millis(arg)
        } else {
            Duration::ZERO
        };
        conn.set_read_timeout(Some(self.timeout.max(wait) + Duration::from_secs(5)))
            .map_err(io)?;
        conn.write_all(&req).map_err(io)?;
        let mut st = [0u8; 1];
        conn.read_exact(&mut st).map_err(io)?;
        let body = read_bytes(&mut *conn).map_err(io)?;
        let text = || String::from_utf8_lossy(&body).into_owned();
        match st[0] {
            ST_OK => Ok(body),
            ST_TIMEOUT => Err(CommError::StoreTimeout {
                addr: self.addr.clone(),
                what: format!("waiting for key {key:?}"),
                timeout: Duration::from_millis(arg),
            }),
            ST_WORLD => {
                let theirs = text().parse().unwrap_or(0);
                Err(CommError::WorldSizeMismatch {
                    addr: self.addr.clone(),
                    ours: value
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map_or(0, u64::from_le_bytes) as usize,
                    theirs,
                })
            }
            _ => Err(self.bad(format!("{what} {key:?}: {}", text()))),
        }
    }
}

fn resolve(addr: &str) -> CommResult<SocketAddr> {
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| CommError::Env {
            var: "MASTER_ADDR",
            detail: format!("{addr} does not resolve to an address"),
        })
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// The largest key or value the store moves (root infos are 4 KiB): a stray client's garbage
/// length must not make the server allocate gigabytes.
const MAX_BYTES: usize = 64 << 20;

fn read_bytes(r: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > MAX_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a field of {n} bytes (the store takes at most {MAX_BYTES})"),
        ));
    }
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// The server's state.
#[derive(Default)]
struct Table {
    values: HashMap<String, Vec<u8>>,
    ranks: HashSet<u64>,
}

#[derive(Default)]
struct Shared {
    table: Mutex<Table>,
    changed: Condvar,
    stop: AtomicBool,
    clients: Mutex<Vec<TcpStream>>,
    /// Clients still connected, and its condition variable.
    active: Mutex<usize>,
    left: Condvar,
}

/// Rank 0's server: an accept thread and a thread per client, stopped on drop once every
/// client has disconnected (or `linger` passed): rank 0 finishing first must not take the store
/// away from ranks still bootstrapping a sub-group.
struct Server {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    linger: Duration,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TcpStore server")
    }
}

impl Server {
    fn start(port: u16, world_size: usize, addr: &str, linger: Duration) -> CommResult<Server> {
        let listener = TcpListener::bind(("0.0.0.0", port)).map_err(|e| CommError::Store {
            addr: addr.to_string(),
            detail: format!(
                "rank 0 cannot serve the store on port {port}: {e} (another job on \
                 MASTER_PORT? pick another port)"
            ),
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| CommError::Store {
                addr: addr.to_string(),
                detail: e.to_string(),
            })?;
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("cannon-store".into())
            .spawn(move || accept_loop(listener, sh, world_size as u64))
            .map_err(|e| CommError::Store {
                addr: addr.to_string(),
                detail: format!("cannot start the store thread: {e}"),
            })?;
        Ok(Server {
            shared,
            accept: Some(accept),
            linger,
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let deadline = Instant::now() + self.linger;
        let mut active = self.shared.active.lock();
        while *active > 0 {
            if self
                .shared
                .left
                .wait_until(&mut active, deadline)
                .timed_out()
            {
                break;
            }
        }
        drop(active);
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        for c in self.shared.clients.lock().iter() {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, world: u64) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    while !shared.stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_nodelay(true);
                if let Ok(c) = s.try_clone() {
                    shared.clients.lock().push(c);
                }
                *shared.active.lock() += 1;
                let sh = shared.clone();
                if let Ok(h) = std::thread::Builder::new()
                    .name("cannon-store-client".into())
                    .spawn(move || serve(s, sh, world))
                {
                    handlers.push(h);
                }
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    for h in handlers {
        let _ = h.join();
    }
}

/// Answers one client until it disconnects or the server stops.
fn serve(s: TcpStream, shared: Arc<Shared>, world: u64) {
    answer(s, &shared, world);
    *shared.active.lock() -= 1;
    shared.left.notify_all();
}

fn answer(mut s: TcpStream, shared: &Shared, world: u64) {
    let reply = |s: &mut TcpStream, st: u8, body: &[u8]| -> std::io::Result<()> {
        let mut out = vec![st];
        put_bytes(&mut out, body);
        s.write_all(&out)
    };
    loop {
        let mut op = [0u8; 1];
        if s.read_exact(&mut op).is_err() {
            return;
        }
        let (Ok(key), Ok(value)) = (read_bytes(&mut s), read_bytes(&mut s)) else {
            return;
        };
        let mut arg = [0u8; 8];
        if s.read_exact(&mut arg).is_err() {
            return;
        }
        let arg = u64::from_le_bytes(arg);
        let key = String::from_utf8_lossy(&key).into_owned();
        let r = match op[0] {
            OP_HELLO => {
                let word = |i: usize| {
                    value
                        .get(i..i + 8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_le_bytes)
                        .unwrap_or(u64::MAX)
                };
                let (their_world, rank) = (word(0), word(8));
                if their_world != world {
                    reply(&mut s, ST_WORLD, world.to_string().as_bytes())
                } else if !shared.table.lock().ranks.insert(rank) {
                    reply(
                        &mut s,
                        ST_ERR,
                        format!("rank {rank} is already connected (two processes with one RANK?)")
                            .as_bytes(),
                    )
                } else {
                    reply(&mut s, ST_OK, &[])
                }
            }
            OP_SET => {
                shared.table.lock().values.insert(key, value);
                shared.changed.notify_all();
                reply(&mut s, ST_OK, &[])
            }
            OP_GET => {
                let deadline = Instant::now() + Duration::from_millis(arg);
                let mut t = shared.table.lock();
                let got = loop {
                    if let Some(v) = t.values.get(&key) {
                        break Some(v.clone());
                    }
                    if shared.stop.load(Ordering::SeqCst)
                        || shared.changed.wait_until(&mut t, deadline).timed_out()
                    {
                        break t.values.get(&key).cloned();
                    }
                };
                drop(t);
                match got {
                    Some(v) => reply(&mut s, ST_OK, &v),
                    None => reply(&mut s, ST_TIMEOUT, &[]),
                }
            }
            OP_ADD => {
                let mut t = shared.table.lock();
                let cur = t
                    .values
                    .get(&key)
                    .and_then(|v| v.as_slice().try_into().ok())
                    .map(i64::from_le_bytes)
                    .unwrap_or(0);
                let new = cur.wrapping_add(arg as i64);
                t.values.insert(key, new.to_le_bytes().to_vec());
                drop(t);
                shared.changed.notify_all();
                reply(&mut s, ST_OK, &new.to_le_bytes())
            }
            OP_DEL => {
                shared.table.lock().values.remove(&key);
                reply(&mut s, ST_OK, &[])
            }
            other => reply(
                &mut s,
                ST_ERR,
                format!("unknown request {other}").as_bytes(),
            ),
        };
        if r.is_err() {
            return;
        }
    }
}
