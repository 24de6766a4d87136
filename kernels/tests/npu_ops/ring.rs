//! Ring attention's blocks on the NPU (FlashAttention per pair, merged by
//! aclnnRingAttentionUpdate) against the CPU block kernel, over two ring steps as one rank
//! sees them: its own K/V block (diagonal chunks causal, the tail chunk against the head chunk
//! in full, so one query range meets two key ranges in one call), then another rank's block
//! of a different length. The statistics the NPU keeps must give the CPU's log-sum-exp.
//!
//! Bars: f32 1e-6 relative L2 (the emulator runs the CPU block kernel per pair; only the
//! merge's f32 rounding differs). bf16 1e-2: FlashAttention returns each block's output and
//! gradients in bf16 before the f32 merge and accumulation, where the CPU keeps them in f32,
//! one bf16 rounding (2^-9 relative) per block and element; inside the project's bf16 bars
//! (0.015 forward, 0.04 gradients).

use crate::{bf, down, f64s, streams, up};
use cannon_kernels::attention::{block_lse_init, BlockAttention, BlockPair, QkvBuf, QkvGradBuf};
use cannon_kernels::ops;
use cannon_kernels::testutil::{rel_l2, Rng};
use cannon_runtime::{DType, DeviceBuffer, Float, Stream};
use half::bf16;

const T: usize = 12;
const TK2: usize = 10;
const HQ: usize = 4;
const HKV: usize = 2;
const D: usize = 16;

fn pair(q: std::ops::Range<usize>, k: std::ops::Range<usize>, causal: bool) -> BlockPair {
    BlockPair { q, k, causal }
}

fn call(pairs: &[BlockPair], k_tokens: usize) -> BlockAttention<'_> {
    BlockAttention {
        pairs,
        q_tokens: T,
        k_tokens,
        q_heads: HQ,
        kv_heads: HKV,
        head_dim: D,
        scale: 1.0 / (D as f32).sqrt(),
    }
}

/// Everything one device computes: `[out, dq, dk1, dv1, dk2, dv2]` and the final `lse`.
type Run = ([Vec<f32>; 6], Vec<f32>);

fn run<E: Float>(s: &Stream, inputs: &[Vec<E>; 6], steps: &[(Vec<BlockPair>, usize); 2]) -> Run {
    let [q, k1, v1, k2, v2, dout] = inputs;
    let qb = up(s, q);
    let kvs = [(up(s, k1), up(s, v1)), (up(s, k2), up(s, v2))];
    let mut out = DeviceBuffer::<f32>::alloc_zeros(s, T * HQ * D).unwrap();
    let mut lse = up(s, &block_lse_init(s.device(), T * HQ));
    for ((pairs, tk), (kb, vb)) in steps.iter().zip(&kvs) {
        let x = QkvBuf {
            q: &qb.view(),
            k: &kb.view(),
            v: &vb.view(),
        };
        let a = call(pairs, *tk);
        ops::attention_block_forward(s, &a, x, &mut out.view_mut(), &mut lse.view_mut()).unwrap();
    }
    // The trainer stores the merged output in the activation type before the backward.
    let out_f = down(s, &out);
    let out_e: Vec<E> = out_f.iter().map(|&x| E::from_f32(x)).collect();
    let (ob, db) = (up(s, &out_e), up(s, dout));
    let mut dq = DeviceBuffer::<f32>::alloc_zeros(s, T * HQ * D).unwrap();
    let mut grads = Vec::new();
    for ((pairs, tk), (kb, vb)) in steps.iter().zip(&kvs) {
        let mut dk = DeviceBuffer::<f32>::alloc_zeros(s, tk * HKV * D).unwrap();
        let mut dv = DeviceBuffer::<f32>::alloc_zeros(s, tk * HKV * D).unwrap();
        let x = QkvBuf {
            q: &qb.view(),
            k: &kb.view(),
            v: &vb.view(),
        };
        let g = QkvGradBuf {
            dq: &mut dq.view_mut(),
            dk: &mut dk.view_mut(),
            dv: &mut dv.view_mut(),
        };
        let a = call(pairs, *tk);
        ops::attention_block_backward(s, &a, x, &ob.view(), &lse.view(), &db.view(), g).unwrap();
        grads.push((down(s, &dk), down(s, &dv)));
    }
    let [(dk1, dv1), (dk2, dv2)]: [(Vec<f32>, Vec<f32>); 2] = grads.try_into().unwrap();
    ([out_f, down(s, &dq), dk1, dv1, dk2, dv2], down(s, &lse))
}

fn ring_blocks<E: Float>(conv: impl Fn(&[f32]) -> Vec<E>, tol: f64) {
    let (_g, c, n) = streams();
    let mut rng = Rng::new(17);
    let mut draw = |len: usize| conv(&rng.normal_vec(len, 1.0));
    let inputs = [
        draw(T * HQ * D),
        draw(T * HKV * D),
        draw(T * HKV * D),
        draw(TK2 * HKV * D),
        draw(TK2 * HKV * D),
        draw(T * HQ * D),
    ];
    // Query ranges 0..6 (head chunk) and 6..12 (tail chunk) in both steps.
    let steps = [
        (
            vec![
                pair(0..6, 0..6, true),
                pair(6..12, 6..12, true),
                pair(6..12, 0..6, false),
            ],
            T,
        ),
        (
            vec![
                pair(0..6, 0..4, false),
                pair(6..12, 0..4, false),
                pair(6..12, 4..10, false),
            ],
            TK2,
        ),
    ];
    let (cr, cl) = run(&c, &inputs, &steps);
    let (nr, nl) = run(&n, &inputs, &steps);
    let bar = crate::bar(tol, E::DTYPE == DType::BF16);
    for (what, a, b) in ["out", "dq", "dk1", "dv1", "dk2", "dv2"]
        .iter()
        .zip(&nr)
        .zip(&cr)
        .map(|((w, a), b)| (w, a, b))
    {
        let e = rel_l2(&f64s(a), &f64s(b));
        assert!(e <= bar, "{}: {what} rel L2 {e:e} (bar {bar:e})", E::DTYPE);
    }
    // The NPU's statistics of a query range r are [Hq, |r|, 8] at r.start * Hq * 8.
    let half = nl.len() / 2;
    let mut lse = vec![0f64; T * HQ];
    for r in [0..6usize, 6..12] {
        for h in 0..HQ {
            for i in 0..r.len() {
                let at = r.start * HQ * 8 + (h * r.len() + i) * 8;
                lse[(r.start + i) * HQ + h] = nl[at] as f64 + (nl[half + at] as f64).ln();
            }
        }
    }
    let e = rel_l2(&lse, &f64s(&cl));
    assert!(e <= bar, "{}: lse rel L2 {e:e} (bar {bar:e})", E::DTYPE);
}

#[test]
fn ring_attention_blocks_match_the_cpu() {
    ring_blocks::<f32>(|v| v.to_vec(), 1e-6);
    ring_blocks::<bf16>(bf, 1e-2);
}
