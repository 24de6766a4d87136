//! The kernels' error type: every failure names the op and what was wrong with its input.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum KernelError {
    /// An argument's length or shape does not fit the op's declared shapes.
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    /// An argument's value is outside what the op accepts (e.g. a token id >= vocab).
    #[error("{op}: invalid argument: {detail}")]
    InvalidArgument { op: &'static str, detail: String },
    /// The op was called on a device whose code path this build does not contain.
    #[error("{op}: not compiled for {device} (rebuild with `--features npu`)")]
    NotCompiled { op: &'static str, device: String },
    /// The device path exists in this build but does not implement this op (or this dtype).
    #[error("{op}: unsupported on {device}: {reason}")]
    Unsupported {
        op: &'static str,
        device: String,
        reason: String,
    },
    /// An aclnn call returned a non-zero `aclnnStatus` (or an aclnn descriptor could not be
    /// created): the op, the C function, the status and `aclGetRecentErrMsg`'s text.
    #[error("{op}: {call} failed with aclnnStatus {status} ({name}){}", fmt_msg(.message))]
    Aclnn {
        op: &'static str,
        call: &'static str,
        status: i32,
        name: &'static str,
        message: String,
    },
    #[error(transparent)]
    Runtime(#[from] cannon_runtime::Error),
}

fn fmt_msg(m: &str) -> String {
    if m.is_empty() {
        String::new()
    } else {
        format!(": {m}")
    }
}

pub type Result<T> = std::result::Result<T, KernelError>;

/// Checks `len == expected`, naming the op and the argument otherwise.
pub fn check_len(op: &'static str, what: &str, len: usize, expected: usize) -> Result<()> {
    if len == expected {
        Ok(())
    } else {
        Err(KernelError::Shape {
            op,
            detail: format!("{what} has {len} elements, expected {expected}"),
        })
    }
}
