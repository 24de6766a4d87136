//! Rotary position embeddings in transformers' rotate-half form, for the text model (1-D
//! positions) and the Pixtral vision encoder (2-D axial positions).
//!
//! ```text
//! with c = cos(angle[p, i]), s = sin(angle[p, i]), i in 0..D/2, p = pos[t]:
//! forward   x[t,h,i]       <- x[t,h,i] c - x[t,h,i+D/2] s
//!           x[t,h,i+D/2]   <- x[t,h,i+D/2] c + x[t,h,i] s
//! backward  the transpose (= inverse) rotation, applied to the gradient in place
//!
//! x: [T, H, D] (q with H = heads, or k with H = kv heads)   pos: [T] table slots
//! ```
//!
//! (transformers: `q * cos + rotate_half(q) * sin` with `cos = concat(cos(a), cos(a))`.)
//!
//! Angles ([`RopeTable`]), formed in f32 like transformers so large positions round alike:
//! - text ([`RopeTable::text`]): `inv_freq[i] = theta^(-2i/D)`, `angle[p, i] = p * inv_freq[i]`,
//!   slot = the token's position (per token, so packed sequences restart at 0);
//! - Pixtral ([`RopeTable::axial`], D divisible by 4): with `f[k] = theta^(-2k/D)`, the first
//!   D/4 angles are `row * f[0, 2, 4, ...]` and the last D/4 are `col * f[1, 3, 5, ...]`;
//!   slot = `row * max_cols + col` ([`RopeTable::axial_slot`]).
//!
//! Each `inv_freq` is the power `theta^-e` (with e = 2i/D as an f32, like torch) rounded to
//! f32, each angle the f32 product `f32(p) * inv_freq`, and cos/sin of that angle are rounded
//! from f64 (torch computes pow, cos and sin in f32 to within an ulp). Rotation arithmetic is f32; bf16 activations are rounded once on
//! store (transformers rounds cos/sin and each product to bf16; the difference is below the
//! bf16 tolerance).

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{KernelError, Result};
use cannon_runtime::Float;

/// Precomputed cos/sin per slot: `[slots, D/2]` each, f32.
#[derive(Clone, Debug)]
pub struct RopeTable {
    head_dim: usize,
    /// `Some(max_cols)` for an axial (2-D) table.
    cols: Option<usize>,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// `f32(theta^(-e))`, the exponent `e` given as the f32 that transformers computes.
fn inv_freq(theta: f64, num: usize, den: usize) -> f32 {
    let e = num as f32 / den as f32;
    (1.0 / theta.powf(e as f64)) as f32
}

impl RopeTable {
    /// A 1-D table for positions `0..max_pos`. `head_dim` even and > 0, `theta` > 0.
    pub fn text(head_dim: usize, theta: f64, max_pos: usize) -> Result<Self> {
        check_table("RopeTable::text", head_dim, 2, theta)?;
        let half = head_dim / 2;
        let freqs: Vec<f32> = (0..half)
            .map(|i| inv_freq(theta, 2 * i, head_dim))
            .collect();
        // A plain loop rather than `flat_map().collect()`: valgrind reported the flattening
        // iterator's empty-slot check as a use of an uninitialised value (a false positive
        // of the optimised niche test; the values were right), and this is as fast.
        let mut angles = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            angles.extend(freqs.iter().map(|&f| p as f32 * f));
        }
        Ok(Self::from_angles(head_dim, None, angles))
    }

    /// A 2-D (Pixtral) table for `row in 0..max_rows`, `col in 0..max_cols`. `head_dim`
    /// divisible by 4. transformers 4.x uses `max_rows = max_cols = image_size / patch_size`.
    pub fn axial(head_dim: usize, theta: f64, max_rows: usize, max_cols: usize) -> Result<Self> {
        check_table("RopeTable::axial", head_dim, 4, theta)?;
        let half = head_dim / 2;
        let f: Vec<f32> = (0..half)
            .map(|k| inv_freq(theta, 2 * k, head_dim))
            .collect();
        let even: Vec<f32> = f.iter().step_by(2).copied().collect();
        let odd: Vec<f32> = f.iter().skip(1).step_by(2).copied().collect();
        let mut angles = Vec::with_capacity(max_rows * max_cols * half);
        for r in 0..max_rows {
            for c in 0..max_cols {
                angles.extend(even.iter().map(|&f| r as f32 * f));
                angles.extend(odd.iter().map(|&f| c as f32 * f));
            }
        }
        Ok(Self::from_angles(head_dim, Some(max_cols), angles))
    }

    fn from_angles(head_dim: usize, cols: Option<usize>, angles: Vec<f32>) -> Self {
        use rayon::prelude::*;
        let (cos, sin) = angles
            .par_iter()
            .map(|&a| ((a as f64).cos() as f32, (a as f64).sin() as f32))
            .unzip();
        RopeTable {
            head_dim,
            cols,
            cos,
            sin,
        }
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Number of slots (positions, or rows x cols).
    pub fn slots(&self) -> usize {
        self.cos.len() / (self.head_dim / 2)
    }

    /// cos of the D/2 angles of `slot`, or `None` past the table.
    pub fn cos(&self, slot: usize) -> Option<&[f32]> {
        (slot < self.slots()).then(|| self.cos_row(slot))
    }

    /// sin of the D/2 angles of `slot`, or `None` past the table.
    pub fn sin(&self, slot: usize) -> Option<&[f32]> {
        (slot < self.slots()).then(|| self.sin_row(slot))
    }

    /// cos row of a slot the caller has checked to be in range.
    fn cos_row(&self, slot: usize) -> &[f32] {
        let h = self.head_dim / 2;
        &self.cos[slot * h..][..h]
    }

    fn sin_row(&self, slot: usize) -> &[f32] {
        let h = self.head_dim / 2;
        &self.sin[slot * h..][..h]
    }

    /// The slot of patch (row, col) in an axial table.
    pub fn axial_slot(&self, row: usize, col: usize) -> Result<u32> {
        let op = "RopeTable::axial_slot";
        let Some(cols) = self.cols else {
            return Err(KernelError::InvalidArgument {
                op,
                detail: "not an axial table".into(),
            });
        };
        let rows = self.slots() / cols.max(1);
        if row >= rows || col >= cols {
            return Err(KernelError::InvalidArgument {
                op,
                detail: format!("patch ({row}, {col}) outside the table's {rows} x {cols} grid"),
            });
        }
        Ok((row * cols + col) as u32)
    }
}

fn check_table(op: &'static str, head_dim: usize, multiple: usize, theta: f64) -> Result<()> {
    if head_dim == 0 || !head_dim.is_multiple_of(multiple) {
        return Err(KernelError::InvalidArgument {
            op,
            detail: format!("head_dim {head_dim} must be a positive multiple of {multiple}"),
        });
    }
    if !(theta > 0.0 && theta.is_finite()) {
        return Err(KernelError::InvalidArgument {
            op,
            detail: format!("theta {theta} must be positive"),
        });
    }
    Ok(())
}

fn check_apply<E>(
    op: &'static str,
    x: &[E],
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    check_apply_len(op, x.len(), n_heads, table, pos)
}

/// [`check_apply`] given x's length: the rules of [`rope_forward`](host::rope_forward) and [`rope_backward`](host::rope_backward) on
/// every backend (the device-level entry points check them before any backend runs): x
/// `[T, H, D]` with T = `pos.len()` and D the table's head_dim, every position inside the
/// table.
pub(crate) fn check_apply_len(
    op: &'static str,
    len: usize,
    n_heads: usize,
    table: &RopeTable,
    pos: &[u32],
) -> Result<()> {
    let d = table.head_dim;
    if len != pos.len() * n_heads * d {
        return Err(KernelError::Shape {
            op,
            detail: format!(
                "x has {} elements, expected T={} x H={n_heads} x D={d}",
                len,
                pos.len()
            ),
        });
    }
    let slots = table.slots();
    if let Some((t, &p)) = pos.iter().enumerate().find(|(_, &p)| p as usize >= slots) {
        return Err(KernelError::InvalidArgument {
            op,
            detail: format!("position {p} of token {t} is outside the table's {slots} slots"),
        });
    }
    Ok(())
}
