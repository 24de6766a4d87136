//! The sizes of a pre-norm block as the memory plan reads them, and the bytes its saved
//! activations and working tensors take (`BlockActs`, `FwdScratch` and `BwdScratch` of
//! `model::block` and `model::block_backward`), shared by the plan and its context-parallel
//! terms.

use crate::model::config::{HiddenAct, Mistral3Config};
use crate::model::saved::Recompute;
use cannon_runtime::alloc::round_size;

/// Sum of the rounded blocks of tensors of these byte sizes.
pub(super) fn blocks(bytes: &[usize]) -> usize {
    bytes.iter().map(|&b| round_size(b)).sum()
}

/// The sizes of a pre-norm block: (d, q width, kv width, heads, inter, gelu gate), and the
/// f32 attention statistics it saves per token and head on the step's device.
#[derive(Clone, Copy)]
pub(super) struct Dims {
    pub(super) d: usize,
    pub(super) dq: usize,
    pub(super) dkv: usize,
    pub(super) hq: usize,
    pub(super) i: usize,
    pub(super) gelu: bool,
    pub(super) lse: usize,
}

impl Dims {
    /// The decoder layer's sizes, with `lse_per_head` f32 statistics per token and head.
    pub(super) fn text(cfg: &Mistral3Config, lse_per_head: usize) -> Self {
        let t = &cfg.text_config;
        Dims {
            d: t.hidden_size,
            dq: t.num_attention_heads * t.head_dim(),
            dkv: t.num_key_value_heads * t.head_dim(),
            hq: t.num_attention_heads,
            i: t.intermediate_size,
            gelu: false,
            lse: lse_per_head,
        }
    }

    /// The vision layer's sizes.
    pub(super) fn vision(cfg: &Mistral3Config, lse_per_head: usize) -> Self {
        let v = &cfg.vision_config;
        let dq = v.num_attention_heads * v.head_dim();
        Dims {
            d: v.hidden_size,
            dq,
            dkv: dq,
            hq: v.num_attention_heads,
            i: v.intermediate_size,
            gelu: v.hidden_act == HiddenAct::Gelu,
            lse: lse_per_head,
        }
    }

    /// What one layer saves for `t` tokens, its output included.
    pub(super) fn layer_saved(&self, t: usize, a: usize) -> usize {
        round_size(4 * t * self.d) + self.layer_acts(t, a, Recompute::None)
    }

    /// The block activations a layer keeps under `r` (without its output): of rstd1, ln1, q,
    /// k, v, att, lse, mid, rstd2, ln2, gate, up, h (`BlockActs`, in that order) all of them,
    /// the selective set (q, k, v, att, lse, mid, gate, up) or none.
    pub(super) fn layer_acts(&self, t: usize, a: usize, r: Recompute) -> usize {
        let all = [
            (4 * t, false),
            (a * t * self.d, false),
            (a * t * self.dq, true),
            (a * t * self.dkv, true),
            (a * t * self.dkv, true),
            (a * t * self.dq, true),
            (4 * t * self.hq * self.lse, true),
            (4 * t * self.d, true),
            (4 * t, false),
            (a * t * self.d, false),
            (4 * t * self.i, true),
            (4 * t * self.i, true),
            (a * t * self.i, false),
        ];
        all.iter()
            .filter(|(_, selective)| match r {
                Recompute::None => true,
                Recompute::Selective => *selective,
                Recompute::Full => false,
            })
            .map(|&(b, _)| round_size(b))
            .sum()
    }

    /// The forward's working tensors for `t` tokens.
    pub(super) fn fwd_scratch(&self, t: usize) -> usize {
        let gelu = if self.gelu { t * self.i } else { 0 };
        let n = [
            t * self.d,
            t * self.dq,
            t * self.dkv,
            t * self.dkv,
            t * self.i,
            gelu,
        ];
        blocks(&n.map(|n| 4 * n))
    }

    /// The backward's working tensors for `t` tokens.
    pub(super) fn bwd_scratch(&self, t: usize, a: usize) -> usize {
        let gelu = if self.gelu { t * self.i } else { 0 };
        let f32s = [
            t * self.d,
            t * self.d,
            t * self.dq,
            t * self.i,
            t * self.i,
            t * self.i,
            gelu,
            self.d,
        ];
        let acts = [t * self.dq, t * self.dq, t * self.dkv, t * self.dkv];
        blocks(&f32s.map(|n| 4 * n)) + blocks(&acts.map(|n| a * n))
    }
}
