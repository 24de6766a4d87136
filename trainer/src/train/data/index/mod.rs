//! The index cache (LLaMA-Factory's and MindSpeed-MM's `cache_dir`): what reading a dataset
//! produced (every sample's ids, labels, image paths and sizes, line; the stats; the bad
//! records' messages; the dropped lines), kept in `data.cache_dir` so that a run reads it in
//! a moment instead of tokenizing the set and reading every image header again, and so that
//! the ranks of a node read it once between them.
//!
//! One file per key ([`index_key`]): a hash of the dataset file (path, size, modification
//! time), the tokenizer's contents, every setting that shapes samples, and the versions of
//! the file format and of the sample rules. Inputs that change make another key, so a stale
//! file is never found; a file that is cut or damaged fails its checks
//! (`codec::decode`), is ignored and is rewritten. The images are not part of the key (a
//! stat of each would cost what the cache saves): an image replaced in place by one of
//! another size is found when its sample is loaded ([`crate::train::data::DataError::ImageChanged`])
//! and skipped.
//!
//! Writing: to a temporary name, then renamed, so a reader sees a whole file or none. The
//! first rank to miss takes a lock on `<file>.lock` and reads the dataset; the others wait
//! on the lock and then read its file (a lock whose holder dies is released with it).

mod codec;

pub use super::hash::hash64;
pub use codec::FORMAT_VERSION;

use super::dataset::{DataSet, SampleSettings};
use super::info::DatasetSpec;
use super::{DataError, Result, Tekken};
use crate::train::digest::hex;
use sha2::{Digest, Sha256};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bumped whenever reading a dataset gives other samples from the same inputs (template,
/// truncation, schema, image size rules): part of every key, so that a build which reads
/// datasets differently never takes an older build's index.
pub const SAMPLES_VERSION: u32 = 2;

/// How [`DataSet::open_cached`] got its dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexUse {
    /// Read from this cache file.
    Hit(PathBuf),
    /// Read from the dataset and written to this cache file; `replaced` says why a file
    /// already there was not used (damaged, cut short).
    Written {
        path: PathBuf,
        replaced: Option<String>,
    },
    /// Read from the dataset; the cache file could not be written (a read-only or full
    /// cache folder does not stop a run: it only costs the next one the same read).
    Unwritten { path: PathBuf, reason: String },
}

impl IndexUse {
    /// The cache file.
    pub fn path(&self) -> &Path {
        match self {
            IndexUse::Hit(p) => p,
            IndexUse::Written { path, .. } | IndexUse::Unwritten { path, .. } => path,
        }
    }

    /// One line for the start of a run.
    pub fn describe(&self) -> String {
        match self {
            IndexUse::Hit(p) => format!("index read from the cache ({})", p.display()),
            IndexUse::Written { path, replaced } => {
                let why = replaced
                    .as_ref()
                    .map(|r| format!(", replacing one that was not usable: {r}"))
                    .unwrap_or_default();
                format!("index written to the cache ({}{why})", path.display())
            }
            IndexUse::Unwritten { path, reason } => {
                format!("index not cached ({}: {reason})", path.display())
            }
        }
    }
}

/// The key of the index of `spec` read with `tok` and `s`: SHA-256 over the format and
/// sample-rule versions, the crate version, the spec (name, file, image folder, schema), the
/// dataset file's canonical path, size and modification time, the tokenizer's contents and
/// vocabulary size, and `max_len`, the system prompt and every image setting that decides a
/// size (longest edge, patch, merge, rounding, pixel limits; not mean and std, which only
/// change pixels). The working folder is in it when a path of the spec is relative (the
/// samples' image paths are then relative too).
pub fn index_key(spec: &DatasetSpec, tok: &Tekken, s: &SampleSettings) -> Result<[u8; 32]> {
    let meta = std::fs::metadata(&spec.file).map_err(|e| DataError::io(&spec.file, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| (d.as_secs(), d.subsec_nanos()))
        .unwrap_or_default();
    let mut h = Sha256::new();
    let mut put = |label: &str, v: &[u8]| {
        h.update(label.as_bytes());
        h.update((v.len() as u64).to_le_bytes());
        h.update(v);
    };
    put("format", &FORMAT_VERSION.to_le_bytes());
    put("samples", &SAMPLES_VERSION.to_le_bytes());
    put("crate", env!("CARGO_PKG_VERSION").as_bytes());
    put("spec", format!("{spec:?}").as_bytes());
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    put("file", format!("{:?}", canonical(&spec.file)).as_bytes());
    put(
        "media",
        format!("{:?}", canonical(&spec.media_dir)).as_bytes(),
    );
    if spec.file.is_relative() || spec.media_dir.is_relative() {
        let cwd = std::env::current_dir().unwrap_or_default();
        put("cwd", format!("{cwd:?}").as_bytes());
    }
    put("size", &meta.len().to_le_bytes());
    put("mtime_s", &mtime.0.to_le_bytes());
    put("mtime_ns", &mtime.1.to_le_bytes());
    put("tokenizer", &tok.fingerprint().to_le_bytes());
    put("vocab_size", &tok.vocab_size().to_le_bytes());
    put("max_len", &(s.max_len as u64).to_le_bytes());
    put("system", format!("{:?}", s.system_prompt).as_bytes());
    put("labels", format!("{:?}", s.labels).as_bytes());
    let i = s.image;
    put(
        "image",
        format!(
            "{} {} {} {} {:?} {:?}",
            i.longest_edge,
            i.patch_size,
            i.merge_size,
            i.round_to_merged_patch,
            i.max_pixels,
            i.min_pixels
        )
        .as_bytes(),
    );
    Ok(h.finalize().into())
}

/// Where the index of `spec` read with `tok` and `s` is kept in `cache_dir`:
/// `<dataset name>-<key>.idx` (the name for people, the key for the program).
pub fn index_file(
    cache_dir: &Path,
    spec: &DatasetSpec,
    tok: &Tekken,
    s: &SampleSettings,
) -> Result<PathBuf> {
    Ok(cache_dir.join(file_name(spec, &index_key(spec, tok, s)?)))
}

fn file_name(spec: &DatasetSpec, key: &[u8; 32]) -> String {
    let stem = match &spec.name {
        Some(n) => n.clone(),
        None => spec
            .file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
    };
    let stem: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    format!("{stem}-{}.idx", hex(&key[..16]))
}

impl DataSet {
    /// [`DataSet::open`] through the index cache in `cache_dir`: the cached index when there
    /// is a valid one for these inputs, else the dataset read and its index written (see the
    /// module docs). Gives the same dataset either way.
    pub fn open_cached(
        spec: &DatasetSpec,
        tok: &Tekken,
        s: &SampleSettings,
        cache_dir: &Path,
    ) -> Result<(Self, IndexUse)> {
        s.check()?;
        let key = index_key(spec, tok, s)?;
        let file = cache_dir.join(file_name(spec, &key));
        let mut unusable = match read(&file, &key, spec) {
            Ok(Some(ds)) => return Ok((ds, IndexUse::Hit(file))),
            Ok(None) => None,
            Err(why) => Some(why),
        };
        // One rank reads the dataset; the others wait here and then find its file.
        let lock = lock(&file);
        if lock.is_some() {
            match read(&file, &key, spec) {
                Ok(Some(ds)) => return Ok((ds, IndexUse::Hit(file))),
                Ok(None) => {}
                Err(why) => unusable = Some(why),
            }
        }
        let ds = DataSet::open(spec, tok, s)?;
        let used = match write(&file, &ds, &key) {
            Ok(()) => IndexUse::Written {
                path: file,
                replaced: unusable,
            },
            Err(reason) => IndexUse::Unwritten { path: file, reason },
        };
        drop(lock);
        Ok((ds, used))
    }
}

/// The index in `file`: None when there is none, Err(why) when it is there but not usable.
fn read(
    file: &Path,
    key: &[u8; 32],
    spec: &DatasetSpec,
) -> std::result::Result<Option<DataSet>, String> {
    let bytes = match std::fs::read(file) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let d = codec::decode(&bytes, key)?;
    Ok(Some(DataSet {
        path: spec.file.clone(),
        spec: spec.clone(),
        layout: d.layout,
        samples: d.samples,
        bad: d.bad,
        dropped: d.dropped,
        stats: d.stats,
    }))
}

/// An exclusive lock on `<file>.lock`, held until dropped; None when the folder or the lock
/// cannot be made (the rank then reads the dataset itself, as without a cache).
fn lock(file: &Path) -> Option<File> {
    let dir = file.parent()?;
    std::fs::create_dir_all(dir).ok()?;
    let mut name = file.as_os_str().to_owned();
    name.push(".lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(PathBuf::from(name))
        .ok()?;
    f.lock().ok()?;
    Some(f)
}

/// Writes `ds`'s index to a temporary name beside `file` and renames it over `file`: ranks
/// racing without a lock each rename a whole file, and the last one stays.
fn write(file: &Path, ds: &DataSet, key: &[u8; 32]) -> std::result::Result<(), String> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let bytes = codec::encode(ds, key)?;
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(format!(
        ".tmp.{}.{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = PathBuf::from(tmp);
    // No fsync: a file lost or cut by a crash fails its checks and is written again.
    let done = std::fs::write(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, file));
    done.map_err(|e| {
        std::fs::remove_file(&tmp).ok();
        e.to_string()
    })
}
