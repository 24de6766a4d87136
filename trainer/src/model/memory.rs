//! The memory of a training step, as formulas over the config and the batch: the bytes each
//! part of the model SAVES for its backward, the working tensors each pass holds while it
//! runs, and from them the peak the caching allocator reports for a forward + backward.
//!
//! Notation: T tokens of the batch, P vision patches (all images), M merged image tokens
//! (`[IMG]` rows), N·C·h·w pixel values; text D hidden, Hq / Hkv heads of Hd, I MLP width, V
//! vocab; vision Dv, Hv heads of Hdv (no GQA), Iv; m the merge size; `a` the bytes of a stored
//! activation (4 in an f32 run, 2 in bf16: [`super::ops`]); f32 is 4 bytes.
//!
//! Saved by the forward (live from the forward until the backward ends):
//!
//! ```text
//! vision embed    4·N·C·h·w (pixels) + 4·P·Dv (conv out) + 4·P (rstd) + 4·P·Dv (ln_pre out)
//! vision layer    P·[8 + 4·Hv + 8·Dv + 8·Iv + a·(2·Dv + 4·Hv·Hdv + Iv)]
//! projector       4·P (rstd) + a·M·m²·Dv (merged) + a·M·Dv (h0) + 4·M·D (h1) + a·M·D (act)
//!                 + 4·M·D (out)
//! text embed      4·T·D (spliced embeddings)
//! text layer      T·[8 + 4·Hq + 8·D + 8·I + a·(2·D + 2·Hq·Hd + 2·Hkv·Hd + I)]
//! final norm      4·T + a·T·D
//! head, full      8·T·V (logits and d logits)         chunked: 0
//! ```
//!
//! A layer's terms, in order: rstd1 + rstd2 (4·T each), lse (4·T·Hq), mid and the layer's
//! output (4·T·D each), gate and up (4·T·I each) in f32; ln1, ln2 (a·T·D each), q and att
//! (a·T·Hq·Hd each), k and v (a·T·Hkv·Hd each), h (a·T·I) in activation storage.
//!
//! Working tensors, live only while their pass runs (`+4·T·I` where a GELU gate needs its
//! product, Pixtral's default):
//!
//! ```text
//! block forward   4·T·(D + Hq·Hd + 2·Hkv·Hd + I)
//! block backward  4·T·(2·D + Hq·Hd + 3·I) + a·T·(2·Hq·Hd + 2·Hkv·Hd) + 4·D
//! projector fwd   4·(P·Dv + 2·M·m²·Dv + M·Dv + M·D)
//! projector bwd   4·(2·M·D + M·Dv + 2·M·m²·Dv + P·Dv + Dv)  (+ 4·P·Dv without a vision grad)
//! final norm fwd  4·T·D
//! chunked loss    4·min(c, T)·V in the forward and again in the backward
//! ```
//!
//! The backward also holds the gradient flowing between parts: 4·T·D into the final norm and
//! two 4·T·D between text layers, 4·T·D + 4·M·D at the splice, 4·M·D + 4·P·Dv into the
//! projector, two 4·P·Dv between vision layers.
//!
//! **Memory features** ([`plan_with`], [`super::saved`]). Write `O = 4·T·D` (a layer's input
//! or output), `F` the thirteen block activations of a text layer above, `K` the part a layer
//! keeps (`F` without recompute; selective: `4·T·(Hq + D + 2·I) + a·T·(2·Hq·Hd + 2·Hkv·Hd)`,
//! i.e. q, k, v, att, lse, mid, gate, up; full: 0), `S` the block forward's working tensors.
//! During layer l's forward the device holds the earlier layers' `O + K` each, then `O + F +
//! O + S` (its input, all it makes, its output), so the text forward's high point is at the
//! last layer: `L·(O + K) + O - K + F + S`, and after it `O + L·(O + K)` stays. With
//! activation offload (L >= 2) layers 0..L-2 leave the device one layer after their forward:
//! the high point is `3·O + K + F + S` and `2·O + K` stays (the last layer's input, what it
//! keeps, its output); the host pool holds `(L-1)·(O + K)`. The text backward adds to its
//! working tensors: `S` for any recompute (`+ O` for the full one, its unused output), and at
//! its worst layer what that layer recomputes (`F - K`) and reloads (`O + K` when offloaded)
//! plus the next layer's reload, prefetched (`O + K`).
//!
//! The caching allocator gives every tensor its own block, rounded up to
//! [`BLOCK_ROUND`](cannon_runtime::alloc::BLOCK_ROUND) (512) bytes, so every term above is
//! rounded up on its own: [`plan`] sums the rounded terms, phase by phase, and its peak is the
//! allocator's `max_allocated` over the step exactly (the test `memory` checks the byte count
//! on the shared fixture). `max_reserved` is at least that: a freed block is reused only by a
//! request of the same rounded size, so blocks of one size cannot serve another's peak; the
//! second identical step reserves nothing new.

use super::config::{HiddenAct, Mistral3Config};
use super::params::{ParamLayout, Part};
use super::pixtral::PatchGrid;
use super::projector::tokens_per_image;
use super::saved::{MemoryFeatures, Recompute};
use super::{Batch, LossMode, ModelError, Precision};
use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_runtime::alloc::round_size;

/// The sizes of one batch that the memory depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// T: tokens.
    pub tokens: usize,
    /// P: vision patches over all images.
    pub patches: usize,
    /// M: merged image tokens.
    pub merged: usize,
    /// N·C·h·w: pixel values.
    pub pixels: usize,
    /// Whether any target is trained (the chunked loss skips everything otherwise).
    pub trained_targets: bool,
}

impl StepShape {
    pub fn of(cfg: &Mistral3Config, batch: &Batch) -> Result<Self, ModelError> {
        let (patches, merged) = if batch.images.is_empty() {
            (0, 0)
        } else {
            let grid = PatchGrid::new(cfg, &batch.images)?;
            let m = tokens_per_image(&grid, cfg.spatial_merge_size).iter().sum();
            (grid.patches(), m)
        };
        Ok(StepShape {
            tokens: batch.input_ids.len(),
            patches,
            merged,
            pixels: batch.images.pixel_values.len(),
            trained_targets: batch.targets().iter().any(|&t| t != IGNORE_INDEX),
        })
    }
}

/// Bytes each part saves (already rounded to blocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Saved {
    pub vision_embed: usize,
    /// One vision layer (every layer saves the same).
    pub vision_layer: usize,
    pub projector: usize,
    pub text_embed: usize,
    /// One text layer.
    pub text_layer: usize,
    pub final_norm: usize,
    pub head: usize,
}

/// The memory plan of one forward + backward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of the parameter groups, and of the gradient groups that train.
    pub params: usize,
    pub grads: usize,
    pub saved: Saved,
    /// Bytes of offloaded decoder activations in the host pool at the end of the forward
    /// (0 without `offload_activations`); not part of the device's figures.
    pub host_activations: usize,
    /// Bytes above the step's start at the high point of each phase, in order.
    pub phases: Vec<(&'static str, usize)>,
}

impl MemoryPlan {
    /// The largest phase: `max_allocated` minus what was allocated when the step began.
    pub fn peak(&self) -> usize {
        self.phases.iter().map(|p| p.1).max().unwrap_or(0)
    }

    /// The phase that reaches the peak.
    pub fn peak_phase(&self) -> &'static str {
        let peak = self.peak();
        self.phases
            .iter()
            .find(|p| p.1 == peak)
            .map_or("none", |p| p.0)
    }
}

/// Sum of the rounded blocks of tensors of these byte sizes.
fn blocks(bytes: &[usize]) -> usize {
    bytes.iter().map(|&b| round_size(b)).sum()
}

/// The sizes of a pre-norm block: (d, q width, kv width, heads, inter, gelu gate).
struct Dims {
    d: usize,
    dq: usize,
    dkv: usize,
    hq: usize,
    i: usize,
    gelu: bool,
}

impl Dims {
    fn text(cfg: &Mistral3Config) -> Self {
        let t = &cfg.text_config;
        Dims {
            d: t.hidden_size,
            dq: t.num_attention_heads * t.head_dim(),
            dkv: t.num_key_value_heads * t.head_dim(),
            hq: t.num_attention_heads,
            i: t.intermediate_size,
            gelu: false,
        }
    }

    fn vision(cfg: &Mistral3Config) -> Self {
        let v = &cfg.vision_config;
        let dq = v.num_attention_heads * v.head_dim();
        Dims {
            d: v.hidden_size,
            dq,
            dkv: dq,
            hq: v.num_attention_heads,
            i: v.intermediate_size,
            gelu: v.hidden_act == HiddenAct::Gelu,
        }
    }

    /// What one layer saves for `t` tokens, its output included.
    fn layer_saved(&self, t: usize, a: usize) -> usize {
        round_size(4 * t * self.d) + self.layer_acts(t, a, Recompute::None)
    }

    /// The block activations a layer keeps under `r` (without its output): of rstd1, ln1, q,
    /// k, v, att, lse, mid, rstd2, ln2, gate, up, h (`BlockActs`, in that order) all of them,
    /// the selective set (q, k, v, att, lse, mid, gate, up) or none.
    fn layer_acts(&self, t: usize, a: usize, r: Recompute) -> usize {
        let all = [
            (4 * t, false),
            (a * t * self.d, false),
            (a * t * self.dq, true),
            (a * t * self.dkv, true),
            (a * t * self.dkv, true),
            (a * t * self.dq, true),
            (4 * t * self.hq, true),
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
    fn fwd_scratch(&self, t: usize) -> usize {
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
    fn bwd_scratch(&self, t: usize, a: usize) -> usize {
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

/// The memory plan of a forward + backward of a batch of shape `s` at precision `prec` with
/// the parts `trainable` training and, if `dpixels`, a pixel gradient asked for: every
/// phase's high point above the step's start, following the order in which the model
/// allocates and frees (see the module docs for the terms). No recompute, no offload: see
/// [`plan_with`].
pub fn plan(
    cfg: &Mistral3Config,
    s: &StepShape,
    prec: Precision,
    mode: LossMode,
    trainable: &[Part],
    dpixels: bool,
) -> MemoryPlan {
    plan_with(
        cfg,
        s,
        prec,
        mode,
        MemoryFeatures::default(),
        trainable,
        dpixels,
    )
}

/// [`plan`] with the decoder's memory features `mem` (recompute, activation offload; the
/// optimizer offload moves no activation and is not part of a forward + backward).
pub fn plan_with(
    cfg: &Mistral3Config,
    s: &StepShape,
    prec: Precision,
    mode: LossMode,
    mem: MemoryFeatures,
    trainable: &[Part],
    dpixels: bool,
) -> MemoryPlan {
    let a = match prec {
        Precision::F32 => 4,
        Precision::Bf16 => 2,
    };
    let layout = ParamLayout::new(cfg);
    let params = blocks(&layout.groups.iter().map(|g| 4 * g.len).collect::<Vec<_>>());
    let grads = layout
        .groups
        .iter()
        .filter(|g| trainable.contains(&g.part))
        .map(|g| round_size(4 * g.len))
        .sum();
    let (t, p, m) = (s.tokens, s.patches, s.merged);
    let (d, v) = (cfg.text_config.hidden_size, cfg.text_config.vocab_size);
    let dv = cfg.vision_config.hidden_size;
    let mm = cfg.spatial_merge_size * cfg.spatial_merge_size;
    let (td, vd) = (Dims::text(cfg), Dims::vision(cfg));
    let images = p > 0;
    let (lv, lt) = (cfg.vision_layers_used(), cfg.text_config.num_hidden_layers);
    let f = |n: usize| round_size(4 * n);

    let saved = Saved {
        vision_embed: if images {
            blocks(&[4 * s.pixels, 4 * p * dv, 4 * p, 4 * p * dv])
        } else {
            0
        },
        vision_layer: if images { vd.layer_saved(p, a) } else { 0 },
        projector: if images {
            blocks(&[
                4 * p,
                a * m * mm * dv,
                a * m * dv,
                4 * m * d,
                a * m * d,
                4 * m * d,
            ])
        } else {
            0
        },
        text_embed: f(t * d),
        text_layer: f(t * d) + td.layer_acts(t, a, mem.recompute),
        final_norm: blocks(&[4 * t, a * t * d]),
        head: match mode {
            LossMode::Full => 2 * f(t * v),
            LossMode::Chunked(_) => 0,
        },
    };
    let chunk = match mode {
        LossMode::Chunked(c) if s.trained_targets => f(c.min(t) * v),
        _ => 0,
    };

    let mut phases = Vec::new();
    let mut live = 0;
    if images {
        live += saved.vision_embed + lv * saved.vision_layer;
        phases.push(("vision forward", live + vd.fwd_scratch(p)));
        live += saved.projector;
        let scratch = blocks(&[
            4 * p * dv,
            4 * m * mm * dv,
            4 * m * mm * dv,
            4 * m * dv,
            4 * m * d,
        ]);
        phases.push(("projector forward", live + scratch));
    }
    let text = TextTerms::new(&td, t, a, lt, mem);
    phases.push(("text forward", live + text.forward_peak));
    live += text.after_forward;
    live += saved.final_norm;
    phases.push(("final norm forward", live + f(t * d)));
    live += saved.head;
    phases.push(("head forward", live + chunk));

    // The backward, with every saved activation live.
    let trains = |part| trainable.contains(&part);
    let vision_needed = trains(Part::Vision) || dpixels;
    let image_needed = images && (trains(Part::Projector) || vision_needed);
    let want_dx0 = trains(Part::Text) || image_needed;
    if !want_dx0 && trainable.is_empty() {
        return MemoryPlan {
            params,
            grads,
            saved,
            host_activations: text.host,
            phases,
        };
    }
    phases.push(("head backward", live + f(t * d) + chunk));
    let text_bwd = 2 * f(t * d) + td.bwd_scratch(t, a) + text.backward_extra;
    phases.push(("text backward", live + text_bwd));
    if want_dx0 {
        phases.push(("splice backward", live + f(t * d) + f(m * d)));
    }
    if image_needed {
        let dvis = if vision_needed { f(p * dv) } else { 0 };
        let sink = if vision_needed { 0 } else { f(p * dv) };
        let scratch = blocks(&[
            4 * m * d,
            4 * m * d,
            4 * m * dv,
            4 * m * mm * dv,
            4 * m * mm * dv,
            4 * p * dv,
            4 * dv,
        ]) + sink;
        phases.push(("projector backward", live + f(m * d) + dvis + scratch));
        if vision_needed {
            let scratch = vd.bwd_scratch(p, a);
            phases.push(("vision backward", live + 2 * f(p * dv) + scratch));
        }
    }
    MemoryPlan {
        params,
        grads,
        saved,
        host_activations: text.host,
        phases,
    }
}

/// The decoder's terms under the memory features (see the module docs): device bytes at the
/// forward's high point and after it, what the backward adds on top of its working tensors,
/// and the host pool's bytes.
struct TextTerms {
    forward_peak: usize,
    after_forward: usize,
    backward_extra: usize,
    host: usize,
}

impl TextTerms {
    fn new(td: &Dims, t: usize, a: usize, layers: usize, mem: MemoryFeatures) -> Self {
        let o = round_size(4 * t * td.d);
        let all = td.layer_acts(t, a, Recompute::None);
        let kept = td.layer_acts(t, a, mem.recompute);
        let scratch = td.fwd_scratch(t);
        if layers == 0 {
            return TextTerms {
                forward_peak: o + scratch,
                after_forward: o,
                backward_extra: 0,
                host: 0,
            };
        }
        // Layers 0..L-2 go to the host (the last one stays), when there are two or more.
        let offloaded = |l: usize| mem.offload_activations && l + 1 < layers;
        // Forward, during layer l: the layers before it (their input and what they keep; an
        // offloaded layer leaves the device after the next layer ran), its input, all it
        // makes, its output, the working tensors.
        let before = |l: usize| -> usize {
            (0..l)
                .filter(|&k| !offloaded(k) || k + 1 == l)
                .map(|_| o + kept)
                .sum()
        };
        let forward_peak = (0..layers)
            .map(|l| before(l) + o + all + o + scratch)
            .max()
            .unwrap_or(0);
        // After it: the layers still on the device and the last output.
        let after_forward = before(layers) + o;
        // Backward: the recompute's working tensors (and the full recompute's throwaway
        // output), then per layer what it reloads and recomputes plus the next one's
        // prefetched reload.
        let rec = match mem.recompute {
            Recompute::None => 0,
            Recompute::Selective => scratch,
            Recompute::Full => scratch + o,
        };
        let reload = |l: usize| if offloaded(l) { o + kept } else { 0 };
        let per_layer = (0..layers)
            .map(|l| reload(l) + if l > 0 { reload(l - 1) } else { 0 } + (all - kept))
            .max()
            .unwrap_or(0);
        let host = (0..layers).map(reload).sum();
        TextTerms {
            forward_peak,
            after_forward,
            backward_extra: rec + per_layer,
            host,
        }
    }
}
