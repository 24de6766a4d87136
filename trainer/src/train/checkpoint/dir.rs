//! The folder a run checkpoints into: finding complete checkpoints, the latest one, pruning,
//! and putting back in order what a crash in the middle of a save left.
//!
//! A step's checkpoint can be on disk under three names: `step-N/` (committed and in place),
//! `step-N.tmp/` (being written; committed once its `manifest.json` is there, the completion
//! marker written last) and `step-N.old/` (the previous copy of the same step, moved aside
//! while a new one takes its place). Of those holding a manifest, a reader takes the `.tmp`
//! (the newest state of the step), else `step-N/`, else the `.old`: whichever point a save
//! stopped at, the newest complete checkpoint is found. [`CheckpointDir::recover`] renames it
//! back to `step-N/`; everything else is a leftover, and the only thing pruning removes
//! besides checkpoints past `keep_last`.

use super::error::{io, CheckpointError, Result};
use super::manifest::MANIFEST_FILE;
use crate::durable::{rename_synced, sync_dir};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The points of a save and a prune a test can stop at ([`CheckpointDir::with_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveStep {
    /// Before the rank file's tensor of this index is written.
    RankTensor(usize),
    /// Rank files, `config.json` and the extra files written; no manifest yet.
    FilesWritten,
    /// The manifest written under its temporary name, not yet renamed to `manifest.json`.
    ManifestWritten,
    /// `manifest.json` in place in `step-N.tmp/`: the save is complete.
    Marked,
    /// The step's previous checkpoint moved to `step-N.old/` (a step saved twice).
    MovedAside,
    /// `step-N.tmp/` renamed to `step-N/`, the root not yet fsynced.
    Renamed,
    /// The root fsynced, `step-N.old/` not yet removed.
    Synced,
    /// A pruned checkpoint's manifest removed, its folder not yet.
    Pruning,
}

/// How an injected fault fails: as a killed process (nothing after it runs), or as a write
/// that found the disk full (the save's own error handling runs).
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    Crash,
    NoSpace,
}

/// A folder of `step-<N>/` checkpoints (and, while a save runs, one `step-<N>.tmp/`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointDir {
    root: PathBuf,
    /// Test-only: the point a save or prune stops at, and how.
    #[cfg(test)]
    pub(crate) fault: Option<(SaveStep, Fault)>,
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

/// Whether a checkpoint folder is complete: its manifest, written last, is there.
fn is_complete(dir: &Path) -> bool {
    dir.join(MANIFEST_FILE).is_file()
}

/// The names one step's checkpoint has on disk.
#[derive(Debug, Default)]
struct Slots {
    main: Option<PathBuf>,
    tmp: Option<PathBuf>,
    old: Option<PathBuf>,
}

impl Slots {
    /// The copy a reader takes (see the module docs).
    fn chosen(&self) -> Option<&PathBuf> {
        [&self.tmp, &self.main, &self.old]
            .into_iter()
            .flatten()
            .find(|p| is_complete(p))
    }

    /// Every name but the chosen one.
    fn leftovers(&self) -> Vec<PathBuf> {
        let chosen = self.chosen();
        [&self.main, &self.tmp, &self.old]
            .into_iter()
            .flatten()
            .filter(|p| Some(*p) != chosen)
            .cloned()
            .collect()
    }
}

impl CheckpointDir {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        CheckpointDir {
            root: root.into(),
            #[cfg(test)]
            fault: None,
        }
    }

    /// Test-only: stops the next saves and prunes at `step` (see [`Fault`]).
    #[cfg(test)]
    pub(crate) fn with_fault(mut self, step: SaveStep, how: Fault) -> Self {
        self.fault = Some((step, how));
        self
    }

    /// The injected fault at `_at`, if a test set one there.
    pub(crate) fn fault_at(&self, _at: SaveStep) -> Result<()> {
        #[cfg(test)]
        match self.fault {
            Some((s, Fault::Crash)) if s == _at => {
                return Err(CheckpointError::Injected("crash injected by a test"));
            }
            Some((s, Fault::NoSpace)) if s == _at => {
                return Err(CheckpointError::Io {
                    path: self.root.clone(),
                    source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                });
            }
            _ => {}
        }
        Ok(())
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

    /// Where step `step`'s previous checkpoint waits while a new one of the same step takes
    /// its place.
    pub fn old_path(&self, step: u64) -> PathBuf {
        self.root.join(format!("{}.old", step_dir_name(step)))
    }

    /// Every step's names on disk. A missing root has none.
    fn scan(&self) -> Result<BTreeMap<u64, Slots>> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(io(&self.root)(e)),
        };
        let mut out: BTreeMap<u64, Slots> = BTreeMap::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.root))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let (stem, which) = if let Some(s) = name.strip_suffix(".tmp") {
                (s, 1)
            } else if let Some(s) = name.strip_suffix(".old") {
                (s, 2)
            } else {
                (name, 0)
            };
            let Some(step) = parse_step_dir(stem) else {
                continue;
            };
            if !entry.path().is_dir() {
                continue;
            }
            let slots = out.entry(step).or_default();
            let slot = match which {
                0 => &mut slots.main,
                1 => &mut slots.tmp,
                _ => &mut slots.old,
            };
            *slot = Some(entry.path());
        }
        Ok(out)
    }

    /// Complete checkpoints, ascending by step: per step the copy a reader takes (usually
    /// `step-N/`; after a crash in a save, see the module docs). A missing root has none.
    pub fn complete(&self) -> Result<Vec<(u64, PathBuf)>> {
        Ok(self
            .scan()?
            .into_iter()
            .filter_map(|(step, s)| s.chosen().map(|p| (step, p.clone())))
            .collect())
    }

    /// The newest complete checkpoint.
    pub fn latest(&self) -> Result<Option<(u64, PathBuf)>> {
        Ok(self.complete()?.pop())
    }

    /// What crashed saves and prunes left that no reader takes: unfinished `step-N.tmp/`
    /// (no manifest), a `step-N.old/` or a half-removed `step-N/` beside a complete copy.
    pub fn unfinished(&self) -> Result<Vec<PathBuf>> {
        let mut out: Vec<PathBuf> = self.scan()?.values().flat_map(Slots::leftovers).collect();
        out.sort();
        Ok(out)
    }

    /// Puts each step's complete copy back under `step-N/` where a crash left it as
    /// `step-N.tmp/` or `step-N.old/`; returns the steps put back. Leaves the leftovers.
    pub fn recover(&self) -> Result<Vec<u64>> {
        let mut done = Vec::new();
        for (step, slots) in self.scan()? {
            let dest = self.path(step);
            match slots.chosen() {
                Some(p) if *p == dest => {}
                Some(p) if Some(p) == slots.tmp.as_ref() => {
                    self.install(p, step, |_| Ok(()))?;
                    done.push(step);
                }
                Some(p) => {
                    // The `.old` copy, with no complete `step-N/` or `.tmp` beside it.
                    if dest.exists() {
                        std::fs::remove_dir_all(&dest).map_err(io(&dest))?;
                    }
                    rename_synced(p, &dest)?;
                    done.push(step);
                }
                None => {}
            }
        }
        Ok(done)
    }

    /// Moves the complete `tmp` into place as step `step`'s checkpoint: a `step-N/` already
    /// there goes to `step-N.old/` first (a rename cannot replace a non-empty directory) and
    /// is removed once the new one is in place and the root fsynced. `fault` is the test
    /// hook between the renames.
    pub(crate) fn install(
        &self,
        tmp: &Path,
        step: u64,
        fault: impl Fn(SaveStep) -> Result<()>,
    ) -> Result<PathBuf> {
        let dest = self.path(step);
        let aside = self.old_path(step);
        if dest.exists() {
            // An `.old` beside a complete `.tmp` is an older copy still: the `.tmp` wins.
            if aside.exists() {
                std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
            }
            std::fs::rename(&dest, &aside).map_err(io(&dest))?;
            sync_dir(&self.root)?;
            fault(SaveStep::MovedAside)?;
        }
        std::fs::rename(tmp, &dest).map_err(io(tmp))?;
        fault(SaveStep::Renamed)?;
        sync_dir(&self.root)?;
        fault(SaveStep::Synced)?;
        if aside.exists() {
            std::fs::remove_dir_all(&aside).map_err(io(&aside))?;
        }
        Ok(dest)
    }

    /// Removes step `step`'s `.tmp` unless it is complete: after a save failed with an error
    /// (a full disk), so its partial files do not hold the space until the next save.
    pub(crate) fn discard_unfinished(&self, step: u64) {
        let tmp = self.tmp_path(step);
        if tmp.is_dir() && !is_complete(&tmp) {
            let _ = std::fs::remove_dir_all(&tmp);
        }
    }

    /// Removes every leftover ([`Self::unfinished`]); returns them.
    pub(crate) fn remove_leftovers(&self) -> Result<Vec<PathBuf>> {
        let leftovers = self.unfinished()?;
        for path in &leftovers {
            std::fs::remove_dir_all(path).map_err(io(path))?;
        }
        Ok(leftovers)
    }

    /// Puts crashed saves' complete copies back ([`Self::recover`]), removes the leftovers,
    /// then all but the newest `keep_last` complete checkpoints (0 keeps all); returns what
    /// it removed. A complete copy is never removed unless `keep_last` newer ones exist.
    pub fn prune(&self, keep_last: usize) -> Result<Vec<PathBuf>> {
        self.recover()?;
        let mut removed = self.remove_leftovers()?;
        if keep_last > 0 {
            let complete = self.complete()?;
            let n = complete.len().saturating_sub(keep_last);
            for (_, path) in complete.into_iter().take(n) {
                // The manifest goes first: a crash half-way through the removal leaves a
                // directory that is no longer taken for a complete checkpoint.
                let manifest = path.join(MANIFEST_FILE);
                std::fs::remove_file(&manifest).map_err(io(&manifest))?;
                self.fault_at(SaveStep::Pruning)?;
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
