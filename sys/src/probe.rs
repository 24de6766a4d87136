//! What `cannon doctor` prints: the CANN environment and, per library, where it was found or
//! where it was looked for.

use std::fmt;

use crate::loader::{self, Lib, ENV_VARS};
use crate::Error;

/// The outcome of looking for one library.
#[derive(Debug, Clone)]
pub struct LibraryProbe {
    pub library: Lib,
    /// The loaded file(s) in lookup order, or why none could be used.
    pub result: Result<Vec<String>, Error>,
}

/// The whole environment as this process sees it.
#[derive(Debug, Clone)]
pub struct Probe {
    /// `ASCEND_HOME_PATH`, `ASCEND_TOOLKIT_HOME` and their values (None = unset).
    pub env: Vec<(&'static str, Option<String>)>,
    /// The CANN emulator every library comes from, when selected ([`crate::emulator`]).
    pub emulator: Option<String>,
    pub libraries: Vec<LibraryProbe>,
}

impl Probe {
    /// True when the AscendCL runtime can be loaded (the same test as [`crate::is_available`]).
    pub fn runtime_available(&self) -> bool {
        self.libraries
            .iter()
            .any(|l| l.library == Lib::AscendCl && l.result.is_ok())
    }
}

/// Loads (or reuses the cached load of) every library and reports each outcome. Never fails:
/// a missing library is a line of the report.
pub fn probe() -> Probe {
    let env = ENV_VARS
        .iter()
        .map(|&name| {
            (
                name,
                std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()),
            )
        })
        .collect();
    let libraries = Lib::ALL
        .iter()
        .map(|&library| LibraryProbe {
            library,
            result: loader::library(library).map(|l| l.paths()),
        })
        .collect();
    let emulator = crate::emulator::selected().map(|p| p.display().to_string());
    Probe {
        env,
        emulator,
        libraries,
    }
}

impl fmt::Display for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.emulator {
            Some(p) => writeln!(
                f,
                "CANN in use: the CANN emulator at {p} ({}), not an installed CANN",
                crate::emulator::ENV
            )?,
            None => writeln!(
                f,
                "CANN in use: an installed CANN, searched for as below ({} unset)",
                crate::emulator::ENV
            )?,
        }
        for (name, value) in &self.env {
            writeln!(f, "{name:<20} {}", value.as_deref().unwrap_or("(unset)"))?;
        }
        for p in &self.libraries {
            match &p.result {
                Ok(paths) => writeln!(f, "found     {}: {}", p.library, paths.join(", "))?,
                Err(Error::LibraryNotFound { searched, .. }) => {
                    writeln!(f, "missing   {}; searched:", p.library)?;
                    for s in searched {
                        writeln!(f, "            {s}")?;
                    }
                }
                Err(e) => writeln!(f, "unusable  {}: {e}", p.library)?,
            }
        }
        Ok(())
    }
}
