//! The slice-level ops the model is written in, forward and backward side by side.
//!
//! Conventions (llm.c): row-major, shapes in the comments (T tokens, D/Din/Dout features,
//! H heads, Hd head_dim); a backward ACCUMULATES into input and weight gradients (`+=`) unless
//! its doc says it overwrites, so residual branches simply add up.
//!
//! `linear` runs on `cannon_kernels::linear` (the GEMM). The others are local, straightforward
//! CPU implementations written while the `cannon-kernels` ops land; each has the shape of the
//! kernel op it stands for, so switching one to the kernel is a change inside this file only. The model code never loops over elements
//! itself except in the few model-specific gathers (patches, the patch merger, the splice).

use cannon_kernels::linear::{self, LinearDims, LinearGrads};
use cannon_kernels::KernelError;

/// Numeric precision of a run. `Bf16` is mixed precision as the CPU kernels do it: the
/// weights and every activation that feeds a GEMM or the attention (the tensors a bf16 run
/// keeps in memory) are rounded to bf16 (nearest even, as torch's `.to(bfloat16)`); every
/// accumulation, the residual stream, the norm statistics, the loss and all gradients stay
/// f32, and the optimizer updates f32 master weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    Bf16,
}

impl Precision {
    /// Rounds `x` to the storage precision in place.
    pub fn round(self, x: &mut [f32]) {
        if self == Precision::Bf16 {
            for v in x {
                *v = half::bf16::from_f32(*v).to_f32();
            }
        }
    }
}

/// `y[T,Dout] = x[T,Din] @ w[Dout,Din]^T` (overwrites y), on `cannon_kernels::linear`.
pub fn linear_forward(
    y: &mut [f32],
    x: &[f32],
    w: &[f32],
    din: usize,
    dout: usize,
) -> Result<(), KernelError> {
    let t = x.len() / din.max(1);
    linear::linear_forward(
        y,
        x,
        w,
        None,
        LinearDims {
            t,
            d_in: din,
            d_out: dout,
        },
    )
}

/// `dx[T,Din] += dy[T,Dout] @ w[Dout,Din]`, `dw[Dout,Din] += dy^T @ x`; either may be skipped.
pub fn linear_backward(
    dx: Option<&mut [f32]>,
    dw: Option<&mut [f32]>,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    din: usize,
    dout: usize,
) -> Result<(), KernelError> {
    let t = x.len() / din.max(1);
    let g = LinearGrads { dx, dw, db: None };
    linear::linear_backward(
        g,
        dy,
        x,
        w,
        LinearDims {
            t,
            d_in: din,
            d_out: dout,
        },
    )
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    if a != 0.0 {
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi += a * xi;
        }
    }
}

/// RMSNorm `y[T,D] = w * (x * rstd)`, `rstd[T] = 1/sqrt(mean(x^2) + eps)` (overwrites both).
pub fn rmsnorm_forward(y: &mut [f32], rstd: &mut [f32], x: &[f32], w: &[f32], eps: f64) {
    let d = w.len();
    for ((yr, r), xr) in y
        .chunks_exact_mut(d)
        .zip(rstd.iter_mut())
        .zip(x.chunks_exact(d))
    {
        let ms = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
        *r = (1.0 / (ms + eps).sqrt()) as f32;
        for ((yv, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
            *yv = wv * (xv * *r);
        }
    }
}

/// RMSNorm backward: `dx += rstd * (w dy - xhat * mean(xhat * w dy))`, `dw += sum_t dy xhat`.
pub fn rmsnorm_backward(
    dx: &mut [f32],
    dw: Option<&mut [f32]>,
    dy: &[f32],
    x: &[f32],
    w: &[f32],
    rstd: &[f32],
) {
    let d = w.len();
    for ((dxr, dyr), (xr, &r)) in dx
        .chunks_exact_mut(d)
        .zip(dy.chunks_exact(d))
        .zip(x.chunks_exact(d).zip(rstd))
    {
        let mut m = 0.0f64;
        for ((&g, &xv), &wv) in dyr.iter().zip(xr).zip(w) {
            m += (g * wv) as f64 * (xv * r) as f64;
        }
        let m = (m / d as f64) as f32;
        for ((dxv, (&g, &xv)), &wv) in dxr.iter_mut().zip(dyr.iter().zip(xr)).zip(w) {
            *dxv += r * (g * wv - xv * r * m);
        }
    }
    if let Some(dw) = dw {
        for ((dyr, xr), &r) in dy.chunks_exact(d).zip(x.chunks_exact(d)).zip(rstd) {
            for ((dwv, &g), &xv) in dw.iter_mut().zip(dyr).zip(xr) {
                *dwv += g * (xv * r);
            }
        }
    }
}

/// Per-token rotation angles for rotate-half RoPE: `cos`/`sin` `[T, Hd/2]` (the second half of
/// HF's `cat(freqs, freqs)` table repeats the first).
#[derive(Clone, Debug, Default)]
pub struct RopeTable {
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
    pub half: usize,
}

impl RopeTable {
    /// From `angles [T, Hd/2]`, computed in f32 as transformers does even for f64 models.
    pub fn from_angles(angles: &[f32], half: usize) -> Self {
        let cos = angles.iter().map(|&a| (a as f64).cos() as f32).collect();
        let sin = angles.iter().map(|&a| (a as f64).sin() as f32).collect();
        RopeTable { cos, sin, half }
    }
}

/// Rotate-half RoPE in place on `x [T, H, Hd]`: `x' = x cos + rotate_half(x) sin`.
pub fn rope_forward(x: &mut [f32], t: &RopeTable) {
    rope_apply(x, t, 1.0);
}

/// RoPE backward in place on `dx [T, H, Hd]` (the inverse rotation).
pub fn rope_backward(dx: &mut [f32], t: &RopeTable) {
    rope_apply(dx, t, -1.0);
}

fn rope_apply(x: &mut [f32], t: &RopeTable, sign: f32) {
    let half = t.half;
    let tokens = t.cos.len() / half.max(1);
    let row = x.len() / tokens.max(1);
    for (tok, xr) in x.chunks_exact_mut(row).enumerate() {
        let (c, s) = (&t.cos[tok * half..][..half], &t.sin[tok * half..][..half]);
        for head in xr.chunks_exact_mut(2 * half) {
            let (x1, x2) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (x1[i], x2[i]);
                let sn = sign * s[i];
                x1[i] = a * c[i] - b * sn;
                x2[i] = b * c[i] + a * sn;
            }
        }
    }
}

/// Varlen attention geometry, TND layout (as `cannon_kernels::attention`): `cu_seqlens` are the
/// cumulative END offsets of the sequences, without a leading 0.
#[derive(Clone, Copy, Debug)]
pub struct Attn<'a> {
    pub cu_seqlens: &'a [usize],
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub causal: bool,
}

impl Attn<'_> {
    fn spans(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let starts = std::iter::once(0).chain(self.cu_seqlens.iter().copied());
        starts.zip(self.cu_seqlens.iter().copied())
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// `out[T,Hq,Hd] = softmax(scale q k^T + mask) v` per sequence, kv head `h / (Hq/Hkv)`;
/// `lse[T,Hq]` the log-sum-exp of each row's scaled scores (both overwritten).
pub fn attention_forward(
    a: &Attn,
    out: &mut [f32],
    lse: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
) {
    let (hd, hq, hkv) = (a.head_dim, a.q_heads, a.kv_heads);
    let group = hq / hkv;
    let scale = a.scale();
    let mut p = Vec::new();
    for (s0, s1) in a.spans() {
        for i in s0..s1 {
            let keys = if a.causal { s0..i + 1 } else { s0..s1 };
            for h in 0..hq {
                let kh = h / group;
                let qi = &q[(i * hq + h) * hd..][..hd];
                p.clear();
                p.extend(
                    keys.clone()
                        .map(|j| scale * dot(qi, &k[(j * hkv + kh) * hd..][..hd])),
                );
                let m = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for x in p.iter_mut() {
                    *x = (*x - m).exp();
                    sum += *x;
                }
                let o = &mut out[(i * hq + h) * hd..][..hd];
                o.fill(0.0);
                for (j, &pj) in keys.clone().zip(&p) {
                    axpy(o, pj / sum, &v[(j * hkv + kh) * hd..][..hd]);
                }
                lse[i * hq + h] = m + sum.ln();
            }
        }
    }
}

/// Attention backward from the saved `out` and `lse`: OVERWRITES `dq`, `dk`, `dv`
/// (`dS = P (dP - rowsum(dO O))`, `dq = scale dS k`, `dk = scale dS^T q`, `dv = P^T dO`).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    a: &Attn,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
    dout: &[f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
) {
    let (hd, hq, hkv) = (a.head_dim, a.q_heads, a.kv_heads);
    let group = hq / hkv;
    let scale = a.scale();
    dq.fill(0.0);
    dk.fill(0.0);
    dv.fill(0.0);
    for (s0, s1) in a.spans() {
        for i in s0..s1 {
            let keys = if a.causal { s0..i + 1 } else { s0..s1 };
            for h in 0..hq {
                let kh = h / group;
                let row = (i * hq + h) * hd;
                let (qi, doi) = (&q[row..][..hd], &dout[row..][..hd]);
                let di = dot(doi, &out[row..][..hd]);
                let l = lse[i * hq + h];
                for j in keys.clone() {
                    let kv = (j * hkv + kh) * hd;
                    let p = (scale * dot(qi, &k[kv..][..hd]) - l).exp();
                    let ds = p * (dot(doi, &v[kv..][..hd]) - di);
                    axpy(&mut dv[kv..][..hd], p, doi);
                    axpy(&mut dq[row..][..hd], scale * ds, &k[kv..][..hd]);
                    axpy(&mut dk[kv..][..hd], scale * ds, qi);
                }
            }
        }
    }
}

/// The gate activation of a gated MLP.
pub use super::config::GateAct;

/// Gated MLP core `h[T,I] = act(gate) * up` (overwrites h).
pub fn gated_forward(h: &mut [f32], gate: &[f32], up: &[f32], act: GateAct) {
    for ((hv, &g), &u) in h.iter_mut().zip(gate).zip(up) {
        *hv = act_value(act, g) * u;
    }
}

/// Gated MLP backward: OVERWRITES `dgate`, `dup` from `dh`.
pub fn gated_backward(
    dgate: &mut [f32],
    dup: &mut [f32],
    dh: &[f32],
    gate: &[f32],
    up: &[f32],
    act: GateAct,
) {
    for (((dg, du), &d), (&g, &u)) in dgate
        .iter_mut()
        .zip(dup.iter_mut())
        .zip(dh)
        .zip(gate.iter().zip(up))
    {
        *du = d * act_value(act, g);
        *dg = d * u * act_grad(act, g);
    }
}

fn act_value(act: GateAct, x: f32) -> f32 {
    match act {
        GateAct::Silu => x / (1.0 + (-x).exp()),
        GateAct::Gelu => gelu(x),
    }
}

fn act_grad(act: GateAct, x: f32) -> f32 {
    match act {
        GateAct::Silu => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 + x * (1.0 - s))
        }
        GateAct::Gelu => gelu_grad(x),
    }
}

/// Exact GELU `x Phi(x)` (erf form, transformers' `"gelu"`).
fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))) as f32
}

fn gelu_grad(x: f32) -> f32 {
    let x = x as f64;
    let cdf = 0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    (cdf + x * pdf) as f32
}

/// `y = gelu(x)` elementwise (overwrites y).
pub fn gelu_forward(y: &mut [f32], x: &[f32]) {
    for (yv, &xv) in y.iter_mut().zip(x) {
        *yv = gelu(xv);
    }
}

/// `dx += gelu'(x) dy`.
pub fn gelu_backward(dx: &mut [f32], dy: &[f32], x: &[f32]) {
    for ((d, &g), &xv) in dx.iter_mut().zip(dy).zip(x) {
        *d += g * gelu_grad(xv);
    }
}

/// Mean softmax cross-entropy of `logits [T,V]` against `targets [T]` (-100 = ignored).
/// Writes `dlogits = (softmax - onehot) / count` for the targeted rows and 0 elsewhere
/// (overwrites), and returns `(loss, count)`; with no target the loss is 0.
pub fn cross_entropy(
    dlogits: &mut [f32],
    logits: &[f32],
    targets: &[i64],
    v: usize,
) -> (f64, usize) {
    let count = targets.iter().filter(|&&t| t >= 0).count();
    let norm = 1.0 / count.max(1) as f64;
    let mut loss = 0.0f64;
    for ((dr, lr), &t) in dlogits
        .chunks_exact_mut(v)
        .zip(logits.chunks_exact(v))
        .zip(targets)
    {
        if t < 0 {
            dr.fill(0.0);
            continue;
        }
        let m = lr.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = lr.iter().map(|&x| (x as f64 - m).exp()).sum();
        let lse = m + sum.ln();
        loss += lse - lr[t as usize] as f64;
        for (d, &x) in dr.iter_mut().zip(lr) {
            *d = (((x as f64 - lse).exp()) * norm) as f32;
        }
        dr[t as usize] -= norm as f32;
    }
    (loss * norm, count)
}
