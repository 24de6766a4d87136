//! The TCP store against strangers speaking raw TCP: each is refused (and recorded), and the
//! job's ranks still complete their rendezvous. The strangers speak the wire format of
//! `comm::store::wire` by hand; a stranger holding the right token is admitted (the control
//! showing that the hand-made frames are right, so the refusals are for the reasons tested).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use cannon_runtime::comm::rendezvous::auth::hmac_sha256;
use cannon_runtime::comm::rendezvous::{JobToken, Rendezvous, StoreLimits, StoreOptions, TcpStore};
use cannon_runtime::comm::CommError;

const TOKEN: &str = "5f1e0c8a2b7d4e6f9a3c1b0d8e7f6a5b";
const OP_HELLO: u8 = 1;
const OP_SET: u8 = 2;
const ST_OK: u8 = 0;
const ST_ERR: u8 = 3;
const ST_AUTH: u8 = 4;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn options(token: Option<&str>, handshake: Duration) -> StoreOptions {
    StoreOptions {
        token: token.map(|t| JobToken::new(t, "CANNON_JOB_TOKEN").unwrap()),
        bind: None,
        limits: StoreLimits {
            handshake,
            ..StoreLimits::default()
        },
    }
}

/// A raw connection that has read the server's greeting: (socket, token required, nonce).
fn greeted(port: u16) -> (TcpStream, bool, [u8; 32]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 41];
    s.read_exact(&mut g).unwrap();
    assert_eq!(&g[..8], b"CNSTORE1");
    (s, g[8] & 1 != 0, g[9..].try_into().unwrap())
}

fn frame(op: u8, key: &[u8], value: &[u8], arg: u64) -> Vec<u8> {
    let mut f = vec![op];
    f.extend_from_slice(&(key.len() as u32).to_le_bytes());
    f.extend_from_slice(key);
    f.extend_from_slice(&(value.len() as u32).to_le_bytes());
    f.extend_from_slice(value);
    f.extend_from_slice(&arg.to_le_bytes());
    f
}

/// HELLO for `rank` of `world`, with the MAC under `token` when given.
fn hello(nonce: &[u8; 32], world: u64, rank: u64, token: Option<&str>) -> Vec<u8> {
    let cnonce = [0x5a; 32];
    let mut v = Vec::new();
    v.extend_from_slice(&world.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(&cnonce);
    if let Some(t) = token {
        v.extend_from_slice(&hmac_sha256(
            t.as_bytes(),
            &[
                b"cannon-store-v1 client",
                nonce,
                &cnonce,
                &rank.to_le_bytes(),
                &world.to_le_bytes(),
            ],
        ));
    }
    frame(OP_HELLO, b"", &v, 0)
}

fn reply_raw(s: &mut TcpStream) -> (u8, Vec<u8>) {
    let mut st = [0u8; 5];
    s.read_exact(&mut st).unwrap();
    let n = u32::from_le_bytes(st[1..].try_into().unwrap()) as usize;
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).unwrap();
    (st[0], b)
}

fn reply(s: &mut TcpStream) -> (u8, String) {
    let (st, b) = reply_raw(s);
    (st, String::from_utf8_lossy(&b).into_owned())
}

/// The server closed the connection (end of stream or reset) within `within`.
fn closed(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// Polls until the server recorded `n` refusals (they are recorded as their threads end).
fn refusals_reach(store: &TcpStore, n: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = store.refusals().unwrap();
        if r.total >= n || Instant::now() > deadline {
            assert!(
                r.total >= n,
                "{} refusals, expected {n}: {:?}",
                r.total,
                r.recent
            );
            return r.recent;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn strangers_are_refused_and_the_ranks_still_meet() {
    let port = free_port();
    let t = Duration::from_secs(20);
    let short = Duration::from_millis(400);
    let root =
        TcpStore::connect_with("127.0.0.1", port, 0, 4, t, &options(Some(TOKEN), short)).unwrap();
    assert_eq!(root.refusals().unwrap().total, 0);

    // No token: refused, and its claim on rank 1 does not stick.
    let (mut s, required, nonce) = greeted(port);
    assert!(required, "a store with a token asks for it");
    s.write_all(&hello(&nonce, 4, 1, None)).unwrap();
    let (st, msg) = reply(&mut s);
    assert_eq!(st, ST_AUTH, "{msg}");
    assert!(msg.contains("CANNON_JOB_TOKEN"), "{msg}");
    assert!(closed(&mut s, Duration::from_secs(5)));

    // A wrong token.
    let (mut s, _, nonce) = greeted(port);
    s.write_all(&hello(&nonce, 4, 1, Some("not-the-token-0123456789abcdef")))
        .unwrap();
    let (st, msg) = reply(&mut s);
    assert_eq!(st, ST_AUTH, "{msg}");
    assert!(msg.contains("wrong job token"), "{msg}");
    assert!(closed(&mut s, Duration::from_secs(5)));

    // The right MAC, but for another nonce (a replayed HELLO).
    let (mut s, _, _) = greeted(port);
    s.write_all(&hello(&[0u8; 32], 4, 1, Some(TOKEN))).unwrap();
    assert_eq!(reply(&mut s).0, ST_AUTH);

    // SET before HELLO.
    let (mut s, _, _) = greeted(port);
    s.write_all(&frame(OP_SET, b"default/root", &[1, 2, 3], 0))
        .unwrap();
    let (st, msg) = reply(&mut s);
    assert_eq!(st, ST_ERR, "{msg}");
    assert!(msg.contains("HELLO"), "{msg}");
    assert!(closed(&mut s, Duration::from_secs(5)));

    // With the token (a rank that is misconfigured rather than a stranger): a rank past the
    // world, and rank 0 a second time.
    let (mut s, _, nonce) = greeted(port);
    s.write_all(&hello(&nonce, 4, 4, Some(TOKEN))).unwrap();
    let (st, msg) = reply(&mut s);
    assert_eq!(st, ST_ERR, "{msg}");
    assert!(msg.contains("not below the world size 4"), "{msg}");
    let (mut s, _, nonce) = greeted(port);
    s.write_all(&hello(&nonce, 4, 0, Some(TOKEN))).unwrap();
    let (st, msg) = reply(&mut s);
    assert_eq!(st, ST_ERR, "{msg}");
    assert!(msg.contains("rank 0 is already connected"), "{msg}");

    // An oversize HELLO (a 1 GiB value announced), garbage, and silence: dropped without an
    // answer, the silent one once its handshake time ran out.
    let (mut s, _, _) = greeted(port);
    let mut big = vec![OP_HELLO, 0, 0, 0, 0];
    big.extend_from_slice(&(1u32 << 30).to_le_bytes());
    s.write_all(&big).unwrap();
    assert!(closed(&mut s, Duration::from_secs(5)));
    let (mut s, _, _) = greeted(port);
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let _ = s.write_all(&garbage);
    assert!(closed(&mut s, Duration::from_secs(5)));
    let (mut s, _, _) = greeted(port);
    let t0 = Instant::now();
    assert!(closed(&mut s, Duration::from_secs(5)));
    assert!(
        t0.elapsed() >= short - Duration::from_millis(100),
        "{:?}",
        t0.elapsed()
    );

    let recent = refusals_reach(&root, 9);
    for want in [
        "no job token",
        "wrong job token",
        "request 2 before HELLO",
        "rank 4 of a world of 4",
        "rank 0 joined a second time",
        "malformed HELLO: a value of 1073741824 bytes",
        "request 0 before HELLO",
        "no request within the handshake",
    ] {
        assert!(
            recent.iter().any(|r| r.contains(want)),
            "{want:?} in {recent:#?}"
        );
    }

    // The control: the hand-made HELLO with the right token is admitted (as rank 3), and an
    // admitted connection sending an oversize value is dropped.
    let (mut s, _, nonce) = greeted(port);
    s.write_all(&hello(&nonce, 4, 3, Some(TOKEN))).unwrap();
    let (st, proof) = reply_raw(&mut s);
    assert_eq!(st, ST_OK, "{}", String::from_utf8_lossy(&proof));
    // The server's proof that it holds the token: the MAC of the same handshake under the
    // server's label.
    let want = hmac_sha256(
        TOKEN.as_bytes(),
        &[
            b"cannon-store-v1 server",
            &nonce,
            &[0x5a; 32],
            &3u64.to_le_bytes(),
            &4u64.to_le_bytes(),
        ],
    );
    assert_eq!(proof, want);
    let mut over = vec![OP_SET, 1, 0, 0, 0, b'k'];
    over.extend_from_slice(&(2u32 << 20).to_le_bytes());
    s.write_all(&over).unwrap();
    assert!(closed(&mut s, Duration::from_secs(5)));

    // Ranks 1 and 2 join (the strangers took no rank) and the root info reaches them.
    let payload: Vec<u8> = (0..4108u32).map(|i| (i * 13 % 251) as u8).collect();
    let rdzv = |store: TcpStore| Rendezvous::Tcp {
        store: std::sync::Arc::new(store),
        prefix: "job".into(),
    };
    let got = std::thread::scope(|sc| {
        let ranks: Vec<_> = (1..3)
            .map(|r| {
                sc.spawn(move || {
                    let o = options(Some(TOKEN), short);
                    let st = TcpStore::connect_with("127.0.0.1", port, r, 4, t, &o).unwrap();
                    rdzv(st).wait(4, 4108, t).unwrap()
                })
            })
            .collect();
        let root = rdzv(root);
        root.publish(4, &payload).unwrap();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for g in got {
        assert_eq!(g, payload);
    }
}

#[test]
fn a_flood_of_connections_does_not_keep_the_ranks_out() {
    let port = free_port();
    let t = Duration::from_secs(20);
    // A handshake time far beyond the test's: the ranks get in because the oldest silent
    // connection is dropped for each newcomer, not because the silent ones time out.
    let long = Duration::from_secs(60);
    let root =
        TcpStore::connect_with("127.0.0.1", port, 0, 2, t, &options(Some(TOKEN), long)).unwrap();
    let mut flood: Vec<TcpStream> = (0..150)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    // And connections opened and closed at once.
    for _ in 0..100 {
        drop(TcpStream::connect(("127.0.0.1", port)).unwrap());
    }
    let t0 = Instant::now();
    let one =
        TcpStore::connect_with("127.0.0.1", port, 1, 2, t, &options(Some(TOKEN), long)).unwrap();
    root.set("k", b"v").unwrap();
    assert_eq!(one.get("k", t).unwrap(), b"v");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    // At most world + 8 connections wait in handshake: the rest of the flood was dropped.
    let still_open = flood
        .iter_mut()
        .filter_map(|s| (!closed(s, Duration::from_millis(20))).then_some(()))
        .count();
    assert!(
        still_open <= 2 + 8,
        "{still_open} flood connections still open"
    );
    refusals_reach(&root, 150 - 10);
}

#[test]
fn the_store_listens_on_master_addr_and_wants_a_token_beyond_loopback() {
    let t = Duration::from_secs(10);
    let short = Duration::from_secs(2);
    // Loopback MASTER_ADDR: loopback only, no token needed.
    let port = free_port();
    let s = TcpStore::connect("127.0.0.1", port, 0, 1, t).unwrap();
    let at = s.listen_addr().unwrap();
    assert!(at.ip().is_loopback(), "{at}");
    drop(s);

    // Every interface only when asked, and then only with a token.
    let port = free_port();
    let mut o = options(None, short);
    o.bind = Some("0.0.0.0".into());
    let e = TcpStore::connect_with("127.0.0.1", port, 0, 2, t, &o).unwrap_err();
    assert!(
        matches!(
            e,
            CommError::Env {
                var: "CANNON_JOB_TOKEN",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("0.0.0.0"), "{e}");
    let mut o = options(Some(TOKEN), short);
    o.bind = Some("0.0.0.0".into());
    let root = TcpStore::connect_with("127.0.0.1", port, 0, 2, t, &o).unwrap();
    assert!(root.listen_addr().unwrap().ip().is_unspecified());
    let one = TcpStore::connect_with("127.0.0.1", port, 1, 2, t, &o).unwrap();
    one.set("a", b"1").unwrap();
    assert_eq!(root.get("a", t).unwrap(), b"1");
    drop(one);
    drop(root);

    // An address that is not this host's (TEST-NET-1): a clear error, not a store elsewhere.
    let e = TcpStore::connect_with(
        "192.0.2.1",
        free_port(),
        0,
        2,
        t,
        &options(Some(TOKEN), short),
    )
    .unwrap_err();
    assert!(e.to_string().contains("192.0.2.1"), "{e}");
}

#[test]
fn ranks_with_different_tokens_get_a_clear_error() {
    let t = Duration::from_secs(10);
    let short = Duration::from_secs(2);
    let port = free_port();
    let root =
        TcpStore::connect_with("127.0.0.1", port, 0, 2, t, &options(Some(TOKEN), short)).unwrap();
    let other = "0000111122223333444455556666";
    let e = TcpStore::connect_with("127.0.0.1", port, 1, 2, t, &options(Some(other), short))
        .unwrap_err();
    assert!(
        matches!(e, CommError::StoreAuth { .. }) && e.to_string().contains("wrong job token"),
        "{e}"
    );
    let e = TcpStore::connect_with("127.0.0.1", port, 1, 2, t, &options(None, short)).unwrap_err();
    assert!(e.to_string().contains("requires the job token"), "{e}");
    // The refused attempts took no rank: rank 1 with the token joins.
    let one =
        TcpStore::connect_with("127.0.0.1", port, 1, 2, t, &options(Some(TOKEN), short)).unwrap();
    drop(one);
    drop(root);

    // A store without a token (loopback) and a rank that has one: the environments differ.
    let port = free_port();
    let root = TcpStore::connect("127.0.0.1", port, 0, 2, t).unwrap();
    let e = TcpStore::connect_with("127.0.0.1", port, 1, 2, t, &options(Some(TOKEN), short))
        .unwrap_err();
    assert!(e.to_string().contains("does not ask for one"), "{e}");
    drop(root);
}
