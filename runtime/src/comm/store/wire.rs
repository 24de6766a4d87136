//! The store's wire format (little endian), shared by the client and the server.
//!
//! - On connecting, the server greets: `"CNSTORE1"`, flags `u8` (bit 0: a job token is
//!   required), a 32-byte nonce.
//! - A request: `op u8, key (u32 length + bytes), value (u32 length + bytes), arg u64`.
//!   The first request must be HELLO, whose value is `world u64, rank u64, client nonce [32]`
//!   and, with a token, the client's MAC `[32]` (see [`super::auth`]).
//! - A reply: `status u8, body (u32 length + bytes)`. HELLO's OK body is the server's MAC (empty
//!   without a token).

use std::io::Read;
use std::net::TcpStream;
use std::time::Instant;

use super::auth::{MAC_BYTES, NONCE_BYTES};

pub const MAGIC: &[u8; 8] = b"CNSTORE1";
pub const GREETING_BYTES: usize = 8 + 1 + NONCE_BYTES;
pub const FLAG_TOKEN: u8 = 1;

pub const OP_HELLO: u8 = 1;
pub const OP_SET: u8 = 2;
pub const OP_GET: u8 = 3;
pub const OP_ADD: u8 = 4;
pub const OP_DEL: u8 = 5;

pub const ST_OK: u8 = 0;
pub const ST_TIMEOUT: u8 = 1;
pub const ST_WORLD: u8 = 2;
pub const ST_ERR: u8 = 3;
/// The job token is missing or wrong.
pub const ST_AUTH: u8 = 4;

/// HELLO's value without and with a MAC.
pub const HELLO_BYTES: usize = 16 + NONCE_BYTES;
pub const HELLO_MAC_BYTES: usize = HELLO_BYTES + MAC_BYTES;

pub fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A request's bytes.
pub fn request(op: u8, key: &[u8], value: &[u8], arg: u64) -> Vec<u8> {
    let mut req = Vec::with_capacity(17 + key.len() + value.len());
    req.push(op);
    put_bytes(&mut req, key);
    put_bytes(&mut req, value);
    req.extend_from_slice(&arg.to_le_bytes());
    req
}

/// A reply's bytes.
pub fn reply(status: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(status);
    put_bytes(&mut out, body);
    out
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg)
}

/// A length-prefixed field of at most `cap` bytes (`what` names it in the error). The length
/// is checked before anything is allocated.
pub fn read_bytes(r: &mut impl Read, cap: usize, what: &str) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > cap {
        return Err(invalid(format!(
            "a {what} of {n} bytes (the store takes at most {cap})"
        )));
    }
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)?;
    Ok(b)
}

/// One request as the server reads it.
#[derive(Debug)]
pub struct Request {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub arg: u64,
}

/// Reads the rest of a request whose op byte was read.
pub fn read_request(
    r: &mut impl Read,
    max_key: usize,
    max_value: usize,
) -> std::io::Result<Request> {
    let key = read_bytes(r, max_key, "key")?;
    let value = read_bytes(r, max_value, "value")?;
    let mut arg = [0u8; 8];
    r.read_exact(&mut arg)?;
    Ok(Request {
        key,
        value,
        arg: u64::from_le_bytes(arg),
    })
}

/// The `i`-th little-endian u64 of `b`, if it is there.
pub fn word(b: &[u8], i: usize) -> Option<u64> {
    b.get(i * 8..i * 8 + 8)
        .and_then(|w| w.try_into().ok())
        .map(u64::from_le_bytes)
}

/// Reads from a socket with every read bounded by one deadline for the whole message, so a
/// peer dribbling a byte now and then cannot hold a connection past it (a per-read timeout
/// alone would restart at every byte).
pub struct Deadline<'a> {
    pub sock: &'a TcpStream,
    pub until: Instant,
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the time for this message ran out",
            ));
        }
        self.sock.set_read_timeout(Some(left))?;
        (&mut &*self.sock).read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_past_the_cap_are_refused_before_allocation() {
        let mut b = Vec::new();
        put_bytes(&mut b, &[7; 10]);
        assert_eq!(read_bytes(&mut b.as_slice(), 10, "value").unwrap(), [7; 10]);
        let e = read_bytes(&mut b.as_slice(), 9, "value").unwrap_err();
        assert!(e.to_string().contains("a value of 10 bytes"), "{e}");
        // A length of 4 GiB with no bytes behind it: refused by the cap, not an allocation.
        let huge = u32::MAX.to_le_bytes();
        assert!(read_bytes(&mut huge.as_slice(), 1 << 20, "key").is_err());
        let req = request(OP_SET, b"k", b"vv", 9);
        let (op, rest) = req.split_first().unwrap();
        assert_eq!(*op, OP_SET);
        let r = read_request(&mut &rest[..], 4, 4).unwrap();
        assert_eq!(
            (&r.key[..], &r.value[..], r.arg),
            (&b"k"[..], &b"vv"[..], 9)
        );
        assert_eq!(word(&[1, 0, 0, 0, 0, 0, 0, 0, 2], 0), Some(1));
        assert_eq!(word(&[1, 0, 0, 0, 0, 0, 0, 0, 2], 1), None);
    }
}
