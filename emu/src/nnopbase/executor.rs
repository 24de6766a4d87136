//! aclOpExecutor and the two-phase calling convention every op handler goes through.
//!
//! Phase 1 (`aclnnXxxGetWorkspaceSize`) validates everything on the host, decides the
//! workspace size and registers an executor holding the job ([`phase1`]). Phase 2
//! (`aclnnXxx(workspace, size, executor, stream)`, [`phase2`]) checks that the executor is live
//! and unused (or repeatable), that the workspace is device memory of at least the size phase 1
//! asked for (null only when it asked 0) on the stream's device, then queues the job; the job
//! resolves every device range when it runs.
//!
//! Executor handles are never reused (a counter, not an address), so launching a consumed
//! executor again is always recognised as such, never mistaken for a newer executor.

#![allow(non_snake_case)]

use super::boundary::ffi_status;
use super::tensor::{PARAM_INVALID, PARAM_NULLPTR};
use crate::error::{EmuError, EmuResult};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus, aclrtStream};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

/// An op's device work, run on the stream's worker (repeatable executors run it again).
pub type OpJob = Arc<dyn Fn() -> EmuResult<()> + Send + Sync>;

/// What phase 1 decided.
pub struct Plan {
    /// Device bytes phase 2 must be given.
    pub workspace: u64,
    /// The device the op's tensors live on (None: no device tensor at all).
    pub device: Option<u32>,
    pub job: OpJob,
}

struct Executor {
    op: &'static str,
    plan: Plan,
    repeatable: bool,
}

/// Live executors by handle.
pub struct Executors {
    live: Mutex<(usize, BTreeMap<usize, Executor>)>,
}

/// Handles start here and step by 64 (never null, never reused, clearly not a host address
/// of ours).
const FIRST_HANDLE: usize = 0x7e00_0000_0000;

pub static EXECUTORS: Executors = Executors {
    live: Mutex::new((0, BTreeMap::new())),
};

impl Executors {
    fn insert(&self, e: Executor) -> usize {
        let mut g = self.live.lock();
        g.0 += 1;
        let h = FIRST_HANDLE + g.0 * 64;
        g.1.insert(h, e);
        h
    }

    fn missing(&self, h: usize) -> EmuError {
        let issued = self.live.lock().0;
        if h == 0 {
            return EmuError::new(PARAM_NULLPTR, "executor is null");
        }
        if h > FIRST_HANDLE
            && h <= FIRST_HANDLE + issued * 64
            && (h - FIRST_HANDLE).is_multiple_of(64)
        {
            EmuError::new(
                PARAM_INVALID,
                format!(
                    "executor {h:#x} was already launched or destroyed: an executor runs once unless aclSetAclOpExecutorRepeatable was called after phase 1"
                ),
            )
        } else {
            EmuError::new(PARAM_INVALID, format!("{h:#x} is not an aclOpExecutor"))
        }
    }

    /// Live executors (leak checks).
    pub fn len(&self) -> usize {
        self.live.lock().1.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Phase 1 of op `op`: runs `plan` (validation + job), writes the workspace size and a fresh
/// executor. On error nothing is registered and both outputs are left untouched.
///
/// # Safety
/// `workspace_size` and `executor` are null or writable (null is reported as an error).
pub unsafe fn phase1(
    op: &'static str,
    workspace_size: *mut u64,
    executor: *mut *mut aclOpExecutor,
    plan: impl FnOnce() -> EmuResult<Plan>,
) -> aclnnStatus {
    ffi_status(&format!("{op}GetWorkspaceSize"), || {
        if workspace_size.is_null() || executor.is_null() {
            return Err(EmuError::new(
                PARAM_NULLPTR,
                "workspaceSize or executor out-pointer is null",
            ));
        }
        let plan = plan()?;
        let ws = plan.workspace;
        let h = EXECUTORS.insert(Executor {
            op,
            plan,
            repeatable: false,
        });
        // SAFETY: both checked non-null; the caller's contract makes them writable.
        unsafe {
            *workspace_size = ws;
            *executor = h as *mut aclOpExecutor;
        }
        Ok(())
    })
}

/// Phase 2 of op `op` (see the module docs for what is checked).
///
/// # Safety
/// None beyond the C signature: handles and the workspace are looked up, never dereferenced.
pub unsafe fn phase2(
    op: &'static str,
    workspace: *mut c_void,
    workspace_size: u64,
    executor: *mut aclOpExecutor,
    stream: aclrtStream,
) -> aclnnStatus {
    ffi_status(op, || {
        let h = executor as usize;
        // Check everything before consuming a one-shot executor, so a bad workspace can be
        // fixed and the executor launched again (it has not run).
        let (stream, asked, device, job, repeatable, made_by) = {
            let g = EXECUTORS.live.lock();
            let Some(e) = g.1.get(&h) else {
                drop(g);
                return Err(EXECUTORS.missing(h));
            };
            let s = crate::device::lookup(stream as usize)?;
            (
                s,
                e.plan.workspace,
                e.plan.device,
                e.plan.job.clone(),
                e.repeatable,
                e.op,
            )
        };
        if made_by != op {
            return Err(EmuError::new(
                PARAM_INVALID,
                format!("executor {h:#x} was made by {made_by}GetWorkspaceSize, not {op}GetWorkspaceSize"),
            ));
        }
        if let Some(d) = device {
            if d != stream.device {
                return Err(EmuError::new(
                    PARAM_INVALID,
                    format!(
                        "the op's tensors live on device {d} but the stream belongs to device {}",
                        stream.device
                    ),
                ));
            }
        }
        let ws = workspace as usize;
        if workspace_size < asked {
            return Err(EmuError::new(
                PARAM_INVALID,
                format!("workspaceSize {workspace_size} is less than the {asked} bytes phase 1 asked for"),
            ));
        }
        if asked > 0 || ws != 0 {
            if ws == 0 {
                return Err(EmuError::new(
                    PARAM_NULLPTR,
                    format!("workspace is null but phase 1 asked for {asked} bytes"),
                ));
            }
            let d = crate::mem::owner(ws)
                .map_err(|e| EmuError::new(PARAM_INVALID, format!("workspace: {}", e.message)))?;
            if d != stream.device {
                return Err(EmuError::new(
                    PARAM_INVALID,
                    format!(
                        "workspace lives on device {d}, the stream on device {}",
                        stream.device
                    ),
                ));
            }
            crate::mem::resolve(ws, asked as usize).map_err(|e| {
                EmuError::new(
                    PARAM_INVALID,
                    format!("workspace of {asked} bytes: {}", e.message),
                )
            })?;
        }
        if !repeatable {
            EXECUTORS.live.lock().1.remove(&h);
        }
        let what = op;
        stream.enqueue(Box::new(move || {
            if asked > 0 {
                // The op scribbles over its workspace as a kernel would; memory freed (or
                // reused by a caller) before the op ran shows up here.
                let p = crate::mem::resolve(ws, asked as usize).map_err(|e| {
                    EmuError::new(
                        e.code,
                        format!("{what}: workspace at run time: {}", e.message),
                    )
                })?;
                // SAFETY: resolve checked [p, p + asked) lies in one live allocation.
                unsafe { std::ptr::write_bytes(p, 0xA5, asked as usize) };
            }
            job().map_err(|e| EmuError::new(e.code, format!("{what}: {}", e.message)))
        }))?;
        Ok(())
    })
}

/// # Safety
/// None beyond the C signature.
#[no_mangle]
pub unsafe extern "C" fn aclSetAclOpExecutorRepeatable(
    executor: *mut aclOpExecutor,
) -> aclnnStatus {
    ffi_status("aclSetAclOpExecutorRepeatable", || {
        let h = executor as usize;
        let mut g = EXECUTORS.live.lock();
        match g.1.get_mut(&h) {
            Some(e) => {
                e.repeatable = true;
                Ok(())
            }
            None => {
                drop(g);
                Err(EXECUTORS.missing(h))
            }
        }
    })
}

/// Destroys a repeatable executor (a one-shot one is released by its launch; destroying
/// an unlaunched one-shot executor is allowed too, as when a caller gives up after phase 1).
///
/// # Safety
/// None beyond the C signature.
#[no_mangle]
pub unsafe extern "C" fn aclDestroyAclOpExecutor(executor: *mut aclOpExecutor) -> aclnnStatus {
    ffi_status("aclDestroyAclOpExecutor", || {
        let h = executor as usize;
        let removed = EXECUTORS.live.lock().1.remove(&h);
        match removed {
            Some(_) => Ok(()),
            None => Err(EXECUTORS.missing(h)),
        }
    })
}

/// Exports phase 2 of ops: `aclnnXxx(workspace, workspaceSize, executor, stream)`.
#[macro_export]
macro_rules! aclnn_phase2 {
    ($($name:ident),* $(,)?) => {$(
        /// Phase 2: queues the executor's job on the stream (see `nnopbase::executor`).
        ///
        /// # Safety
        /// None beyond the C signature: handles are looked up, never dereferenced.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            workspace: *mut ::std::ffi::c_void,
            workspaceSize: u64,
            executor: *mut ::cannon_sys::aclnn::aclOpExecutor,
            stream: ::cannon_sys::aclnn::aclrtStream,
        ) -> ::cannon_sys::aclnn::aclnnStatus {
            // SAFETY: forwarded; phase2 only looks the handles up.
            unsafe { $crate::nnopbase::executor::phase2(stringify!($name), workspace, workspaceSize, executor, stream) }
        }
    )*};
}

/// The device of `addr` (for [`Plan::device`]); tensors on two devices are an error.
pub fn common_device(addrs: &[usize]) -> EmuResult<Option<u32>> {
    let mut dev = None;
    for &a in addrs.iter().filter(|&&a| a != 0) {
        let d = crate::mem::owner(a)?;
        match dev {
            None => dev = Some(d),
            Some(x) if x != d => {
                return Err(EmuError::new(
                    PARAM_INVALID,
                    format!("tensors on devices {x} and {d} in one op"),
                ))
            }
            _ => {}
        }
    }
    Ok(dev)
}
