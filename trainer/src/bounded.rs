//! Reading small files whose content nobody here wrote (configs, indexes, dataset info, the
//! system prompt): the size is checked before a byte is read, so a file as large as the disk
//! is an error naming it, not an allocation that aborts the process. Imports nothing of the
//! crate, so every tier may use it.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// The largest small text file read (a TOML run config, dataset_info.json, a model folder's
/// config.json or system prompt): such files are kilobytes; 16 MiB is far past any of them.
pub const MAX_SMALL_FILE: u64 = 16 << 20;

/// The bytes of `path`, or an `InvalidData` error when it holds more than `limit` bytes. The
/// read stops at `limit + 1` bytes even if the file grows while being read.
pub fn read_capped(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let file = std::fs::File::open(path)?;
    let len = file.metadata()?.len();
    if len > limit {
        return Err(too_large(len, limit));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(bytes.len() as u64, limit));
    }
    Ok(bytes)
}

/// [`read_capped`] as UTF-8 text.
pub fn read_to_string_capped(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, limit)?)
        .map_err(|_| Error::new(ErrorKind::InvalidData, "not UTF-8 text"))
}

fn too_large(len: u64, limit: u64) -> Error {
    Error::new(
        ErrorKind::InvalidData,
        format!("{len} bytes, past {limit}, the largest this file may be"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_past_the_limit_are_named_errors_and_others_read_whole() {
        let dir = std::env::temp_dir().join(format!("cannon-bounded-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.txt");
        std::fs::write(&p, "héllo").unwrap();
        assert_eq!(read_to_string_capped(&p, 6).unwrap(), "héllo");
        let e = read_to_string_capped(&p, 5).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidData);
        assert!(e.to_string().contains("6 bytes, past 5"), "{e}");
        std::fs::write(&p, [0xffu8, 0xfe]).unwrap();
        assert!(read_to_string_capped(&p, 6).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
