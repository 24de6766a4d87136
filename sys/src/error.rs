//! The one error type of cannon-sys: what went wrong while finding CANN, never a CANN status code
//! (those are returned as values by the bindings and decoded with [`crate::codes`]).

use thiserror::Error;

/// A failure to reach a CANN library or one of its symbols.
///
/// `Clone` because a failed lookup is cached (one resolution per library and per symbol) and
/// handed to every later caller.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// No candidate file of the library could be found.
    #[error("library {library} not found; searched: {}", searched.join(", "))]
    LibraryNotFound {
        library: String,
        searched: Vec<String>,
    },
    /// A candidate file exists but the dynamic loader refused it (wrong architecture, missing
    /// dependency such as the Ascend driver libraries, corrupt file). Reported instead of
    /// `LibraryNotFound` because "found but broken" needs a different fix.
    #[error("library {library} found at {path} but could not be loaded: {reason}")]
    LibraryLoadFailed {
        library: String,
        path: String,
        reason: String,
    },
    /// The library loaded but does not export the symbol (older/newer CANN than the headers).
    #[error("symbol {symbol} not found in {library}")]
    SymbolNotFound { library: String, symbol: String },
}
