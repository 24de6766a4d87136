//! Host access to a tensor's device memory, for op jobs running on a stream's worker.
//!
//! A job copies its inputs out of device memory ([`read()`]), runs the CPU kernel on owned host
//! vectors and copies results back ([`write()`]). Copy-in/copy-out makes in-place ops and
//! aliased operands behave as on hardware (every input is read before any output is written)
//! and lets strided views (transposes) be gathered in one place. Every range is resolved
//! against the live allocations when the job runs, not when it was queued, so memory freed in
//! between is an error instead of a stale read.

use super::tensor::{TensorDesc, PARAM_INVALID};
use crate::error::{EmuError, EmuResult};
use std::sync::Arc;

/// Element offsets (from the view's first element) of the view's elements, row-major.
fn offsets(t: &TensorDesc) -> Vec<usize> {
    let n = t.numel();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = t.dims.len();
    let mut idx = vec![0i64; rank];
    for _ in 0..n {
        let off: i64 = idx.iter().zip(&t.strides).map(|(&i, &s)| i * s).sum();
        out.push(off as usize);
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < t.dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

fn check_size<T>(t: &TensorDesc) -> EmuResult<()> {
    if std::mem::size_of::<T>() != t.elem_size() {
        return Err(EmuError::new(
            PARAM_INVALID,
            format!(
                "internal: reading a {}-byte element type from a {}-byte tensor",
                std::mem::size_of::<T>(),
                t.elem_size()
            ),
        ));
    }
    Ok(())
}

/// The host bytes of the tensor's whole view range.
fn span(t: &TensorDesc) -> EmuResult<(*mut u8, usize)> {
    let es = t.elem_size();
    let reach = t.extent().saturating_sub(t.offset as usize);
    let p = crate::mem::resolve(t.first_elem_addr(), reach * es)?;
    Ok((p, reach))
}

/// The view's elements in row-major order.
pub fn read<T: bytemuck::Pod>(t: &Arc<TensorDesc>) -> EmuResult<Vec<T>> {
    check_size::<T>(t)?;
    if t.numel() == 0 {
        return Ok(Vec::new());
    }
    let (p, reach) = span(t)?;
    // SAFETY: `p` is the host backing of `reach` elements inside one live allocation
    // (resolve checked the range); device memory is only touched by the stream that runs
    // this job (CANN's ordering rule), and `read_unaligned` needs no alignment.
    let all: Vec<T> = (0..reach)
        .map(|i| unsafe { std::ptr::read_unaligned((p as *const T).add(i)) })
        .collect();
    if t.is_contiguous() {
        return Ok(all);
    }
    Ok(offsets(t).into_iter().map(|o| all[o]).collect())
}

/// Stores `v` (row-major, `numel` values) into the view.
pub fn write<T: bytemuck::Pod>(t: &Arc<TensorDesc>, v: &[T]) -> EmuResult<()> {
    check_size::<T>(t)?;
    if v.len() != t.numel() {
        return Err(EmuError::new(
            PARAM_INVALID,
            format!("internal: {} values for a view of {}", v.len(), t.numel()),
        ));
    }
    if v.is_empty() {
        return Ok(());
    }
    let (p, _) = span(t)?;
    let offs: Vec<usize> = if t.is_contiguous() {
        (0..v.len()).collect()
    } else {
        offsets(t)
    };
    for (x, o) in v.iter().zip(offs) {
        // SAFETY: every offset lies inside the resolved span (offsets < extent - offset).
        unsafe { std::ptr::write_unaligned((p as *mut T).add(o), *x) };
    }
    Ok(())
}
