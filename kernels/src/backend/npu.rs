//! [`Backend`] on an Ascend NPU: each method is the op's aclnn body in the op's own `npu.rs`.

use super::{Backend, Npu};
use crate::adamw::AdamW;
use crate::attention::{BlockAttention, QkvBuf, QkvGradBuf, VarlenAttention};
use crate::cross_entropy::{CeStats, LmHeadGrads, LossNorm};
use crate::error::Result;
use crate::gemm::{Dims, Precision, Trans};
use crate::index::TransposeDims;
use crate::linear::{LinearDims, LinearGradBufs};
use crate::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use crate::rope::RopeTable;
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use cannon_runtime::{Element, Float};

impl Backend for Npu {
    fn adamw_step(
        &self,
        stream: &Stream,
        params: &mut BufferViewMut<'_, f32>,
        grads: &BufferView<'_, f32>,
        m: &mut BufferViewMut<'_, f32>,
        v: &mut BufferViewMut<'_, f32>,
        step: u64,
        hp: &AdamW,
    ) -> Result<()> {
        crate::adamw::npu::step(self.ordinal, stream, params, grads, m, v, step, hp)
    }

    fn attention_forward<E: Float>(
        &self,
        stream: &Stream,
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, E>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()> {
        crate::attention::npu::forward(self.ordinal, stream, a, x, out, lse)
    }

    fn attention_backward<E: Float>(
        &self,
        stream: &Stream,
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, E>,
    ) -> Result<()> {
        crate::attention::npu::backward(self.ordinal, stream, a, x, out, lse, dout, g)
    }

    fn attention_block_forward<E: Float>(
        &self,
        _: &Stream,
        _: &BlockAttention,
        _: QkvBuf<'_, E>,
        _: &mut BufferViewMut<'_, f32>,
        _: &mut BufferViewMut<'_, f32>,
    ) -> Result<()> {
        Err(ring_block_pending("attention_block_forward", self.ordinal))
    }

    fn attention_block_backward<E: Float>(
        &self,
        _: &Stream,
        _: &BlockAttention,
        _: QkvBuf<'_, E>,
        _: &BufferView<'_, E>,
        _: &BufferView<'_, f32>,
        _: &BufferView<'_, E>,
        _: QkvGradBuf<'_, '_, f32>,
    ) -> Result<()> {
        Err(ring_block_pending("attention_block_backward", self.ordinal))
    }

    fn cast<A: Float, B: Float>(
        &self,
        stream: &Stream,
        src: &BufferView<'_, A>,
        dst: &mut BufferViewMut<'_, B>,
    ) -> Result<()> {
        crate::cast::npu::convert(self.ordinal, stream, src, dst)
    }

    fn cross_entropy(
        &self,
        stream: &Stream,
        logits: &BufferView<'_, f32>,
        labels: &[i32],
        vocab: usize,
        d_logits: Option<&mut BufferViewMut<'_, f32>>,
        norm: LossNorm,
    ) -> Result<CeStats> {
        crate::cross_entropy::npu::full(self.ordinal, stream, logits, labels, vocab, d_logits, norm)
    }

    fn cross_entropy_in_place(
        &self,
        stream: &Stream,
        logits: &mut BufferViewMut<'_, f32>,
        labels: &[i32],
        vocab: usize,
        norm: LossNorm,
    ) -> Result<CeStats> {
        crate::cross_entropy::npu::in_place(self.ordinal, stream, logits, labels, vocab, norm)
    }

    fn cross_entropy_lm_head(
        &self,
        stream: &Stream,
        h: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        labels: &[i32],
        d_model: usize,
        vocab: usize,
        chunk_rows: usize,
        norm: LossNorm,
        grads: LmHeadGrads<'_>,
    ) -> Result<CeStats> {
        crate::cross_entropy::npu::chunked_lm_head(
            self.ordinal,
            stream,
            h,
            w,
            labels,
            d_model,
            vocab,
            chunk_rows,
            norm,
            grads,
        )
    }

    fn embedding_forward<E: Float>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, E>,
        ids: &[u32],
        weight: &BufferView<'_, E>,
        dim: usize,
    ) -> Result<()> {
        crate::embedding::npu::forward(self.ordinal, stream, out, ids, weight, dim)
    }

    fn embedding_backward<E: Float>(
        &self,
        stream: &Stream,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        ids: &[u32],
        dim: usize,
    ) -> Result<()> {
        crate::embedding::npu::backward(self.ordinal, stream, dweight, dout, ids, dim)
    }

    fn gelu_forward<E: Float>(
        &self,
        stream: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::gelu::npu::forward(self.ordinal, stream, y, x)
    }

    fn gelu_backward<E: Float>(
        &self,
        stream: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        dy: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::gelu::npu::backward(self.ordinal, stream, dx, dy, x)
    }

    fn gemm<A: Float, B: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        ta: Trans,
        tb: Trans,
        d: Dims,
        alpha: f32,
        a: &BufferView<'_, A>,
        lda: usize,
        b: &BufferView<'_, B>,
        ldb: usize,
        beta: f32,
        c: &mut BufferViewMut<'_, f32>,
        ldc: usize,
    ) -> Result<()> {
        crate::gemm::npu::gemm(
            self.ordinal,
            stream,
            p,
            ta,
            tb,
            d,
            alpha,
            a,
            lda,
            b,
            ldb,
            beta,
            c,
            ldc,
        )
    }

    fn grad_sum_squares(&self, stream: &Stream, grads: &[BufferView<'_, f32>]) -> Result<f64> {
        crate::grad_clip::npu::grad_sum_squares(self.ordinal, stream, grads)
    }

    fn scale_grads(
        &self,
        stream: &Stream,
        grads: &mut [BufferViewMut<'_, f32>],
        coef: f32,
    ) -> Result<()> {
        crate::grad_clip::npu::scale_grads(self.ordinal, stream, grads, coef)
    }

    fn linear_forward<Y: Float, X: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        y: &mut BufferViewMut<'_, Y>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        b: Option<&BufferView<'_, W>>,
        d: LinearDims,
    ) -> Result<()> {
        crate::linear::npu::forward(self.ordinal, stream, p, y, x, w, b, d)
    }

    fn linear_backward<G: Float, X: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        g: LinearGradBufs<'_>,
        dy: &BufferView<'_, G>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        d: LinearDims,
    ) -> Result<()> {
        crate::linear::npu::backward(self.ordinal, stream, p, g, dy, x, w, d)
    }

    fn patch_embed_forward<P: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()> {
        crate::patch_embed::npu::forward(self.ordinal, stream, p, out, pixels, weight, g, d_model)
    }

    fn patch_embed_backward<G: Float, P: Float, W: Float>(
        &self,
        stream: &Stream,
        p: Precision,
        grads: PatchEmbedGradBufs<'_>,
        dout: &BufferView<'_, G>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()> {
        crate::patch_embed::npu::backward(
            self.ordinal,
            stream,
            p,
            grads,
            dout,
            pixels,
            weight,
            g,
            d_model,
        )
    }

    fn rmsnorm_forward<E: Float>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, E>,
        rstd: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        crate::rmsnorm::npu::forward(self.ordinal, stream, out, rstd, x, weight, dim, eps)
    }

    fn rmsnorm_backward<E: Float>(
        &self,
        stream: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        rstd: &BufferView<'_, f32>,
        dim: usize,
    ) -> Result<()> {
        crate::rmsnorm::npu::backward(
            self.ordinal,
            stream,
            dx,
            dweight,
            dout,
            x,
            weight,
            rstd,
            dim,
        )
    }

    fn rope_forward<E: Float>(
        &self,
        stream: &Stream,
        x: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()> {
        crate::rope::npu::forward(self.ordinal, stream, x, n_heads, table, pos)
    }

    fn rope_backward<E: Float>(
        &self,
        stream: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()> {
        crate::rope::npu::backward(self.ordinal, stream, dx, n_heads, table, pos)
    }

    fn swiglu_forward<E: Float>(
        &self,
        stream: &Stream,
        h: &mut BufferViewMut<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::swiglu::npu::forward(self.ordinal, stream, h, gate, up)
    }

    fn swiglu_backward<E: Float>(
        &self,
        stream: &Stream,
        d_gate: &mut BufferViewMut<'_, E>,
        d_up: &mut BufferViewMut<'_, E>,
        dh: &BufferView<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::swiglu::npu::backward(self.ordinal, stream, d_gate, d_up, dh, gate, up)
    }

    fn add_into<E: Float>(
        &self,
        stream: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::elementwise::npu::add_into(self.ordinal, stream, y, x)
    }

    fn mul<E: Float>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, E>,
        a: &BufferView<'_, E>,
        b: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::elementwise::npu::mul(self.ordinal, stream, out, a, b)
    }

    fn mul_into<E: Float>(
        &self,
        stream: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        crate::elementwise::npu::mul_into(self.ordinal, stream, y, x)
    }

    fn gather_rows<T: Element>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        crate::index::npu::gather_rows(self.ordinal, stream, out, src, idx, dim)
    }

    fn scatter_rows<T: Element>(
        &self,
        stream: &Stream,
        dst: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        crate::index::npu::scatter_rows(self.ordinal, stream, dst, src, idx, dim)
    }

    fn scatter_add_rows<E: Float>(
        &self,
        stream: &Stream,
        dst: &mut BufferViewMut<'_, E>,
        src: &BufferView<'_, E>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        crate::index::npu::scatter_add_rows(self.ordinal, stream, dst, src, idx, dim)
    }

    fn zero_rows<T: Element>(
        &self,
        stream: &Stream,
        dst: &mut BufferViewMut<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        crate::index::npu::zero_rows(self.ordinal, stream, dst, idx, dim)
    }

    fn transpose<T: Element>(
        &self,
        stream: &Stream,
        out: &mut BufferViewMut<'_, T>,
        x: &BufferView<'_, T>,
        d: TransposeDims,
    ) -> Result<()> {
        crate::index::npu::transpose(self.ordinal, stream, out, x, d)
    }
}

/// Ring attention's blocks have no NPU body yet: they would be
/// aclnnFlashAttentionVarLenScore calls with separate query and key lengths and the
/// log-sum-exp merge composed from aclnn elementwise ops. Until then the NPU runs context
/// parallelism as Ulysses.
fn ring_block_pending(op: &'static str, ordinal: u32) -> crate::error::KernelError {
    let device = cannon_runtime::Device::Npu(ordinal).to_string();
    if cfg!(feature = "npu") {
        crate::error::KernelError::Unsupported {
            op,
            device,
            reason: "ring attention blocks (parallel.cp_algo = ring or hybrid) have no NPU \
                     body yet; use parallel.cp_algo = ulysses on the NPU"
                .into(),
        }
    } else {
        crate::error::KernelError::NotCompiled { op, device }
    }
}
