//! SHA-256 of input files, for the digests of `run_identity.json`.
//!
//! The hashing is the `sha2` crate's, which picks the CPU's SHA instructions at run time
//! (SHA-NI on x86-64, the ARMv8 SHA-2 extension on aarch64): a run digests its weights at
//! start-up, and a portable SHA-256 runs at a fraction of a disk's read rate. A file is read
//! in [`READ_PIECE`] pieces on a reader thread while the caller's thread hashes the piece
//! before, so a cold file costs about the longer of its read and its hashing, not their sum.

use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Bytes per read. Large pieces keep a cold read streaming at the disk's rate with few system
/// calls (about 6000 for a 48 GB checkpoint); a reader keeps at most three of them.
pub const READ_PIECE: usize = 8 << 20;

/// Pieces in flight per file: one being hashed, one being read, one queued between them.
const PIECES: usize = 3;

/// A file that could not be read, named.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct DigestError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// The SHA-256 of everything `r` yields, read in [`READ_PIECE`] pieces on this thread.
pub fn sha256_reader(mut r: impl Read) -> io::Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; READ_PIECE];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(hasher.finalize().into()),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The SHA-256 of everything `r` yields, read on a thread of its own while this thread hashes:
/// the two overlap, so the digest of a cold file takes about as long as reading it.
pub fn sha256_reader_overlapped(r: impl Read + Send) -> io::Result<[u8; 32]> {
    // Filled pieces go to the hasher; emptied ones come back to be filled again, so the
    // pieces are allocated once.
    let (full_tx, full_rx) = sync_channel::<Vec<u8>>(PIECES);
    let (empty_tx, empty_rx) = sync_channel::<Vec<u8>>(PIECES);
    for _ in 0..PIECES {
        // Cannot fail: the receiver is alive and the channel has room for every piece.
        let _ = empty_tx.send(vec![0u8; READ_PIECE]);
    }
    std::thread::scope(|s| {
        let reader = s.spawn(move || fill_pieces(r, empty_rx, full_tx));
        let mut hasher = Sha256::new();
        // Ends when the reader drops its sender: at the end of the input or on an error.
        for piece in full_rx.iter() {
            hasher.update(&piece);
            // The reader may have stopped already; then the piece is not needed.
            let _ = empty_tx.send(piece);
        }
        match reader.join() {
            Ok(result) => result.map(|()| hasher.finalize().into()),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// The reader's half of [`sha256_reader_overlapped`]: fills each empty piece it gets and sends
/// it on, cut to the bytes read (a short read is sent as it is; the next fills the next piece).
fn fill_pieces(
    mut r: impl Read,
    empty: Receiver<Vec<u8>>,
    full: SyncSender<Vec<u8>>,
) -> io::Result<()> {
    // No more empty pieces means the hasher has gone: nothing is waiting for the bytes.
    while let Ok(mut piece) = empty.recv() {
        piece.resize(READ_PIECE, 0);
        let n = loop {
            match r.read(&mut piece) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            return Ok(());
        }
        piece.truncate(n);
        if full.send(piece).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// The hex SHA-256 of a file's contents. Files of at most one piece are read and hashed on
/// this thread (a second thread would only add its start-up); larger ones overlap the two.
pub fn sha256_file(path: &Path) -> Result<String, DigestError> {
    let named = |source| DigestError {
        path: path.to_path_buf(),
        source,
    };
    let f = File::open(path).map_err(named)?;
    let len = f.metadata().map_err(named)?.len();
    let digest = if len <= READ_PIECE as u64 {
        sha256_reader(f)
    } else {
        sha256_reader_overlapped(f)
    };
    digest.map(|d| hex(&d)).map_err(named)
}

/// Lower-case hex of a digest.
pub fn hex(digest: &[u8]) -> String {
    use std::fmt::Write;
    digest
        .iter()
        .fold(String::with_capacity(2 * digest.len()), |mut s, b| {
            // Writing to a String cannot fail.
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that yields at most `piece` bytes a call, so block boundaries fall mid-read.
    struct Uneven<R> {
        inner: R,
        piece: usize,
    }

    impl<R: Read> Read for Uneven<R> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.piece);
            self.inner.read(&mut buf[..n])
        }
    }

    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    const MSG_448: &[u8] = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    const MSG_448_SHA: &str = "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1";
    const MILLION_A: &str = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

    fn million_a() -> impl Read + Send {
        Uneven {
            inner: io::repeat(b'a').take(1_000_000),
            piece: 999,
        }
    }

    /// FIPS 180-4 / NIST CAVP examples, through both readers.
    #[test]
    fn standard_vectors() -> io::Result<()> {
        for digest in [
            sha256_reader as fn(&'static [u8]) -> io::Result<[u8; 32]>,
            sha256_reader_overlapped,
        ] {
            assert_eq!(hex(&digest(b"")?), EMPTY);
            assert_eq!(hex(&digest(b"abc")?), ABC);
            assert_eq!(hex(&digest(MSG_448)?), MSG_448_SHA);
        }
        // One million 'a', fed in uneven pieces to cross the 64-byte blocks mid-read.
        assert_eq!(hex(&sha256_reader(million_a())?), MILLION_A);
        assert_eq!(hex(&sha256_reader_overlapped(million_a())?), MILLION_A);
        Ok(())
    }

    /// Files above one piece take the overlapped path (several pieces, a short last one); both
    /// paths agree with hashing the bytes in one call.
    #[test]
    fn files_small_and_multi_piece() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("cannon-digest-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        for len in [0, 3, READ_PIECE, 2 * READ_PIECE + 12345] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let path = dir.join(format!("f{len}"));
            std::fs::write(&path, &bytes)?;
            let want = hex(&Sha256::digest(&bytes));
            assert_eq!(sha256_file(&path)?, want, "{len} bytes");
        }
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    /// A missing file is an error naming it.
    #[test]
    fn missing_file_is_named() {
        let path = std::env::temp_dir().join("cannon-digest-no-such-file");
        let e = sha256_file(&path).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("cannon-digest-no-such-file")));
    }

    /// A read error mid-file ends the overlapped digest with that error (the reader thread
    /// stops, the hasher does not wait forever).
    #[test]
    fn read_error_mid_file() {
        struct Failing(usize);
        impl Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("disk gone"));
                }
                self.0 -= 1;
                buf.fill(1);
                Ok(buf.len())
            }
        }
        let e = sha256_reader_overlapped(Failing(5)).err();
        assert!(e.is_some_and(|e| e.to_string() == "disk gone"));
    }
}
