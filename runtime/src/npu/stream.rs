//! `aclrtStream` and `aclrtEvent` owners.

use super::result::{self, check};
use crate::error::Result;
use cannon_sys::acl;

/// An AscendCL stream on one device; destroyed on drop.
pub struct NpuStream {
    ordinal: u32,
    raw: acl::aclrtStream,
}

// SAFETY: an aclrtStream handle may be used from any thread once that thread has bound the
// stream's device, which every method does first.
unsafe impl Send for NpuStream {}
// SAFETY: as above; AscendCL serialises submissions to one stream internally.
unsafe impl Sync for NpuStream {}

impl NpuStream {
    pub fn new(ordinal: u32) -> Result<Self> {
        super::context::bind(ordinal)?;
        let mut raw: acl::aclrtStream = std::ptr::null_mut();
        // SAFETY: raw is a valid out-pointer; the device is bound.
        check("aclrtCreateStream", unsafe {
            acl::aclrtCreateStream(&mut raw)
        })?;
        Ok(NpuStream { ordinal, raw })
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The raw handle, for aclnn and HCCL calls.
    pub fn raw(&self) -> acl::aclrtStream {
        self.raw
    }

    pub fn synchronize(&self) -> Result<()> {
        super::context::bind(self.ordinal)?;
        // SAFETY: raw is a live stream.
        check("aclrtSynchronizeStream", unsafe {
            acl::aclrtSynchronizeStream(self.raw)
        })
    }

    pub fn wait(&self, event: &NpuEvent) -> Result<()> {
        super::context::bind(self.ordinal)?;
        // SAFETY: both handles are live.
        check("aclrtStreamWaitEvent", unsafe {
            acl::aclrtStreamWaitEvent(self.raw, event.raw)
        })
    }
}

impl Drop for NpuStream {
    fn drop(&mut self) {
        // Errors cannot leave Drop; a failed destroy leaks one handle, which the device
        // reclaims at reset. CANN wants a stream's tasks finished before it is destroyed
        // (acl_rt.h, aclrtDestroyStream), so drain it first.
        if super::context::bind(self.ordinal).is_ok() {
            // SAFETY: raw is live and not used after this.
            unsafe {
                let _ = acl::aclrtSynchronizeStream(self.raw);
                let _ = acl::aclrtDestroyStream(self.raw);
            }
        }
    }
}

/// An AscendCL timing event; destroyed on drop.
pub struct NpuEvent {
    ordinal: u32,
    raw: acl::aclrtEvent,
}

// SAFETY: see NpuStream.
unsafe impl Send for NpuEvent {}
// SAFETY: see NpuStream.
unsafe impl Sync for NpuEvent {}

impl NpuEvent {
    pub fn new(ordinal: u32) -> Result<Self> {
        super::context::bind(ordinal)?;
        let mut raw: acl::aclrtEvent = std::ptr::null_mut();
        let flag = result::ACL_EVENT_TIME_LINE | result::ACL_EVENT_SYNC;
        // SAFETY: raw is a valid out-pointer; the flag values come from acl_rt.h.
        check("aclrtCreateEventWithFlag", unsafe {
            acl::aclrtCreateEventWithFlag(&mut raw, flag as _)
        })?;
        Ok(NpuEvent { ordinal, raw })
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    pub fn record(&self, stream: &NpuStream) -> Result<()> {
        super::context::bind(self.ordinal)?;
        // SAFETY: both handles are live.
        check("aclrtRecordEvent", unsafe {
            acl::aclrtRecordEvent(self.raw, stream.raw)
        })
    }

    pub fn synchronize(&self) -> Result<()> {
        super::context::bind(self.ordinal)?;
        // SAFETY: raw is live.
        check("aclrtSynchronizeEvent", unsafe {
            acl::aclrtSynchronizeEvent(self.raw)
        })
    }

    /// Whether the recorded work has finished (`aclrtQueryEventStatus`; never blocks).
    pub fn query(&self) -> Result<bool> {
        super::context::bind(self.ordinal)?;
        let mut status: acl::aclrtEventRecordedStatus = acl::ACL_EVENT_RECORDED_STATUS_NOT_READY;
        // SAFETY: status is a valid out-pointer; raw is live.
        check("aclrtQueryEventStatus", unsafe {
            acl::aclrtQueryEventStatus(self.raw, &mut status)
        })?;
        Ok(status == acl::ACL_EVENT_RECORDED_STATUS_COMPLETE)
    }

    pub fn elapsed_ms(&self, end: &NpuEvent) -> Result<f32> {
        super::context::bind(self.ordinal)?;
        let mut ms = 0f32;
        // SAFETY: ms is a valid out-pointer; both events are live.
        check("aclrtEventElapsedTime", unsafe {
            acl::aclrtEventElapsedTime(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for NpuEvent {
    fn drop(&mut self) {
        if super::context::bind(self.ordinal).is_ok() {
            // SAFETY: raw is live and not used after this.
            let _ = unsafe { acl::aclrtDestroyEvent(self.raw) };
        }
    }
}
