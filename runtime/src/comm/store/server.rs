//! Rank 0's side of the store: an accept thread and a thread per connection.
//!
//! A connection is a stranger until its handshake admits it: the server greets it with a
//! fresh nonce, and its first request must be a HELLO with this job's world size, a rank below
//! it that no one has taken, and (when the job has a token) a MAC proving the token. Until then
//! it has [`StoreLimits::handshake`] in all; once admitted, each request must arrive whole
//! within [`StoreLimits::frame`] of its first byte (between requests a rank may idle: it holds
//! its connection for the whole job). A refused peer is logged to stderr once per address,
//! the job goes on.
//!
//! Connections in handshake are capped at `world + extra_pending`; when the cap is reached, the
//! oldest of them is dropped for the newcomer, so a flood of silent connections cannot keep
//! the ranks out (a rank dropped while greeting retries). Admitted connections are at most
//! `world`, one per rank: `2 * world + extra_pending` sockets in all.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::auth::{constant_time_eq, random_bytes, Challenge, JobToken, MAC_BYTES, NONCE_BYTES};
use super::wire::*;
use super::{Refusals, StoreLimits};

/// Refusal messages kept for [`super::TcpStore::refusals`], and distinct addresses logged.
const RECENT_REFUSALS: usize = 64;
const LOGGED_PEERS: usize = 256;

/// The server's table.
#[derive(Default)]
struct Table {
    values: HashMap<Vec<u8>, Vec<u8>>,
    /// Bytes of keys and values stored.
    bytes: usize,
    ranks: HashSet<u64>,
}

struct Conn {
    sock: TcpStream,
    /// Still in its handshake.
    pending: bool,
    /// Dropped to make room for a newer connection.
    evicted: bool,
}

#[derive(Default)]
struct RefusalLog {
    total: u64,
    recent: VecDeque<String>,
    logged: HashSet<IpAddr>,
}

pub(super) struct Shared {
    addr: String,
    world: u64,
    token: Option<JobToken>,
    limits: StoreLimits,
    table: Mutex<Table>,
    changed: Condvar,
    stop: AtomicBool,
    /// Every open connection by id (ids grow: the smallest pending one is the oldest).
    conns: Mutex<BTreeMap<u64, Conn>>,
    next_id: AtomicU64,
    /// Admitted ranks still connected, and its condition variable.
    active: Mutex<usize>,
    left: Condvar,
    refusals: Mutex<RefusalLog>,
}

/// Rank 0's server, stopped on drop once every admitted rank has disconnected (or `linger`
/// passed): rank 0 finishing first must not take the store away from ranks still
/// bootstrapping a sub-group.
pub(super) struct Server {
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    linger: Duration,
    local: SocketAddr,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TcpStore server on {}", self.local)
    }
}

impl Server {
    /// Serves on `listener` (bound by the caller) for a job of `world` ranks.
    pub fn start(
        listener: TcpListener,
        world: usize,
        addr: &str,
        linger: Duration,
        token: Option<JobToken>,
        limits: StoreLimits,
    ) -> std::io::Result<Server> {
        let local = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            addr: addr.to_string(),
            world: world as u64,
            token,
            limits,
            table: Mutex::default(),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            conns: Mutex::default(),
            next_id: AtomicU64::new(0),
            active: Mutex::new(0),
            left: Condvar::new(),
            refusals: Mutex::default(),
        });
        let sh = shared.clone();
        let accept = std::thread::Builder::new()
            .name("cannon-store".into())
            .spawn(move || accept_loop(listener, sh))?;
        Ok(Server {
            shared,
            accept: Some(accept),
            linger,
            local,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn refusals(&self) -> Refusals {
        let r = self.shared.refusals.lock();
        Refusals {
            total: r.total,
            recent: r.recent.iter().cloned().collect(),
        }
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
        for c in self.shared.conns.lock().values() {
            let _ = c.sock.shutdown(Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let mut handlers: Vec<JoinHandle<()>> = Vec::new();
    let max_pending = shared.world as usize + shared.limits.extra_pending;
    while !shared.stop.load(Ordering::SeqCst) {
        let (s, peer) = match listener.accept() {
            Ok(x) => x,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        handlers.retain(|h| !h.is_finished());
        let _ = s.set_nonblocking(false);
        let _ = s.set_nodelay(true);
        let Ok(clone) = s.try_clone() else { continue };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        {
            let mut conns = shared.conns.lock();
            let mut pending = conns.iter_mut().filter(|(_, c)| c.pending && !c.evicted);
            let first = pending.next();
            if first.is_some() && 1 + pending.count() >= max_pending {
                if let Some((_, oldest)) = first {
                    oldest.evicted = true;
                    let _ = oldest.sock.shutdown(Shutdown::Both);
                }
            }
            conns.insert(
                id,
                Conn {
                    sock: clone,
                    pending: true,
                    evicted: false,
                },
            );
        }
        let sh = shared.clone();
        match std::thread::Builder::new()
            .name("cannon-store-client".into())
            .spawn(move || handle(s, peer, id, &sh))
        {
            Ok(h) => handlers.push(h),
            Err(_) => {
                shared.conns.lock().remove(&id);
            }
        }
    }
    for h in handlers {
        let _ = h.join();
    }
}

/// One connection, from greeting to close.
fn handle(s: TcpStream, peer: SocketAddr, id: u64, sh: &Shared) {
    let _ = s.set_write_timeout(Some(sh.limits.handshake));
    match handshake(&s, sh) {
        Ok(()) => {
            if let Some(c) = sh.conns.lock().get_mut(&id) {
                c.pending = false;
            }
            *sh.active.lock() += 1;
            let _ = s.set_write_timeout(Some(sh.limits.frame));
            if let Err(why) = serve(&s, sh) {
                sh.refuse(peer, &format!("an admitted rank: {why}"));
            }
            *sh.active.lock() -= 1;
            sh.left.notify_all();
        }
        Err(why) => {
            let evicted = sh.conns.lock().get(&id).is_some_and(|c| c.evicted);
            let why = match evicted {
                true => "dropped for a newer connection while in its handshake (too many \
                         connections in handshake)"
                    .to_string(),
                false => why,
            };
            sh.refuse(peer, &why);
        }
    }
    let _ = s.shutdown(Shutdown::Both);
    sh.conns.lock().remove(&id);
}

impl Shared {
    /// Records a refused peer; logs it to stderr the first time its address is refused.
    fn refuse(&self, peer: SocketAddr, why: &str) {
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        let msg = format!("{peer}: {why}");
        let mut r = self.refusals.lock();
        r.total += 1;
        if r.recent.len() == RECENT_REFUSALS {
            r.recent.pop_front();
        }
        r.recent.push_back(msg.clone());
        let ip = peer.ip();
        if r.logged.contains(&ip) || r.logged.len() > LOGGED_PEERS {
            return;
        }
        r.logged.insert(ip);
        let more = match r.logged.len() > LOGGED_PEERS {
            true => " (further refused addresses are not logged)",
            false => " (later refusals of this address are not logged)",
        };
        eprintln!("cannon: TCP store at {}: refused {msg}{more}", self.addr);
    }
}

fn send(s: &TcpStream, status: u8, body: &[u8]) -> Result<(), String> {
    (&mut &*s)
        .write_all(&reply(status, body))
        .map_err(|e| format!("cannot answer: {e}"))
}

/// The greeting and the HELLO; Ok once the peer is admitted as a rank of this job, else why
/// it was refused (it has been told, when it got as far as a request).
fn handshake(s: &TcpStream, sh: &Shared) -> Result<(), String> {
    let until = Instant::now() + sh.limits.handshake;
    let server_nonce = random_bytes().map_err(|e| format!("no nonce from /dev/urandom: {e}"))?;
    let mut greeting = Vec::with_capacity(GREETING_BYTES);
    greeting.extend_from_slice(MAGIC);
    greeting.push(if sh.token.is_some() { FLAG_TOKEN } else { 0 });
    greeting.extend_from_slice(&server_nonce);
    (&mut &*s)
        .write_all(&greeting)
        .map_err(|e| format!("cannot greet: {e}"))?;

    let mut r = Deadline { sock: s, until };
    let mut op = [0u8; 1];
    r.read_exact(&mut op).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "closed the connection before HELLO".to_string(),
        _ => format!(
            "no request within the handshake's {:?}: {e}",
            sh.limits.handshake
        ),
    })?;
    if op[0] != OP_HELLO {
        let _ = send(s, ST_ERR, b"the first request must be HELLO");
        return Err(format!("request {} before HELLO", op[0]));
    }
    // HELLO's value is small: a peer announcing a larger one is not a rank of ours.
    let req =
        read_request(&mut r, 0, HELLO_MAC_BYTES).map_err(|e| format!("malformed HELLO: {e}"))?;
    let v = &req.value;
    if v.len() != HELLO_BYTES && v.len() != HELLO_MAC_BYTES {
        let _ = send(s, ST_ERR, b"malformed HELLO");
        return Err(format!("malformed HELLO ({} bytes)", v.len()));
    }
    let (world, rank) = (word(v, 0).unwrap_or(0), word(v, 1).unwrap_or(0));
    let mut client_nonce = [0u8; NONCE_BYTES];
    client_nonce.copy_from_slice(&v[16..16 + NONCE_BYTES]);
    let challenge = Challenge {
        server_nonce,
        client_nonce,
        rank,
        world,
    };
    // The token first: a peer without it learns nothing of the job (its size, its ranks).
    let proof = match &sh.token {
        None => Vec::new(),
        Some(token) => {
            let Some(mac) = v.get(HELLO_BYTES..).filter(|m| !m.is_empty()) else {
                let _ = send(
                    s,
                    ST_AUTH,
                    b"this store requires the job token: set CANNON_JOB_TOKEN (or \
                      CANNON_JOB_TOKEN_FILE) to the value rank 0 has",
                );
                return Err("no job token".into());
            };
            if !constant_time_eq(mac, &token.client_mac(&challenge)) {
                let _ = send(
                    s,
                    ST_AUTH,
                    b"wrong job token (CANNON_JOB_TOKEN differs from rank 0's; or another \
                      job uses MASTER_PORT)",
                );
                return Err("wrong job token".into());
            }
            token.server_mac(&challenge).to_vec()
        }
    };
    if world != sh.world {
        let _ = send(s, ST_WORLD, sh.world.to_string().as_bytes());
        return Err(format!("world size {world}, this job has {}", sh.world));
    }
    if rank >= world {
        let _ = send(
            s,
            ST_ERR,
            format!("rank {rank} is not below the world size {world}").as_bytes(),
        );
        return Err(format!("rank {rank} of a world of {world}"));
    }
    if !sh.table.lock().ranks.insert(rank) {
        let _ = send(
            s,
            ST_ERR,
            format!("rank {rank} is already connected (two processes with one RANK?)").as_bytes(),
        );
        return Err(format!("rank {rank} joined a second time"));
    }
    debug_assert!(proof.is_empty() || proof.len() == MAC_BYTES);
    send(s, ST_OK, &proof)
}

/// Answers an admitted rank until it disconnects or the server stops. An error is a
/// misbehaving connection (malformed or oversized request, a request left half sent); a
/// rank that simply leaves is Ok.
fn serve(s: &TcpStream, sh: &Shared) -> Result<(), String> {
    let lim = &sh.limits;
    loop {
        let mut op = [0u8; 1];
        let _ = s.set_read_timeout(None);
        match (&mut &*s).read(&mut op) {
            Ok(0) | Err(_) => return Ok(()),
            Ok(_) => {}
        }
        let mut r = Deadline {
            sock: s,
            until: Instant::now() + lim.frame,
        };
        let req = read_request(&mut r, lim.max_key, lim.max_value)
            .map_err(|e| format!("request {}: {e}", op[0]))?;
        let (key, arg) = (req.key, req.arg);
        let sent = match op[0] {
            OP_SET => {
                let mut t = sh.table.lock();
                let old = t.values.get(&key).map_or(0, |v| key.len() + v.len());
                let bytes = t.bytes - old + key.len() + req.value.len();
                if bytes > lim.max_total {
                    drop(t);
                    let msg = format!(
                        "the store is full: {bytes} bytes of keys and values (at most {})",
                        lim.max_total
                    );
                    send(s, ST_ERR, msg.as_bytes())
                } else {
                    t.bytes = bytes;
                    t.values.insert(key, req.value);
                    drop(t);
                    sh.changed.notify_all();
                    send(s, ST_OK, &[])
                }
            }
            OP_GET => {
                let deadline = Instant::now() + Duration::from_millis(arg);
                let mut t = sh.table.lock();
                let got = loop {
                    if let Some(v) = t.values.get(&key) {
                        break Some(v.clone());
                    }
                    if sh.stop.load(Ordering::SeqCst)
                        || sh.changed.wait_until(&mut t, deadline).timed_out()
                    {
                        break t.values.get(&key).cloned();
                    }
                };
                drop(t);
                match got {
                    Some(v) => send(s, ST_OK, &v),
                    None => send(s, ST_TIMEOUT, &[]),
                }
            }
            OP_ADD => {
                let mut t = sh.table.lock();
                let old = t.values.get(&key);
                let cur = old
                    .and_then(|v| v.as_slice().try_into().ok())
                    .map(i64::from_le_bytes)
                    .unwrap_or(0);
                let old_bytes = old.map_or(0, |v| key.len() + v.len());
                let bytes = t.bytes - old_bytes + key.len() + 8;
                if bytes > lim.max_total {
                    drop(t);
                    send(s, ST_ERR, b"the store is full")
                } else {
                    let new = cur.wrapping_add(arg as i64);
                    t.bytes = bytes;
                    t.values.insert(key, new.to_le_bytes().to_vec());
                    drop(t);
                    sh.changed.notify_all();
                    send(s, ST_OK, &new.to_le_bytes())
                }
            }
            OP_DEL => {
                let mut t = sh.table.lock();
                if let Some(v) = t.values.remove(&key) {
                    t.bytes -= key.len() + v.len();
                }
                drop(t);
                send(s, ST_OK, &[])
            }
            OP_HELLO => send(s, ST_ERR, b"HELLO twice on one connection"),
            other => send(s, ST_ERR, format!("unknown request {other}").as_bytes()),
        };
        if sent.is_err() {
            return Ok(());
        }
    }
}
