//! bf16 GEMM on AVX512-BF16: packing, cache blocking and a `vdpbf16ps` register-blocked kernel.
//!
//! `vdpbf16ps acc, a, b` adds, in each of the 16 f32 lanes, `a[2l]*b[2l] + a[2l+1]*b[2l+1]`:
//! it consumes *pairs along k*. So both operands are packed as u32 words holding
//! `(x[.., 2q], x[.., 2q+1])` (low half = even k, an odd k padded with a zero bf16):
//!
//! ```text
//! B panel  [kc, nc] -> strips of NR columns:  bp[s][q][j] = pair(op(B)[2q, s*NR+j], op(B)[2q+1, ..])
//! A block  [mc, kc] -> strips of MR rows:     ap[s][q][i] = pair(op(A)[s*MR+i, 2q], op(A)[.., 2q+1])
//! ```
//!
//! The kernel keeps an MR x NR tile of C in MR*NV zmm accumulators; per k-pair it loads NV
//! vectors of B (16 columns each) and broadcasts one A pair per row. Blocking is GotoBLAS/BLIS:
//! the B micro-panel (kc x NR) stays in L1 while the kernel walks the A block (mc x kc, in L2),
//! and the B panel (ko x nc, several kc sub-blocks) is packed once and shared by all threads,
//! which split C's rows (or, for short products, column strips). Each task walks the panel's
//! kc sub-blocks itself, so for deep products its C tile stays in L2 between them.
//!
//! All `unsafe` lives here: the intrinsics need the CPU features checked by [`available`], and
//! the kernel writes C through a raw pointer because threads own disjoint tiles of it.
//!
//! The AVX-512 intrinsics (incl. `_mm512_dpbf16_ps`) are stable since Rust 1.89, above the
//! workspace's declared rust-version: this module needs 1.89 (the toolchain here is 1.95), as
//! its `#[clippy::msrv]` in mod.rs says.

use super::x86_pack::{pack_block_across_rows, pack_k_across_rows, pack_k_in_rows, Panel, Src};
use super::x86_tile::{drive, store_tile, Epi, Packed};
use super::{Dims, Trans};
use cannon_runtime::Float;
use std::arch::x86_64::*;

/// Rows of C per kernel call.
const MR: usize = 14;
/// zmm vectors across C's columns per kernel call.
const NV: usize = 2;
/// Columns of C per kernel call.
const NR: usize = NV * 16;
/// k per block (even): B micro-panel = KC*NR*2 bytes = 32 KiB.
const KC: usize = 512;
/// Rows of A per block at most: A block = MC_MAX*KC*2 bytes (~256 KiB, in L2).
const MC_MAX: usize = 252;
/// Columns of B per panel when k fits one KC block: the packed panel (KC*NC*2 bytes = 2 MiB)
/// is shared through L3.
const NC: usize = 2048;
/// Columns of B per panel when k spans several KC blocks: a task's C tile (MC_MAX*NC_DEEP*4
/// bytes ~ 0.5 MiB) then stays in L2 while it walks the k sub-blocks.
const NC_DEEP: usize = 512;
/// k per packed B panel (a multiple of KC): panel = KO*NC_DEEP*2 bytes = 4 MiB.
const KO: usize = 4096;

/// Whether the CPU has what the kernel executes (the detection result is cached by std).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bf16")
}

/// Packs one A block strip or B panel strip (see `x86_pack`).
/// `lanes_are_rows`: the packed lane index is the stored row (A with N, B with T).
fn pack(lanes_are_rows: bool, src: Src, p: Panel, out: &mut [u32]) {
    // SAFETY: `available()` was checked before any packing; the caller passes a panel inside
    // the operand checked by mod.rs and an `out` of kp * w words.
    unsafe {
        if lanes_are_rows {
            pack_k_in_rows(src, p, out)
        } else {
            pack_k_across_rows(src, p, out)
        }
    }
}

/// The MR x NR kernel: `kp` k-pairs from packed `a` (`[kp][MR]`) and `b` (`[kp][NR]`), result
/// written to the `mr x nr` corner of the tile at `c` (row stride `ldc`).
///
/// # Safety
/// The CPU must have avx512f + avx512bf16; `a`/`b` must hold `kp*MR`/`kp*NR` words with `b`
/// 64-byte aligned; `c` must be valid for `mr` rows of `nr` floats at stride `ldc`.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    kp: usize,
    a: *const u32,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    mr: usize,
    nr: usize,
    e: Epi,
) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let (mut a, mut b) = (a, b);
    for _ in 0..kp {
        let mut bv = [_mm512_setzero_ps(); NV];
        for (v, bv) in bv.iter_mut().enumerate() {
            *bv = _mm512_load_ps(b.add(v * 16).cast::<f32>());
        }
        for (i, acc_row) in acc.iter_mut().enumerate() {
            // The broadcast pair goes in the instruction's memory-capable operand slot.
            let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*a.add(i) as i32));
            for (acc, &bv) in acc_row.iter_mut().zip(&bv) {
                *acc = _mm512_dpbf16_ps(*acc, std::mem::transmute::<__m512, __m512bh>(bv), ai);
            }
        }
        a = a.add(MR);
        b = b.add(NR);
    }
    store_tile::<MR, NV>(&acc, c, ldc, mr, nr, e);
}

/// The bf16 kernel's operands, as the blocking driver sees them.
struct Bf16Kernel<'a> {
    ta: Trans,
    tb: Trans,
    a: Src<'a>,
    lda: usize,
    b: Src<'a>,
    ldb: usize,
}

impl Packed for Bf16Kernel<'_> {
    const MR: usize = MR;
    const NR: usize = NR;
    const STEP: usize = 2;
    const KC: usize = KC;
    const MC_MAX: usize = MC_MAX;
    const NC: usize = NC;
    const NC_DEEP: usize = NC_DEEP;
    const KO: usize = KO;

    fn pack_b(&self, j0: usize, nv: usize, k0: usize, kc: usize, out: &mut [u32]) {
        let p = Panel {
            ld: self.ldb,
            lane0: j0,
            nv,
            k0,
            kc,
            w: NR,
        };
        pack(self.tb == Trans::T, self.b, p, out);
    }

    fn pack_a(&self, i0: usize, i1: usize, k0: usize, kc: usize, strips: usize, out: &mut [u32]) {
        let kp = kc.div_ceil(2);
        if self.ta == Trans::N {
            for (s, out) in out.chunks_mut(kp * MR).take(strips).enumerate() {
                let r0 = i0 + s * MR;
                let p = Panel {
                    ld: self.lda,
                    lane0: r0,
                    nv: MR.min(i1 - r0),
                    k0,
                    kc,
                    w: MR,
                };
                pack(true, self.a, p, out);
            }
        } else {
            let p = Panel {
                ld: self.lda,
                lane0: i0,
                nv: i1 - i0,
                k0,
                kc,
                w: MR,
            };
            // SAFETY: as in `pack`: features checked, columns i0..i1 and rows k0..k0+kc of
            // the stored A^T are inside the checked operand, and out holds strips * kp * MR
            // words.
            unsafe { pack_block_across_rows(self.a, p, strips, out) };
        }
    }

    unsafe fn kernel(
        steps: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        mr: usize,
        nr: usize,
        e: Epi,
    ) {
        kernel(steps, a, b, c, ldc, mr, nr, e)
    }
}

/// `C = alpha * op(A) op(B) + beta * C` (dims and slices already checked, k > 0, alpha != 0,
/// [`available`] true), blocked by [`drive`].
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm<TA: Float, TB: Float>(
    ta: Trans,
    tb: Trans,
    d: Dims,
    alpha: f32,
    a: &[TA],
    lda: usize,
    b: &[TB],
    ldb: usize,
    beta: f32,
    c: &mut [f32],
    ldc: usize,
    parallel: bool,
) {
    let kern = Bf16Kernel {
        ta,
        tb,
        a: Src::new(a),
        lda,
        b: Src::new(b),
        ldb,
    };
    drive(&kern, d, alpha, beta, c, ldc, parallel);
}
