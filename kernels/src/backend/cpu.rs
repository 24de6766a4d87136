//! [`Backend`] on the host: each method borrows the buffers' host slices and calls the op's
//! slice-level kernel, unchanged.

use super::{Backend, Cpu};
use crate::adamw::{host::adamw_step, AdamW};
use crate::attention::{self, BlockAttention, Qkv, QkvBuf, QkvGrad, QkvGradBuf, VarlenAttention};
use crate::cast;
use crate::cross_entropy::{self, CeStats, LmHeadCpu, LmHeadGrads, LossNorm};
use crate::error::Result;
use crate::gemm::{self, Dims, Precision, Trans};
use crate::index::TransposeDims;
use crate::linear::host::{linear_backward, linear_forward};
use crate::linear::{LinearDims, LinearGradBufs};
use crate::patch_embed::host::{patch_embed_backward, patch_embed_forward};
use crate::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use crate::rope::host::{rope_backward, rope_forward};
use crate::rope::RopeTable;
use crate::{elementwise, embedding, gelu, grad_clip, index, rmsnorm, swiglu};
use cannon_runtime::{BufferView, BufferViewMut, Stream};
use cannon_runtime::{Element, Float};

fn host_slices_mut<'a>(views: &'a mut [BufferViewMut<'_, f32>]) -> Result<Vec<&'a mut [f32]>> {
    Ok(views
        .iter_mut()
        .map(|g| g.as_host_slice_mut())
        .collect::<cannon_runtime::Result<Vec<_>>>()?)
}

impl Backend for Cpu {
    fn adamw_step(
        &self,
        _: &Stream,
        params: &mut BufferViewMut<'_, f32>,
        grads: &BufferView<'_, f32>,
        m: &mut BufferViewMut<'_, f32>,
        v: &mut BufferViewMut<'_, f32>,
        step: u64,
        hp: &AdamW,
    ) -> Result<()> {
        adamw_step(
            params.as_host_slice_mut()?,
            grads.as_host_slice()?,
            m.as_host_slice_mut()?,
            v.as_host_slice_mut()?,
            step,
            hp,
        )
    }

    fn attention_forward<E: Float>(
        &self,
        _: &Stream,
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, E>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()> {
        let qkv = Qkv {
            q: x.q.as_host_slice()?,
            k: x.k.as_host_slice()?,
            v: x.v.as_host_slice()?,
        };
        attention::host::forward(a, qkv, out.as_host_slice_mut()?, lse.as_host_slice_mut()?)
    }

    fn attention_backward<E: Float>(
        &self,
        _: &Stream,
        a: &VarlenAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, E>,
    ) -> Result<()> {
        let qkv = Qkv {
            q: x.q.as_host_slice()?,
            k: x.k.as_host_slice()?,
            v: x.v.as_host_slice()?,
        };
        let grads = QkvGrad {
            dq: g.dq.as_host_slice_mut()?,
            dk: g.dk.as_host_slice_mut()?,
            dv: g.dv.as_host_slice_mut()?,
        };
        attention::host::backward(
            a,
            qkv,
            out.as_host_slice()?,
            lse.as_host_slice()?,
            dout.as_host_slice()?,
            grads,
        )
    }

    fn attention_block_forward<E: Float>(
        &self,
        _: &Stream,
        a: &BlockAttention,
        x: QkvBuf<'_, E>,
        out: &mut BufferViewMut<'_, f32>,
        lse: &mut BufferViewMut<'_, f32>,
    ) -> Result<()> {
        let (q, k, v) = (
            x.q.as_host_slice()?,
            x.k.as_host_slice()?,
            x.v.as_host_slice()?,
        );
        let (out, lse) = (out.as_host_slice_mut()?, lse.as_host_slice_mut()?);
        attention::host::block_forward_merge(a, q, k, v, out, lse)
    }

    fn attention_block_backward<E: Float>(
        &self,
        _: &Stream,
        a: &BlockAttention,
        x: QkvBuf<'_, E>,
        out: &BufferView<'_, E>,
        lse: &BufferView<'_, f32>,
        dout: &BufferView<'_, E>,
        g: QkvGradBuf<'_, '_, f32>,
    ) -> Result<()> {
        let qkv = (
            x.q.as_host_slice()?,
            x.k.as_host_slice()?,
            x.v.as_host_slice()?,
        );
        let (out, lse, dout) = (
            out.as_host_slice()?,
            lse.as_host_slice()?,
            dout.as_host_slice()?,
        );
        let (dq, dk, dv) = (
            g.dq.as_host_slice_mut()?,
            g.dk.as_host_slice_mut()?,
            g.dv.as_host_slice_mut()?,
        );
        attention::host::block_backward_accumulate(a, qkv, out, lse, dout, dq, dk, dv)
    }

    fn cast<A: Float, B: Float>(
        &self,
        _: &Stream,
        src: &BufferView<'_, A>,
        dst: &mut BufferViewMut<'_, B>,
    ) -> Result<()> {
        cast::host::cast(src.as_host_slice()?, dst.as_host_slice_mut()?)
    }

    fn cross_entropy(
        &self,
        _: &Stream,
        logits: &BufferView<'_, f32>,
        labels: &[i32],
        vocab: usize,
        d_logits: Option<&mut BufferViewMut<'_, f32>>,
        norm: LossNorm,
    ) -> Result<CeStats> {
        let d_logits = d_logits.map(|d| d.as_host_slice_mut()).transpose()?;
        cross_entropy::host::cross_entropy(logits.as_host_slice()?, labels, vocab, d_logits, norm)
    }

    fn cross_entropy_in_place(
        &self,
        _: &Stream,
        logits: &mut BufferViewMut<'_, f32>,
        labels: &[i32],
        vocab: usize,
        norm: LossNorm,
    ) -> Result<CeStats> {
        cross_entropy::host::cross_entropy_in_place(
            logits.as_host_slice_mut()?,
            labels,
            vocab,
            norm,
        )
    }

    fn cross_entropy_lm_head(
        &self,
        _: &Stream,
        h: &BufferView<'_, f32>,
        w: &BufferView<'_, f32>,
        labels: &[i32],
        d_model: usize,
        vocab: usize,
        chunk_rows: usize,
        norm: LossNorm,
        mut grads: LmHeadGrads<'_>,
    ) -> Result<CeStats> {
        // The lm_head's lengths, as the NPU body checks them (the slice-level loss sees only
        // the producer, which slices h and dh by rows).
        grads.check(h.len(), w.len(), labels.len(), d_model, vocab)?;
        let with_grad = grads.dh.is_some() || grads.dw.is_some();
        let mut producer = LmHeadCpu {
            h: h.as_host_slice()?,
            w: w.as_host_slice()?,
            dh: grads
                .dh
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
            dw: grads
                .dw
                .as_mut()
                .map(|v| v.as_host_slice_mut())
                .transpose()?,
            d_model,
            vocab,
        };
        cross_entropy::host::cross_entropy_chunked(
            &mut producer,
            labels,
            vocab,
            chunk_rows,
            norm,
            with_grad,
        )
    }

    fn embedding_forward<E: Float>(
        &self,
        _: &Stream,
        out: &mut BufferViewMut<'_, E>,
        ids: &[u32],
        weight: &BufferView<'_, E>,
        dim: usize,
    ) -> Result<()> {
        embedding::host::embedding_forward(
            out.as_host_slice_mut()?,
            ids,
            weight.as_host_slice()?,
            dim,
        )
    }

    fn embedding_backward<E: Float>(
        &self,
        _: &Stream,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        ids: &[u32],
        dim: usize,
    ) -> Result<()> {
        embedding::host::embedding_backward(
            dweight.as_host_slice_mut()?,
            dout.as_host_slice()?,
            ids,
            dim,
        )
    }

    fn gelu_forward<E: Float>(
        &self,
        _: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        gelu::host::gelu_forward(y.as_host_slice_mut()?, x.as_host_slice()?)
    }

    fn gelu_backward<E: Float>(
        &self,
        _: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        dy: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        gelu::host::gelu_backward(
            dx.as_host_slice_mut()?,
            dy.as_host_slice()?,
            x.as_host_slice()?,
        )
    }

    fn gemm<A: Float, B: Float>(
        &self,
        _: &Stream,
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
        let (a, b, c) = (
            a.as_host_slice()?,
            b.as_host_slice()?,
            c.as_host_slice_mut()?,
        );
        gemm::host::gemm(p, ta, tb, d, alpha, a, lda, b, ldb, beta, c, ldc)
    }

    fn grad_sum_squares(&self, _: &Stream, grads: &[BufferView<'_, f32>]) -> Result<f64> {
        let slices = grads
            .iter()
            .map(|g| g.as_host_slice())
            .collect::<cannon_runtime::Result<Vec<&[f32]>>>()?;
        Ok(grad_clip::host::grad_sum_squares(&slices))
    }

    fn scale_grads(
        &self,
        _: &Stream,
        grads: &mut [BufferViewMut<'_, f32>],
        coef: f32,
    ) -> Result<()> {
        grad_clip::host::scale_grads(&mut host_slices_mut(grads)?, coef);
        Ok(())
    }

    fn linear_forward<Y: Float, X: Float, W: Float>(
        &self,
        _: &Stream,
        p: Precision,
        y: &mut BufferViewMut<'_, Y>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        b: Option<&BufferView<'_, W>>,
        d: LinearDims,
    ) -> Result<()> {
        let b = b.map(|b| b.as_host_slice()).transpose()?;
        linear_forward(
            p,
            y.as_host_slice_mut()?,
            x.as_host_slice()?,
            w.as_host_slice()?,
            b,
            d,
        )
    }

    fn linear_backward<G: Float, X: Float, W: Float>(
        &self,
        _: &Stream,
        p: Precision,
        mut g: LinearGradBufs<'_>,
        dy: &BufferView<'_, G>,
        x: &BufferView<'_, X>,
        w: &BufferView<'_, W>,
        d: LinearDims,
    ) -> Result<()> {
        let (dy, x, w) = (dy.as_host_slice()?, x.as_host_slice()?, w.as_host_slice()?);
        linear_backward(p, g.host()?, dy, x, w, d)
    }

    fn patch_embed_forward<P: Float, W: Float>(
        &self,
        _: &Stream,
        p: Precision,
        out: &mut BufferViewMut<'_, f32>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()> {
        let (pixels, weight) = (pixels.as_host_slice()?, weight.as_host_slice()?);
        patch_embed_forward(p, out.as_host_slice_mut()?, pixels, weight, g, d_model)
    }

    fn patch_embed_backward<G: Float, P: Float, W: Float>(
        &self,
        _: &Stream,
        p: Precision,
        mut grads: PatchEmbedGradBufs<'_>,
        dout: &BufferView<'_, G>,
        pixels: &BufferView<'_, P>,
        weight: &BufferView<'_, W>,
        g: PatchGeom,
        d_model: usize,
    ) -> Result<()> {
        let dout = dout.as_host_slice()?;
        let (pixels, weight) = (pixels.as_host_slice()?, weight.as_host_slice()?);
        patch_embed_backward(p, grads.host()?, dout, pixels, weight, g, d_model)
    }

    fn rmsnorm_forward<E: Float>(
        &self,
        _: &Stream,
        out: &mut BufferViewMut<'_, E>,
        rstd: &mut BufferViewMut<'_, f32>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        rmsnorm::host::rmsnorm_forward(
            out.as_host_slice_mut()?,
            rstd.as_host_slice_mut()?,
            x.as_host_slice()?,
            weight.as_host_slice()?,
            dim,
            eps,
        )
    }

    fn rmsnorm_backward<E: Float>(
        &self,
        _: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        dweight: &mut BufferViewMut<'_, f32>,
        dout: &BufferView<'_, E>,
        x: &BufferView<'_, E>,
        weight: &BufferView<'_, E>,
        rstd: &BufferView<'_, f32>,
        dim: usize,
    ) -> Result<()> {
        rmsnorm::host::rmsnorm_backward(
            dx.as_host_slice_mut()?,
            dweight.as_host_slice_mut()?,
            dout.as_host_slice()?,
            x.as_host_slice()?,
            weight.as_host_slice()?,
            rstd.as_host_slice()?,
            dim,
        )
    }

    fn rope_forward<E: Float>(
        &self,
        _: &Stream,
        x: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()> {
        rope_forward(x.as_host_slice_mut()?, n_heads, table, pos)
    }

    fn rope_backward<E: Float>(
        &self,
        _: &Stream,
        dx: &mut BufferViewMut<'_, E>,
        n_heads: usize,
        table: &RopeTable,
        pos: &[u32],
    ) -> Result<()> {
        rope_backward(dx.as_host_slice_mut()?, n_heads, table, pos)
    }

    fn swiglu_forward<E: Float>(
        &self,
        _: &Stream,
        h: &mut BufferViewMut<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()> {
        swiglu::host::swiglu_forward(
            h.as_host_slice_mut()?,
            gate.as_host_slice()?,
            up.as_host_slice()?,
        )
    }

    fn swiglu_backward<E: Float>(
        &self,
        _: &Stream,
        d_gate: &mut BufferViewMut<'_, E>,
        d_up: &mut BufferViewMut<'_, E>,
        dh: &BufferView<'_, E>,
        gate: &BufferView<'_, E>,
        up: &BufferView<'_, E>,
    ) -> Result<()> {
        swiglu::host::swiglu_backward(
            d_gate.as_host_slice_mut()?,
            d_up.as_host_slice_mut()?,
            dh.as_host_slice()?,
            gate.as_host_slice()?,
            up.as_host_slice()?,
        )
    }

    fn add_into<E: Float>(
        &self,
        _: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        elementwise::host::add_into(y.as_host_slice_mut()?, x.as_host_slice()?)
    }

    fn mul<E: Float>(
        &self,
        _: &Stream,
        out: &mut BufferViewMut<'_, E>,
        a: &BufferView<'_, E>,
        b: &BufferView<'_, E>,
    ) -> Result<()> {
        elementwise::host::mul(
            out.as_host_slice_mut()?,
            a.as_host_slice()?,
            b.as_host_slice()?,
        )
    }

    fn mul_into<E: Float>(
        &self,
        _: &Stream,
        y: &mut BufferViewMut<'_, E>,
        x: &BufferView<'_, E>,
    ) -> Result<()> {
        elementwise::host::mul_into(y.as_host_slice_mut()?, x.as_host_slice()?)
    }

    fn gather_rows<T: Element>(
        &self,
        _: &Stream,
        out: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        index::host::gather_rows(out.as_host_slice_mut()?, src.as_host_slice()?, idx, dim)
    }

    fn scatter_rows<T: Element>(
        &self,
        _: &Stream,
        dst: &mut BufferViewMut<'_, T>,
        src: &BufferView<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        index::host::scatter_rows(dst.as_host_slice_mut()?, src.as_host_slice()?, idx, dim)
    }

    fn scatter_add_rows<E: Float>(
        &self,
        _: &Stream,
        dst: &mut BufferViewMut<'_, E>,
        src: &BufferView<'_, E>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        index::host::scatter_add_rows(dst.as_host_slice_mut()?, src.as_host_slice()?, idx, dim)
    }

    fn zero_rows<T: Element>(
        &self,
        _: &Stream,
        dst: &mut BufferViewMut<'_, T>,
        idx: &[usize],
        dim: usize,
    ) -> Result<()> {
        index::host::zero_rows(dst.as_host_slice_mut()?, idx, dim)
    }

    fn transpose<T: Element>(
        &self,
        _: &Stream,
        out: &mut BufferViewMut<'_, T>,
        x: &BufferView<'_, T>,
        d: TransposeDims,
    ) -> Result<()> {
        index::host::transpose(out.as_host_slice_mut()?, x.as_host_slice()?, d)
    }
}
