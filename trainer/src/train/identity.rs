//! `run_identity.json`: what a run was made of, so that two runs can be told apart or shown to
//! be the same: the source revision the binary was built from (`git describe` at build time),
//! the versions, SHA-256 of every input file (dataset, held-out set, tokenizer, config, weights),
//! the command line, the machine, and the environment variables that change behaviour.

use super::digest::{sha256_file, DigestError};
use rayon::prelude::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `git describe --always --dirty --tags` of the trainer's sources at build time, or
/// "unknown" when the build had no git.
pub const SOURCE_REVISION: &str = env!("CANNON_GIT_DESCRIBE");
/// The compiler that built this binary.
pub const RUSTC_VERSION: &str = env!("CANNON_RUSTC_VERSION");
/// The workspace version (every cannon crate shares it).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// One input file and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileDigest {
    pub path: PathBuf,
    pub bytes: u64,
    pub sha256: String,
}

impl FileDigest {
    /// Reads and digests `path`; an error names it.
    pub fn of(path: &Path) -> Result<Self, DigestError> {
        let bytes = std::fs::metadata(path)
            .map_err(|source| DigestError {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        Ok(FileDigest {
            path: path.to_path_buf(),
            bytes,
            sha256: sha256_file(path)?,
        })
    }
}

/// The whole record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunIdentity {
    pub source_revision: String,
    pub versions: BTreeMap<String, String>,
    /// Input files by role: `dataset`, `eval_dataset`, `tokenizer`, `config` (the file given
    /// with --config), `effective_config` (the run folder's config.toml), `weights/<name>`.
    pub files: BTreeMap<String, FileDigest>,
    pub command: Vec<String>,
    pub host: BTreeMap<String, String>,
    /// RAYON_NUM_THREADS and every CANNON_* and ASCEND_* variable that is set.
    pub env: BTreeMap<String, String>,
    /// The GEMM peak a training run's `mfu` divides by, as measured at its start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gemm_peak: Option<crate::train::flops::PeakProbe>,
}

/// Environment variables that change what a run does or how fast: the thread pool's size,
/// the project's own switches, and CANN's. The job token is recorded as set, never its value
/// (run folders get copied and shared; the token admits ranks to a running job's store).
pub fn behaviour_env() -> BTreeMap<String, String> {
    behaviour_env_of(std::env::vars())
}

fn behaviour_env_of(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.filter(|(k, _)| {
        k == "RAYON_NUM_THREADS" || k.starts_with("CANNON_") || k.starts_with("ASCEND_")
    })
    .map(|(k, v)| match k.as_str() {
        "CANNON_JOB_TOKEN" => (k, "<set, not recorded>".into()),
        _ => (k, v),
    })
    .collect()
}

/// The CPU's model name (from /proc/cpuinfo where there is one) and its thread count.
pub fn host() -> BTreeMap<String, String> {
    let mut h = BTreeMap::new();
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    h.insert("cpu".into(), model);
    h.insert(
        "threads".into(),
        std::thread::available_parallelism()
            .map(|n| n.get().to_string())
            .unwrap_or_else(|_| "unknown".into()),
    );
    h.insert("os".into(), std::env::consts::OS.into());
    h.insert("arch".into(), std::env::consts::ARCH.into());
    h
}

/// The digests of `files` (role, path) by role; a file that cannot be read is an error
/// naming it.
///
/// The files are digested over the thread pool, one file a task (a sharded checkpoint's
/// shards are many large files; a file's SHA-256 is one sequential chain), the largest first
/// so that the last to finish is a small one.
pub fn digest_files(
    files: &[(String, PathBuf)],
) -> Result<BTreeMap<String, FileDigest>, DigestError> {
    let mut order: Vec<(u64, &(String, PathBuf))> = files
        .iter()
        // A file without metadata is reported by its digest below.
        .map(|f| (std::fs::metadata(&f.1).map_or(0, |m| m.len()), f))
        .collect();
    order.sort_by_key(|&(len, _)| std::cmp::Reverse(len));
    order
        .into_par_iter()
        .with_max_len(1)
        .map(|(_, (role, path))| Ok((role.clone(), FileDigest::of(path)?)))
        .collect()
}

/// The nice value of the threads of [`digest_files_beside`]: the scheduler gives a busy
/// core's time to the default-priority threads about ten to one (CFS weights 1024 / 110),
/// and an idle core's to the digest.
#[cfg(target_os = "linux")]
const BESIDE_NICE: libc::c_int = 10;

/// [`digest_files`] on threads of their own at a low CPU priority, for a digest that runs
/// beside work that matters more: a run's start-up, which reads the same weight files. On a
/// 2-core host hashing a 3.5 GB checkpoint (about 2 s of SHA-NI) took a core from the
/// start-up's reads and zeroing; at low priority it takes the time they leave (a cold read's
/// waits, then the steps' gaps), and the run waits for it only at its end, where the record
/// is written.
pub fn digest_files_beside(
    files: &[(String, PathBuf)],
) -> Result<BTreeMap<String, FileDigest>, DigestError> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(rayon::current_num_threads())
        .thread_name(|i| format!("cannon-digest-{i}"))
        .start_handler(|_| lower_priority())
        .build();
    match pool {
        Ok(pool) => pool.install(|| digest_files(files)),
        // No threads to be had: the global pool at its priority.
        Err(_) => digest_files(files),
    }
}

/// Lowers the calling thread's CPU priority to [`BESIDE_NICE`]; threads it starts (a digest's
/// reader) inherit it. Best effort: a refusal leaves the priority as it was.
fn lower_priority() {
    // SAFETY: plain system calls on the calling thread's id (Linux: the nice value is a
    // per-thread attribute, and PRIO_PROCESS with a thread id sets that thread's alone).
    #[cfg(target_os = "linux")]
    unsafe {
        let tid = libc::gettid() as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, BESIDE_NICE);
    }
}

impl RunIdentity {
    /// The record of a run over `files` (role, path), digested by [`digest_files`].
    pub fn new(files: &[(String, PathBuf)]) -> Result<Self, DigestError> {
        Ok(Self::of_digests(digest_files(files)?))
    }

    /// The record of a run whose input files were digested already (a run digests them while
    /// its weights load).
    pub fn of_digests(files: BTreeMap<String, FileDigest>) -> Self {
        let mut versions = BTreeMap::new();
        versions.insert("cannon".into(), VERSION.into());
        versions.insert("rustc".into(), RUSTC_VERSION.into());
        RunIdentity {
            source_revision: SOURCE_REVISION.into(),
            versions,
            files,
            command: std::env::args().collect(),
            host: host(),
            env: behaviour_env(),
            gemm_peak: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_job_token_is_never_recorded() {
        let secret = "7c0ffee7c0ffee7c0ffee7c0ffee7c0ffee";
        let vars = [
            ("CANNON_JOB_TOKEN", secret),
            ("CANNON_JOB_TOKEN_FILE", "/home/u/.cannon-token"),
            ("RAYON_NUM_THREADS", "2"),
            ("HOME", "/home/u"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let env = behaviour_env_of(vars.into_iter());
        assert!(env.contains_key("CANNON_JOB_TOKEN"));
        assert!(!format!("{env:?}").contains(secret), "{env:?}");
        // A file's path is no secret (its mode keeps it private) and says how the run was made.
        assert_eq!(env["CANNON_JOB_TOKEN_FILE"], "/home/u/.cannon-token");
        assert_eq!(env["RAYON_NUM_THREADS"], "2");
        assert!(!env.contains_key("HOME"));
    }
}
