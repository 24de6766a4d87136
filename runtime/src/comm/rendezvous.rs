//! Process-group bootstrap for multi-process backends (HCCL): the torchrun-style environment
//! and the rendezvous that ships rank 0's opaque root info to every other rank: a TCP store at
//! `MASTER_ADDR:MASTER_PORT` ([`TcpStore`], as torch's) or a file on a shared directory
//! ([`FileRendezvous`]). [`Rendezvous::from_env`] picks one.
//!
//! Environment:
//! - `RANK`, `WORLD_SIZE`, `LOCAL_RANK`: as torchrun (and `cannon launch`) set them (all
//!   required).
//! - `CANNON_RDZV_DIR`: a directory every rank can see (a shared filesystem across hosts); when
//!   set, the file rendezvous is used.
//! - otherwise `MASTER_ADDR` and `MASTER_PORT`: rank 0 serves a TCP store there, the others
//!   connect to it (torchrun's variables).
//! - `CANNON_JOB_TOKEN` (or `CANNON_JOB_TOKEN_FILE`, a file only its owner can read): the
//!   job's secret, which a rank must prove (never send) to join the store; required when the
//!   store listens beyond loopback. `cannon launch` makes one per job.
//! - `CANNON_STORE_BIND`: the address rank 0's store listens on, instead of MASTER_ADDR's
//!   (`0.0.0.0` for every interface).
//! - `CANNON_RDZV_ID` (else `TORCHELASTIC_RUN_ID`, else `default`): names this job's file or
//!   keys, so concurrent jobs sharing a directory do not read each other's root info.
//!
//! File: rank 0 writes `<dir>/cannon-rdzv-<id>.bin` atomically (temporary file, then rename),
//! others poll until it appears. The file records the world size, so a stale file from a run
//! with another world size is an error rather than a hang inside HCCL; rank 0 deletes the file
//! once the communicator is up (HCCL init is collective, so by then every rank has read it).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{CommError, CommResult};
pub use super::store::auth::{self, JobToken};
pub use super::store::{Refusals, StoreLimits, StoreOptions, TcpStore};

/// Where this process sits in the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
}

impl DistEnv {
    /// Reads `RANK`, `WORLD_SIZE` and `LOCAL_RANK` from the process environment.
    pub fn from_env() -> CommResult<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`DistEnv::from_env`], with the variables looked up through `get` (testable).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> CommResult<Self> {
        let num = |var: &'static str| -> CommResult<usize> {
            let v = get(var).ok_or_else(|| CommError::Env {
                var,
                detail: "not set (launch one process per NPU with torchrun-style RANK, \
                         WORLD_SIZE, LOCAL_RANK)"
                    .into(),
            })?;
            v.trim().parse().map_err(|_| CommError::Env {
                var,
                detail: format!("{v:?} is not a non-negative integer"),
            })
        };
        let env = DistEnv {
            rank: num("RANK")?,
            world_size: num("WORLD_SIZE")?,
            local_rank: num("LOCAL_RANK")?,
        };
        if env.world_size == 0 {
            return Err(CommError::Env {
                var: "WORLD_SIZE",
                detail: "must be at least 1".into(),
            });
        }
        if env.rank >= env.world_size {
            return Err(CommError::Env {
                var: "RANK",
                detail: format!("{} is not below WORLD_SIZE {}", env.rank, env.world_size),
            });
        }
        Ok(env)
    }
}

const MAGIC: &[u8; 8] = b"CNRDZV01";
const HEADER: usize = 24;

/// A one-shot file rendezvous: one publisher, any number of readers.
#[derive(Debug, Clone)]
pub struct FileRendezvous {
    dir: PathBuf,
    run_id: String,
}

impl FileRendezvous {
    /// `run_id` may hold letters, digits, `_`, `-` and `.` (it becomes part of a file name).
    pub fn new(dir: impl Into<PathBuf>, run_id: &str) -> CommResult<Self> {
        let dir = dir.into();
        let ok = !run_id.is_empty()
            && run_id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !ok {
            return Err(CommError::Rendezvous {
                path: dir.display().to_string(),
                detail: format!("run id {run_id:?} must be non-empty [A-Za-z0-9_.-]"),
            });
        }
        Ok(FileRendezvous {
            dir,
            run_id: run_id.to_string(),
        })
    }

    /// From `CANNON_RDZV_DIR` and `CANNON_RDZV_ID` / `TORCHELASTIC_RUN_ID` (see the module doc).
    pub fn from_env() -> CommResult<Self> {
        let dir = std::env::var("CANNON_RDZV_DIR").map_err(|_| CommError::Env {
            var: "CANNON_RDZV_DIR",
            detail: "not set: a directory all ranks share, for the HCCL root info".into(),
        })?;
        let id = std::env::var("CANNON_RDZV_ID")
            .or_else(|_| std::env::var("TORCHELASTIC_RUN_ID"))
            .unwrap_or_else(|_| "default".into());
        Self::new(dir, &id)
    }

    /// A rendezvous in the same directory whose run id extends this one's (sub-group
    /// bootstraps: `<id>.<suffix>`).
    pub fn child(&self, suffix: &str) -> CommResult<Self> {
        Self::new(&self.dir, &format!("{}.{suffix}", self.run_id))
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(format!("cannon-rdzv-{}.bin", self.run_id))
    }

    /// Writes `payload` for a world of `world_size` (rank 0). Atomic: readers never see a
    /// partial file.
    pub fn publish(&self, world_size: usize, payload: &[u8]) -> CommResult<()> {
        let path = self.path();
        let tmp = self.dir.join(format!(
            ".cannon-rdzv-{}.{}.tmp",
            self.run_id,
            std::process::id()
        ));
        let mut bytes = Vec::with_capacity(HEADER + payload.len());
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&(world_size as u64).to_le_bytes());
        bytes.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        bytes.extend_from_slice(payload);
        let write = || -> std::io::Result<()> {
            fs::create_dir_all(&self.dir)?;
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)
        };
        write().map_err(|e| io_err(&path, "publish", e))
    }

    /// Polls every `poll` until the file appears (up to `timeout`) and returns its payload,
    /// which must be `payload_len` bytes for a world of `world_size`.
    pub fn wait(
        &self,
        world_size: usize,
        payload_len: usize,
        timeout: Duration,
        poll: Duration,
    ) -> CommResult<Vec<u8>> {
        let path = self.path();
        let start = Instant::now();
        loop {
            match fs::read(&path) {
                Ok(bytes) => return parse(&path, &bytes, world_size, payload_len),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path, "read", e)),
            }
            if start.elapsed() >= timeout {
                return Err(CommError::Rendezvous {
                    path: path.display().to_string(),
                    detail: format!(
                        "rank 0 did not publish the root info within {timeout:?} (is it running, \
                         with the same CANNON_RDZV_DIR and run id?)"
                    ),
                });
            }
            std::thread::sleep(poll.min(timeout.saturating_sub(start.elapsed())));
        }
    }

    /// Deletes the file (rank 0, once every rank has read it). A missing file is fine.
    pub fn remove(&self) -> CommResult<()> {
        let path = self.path();
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path, "remove", e)),
        }
    }
}

fn parse(path: &Path, bytes: &[u8], world_size: usize, payload_len: usize) -> CommResult<Vec<u8>> {
    let bad = |detail: String| CommError::Rendezvous {
        path: path.display().to_string(),
        detail,
    };
    if bytes.len() < HEADER || &bytes[..8] != MAGIC {
        return Err(bad("not a cannon rendezvous file".into()));
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[i..i + 8]);
        u64::from_le_bytes(w)
    };
    let (world, len) = (word(8), word(16));
    if world != world_size as u64 {
        return Err(bad(format!(
            "written for a world of {world}, this job has {world_size} (a stale file from \
             another run? delete it or set CANNON_RDZV_ID)"
        )));
    }
    if len != payload_len as u64 || bytes.len() != HEADER + payload_len {
        return Err(bad(format!(
            "payload of {} bytes (header says {len}), expected {payload_len}",
            bytes.len() - HEADER
        )));
    }
    Ok(bytes[HEADER..].to_vec())
}

fn io_err(path: &Path, what: &str, e: std::io::Error) -> CommError {
    CommError::Rendezvous {
        path: path.display().to_string(),
        detail: format!("{what}: {e}"),
    }
}

/// How often the file rendezvous looks for rank 0's file.
const FILE_POLL: Duration = Duration::from_millis(20);

/// Where rank 0's root info goes and where the others find it.
#[derive(Debug, Clone)]
pub enum Rendezvous {
    /// A file in a shared directory.
    File(FileRendezvous),
    /// A key (`<prefix>/root`) of the TCP store that rank 0 of the job serves.
    Tcp {
        store: Arc<TcpStore>,
        prefix: String,
    },
}

impl From<FileRendezvous> for Rendezvous {
    fn from(f: FileRendezvous) -> Self {
        Rendezvous::File(f)
    }
}

fn run_id(get: &impl Fn(&str) -> Option<String>) -> String {
    get("CANNON_RDZV_ID")
        .or_else(|| get("TORCHELASTIC_RUN_ID"))
        .unwrap_or_else(|| "default".into())
}

impl Rendezvous {
    /// The job's rendezvous from the environment (see the module doc): `CANNON_RDZV_DIR` if
    /// set, else the TCP store at `MASTER_ADDR:MASTER_PORT` (rank 0 serves it; `timeout`
    /// bounds connecting and every wait on it).
    pub fn from_env(env: &DistEnv, timeout: Duration) -> CommResult<Self> {
        Self::from_lookup(|k| std::env::var(k).ok(), env, timeout)
    }

    /// As [`Rendezvous::from_env`], with variables looked up through `get` (testable).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
        env: &DistEnv,
        timeout: Duration,
    ) -> CommResult<Self> {
        let id = run_id(&get);
        if let Some(dir) = get("CANNON_RDZV_DIR").filter(|d| !d.is_empty()) {
            return FileRendezvous::new(dir, &id).map(Rendezvous::File);
        }
        let addr = get("MASTER_ADDR").filter(|a| !a.trim().is_empty());
        let port = get("MASTER_PORT");
        let (addr, port) = match (addr, port) {
            (Some(a), Some(p)) => (a, p),
            (None, None) => {
                return Err(CommError::Env {
                    var: "MASTER_ADDR",
                    detail: "not set, nor CANNON_RDZV_DIR: set MASTER_ADDR and MASTER_PORT \
                             (rank 0 serves a TCP store there; `cannon launch` does it), or \
                             CANNON_RDZV_DIR to a directory all ranks share"
                        .into(),
                })
            }
            (None, Some(_)) => {
                return Err(CommError::Env {
                    var: "MASTER_ADDR",
                    detail: "not set but MASTER_PORT is: set both".into(),
                })
            }
            (Some(_), None) => {
                return Err(CommError::Env {
                    var: "MASTER_PORT",
                    detail: "not set but MASTER_ADDR is: set both".into(),
                })
            }
        };
        let port: u16 = match port.trim().parse() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(CommError::Env {
                    var: "MASTER_PORT",
                    detail: format!("{port:?} is not a port number (1-65535)"),
                })
            }
        };
        let options = StoreOptions::from_lookup(&get)?;
        let store = TcpStore::connect_with(
            addr.trim(),
            port,
            env.rank,
            env.world_size,
            timeout,
            &options,
        )?;
        Ok(Rendezvous::Tcp {
            store: Arc::new(store),
            prefix: id,
        })
    }

    /// A rendezvous for a sub-group bootstrap (`<id>.<suffix>`), in the same directory or
    /// store.
    pub fn child(&self, suffix: &str) -> CommResult<Self> {
        match self {
            Rendezvous::File(f) => f.child(suffix).map(Rendezvous::File),
            Rendezvous::Tcp { store, prefix } => Ok(Rendezvous::Tcp {
                store: store.clone(),
                prefix: format!("{prefix}.{suffix}"),
            }),
        }
    }

    /// Where the root info goes, for messages.
    pub fn describe(&self) -> String {
        match self {
            Rendezvous::File(f) => f.path().display().to_string(),
            Rendezvous::Tcp { store, prefix } => format!("{}/{prefix}/root", store.addr()),
        }
    }

    /// Rank 0: makes `payload` (for a world of `world_size`) available to the others.
    pub fn publish(&self, world_size: usize, payload: &[u8]) -> CommResult<()> {
        match self {
            Rendezvous::File(f) => f.publish(world_size, payload),
            Rendezvous::Tcp { store, prefix } => {
                let mut v = (world_size as u64).to_le_bytes().to_vec();
                v.extend_from_slice(payload);
                store.set(&format!("{prefix}/root"), &v)
            }
        }
    }

    /// The other ranks: rank 0's payload, which must be `payload_len` bytes for a world of
    /// `world_size`, waiting at most `timeout`.
    pub fn wait(
        &self,
        world_size: usize,
        payload_len: usize,
        timeout: Duration,
    ) -> CommResult<Vec<u8>> {
        match self {
            Rendezvous::File(f) => f.wait(world_size, payload_len, timeout, FILE_POLL),
            Rendezvous::Tcp { store, prefix } => {
                let v = store.get(&format!("{prefix}/root"), timeout)?;
                let world = v
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes);
                if world != Some(world_size as u64) {
                    return Err(CommError::WorldSizeMismatch {
                        addr: store.addr().to_string(),
                        ours: world_size,
                        theirs: world.unwrap_or(0) as usize,
                    });
                }
                if v.len() != 8 + payload_len {
                    return Err(CommError::Store {
                        addr: store.addr().to_string(),
                        detail: format!(
                            "root info of {} bytes, expected {payload_len}",
                            v.len() - 8
                        ),
                    });
                }
                Ok(v[8..].to_vec())
            }
        }
    }

    /// Rank 0, once every rank joined: removes the published root info.
    pub fn remove(&self) -> CommResult<()> {
        match self {
            Rendezvous::File(f) => f.remove(),
            Rendezvous::Tcp { store, prefix } => store.delete(&format!("{prefix}/root")),
        }
    }
}
