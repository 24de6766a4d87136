//! The aclnn plumbing every NPU body uses (feature `npu`), in cudarc's layering over
//! `cannon_sys::aclnn`:
//!
//! - owners of the descriptors ([`AclTensor`], [`AclScalar`], [`AclIntArray`]): created from
//!   runtime buffer views (ND, contiguous strides, offset 0, storage = view) or host values,
//!   destroyed on drop; a failed destroy is recorded ([`take_drop_errors`]), never a panic;
//! - [`run`]: the two-phase call. Phase 1 gives the workspace size and a one-shot executor;
//!   the workspace comes from the device's caching allocator and goes back to it as soon as
//!   phase 2 has queued the op. That is stream-ordered reuse, as torch_npu does: the block
//!   is allocated for `stream`, so the next user on the same stream runs after this op, and
//!   a user on another stream gets it only after an event recorded at the free has
//!   completed (`cannon_runtime::alloc`).
//! - every non-zero `aclnnStatus` becomes [`KernelError::Aclnn`] with the op, the C function
//!   and `aclGetRecentErrMsg`'s text; a missing library or symbol is the runtime's `Sys` error.
//!
//! Descriptors must outlive phase 2 (docs/cann-api.md §2.1: whether CANN allows destroying
//! them in between is unconfirmed), so callers keep the owners alive across [`run`].

use crate::error::{KernelError, Result};
use cannon_runtime::{BufferView, BufferViewMut, DeviceBuffer, Element, Stream};
use cannon_sys::aclnn as sys;
use std::ffi::c_void;
use std::sync::Mutex;

/// Failed descriptor destroys (from `Drop`), oldest first.
static DROP_ERRORS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Takes the descriptor destroy failures recorded so far.
pub fn take_drop_errors() -> Vec<String> {
    std::mem::take(&mut *DROP_ERRORS.lock().unwrap_or_else(|p| p.into_inner()))
}

fn status_error(op: &'static str, call: &'static str, status: i32) -> KernelError {
    KernelError::Aclnn {
        op,
        call,
        status,
        name: cannon_sys::aclnn_status_name(status),
        message: cannon_runtime::npu::result::recent_error_message(),
    }
}

/// Turns an aclnn call's outcome into a result.
pub fn check(
    op: &'static str,
    call: &'static str,
    r: std::result::Result<sys::aclnnStatus, cannon_sys::Error>,
) -> Result<()> {
    let status = r.map_err(|e| KernelError::Runtime(e.into()))?;
    if status == 0 {
        Ok(())
    } else {
        Err(status_error(op, call, status))
    }
}

/// Row-major strides of `shape`.
fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn dims(op: &'static str, shape: &[usize]) -> Result<Vec<i64>> {
    shape
        .iter()
        .map(|&d| {
            i64::try_from(d).map_err(|_| KernelError::Shape {
                op,
                detail: format!("dimension {d} does not fit an int64"),
            })
        })
        .collect()
}

/// An owned `aclTensor` descriptor (never the memory it describes).
pub struct AclTensor {
    raw: *mut sys::aclTensor,
}

impl AclTensor {
    /// A descriptor of `shape` (row-major) over `n` values of `T` at device address `data`.
    fn contiguous<T: Element>(
        op: &'static str,
        data: *mut c_void,
        n: usize,
        shape: &[usize],
    ) -> Result<Self> {
        let d = dims(op, shape)?;
        let numel: usize = shape.iter().product();
        if numel != n {
            return Err(KernelError::Shape {
                op,
                detail: format!("a view of {n} values described as shape {shape:?}"),
            });
        }
        // SAFETY: `data` is the start of a runtime buffer view of `n` = numel values (the
        // callers pass a view's or buffer's own pointer and length).
        unsafe { Self::strided::<T>(op, data, &d, &contiguous_strides(&d), &d) }
    }

    /// A descriptor with explicit strides (elements) over `storage` at `data`: transposes
    /// expressed as views, as aclnn ops marked non-contiguous-capable take them.
    ///
    /// # Safety
    /// `data` must be device memory holding `storage` (its product of dims) values of `T`,
    /// alive and not aliased by host writes for as long as any op using this descriptor may
    /// run on its stream (CANN does not check the pointer; the emulator does).
    pub unsafe fn strided<T: Element>(
        op: &'static str,
        data: *mut c_void,
        dims: &[i64],
        strides: &[i64],
        storage: &[i64],
    ) -> Result<Self> {
        // SAFETY: the arrays hold dims.len() / storage.len() values and outlive the call
        // (aclCreateTensor copies them); `data` is a device address the caller owns for the
        // descriptor's lifetime.
        let r = unsafe {
            sys::aclCreateTensor(
                dims.as_ptr(),
                dims.len() as u64,
                T::DTYPE.acl_code(),
                strides.as_ptr(),
                0,
                cannon_sys::acl::ACL_FORMAT_ND,
                storage.as_ptr(),
                storage.len() as u64,
                data,
            )
        };
        let raw = r.map_err(|e| KernelError::Runtime(e.into()))?;
        if raw.is_null() {
            return Err(status_error(op, "aclCreateTensor", sys_null_status()));
        }
        Ok(AclTensor { raw })
    }

    /// A read-only view as a tensor of `shape`.
    pub fn from_view<T: Element>(
        op: &'static str,
        v: &BufferView<'_, T>,
        shape: &[usize],
    ) -> Result<Self> {
        Self::contiguous::<T>(op, v.as_raw_ptr() as *mut c_void, v.len(), shape)
    }

    /// A written view as a tensor of `shape`.
    pub fn from_view_mut<T: Element>(
        op: &'static str,
        v: &mut BufferViewMut<'_, T>,
        shape: &[usize],
    ) -> Result<Self> {
        let n = v.len();
        Self::contiguous::<T>(op, v.as_raw_mut_ptr() as *mut c_void, n, shape)
    }

    /// A whole buffer as a tensor of `shape`.
    pub fn from_buffer<T: Element>(
        op: &'static str,
        b: &mut DeviceBuffer<T>,
        shape: &[usize],
    ) -> Result<Self> {
        let n = b.len();
        Self::contiguous::<T>(op, b.as_raw_mut_ptr() as *mut c_void, n, shape)
    }

    pub fn raw(&self) -> *mut sys::aclTensor {
        self.raw
    }
}

/// The status reported for a creation function that returned null (they return no status;
/// the reason is behind aclGetRecentErrMsg): ACLNN_ERR_PARAM_INVALID.
fn sys_null_status() -> i32 {
    161002
}

impl Drop for AclTensor {
    fn drop(&mut self) {
        // SAFETY: raw came from aclCreateTensor and is destroyed once.
        record_drop("aclDestroyTensor", unsafe {
            sys::aclDestroyTensor(self.raw)
        });
    }
}

fn record_drop(call: &str, r: std::result::Result<sys::aclnnStatus, cannon_sys::Error>) {
    match r {
        Ok(0) => {}
        Ok(s) => DROP_ERRORS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!(
                "{call} failed with aclnnStatus {s}: {}",
                cannon_runtime::npu::result::recent_error_message()
            )),
        Err(e) => DROP_ERRORS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("{call}: {e}")),
    }
}

/// An owned `aclScalar` (CANN copies the value at creation).
pub struct AclScalar {
    raw: *mut sys::aclScalar,
}

impl AclScalar {
    pub fn f32(op: &'static str, v: f32) -> Result<Self> {
        let mut v = v;
        // SAFETY: a pointer to one live f32, read during the call.
        let r = unsafe {
            sys::aclCreateScalar(
                &mut v as *mut f32 as *mut c_void,
                cannon_sys::acl::ACL_FLOAT,
            )
        };
        let raw = r.map_err(|e| KernelError::Runtime(e.into()))?;
        if raw.is_null() {
            return Err(status_error(op, "aclCreateScalar", sys_null_status()));
        }
        Ok(AclScalar { raw })
    }

    pub fn raw(&self) -> *mut sys::aclScalar {
        self.raw
    }
}

impl Drop for AclScalar {
    fn drop(&mut self) {
        // SAFETY: raw came from aclCreateScalar and is destroyed once.
        record_drop("aclDestroyScalar", unsafe {
            sys::aclDestroyScalar(self.raw)
        });
    }
}

/// An owned host `aclIntArray` (e.g. FlashAttention's actual sequence lengths).
pub struct AclIntArray {
    raw: *mut sys::aclIntArray,
}

impl AclIntArray {
    pub fn new(op: &'static str, v: &[i64]) -> Result<Self> {
        // SAFETY: v.len() values, copied during the call.
        let r = unsafe { sys::aclCreateIntArray(v.as_ptr(), v.len() as u64) };
        let raw = r.map_err(|e| KernelError::Runtime(e.into()))?;
        if raw.is_null() {
            return Err(status_error(op, "aclCreateIntArray", sys_null_status()));
        }
        Ok(AclIntArray { raw })
    }

    pub fn raw(&self) -> *mut sys::aclIntArray {
        self.raw
    }
}

impl Drop for AclIntArray {
    fn drop(&mut self) {
        // SAFETY: raw came from aclCreateIntArray and is destroyed once.
        record_drop("aclDestroyIntArray", unsafe {
            sys::aclDestroyIntArray(self.raw)
        });
    }
}

/// Phase 2 of an aclnn op, as the bindings declare it.
pub type Phase2 = unsafe fn(
    *mut c_void,
    u64,
    *mut sys::aclOpExecutor,
    sys::aclrtStream,
) -> std::result::Result<sys::aclnnStatus, cannon_sys::Error>;

/// The two-phase call of aclnn op `call` for kernels op `op` on `stream`: `phase1` is the
/// op's `GetWorkspaceSize` (named `call_ws`) with its arguments bound (it gets the
/// workspace-size and executor out-pointers), `phase2` the op itself. The crate's bodies
/// call it through its `aclnn!` macro.
pub fn run(
    op: &'static str,
    call: &'static str,
    call_ws: &'static str,
    stream: &Stream,
    phase1: impl FnOnce(
        *mut u64,
        *mut *mut sys::aclOpExecutor,
    ) -> std::result::Result<sys::aclnnStatus, cannon_sys::Error>,
    phase2: Phase2,
) -> Result<()> {
    let Some(s) = stream.acl_stream() else {
        return Err(KernelError::InvalidArgument {
            op,
            detail: format!("{call} needs an NPU stream, got one on {}", stream.device()),
        });
    };
    let mut ws_size = 0u64;
    let mut ex: *mut sys::aclOpExecutor = std::ptr::null_mut();
    check(op, call_ws, phase1(&mut ws_size, &mut ex))?;
    let mut ws = if ws_size > 0 {
        let n = usize::try_from(ws_size).map_err(|_| KernelError::InvalidArgument {
            op,
            detail: format!("{call} asks for a workspace of {ws_size} bytes"),
        })?;
        match DeviceBuffer::<u8>::alloc(stream, n) {
            Ok(b) => Some(b),
            Err(e) => {
                destroy_unlaunched(ex);
                return Err(e.into());
            }
        }
    } else {
        None
    };
    let ws_ptr = ws
        .as_mut()
        .map_or(std::ptr::null_mut(), |b| b.as_raw_mut_ptr() as *mut c_void);
    // SAFETY: ex is the executor phase 1 just made (launched once, here); the workspace is
    // device memory of the size asked, returned to the allocator only after this call has
    // queued the op (stream-ordered reuse, see the module docs).
    let r = unsafe { phase2(ws_ptr, ws_size, ex, s.raw()) };
    let out = check(op, call, r);
    if out.is_err() {
        destroy_unlaunched(ex);
    }
    drop(ws);
    out
}

/// Releases an executor that phase 2 did not consume (so a failed call leaks nothing).
fn destroy_unlaunched(ex: *mut sys::aclOpExecutor) {
    if !ex.is_null() {
        // SAFETY: ex came from phase 1 and was not launched; errors (e.g. CANN consumed it
        // anyway) are ignored, the executor is gone either way.
        let _ = unsafe { sys::aclDestroyAclOpExecutor(ex) };
        let _ = cannon_runtime::npu::result::recent_error_message();
    }
}

/// The two-phase call of an aclnn op: `aclnn!(op, stream, aclnnXxxGetWorkspaceSize,
/// aclnnXxx, (phase-1 arguments before the workspace-size/executor pointers))`.
macro_rules! aclnn {
    ($op:expr, $stream:expr, $p1:ident, $p2:ident, ($($arg:expr),* $(,)?)) => {
        $crate::backend::aclnn::run(
            $op,
            stringify!($p2),
            stringify!($p1),
            $stream,
            // SAFETY: the descriptors passed are live owners kept alive across the call by
            // the caller; the out-pointers come from `run`.
            |ws, ex| unsafe { ::cannon_sys::aclnn::$p1($($arg,)* ws, ex) },
            ::cannon_sys::aclnn::$p2,
        )
    };
}
pub(crate) use aclnn;
