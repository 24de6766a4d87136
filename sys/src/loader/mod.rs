//! Finds the CANN libraries at run time and resolves their symbols, once each.
//!
//! Search order (docs/cann-api.md §6.3), per candidate file name:
//!   1. `$ASCEND_HOME_PATH/lib64/<name>`
//!   2. `$ASCEND_TOOLKIT_HOME/lib64/<name>` (skipped when it is the same directory as 1)
//!   3. `<name>` through the default dlopen search path (LD_LIBRARY_PATH, ld.so.cache, /lib...)
//!
//! The aclnn op library is a *group*: every file of the group that loads is kept, and an op symbol
//! is looked up in them in torch_npu's order (op-plugin `GetOpApiFuncAddr`):
//!   libcust_opapi.so -> libopapi_*.so (sorted) -> libopapi.so -> libaclnn_ops_infer.so ->
//!   libaclnn_ops_train.so -> libaclnn_math.so -> libaclnn_sparse.so -> libaclnn_fft.so ->
//!   libaclnn_rand.so

mod dl;

use std::ffi::{c_void, CStr};
use std::fmt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::Error;

/// One CANN library (or, for [`Lib::OpApi`], the group of aclnn op libraries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lib {
    /// `libascendcl.so`: the AscendCL runtime (devices, memory, streams, events).
    AscendCl,
    /// `libnnopbase.so`: the aclnn descriptor API (aclCreateTensor, executors).
    NnopBase,
    /// The aclnn op libraries (`libopapi.so`, split `libopapi_*.so`, legacy `libaclnn_*.so`).
    OpApi,
    /// `libhccl.so`: collectives.
    Hccl,
}

/// A file name to look for, or a pattern matched against directory entries.
#[derive(Debug, Clone, Copy)]
enum Candidate {
    File(&'static str),
    /// `prefix*suffix`, expanded in the environment directories only (the default dlopen path
    /// cannot be listed); torch_npu does the same with `$ASCEND_HOME_PATH/lib64`.
    Pattern {
        prefix: &'static str,
        suffix: &'static str,
    },
}

const OP_API_CANDIDATES: &[Candidate] = &[
    Candidate::File("libcust_opapi.so"),
    Candidate::Pattern {
        prefix: "libopapi_",
        suffix: ".so",
    },
    Candidate::File("libopapi.so"),
    Candidate::File("libaclnn_ops_infer.so"),
    Candidate::File("libaclnn_ops_train.so"),
    Candidate::File("libaclnn_math.so"),
    Candidate::File("libaclnn_sparse.so"),
    Candidate::File("libaclnn_fft.so"),
    Candidate::File("libaclnn_rand.so"),
];

impl Lib {
    /// Every library, in the order `probe` reports them.
    pub const ALL: [Lib; 4] = [Lib::AscendCl, Lib::NnopBase, Lib::OpApi, Lib::Hccl];

    /// The name used in errors and reports.
    pub fn name(self) -> &'static str {
        match self {
            Lib::AscendCl => "libascendcl.so",
            Lib::NnopBase => "libnnopbase.so",
            Lib::OpApi => "aclnn op libraries (libopapi.so / libopapi_*.so / libaclnn_*.so)",
            Lib::Hccl => "libhccl.so",
        }
    }

    fn candidates(self) -> &'static [Candidate] {
        match self {
            Lib::AscendCl => &[Candidate::File("libascendcl.so")],
            Lib::NnopBase => &[Candidate::File("libnnopbase.so")],
            Lib::OpApi => OP_API_CANDIDATES,
            Lib::Hccl => &[Candidate::File("libhccl.so")],
        }
    }

    /// A group keeps every file that loads; a single library stops at the first.
    fn is_group(self) -> bool {
        self == Lib::OpApi
    }

    fn index(self) -> usize {
        match self {
            Lib::AscendCl => 0,
            Lib::NnopBase => 1,
            Lib::OpApi => 2,
            Lib::Hccl => 3,
        }
    }
}

impl fmt::Display for Lib {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where to look, in order. Built from the environment by [`SearchDirs::from_env`]; tests and
/// tools may build their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchDirs {
    /// Absolute directories tried first, in order, without duplicates.
    pub dirs: Vec<PathBuf>,
    /// Finally try the bare file name through the default dlopen search path.
    pub default_path: bool,
}

/// Environment variables that name a CANN install (toolkit `set_env.sh` sets both).
pub const ENV_VARS: [&str; 2] = ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"];

impl SearchDirs {
    /// `$ASCEND_HOME_PATH/lib64`, `$ASCEND_TOOLKIT_HOME/lib64` (each if set and non-empty), then
    /// the default dlopen search path.
    pub fn from_env() -> Self {
        let roots = ENV_VARS.iter().filter_map(std::env::var_os);
        Self::new(
            roots
                .filter(|r| !r.is_empty())
                .map(|r| PathBuf::from(r).join("lib64")),
            true,
        )
    }

    /// Directories in order (duplicates dropped), then optionally the default path.
    pub fn new(dirs: impl IntoIterator<Item = PathBuf>, default_path: bool) -> Self {
        let mut unique: Vec<PathBuf> = Vec::new();
        for d in dirs {
            if !unique.contains(&d) {
                unique.push(d);
            }
        }
        Self {
            dirs: unique,
            default_path,
        }
    }
}

/// One loaded file.
#[derive(Debug)]
struct Loaded {
    /// Where it was loaded from, for reports.
    path: String,
    handle: dl::Handle,
}

/// A loaded library (or group): one or more dlopen handles, searched in order.
#[derive(Debug)]
pub struct Library {
    lib: Lib,
    loaded: Vec<Loaded>,
}

impl Library {
    /// Which library this is.
    pub fn lib(&self) -> Lib {
        self.lib
    }

    /// The files that were loaded, in lookup order.
    pub fn paths(&self) -> Vec<String> {
        self.loaded.iter().map(|l| l.path.clone()).collect()
    }

    /// The address of `symbol` in the first file that exports it.
    pub fn symbol(&self, symbol: &CStr) -> Result<NonNull<c_void>, Error> {
        self.loaded
            .iter()
            .find_map(|l| dl::symbol(l.handle, symbol))
            .ok_or_else(|| Error::SymbolNotFound {
                library: self.lib.name().to_owned(),
                symbol: symbol.to_string_lossy().into_owned(),
            })
    }
}

/// What one load attempt found.
enum Attempt {
    Loaded(Loaded),
    /// Nothing there (recorded in `searched`).
    Absent,
    /// Something there that the loader refused.
    Refused {
        path: String,
        reason: String,
    },
}

fn attempt_path(path: &Path) -> Attempt {
    if !path.exists() {
        return Attempt::Absent;
    }
    let shown = path.display().to_string();
    match dl::open(&shown) {
        Ok(handle) => Attempt::Loaded(Loaded {
            path: shown,
            handle,
        }),
        Err(reason) => Attempt::Refused {
            path: shown,
            reason,
        },
    }
}

fn attempt_default(name: &str) -> Attempt {
    match dl::open(name) {
        Ok(handle) => {
            let path = match dl::origin(handle) {
                Some(dir) => format!("{dir}/{name}"),
                None => default_label(name),
            };
            Attempt::Loaded(Loaded { path, handle })
        }
        // glibc words "no such file anywhere on the path" exactly like this; any other message
        // (a dependency missing, wrong ELF class) means the file was found but refused.
        Err(reason) if reason.starts_with(&format!("{name}: cannot open shared object file")) => {
            Attempt::Absent
        }
        Err(reason) => Attempt::Refused {
            path: default_label(name),
            reason,
        },
    }
}

fn default_label(name: &str) -> String {
    format!("{name} (default dlopen search path)")
}

/// Entries of `dir` named `prefix*suffix`, sorted so the lookup order is reproducible.
fn expand_pattern(dir: &Path, prefix: &str, suffix: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.len() > prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
        })
        .map(|e| e.path())
        .collect();
    found.sort();
    found
}

/// Accumulates the outcome of a search.
struct Search {
    loaded: Vec<Loaded>,
    searched: Vec<String>,
    refused: Option<(String, String)>,
}

impl Search {
    /// Notes the outcome; true when something loaded.
    fn record(&mut self, attempt: Attempt) -> bool {
        match attempt {
            Attempt::Loaded(l) => {
                self.loaded.push(l);
                true
            }
            Attempt::Absent => false,
            Attempt::Refused { path, reason } => {
                self.refused.get_or_insert((path, reason));
                false
            }
        }
    }
}

/// Searches for `lib` in `dirs` without touching the process-wide cache. The cached entry points
/// ([`library`], [`Symbol`]) use this with [`SearchDirs::from_env`].
pub fn open_uncached(lib: Lib, dirs: &SearchDirs) -> Result<Library, Error> {
    let mut s = Search {
        loaded: Vec::new(),
        searched: Vec::new(),
        refused: None,
    };
    for candidate in lib.candidates() {
        match *candidate {
            Candidate::File(name) => {
                let in_dirs = dirs.dirs.iter().map(|d| d.join(name));
                let mut found = false;
                for path in in_dirs {
                    s.searched.push(path.display().to_string());
                    if s.record(attempt_path(&path)) {
                        found = true;
                        break;
                    }
                }
                if !found && dirs.default_path {
                    s.searched.push(default_label(name));
                    s.record(attempt_default(name));
                }
            }
            Candidate::Pattern { prefix, suffix } => {
                for dir in &dirs.dirs {
                    s.searched
                        .push(dir.join(format!("{prefix}*{suffix}")).display().to_string());
                    for path in expand_pattern(dir, prefix, suffix) {
                        s.record(attempt_path(&path));
                    }
                }
            }
        }
        if !s.loaded.is_empty() && !lib.is_group() {
            break;
        }
    }
    if !s.loaded.is_empty() {
        return Ok(Library {
            lib,
            loaded: s.loaded,
        });
    }
    Err(match s.refused {
        Some((path, reason)) => Error::LibraryLoadFailed {
            library: lib.name().to_owned(),
            path,
            reason,
        },
        None => Error::LibraryNotFound {
            library: lib.name().to_owned(),
            searched: s.searched,
        },
    })
}

/// `lib` from the CANN emulator at `path` (see [`crate::emulator`]): that one file or an error
/// naming it, never a search elsewhere.
pub fn open_emulator(lib: Lib, path: &Path) -> Result<Library, Error> {
    match attempt_path(path) {
        Attempt::Loaded(l) => Ok(Library {
            lib,
            loaded: vec![l],
        }),
        Attempt::Absent => Err(Error::LibraryNotFound {
            library: lib.name().to_owned(),
            searched: vec![format!(
                "{} ({})",
                path.display(),
                crate::emulator::choice::ENV
            )],
        }),
        Attempt::Refused { path, reason } => Err(Error::LibraryLoadFailed {
            library: lib.name().to_owned(),
            path,
            reason,
        }),
    }
}

/// The process-wide library, searched once (with the environment at first use) and cached,
/// success or failure. When the CANN emulator is selected ([`crate::emulator`]) every library
/// is that one file.
pub fn library(lib: Lib) -> Result<&'static Library, Error> {
    static CACHE: [OnceLock<Result<Library, Error>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    CACHE[lib.index()]
        .get_or_init(|| match crate::emulator::choice::selected() {
            Some(path) => open_emulator(lib, path),
            None => open_uncached(lib, &SearchDirs::from_env()),
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// One C function, resolved on first use and cached (as its address, or as the error).
///
/// The generated bindings hold one `static` of this type per function.
pub struct Symbol {
    lib: Lib,
    name: &'static CStr,
    // The address as usize: raw pointers are not Sync, a function address is safe to share.
    cell: OnceLock<Result<usize, Error>>,
}

impl Symbol {
    /// A symbol `name` of library `lib`, not yet resolved.
    pub const fn new(lib: Lib, name: &'static CStr) -> Self {
        Self {
            lib,
            name,
            cell: OnceLock::new(),
        }
    }

    /// The symbol's address, loading the library first if needed.
    pub fn get(&self) -> Result<NonNull<c_void>, Error> {
        let resolved = self.cell.get_or_init(|| {
            let addr = library(self.lib)?.symbol(self.name)?;
            Ok(addr.as_ptr() as usize)
        });
        match resolved {
            // A cached address came from a non-null dlsym result.
            Ok(addr) => NonNull::new(*addr as *mut c_void).ok_or_else(|| self.not_found()),
            Err(e) => Err(e.clone()),
        }
    }

    fn not_found(&self) -> Error {
        Error::SymbolNotFound {
            library: self.lib.name().to_owned(),
            symbol: self.name.to_string_lossy().into_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_dirs_are_searched_once() {
        let d = SearchDirs::new(
            [
                PathBuf::from("/a"),
                PathBuf::from("/b"),
                PathBuf::from("/a"),
            ],
            true,
        );
        assert_eq!(d.dirs, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
    }

    #[test]
    fn missing_everywhere_lists_every_candidate_location() {
        let dir = std::env::temp_dir().join("cannon-sys-loader-unit-empty");
        let dirs = SearchDirs::new([dir.clone()], false);
        let err = open_uncached(Lib::Hccl, &dirs).unwrap_err();
        assert_eq!(
            err,
            Error::LibraryNotFound {
                library: "libhccl.so".into(),
                searched: vec![dir.join("libhccl.so").display().to_string()],
            }
        );
    }

    #[test]
    fn op_group_searches_in_torch_npu_order() {
        let dir = PathBuf::from("/nonexistent-cannon-sys");
        let err = open_uncached(Lib::OpApi, &SearchDirs::new([dir], false)).unwrap_err();
        let Error::LibraryNotFound { searched, .. } = err else {
            panic!("expected LibraryNotFound, got {err:?}");
        };
        let names: Vec<&str> = searched
            .iter()
            .map(|p| p.rsplit('/').next().unwrap_or(p))
            .collect();
        assert_eq!(
            names,
            [
                "libcust_opapi.so",
                "libopapi_*.so",
                "libopapi.so",
                "libaclnn_ops_infer.so",
                "libaclnn_ops_train.so",
                "libaclnn_math.so",
                "libaclnn_sparse.so",
                "libaclnn_fft.so",
                "libaclnn_rand.so",
            ]
        );
    }

    #[test]
    fn a_file_the_loader_refuses_is_load_failed_not_not_found() {
        let dir = std::env::temp_dir().join(format!("cannon-sys-refused-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("libhccl.so");
        std::fs::write(&path, b"not an ELF file").unwrap();
        let err = open_uncached(Lib::Hccl, &SearchDirs::new([dir.clone()], false)).unwrap_err();
        std::fs::remove_dir_all(&dir).unwrap();
        let Error::LibraryLoadFailed {
            library,
            path: p,
            reason,
        } = err
        else {
            panic!("expected LibraryLoadFailed, got {err:?}");
        };
        assert_eq!(
            (library.as_str(), p),
            ("libhccl.so", path.display().to_string())
        );
        // glibc: "<path>: invalid ELF header" (musl words it differently, still non-empty).
        assert!(!reason.is_empty());
    }

    #[test]
    fn default_path_miss_is_absent_not_refused() {
        let err = open_uncached(Lib::AscendCl, &SearchDirs::new([], true));
        // This machine has no CANN; if it ever does, the library simply loads.
        if let Err(e) = err {
            assert_eq!(
                e,
                Error::LibraryNotFound {
                    library: "libascendcl.so".into(),
                    searched: vec!["libascendcl.so (default dlopen search path)".into()],
                }
            );
        }
    }
}
