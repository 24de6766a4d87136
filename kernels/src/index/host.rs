//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// `out[i] = src[idx[i]]`: rows of `dim` elements. out: `[K, D]`, src: `[R, D]`, idx: `[K]`.
pub fn gather_rows<T: Element>(out: &mut [T], src: &[T], idx: &[usize], dim: usize) -> Result<()> {
    check_gather_rows(out.len(), src.len(), idx, dim)?;
    cpu::gather_rows(out, src, idx, dim);
    Ok(())
}

/// `dst[idx[i]] = src[i]`. dst: `[R, D]`, src: `[K, D]`, idx: `[K]`.
pub fn scatter_rows<T: Element>(dst: &mut [T], src: &[T], idx: &[usize], dim: usize) -> Result<()> {
    check_scatter_rows("scatter_rows", dst.len(), src.len(), idx, dim)?;
    cpu::scatter_rows(dst, src, idx, dim);
    Ok(())
}

/// `dst[idx[i]] += src[i]`, in order of i. dst: `[R, D]`, src: `[K, D]`, idx: `[K]`.
pub fn scatter_add_rows<E: Float>(
    dst: &mut [E],
    src: &[E],
    idx: &[usize],
    dim: usize,
) -> Result<()> {
    check_scatter_rows("scatter_add_rows", dst.len(), src.len(), idx, dim)?;
    cpu::scatter_add_rows(dst, src, idx, dim);
    Ok(())
}

/// `dst[idx[i]] = 0`. dst: `[R, D]`, idx: `[K]`.
pub fn zero_rows<T: Element>(dst: &mut [T], idx: &[usize], dim: usize) -> Result<()> {
    check_zero_rows(dst.len(), idx, dim)?;
    for &r in idx {
        dst[r * dim..(r + 1) * dim].fill(T::zeroed());
    }
    Ok(())
}

/// `out[b, c, r] = x[b, r, c]`. x: `[B, R, C]`, out: `[B, C, R]`.
pub fn transpose<T: Element>(out: &mut [T], x: &[T], d: TransposeDims) -> Result<()> {
    check_transpose(out.len(), x.len(), d)?;
    cpu::transpose(out, x, d);
    Ok(())
}
