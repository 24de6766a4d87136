//! Every op on the meta device: with the right operand lengths a call is `Ok`, with any one
//! operand one element short it is the error the CPU gives (the entry point's `check`, the
//! same rule the slice-level function applies), although the meta backend computes nothing.
//! Each call also runs on CPU buffers through the entry point, and through its CPU arm alone
//! (`ops::on_cpu`), which skips the entry point's check: the slice-level function still
//! refuses the wrong length by itself.

use cannon_kernels::adamw::AdamW;
use cannon_kernels::attention::{
    lse_per_head, BlockAttention, BlockPair, QkvBuf, QkvGradBuf, VarlenAttention,
};
use cannon_kernels::cross_entropy::{LmHeadGrads, LossNorm, IGNORE_INDEX};
use cannon_kernels::gemm::{Dims, Trans};
use cannon_kernels::index::TransposeDims;
use cannon_kernels::linear::{LinearDims, LinearGradBufs};
use cannon_kernels::patch_embed::{PatchEmbedGradBufs, PatchGeom};
use cannon_kernels::rope::RopeTable;
use cannon_kernels::{ops, KernelError, Precision};
use cannon_runtime::{Device, DeviceBuffer, Element, Stream};
use half::bf16;
use std::collections::BTreeSet;

/// How a case reaches the op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Via {
    /// `cannon_kernels::ops`: the entry's `check`, then the stream's backend.
    Entry,
    /// The entry point's CPU arm (`ops::on_cpu`): the slice-level function alone.
    CpuBackend,
}

/// One call: its stream, its path and the operand to cut short (none: every length right).
struct Call<'a> {
    st: &'a Stream,
    via: Via,
    short: Option<&'static str>,
}

impl Call<'_> {
    /// Operand `name` of `n` elements on the call's device, one fewer if it is the one cut.
    fn buf<T: Element>(&self, name: &str, n: usize) -> DeviceBuffer<T> {
        let n = if self.short == Some(name) { n - 1 } else { n };
        DeviceBuffer::alloc_zeros(self.st, n).unwrap()
    }
}

/// `$op(stream, args...)` through the path the call names; the value dropped.
macro_rules! call {
    ($c:expr, $op:ident($($arg:expr),* $(,)?)) => {{
        let c: &Call = $c;
        match c.via {
            Via::Entry => ops::$op(c.st, $($arg),*).map(drop),
            Via::CpuBackend => ops::on_cpu::$op($($arg),*).map(drop),
        }
    }};
}

type Run = fn(&Call) -> Result<(), KernelError>;

/// One op of the list: its entry point, the op its errors name, the buffer operands that
/// are each cut short once, and the call.
struct Case {
    name: &'static str,
    op: &'static str,
    operands: &'static [&'static str],
    run: Run,
}

fn adamw_step(c: &Call) -> Result<(), KernelError> {
    let n = 7;
    let (mut p, g) = (c.buf::<f32>("params", n), c.buf::<f32>("grads", n));
    let (mut m, mut v) = (c.buf::<f32>("m", n), c.buf::<f32>("v", n));
    let hp = AdamW::default();
    call!(
        c,
        adamw_step(
            &mut p.view_mut(),
            &g.view(),
            &mut m.view_mut(),
            &mut v.view_mut(),
            1,
            &hp
        )
    )
}

/// T = 5 tokens in two sequences, 4 query heads over 2 kv heads of 3.
const VARLEN: (usize, usize, usize, usize) = (5, 4, 2, 3);
const CU: [usize; 2] = [3, 5];

fn varlen() -> VarlenAttention<'static> {
    let (t, hq, hkv, d) = VARLEN;
    VarlenAttention::new(&CU, t, hq, hkv, d, true)
}

fn attention_forward(c: &Call) -> Result<(), KernelError> {
    let (t, hq, hkv, d) = VARLEN;
    let per_head = lse_per_head(c.st.device());
    let (q, k, v) = (
        c.buf::<f32>("q", t * hq * d),
        c.buf::<f32>("k", t * hkv * d),
        c.buf::<f32>("v", t * hkv * d),
    );
    let (mut out, mut lse) = (
        c.buf::<f32>("out", t * hq * d),
        c.buf::<f32>("lse", t * hq * per_head),
    );
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let x = QkvBuf {
        q: &qv,
        k: &kv,
        v: &vv,
    };
    let a = varlen();
    call!(
        c,
        attention_forward(&a, x, &mut out.view_mut(), &mut lse.view_mut())
    )
}

fn attention_backward(c: &Call) -> Result<(), KernelError> {
    let (t, hq, hkv, d) = VARLEN;
    let per_head = lse_per_head(c.st.device());
    let (q, k, v) = (
        c.buf::<f32>("q", t * hq * d),
        c.buf::<f32>("k", t * hkv * d),
        c.buf::<f32>("v", t * hkv * d),
    );
    let (out, lse, dout) = (
        c.buf::<f32>("out", t * hq * d),
        c.buf::<f32>("lse", t * hq * per_head),
        c.buf::<f32>("dout", t * hq * d),
    );
    let (mut dq, mut dk, mut dv) = (
        c.buf::<f32>("dq", t * hq * d),
        c.buf::<f32>("dk", t * hkv * d),
        c.buf::<f32>("dv", t * hkv * d),
    );
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let x = QkvBuf {
        q: &qv,
        k: &kv,
        v: &vv,
    };
    let (mut dqv, mut dkv, mut dvv) = (dq.view_mut(), dk.view_mut(), dv.view_mut());
    let g = QkvGradBuf {
        dq: &mut dqv,
        dk: &mut dkv,
        dv: &mut dvv,
    };
    let a = varlen();
    call!(
        c,
        attention_backward(&a, x, &out.view(), &lse.view(), &dout.view(), g)
    )
}

/// 3 query rows against 4 key rows, 2 query heads over 1 kv head of 3.
const BLOCK: (usize, usize, usize, usize, usize) = (3, 4, 2, 1, 3);

fn block_pairs() -> [BlockPair; 1] {
    let (tq, tk, ..) = BLOCK;
    [BlockPair {
        q: 0..tq,
        k: 0..tk,
        causal: false,
    }]
}

fn block(pairs: &[BlockPair]) -> BlockAttention<'_> {
    let (tq, tk, hq, hkv, d) = BLOCK;
    BlockAttention {
        pairs,
        q_tokens: tq,
        k_tokens: tk,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        scale: 0.5,
    }
}

fn attention_block_forward(c: &Call) -> Result<(), KernelError> {
    let (tq, tk, hq, hkv, d) = BLOCK;
    let per_head = lse_per_head(c.st.device());
    let (q, k, v) = (
        c.buf::<f32>("q", tq * hq * d),
        c.buf::<f32>("k", tk * hkv * d),
        c.buf::<f32>("v", tk * hkv * d),
    );
    let (mut out, mut lse) = (
        c.buf::<f32>("out", tq * hq * d),
        c.buf::<f32>("lse", tq * hq * per_head),
    );
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let x = QkvBuf {
        q: &qv,
        k: &kv,
        v: &vv,
    };
    let pairs = block_pairs();
    let a = block(&pairs);
    call!(
        c,
        attention_block_forward(&a, x, &mut out.view_mut(), &mut lse.view_mut())
    )
}

fn attention_block_backward(c: &Call) -> Result<(), KernelError> {
    let (tq, tk, hq, hkv, d) = BLOCK;
    let per_head = lse_per_head(c.st.device());
    let (q, k, v) = (
        c.buf::<f32>("q", tq * hq * d),
        c.buf::<f32>("k", tk * hkv * d),
        c.buf::<f32>("v", tk * hkv * d),
    );
    let (out, lse, dout) = (
        c.buf::<f32>("out", tq * hq * d),
        c.buf::<f32>("lse", tq * hq * per_head),
        c.buf::<f32>("dout", tq * hq * d),
    );
    let (mut dq, mut dk, mut dv) = (
        c.buf::<f32>("dq", tq * hq * d),
        c.buf::<f32>("dk", tk * hkv * d),
        c.buf::<f32>("dv", tk * hkv * d),
    );
    let (qv, kv, vv) = (q.view(), k.view(), v.view());
    let x = QkvBuf {
        q: &qv,
        k: &kv,
        v: &vv,
    };
    let (mut dqv, mut dkv, mut dvv) = (dq.view_mut(), dk.view_mut(), dv.view_mut());
    let g = QkvGradBuf {
        dq: &mut dqv,
        dk: &mut dkv,
        dv: &mut dvv,
    };
    let pairs = block_pairs();
    let a = block(&pairs);
    call!(
        c,
        attention_block_backward(&a, x, &out.view(), &lse.view(), &dout.view(), g)
    )
}

fn cast(c: &Call) -> Result<(), KernelError> {
    let (src, mut dst) = (c.buf::<f32>("src", 9), c.buf::<bf16>("dst", 9));
    call!(c, cast(&src.view(), &mut dst.view_mut()))
}

/// 3 rows of a vocabulary of 5, one ignored.
const LABELS: [i32; 3] = [1, IGNORE_INDEX, 4];
const VOCAB: usize = 5;

fn cross_entropy(c: &Call) -> Result<(), KernelError> {
    let n = LABELS.len() * VOCAB;
    let (logits, mut d) = (c.buf::<f32>("logits", n), c.buf::<f32>("d_logits", n));
    let (labels, norm) = (&LABELS[..], LossNorm::Mean);
    call!(
        c,
        cross_entropy(&logits.view(), labels, VOCAB, Some(&mut d.view_mut()), norm)
    )
}

fn cross_entropy_in_place(c: &Call) -> Result<(), KernelError> {
    let mut logits = c.buf::<f32>("logits", LABELS.len() * VOCAB);
    let (labels, norm) = (&LABELS[..], LossNorm::Mean);
    call!(
        c,
        cross_entropy_in_place(&mut logits.view_mut(), labels, VOCAB, norm)
    )
}

fn cross_entropy_lm_head(c: &Call) -> Result<(), KernelError> {
    let (n, d_model) = (LABELS.len(), 4);
    let (h, w) = (
        c.buf::<f32>("h", n * d_model),
        c.buf::<f32>("w", VOCAB * d_model),
    );
    let (mut dh, mut dw) = (
        c.buf::<f32>("dh", n * d_model),
        c.buf::<f32>("dw", VOCAB * d_model),
    );
    let grads = LmHeadGrads {
        dh: Some(dh.view_mut()),
        dw: Some(dw.view_mut()),
    };
    let (labels, norm) = (&LABELS[..], LossNorm::Mean);
    call!(
        c,
        cross_entropy_lm_head(&h.view(), &w.view(), labels, d_model, VOCAB, 2, norm, grads)
    )
}

/// 4 tokens of a vocabulary of 6, rows of 3.
const IDS: [u32; 4] = [0, 5, 2, 2];
const EMB: (usize, usize) = (6, 3);

fn embedding_forward(c: &Call) -> Result<(), KernelError> {
    let (vocab, dim) = EMB;
    let (mut out, weight) = (
        c.buf::<f32>("out", IDS.len() * dim),
        c.buf::<f32>("weight", vocab * dim),
    );
    call!(
        c,
        embedding_forward(&mut out.view_mut(), &IDS, &weight.view(), dim)
    )
}

fn embedding_backward(c: &Call) -> Result<(), KernelError> {
    let (vocab, dim) = EMB;
    let (mut dweight, dout) = (
        c.buf::<f32>("dweight", vocab * dim),
        c.buf::<f32>("dout", IDS.len() * dim),
    );
    call!(
        c,
        embedding_backward(&mut dweight.view_mut(), &dout.view(), &IDS, dim)
    )
}

fn gelu_forward(c: &Call) -> Result<(), KernelError> {
    let (mut y, x) = (c.buf::<f32>("y", 7), c.buf::<f32>("x", 7));
    call!(c, gelu_forward(&mut y.view_mut(), &x.view()))
}

fn gelu_backward(c: &Call) -> Result<(), KernelError> {
    let (mut dx, dy, x) = (
        c.buf::<f32>("dx", 7),
        c.buf::<f32>("dy", 7),
        c.buf::<f32>("x", 7),
    );
    call!(c, gelu_backward(&mut dx.view_mut(), &dy.view(), &x.view()))
}

/// `C [2, 3] = A [2, 4] B^T` with B stored `[3, 4]`, every row stride the row length.
fn gemm(c: &Call) -> Result<(), KernelError> {
    let d = Dims { m: 2, n: 3, k: 4 };
    let (a, b, mut cm) = (
        c.buf::<f32>("a", d.m * d.k),
        c.buf::<f32>("b", d.n * d.k),
        c.buf::<f32>("c", d.m * d.n),
    );
    call!(
        c,
        gemm(
            Precision::F32,
            Trans::N,
            Trans::T,
            d,
            1.0,
            &a.view(),
            d.k,
            &b.view(),
            d.k,
            0.0,
            &mut cm.view_mut(),
            d.n
        )
    )
}

fn grad_sum_squares(c: &Call) -> Result<(), KernelError> {
    let (a, b) = (c.buf::<f32>("a", 3), c.buf::<f32>("b", 5));
    call!(c, grad_sum_squares(&[a.view(), b.view()]))
}

fn scale_grads(c: &Call) -> Result<(), KernelError> {
    let (mut a, mut b) = (c.buf::<f32>("a", 3), c.buf::<f32>("b", 5));
    call!(c, scale_grads(&mut [a.view_mut(), b.view_mut()], 0.5))
}

const LIN: LinearDims = LinearDims {
    t: 2,
    d_in: 3,
    d_out: 4,
};

fn linear_forward(c: &Call) -> Result<(), KernelError> {
    let d = LIN;
    let (mut y, x) = (
        c.buf::<f32>("y", d.t * d.d_out),
        c.buf::<f32>("x", d.t * d.d_in),
    );
    let (w, b) = (
        c.buf::<f32>("w", d.d_out * d.d_in),
        c.buf::<f32>("b", d.d_out),
    );
    let p = Precision::F32;
    call!(
        c,
        linear_forward(
            p,
            &mut y.view_mut(),
            &x.view(),
            &w.view(),
            Some(&b.view()),
            d
        )
    )
}

fn linear_backward(c: &Call) -> Result<(), KernelError> {
    let d = LIN;
    let (mut dx, mut dw, mut db) = (
        c.buf::<f32>("dx", d.t * d.d_in),
        c.buf::<f32>("dw", d.d_out * d.d_in),
        c.buf::<f32>("db", d.d_out),
    );
    let (dy, x, w) = (
        c.buf::<f32>("dy", d.t * d.d_out),
        c.buf::<f32>("x", d.t * d.d_in),
        c.buf::<f32>("w", d.d_out * d.d_in),
    );
    let g = LinearGradBufs {
        dx: Some(dx.view_mut()),
        dw: Some(dw.view_mut()),
        db: Some(db.view_mut()),
    };
    let p = Precision::F32;
    call!(
        c,
        linear_backward(p, g, &dy.view(), &x.view(), &w.view(), d)
    )
}

/// 2 channels stored 4 x 5, the 4 x 4 image cut in 2 x 2 patches of 2: 4 patches of 8.
const GEOM: PatchGeom = PatchGeom {
    channels: 2,
    height: 4,
    width: 5,
    h: 4,
    w: 4,
    patch: 2,
};
const D_MODEL: usize = 3;

fn patch_embed_forward(c: &Call) -> Result<(), KernelError> {
    let g = GEOM;
    let (mut out, pixels, weight) = (
        c.buf::<f32>("out", g.num_patches() * D_MODEL),
        c.buf::<f32>("pixels", g.channels * g.height * g.width),
        c.buf::<f32>("weight", D_MODEL * g.patch_len()),
    );
    let p = Precision::F32;
    call!(
        c,
        patch_embed_forward(
            p,
            &mut out.view_mut(),
            &pixels.view(),
            &weight.view(),
            g,
            D_MODEL
        )
    )
}

fn patch_embed_backward(c: &Call) -> Result<(), KernelError> {
    let g = GEOM;
    let (mut dweight, mut dpixels) = (
        c.buf::<f32>("dweight", D_MODEL * g.patch_len()),
        c.buf::<f32>("dpixels", g.channels * g.height * g.width),
    );
    let (dout, pixels, weight) = (
        c.buf::<f32>("dout", g.num_patches() * D_MODEL),
        c.buf::<f32>("pixels", g.channels * g.height * g.width),
        c.buf::<f32>("weight", D_MODEL * g.patch_len()),
    );
    let grads = PatchEmbedGradBufs {
        dweight: Some(dweight.view_mut()),
        dpixels: Some(dpixels.view_mut()),
    };
    let p = Precision::F32;
    call!(
        c,
        patch_embed_backward(
            p,
            grads,
            &dout.view(),
            &pixels.view(),
            &weight.view(),
            g,
            D_MODEL
        )
    )
}

/// 3 rows of 4.
const NORM: (usize, usize) = (3, 4);

fn rmsnorm_forward(c: &Call) -> Result<(), KernelError> {
    let (t, dim) = NORM;
    let (mut out, mut rstd) = (c.buf::<f32>("out", t * dim), c.buf::<f32>("rstd", t));
    let (x, weight) = (c.buf::<f32>("x", t * dim), c.buf::<f32>("weight", dim));
    call!(
        c,
        rmsnorm_forward(
            &mut out.view_mut(),
            &mut rstd.view_mut(),
            &x.view(),
            &weight.view(),
            dim,
            1e-5
        )
    )
}

fn rmsnorm_backward(c: &Call) -> Result<(), KernelError> {
    let (t, dim) = NORM;
    let (mut dx, mut dweight) = (c.buf::<f32>("dx", t * dim), c.buf::<f32>("dweight", dim));
    let (dout, x) = (c.buf::<f32>("dout", t * dim), c.buf::<f32>("x", t * dim));
    let (weight, rstd) = (c.buf::<f32>("weight", dim), c.buf::<f32>("rstd", t));
    call!(
        c,
        rmsnorm_backward(
            &mut dx.view_mut(),
            &mut dweight.view_mut(),
            &dout.view(),
            &x.view(),
            &weight.view(),
            &rstd.view(),
            dim
        )
    )
}

/// 3 tokens of 2 heads of 4, a table of 8 positions.
const POS: [u32; 3] = [0, 3, 7];

fn rope_table() -> RopeTable {
    RopeTable::text(4, 10000.0, 8).unwrap()
}

fn rope_forward(c: &Call) -> Result<(), KernelError> {
    let (table, heads) = (rope_table(), 2);
    let mut x = c.buf::<f32>("x", POS.len() * heads * table.head_dim());
    call!(c, rope_forward(&mut x.view_mut(), heads, &table, &POS))
}

fn rope_backward(c: &Call) -> Result<(), KernelError> {
    let (table, heads) = (rope_table(), 2);
    let mut dx = c.buf::<f32>("dx", POS.len() * heads * table.head_dim());
    call!(c, rope_backward(&mut dx.view_mut(), heads, &table, &POS))
}

fn swiglu_forward(c: &Call) -> Result<(), KernelError> {
    let (mut h, gate, up) = (
        c.buf::<f32>("h", 5),
        c.buf::<f32>("gate", 5),
        c.buf::<f32>("up", 5),
    );
    call!(
        c,
        swiglu_forward(&mut h.view_mut(), &gate.view(), &up.view())
    )
}

fn swiglu_backward(c: &Call) -> Result<(), KernelError> {
    let (mut d_gate, mut d_up) = (c.buf::<f32>("d_gate", 5), c.buf::<f32>("d_up", 5));
    let (dh, gate, up) = (
        c.buf::<f32>("dh", 5),
        c.buf::<f32>("gate", 5),
        c.buf::<f32>("up", 5),
    );
    call!(
        c,
        swiglu_backward(
            &mut d_gate.view_mut(),
            &mut d_up.view_mut(),
            &dh.view(),
            &gate.view(),
            &up.view()
        )
    )
}

fn add_into(c: &Call) -> Result<(), KernelError> {
    let (mut y, x) = (c.buf::<f32>("y", 6), c.buf::<f32>("x", 6));
    call!(c, add_into(&mut y.view_mut(), &x.view()))
}

fn mul(c: &Call) -> Result<(), KernelError> {
    let (mut out, a, b) = (
        c.buf::<f32>("out", 6),
        c.buf::<f32>("a", 6),
        c.buf::<f32>("b", 6),
    );
    call!(c, mul(&mut out.view_mut(), &a.view(), &b.view()))
}

fn mul_into(c: &Call) -> Result<(), KernelError> {
    let (mut y, x) = (c.buf::<f32>("y", 6), c.buf::<f32>("x", 6));
    call!(c, mul_into(&mut y.view_mut(), &x.view()))
}

/// Rows 4, 0, 2 of a table of 5 rows of 3.
const IDX: [usize; 3] = [4, 0, 2];
const TABLE: (usize, usize) = (5, 3);

fn gather_rows(c: &Call) -> Result<(), KernelError> {
    let (rows, dim) = TABLE;
    let (mut out, src) = (
        c.buf::<f32>("out", IDX.len() * dim),
        c.buf::<f32>("src", rows * dim),
    );
    call!(c, gather_rows(&mut out.view_mut(), &src.view(), &IDX, dim))
}

fn scatter_rows(c: &Call) -> Result<(), KernelError> {
    let (rows, dim) = TABLE;
    let (mut dst, src) = (
        c.buf::<f32>("dst", rows * dim),
        c.buf::<f32>("src", IDX.len() * dim),
    );
    call!(c, scatter_rows(&mut dst.view_mut(), &src.view(), &IDX, dim))
}

fn scatter_add_rows(c: &Call) -> Result<(), KernelError> {
    let (rows, dim) = TABLE;
    let (mut dst, src) = (
        c.buf::<f32>("dst", rows * dim),
        c.buf::<f32>("src", IDX.len() * dim),
    );
    call!(
        c,
        scatter_add_rows(&mut dst.view_mut(), &src.view(), &IDX, dim)
    )
}

fn zero_rows(c: &Call) -> Result<(), KernelError> {
    let (rows, dim) = TABLE;
    let mut dst = c.buf::<f32>("dst", rows * dim);
    call!(c, zero_rows(&mut dst.view_mut(), &IDX, dim))
}

fn transpose(c: &Call) -> Result<(), KernelError> {
    let d = TransposeDims {
        batch: 2,
        rows: 3,
        cols: 4,
    };
    let n = d.batch * d.rows * d.cols;
    let (mut out, x) = (c.buf::<f32>("out", n), c.buf::<f32>("x", n));
    call!(c, transpose(&mut out.view_mut(), &x.view(), d))
}

/// Every op with a backend `match` (`kernels/src/<op>/device.rs`).
const CASES: &[Case] = &[
    Case {
        name: "adamw_step",
        op: "adamw_step",
        operands: &["params", "grads", "m", "v"],
        run: adamw_step,
    },
    Case {
        name: "attention_forward",
        op: "attention_forward",
        operands: &["q", "k", "v", "out", "lse"],
        run: attention_forward,
    },
    Case {
        name: "attention_backward",
        op: "attention_backward",
        operands: &["q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"],
        run: attention_backward,
    },
    Case {
        name: "attention_block_forward",
        op: "attention_block_forward",
        operands: &["q", "k", "v", "out", "lse"],
        run: attention_block_forward,
    },
    Case {
        name: "attention_block_backward",
        op: "attention_block_backward",
        operands: &["q", "k", "v", "out", "lse", "dout", "dq", "dk", "dv"],
        run: attention_block_backward,
    },
    Case {
        name: "cast",
        op: "cast",
        operands: &["src", "dst"],
        run: cast,
    },
    Case {
        name: "cross_entropy",
        op: "cross_entropy",
        operands: &["logits", "d_logits"],
        run: cross_entropy,
    },
    Case {
        name: "cross_entropy_in_place",
        op: "cross_entropy_in_place",
        operands: &["logits"],
        run: cross_entropy_in_place,
    },
    Case {
        name: "cross_entropy_lm_head",
        op: "cross_entropy_chunked",
        operands: &["h", "w", "dh", "dw"],
        run: cross_entropy_lm_head,
    },
    Case {
        name: "embedding_forward",
        op: "embedding_forward",
        operands: &["out", "weight"],
        run: embedding_forward,
    },
    Case {
        name: "embedding_backward",
        op: "embedding_backward",
        operands: &["dweight", "dout"],
        run: embedding_backward,
    },
    Case {
        name: "gelu_forward",
        op: "gelu_forward",
        operands: &["y", "x"],
        run: gelu_forward,
    },
    Case {
        name: "gelu_backward",
        op: "gelu_backward",
        operands: &["dx", "dy", "x"],
        run: gelu_backward,
    },
    Case {
        name: "gemm",
        op: "gemm",
        operands: &["a", "b", "c"],
        run: gemm,
    },
    // No rule: any views of any lengths.
    Case {
        name: "grad_sum_squares",
        op: "grad_sum_squares",
        operands: &[],
        run: grad_sum_squares,
    },
    Case {
        name: "scale_grads",
        op: "scale_grads",
        operands: &[],
        run: scale_grads,
    },
    Case {
        name: "linear_forward",
        op: "linear_forward",
        operands: &["y", "x", "w", "b"],
        run: linear_forward,
    },
    Case {
        name: "linear_backward",
        op: "linear_backward",
        operands: &["dx", "dw", "db", "dy", "x", "w"],
        run: linear_backward,
    },
    Case {
        name: "patch_embed_forward",
        op: "patch_embed_forward",
        operands: &["out", "pixels", "weight"],
        run: patch_embed_forward,
    },
    Case {
        name: "patch_embed_backward",
        op: "patch_embed_backward",
        operands: &["dweight", "dpixels", "dout", "pixels", "weight"],
        run: patch_embed_backward,
    },
    Case {
        name: "rmsnorm_forward",
        op: "rmsnorm_forward",
        operands: &["out", "rstd", "x", "weight"],
        run: rmsnorm_forward,
    },
    Case {
        name: "rmsnorm_backward",
        op: "rmsnorm_backward",
        operands: &["dx", "dweight", "dout", "x", "weight", "rstd"],
        run: rmsnorm_backward,
    },
    Case {
        name: "rope_forward",
        op: "rope_forward",
        operands: &["x"],
        run: rope_forward,
    },
    Case {
        name: "rope_backward",
        op: "rope_backward",
        operands: &["dx"],
        run: rope_backward,
    },
    Case {
        name: "swiglu_forward",
        op: "swiglu_forward",
        operands: &["h", "gate", "up"],
        run: swiglu_forward,
    },
    Case {
        name: "swiglu_backward",
        op: "swiglu_backward",
        operands: &["d_gate", "d_up", "dh", "gate", "up"],
        run: swiglu_backward,
    },
    Case {
        name: "add_into",
        op: "add_into",
        operands: &["y", "x"],
        run: add_into,
    },
    Case {
        name: "mul",
        op: "mul",
        operands: &["out", "a", "b"],
        run: mul,
    },
    Case {
        name: "mul_into",
        op: "mul_into",
        operands: &["y", "x"],
        run: mul_into,
    },
    Case {
        name: "gather_rows",
        op: "gather_rows",
        operands: &["out", "src"],
        run: gather_rows,
    },
    Case {
        name: "scatter_rows",
        op: "scatter_rows",
        operands: &["dst", "src"],
        run: scatter_rows,
    },
    Case {
        name: "scatter_add_rows",
        op: "scatter_add_rows",
        operands: &["dst", "src"],
        run: scatter_add_rows,
    },
    Case {
        name: "zero_rows",
        op: "zero_rows",
        operands: &["dst"],
        run: zero_rows,
    },
    Case {
        name: "transpose",
        op: "transpose",
        operands: &["out", "x"],
        run: transpose,
    },
];

/// The op an argument error names (`None` for any other error: a device mismatch, a host
/// access refused...).
fn op_of(e: &KernelError) -> Option<&'static str> {
    match e {
        KernelError::Shape { op, .. } | KernelError::InvalidArgument { op, .. } => Some(op),
        _ => None,
    }
}

/// The ops with a backend `match`, read from the ops' sources: the functions of each
/// `src/<op>/device.rs`'s `on_cpu` module (one per entry point with a CPU arm), each checked
/// to have its entry point beside it.
fn ops_with_a_backend_match() -> BTreeSet<String> {
    let src_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut ops = BTreeSet::new();
    for dir in std::fs::read_dir(src_dir).unwrap() {
        let path = dir.unwrap().path().join("device.rs");
        let Ok(src) = std::fs::read_to_string(&path) else {
            continue;
        };
        let name = |l: &str| l.split(['<', '(']).next().unwrap().to_string();
        let entries: BTreeSet<String> = src
            .lines()
            .filter_map(|l| l.strip_prefix("pub fn "))
            .map(name)
            .collect();
        for op in src
            .lines()
            .filter_map(|l| l.strip_prefix("    pub fn "))
            .map(name)
        {
            assert!(entries.contains(&op), "{path:?}: {op} has no entry point");
            ops.insert(op);
        }
    }
    ops
}

#[test]
fn every_op_of_the_list_has_a_case() {
    let cases: BTreeSet<String> = CASES.iter().map(|c| c.name.to_string()).collect();
    let list = ops_with_a_backend_match();
    assert_eq!(list.len(), 34, "the ops as read: {list:?}");
    assert_eq!(cases, list, "one case per op");
}

/// `case` on `st` through `via`: `Ok` with every length right, and with each operand one
/// element short the argument error of `case.op`. Gives those errors' messages.
fn run_case(case: &Case, st: &Stream, via: Via) -> Vec<String> {
    let right = Call {
        st,
        via,
        short: None,
    };
    if let Err(e) = (case.run)(&right) {
        panic!(
            "{} on {} ({via:?}), right lengths: {e}",
            case.name,
            st.device()
        );
    }
    case.operands
        .iter()
        .map(|&operand| {
            let short = Call {
                st,
                via,
                short: Some(operand),
            };
            let e = match (case.run)(&short) {
                Ok(()) => panic!(
                    "{} on {} ({via:?}) accepted {operand} one element short",
                    case.name,
                    st.device()
                ),
                Err(e) => e,
            };
            assert_eq!(
                op_of(&e),
                Some(case.op),
                "{} on {} ({via:?}), {operand} short: {e}",
                case.name,
                st.device()
            );
            e.to_string()
        })
        .collect()
}

#[test]
fn meta_checks_every_operand_length_of_every_op() {
    let meta = Stream::new(Device::Meta).unwrap();
    for case in CASES {
        run_case(case, &meta, Via::Entry);
    }
}

/// On CPU buffers the same calls give the same errors through the entry point, and through
/// the CPU arm alone: the slice-level functions still check by themselves. Where the
/// layout is the device's own (attention's saved statistics), the numbers differ from the
/// meta device's; every other message is the meta device's word for word.
#[test]
fn cpu_refuses_the_same_lengths_with_or_without_the_entry_check() {
    let (meta, cpu) = (Stream::new(Device::Meta).unwrap(), Stream::cpu());
    for case in CASES {
        let on_meta = run_case(case, &meta, Via::Entry);
        let entry = run_case(case, &cpu, Via::Entry);
        let backend = run_case(case, &cpu, Via::CpuBackend);
        assert_eq!(entry, backend, "{}: entry check vs CPU function", case.name);
        for ((operand, m), c) in case.operands.iter().zip(&on_meta).zip(&entry) {
            let layout = case.name.starts_with("attention") && m.contains("lse");
            assert!(
                layout || m == c,
                "{} ({operand} short): meta {m} / cpu {c}",
                case.name
            );
        }
    }
}

/// The rules beyond lengths that the CPU functions apply up front (ids inside their
/// tables, a valid attention layout, precision against storage types, hyper-parameters)
/// hold on the meta device as well, with the CPU's very message.
#[test]
fn meta_refuses_what_the_cpu_refuses_beyond_lengths() {
    fn embedding_id_past_vocab(c: &Call) -> Result<(), KernelError> {
        let (mut out, weight) = (c.buf::<f32>("out", 3), c.buf::<f32>("weight", 6 * 3));
        call!(
            c,
            embedding_forward(&mut out.view_mut(), &[6], &weight.view(), 3)
        )
    }
    fn label_past_vocab(c: &Call) -> Result<(), KernelError> {
        let logits = c.buf::<f32>("logits", 2 * VOCAB);
        let labels = [0, VOCAB as i32];
        call!(
            c,
            cross_entropy(&logits.view(), &labels, VOCAB, None, LossNorm::Mean)
        )
    }
    fn zero_divisor(c: &Call) -> Result<(), KernelError> {
        let mut logits = c.buf::<f32>("logits", 2 * VOCAB);
        let norm = LossNorm::Divisor(0.0);
        call!(
            c,
            cross_entropy_in_place(&mut logits.view_mut(), &[0, 1], VOCAB, norm)
        )
    }
    fn zero_chunk_rows(c: &Call) -> Result<(), KernelError> {
        let (h, w) = (c.buf::<f32>("h", 2 * 4), c.buf::<f32>("w", VOCAB * 4));
        let grads = LmHeadGrads { dh: None, dw: None };
        let norm = LossNorm::Mean;
        call!(
            c,
            cross_entropy_lm_head(&h.view(), &w.view(), &[0, 1], 4, VOCAB, 0, norm, grads)
        )
    }
    fn position_past_table(c: &Call) -> Result<(), KernelError> {
        let table = rope_table();
        let mut x = c.buf::<f32>("x", 2 * table.head_dim());
        call!(c, rope_forward(&mut x.view_mut(), 1, &table, &[1, 8]))
    }
    fn index_past_rows(c: &Call) -> Result<(), KernelError> {
        let (rows, dim) = TABLE;
        let mut dst = c.buf::<f32>("dst", rows * dim);
        call!(c, zero_rows(&mut dst.view_mut(), &[rows], dim))
    }
    fn cu_seqlens_past_tokens(c: &Call) -> Result<(), KernelError> {
        let (t, hq, hkv, d) = VARLEN;
        let per_head = lse_per_head(c.st.device());
        let (q, k, v) = (
            c.buf::<f32>("q", t * hq * d),
            c.buf::<f32>("k", t * hkv * d),
            c.buf::<f32>("v", t * hkv * d),
        );
        let (mut out, mut lse) = (
            c.buf::<f32>("out", t * hq * d),
            c.buf::<f32>("lse", t * hq * per_head),
        );
        let (qv, kv, vv) = (q.view(), k.view(), v.view());
        let x = QkvBuf {
            q: &qv,
            k: &kv,
            v: &vv,
        };
        let a = VarlenAttention::new(&[3, 6], t, hq, hkv, d, true);
        call!(
            c,
            attention_forward(&a, x, &mut out.view_mut(), &mut lse.view_mut())
        )
    }
    fn block_pair_past_keys(c: &Call) -> Result<(), KernelError> {
        let (tq, tk, hq, hkv, d) = BLOCK;
        let per_head = lse_per_head(c.st.device());
        let (q, k, v) = (
            c.buf::<f32>("q", tq * hq * d),
            c.buf::<f32>("k", tk * hkv * d),
            c.buf::<f32>("v", tk * hkv * d),
        );
        let (mut out, mut lse) = (
            c.buf::<f32>("out", tq * hq * d),
            c.buf::<f32>("lse", tq * hq * per_head),
        );
        let (qv, kv, vv) = (q.view(), k.view(), v.view());
        let x = QkvBuf {
            q: &qv,
            k: &kv,
            v: &vv,
        };
        let pairs = [BlockPair {
            q: 0..tq,
            k: 1..tk + 1,
            causal: false,
        }];
        let a = block(&pairs);
        call!(
            c,
            attention_block_forward(&a, x, &mut out.view_mut(), &mut lse.view_mut())
        )
    }
    fn gemm_f32_of_bf16(c: &Call) -> Result<(), KernelError> {
        let d = Dims { m: 2, n: 2, k: 2 };
        let (a, b, mut cm) = (
            c.buf::<bf16>("a", 4),
            c.buf::<f32>("b", 4),
            c.buf::<f32>("c", 4),
        );
        call!(
            c,
            gemm(
                Precision::F32,
                Trans::N,
                Trans::N,
                d,
                1.0,
                &a.view(),
                2,
                &b.view(),
                2,
                0.0,
                &mut cm.view_mut(),
                2
            )
        )
    }
    fn linear_f32_of_bf16(c: &Call) -> Result<(), KernelError> {
        let d = LIN;
        let (mut y, x, w) = (
            c.buf::<f32>("y", d.t * d.d_out),
            c.buf::<f32>("x", d.t * d.d_in),
            c.buf::<bf16>("w", d.d_out * d.d_in),
        );
        let p = Precision::F32;
        call!(
            c,
            linear_forward(p, &mut y.view_mut(), &x.view(), &w.view(), None, d)
        )
    }
    fn patch_embed_f32_of_bf16(c: &Call) -> Result<(), KernelError> {
        let g = GEOM;
        let (dout, pixels, weight) = (
            c.buf::<bf16>("dout", g.num_patches() * D_MODEL),
            c.buf::<f32>("pixels", g.channels * g.height * g.width),
            c.buf::<f32>("weight", D_MODEL * g.patch_len()),
        );
        let grads = PatchEmbedGradBufs {
            dweight: None,
            dpixels: None,
        };
        call!(
            c,
            patch_embed_backward(
                Precision::F32,
                grads,
                &dout.view(),
                &pixels.view(),
                &weight.view(),
                g,
                D_MODEL
            )
        )
    }
    fn adamw_step_zero(c: &Call) -> Result<(), KernelError> {
        let (mut p, g) = (c.buf::<f32>("params", 3), c.buf::<f32>("grads", 3));
        let (mut m, mut v) = (c.buf::<f32>("m", 3), c.buf::<f32>("v", 3));
        let hp = AdamW::default();
        call!(
            c,
            adamw_step(
                &mut p.view_mut(),
                &g.view(),
                &mut m.view_mut(),
                &mut v.view_mut(),
                0,
                &hp
            )
        )
    }

    let wrong: [(&str, &str, Run); 12] = [
        (
            "embedding_forward",
            "outside the vocabulary",
            embedding_id_past_vocab,
        ),
        ("cross_entropy", "label 5", label_past_vocab),
        ("cross_entropy_in_place", "divisor", zero_divisor),
        ("cross_entropy_chunked", "chunk_rows", zero_chunk_rows),
        ("rope_forward", "position 8", position_past_table),
        ("zero_rows", "index 5", index_past_rows),
        ("attention_forward", "cu_seqlens", cu_seqlens_past_tokens),
        ("attention_block_forward", "key rows", block_pair_past_keys),
        ("gemm", "a is bf16", gemm_f32_of_bf16),
        ("linear_forward", "w is bf16", linear_f32_of_bf16),
        (
            "patch_embed_backward",
            "dout is bf16",
            patch_embed_f32_of_bf16,
        ),
        ("adamw_step", "1-based", adamw_step_zero),
    ];
    let (meta, cpu) = (Stream::new(Device::Meta).unwrap(), Stream::cpu());
    for (op, says, run) in wrong {
        let message = |st: &Stream, via: Via| {
            let e = run(&Call {
                st,
                via,
                short: None,
            })
            .expect_err(op);
            assert_eq!(op_of(&e), Some(op), "{e}");
            e.to_string()
        };
        let on_meta = message(&meta, Via::Entry);
        assert!(on_meta.contains(says), "{op}: {on_meta}");
        assert_eq!(on_meta, message(&cpu, Via::Entry), "{op}: meta vs CPU");
        assert_eq!(
            on_meta,
            message(&cpu, Via::CpuBackend),
            "{op}: meta vs CPU function"
        );
    }
}
