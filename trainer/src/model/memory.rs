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
//! The caching allocator gives every tensor its own block, rounded up to
//! [`BLOCK_ROUND`](cannon_runtime::alloc::BLOCK_ROUND) (512) bytes, so every term above is
//! rounded up on its own: [`plan`] sums the rounded terms, phase by phase, and its peak is the
//! allocator's `max_allocated` over the step exactly (the test `memory` checks the byte count
//! on the shared fixture). `max_reserved` is at least that: a freed block is reused only by a
//! request of the same rounded size, so blocks of one size cannot serve another's peak; the
//! second identical step reserves nothing new.
//!
//! [`plan_with`] is the same plan with two additions for `crate::plan` (`cannon plan`): the
//! bytes of parameter and gradient buffers that exist only while the pass is at a given
//! group's step ([`At`]: a sharded rank's gathered groups, its prefetch and the group's full
//! gradient, which the test `plan` checks against real FSDP steps to the byte), and the
//! memory features the model does not run yet ([`StepFeatures`]: recompute, activation
//! offload, context parallel, with their formulas), so their effect can be planned now.
//! A phase that spans a tower's layers is taken at the layer where it is highest (with
//! nothing per step, the last layer in the forward: the original phases, unchanged).

use super::config::{HiddenAct, Mistral3Config};
use super::params::{ParamLayout, Part};
use super::pixtral::PatchGrid;
use super::projector::tokens_per_image;
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

/// Bytes each part keeps on the device for the backward (already rounded to blocks), under
/// the step's [`StepFeatures`] (a layer under recompute keeps less).
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

/// One phase's high point above the step's start, by kind of tensor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phase {
    pub name: &'static str,
    /// Saved activations alive (the head's logits excluded).
    pub saved: usize,
    /// Logits: the full loss's `[T,V]` logits and their gradient, or the chunk alive.
    pub logits: usize,
    /// Parameter and gradient buffers that exist only for this phase (FSDP's gathered groups
    /// and full gradients) and context-parallel exchange buffers.
    pub comm: usize,
    /// Working tensors of the pass (and the gradient flowing between parts).
    pub scratch: usize,
}

impl Phase {
    pub fn total(&self) -> usize {
        self.saved + self.logits + self.comm + self.scratch
    }
}

/// The memory plan of one forward + backward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    /// Bytes of the parameter groups, and of the gradient groups that train.
    pub params: usize,
    pub grads: usize,
    pub saved: Saved,
    /// Bytes of saved activations moved to host memory at the step's high point (offload).
    pub host_saved: usize,
    /// Each phase's high point above the step's start, in order.
    pub phases: Vec<Phase>,
}

impl MemoryPlan {
    /// The largest phase: `max_allocated` minus what was allocated when the step began.
    pub fn peak(&self) -> usize {
        self.phases.iter().map(Phase::total).max().unwrap_or(0)
    }

    /// The phase that reaches the peak (the first one, if several do).
    pub fn peak_phase(&self) -> &'static str {
        self.peak_at().map_or("none", |p| p.name)
    }

    /// The phase that reaches the peak, with its parts.
    pub fn peak_at(&self) -> Option<&Phase> {
        let peak = self.peak();
        self.phases.iter().find(|p| p.total() == peak)
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
        let f32s = [
            t,
            t,
            t * self.hq,
            t * self.d,
            t * self.d,
            t * self.i,
            t * self.i,
        ];
        let acts = [
            t * self.d,
            t * self.d,
            t * self.dq,
            t * self.dq,
            t * self.dkv,
            t * self.dkv,
            t * self.i,
        ];
        blocks(&f32s.map(|n| 4 * n)) + blocks(&acts.map(|n| a * n))
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

/// Memory features of a step. The model runs with none of them today except the chunked
/// loss ([`LossMode`]); the others are planned here by the formulas below, so that
/// `cannon plan` can say what they would save before they run.
///
/// ```text
/// recompute full       a layer keeps only its output (4·T·D, the next layer's input); its
///                      other saved tensors (layer − 4·T·D) exist for one layer at a time:
///                      while its forward runs and again while its backward recomputes them
/// recompute selective  a layer drops its norm outputs and SwiGLU/GELU product (a·T·D twice
///                      + a·T·I), recomputed (cheap, elementwise) for one layer at a time
/// offload activations  each layer's saved tensors go to host memory after its forward and
///                      come back before its backward: the device holds two layers' (the one
///                      computing and the one in transfer), the rest is host memory
/// context parallel     the language model's T tokens are split over cp ranks (T/cp each),
///                      the vision tower and projector run whole on every rank; attention
///                      exchanges (below) add to the text layers' working set
/// ```
///
/// Context-parallel exchange buffers of one text layer (a: activation bytes, Tl = T/cp,
/// Hkv' = max(Hkv, u) after replicating KV heads for Ulysses):
///
/// ```text
/// ulysses (u = cp)     fwd a·Tl·(2·Hq + 2·Hkv')·Hd   (q, k, v, out re-laid head-sharded)
///                      bwd the same for dq, dk, dv, dout
/// ring (r = cp)        fwd 2·a·Tl·2·Hkv·Hd (K/V block held + next in flight)
///                          + 4·Tl·Hq·(Hd + 1) (f32 partial out and lse)
///                      bwd the fwd's K/V blocks + 2·4·Tl·2·Hkv·Hd (dK/dV travelling)
/// hybrid (u x r)       ulysses over u, then ring over r = cp/u on Tl·u tokens of Hkv'/u heads
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepFeatures {
    pub recompute: Recompute,
    pub offload_activations: bool,
    pub cp: ContextParallel,
}

/// Activation recompute per decoder layer (both towers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    #[default]
    None,
    Full,
    Selective,
}

/// How the language model's attention is split over `size` context-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextParallel {
    pub size: usize,
    pub algo: CpAlgo,
    /// Ulysses group size of the hybrid (ignored by the others).
    pub ulysses: usize,
}

impl Default for ContextParallel {
    fn default() -> Self {
        ContextParallel {
            size: 1,
            algo: CpAlgo::Ulysses,
            ulysses: 1,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpAlgo {
    #[default]
    Ulysses,
    Ring,
    Hybrid,
}

impl ContextParallel {
    /// (ulysses degree, ring degree).
    fn degrees(&self) -> (usize, usize) {
        let n = self.size.max(1);
        match self.algo {
            CpAlgo::Ulysses => (n, 1),
            CpAlgo::Ring => (1, n),
            CpAlgo::Hybrid => {
                let u = self.ulysses.clamp(1, n);
                (u, n / u)
            }
        }
    }

    /// Exchange buffers of one text layer's (forward, backward) for `t` local tokens.
    fn buffers(&self, d: &Dims, hd: usize, t: usize, a: usize) -> (usize, usize) {
        if self.size <= 1 {
            return (0, 0);
        }
        let (u, r) = self.degrees();
        let hkv = d.dkv / hd.max(1);
        let (mut fwd, mut bwd) = (0, 0);
        let hkv_u = if u > 1 {
            let h = hkv.max(u);
            let n = a * t * (2 * d.hq + 2 * h) * hd;
            fwd += round_size(n);
            bwd += round_size(n);
            h / u
        } else {
            hkv
        };
        if r > 1 {
            let (tr, hq_r) = (t * u, d.hq / u.max(1));
            let kv = blocks(&[a * tr * 2 * hkv_u * hd, a * tr * 2 * hkv_u * hd]);
            fwd += kv + blocks(&[4 * tr * hq_r * hd, 4 * tr * hq_r]);
            bwd += kv + blocks(&[4 * tr * 2 * hkv_u * hd, 4 * tr * 2 * hkv_u * hd]);
        }
        (fwd, bwd)
    }
}

/// Where in the pass a phase's high point is: the forward or backward step of a parameter
/// group (`ParamLayout` indices). A sharded rank holds that step's gathered groups then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    Fwd(usize),
    Bwd(usize),
}

/// What a tower's layer keeps for the whole pass and what it holds for one layer at a time.
#[derive(Clone, Copy)]
struct LayerCost {
    kept: usize,
    one_at_a_time: usize,
    /// Layers whose kept bytes are on the device at the backward (offload: two).
    resident: usize,
    layers: usize,
}

impl LayerCost {
    fn new(d: &Dims, t: usize, a: usize, layers: usize, f: &StepFeatures) -> Self {
        let full = d.layer_saved(t, a);
        let (kept, one_at_a_time) = match f.recompute {
            Recompute::None => (full, 0),
            Recompute::Full => (round_size(4 * t * d.d), full - round_size(4 * t * d.d)),
            Recompute::Selective => {
                let dropped = blocks(&[a * t * d.d, a * t * d.d, a * t * d.i]);
                (full - dropped, dropped)
            }
        };
        let resident = if f.offload_activations {
            layers.min(2)
        } else {
            layers
        };
        LayerCost {
            kept,
            one_at_a_time,
            resident,
            layers,
        }
    }

    /// Kept bytes on the device once layer `l`'s forward has run.
    fn at_forward(&self, l: usize) -> usize {
        (l + 1).min(self.resident) * self.kept
    }

    fn on_device(&self) -> usize {
        self.resident * self.kept
    }

    fn on_host(&self) -> usize {
        (self.layers - self.resident) * self.kept
    }
}

/// The phase of largest total among `phases` (`fallback` when there is none).
fn highest(phases: impl Iterator<Item = Phase>, fallback: Phase) -> Phase {
    phases.max_by_key(Phase::total).unwrap_or(fallback)
}

/// The memory plan of a forward + backward of a batch of shape `s` at precision `prec` with
/// the parts `trainable` training and, if `dpixels`, a pixel gradient asked for: every
/// phase's high point above the step's start, following the order in which the model
/// allocates and frees (see the module docs for the terms).
pub fn plan(
    cfg: &Mistral3Config,
    s: &StepShape,
    prec: Precision,
    mode: LossMode,
    trainable: &[Part],
    dpixels: bool,
) -> MemoryPlan {
    let none = StepFeatures::default();
    plan_with(cfg, s, prec, mode, trainable, dpixels, &none, &|_| 0)
}

/// [`plan`] under memory features `feat`, with `comm(at)` bytes of parameter and gradient
/// buffers alive at each group step besides the resident ones (0 for a model that holds
/// its groups; a sharded rank's gathered groups, see `crate::plan`). `s.tokens` is the
/// rank's text tokens (T/cp under context parallel); patches and merged tokens are whole.
/// A phase that spans a tower's layers reports the layer where it is highest.
#[allow(clippy::too_many_arguments)]
pub fn plan_with(
    cfg: &Mistral3Config,
    s: &StepShape,
    prec: Precision,
    mode: LossMode,
    trainable: &[Part],
    dpixels: bool,
    feat: &StepFeatures,
    comm: &dyn Fn(At) -> usize,
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
    let tl = LayerCost::new(&td, t, a, lt, feat);
    let vl = LayerCost::new(&vd, p, a, if images { lv } else { 0 }, feat);
    let (cp_fwd, cp_bwd) = feat.cp.buffers(&td, cfg.text_config.head_dim(), t, a);

    let saved = Saved {
        vision_embed: if images {
            blocks(&[4 * s.pixels, 4 * p * dv, 4 * p, 4 * p * dv])
        } else {
            0
        },
        vision_layer: if images { vl.kept } else { 0 },
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
        text_layer: tl.kept,
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
    let ph = |name, saved, logits, comm, scratch| Phase {
        name,
        saved,
        logits,
        comm,
        scratch,
    };

    let mut phases = Vec::new();
    let mut live = 0;
    if images {
        let ve = ParamLayout::VISION_EMBED;
        phases.push(ph(
            "vision embed forward",
            saved.vision_embed,
            0,
            comm(At::Fwd(ve)),
            0,
        ));
        let scratch = vd.fwd_scratch(p) + vl.one_at_a_time;
        let fallback = ph("vision forward", saved.vision_embed, 0, 0, scratch);
        phases.push(highest(
            (0..lv).map(|i| {
                let kept = saved.vision_embed + vl.at_forward(i);
                let c = comm(At::Fwd(layout.vision_layer(i)));
                ph("vision forward", kept, 0, c, scratch)
            }),
            fallback,
        ));
        live += saved.vision_embed + vl.on_device() + saved.projector;
        let scratch = blocks(&[
            4 * p * dv,
            4 * m * mm * dv,
            4 * m * mm * dv,
            4 * m * dv,
            4 * m * d,
        ]);
        let c = comm(At::Fwd(layout.projector()));
        phases.push(ph("projector forward", live, 0, c, scratch));
    }
    live += saved.text_embed;
    let c = comm(At::Fwd(layout.text_embed()));
    phases.push(ph("text embed forward", live, 0, c, 0));
    let scratch = td.fwd_scratch(t) + tl.one_at_a_time + cp_fwd;
    phases.push(highest(
        (0..lt).map(|l| {
            let c = comm(At::Fwd(layout.text_layer(l)));
            ph("text forward", live + tl.at_forward(l), 0, c, scratch)
        }),
        ph("text forward", live, 0, 0, scratch),
    ));
    live += tl.on_device() + saved.final_norm;
    let head_fwd = comm(At::Fwd(layout.text_head()));
    phases.push(ph("final norm forward", live, 0, head_fwd, f(t * d)));
    phases.push(ph("head forward", live, saved.head + chunk, head_fwd, 0));
    let host_saved = tl.on_host() + vl.on_host();

    // The backward, with every saved activation live.
    let trains = |part| trainable.contains(&part);
    let vision_needed = trains(Part::Vision) || dpixels;
    let image_needed = images && (trains(Part::Projector) || vision_needed);
    let want_dx0 = trains(Part::Text) || image_needed;
    let done = |phases| MemoryPlan {
        params,
        grads,
        saved,
        host_saved,
        phases,
    };
    if !want_dx0 && trainable.is_empty() {
        return done(phases);
    }
    let logits = saved.head + chunk;
    let head_bwd = comm(At::Bwd(layout.text_head()));
    phases.push(ph("head backward", live, logits, head_bwd, f(t * d)));
    // The final norm's backward runs with the decoder backward's buffers, the head group
    // still held; each layer's with its own group.
    let base = 2 * f(t * d) + td.bwd_scratch(t, a);
    let layer = base + tl.one_at_a_time + cp_bwd;
    let head_step = ph("text backward", live, saved.head, head_bwd, base);
    let layers = (0..lt).map(|l| {
        let c = comm(At::Bwd(layout.text_layer(l)));
        ph("text backward", live, saved.head, c, layer)
    });
    phases.push(highest(layers.chain([head_step]), head_step));
    if want_dx0 {
        let c = comm(At::Bwd(layout.text_embed()));
        phases.push(ph(
            "splice backward",
            live,
            saved.head,
            c,
            f(t * d) + f(m * d),
        ));
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
        let c = comm(At::Bwd(layout.projector()));
        let at = ph(
            "projector backward",
            live,
            saved.head,
            c,
            f(m * d) + dvis + scratch,
        );
        phases.push(at);
        if vision_needed {
            let scratch = 2 * f(p * dv) + vd.bwd_scratch(p, a) + vl.one_at_a_time;
            // The patch embedding's step is counted with the layers' working set (it holds
            // less: an upper bound for a sharded rank, nothing for one that holds its groups).
            let embed = comm(At::Bwd(ParamLayout::VISION_EMBED));
            let embed = ph("vision backward", live, saved.head, embed, scratch);
            let layers = (0..lv).map(|i| {
                let c = comm(At::Bwd(layout.vision_layer(i)));
                ph("vision backward", live, saved.head, c, scratch)
            });
            phases.push(highest(layers.chain([embed]), embed));
        }
    }
    done(phases)
}
