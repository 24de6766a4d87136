//! The block kernel against the naive float64 attention: a causal varlen problem cut into
//! two token chunks and computed block by block (diagonal blocks causal, the later chunk's
//! queries against the earlier chunk's keys in full), merged with the log-sum-exp, must give
//! the whole attention. Bars as in `attention::tests` (f32: forward and lse 1e-5, backward
//! 1e-4 relative L2: f32 sums over <= 150 keys are good to ~1e-6; a wrong merge or mask is
//! O(1)).

use super::super::cpu::Isa;
use super::super::reference::{data, naive_backward, naive_forward, to_f64, Case};
use super::{backward_accumulate_on, forward_merge, forward_merge_on, BlockAttention, BlockPair};
use crate::testutil::rel_l2;

/// The blocks of `lens` (cumulative sequences) cut at token `cut`: per sequence, the pieces
/// on each side; diagonal pieces causal, (second piece, first piece) full.
fn blocks(lens: &[usize], cut: usize) -> (Vec<BlockPair>, Vec<BlockPair>) {
    let (mut diag, mut off) = (Vec::new(), Vec::new());
    let mut start = 0;
    for &l in lens {
        let end = start + l;
        let a = start..end.min(cut).max(start);
        let b = start.max(cut)..end.max(cut);
        for r in [&a, &b] {
            if !r.is_empty() {
                diag.push(BlockPair {
                    q: r.clone(),
                    k: r.clone(),
                    causal: true,
                });
            }
        }
        if !a.is_empty() && !b.is_empty() {
            off.push(BlockPair {
                q: b.clone(),
                k: a.clone(),
                causal: false,
            });
        }
        start = end;
    }
    (diag, off)
}

/// A call on `t` query and key rows with `(t, hq, hkv, d, scale)`.
fn call(
    pairs: &[BlockPair],
    (t, hq, hkv, d, scale): (usize, usize, usize, usize, f32),
) -> BlockAttention<'_> {
    BlockAttention {
        pairs,
        q_tokens: t,
        k_tokens: t,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        scale,
    }
}

#[test]
fn blocks_merged_equal_whole_causal_attention() {
    for isa in Isa::available() {
        blocks_merged_equal_whole_causal_attention_at(isa);
    }
}

/// The row kernels (softmax, probabilities and score gradients) at `isa`.
fn blocks_merged_equal_whole_causal_attention_at(isa: Isa) {
    for (n, (lens, cut, hq, hkv, d)) in [
        (vec![9usize, 14, 1, 6], 13usize, 4usize, 2usize, 8usize),
        (vec![30], 11, 2, 2, 5),
        (vec![3, 0, 17], 3, 3, 1, 16),
        // Diagonal blocks of 70 and 80 rows: the causal kernel's bands of 64 rows and a
        // partial last band.
        (vec![150, 7], 70, 2, 1, 8),
    ]
    .into_iter()
    .enumerate()
    {
        let c = Case::new(&lens, hq, hkv, d, true);
        let x = data(&c, 40 + n as u64);
        let (out_r, lse_r) = naive_forward(&c, &to_f64(&x.q), &to_f64(&x.k), &to_f64(&x.v));
        let t = c.t();
        let (diag, off) = blocks(&lens, cut);
        let geom = (t, hq, hkv, d, c.scale() as f32);
        let mut out = vec![0.0f32; t * hq * d];
        let mut lse = vec![f32::NEG_INFINITY; t * hq];
        // Off-diagonal first: the merge must not depend on the order of the blocks.
        for pairs in [&off, &diag] {
            let qkv = (&x.q[..], &x.k[..], &x.v[..]);
            forward_merge_on(isa, &call(pairs, geom), qkv, &mut out, &mut lse).unwrap();
        }
        let fwd = rel_l2(&to_f64(&out), &out_r);
        let lse_err = rel_l2(&to_f64(&lse), &lse_r);
        assert!(
            fwd <= 1e-5 && lse_err <= 1e-5,
            "{isa:?} {lens:?}: {fwd:e} {lse_err:e}"
        );

        let (dq_r, dk_r, dv_r) = naive_backward(
            &c,
            &to_f64(&x.q),
            &to_f64(&x.k),
            &to_f64(&x.v),
            &to_f64(&x.dout),
        );
        let (mut dq, mut dk, mut dv) = (
            vec![0.0; t * hq * d],
            vec![0.0; t * hkv * d],
            vec![0.0; t * hkv * d],
        );
        for pairs in [&diag, &off] {
            let qkv = (&x.q[..], &x.k[..], &x.v[..]);
            let saved = (&out[..], &lse[..], &x.dout[..]);
            let grads = (&mut dq[..], &mut dk[..], &mut dv[..]);
            backward_accumulate_on(isa, &call(pairs, geom), qkv, saved, grads).unwrap();
        }
        for (name, got, want) in [("dq", &dq, &dq_r), ("dk", &dk, &dk_r), ("dv", &dv, &dv_r)] {
            let e = rel_l2(&to_f64(got), want);
            assert!(e <= 1e-4, "{isa:?} {lens:?} {name}: {e:e}");
        }
    }
}

/// Queries and keys in separate buffers of different lengths (a ring step's K/V block):
/// rows [6, 10) of one sequence against its keys [0, 6), full, equal the whole attention of
/// those rows once the diagonal block is merged too.
#[test]
fn separate_key_buffer_of_another_length() {
    let (hq, hkv, d) = (2, 1, 4);
    let c = Case::new(&[10], hq, hkv, d, true);
    let x = data(&c, 7);
    let (out_r, _) = naive_forward(&c, &to_f64(&x.q), &to_f64(&x.k), &to_f64(&x.v));
    let rows = |v: &[f32], heads: usize, r: std::ops::Range<usize>| {
        v[r.start * heads * d..r.end * heads * d].to_vec()
    };
    let q = rows(&x.q, hq, 6..10);
    let (k0, v0) = (rows(&x.k, hkv, 0..6), rows(&x.v, hkv, 0..6));
    let (k1, v1) = (rows(&x.k, hkv, 6..10), rows(&x.v, hkv, 6..10));
    let mut out = vec![0.0f32; 4 * hq * d];
    let mut lse = vec![f32::NEG_INFINITY; 4 * hq];
    let full = [BlockPair {
        q: 0..4,
        k: 0..6,
        causal: false,
    }];
    let diag = [BlockPair {
        q: 0..4,
        k: 0..4,
        causal: true,
    }];
    let mut a = BlockAttention {
        pairs: &full,
        q_tokens: 4,
        k_tokens: 6,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
        scale: c.scale() as f32,
    };
    forward_merge(&a, &q, &k0, &v0, &mut out, &mut lse).unwrap();
    a.pairs = &diag;
    a.k_tokens = 4;
    forward_merge(&a, &q, &k1, &v1, &mut out, &mut lse).unwrap();
    let want = &out_r[6 * hq * d..];
    assert!(rel_l2(&to_f64(&out), want) <= 1e-5);
}

#[test]
fn bad_pairs_are_errors_naming_the_problem() {
    let (q, k) = (vec![0.0f32; 8 * 4], vec![0.0f32; 8 * 4]);
    let (mut out, mut lse) = (vec![0.0f32; 8 * 4], vec![0.0f32; 8]);
    let mut run = |pairs: &[BlockPair]| {
        let a = BlockAttention {
            pairs,
            q_tokens: 8,
            k_tokens: 8,
            q_heads: 1,
            kv_heads: 1,
            head_dim: 4,
            scale: 0.5,
        };
        forward_merge(&a, &q, &k, &k, &mut out, &mut lse)
            .unwrap_err()
            .to_string()
    };
    let e = run(&[BlockPair {
        q: 0..3,
        k: 0..4,
        causal: true,
    }]);
    assert!(e.contains("causal block"), "{e}");
    let e = run(&[
        BlockPair {
            q: 0..4,
            k: 0..2,
            causal: false,
        },
        BlockPair {
            q: 2..6,
            k: 4..6,
            causal: false,
        },
    ]);
    assert!(e.contains("overlap"), "{e}");
    let e = run(&[BlockPair {
        q: 0..9,
        k: 0..2,
        causal: false,
    }]);
    assert!(e.contains("outside"), "{e}");
}
