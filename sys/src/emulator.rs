//! The CANN emulator hook: `CANNON_CANN_EMULATOR=/path/to/libcannon_cann_emu.so` makes every
//! library ([`Lib::AscendCl`], [`Lib::NnopBase`], [`Lib::OpApi`], [`Lib::Hccl`]) resolve from
//! that one file and nothing else. Without the variable (and without [`use_emulator`]) nothing
//! changes: the loader searches for an installed CANN as before, and never falls back to the
//! emulator.
//!
//! The choice is made once per process, at the first library load (or by [`use_emulator`]
//! before it), and reported by [`crate::probe`] and [`cann_in_use`].
//!
//! Tests: [`select_for_tests`] runs them against an installed CANN when one loads (an Ascend
//! host), else against the emulator cargo built next to the running test binary; it fails
//! (with the command that builds the emulator) rather than letting an NPU test pass without
//! running. [`use_built_emulator`] insists on the emulator.
//!
//! Layering: the choice itself ([`ENV`], [`selected`], [`use_emulator`]) lives in a leaf
//! module below the loader, which reads it; this module's test selection and report
//! ([`select_for_tests`], [`cann_in_use`]) open libraries through the loader, above it.
//!
//! [`Lib::AscendCl`]: crate::Lib::AscendCl
//! [`Lib::NnopBase`]: crate::Lib::NnopBase
//! [`Lib::OpApi`]: crate::Lib::OpApi
//! [`Lib::Hccl`]: crate::Lib::Hccl

pub(crate) mod choice;

pub use choice::{selected, use_emulator, EmulatorError, BUILD_COMMAND, ENV, FILE_NAME};

use choice::{from_env, SELECTED};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Where cargo leaves the emulator relative to the running executable: a test binary lives
/// in `target/<profile>/deps/`, where `cargo test` builds the cdylib; `cargo build -p
/// cannon-cann-emu` copies it up to `target/<profile>/`; a binary run by `cargo run` lives in
/// `target/<profile>/`. `$CARGO_TARGET_DIR/<profile>` is searched last.
pub fn candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut profile = None;
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            if dir.file_name().is_some_and(|n| n == "deps") {
                dirs.push(dir.to_path_buf());
                if let Some(up) = dir.parent() {
                    dirs.push(up.to_path_buf());
                    profile = up.file_name().map(|n| n.to_owned());
                }
            } else {
                dirs.push(dir.to_path_buf());
                dirs.push(dir.join("deps"));
                profile = dir.file_name().map(|n| n.to_owned());
            }
        }
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR").filter(|v| !v.is_empty()) {
        let target = PathBuf::from(target);
        let profiles = match &profile {
            Some(p) => vec![p.clone()],
            None => vec!["release".into(), "debug".into()],
        };
        for p in profiles {
            dirs.push(target.join(&p));
            dirs.push(target.join(&p).join("deps"));
        }
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in dirs {
        let f = d.join(FILE_NAME);
        if !out.contains(&f) {
            out.push(f);
        }
    }
    out
}

/// The newest built emulator among [`candidates`].
pub fn locate_built() -> Result<PathBuf, EmulatorError> {
    let all = candidates();
    all.iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p.clone())
        .ok_or_else(|| EmulatorError::NotBuilt {
            searched: all.iter().map(|p| p.display().to_string()).collect(),
        })
}

/// For tests: selects the emulator cargo built (or the one `CANNON_CANN_EMULATOR` already
/// names) before the first CANN call of the process, and returns its path (pass it on to
/// child processes as `CANNON_CANN_EMULATOR`). An error when it is not built or the process
/// already chose the installed CANN: the caller fails the test with the message.
pub fn use_built_emulator() -> Result<PathBuf, EmulatorError> {
    let path = match from_env() {
        Some(p) => p,
        None => locate_built()?,
    };
    use_emulator(path.clone())?;
    Ok(path)
}

/// Which CANN a test process runs against ([`select_for_tests`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestCann {
    /// The emulator at this path.
    Emulator(PathBuf),
    /// An installed CANN (its runtime library's path(s)): a real Ascend host.
    Installed(Vec<String>),
}

impl TestCann {
    pub fn is_emulator(&self) -> bool {
        matches!(self, TestCann::Emulator(_))
    }
}

/// For tests of the NPU path: the CANN they run against, chosen before the first CANN call of
/// the process, in this order:
/// 1. `CANNON_CANN_EMULATOR` set: that emulator;
/// 2. an installed CANN that loads (`ASCEND_HOME_PATH`, ...): the real one, so `cargo test
///    --features npu` on an Ascend host tests the hardware;
/// 3. otherwise the emulator cargo built next to the test binary, or [`EmulatorError::NotBuilt`]
///    naming the build command: an NPU test never passes without running.
///
/// Tests that only make sense on the emulator (its capacity variable, its test hooks) check
/// [`TestCann::is_emulator`] and say that they skip.
pub fn select_for_tests() -> Result<TestCann, EmulatorError> {
    static CHOICE: OnceLock<Result<TestCann, EmulatorError>> = OnceLock::new();
    CHOICE
        .get_or_init(|| {
            if let Some(p) = from_env() {
                use_emulator(p.clone())?;
                return Ok(TestCann::Emulator(p));
            }
            if let Some(Some(p)) = SELECTED.get() {
                return Ok(TestCann::Emulator(p.clone()));
            }
            let installed = if SELECTED.get().is_some() {
                crate::loader::library(crate::Lib::AscendCl).map(|l| l.paths())
            } else {
                let dirs = crate::loader::SearchDirs::from_env();
                crate::loader::open_uncached(crate::Lib::AscendCl, &dirs).map(|l| l.paths())
            };
            match installed {
                Ok(paths) => {
                    let _ = SELECTED.set(None);
                    eprintln!(
                        "NPU tests run against the installed CANN: {}",
                        paths.join(", ")
                    );
                    Ok(TestCann::Installed(paths))
                }
                Err(_) => {
                    let p = locate_built()?;
                    use_emulator(p.clone())?;
                    Ok(TestCann::Emulator(p))
                }
            }
        })
        .clone()
}

/// One line saying which CANN this process uses: "CANN emulator at PATH", the installed
/// runtime library's path, or that none was found. Loads `libascendcl.so` (or the emulator)
/// if not yet loaded.
pub fn cann_in_use() -> String {
    match selected() {
        Some(p) => format!("CANN emulator at {} ({ENV})", p.display()),
        None => match crate::loader::library(crate::Lib::AscendCl) {
            Ok(l) => format!("installed CANN: {}", l.paths().join(", ")),
            Err(e) => format!("no CANN: {e}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_binary_looks_in_its_deps_folder_then_the_profile_folder() {
        // Unit tests run from target/<profile>/deps/.
        let exe = std::env::current_exe().unwrap();
        let deps = exe.parent().unwrap();
        let c = candidates();
        assert_eq!(c[0], deps.join(FILE_NAME));
        assert_eq!(c[1], deps.parent().unwrap().join(FILE_NAME));
    }

    #[test]
    fn not_built_says_how_to_build_it() {
        let e = EmulatorError::NotBuilt {
            searched: vec!["/t/release/deps/libcannon_cann_emu.so".into()],
        };
        let m = e.to_string();
        assert!(
            m.contains(BUILD_COMMAND) && m.contains("/t/release/deps"),
            "{m}"
        );
    }
}
