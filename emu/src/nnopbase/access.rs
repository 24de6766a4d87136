//! Host access to a tensor's device memory, for op jobs running on a stream's worker.
//!
//! A job copies its inputs out of device memory ([`read()`]), runs the CPU kernel on owned host
//! vectors and copies results back ([`write()`]). Copy-in/copy-out makes in-place ops and
//! aliased operands behave as on hardware (every input is read before any output is written)
//! and lets strided views (transposes) be gathered in one place. Every range is resolved
//! against the live allocations when the job runs, not when it was queued, so memory freed in
//! between is an error instead of a stale read.
//!
//! The ops whose operands are the model's largest tensors (matmul, embedding and its backward,
//! AdamW) read and write device memory in place instead ([`span_slice`], [`span_slice_mut`])
//! when every written tensor shares no byte with any other operand ([`disjoint`]), which keeps
//! the same every-input-before-any-output semantics: a copy of an lm-head weight or gradient
//! would otherwise sit in host memory beside the emulated device memory it mirrors, hundreds
//! of MB that no NPU holds. Anything else (aliased operands, other strides, other dtypes)
//! takes the copying path.

use super::tensor::{TensorDesc, PARAM_INVALID};
use crate::error::{EmuError, EmuResult};
use std::sync::Arc;

/// Calls `f` with the element offset (from the view's first element) of each of the view's
/// elements, row-major, without materialising them: a transposed lm-head weight has tens of
/// millions of elements, and a vector of their offsets would weigh twice the weight.
fn for_each_offset(t: &TensorDesc, mut f: impl FnMut(usize)) {
    if t.numel() == 0 {
        return;
    }
    let rank = t.dims.len();
    let mut idx = vec![0i64; rank];
    let mut off: i64 = 0;
    loop {
        f(off as usize);
        let mut d = rank;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            off += t.strides[d];
            if idx[d] < t.dims[d] {
                break;
            }
            off -= idx[d] * t.strides[d];
            idx[d] = 0;
        }
    }
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
    let (p, _) = span(t)?;
    let p = p as *const T;
    let mut out = Vec::with_capacity(t.numel());
    if t.is_contiguous() {
        // SAFETY: `p` is the host backing of the view's span inside one live allocation
        // (resolve checked the range) and a contiguous view's `numel` elements fill it;
        // device memory is only touched by the stream that runs this job (CANN's ordering
        // rule), and `read_unaligned` needs no alignment.
        out.extend((0..t.numel()).map(|i| unsafe { std::ptr::read_unaligned(p.add(i)) }));
    } else {
        // SAFETY: as above; every offset of the view lies inside its resolved span.
        for_each_offset(t, |o| {
            out.push(unsafe { std::ptr::read_unaligned(p.add(o)) })
        });
    }
    Ok(out)
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
    let p = p as *mut T;
    if t.is_contiguous() {
        for (i, x) in v.iter().enumerate() {
            // SAFETY: a contiguous view's `numel` elements fill its resolved span.
            unsafe { std::ptr::write_unaligned(p.add(i), *x) };
        }
        return Ok(());
    }
    let mut values = v.iter();
    for_each_offset(t, |o| {
        if let Some(x) = values.next() {
            // SAFETY: every offset lies inside the resolved span (offsets < extent - offset).
            unsafe { std::ptr::write_unaligned(p.add(o), *x) };
        }
    });
    Ok(())
}

/// The device address range `[start, end)` of the bytes the view reaches.
pub fn reach(t: &TensorDesc) -> (usize, usize) {
    let start = t.first_elem_addr();
    let elems = t.extent().saturating_sub(t.offset as usize);
    (start, start + elems * t.elem_size())
}

/// Whether two views reach no byte in common (an empty view shares none).
pub fn disjoint(a: &TensorDesc, b: &TensorDesc) -> bool {
    let ((a0, a1), (b0, b1)) = (reach(a), reach(b));
    a0 == a1 || b0 == b1 || a1 <= b0 || b1 <= a0
}

/// The view's span (its first element to the farthest it reaches) in place, as `T`s: for
/// ops that read large operands without copying them (an lm-head weight, a gradient of the
/// embedding). `None` when it cannot be borrowed so (empty, a negative stride, misaligned):
/// the caller copies with [`read`] instead.
///
/// # Safety
/// Nothing writes the span while the slice lives: the job is the only work on its tensors
/// (CANN's stream-ordering rule), and it writes its outputs only where they are
/// [`disjoint`] from the slices it still uses.
pub unsafe fn span_slice<'a, T: bytemuck::Pod>(t: &TensorDesc) -> EmuResult<Option<&'a [T]>> {
    check_size::<T>(t)?;
    if t.numel() == 0 || t.strides.iter().any(|&s| s < 0) {
        return Ok(None);
    }
    let (p, reach) = span(t)?;
    if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Ok(None);
    }
    // SAFETY: `resolve` checked the span lies in one live allocation whose host backing `p`
    // is; aligned (checked); the caller keeps writers away while the slice lives.
    Ok(Some(unsafe {
        std::slice::from_raw_parts(p as *const T, reach)
    }))
}

/// [`span_slice`] for writing a contiguous view in place (`None` when it is not contiguous).
///
/// # Safety
/// As [`span_slice`], and no other slice of the span lives meanwhile.
pub unsafe fn span_slice_mut<'a, T: bytemuck::Pod>(
    t: &TensorDesc,
) -> EmuResult<Option<&'a mut [T]>> {
    // SAFETY: `contiguous_ptr` gives the aligned start of `numel` elements inside one live
    // allocation; the caller rules out every other slice of the span.
    Ok(contiguous_ptr::<T>(t)?.map(|p| unsafe { std::slice::from_raw_parts_mut(p, t.numel()) }))
}

/// The host address of a contiguous view's first element, as `T` (`None` when the view is
/// empty, not contiguous or misaligned): for element-wise ops whose output may be one of
/// their inputs exactly (`x += y`), which slices cannot express.
pub fn contiguous_ptr<T: bytemuck::Pod>(t: &TensorDesc) -> EmuResult<Option<*mut T>> {
    check_size::<T>(t)?;
    if t.numel() == 0 || !t.is_contiguous() {
        return Ok(None);
    }
    let (p, reach) = span(t)?;
    if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) || reach != t.numel() {
        return Ok(None);
    }
    Ok(Some(p as *mut T))
}
