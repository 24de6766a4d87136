//! How emulated HCCL ranks talk: a full mesh of TCP connections, one per pair of ranks, set up
//! by `HcclCommInitRootInfo` from the address in the root info, then a reader thread per peer.
//!
//! Ranks are separate processes (or threads, in the unit tests): nothing is shared but sockets.
//! Every message is a [`Frame`]: a fixed header naming what it belongs to (a collective's
//! sequence number, or a point-to-point counter) and what the sender thinks the call is (op,
//! dtype, count, reduce op, root), then the payload. Each peer's reader thread drains its socket
//! into an inbox keyed by `(kind, seq)`, so a writer never blocks on a peer that is itself
//! writing (all-to-all patterns cannot deadlock on socket buffers) and messages of calls that
//! ran on different streams cannot be confused.
//!
//! A dead peer shows up as end-of-file or a reset on its socket (the kernel closes a killed
//! process's sockets); a hung one as no message within `HCCL_EXEC_TIMEOUT`. Either is an error
//! for whoever waits on that peer, never a hang. The connections are made in [`super::bootstrap`].

use crate::error::{EmuError, EmuResult};
use cannon_sys::hccl::{
    HcclResult, HCCL_E_PARA, HCCL_E_TCP_CONNECT, HCCL_E_TCP_TRANSFER, HCCL_E_TIMEOUT,
};
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// `HcclRootInfo` bytes (hccl_types.h).
pub const ROOT_INFO_BYTES: usize = cannon_sys::hccl::HCCL_ROOT_INFO_BYTES as usize;
const ROOT_MAGIC: &[u8; 8] = b"CNEMUHCL";
const FRAME_MAGIC: u32 = 0x4846_5231; // "HFR1"
const HEAD_BYTES: usize = 56;
/// What a frame's payload buffer starts at; it grows with the bytes that arrive.
const FIRST_ALLOC: u64 = 1 << 20;

/// The largest payload a peer may send: a device's memory (a frame is at most one buffer,
/// see `comm`; pieces are smaller).
pub(super) fn max_payload() -> u64 {
    crate::mem::device_capacity()
}

/// `HCCL_CONNECT_TIMEOUT` (seconds; HCCL's default 120) and `HCCL_EXEC_TIMEOUT` (seconds;
/// 1836 on Atlas A2, where 0 means never). CANN's environment-variable reference documents both;
/// HCCL takes whole seconds and a connect timeout of at least 120, the emulator also takes
/// fractions and small values so tests of dead peers stay short.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub exec: Duration,
}

/// What `HCCL_EXEC_TIMEOUT=0` (never time out) becomes: far beyond any run, small enough that
/// `Instant + NEVER` cannot overflow.
pub const NEVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[cfg(test)]
thread_local! {
    /// Unit tests run ranks as threads of one process: per-thread timeouts instead of the
    /// process environment.
    pub static TEST_TIMEOUTS: std::cell::Cell<Option<Timeouts>> = const { std::cell::Cell::new(None) };
}

impl Timeouts {
    pub fn from_env() -> EmuResult<Self> {
        #[cfg(test)]
        if let Some(t) = TEST_TIMEOUTS.with(|t| t.get()) {
            return Ok(t);
        }
        let get = |k: &str| std::env::var(k).ok();
        Ok(Self {
            connect: secs(
                "HCCL_CONNECT_TIMEOUT",
                get("HCCL_CONNECT_TIMEOUT"),
                120.0,
                false,
            )?,
            exec: secs("HCCL_EXEC_TIMEOUT", get("HCCL_EXEC_TIMEOUT"), 1836.0, true)?,
        })
    }
}

/// Seconds from `value` (else `default`); 0 is [`NEVER`] where `zero_is_never`.
fn secs(
    var: &str,
    value: Option<String>,
    default: f64,
    zero_is_never: bool,
) -> EmuResult<Duration> {
    let Some(v) = value else {
        return Ok(Duration::from_secs_f64(default));
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s == 0.0 && zero_is_never => Ok(NEVER),
        Ok(s) if s > 0.0 && s.is_finite() => {
            Ok(Duration::try_from_secs_f64(s).unwrap_or(NEVER).min(NEVER))
        }
        _ => Err(EmuError::new(
            HCCL_E_PARA as i32,
            format!(
                "{var}={v:?} is not a {} number of seconds",
                if zero_is_never {
                    "non-negative"
                } else {
                    "positive"
                }
            ),
        )),
    }
}

pub(super) fn err(code: HcclResult, message: impl Into<String>) -> EmuError {
    EmuError::new(code as i32, message)
}

/// The address every rank of a pending communicator connects to, and the nonce that tells
/// this job's connections from anyone else's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootInfo {
    pub addr: SocketAddr,
    pub nonce: u64,
}

impl RootInfo {
    /// Layout inside the 4108 opaque bytes: magic (8), nonce (8, LE), port (2, LE), then the
    /// IP address as text, NUL terminated. The rest is zero.
    pub fn encode(&self) -> [u8; ROOT_INFO_BYTES] {
        let mut b = [0u8; ROOT_INFO_BYTES];
        b[..8].copy_from_slice(ROOT_MAGIC);
        b[8..16].copy_from_slice(&self.nonce.to_le_bytes());
        b[16..18].copy_from_slice(&self.addr.port().to_le_bytes());
        let ip = self.addr.ip().to_string();
        b[18..18 + ip.len()].copy_from_slice(ip.as_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> EmuResult<Self> {
        if b.len() != ROOT_INFO_BYTES || &b[..8] != ROOT_MAGIC {
            return Err(err(
                HCCL_E_PARA,
                "rootInfo was not written by HcclGetRootInfo (bad magic): pass the bytes rank 0 \
                 got, unchanged",
            ));
        }
        let nonce = u64::from_le_bytes(b[8..16].try_into().unwrap_or_default());
        let port = u16::from_le_bytes([b[16], b[17]]);
        let text = &b[18..];
        let end = text.iter().position(|&c| c == 0).unwrap_or(text.len());
        let ip: IpAddr = std::str::from_utf8(&text[..end])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| err(HCCL_E_PARA, "rootInfo holds no valid root address"))?;
        Ok(Self {
            addr: SocketAddr::new(ip, port),
            nonce,
        })
    }
}

/// Listeners made by `HcclGetRootInfo` in this process, by nonce, until rank 0 joins.
pub(super) fn pending() -> &'static Mutex<HashMap<u64, TcpListener>> {
    static P: OnceLock<Mutex<HashMap<u64, TcpListener>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

/// The interface ranks listen on: `HCCL_IF_IP` (as HCCL uses it to pick the root NIC), else
/// loopback.
fn interface_ip() -> EmuResult<IpAddr> {
    match std::env::var("HCCL_IF_IP") {
        Ok(v) => v.trim().parse().map_err(|_| {
            err(
                HCCL_E_PARA,
                format!("HCCL_IF_IP={v:?} is not an IP address"),
            )
        }),
        Err(_) => Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)),
    }
}

/// A random 64-bit value (std's hasher keys are random per process).
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// `HcclGetRootInfo`: opens the root's listening socket and describes it.
pub fn create_root() -> EmuResult<RootInfo> {
    let ip = interface_ip()?;
    let l = TcpListener::bind(SocketAddr::new(ip, 0)).map_err(|e| {
        err(
            HCCL_E_TCP_CONNECT,
            format!("cannot listen on {ip} for the root: {e}"),
        )
    })?;
    let addr = l
        .local_addr()
        .map_err(|e| err(HCCL_E_TCP_CONNECT, e.to_string()))?;
    let info = RootInfo {
        addr,
        nonce: nonce(),
    };
    pending().lock().insert(info.nonce, l);
    Ok(info)
}

/// What a message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Collective number `seq` of the communicator.
    Coll,
    /// The `seq`-th point-to-point message between two ranks, one direction.
    P2p,
    /// "Ready to receive" for point-to-point message `seq` (HCCL's send waits for it).
    Cts,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Coll => 1,
            Kind::P2p => 2,
            Kind::Cts => 3,
        }
    }
    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            1 => Kind::Coll,
            2 => Kind::P2p,
            3 => Kind::Cts,
            _ => return None,
        })
    }
}

/// What the sender believes the call is; a receiver whose own call differs reports both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    pub op: u32,
    pub dtype: u32,
    pub count: u64,
    pub reduce: u32,
    pub root: u32,
}

/// One message.
#[derive(Debug)]
pub struct Frame {
    pub kind: Kind,
    pub seq: u64,
    /// Which piece of the call's payload (a large buffer travels in pieces, see `comm`).
    pub piece: u64,
    pub meta: Meta,
    pub payload: Vec<u8>,
}

#[cfg(test)]
fn write_frame(w: &mut impl Write, f: &Frame) -> std::io::Result<()> {
    write_parts(w, f.kind, (f.seq, f.piece), f.meta, &f.payload)
}

/// A frame's header and payload, the payload borrowed (a collective sends straight from
/// device memory rather than from a copy of it).
fn write_parts(
    w: &mut impl Write,
    kind: Kind,
    (seq, piece): (u64, u64),
    meta: Meta,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut h = [0u8; HEAD_BYTES];
    h[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    h[4] = kind.code();
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&meta.op.to_le_bytes());
    h[20..24].copy_from_slice(&meta.dtype.to_le_bytes());
    h[24..32].copy_from_slice(&meta.count.to_le_bytes());
    h[32..36].copy_from_slice(&meta.reduce.to_le_bytes());
    h[36..40].copy_from_slice(&meta.root.to_le_bytes());
    h[40..48].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[48..56].copy_from_slice(&piece.to_le_bytes());
    w.write_all(&h)?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame whose payload is at most `max_payload` bytes. The payload grows as its
/// bytes arrive (never a buffer of the header's length up front), so a corrupt or hostile
/// header costs at most what the peer actually sends, and a length past the cap is refused
/// before any of it is read.
pub(super) fn read_frame(r: &mut impl Read, max_payload: u64) -> std::io::Result<Frame> {
    let mut h = [0u8; HEAD_BYTES];
    r.read_exact(&mut h)?;
    let u32_at = |i: usize| u32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]);
    let u64_at = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&h[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    if u32_at(0) != FRAME_MAGIC {
        return Err(bad("not an emulated HCCL frame"));
    }
    let kind = Kind::from_code(h[4]).ok_or_else(|| bad("unknown frame kind"))?;
    let len = u64_at(40);
    if len > max_payload {
        return Err(bad(&format!(
            "a frame of {len} payload bytes, more than a device holds ({max_payload})"
        )));
    }
    let mut payload = Vec::with_capacity(len.min(FIRST_ALLOC) as usize);
    r.take(len).read_to_end(&mut payload)?;
    if payload.len() as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!(
                "a frame cut short: {} of {len} payload bytes",
                payload.len()
            ),
        ));
    }
    Ok(Frame {
        kind,
        seq: u64_at(8),
        piece: u64_at(48),
        meta: Meta {
            op: u32_at(16),
            dtype: u32_at(20),
            count: u64_at(24),
            reduce: u32_at(32),
            root: u32_at(36),
        },
        payload,
    })
}

/// Messages that arrived from one peer and are not taken yet.
#[derive(Default)]
struct InboxState {
    frames: HashMap<(Kind, u64, u64), Frame>,
    /// Why the connection ended (set once the reader has queued everything before it).
    closed: Option<String>,
}

#[derive(Default)]
pub(super) struct Inbox {
    state: Mutex<InboxState>,
    arrived: Condvar,
}

/// The connection to one peer.
pub(super) struct Peer {
    pub(super) writer: Mutex<TcpStream>,
    pub(super) inbox: Arc<Inbox>,
    pub(super) reader: Mutex<Option<JoinHandle<()>>>,
}

/// A rank's connections to every other rank of one communicator.
pub struct Mesh {
    pub rank: u32,
    pub n_ranks: u32,
    /// Indexed by rank; `None` at our own rank.
    pub(super) peers: Vec<Option<Peer>>,
}

/// Why a wait for a peer failed; the caller turns it into the HCCL and ACL codes.
#[derive(Debug)]
pub enum PeerError {
    Closed { peer: u32, why: String },
    Timeout { peer: u32, waited: Duration },
    Io { peer: u32, what: String },
}

impl PeerError {
    pub fn hccl_code(&self) -> HcclResult {
        match self {
            PeerError::Closed { .. } | PeerError::Io { .. } => HCCL_E_TCP_TRANSFER,
            PeerError::Timeout { .. } => HCCL_E_TIMEOUT,
        }
    }
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::Closed { peer, why } => write!(
                f,
                "rank {peer} closed its connection ({why}): the process died or destroyed the \
                 communicator before this call"
            ),
            PeerError::Timeout { peer, waited } => write!(
                f,
                "no message from rank {peer} within HCCL_EXEC_TIMEOUT ({waited:?}): the rank is \
                 hung, or did not make the same call"
            ),
            PeerError::Io { peer, what } => write!(f, "sending to rank {peer} failed: {what}"),
        }
    }
}

impl Mesh {
    /// Sends `payload` as piece `at.1` of message `(kind, at.0)` to `peer` (never to ourselves). The write
    /// times out after `timeout`, so a peer that stopped reading cannot hang us.
    pub fn send(
        &self,
        peer: u32,
        kind: Kind,
        at: (u64, u64),
        meta: Meta,
        payload: &[u8],
    ) -> Result<(), PeerError> {
        let p = self.peer(peer)?;
        let mut w = p.writer.lock();
        write_parts(&mut *w, kind, at, meta, payload).map_err(|e| {
            use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
            if matches!(e.kind(), BrokenPipe | ConnectionReset | ConnectionAborted) {
                PeerError::Closed {
                    peer,
                    why: e.to_string(),
                }
            } else {
                PeerError::Io {
                    peer,
                    what: e.to_string(),
                }
            }
        })
    }

    /// Takes piece `at.1` of message `(kind, at.0)` from `peer`, waiting until `deadline`.
    pub fn recv(
        &self,
        peer: u32,
        kind: Kind,
        (seq, piece): (u64, u64),
        deadline: Instant,
        started: Instant,
    ) -> Result<Frame, PeerError> {
        let p = self.peer(peer)?;
        let mut st = p.inbox.state.lock();
        loop {
            if let Some(f) = st.frames.remove(&(kind, seq, piece)) {
                return Ok(f);
            }
            if let Some(why) = &st.closed {
                return Err(PeerError::Closed {
                    peer,
                    why: why.clone(),
                });
            }
            if p.inbox.arrived.wait_until(&mut st, deadline).timed_out() {
                if let Some(f) = st.frames.remove(&(kind, seq, piece)) {
                    return Ok(f);
                }
                return Err(PeerError::Timeout {
                    peer,
                    waited: started.elapsed(),
                });
            }
        }
    }

    fn peer(&self, peer: u32) -> Result<&Peer, PeerError> {
        self.peers
            .get(peer as usize)
            .and_then(|p| p.as_ref())
            .ok_or_else(|| PeerError::Io {
                peer,
                what: "no connection to that rank".into(),
            })
    }

    /// Closes every connection and waits for the reader threads.
    pub fn close(&mut self) {
        for p in self.peers.iter().flatten() {
            let _ = p.writer.lock().shutdown(Shutdown::Both);
        }
        for p in self.peers.iter().flatten() {
            if let Some(h) = p.reader.lock().take() {
                let _ = h.join();
            }
        }
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        self.close();
    }
}

pub(super) fn spawn_reader(
    rank: u32,
    peer: u32,
    mut sock: TcpStream,
    inbox: Arc<Inbox>,
) -> EmuResult<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("emu-hccl-r{rank}-from{peer}"))
        .spawn(move || loop {
            match read_frame(&mut sock, max_payload()) {
                Ok(f) => {
                    inbox
                        .state
                        .lock()
                        .frames
                        .insert((f.kind, f.seq, f.piece), f);
                    inbox.arrived.notify_all();
                }
                Err(e) => {
                    let why = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        "end of stream".to_string()
                    } else {
                        e.to_string()
                    };
                    inbox.state.lock().closed = Some(why);
                    inbox.arrived.notify_all();
                    return;
                }
            }
        })
        .map_err(|e| {
            err(
                HCCL_E_TCP_CONNECT,
                format!("cannot start a reader thread: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_info_round_trips_and_rejects_garbage() {
        let r = RootInfo {
            addr: "127.0.0.1:4242".parse().unwrap(),
            nonce: 0x1234_5678_9abc_def0,
        };
        assert_eq!(RootInfo::decode(&r.encode()).unwrap(), r);
        let e = RootInfo::decode(&[0u8; ROOT_INFO_BYTES]).unwrap_err();
        assert_eq!(e.code, HCCL_E_PARA as i32);
    }

    #[test]
    fn timeouts_parse_as_cann_documents_them() {
        let s = |v: Option<&str>, never| secs("X", v.map(String::from), 120.0, never);
        assert_eq!(s(None, false).unwrap(), Duration::from_secs(120));
        assert_eq!(s(Some("0.25"), false).unwrap(), Duration::from_millis(250));
        assert_eq!(
            s(Some("0"), true).unwrap(),
            NEVER,
            "HCCL_EXEC_TIMEOUT=0: never"
        );
        assert!(s(Some("0"), false).is_err());
        assert!(s(Some("-3"), true).is_err());
        assert!(s(Some("soon"), true)
            .unwrap_err()
            .message
            .contains("\"soon\""));
        assert_eq!(s(Some("1e30"), true).unwrap(), NEVER);
    }

    #[test]
    fn frames_round_trip() {
        let f = Frame {
            kind: Kind::P2p,
            seq: 7,
            piece: 5,
            meta: Meta {
                op: 3,
                dtype: 4,
                count: 99,
                reduce: 1,
                root: 2,
            },
            payload: vec![1, 2, 3],
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &f).unwrap();
        let g = read_frame(&mut buf.as_slice(), 3).unwrap();
        assert_eq!(
            (g.kind, g.seq, g.piece, g.meta, &g.payload),
            (f.kind, f.seq, f.piece, f.meta, &f.payload)
        );
        // One byte over the cap is refused before the payload is read.
        let e = read_frame(&mut buf.as_slice(), 2).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("3 payload bytes"), "{e}");
        // A header claiming 2^64 - 1 bytes costs no allocation of that size, and one that
        // claims more than arrives is a short frame, not a hang or a huge buffer.
        let mut huge = buf.clone();
        huge[40..48].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(read_frame(&mut huge.as_slice(), max_payload()).is_err());
        let mut short = buf.clone();
        short[40..48].copy_from_slice(&(64u64 << 20).to_le_bytes());
        let e = read_frame(&mut short.as_slice(), u64::MAX).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    }
}
