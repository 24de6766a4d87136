//! A small key-value store over TCP at `MASTER_ADDR:MASTER_PORT`, as torch's `TCPStore`: rank 0
//! serves it, every rank (rank 0 included) is a client. It ships HCCL's root info from rank 0 to
//! the others (see [`super::rendezvous::Rendezvous`]).
//!
//! - Rank 0 listens on the address `MASTER_ADDR` resolves to (a loopback `MASTER_ADDR` is
//!   reachable from this host only), or on `CANNON_STORE_BIND` when set; never on every
//!   interface unless `CANNON_STORE_BIND` says `0.0.0.0`.
//! - A connection must first be admitted (see [`server`]): HELLO with this job's world size, a
//!   rank below it that is not taken, and, when the job has a token (`CANNON_JOB_TOKEN`, see
//!   [`auth`]), a MAC of the server's nonce under it. The token is required whenever the
//!   store listens beyond loopback; on loopback it is optional (ranks started by hand on one
//!   host), and used when set.
//! - The client proves nothing more than the token; the server proves it holds the token too,
//!   so a program squatting on `MASTER_PORT` cannot hand the ranks a root info of its own.
//! - Clients connect with retries until the timeout (ranks start in any order; the server may
//!   not listen yet). A different world size is [`CommError::WorldSizeMismatch`], a bad
//!   token [`CommError::StoreAuth`].
//! - `set` stores bytes; `get` waits (on the server, up to the timeout) until the key exists;
//!   `add` is an atomic counter (barriers). Waits past the timeout are
//!   [`CommError::StoreTimeout`].
//!
//! The wire format is in [`wire`]. Nothing is encrypted: keys and values (HCCL's root info)
//! can be read by whoever sees the network; see the README's trust model.

pub mod auth;
mod server;
mod wire;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use self::auth::{constant_time_eq, random_bytes, Challenge, JobToken, NONCE_BYTES};
use self::server::Server;
use self::wire::*;
use super::error::{CommError, CommResult};

/// The variable naming the address rank 0's store listens on, instead of `MASTER_ADDR`'s.
pub const BIND_ENV: &str = "CANNON_STORE_BIND";

/// What the server accepts. The defaults fit the root infos the store carries (4 KiB each)
/// with a wide margin.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// Longest key, in bytes.
    pub max_key: usize,
    /// Longest value, in bytes.
    pub max_value: usize,
    /// All keys and values together, in bytes.
    pub max_total: usize,
    /// Connections in handshake allowed beyond the world size.
    pub extra_pending: usize,
    /// Time a new connection has to be admitted (greeting, HELLO).
    pub handshake: Duration,
    /// Time an admitted rank has to send the rest of a request once it began one.
    pub frame: Duration,
}

impl Default for StoreLimits {
    fn default() -> Self {
        StoreLimits {
            max_key: 1 << 10,
            max_value: 1 << 20,
            max_total: 64 << 20,
            extra_pending: 8,
            handshake: Duration::from_secs(10),
            frame: Duration::from_secs(30),
        }
    }
}

/// How a rank joins the store: its job token, where rank 0 listens, the limits.
#[derive(Debug, Clone, Default)]
pub struct StoreOptions {
    pub token: Option<JobToken>,
    /// An address (or host name) for rank 0 to listen on instead of `MASTER_ADDR`'s.
    pub bind: Option<String>,
    pub limits: StoreLimits,
}

impl StoreOptions {
    /// `CANNON_JOB_TOKEN` / `CANNON_JOB_TOKEN_FILE` and `CANNON_STORE_BIND`, looked up through
    /// `get`.
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> CommResult<Self> {
        Ok(StoreOptions {
            token: JobToken::from_lookup(get)?,
            bind: get(BIND_ENV)
                .map(|b| b.trim().to_string())
                .filter(|b| !b.is_empty()),
            limits: StoreLimits::default(),
        })
    }
}

/// Connections the server refused: how many, and the latest reasons (`address: why`).
#[derive(Debug, Clone, Default)]
pub struct Refusals {
    pub total: u64,
    pub recent: Vec<String>,
}

/// A client of the store (and, on rank 0, its server).
#[derive(Debug)]
pub struct TcpStore {
    addr: String,
    conn: Mutex<TcpStream>,
    timeout: Duration,
    limits: StoreLimits,
    server: Option<Server>,
}

/// A failed attempt to join: worth another try (nobody listens yet, we were dropped while
/// greeting) or final (refused).
enum Attempt {
    Retry(String),
    Fatal(CommError),
}

impl TcpStore {
    /// [`TcpStore::connect_with`] without a token, with rank 0 listening on `host`'s address
    /// (which must then be loopback).
    pub fn connect(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> CommResult<TcpStore> {
        Self::connect_with(
            host,
            port,
            rank,
            world_size,
            timeout,
            &StoreOptions::default(),
        )
    }

    /// Connects rank `rank` of `world_size` to the store at `host:port`; rank 0 first starts
    /// the server (on `host`'s address, or `options.bind`). `timeout` bounds the connection
    /// attempts and every later wait.
    pub fn connect_with(
        host: &str,
        port: u16,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        options: &StoreOptions,
    ) -> CommResult<TcpStore> {
        let addr = format!("{host}:{port}");
        let mut targets = resolve(host, port, "MASTER_ADDR")?;
        let server = if rank == 0 {
            let s = serve(host, port, world_size, &addr, timeout, options)?;
            // Rank 0 reaches its own server where it listens (CANNON_STORE_BIND may name
            // another interface than MASTER_ADDR).
            let local = s.local_addr();
            if !local.ip().is_unspecified() {
                targets = vec![local];
            }
            Some(s)
        } else {
            None
        };
        let deadline = Instant::now() + timeout;
        let mut last = String::from("no attempt");
        loop {
            for target in &targets {
                match join(target, &addr, rank, world_size, deadline, options) {
                    Ok(stream) => {
                        return Ok(TcpStore {
                            addr,
                            conn: Mutex::new(stream),
                            timeout,
                            limits: options.limits,
                            server,
                        })
                    }
                    Err(Attempt::Fatal(e)) => return Err(e),
                    Err(Attempt::Retry(e)) => last = e,
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(CommError::StoreTimeout {
                    addr,
                    what: format!("connecting (is rank 0 running? last error: {last})"),
                    timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(20).min(left));
        }
    }

    /// `host:port`, for messages.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// True on the rank that serves the store.
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    /// Where rank 0's server listens (None on the other ranks).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(Server::local_addr)
    }

    /// The connections rank 0's server refused so far (None on the other ranks).
    pub fn refusals(&self) -> Option<Refusals> {
        self.server.as_ref().map(Server::refusals)
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
        // Refused here rather than sent: the server would drop the connection.
        if key.len() > self.limits.max_key || value.len() > self.limits.max_value {
            return Err(self.bad(format!(
                "{what}: key of {} bytes or value of {} bytes over the store's limits ({} and \
                 {})",
                key.len(),
                value.len(),
                self.limits.max_key,
                self.limits.max_value
            )));
        }
        let mut conn = self.conn.lock();
        let req = wire::request(op, key.as_bytes(), value, arg);
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
        let body =
            read_bytes(&mut *conn, self.limits.max_value.max(1 << 10), "reply").map_err(io)?;
        let text = || String::from_utf8_lossy(&body).into_owned();
        match st[0] {
            ST_OK => Ok(body),
            ST_TIMEOUT => Err(CommError::StoreTimeout {
                addr: self.addr.clone(),
                what: format!("waiting for key {key:?}"),
                timeout: Duration::from_millis(arg),
            }),
            _ => Err(self.bad(format!("{what} {key:?}: {}", text()))),
        }
    }
}

/// Every address `host:port` resolves to (`var` names the variable it came from).
fn resolve(host: &str, port: u16, var: &'static str) -> CommResult<Vec<SocketAddr>> {
    let all: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map(|a| a.collect())
        .unwrap_or_default();
    if all.is_empty() {
        return Err(CommError::Env {
            var,
            detail: format!("{host} does not resolve to an address"),
        });
    }
    Ok(all)
}

/// Rank 0: listens where `options.bind` or `host` says and starts the server.
fn serve(
    host: &str,
    port: u16,
    world: usize,
    addr: &str,
    linger: Duration,
    options: &StoreOptions,
) -> CommResult<Server> {
    let (ip, var) = match &options.bind {
        Some(b) => (resolve(b, port, BIND_ENV)?[0].ip(), BIND_ENV),
        None => (resolve(host, port, "MASTER_ADDR")?[0].ip(), "MASTER_ADDR"),
    };
    if !ip.is_loopback() && options.token.is_none() {
        return Err(CommError::Env {
            var: auth::TOKEN_ENV,
            detail: format!(
                "not set, and rank 0 would serve the store on {ip} ({var}), where other hosts \
                 reach it: without a job token anyone there could join the job. `cannon \
                 launch` sets one per job; ranks started otherwise need the same \
                 {} (or {}, a file only you can read) on every rank",
                auth::TOKEN_ENV,
                auth::TOKEN_FILE_ENV
            ),
        });
    }
    if options.bind.is_none() && ip.is_loopback() && host.parse::<IpAddr>().is_err() {
        let local = matches!(host, "localhost" | "localhost.localdomain");
        if !local {
            eprintln!(
                "cannon: MASTER_ADDR {host} resolves to {ip} here, a loopback address: only \
                 this host can reach the store (set MASTER_ADDR to the address other nodes \
                 use, or {BIND_ENV})"
            );
        }
    }
    let listener = TcpListener::bind((ip, port)).map_err(|e| CommError::Store {
        addr: addr.to_string(),
        detail: match e.kind() {
            std::io::ErrorKind::AddrNotAvailable => format!(
                "rank 0 cannot listen on {ip} ({var}): {e}; it is not an address of this host \
                 (run rank 0 on the host {var} names, or set {BIND_ENV} to this host's \
                 interface)"
            ),
            _ => format!(
                "rank 0 cannot serve the store on {ip} port {port}: {e} (another job on \
                 MASTER_PORT? pick another port)"
            ),
        },
    })?;
    Server::start(
        listener,
        world,
        addr,
        linger,
        options.token.clone(),
        options.limits,
    )
    .map_err(|e| CommError::Store {
        addr: addr.to_string(),
        detail: format!("cannot start the store: {e}"),
    })
}

/// One attempt to connect to `target` and be admitted.
fn join(
    target: &SocketAddr,
    addr: &str,
    rank: usize,
    world: usize,
    deadline: Instant,
    options: &StoreOptions,
) -> Result<TcpStream, Attempt> {
    let left = deadline.saturating_duration_since(Instant::now());
    let s = TcpStream::connect_timeout(target, left.max(Duration::from_millis(1)))
        .map_err(|e| Attempt::Retry(e.to_string()))?;
    let _ = s.set_nodelay(true);
    let until = deadline.min(Instant::now() + options.limits.handshake);
    let _ = s.set_write_timeout(Some(options.limits.handshake));
    let fatal = |detail: String| {
        Attempt::Fatal(CommError::StoreAuth {
            addr: addr.to_string(),
            detail,
        })
    };
    let mut r = Deadline { sock: &s, until };
    let mut greeting = [0u8; GREETING_BYTES];
    r.read_exact(&mut greeting)
        .map_err(|e| Attempt::Retry(format!("no greeting from the store: {e}")))?;
    if &greeting[..8] != MAGIC {
        return Err(Attempt::Fatal(CommError::Store {
            addr: addr.to_string(),
            detail: "what listens there is not a cannon store (another program on \
                     MASTER_PORT?)"
                .into(),
        }));
    }
    let token_required = greeting[8] & FLAG_TOKEN != 0;
    let mut server_nonce = [0u8; NONCE_BYTES];
    server_nonce.copy_from_slice(&greeting[9..]);
    let client_nonce = random_bytes().map_err(|e| {
        Attempt::Fatal(CommError::Store {
            addr: addr.to_string(),
            detail: format!("no nonce from /dev/urandom: {e}"),
        })
    })?;
    let challenge = Challenge {
        server_nonce,
        client_nonce,
        rank: rank as u64,
        world: world as u64,
    };
    let token = match (&options.token, token_required) {
        (Some(t), true) => Some(t),
        (None, false) => None,
        (None, true) => {
            return Err(fatal(format!(
                "rank 0's store requires the job token: set {} (or {}) to rank 0's value",
                auth::TOKEN_ENV,
                auth::TOKEN_FILE_ENV
            )))
        }
        (Some(_), false) => {
            return Err(fatal(format!(
                "this rank has a job token ({} or {}) but the store does not ask for one: \
                 were the ranks started with different environments, or is another program \
                 on MASTER_PORT?",
                auth::TOKEN_ENV,
                auth::TOKEN_FILE_ENV
            )))
        }
    };
    let mut hello = Vec::with_capacity(HELLO_MAC_BYTES);
    hello.extend_from_slice(&(world as u64).to_le_bytes());
    hello.extend_from_slice(&(rank as u64).to_le_bytes());
    hello.extend_from_slice(&client_nonce);
    if let Some(t) = token {
        hello.extend_from_slice(&t.client_mac(&challenge));
    }
    (&s).write_all(&wire::request(OP_HELLO, b"", &hello, 0))
        .map_err(|e| Attempt::Retry(format!("cannot send HELLO: {e}")))?;
    let mut r = Deadline { sock: &s, until };
    let mut st = [0u8; 1];
    r.read_exact(&mut st)
        .map_err(|e| Attempt::Retry(format!("no answer to HELLO: {e}")))?;
    let body = read_bytes(&mut r, 1 << 10, "reply")
        .map_err(|e| Attempt::Retry(format!("no answer to HELLO: {e}")))?;
    let text = String::from_utf8_lossy(&body).into_owned();
    match st[0] {
        ST_OK => {
            if let Some(t) = token {
                if !constant_time_eq(&body, &t.server_mac(&challenge)) {
                    return Err(fatal(
                        "the store did not prove it holds the job token (another program on \
                         MASTER_PORT?)"
                            .into(),
                    ));
                }
            }
            Ok(s)
        }
        ST_AUTH => Err(fatal(text)),
        ST_WORLD => Err(Attempt::Fatal(CommError::WorldSizeMismatch {
            addr: addr.to_string(),
            ours: world,
            theirs: text.parse().unwrap_or(0),
        })),
        _ => Err(Attempt::Fatal(CommError::Store {
            addr: addr.to_string(),
            detail: format!("hello: {text}"),
        })),
    }
}
