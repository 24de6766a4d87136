//! Ring attention over the ring ranks (after the Ulysses exchange, so on `2C` tokens and this
//! rank's heads):
//!
//! ```text
//! forward   out = 0, lse = -inf                                   [2C, Hq', Hd], [2C, Hq']
//!           (lse: the device's form, `attention::block_lse_init`; the NPU keeps the
//!           softmax max and sum, [2C, Hq', 16])
//!           step s = 0 .. r-1: the K/V block of ring rank (R - s) mod r is here;
//!             merge attention_block(q, K, V, pairs(R, owner)) into (out, lse)
//!             pass K, V on to R + 1, take the next from R - 1 (send_recv)
//! backward  dq = 0, dK/dV accumulator = 0 (travels with the K/V block)
//!           step s: add the block's dq, dK, dV (with the final out and lse);
//!             pass K, V on (not after the last step) and the dK/dV accumulator
//!             (every step: after r passes it is back at the block's owner)
//! ```
//!
//! The pairs are [`CpLayout::ring_pairs`]: causal on the diagonal chunk, full against an
//! earlier chunk, nothing against a later one. With head-tail chunking every rank does the
//! same amount of work at every step but the first.

use super::error::Result;
use super::layout::CpShapes;
use super::CpLayout;
use cannon_kernels::attention::{self, BlockAttention, QkvBuf, QkvGradBuf};
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{ops, Tensor};
use cannon_runtime::comm::Communicator;
use cannon_runtime::{BufferView, Element, Float};

/// Sends `cur` to the next ring rank and replaces it with the previous rank's.
fn pass_on<T: Element>(exec: &DeviceCtx, ring: &Communicator, cur: &mut Tensor<T>) -> Result<()> {
    let r = ring.world_size();
    let me = ring.rank();
    let mut next = exec.empty::<T>(cur.shape())?;
    ring.send_recv(
        &cur.view(),
        (me + 1) % r,
        &mut next.view_mut(),
        (me + r - 1) % r,
        exec.stream(),
    )?;
    *cur = next;
    Ok(())
}

fn block<'p>(
    sh: &CpShapes,
    hd: usize,
    pairs: &'p [cannon_kernels::attention::BlockPair],
) -> BlockAttention<'p> {
    BlockAttention {
        pairs,
        q_tokens: sh.tokens,
        k_tokens: sh.tokens,
        q_heads: sh.q_heads,
        kv_heads: sh.kv_heads,
        head_dim: hd,
        scale: 1.0 / (hd.max(1) as f32).sqrt(),
    }
}

/// Ring forward: returns the f32 output `[2C, Hq'*Hd]` and writes the log-sum-exp into `lse`.
pub fn forward<A: Float>(
    exec: &DeviceCtx,
    ring: &Communicator,
    layout: &CpLayout,
    sh: &CpShapes,
    hd: usize,
    (q, k, v): (&Tensor<A>, &Tensor<A>, &Tensor<A>),
    lse: &mut Tensor<f32>,
) -> Result<Tensor<f32>> {
    let st = exec.stream();
    let (r, me) = (ring.world_size(), ring.rank());
    let mut out = exec.zeros::<f32>(&[sh.tokens, sh.q_heads * hd])?;
    // Empty accumulators: -inf on the CPU, the NPU's (max, sum) form there.
    let empty = attention::block_lse_init(exec.device(), sh.tokens * sh.q_heads);
    lse.view_mut().memcpy_htod(st, &empty)?;
    let (mut kc, mut vc) = (exec.empty::<A>(k.shape())?, exec.empty::<A>(v.shape())?);
    kc.view_mut().memcpy_dtod(st, &k.view())?;
    vc.view_mut().memcpy_dtod(st, &v.view())?;
    for s in 0..r {
        let pairs = layout.ring_pairs((me + r - s) % r);
        let (qv, kv, vv) = (q.view(), kc.view(), vc.view());
        let x = QkvBuf {
            q: &qv,
            k: &kv,
            v: &vv,
        };
        let a = block(sh, hd, &pairs);
        ops::attention_block_forward(st, &a, x, &mut out.view_mut(), &mut lse.view_mut())?;
        if s + 1 < r {
            pass_on(exec, ring, &mut kc)?;
            pass_on(exec, ring, &mut vc)?;
        }
    }
    Ok(out)
}

/// Ring backward: f32 `(dq, dk, dv)` of this rank's q and of its own K/V block, from the
/// final `out`, `lse` and `dout` of its queries.
pub fn backward<A: Float>(
    exec: &DeviceCtx,
    ring: &Communicator,
    layout: &CpLayout,
    sh: &CpShapes,
    hd: usize,
    x: QkvBuf<'_, A>,
    (out, lse, dout): (&BufferView<'_, A>, &BufferView<'_, f32>, &BufferView<'_, A>),
) -> Result<(Tensor<f32>, Tensor<f32>, Tensor<f32>)> {
    let st = exec.stream();
    let (r, me) = (ring.world_size(), ring.rank());
    let kv_shape = [sh.tokens, sh.kv_heads * hd];
    let mut dq = exec.zeros::<f32>(&[sh.tokens, sh.q_heads * hd])?;
    let (mut dk, mut dv) = (exec.zeros::<f32>(&kv_shape)?, exec.zeros::<f32>(&kv_shape)?);
    let (mut kc, mut vc) = (exec.empty::<A>(&kv_shape)?, exec.empty::<A>(&kv_shape)?);
    kc.view_mut().memcpy_dtod(st, x.k)?;
    vc.view_mut().memcpy_dtod(st, x.v)?;
    for s in 0..r {
        let pairs = layout.ring_pairs((me + r - s) % r);
        let (kv, vv) = (kc.view(), vc.view());
        let xs = QkvBuf {
            q: x.q,
            k: &kv,
            v: &vv,
        };
        let (mut gq, mut gk, mut gv) = (dq.view_mut(), dk.view_mut(), dv.view_mut());
        let g = QkvGradBuf {
            dq: &mut gq,
            dk: &mut gk,
            dv: &mut gv,
        };
        let a = block(sh, hd, &pairs);
        ops::attention_block_backward(st, &a, xs, out, lse, dout, g)?;
        if s + 1 < r {
            pass_on(exec, ring, &mut kc)?;
            pass_on(exec, ring, &mut vc)?;
        }
        // The accumulator follows its block; after r passes it is home.
        pass_on(exec, ring, &mut dk)?;
        pass_on(exec, ring, &mut dv)?;
    }
    Ok((dq, dk, dv))
}
