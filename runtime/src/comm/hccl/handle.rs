//! One rank's HCCL communicator: the handle, its life (bound device, destroy, asynchronous
//! errors), and what every call shares (binding the device, the raw stream, HCCL statuses
//! as errors, argument checks).

use std::cell::Cell;
use std::ffi::c_void;
use std::time::Duration;

use cannon_sys::hccl;

use crate::comm::error::{CommError, CommResult};
use crate::comm::rendezvous::Rendezvous;
use crate::comm::types::ReduceOp;
use crate::device::Device;
use crate::dtype::Element;
use crate::stream::Stream;

/// One rank's HCCL communicator, bound to the NPU `ordinal`; destroyed on drop.
pub(crate) struct HcclCommunicator {
    pub(super) raw: hccl::HcclComm,
    pub(super) rank: usize,
    pub(super) world_size: usize,
    pub(super) ordinal: u32,
    /// Where splits bootstrap their subgroups, and how long they wait there.
    pub(super) rdzv: Rendezvous,
    pub(super) timeout: Cell<Duration>,
    pub(super) splits: Cell<u32>,
}

// SAFETY: an HcclComm may be used from any thread that has bound the communicator's device,
// which every method does first. Not Sync (the Cell): HCCL calls on one communicator must be
// issued in one order, as with the CPU communicator.
unsafe impl Send for HcclCommunicator {}

impl Drop for HcclCommunicator {
    fn drop(&mut self) {
        // Errors cannot leave drop; `destroy` reports them.
        let _ = self.destroy_raw();
    }
}

impl std::fmt::Debug for HcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HcclCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("device", &self.device())
            .finish()
    }
}

/// Turns an HCCL status into a `CommError` naming the call.
pub(super) fn check(
    call: &'static str,
    r: Result<hccl::HcclResult, cannon_sys::Error>,
) -> CommResult<()> {
    let code = r?;
    if code == hccl::HCCL_SUCCESS {
        return Ok(());
    }
    Err(CommError::Hccl {
        call,
        code: code as i32,
        message: cannon_sys::hccl_result_name(code).to_string(),
    })
}

pub(super) fn runtime(call: &'static str) -> impl Fn(crate::Error) -> CommError {
    move |e| CommError::Runtime {
        call,
        message: e.to_string(),
    }
}

pub(super) fn mut_ptr<T>(p: *const T) -> *mut c_void {
    p.cast_mut().cast()
}

impl HcclCommunicator {
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    pub(crate) fn world_size(&self) -> usize {
        self.world_size
    }

    pub(crate) fn device(&self) -> Device {
        Device::Npu(self.ordinal)
    }

    /// Bounds the rendezvous waits of later splits (HCCL's own timeouts bound collectives).
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    pub(crate) fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    /// Destroys the communicator, reporting HCCL's status (drop ignores it).
    pub(crate) fn destroy(mut self) -> CommResult<()> {
        self.destroy_raw()
    }

    fn destroy_raw(&mut self) -> CommResult<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        crate::npu::bind(self.ordinal).map_err(runtime("HcclCommDestroy"))?;
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        // SAFETY: `raw` is a live communicator created by HcclCommInitRootInfo, destroyed once.
        check("HcclCommDestroy", unsafe { hccl::HcclCommDestroy(raw) })
    }

    /// HCCL's asynchronous error state (a failed collective surfaces here, not at enqueue).
    pub(crate) fn check_async_error(&self) -> CommResult<()> {
        self.bind("HcclGetCommAsyncError")?;
        let mut code: hccl::HcclResult = hccl::HCCL_SUCCESS;
        // SAFETY: live communicator, valid out-pointer.
        check("HcclGetCommAsyncError", unsafe {
            hccl::HcclGetCommAsyncError(self.raw, &mut code)
        })?;
        check("HcclGetCommAsyncError (async)", Ok(code))
    }

    pub(super) fn bind(&self, call: &'static str) -> CommResult<()> {
        crate::npu::bind(self.ordinal).map_err(runtime(call))
    }

    /// Binds our device and returns the raw stream, which must live on our device.
    pub(super) fn stream(
        &self,
        op: &'static str,
        stream: &Stream,
    ) -> CommResult<hccl::aclrtStream> {
        self.check_devices(op, &[("the stream", stream.device())])?;
        let raw =
            stream
                .acl_stream()
                .map(|s| s.raw())
                .ok_or_else(|| CommError::InvalidArgument {
                    op,
                    detail: "the stream has no aclrtStream".into(),
                })?;
        self.bind(op)?;
        Ok(raw)
    }

    pub(super) fn reduce_code<T: Element>(&self, op: &'static str, r: ReduceOp) -> CommResult<u32> {
        r.check(op, T::DTYPE)?;
        r.hccl_code().ok_or(CommError::UnsupportedReduce {
            op,
            reduce_op: r,
            dtype: T::DTYPE,
            detail: "HCCL has no average; reduce with Sum and scale by 1/world_size",
        })
    }

    pub(super) fn check_len(
        &self,
        op: &'static str,
        what: &str,
        got: usize,
        want: usize,
    ) -> CommResult<()> {
        if got == want {
            return Ok(());
        }
        Err(CommError::InvalidArgument {
            op,
            detail: format!(
                "rank {}: {what} has {got} elements, expected {want}",
                self.rank
            ),
        })
    }

    pub(super) fn check_rank(&self, op: &'static str, rank: usize) -> CommResult<()> {
        if rank < self.world_size {
            return Ok(());
        }
        Err(CommError::InvalidRank {
            op,
            rank,
            world_size: self.world_size,
        })
    }

    pub(super) fn check_devices(
        &self,
        op: &'static str,
        operands: &[(&'static str, Device)],
    ) -> CommResult<()> {
        match operands.iter().find(|&&(_, d)| d != self.device()) {
            None => Ok(()),
            Some(&(what, found)) => Err(CommError::DeviceMismatch {
                op,
                rank: self.rank,
                what,
                expected: self.device(),
                found,
            }),
        }
    }
}

/// Per-peer counts and displacements (exclusive prefix sums) as HCCL's uint64 arrays.
pub(super) fn counts_displs(counts: &[usize]) -> (Vec<u64>, Vec<u64>) {
    let c: Vec<u64> = counts.iter().map(|&x| x as u64).collect();
    let mut acc = 0u64;
    let d = c
        .iter()
        .map(|&x| {
            let o = acc;
            acc += x;
            o
        })
        .collect();
    (c, d)
}
