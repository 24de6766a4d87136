//! Durable file-system commits: a file or a folder is made complete under a temporary name,
//! fsynced, renamed into place, and the folder holding it fsynced, so that after a crash or a
//! power cut a reader finds either the old state or the whole new one, never half of it.
//! Checkpoints, the final model and `cannon export` commit through these.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// An I/O error with the path it happened on (the callers' error types take it as their own
/// `Io { path, source }`).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct FsError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

pub type Result<T> = std::result::Result<T, FsError>;

fn at(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |source| FsError {
        path: path.to_path_buf(),
        source,
    }
}

/// The folder an entry `path` lives in (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// fsyncs a directory, so the entries created, renamed or removed in it are durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

/// Writes `bytes` to a new `path` and fsyncs the file (not its folder: the caller commits
/// the folder, or uses [`replace_file`]).
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(at(path))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(at(path))
}

/// A name beside `path` no other process picks: `<path>.<tag>-<pid>-<nanos>`.
pub fn unique_sibling(path: &Path, tag: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{tag}-{}-{nanos}", std::process::id()));
    PathBuf::from(name)
}

/// Renames `from` to `to` and fsyncs the folders of both, so the rename survives a crash.
pub fn rename_synced(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(at(from))?;
    let (a, b) = (parent_of(from), parent_of(to));
    sync_dir(b)?;
    if a != b {
        sync_dir(a)?;
    }
    Ok(())
}

/// Replaces (or creates) the file `path` with `bytes` atomically: written and fsynced under
/// a unique temporary name beside it, renamed over it, the folder fsynced. A reader sees the
/// old contents or the new, never a truncated file.
pub fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = unique_sibling(path, "partial");
    if let Err(e) = write_synced(&tmp, bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    rename_synced(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Whether an I/O error is the file system running out of space (or quota).
pub fn is_no_space(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || e.raw_os_error() == Some(libc::ENOSPC)
        || e.raw_os_error() == Some(libc::EDQUOT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cannon-durable-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn replace_file_swaps_contents_and_leaves_no_temporary() {
        let d = scratch("replace");
        let f = d.join("config.json");
        replace_file(&f, b"one").unwrap();
        replace_file(&f, b"two").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_failed_replace_keeps_the_old_file_and_names_the_path() {
        let d = scratch("replace-fail");
        // A folder where the file should go: the rename over it fails.
        let f = d.join("taken");
        std::fs::create_dir(&f).unwrap();
        std::fs::write(f.join("inside"), b"x").unwrap();
        let err = replace_file(&f, b"new").unwrap_err();
        assert!(err.to_string().contains("taken"), "{err}");
        assert!(f.join("inside").is_file());
        // The temporary was removed.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
    }

    #[test]
    fn unique_siblings_differ_and_stay_beside() {
        let p = Path::new("/x/out");
        let (a, b) = (unique_sibling(p, "tmp"), unique_sibling(p, "tmp"));
        assert_ne!(a, b);
        assert_eq!(a.parent(), Some(Path::new("/x")));
        assert!(a.to_string_lossy().starts_with("/x/out.tmp-"));
    }

    #[test]
    fn no_space_is_recognised() {
        assert!(is_no_space(&std::io::Error::from_raw_os_error(
            libc::ENOSPC
        )));
        assert!(!is_no_space(&std::io::Error::from_raw_os_error(
            libc::EACCES
        )));
    }
}
