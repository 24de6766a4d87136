//! The job token that admits a rank to the store, and the HMAC that proves it without sending
//! it: the server sends a fresh random nonce, the client answers
//! `HMAC-SHA256(token, "cannon-store-v1 client" || server nonce || client nonce || rank ||
//! world)`, and the server proves it knows the token too with the same MAC under the label
//! `"cannon-store-v1 server"`. A recorded exchange is useless for another connection (new
//! nonces), and the token itself never crosses the network.
//!
//! Where the token comes from: `CANNON_JOB_TOKEN` (what `cannon launch` sets, one per job), or
//! `CANNON_JOB_TOKEN_FILE`, a file only its owner may read (several nodes of one job share a
//! token that way without it showing in `ps` or a scheduler's job record).

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::comm::error::{CommError, CommResult};

/// The variable holding the token.
pub const TOKEN_ENV: &str = "CANNON_JOB_TOKEN";
/// The variable naming a file that holds the token.
pub const TOKEN_FILE_ENV: &str = "CANNON_JOB_TOKEN_FILE";
/// The shortest token taken: a MAC over a public nonce can be tried offline against guessed
/// tokens, so a short one would be found from one recorded handshake.
pub const MIN_TOKEN_BYTES: usize = 16;
/// The longest (a token file that is really something else should not be read whole).
const MAX_TOKEN_BYTES: usize = 4096;

/// Bytes of a nonce and of a MAC.
pub const NONCE_BYTES: usize = 32;
pub const MAC_BYTES: usize = 32;

const CLIENT_LABEL: &[u8] = b"cannon-store-v1 client";
const SERVER_LABEL: &[u8] = b"cannon-store-v1 server";

/// A job's shared secret. Its `Debug` shows no byte of it (errors and logs print options).
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken(Vec<u8>);

impl std::fmt::Debug for JobToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JobToken(<{} bytes>)", self.0.len())
    }
}

impl JobToken {
    /// A token from its text (surrounding white space, e.g. a file's newline, is not part of
    /// it). `source` names where it came from, for the error.
    pub fn new(text: &str, source: &'static str) -> CommResult<Self> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_BYTES {
            return Err(CommError::Env {
                var: source,
                detail: format!(
                    "a job token of {} bytes is too short to keep strangers out (at least \
                     {MIN_TOKEN_BYTES}; `cannon launch` makes 64 hex digits: use e.g. \
                     `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'`)",
                    t.len()
                ),
            });
        }
        if t.len() > MAX_TOKEN_BYTES {
            return Err(CommError::Env {
                var: source,
                detail: format!(
                    "a job token of {} bytes (at most {MAX_TOKEN_BYTES})",
                    t.len()
                ),
            });
        }
        Ok(JobToken(t.as_bytes().to_vec()))
    }

    /// The token of this process: `CANNON_JOB_TOKEN`, or the file `CANNON_JOB_TOKEN_FILE`
    /// names, or none. Both set is an error (which one would the other ranks use?).
    pub fn from_lookup(get: &impl Fn(&str) -> Option<String>) -> CommResult<Option<Self>> {
        let inline = get(TOKEN_ENV).filter(|v| !v.trim().is_empty());
        let file = get(TOKEN_FILE_ENV).filter(|v| !v.trim().is_empty());
        match (inline, file) {
            (Some(_), Some(_)) => Err(CommError::Env {
                var: TOKEN_ENV,
                detail: format!("set, and so is {TOKEN_FILE_ENV}: set one of them"),
            }),
            (Some(t), None) => JobToken::new(&t, TOKEN_ENV).map(Some),
            (None, Some(path)) => JobToken::from_file(Path::new(path.trim())).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The token in `path`, which must be a regular file that neither its group nor others
    /// may read or write (as ssh insists on for a private key).
    pub fn from_file(path: &Path) -> CommResult<Self> {
        use std::os::unix::fs::PermissionsExt;
        let bad = |detail: String| CommError::Env {
            var: TOKEN_FILE_ENV,
            detail: format!("{}: {detail}", path.display()),
        };
        let f = std::fs::File::open(path).map_err(|e| bad(format!("cannot open it: {e}")))?;
        let meta = f.metadata().map_err(|e| bad(e.to_string()))?;
        if !meta.is_file() {
            return Err(bad("not a regular file".into()));
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "mode {mode:03o} lets other users read or change the job token: \
                 `chmod 600 {}`",
                path.display()
            )));
        }
        let mut text = String::new();
        f.take(MAX_TOKEN_BYTES as u64 + 64)
            .read_to_string(&mut text)
            .map_err(|e| bad(format!("cannot read it as text: {e}")))?;
        JobToken::new(&text, TOKEN_FILE_ENV)
    }

    /// A fresh token for one job: 32 bytes of the kernel's randomness as 64 hex digits.
    pub fn generate_hex() -> std::io::Result<String> {
        Ok(random_bytes()?.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// What a client sends to prove it holds the token.
    pub(super) fn client_mac(&self, challenge: &Challenge) -> [u8; MAC_BYTES] {
        self.mac(CLIENT_LABEL, challenge)
    }

    /// What the server answers to prove it holds the token too.
    pub(super) fn server_mac(&self, challenge: &Challenge) -> [u8; MAC_BYTES] {
        self.mac(SERVER_LABEL, challenge)
    }

    fn mac(&self, label: &[u8], c: &Challenge) -> [u8; MAC_BYTES] {
        hmac_sha256(
            &self.0,
            &[
                label,
                &c.server_nonce,
                &c.client_nonce,
                &c.rank.to_le_bytes(),
                &c.world.to_le_bytes(),
            ],
        )
    }
}

/// What one handshake's MACs cover.
#[derive(Debug, Clone, Copy)]
pub(super) struct Challenge {
    pub server_nonce: [u8; NONCE_BYTES],
    pub client_nonce: [u8; NONCE_BYTES],
    pub rank: u64,
    pub world: u64,
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `parts`. Written out over the `sha2` crate the
/// workspace already uses: the construction is a dozen lines and tested against RFC 4231.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let inner = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner);
    outer.finalize().into()
}

/// Equality whose time does not depend on where the inputs first differ (a MAC compared
/// byte by byte with an early exit tells a prober how many leading bytes it got right).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// 32 bytes from the kernel's random source. No fallback: a guessable nonce would let a
/// recorded handshake be replayed.
pub(super) fn random_bytes() -> std::io::Result<[u8; NONCE_BYTES]> {
    let mut b = [0u8; NONCE_BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// RFC 4231, test cases 1, 2, 3, 4, 6 and 7 (5 is a truncated MAC), HMAC-SHA-256 column.
    #[test]
    fn hmac_matches_rfc_4231() {
        let cases: [(Vec<u8>, Vec<u8>, &str); 6] = [
            (
                vec![0x0b; 20],
                b"Hi There".to_vec(),
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe".to_vec(),
                b"what do ya want for nothing?".to_vec(),
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                vec![0xaa; 20],
                vec![0xdd; 50],
                "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe",
            ),
            (
                hex("0102030405060708090a0b0c0d0e0f10111213141516171819"),
                vec![0xcd; 50],
                "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b",
            ),
            (
                vec![0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First".to_vec(),
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
            (
                vec![0xaa; 131],
                b"This is a test using a larger than block-size key and a larger than \
                  block-size data. The key needs to be hashed before being used by the HMAC \
                  algorithm."
                    .to_vec(),
                "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2",
            ),
        ];
        for (i, (key, data, want)) in cases.iter().enumerate() {
            assert_eq!(hmac_sha256(key, &[data]).to_vec(), hex(want), "case {i}");
            // Split input: the MAC is of the concatenation.
            let (a, b) = data.split_at(data.len() / 3);
            assert_eq!(hmac_sha256(key, &[a, b]).to_vec(), hex(want), "case {i}");
        }
    }

    #[test]
    fn macs_bind_every_field_and_the_side() {
        let t = JobToken::new("0123456789abcdef-job", TOKEN_ENV).unwrap();
        let c = Challenge {
            server_nonce: [1; NONCE_BYTES],
            client_nonce: [2; NONCE_BYTES],
            rank: 3,
            world: 4,
        };
        let m = t.client_mac(&c);
        assert_ne!(
            m,
            t.server_mac(&c),
            "a client MAC must not pass as the server's"
        );
        for other in [
            Challenge {
                server_nonce: [9; NONCE_BYTES],
                ..c
            },
            Challenge {
                client_nonce: [9; NONCE_BYTES],
                ..c
            },
            Challenge { rank: 2, ..c },
            Challenge { world: 5, ..c },
        ] {
            assert_ne!(m, t.client_mac(&other));
        }
        let u = JobToken::new("0123456789abcdef-jox", TOKEN_ENV).unwrap();
        assert_ne!(m, u.client_mac(&c));
        assert!(constant_time_eq(&m, &t.client_mac(&c)));
        assert!(!constant_time_eq(&m, &u.client_mac(&c)));
        assert!(!constant_time_eq(&m, &m[..31]));
        assert!(
            !format!("{t:?}").contains("0123"),
            "Debug must not show the token"
        );
    }

    #[test]
    fn token_sources_are_checked() {
        let none = |_: &str| None;
        assert_eq!(JobToken::from_lookup(&none).unwrap(), None);
        let short = JobToken::new("abc", TOKEN_ENV).unwrap_err();
        assert!(short.to_string().contains("too short"), "{short}");
        let both = |k: &str| Some(format!("{k}-0123456789abcdef"));
        let e = JobToken::from_lookup(&both).unwrap_err();
        assert!(e.to_string().contains("set one of them"), "{e}");

        let dir = std::env::temp_dir().join(format!("cannon-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "fedcba9876543210fedcba\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let get = |k: &str| (k == TOKEN_FILE_ENV).then(|| path.display().to_string());
        let e = JobToken::from_lookup(&get).unwrap_err();
        assert!(
            matches!(
                e,
                CommError::Env {
                    var: TOKEN_FILE_ENV,
                    ..
                }
            ) && e.to_string().contains("mode 640")
                && e.to_string().contains("chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = JobToken::from_lookup(&get).unwrap().unwrap();
        assert_eq!(
            t,
            JobToken::new("fedcba9876543210fedcba", TOKEN_ENV).unwrap()
        );
        let _ = std::fs::remove_dir_all(&dir);

        let a = JobToken::generate_hex().unwrap();
        let b = JobToken::generate_hex().unwrap();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
