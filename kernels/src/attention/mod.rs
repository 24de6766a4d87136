//! Varlen fused attention in TND layout (FlashAttention-2 style), forward and backward, CPU.
//!
//! Shapes (T = total tokens of all sequences concatenated, Hq / Hkv = query / key-value heads,
//! D = head_dim; every tensor row-major, contiguous):
//!
//! ```text
//! q, out, dout, dq   [T, Hq,  D]
//! k, v, dk, dv       [T, Hkv, D]
//! lse                [T, Hq]      f32, natural-log log-sum-exp of the scaled scores per row
//! cu_seqlens         [B]          cumulative END offsets, no leading 0 (the CANN convention)
//! ```
//!
//! `cu_seqlens` follows aclnnFlashAttentionVarLenScore's `actual_seq_qlen`: two images of 64 and
//! 96 patches are `[64, 160]`; an empty sequence repeats the previous value (`[2, 2, 5]` holds
//! lengths 2, 0, 3). It must be non-decreasing and end at T; an empty `cu_seqlens` means T = 0.
//! The leading-0 form (`[0, 64, 160]`) is accepted too because it only adds an empty first
//! sequence. CANN's "trailing zeros for unused batches" form is rejected (it is decreasing).
//!
//! Semantics per sequence s (rows `[start_s, end_s)`) and query head h, with kv head
//! `h / (Hq / Hkv)` (repeat_interleave: kv head j serves q heads `j*g .. j*g+g-1`):
//! `out = softmax(scale * q k^T + mask) v`, the mask being -inf above the diagonal when
//! `causal` (query i sees keys 0..=i of its own sequence) and nothing otherwise. Tokens of
//! different sequences never interact, so changing one sequence leaves the outputs of the
//! others bit-identical. Scores are computed in key blocks of 64 with an online softmax: no
//! S x S matrix is ever built.
//!
//! `lse[t, h] = ln(sum_j exp(scale * q_t . k_j))` over the keys row t may see; backward uses it
//! to recompute the probabilities. (CANN's softmaxMax/Sum are a different, opaque pair; this
//! layout is ours.)
//!
//! Backward OVERWRITES `dq`, `dk`, `dv` (unlike the crate-wide accumulate convention: attention
//! has no parameters, so its input gradients are always fresh buffers; in bf16 an accumulate
//! would also round twice). It is the FlashAttention-2 backward: `D_i = rowsum(dO_i * O_i)`,
//! P recomputed from the LSE, `dV += P^T dO`, `dP = dO V^T`, `dS = P * (dP - D)`,
//! `dQ += scale dS K`, `dK += scale dS^T Q`, with dK/dV summed over the q heads of a group.
//!
//! Float types: `f32`, and `half::bf16` storage (q/k/v/out/dout/dq/dk/dv in bf16, every
//! accumulation and the LSE in f32). Any head_dim >= 1 works (tested up to 256).
//!
//! Results do not depend on the number of threads: every row's arithmetic is fixed by the
//! shapes, and both backward schedules (fused per (sequence, kv head), or split into a dK/dV
//! pass and a dQ pass, chosen by the expected load balance) give the same bits.
//!
//! Ring attention's blocks (a rank's queries against another rank's keys, merged with the
//! log-sum-exp) are [`BlockAttention`] (block.rs).
//!
//! CPU implementation (cpu.rs, fwd.rs, bwd.rs, pack.rs, simd.rs): rayon over (sequence, query
//! tile) in forward and over (sequence, kv head) or (sequence, key block) + (sequence, query
//! tile) in backward, each task owning disjoint output rows; register-blocked 4 x 64 f32
//! micro-kernels written for auto-vectorisation and compiled per ISA (AVX-512, AVX2+FMA,
//! portable) behind run-time feature detection. Operands are packed once per call into f32
//! tiles (which also widens bf16): extra memory is about 2x the size of k and v in forward,
//! and 3x k/v plus 2x q in backward, held in a small process-wide buffer pool that is reused
//! by later calls instead of being freed.
//!
//! Speed: the measured rates are in docs/benchmarks.md ("Kernel rates").

mod block;
mod bwd;
mod cpu;
pub mod device;
mod fwd;
pub mod host;
pub(crate) mod npu;
pub(crate) use block::{
    check_backward as check_block_backward, check_forward as check_block_forward,
};
pub use block::{BlockAttention, BlockPair};
pub use npu::{block_lse_len_npu, lse_len_npu, BLOCK_EMPTY_MAX};

/// An empty ring-block `lse` accumulator of `rows` (query tokens x heads) for the backend of
/// `on` (a [`Selected`] backend, or a device, which selects one), `rows * lse_per_head(on)`
/// values: the log-sum-exp -inf on the CPU; softmaxMax [`BLOCK_EMPTY_MAX`] and softmaxSum 1
/// on the NPU (the merge's inputs must be finite there) and on the meta device, which takes
/// the NPU's layout (see [`lse_per_head`]). The output accumulator starts at 0 on all.
pub fn block_lse_init(on: impl Into<Selected>, rows: usize) -> Vec<f32> {
    match on.into() {
        Selected::Cpu(_) => vec![f32::NEG_INFINITY; rows],
        Selected::Npu(_) | Selected::Meta(_) => {
            let mut v = vec![BLOCK_EMPTY_MAX; rows * 8];
            v.resize(rows * 16, 1.0);
            v
        }
    }
}

/// f32 values of the softmax statistics per (token, query head) that the forward saves for
/// the backward on the backend of `on` (a [`Selected`] backend, or a device, which selects
/// one): 1 on the CPU (the log-sum-exp, `[T, Hq]`), 16 on the NPU (softmaxMax and
/// softmaxSum, `[T, Hq, 8]` each, see [`lse_len_npu`]). A model sizes its saved `lse` tensor
/// as `[T, Hq, lse_per_head(device)]`. The meta device sizes it as the NPU does: a meta run
/// measures what an NPU rank would allocate.
pub fn lse_per_head(on: impl Into<Selected>) -> usize {
    match on.into() {
        Selected::Cpu(_) => 1,
        Selected::Npu(_) | Selected::Meta(_) => 16,
    }
}
mod pack;
mod simd;

#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

use crate::backend::Selected;
use crate::error::{check_len, KernelError, Result};
use cannon_runtime::{BufferView, BufferViewMut, Float};

const OP_FWD: &str = "attention_forward";
const OP_BWD: &str = "attention_backward";

/// The static description of one varlen attention call.
#[derive(Clone, Copy, Debug)]
pub struct VarlenAttention<'a> {
    /// Cumulative end offsets of the sequences, no leading 0 (see the module docs).
    pub cu_seqlens: &'a [usize],
    /// T: total tokens (= last entry of `cu_seqlens`).
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
    /// Multiplies `q . k` before the softmax.
    pub scale: f32,
}

impl<'a> VarlenAttention<'a> {
    /// With the usual scale `1 / sqrt(head_dim)`.
    pub fn new(
        cu_seqlens: &'a [usize],
        tokens: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        causal: bool,
    ) -> Self {
        VarlenAttention {
            cu_seqlens,
            tokens,
            q_heads,
            kv_heads,
            head_dim,
            causal,
            scale: 1.0 / (head_dim.max(1) as f32).sqrt(),
        }
    }

    pub fn with_scale(self, scale: f32) -> Self {
        VarlenAttention { scale, ..self }
    }

    fn q_len(&self) -> usize {
        self.tokens * self.q_heads * self.head_dim
    }

    fn kv_len(&self) -> usize {
        self.tokens * self.kv_heads * self.head_dim
    }

    fn lse_len(&self) -> usize {
        self.tokens * self.q_heads
    }

    /// Checks heads, head_dim, scale and cu_seqlens; every failure names `op`.
    fn validate(&self, op: &'static str) -> Result<()> {
        let bad = |detail: String| Err(KernelError::InvalidArgument { op, detail });
        if self.q_heads == 0 || self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "q_heads ({}) must be a positive multiple of kv_heads ({})",
                self.q_heads, self.kv_heads
            ));
        }
        if self.head_dim == 0 {
            return bad("head_dim must be >= 1".into());
        }
        let sizes = [self.q_heads, self.kv_heads].map(|h| {
            self.tokens
                .checked_mul(h)
                .and_then(|x| x.checked_mul(self.head_dim))
        });
        if sizes.contains(&None) {
            return bad(format!(
                "tokens x heads x head_dim overflows ({} x {} x {})",
                self.tokens, self.q_heads, self.head_dim
            ));
        }
        if !self.scale.is_finite() {
            return bad(format!("scale must be finite, got {}", self.scale));
        }
        let mut prev = 0usize;
        for (i, &end) in self.cu_seqlens.iter().enumerate() {
            if end < prev {
                return bad(format!(
                    "cu_seqlens must be non-decreasing cumulative ends: entry {i} is {end} \
                     after {prev}"
                ));
            }
            prev = end;
        }
        if prev != self.tokens {
            return bad(format!(
                "cu_seqlens must end at the token count {} but ends at {prev}",
                self.tokens
            ));
        }
        Ok(())
    }

    /// Sequences as `(start, len)`, empty ones dropped.
    fn sequences(&self) -> Vec<(usize, usize)> {
        let mut prev = 0;
        let mut out = Vec::with_capacity(self.cu_seqlens.len());
        for &end in self.cu_seqlens {
            if end > prev {
                out.push((prev, end - prev));
            }
            prev = end;
        }
        out
    }
}

/// q, k, v on a device (the operands of [`crate::ops::attention_forward`]).
#[derive(Clone, Copy, Debug)]
pub struct QkvBuf<'a, E: cannon_runtime::Element> {
    pub q: &'a BufferView<'a, E>,
    pub k: &'a BufferView<'a, E>,
    pub v: &'a BufferView<'a, E>,
}

impl<E: cannon_runtime::Element> QkvBuf<'_, E> {
    /// The lengths of q, k, v.
    pub(crate) fn lens(&self) -> [usize; 3] {
        [self.q.len(), self.k.len(), self.v.len()]
    }
}

impl<E: cannon_runtime::Element> crate::backend::OnDevice for QkvBuf<'_, E> {
    fn devices(&self, out: &mut Vec<cannon_runtime::Device>) {
        out.extend([self.q.device(), self.k.device(), self.v.device()]);
    }
}

/// Gradients of q, k, v on a device (overwritten by [`crate::ops::attention_backward`]).
#[derive(Debug)]
pub struct QkvGradBuf<'a, 'b, E: cannon_runtime::Element> {
    pub dq: &'a mut BufferViewMut<'b, E>,
    pub dk: &'a mut BufferViewMut<'b, E>,
    pub dv: &'a mut BufferViewMut<'b, E>,
}

impl<E: cannon_runtime::Element> QkvGradBuf<'_, '_, E> {
    /// The lengths of dq, dk, dv.
    pub(crate) fn lens(&self) -> [usize; 3] {
        [self.dq.len(), self.dk.len(), self.dv.len()]
    }
}

impl<E: cannon_runtime::Element> crate::backend::OnDevice for QkvGradBuf<'_, '_, E> {
    fn devices(&self, out: &mut Vec<cannon_runtime::Device>) {
        out.extend([self.dq.device(), self.dk.device(), self.dv.device()]);
    }
}

/// Read-only q, k, v: `[T, Hq, D]`, `[T, Hkv, D]`, `[T, Hkv, D]`.
#[derive(Clone, Copy, Debug)]
pub struct Qkv<'a, E> {
    pub q: &'a [E],
    pub k: &'a [E],
    pub v: &'a [E],
}

/// Gradients of q, k, v (overwritten by [`backward`](host::backward)), shaped like [`Qkv`].
#[derive(Debug)]
pub struct QkvGrad<'a, E> {
    pub dq: &'a mut [E],
    pub dk: &'a mut [E],
    pub dv: &'a mut [E],
}

impl<E> Qkv<'_, E> {
    fn lens(&self) -> [usize; 3] {
        [self.q.len(), self.k.len(), self.v.len()]
    }
}

/// How a length error names the saved softmax statistics: the CPU's log-sum-exp (1 value
/// per token and query head) is `lse`; the NPU's form (16, see [`lse_per_head`]) is named
/// `npu` (which points at the function sizing it).
fn lse_name(lse_per_head: usize, npu: &'static str) -> &'static str {
    if lse_per_head == 1 {
        "lse"
    } else {
        npu
    }
}

/// q `[T, Hq, D]`, k and v `[T, Hkv, D]` (their lengths, in that order).
fn check_qkv(op: &'static str, a: &VarlenAttention, [q, k, v]: [usize; 3]) -> Result<()> {
    check_len(op, "q", q, a.q_len())?;
    check_len(op, "k", k, a.kv_len())?;
    check_len(op, "v", v, a.kv_len())
}

/// The saved statistics: `[T, Hq, lse_per_head]`.
fn check_lse(op: &'static str, a: &VarlenAttention, lse_per_head: usize, lse: usize) -> Result<()> {
    let what = lse_name(
        lse_per_head,
        "lse (softmaxMax + softmaxSum, see lse_len_npu)",
    );
    check_len(op, what, lse, a.lse_len() * lse_per_head)
}

/// The rules of [`forward`](host::forward) on every backend (the device-level entry point checks them before
/// any backend runs): `a` valid, q, k, v, out of its shapes and `lse` of `T * Hq *
/// lse_per_head` values, `lse_per_head` being the backend's ([`lse_per_head`]; 1 here).
pub(crate) fn check_forward(
    a: &VarlenAttention,
    lse_per_head: usize,
    qkv: [usize; 3],
    out: usize,
    lse: usize,
) -> Result<()> {
    a.validate(OP_FWD)?;
    check_qkv(OP_FWD, a, qkv)?;
    check_len(OP_FWD, "out", out, a.q_len())?;
    check_lse(OP_FWD, a, lse_per_head, lse)
}

/// The rules of [`backward`](host::backward) on every backend, as [`check_forward`]'s, with dout shaped as
/// out and dq, dk, dv as q, k, v.
pub(crate) fn check_backward(
    a: &VarlenAttention,
    lse_per_head: usize,
    qkv: [usize; 3],
    (out, lse, dout): (usize, usize, usize),
    [dq, dk, dv]: [usize; 3],
) -> Result<()> {
    a.validate(OP_BWD)?;
    check_qkv(OP_BWD, a, qkv)?;
    check_len(OP_BWD, "out", out, a.q_len())?;
    check_lse(OP_BWD, a, lse_per_head, lse)?;
    check_len(OP_BWD, "dout", dout, a.q_len())?;
    check_len(OP_BWD, "dq", dq, a.q_len())?;
    check_len(OP_BWD, "dk", dk, a.kv_len())?;
    check_len(OP_BWD, "dv", dv, a.kv_len())
}
