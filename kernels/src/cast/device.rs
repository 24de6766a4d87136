//! The cast on runtime buffers: the device-level entry points
//! (re-exported by [`crate::ops`]).
//!
//! Each runs the op's check (the rule its slice-level function and NPU body apply too, so
//! the meta device rejects what the CPU would), selects the backend once (every operand on
//! the stream's device, [`backend::select`]), and matches on it: the CPU arm
//! ([`on_cpu`]) borrows the buffers' host slices for [`super::host`], the NPU arm is the
//! op's aclnn body (`npu.rs`), the meta arm computes nothing.

use super::npu;
use crate::backend::{self, Npu, Selected};
use crate::error::Result;
use cannon_runtime::trace;
use cannon_runtime::Float;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// [`crate::cast::host::cast`] on `stream`'s device:
/// `dst = src` converted between storage types ([`crate::cast`]).
pub fn cast<A: Float, B: Float>(
    stream: &Stream,
    src: &BufferView<'_, A>,
    dst: &mut BufferViewMut<'_, B>,
) -> Result<()> {
    super::check_cast(src.len(), dst.len())?;
    let _span = trace::span_on(stream, "cast", trace::Cat::Norm);
    match backend::select("cast", stream, &[&src, &dst])? {
        Selected::Cpu(_) => on_cpu::cast(src, dst),
        Selected::Npu(Npu { ordinal }) => npu::convert(ordinal, stream, src, dst),
        Selected::Meta(_) => Ok(()),
    }
}

/// The CPU arm of each entry point: the buffers' host slices passed to the slice-level
/// function, without the entry's check or device selection (the slice-level function checks
/// by itself; tests compare the two).
pub mod on_cpu {
    use super::*;
    use crate::cast::host;

    pub fn cast<A: Float, B: Float>(
        src: &BufferView<'_, A>,
        dst: &mut BufferViewMut<'_, B>,
    ) -> Result<()> {
        host::cast(src.as_host_slice()?, dst.as_host_slice_mut()?)
    }
}
