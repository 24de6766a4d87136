//! Which CANN this process loads: the variable that names the emulator and the one-time
//! choice the loader reads at its first library load. It sits below the loader (which asks
//! [`selected`]) and knows nothing of it; the rest of [`crate::emulator`], which opens
//! libraries to decide, sits above the loader.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use thiserror::Error;

/// The variable that names the emulator library.
pub const ENV: &str = "CANNON_CANN_EMULATOR";

/// The emulator's file name as cargo builds it (package `cannon-cann-emu`, a cdylib).
pub const FILE_NAME: &str = "libcannon_cann_emu.so";

/// The command that builds the emulator, for messages.
pub const BUILD_COMMAND: &str = "cargo build --release -p cannon-cann-emu";

/// What went wrong selecting the emulator.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EmulatorError {
    /// The built library is not where cargo puts it.
    #[error(
        "the CANN emulator ({FILE_NAME}) has not been built; searched: {}. Build it with \
         `{BUILD_COMMAND}` (`cargo test --workspace --release --features npu` builds it too; \
         .ci/run does both)",
        searched.join(", ")
    )]
    NotBuilt { searched: Vec<String> },
    /// This process already chose where CANN comes from.
    #[error(
        "CANN was already selected in this process ({current}); the emulator must be selected \
         before the first CANN call"
    )]
    AlreadySelected { current: String },
}

/// `None`: the installed CANN (the loader's search); `Some(path)`: the emulator at `path`.
pub(super) static SELECTED: OnceLock<Option<PathBuf>> = OnceLock::new();

pub(super) fn from_env() -> Option<PathBuf> {
    std::env::var_os(ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Where this process's CANN comes from, deciding it (from `CANNON_CANN_EMULATOR`) on first
/// use: `Some(path)` is the emulator.
pub fn selected() -> Option<&'static Path> {
    SELECTED.get_or_init(from_env).as_deref()
}

/// Selects the emulator at `path` for this process, before any CANN library is loaded. Calling
/// it again with the same path is fine; a different choice already made is an error.
///
/// It does not set `CANNON_CANN_EMULATOR` (changing the environment of a running,
/// multi-threaded process is unsound on glibc); a test that starts processes passes
/// `.env(ENV, path)` to them.
pub fn use_emulator(path: impl Into<PathBuf>) -> Result<(), EmulatorError> {
    let path = path.into();
    let chosen = SELECTED.get_or_init(|| Some(path.clone()));
    match chosen {
        Some(p) if *p == path => Ok(()),
        Some(p) => Err(EmulatorError::AlreadySelected {
            current: format!("the emulator at {}", p.display()),
        }),
        None => Err(EmulatorError::AlreadySelected {
            current: "the installed CANN".into(),
        }),
    }
}
