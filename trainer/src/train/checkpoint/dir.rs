//! The folder a run checkpoints into: finding complete checkpoints, the latest one, pruning.

use super::error::{io, CheckpointError, Result};
use super::manifest::MANIFEST_FILE;
use std::path::{Path, PathBuf};

/// A folder of `step-<N>/` checkpoints (and, while a save runs, one `step-<N>.tmp/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointDir {
    root: PathBuf,
}

/// `step-000123`: zero-padded so a directory listing sorts by step (steps past 999999 get
/// more digits; the step is always parsed, never compared as text).
pub fn step_dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// The step of a complete checkpoint's directory name (None for `.tmp`, `.old` and others).
pub fn parse_step_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

impl CheckpointDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CheckpointDir { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where step `step`'s checkpoint is (or would be).
    pub fn path(&self, step: u64) -> PathBuf {
        self.root.join(step_dir_name(step))
    }

    /// Where step `step`'s unfinished save writes.
    pub fn tmp_path(&self, step: u64) -> PathBuf {
        self.root.join(format!("{}.tmp", step_dir_name(step)))
    }

    /// Complete checkpoints (a `step-<N>` directory holding `manifest.json`), ascending by
    /// step. A missing root has none.
    pub fn complete(&self) -> Result<Vec<(u64, PathBuf)>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.root)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.root))?;
            let name = entry.file_name();
            let Some(step) = name.to_str().and_then(parse_step_dir) else {
                continue;
            };
            let path = entry.path();
            if path.join(MANIFEST_FILE).is_file() {
                out.push((step, path));
            }
        }
        out.sort();
        Ok(out)
    }

    /// The newest complete checkpoint.
    pub fn latest(&self) -> Result<Option<(u64, PathBuf)>> {
        Ok(self.complete()?.pop())
    }

    /// Unfinished saves (`step-<N>.tmp`) and replaced checkpoints (`step-<N>.old`) left by a
    /// crash.
    pub fn unfinished(&self) -> Result<Vec<PathBuf>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.root)(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.root))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let stem = name
                .strip_suffix(".tmp")
                .or_else(|| name.strip_suffix(".old"));
            if stem.and_then(parse_step_dir).is_some() {
                out.push(entry.path());
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes all but the newest `keep_last` complete checkpoints (0 keeps all) and the
    /// leftovers of crashed saves; returns what it removed.
    pub fn prune(&self, keep_last: usize) -> Result<Vec<PathBuf>> {
        let mut removed = Vec::new();
        for path in self.unfinished()? {
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
            removed.push(path);
        }
        if keep_last > 0 {
            let complete = self.complete()?;
            let n = complete.len().saturating_sub(keep_last);
            for (_, path) in complete.into_iter().take(n) {
                // The manifest goes first: a crash half-way through the removal leaves a
                // directory that is no longer taken for a complete checkpoint.
                let manifest = path.join(MANIFEST_FILE);
                std::fs::remove_file(&manifest).map_err(io(&manifest))?;
                std::fs::remove_dir_all(&path).map_err(io(&path))?;
                removed.push(path);
            }
        }
        Ok(removed)
    }
}

/// A checkpoint directory named by the user: itself if it holds a manifest, else the newest
/// complete checkpoint under it (a run's checkpoint folder).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join(MANIFEST_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    if !path.is_dir() {
        return Err(CheckpointError::Io {
            path: path.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
        });
    }
    CheckpointDir::new(path)
        .latest()?
        .map(|(_, p)| p)
        .ok_or_else(|| CheckpointError::NoCheckpoint(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_parse_back_and_leftovers_do_not() {
        assert_eq!(step_dir_name(123), "step-000123");
        assert_eq!(parse_step_dir("step-000123"), Some(123));
        assert_eq!(parse_step_dir("step-1234567"), Some(1234567));
        for bad in [
            "step-000123.tmp",
            "step-000123.old",
            "step-",
            "step-1a",
            "latest",
        ] {
            assert_eq!(parse_step_dir(bad), None, "{bad}");
        }
    }
}
