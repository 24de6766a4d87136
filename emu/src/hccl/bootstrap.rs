//! `HcclCommInitRootInfo`'s collective part: rank 0 accepts every other rank on the root
//! info's address and checks they belong to this job and agree on its size, then answers with
//! every rank's listening address; each rank connects to the ranks below it and accepts the
//! ranks above it. All of it bounded by `HCCL_CONNECT_TIMEOUT`.

use super::transport::{err, pending, spawn_reader, Inbox, Mesh, Peer, RootInfo, Timeouts};
use crate::error::{EmuError, EmuResult};
use cannon_sys::hccl::{HcclResult, HCCL_E_PARA, HCCL_E_TCP_CONNECT, HCCL_E_TIMEOUT};
use parking_lot::Mutex;
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELLO_MAGIC: u32 = 0x4845_4c4f; // "HELO"

/// The first message on every connection: who is calling, for which job.
pub(super) struct Hello {
    nonce: u64,
    n_ranks: u32,
    rank: u32,
    /// The caller's own listening address (to rank 0 only; other ranks send port 0).
    listen: Option<SocketAddr>,
}

fn write_hello(s: &mut TcpStream, h: &Hello) -> std::io::Result<()> {
    let ip = h.listen.map(|a| a.ip().to_string()).unwrap_or_default();
    let mut b = Vec::with_capacity(64);
    b.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    b.extend_from_slice(&h.nonce.to_le_bytes());
    b.extend_from_slice(&h.n_ranks.to_le_bytes());
    b.extend_from_slice(&h.rank.to_le_bytes());
    b.extend_from_slice(&h.listen.map(|a| a.port()).unwrap_or(0).to_le_bytes());
    b.push(ip.len() as u8);
    b.extend_from_slice(ip.as_bytes());
    s.write_all(&b)
}

pub(super) fn read_hello(s: &mut impl Read) -> std::io::Result<Hello> {
    let mut b = [0u8; 23];
    s.read_exact(&mut b)?;
    let bad = |m: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, m.to_string());
    if u32::from_le_bytes([b[0], b[1], b[2], b[3]]) != HELLO_MAGIC {
        return Err(bad("not an emulated HCCL peer"));
    }
    let nonce = u64::from_le_bytes(b[4..12].try_into().unwrap_or_default());
    let n_ranks = u32::from_le_bytes([b[12], b[13], b[14], b[15]]);
    let rank = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
    let port = u16::from_le_bytes([b[20], b[21]]);
    let mut ip = vec![0u8; b[22] as usize];
    s.read_exact(&mut ip)?;
    let listen = if ip.is_empty() {
        None
    } else {
        let ip: IpAddr = std::str::from_utf8(&ip)
            .ok()
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| bad("bad listen address"))?;
        Some(SocketAddr::new(ip, port))
    };
    Ok(Hello {
        nonce,
        n_ranks,
        rank,
        listen,
    })
}

/// Rank 0's answer: status 0 and every rank's address, or a nonzero HcclResult and why.
fn write_table(
    s: &mut TcpStream,
    status: Result<&[SocketAddr], (HcclResult, &str)>,
) -> std::io::Result<()> {
    let text = match status {
        Ok(addrs) => {
            let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
            format!("0 {}", list.join(","))
        }
        Err((code, why)) => format!("{code} {why}"),
    };
    s.write_all(&(text.len() as u32).to_le_bytes())?;
    s.write_all(text.as_bytes())
}

/// The longest rank table read: a rank's address is at most 47 characters ("[v6]:port,"),
/// so 1 MiB holds 20 000 ranks; a length past it is refused before anything is allocated
/// (it was a 4 GiB vector for whatever answered on the root info's port).
const MAX_TABLE_BYTES: u32 = 1 << 20;

pub(super) type Table = Result<Vec<SocketAddr>, (HcclResult, String)>;

pub(super) fn read_table(s: &mut impl Read) -> std::io::Result<Table> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n);
    if n > MAX_TABLE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a rank table of {n} bytes (at most {MAX_TABLE_BYTES})"),
        ));
    }
    let mut b = vec![0u8; n as usize];
    s.read_exact(&mut b)?;
    let text = String::from_utf8_lossy(&b).into_owned();
    let (code, rest) = text.split_once(' ').unwrap_or((&text, ""));
    let code: HcclResult = code.parse().unwrap_or(HCCL_E_TCP_CONNECT);
    if code != 0 {
        return Ok(Err((code, rest.to_string())));
    }
    let addrs = rest
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|a| a.parse())
        .collect::<Result<Vec<SocketAddr>, _>>()
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad rank table"))?;
    Ok(Ok(addrs))
}

fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Connects to `addr`, retrying refused connections until `deadline` (the peer may not listen
/// yet: ranks start in any order).
fn connect_retry(addr: SocketAddr, deadline: Instant, what: &str) -> EmuResult<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, left(deadline)) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() >= deadline => {
                return Err(err(
                    HCCL_E_TIMEOUT,
                    format!("cannot reach {what} at {addr} within HCCL_CONNECT_TIMEOUT: {e}"),
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20).min(left(deadline))),
        }
    }
}

/// Accepts one connection before `deadline`.
fn accept_until(l: &TcpListener, deadline: Instant) -> std::io::Result<Option<TcpStream>> {
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(Some(s));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Ok(None);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

fn io(code: HcclResult, what: &str) -> impl Fn(std::io::Error) -> EmuError + '_ {
    move |e| err(code, format!("{what}: {e}"))
}

/// `HcclCommInitRootInfo`'s collective part: every rank of the job connects to every other.
pub fn connect(root: &RootInfo, n_ranks: u32, rank: u32, t: Timeouts) -> EmuResult<Mesh> {
    let deadline = Instant::now() + t.connect;
    let mut socks: Vec<Option<TcpStream>> = (0..n_ranks).map(|_| None).collect();
    if rank == 0 {
        let listener = pending().lock().remove(&root.nonce).ok_or_else(|| {
            err(
                HCCL_E_PARA,
                "rank 0 must call HcclCommInitRootInfo in the process that called \
                 HcclGetRootInfo, once per root info",
            )
        })?;
        root_gather(&listener, root, n_ranks, deadline, &mut socks)?;
    } else {
        join_root(root, n_ranks, rank, deadline, &mut socks)?;
    }
    let mut peers = Vec::with_capacity(n_ranks as usize);
    for (peer, s) in socks.into_iter().enumerate() {
        let Some(s) = s else {
            peers.push(None);
            continue;
        };
        let e = io(HCCL_E_TCP_CONNECT, "socket setup");
        s.set_nodelay(true).map_err(&e)?;
        s.set_read_timeout(None).map_err(&e)?;
        s.set_write_timeout(Some(t.exec)).map_err(&e)?;
        let inbox = Arc::new(Inbox::default());
        let reader = spawn_reader(rank, peer as u32, s.try_clone().map_err(&e)?, inbox.clone())?;
        peers.push(Some(Peer {
            writer: Mutex::new(s),
            inbox,
            reader: Mutex::new(Some(reader)),
        }));
    }
    Ok(Mesh {
        rank,
        n_ranks,
        peers,
    })
}

/// Rank 0: accept every other rank's hello, check they are this job with this size, answer
/// with the table of listening addresses (or the reason the group cannot form).
fn root_gather(
    listener: &TcpListener,
    root: &RootInfo,
    n_ranks: u32,
    deadline: Instant,
    socks: &mut [Option<TcpStream>],
) -> EmuResult<()> {
    let mut addrs: Vec<SocketAddr> = vec![root.addr; n_ranks as usize];
    let mut joined = 1u32;
    let mut failure: Option<(HcclResult, String)> = None;
    while joined < n_ranks && failure.is_none() {
        let Some(mut s) =
            accept_until(listener, deadline).map_err(io(HCCL_E_TCP_CONNECT, "accepting ranks"))?
        else {
            let missing: Vec<usize> = (1..n_ranks as usize)
                .filter(|&r| socks[r].is_none())
                .collect();
            failure = Some((
                HCCL_E_TIMEOUT,
                format!(
                    "rank(s) {missing:?} did not join within HCCL_CONNECT_TIMEOUT (a group of \
                     {n_ranks}: are they running, with this root info?)"
                ),
            ));
            break;
        };
        let _ = s.set_read_timeout(Some(left(deadline)));
        let Ok(h) = read_hello(&mut s) else {
            continue; // not one of ours: a port scan or a stray client
        };
        if h.nonce != root.nonce {
            let _ = write_table(&mut s, Err((HCCL_E_PARA, "root info of another job")));
            continue;
        }
        let problem = if h.n_ranks != n_ranks {
            Some(format!(
                "rank {} called HcclCommInitRootInfo with nRanks {}, rank 0 with {n_ranks}",
                h.rank, h.n_ranks
            ))
        } else if h.rank == 0 || h.rank >= n_ranks || socks[h.rank as usize].is_some() {
            Some(format!(
                "two processes joined as rank {} (or rank 0 joined twice) of a group of {n_ranks}",
                h.rank
            ))
        } else {
            None
        };
        if let Some(p) = problem {
            let _ = write_table(&mut s, Err((HCCL_E_PARA, &p)));
            failure = Some((HCCL_E_PARA, p));
            break;
        }
        addrs[h.rank as usize] = h.listen.unwrap_or(root.addr);
        socks[h.rank as usize] = Some(s);
        joined += 1;
    }
    for s in socks.iter_mut().flatten() {
        let r = match &failure {
            None => write_table(s, Ok(&addrs)),
            Some((c, why)) => write_table(s, Err((*c, why))),
        };
        if let Err(e) = r {
            failure.get_or_insert((HCCL_E_TCP_CONNECT, format!("answering a rank: {e}")));
        }
    }
    match failure {
        None => Ok(()),
        Some((c, why)) => Err(err(c, why)),
    }
}

/// Ranks > 0: hello to rank 0, get the table, connect to the lower ranks, accept the higher.
fn join_root(
    root: &RootInfo,
    n_ranks: u32,
    rank: u32,
    deadline: Instant,
    socks: &mut [Option<TcpStream>],
) -> EmuResult<()> {
    let mut to_root = connect_retry(root.addr, deadline, "rank 0")?;
    // Listen on the interface that reaches the root (loopback for one host).
    let ip = to_root
        .local_addr()
        .map_err(io(HCCL_E_TCP_CONNECT, "local address"))?
        .ip();
    let listener = TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(io(HCCL_E_TCP_CONNECT, "listening for peers"))?;
    let listen = listener
        .local_addr()
        .map_err(io(HCCL_E_TCP_CONNECT, "listening for peers"))?;
    let hello = Hello {
        nonce: root.nonce,
        n_ranks,
        rank,
        listen: Some(listen),
    };
    write_hello(&mut to_root, &hello).map_err(io(HCCL_E_TCP_CONNECT, "hello to rank 0"))?;
    let _ = to_root.set_read_timeout(Some(left(deadline)));
    let table = match read_table(&mut to_root) {
        Ok(Ok(t)) => t,
        Ok(Err((code, why))) => return Err(err(code, format!("rank 0 refused the group: {why}"))),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            return Err(err(
                HCCL_E_TIMEOUT,
                "the group did not form within HCCL_CONNECT_TIMEOUT (some rank never joined)",
            ))
        }
        Err(e) => return Err(err(HCCL_E_TCP_CONNECT, format!("rank 0's answer: {e}"))),
    };
    if table.len() != n_ranks as usize {
        return Err(err(HCCL_E_PARA, "rank 0 sent a table of another size"));
    }
    socks[0] = Some(to_root);
    for (peer, &addr) in table.iter().enumerate().take(rank as usize).skip(1) {
        let mut s = connect_retry(addr, deadline, &format!("rank {peer}"))?;
        let h = Hello {
            nonce: root.nonce,
            n_ranks,
            rank,
            listen: None,
        };
        write_hello(&mut s, &h).map_err(io(HCCL_E_TCP_CONNECT, "hello to a peer"))?;
        socks[peer] = Some(s);
    }
    let mut expected = n_ranks - 1 - rank;
    while expected > 0 {
        let Some(mut s) =
            accept_until(&listener, deadline).map_err(io(HCCL_E_TCP_CONNECT, "accepting peers"))?
        else {
            let missing: Vec<u32> = (rank + 1..n_ranks)
                .filter(|&r| socks[r as usize].is_none())
                .collect();
            return Err(err(
                HCCL_E_TIMEOUT,
                format!("rank(s) {missing:?} did not connect within HCCL_CONNECT_TIMEOUT"),
            ));
        };
        let _ = s.set_read_timeout(Some(left(deadline)));
        let Ok(h) = read_hello(&mut s) else { continue };
        if h.nonce != root.nonce
            || h.rank <= rank
            || h.rank >= n_ranks
            || socks[h.rank as usize].is_some()
        {
            continue;
        }
        socks[h.rank as usize] = Some(s);
        expected -= 1;
    }
    Ok(())
}

#[cfg(test)]
mod wire_tests {
    use super::*;

    /// A rank table's declared length is checked before its buffer is made: a peer declaring
    /// 4 GiB got a 4 GiB vector before.
    #[test]
    fn a_rank_table_past_the_cap_is_refused_unread() {
        let mut bytes = u32::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"0 127.0.0.1:1");
        let e = read_table(&mut bytes.as_slice()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("at most 1048576"), "{e}");
        let text = b"0 127.0.0.1:1,[::1]:2";
        let mut ok = (text.len() as u32).to_le_bytes().to_vec();
        ok.extend_from_slice(text);
        let addrs = read_table(&mut ok.as_slice()).unwrap().unwrap();
        assert_eq!(addrs.len(), 2);
    }
}
