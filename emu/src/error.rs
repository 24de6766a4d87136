//! The emulator's error: a CANN status code and a message. Exported functions return the code
//! and leave the message for `aclGetRecentErrMsg`, as CANN does.

use std::cell::RefCell;

/// A failed emulated call: the status the C function returns and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuError {
    /// aclError, aclnnStatus or HcclResult, as the failing function's header types it.
    pub code: i32,
    pub message: String,
}

pub type EmuResult<T> = Result<T, EmuError>;

impl EmuError {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for EmuError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for EmuError {}

thread_local! {
    /// The message of this thread's last failed call (CANN keeps it per thread).
    static RECENT: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Records `e` as this thread's recent error (prefixed with the C function's name) and returns
/// its code, for `return record("aclrtMalloc", e)` in an exported function.
pub fn record(function: &str, e: EmuError) -> i32 {
    let text = format!("[cannon CANN emulator] {function}: {}", e.message);
    RECENT.with(|r| *r.borrow_mut() = Some(text));
    e.code
}

/// Takes this thread's recent error message (a second call returns None, as CANN's does).
pub fn take_recent() -> Option<String> {
    RECENT.with(|r| r.borrow_mut().take())
}

/// Status `0` on success, the recorded code otherwise.
pub fn status(function: &str, r: EmuResult<()>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => record(function, e),
    }
}
