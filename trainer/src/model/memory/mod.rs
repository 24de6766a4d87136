//! The memory of a training step, as formulas over the config and the batch: the bytes each
//! part of the model saves for its backward, the working tensors of each pass, and from them
//! the caching allocator's peak ([`plan`], [`plan_with`]), equal to `max_allocated` to the byte
//! (tests `memory`, `memory_features`, `plan`). The derivation, term by term, is in the
//! repository's docs/memory.md, "The formulas behind the plan".

mod cp;
mod dims;
pub use cp::{ContextParallel, CpAlgo};

use super::config::Mistral3Config;
use super::params::{ParamLayout, Part};
use super::pixtral::PatchGrid;
use super::projector::tokens_per_image;
use super::saved::{MemoryFeatures, Recompute};
use super::{Batch, LossMode, ModelError, Precision};
use cannon_kernels::attention::lse_per_head;
use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_runtime::alloc::round_size;
use cannon_runtime::Device;
use dims::{blocks, Dims};

/// The sizes of one batch that the memory depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepShape {
    /// T: tokens (of this rank, under context parallelism: `Tl`).
    pub tokens: usize,
    /// Tokens of the whole batch (= `tokens` without context parallelism): the spliced
    /// embeddings and the gradient flowing into them are the whole batch's on every CP rank.
    pub whole_tokens: usize,
    /// P: vision patches over all images.
    pub patches: usize,
    /// M: merged image tokens.
    pub merged: usize,
    /// N·C·h·w: pixel values.
    pub pixels: usize,
    /// Whether any target is trained (the chunked loss skips everything otherwise).
    pub trained_targets: bool,
    /// f32 softmax statistics an attention layer saves per (token, query head) on the
    /// step's device ([`cannon_kernels::attention::lse_per_head`]): 1 on the CPU (the
    /// log-sum-exp), 16 on an NPU (aclnn's softmaxMax and softmaxSum, 8 each).
    pub lse_per_head: usize,
}

impl StepShape {
    /// The shape of `batch` run on `device`.
    pub fn of(cfg: &Mistral3Config, batch: &Batch, device: Device) -> Result<Self, ModelError> {
        let (patches, merged) = if batch.images.is_empty() {
            (0, 0)
        } else {
            let grid = PatchGrid::new(cfg, &batch.images)?;
            let m = tokens_per_image(&grid, cfg.spatial_merge_size).iter().sum();
            (grid.patches(), m)
        };
        Ok(StepShape {
            tokens: batch.input_ids.len(),
            whole_tokens: batch.input_ids.len(),
            patches,
            merged,
            pixels: batch.images.pixel_values.len(),
            trained_targets: batch.targets().iter().any(|&t| t != IGNORE_INDEX),
            lse_per_head: lse_per_head(device),
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
    /// Logits: the full loss's `[T,V]` logits overwritten by their gradient, or the chunk
    /// alive.
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
    /// Bytes of offloaded decoder activations in the host pool at the end of the forward
    /// (0 without `offload_activations`); not part of the device's figures.
    pub host_activations: usize,
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

/// The features of a step that change its memory: the decoder's recompute and activation
/// offload ([`MemoryFeatures`], as the model runs them; see the module docs for their
/// terms) and context parallelism.
///
/// Context parallelism (`crate::parallel::cp::attn`, `crate::parallel::cp::ring`; u Ulysses ranks, r ring
/// ranks). With Tl the rank's tokens, rep = u / Hkv when Hkv < u (each kv head repeated),
/// rep = 1 otherwise, and Hkv' = rep·Hkv, write `q4 = 4·Tl·Hq·Hd`, `k4 = 4·Tl·Hkv'·Hd` (f32) and `qa`, `ka`
/// the same in activation storage, `kv = a·Tl·Hkv·Hd`, and `x = 1` when u > 1 (an
/// all-to-all receives into a second buffer beside the one it sends), else 0. A layer saves
/// its q, k, v in the head-sharded layout (`k`, `v` of Hkv' heads: `ka` each) and the
/// head-sharded attention output once more (`qa`). The exchange buffers of one layer, each
/// the highest of its steps in the order the code allocates and frees them:
///
/// ```text
/// forward   q, k, v to heads (f32)        max((1 + x)·q4, q4 + (2 + x)·k4)
///           ring (r > 1)                  q4 (f32 output) + 2·ka (K/V block) + ka (the
///                                         next one, received while the block is held)
///           attention output back         (1 + x)·qa
/// backward  d out to heads, dq dk dv      2·qa + 2·ka          (head-sharded, kept to the end)
///           ring (r > 1)                  2·qa + 2·ka + q4 + 2·k4 (f32 dq, dK, dV) + 2·ka
///                                         (K/V block) + k4 (dK or dV received)
///           back to tokens                qa + 2·ka + (1 + x)·qa  for dq;
///                                         qa + 2·ka + x·ka + kv (+ ka when rep > 1) for dk
/// ```
///
/// Under the full recompute a layer's backward first runs its forward again, collectives
/// included, beside the same tensors but before the layer's gradient buffer exists
/// ([`PassPoint::Recompute`]: a sharded rank's full gradient of the group comes after).
/// The whole batch's spliced embeddings `[T, D]` exist on every CP rank until its rows are
/// split off, and again as the gradient flowing into them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepFeatures {
    pub recompute: Recompute,
    pub offload_activations: bool,
    pub cp: ContextParallel,
}

impl StepFeatures {
    /// The decoder's memory features (the optimizer offload is not part of a pass).
    pub fn memory(&self) -> MemoryFeatures {
        MemoryFeatures {
            recompute: self.recompute,
            offload_activations: self.offload_activations,
            offload_optimizer: false,
        }
    }
}

impl From<MemoryFeatures> for StepFeatures {
    fn from(m: MemoryFeatures) -> Self {
        StepFeatures {
            recompute: m.recompute,
            offload_activations: m.offload_activations,
            cp: ContextParallel::default(),
        }
    }
}

/// Where in the pass a phase's high point is: the forward or backward step of a parameter
/// group (`ParamLayout` indices). A sharded rank holds that step's gathered groups then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassPoint {
    Fwd(usize),
    Bwd(usize),
    /// A decoder layer's forward run again by the full recompute, at the start of the
    /// group's backward step: its weights are there, its gradient is not yet.
    Recompute(usize),
}

/// The decoder's terms under the memory features (see the module docs), per layer: what the
/// device holds at its forward and what its backward adds to the working tensors.
struct TextTerms {
    /// `O`: a layer's input or output.
    o: usize,
    /// `F` (with the head-sharded attention output under CP).
    all: usize,
    /// `K`.
    kept: usize,
    layers: usize,
    offload: bool,
    /// The recompute's working tensors in the backward (`S`, `+ O` for the full one).
    rec: usize,
}

impl TextTerms {
    fn new(td: &Dims, hd: usize, t: usize, a: usize, layers: usize, f: &StepFeatures) -> Self {
        let att_cp = if f.cp.size > 1 {
            round_size(a * t * td.dq)
        } else {
            0
        };
        // Under CP the layer keeps k and v head-sharded, with Ulysses' repeated kv heads.
        let sd = Dims {
            dkv: td.dkv * f.cp.kv_rep(td.dkv / hd.max(1)),
            ..*td
        };
        let o = round_size(4 * t * td.d);
        let kept_cp = if f.recompute == Recompute::Full {
            0
        } else {
            att_cp
        };
        TextTerms {
            o,
            all: sd.layer_acts(t, a, Recompute::None) + att_cp,
            kept: sd.layer_acts(t, a, f.recompute) + kept_cp,
            layers,
            offload: f.offload_activations,
            rec: match f.recompute {
                Recompute::None => 0,
                Recompute::Selective => td.fwd_scratch(t),
                Recompute::Full => td.fwd_scratch(t) + o,
            },
        }
    }

    /// Layers 0..L-2 go to the host (the last one stays), when there are two or more.
    fn offloaded(&self, l: usize) -> bool {
        self.offload && l + 1 < self.layers
    }

    /// Device bytes of the layers before `l` (their input and what they keep; an offloaded
    /// layer leaves the device after the next layer ran).
    fn before(&self, l: usize) -> usize {
        (0..l)
            .filter(|&k| !self.offloaded(k) || k + 1 == l)
            .map(|_| self.o + self.kept)
            .sum()
    }

    /// Saved bytes on the device during layer `l`'s forward: the layers before it, its input,
    /// what it keeps and its output (what it makes and drops is working memory).
    fn at_forward(&self, l: usize) -> usize {
        self.before(l) + 2 * self.o + self.kept
    }

    /// Saved bytes on the device after the forward: the layers still there and the output.
    fn after_forward(&self) -> usize {
        self.before(self.layers) + self.o
    }

    /// What a layer brings back from the host.
    fn reload(&self, l: usize) -> usize {
        if self.offloaded(l) {
            self.o + self.kept
        } else {
            0
        }
    }

    /// What layer `l`'s backward adds to the working tensors: its reload and the prefetched
    /// one of layer l-1, what it recomputes, the recompute's working tensors.
    fn backward(&self, l: usize) -> usize {
        let prev = if l > 0 { self.reload(l - 1) } else { 0 };
        self.reload(l) + prev + (self.all - self.kept) + self.rec
    }

    fn host(&self) -> usize {
        (0..self.layers).map(|l| self.reload(l)).sum()
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
/// its groups on the device; a sharded rank's gathered groups, or the groups copied in from
/// the host pool under the optimizer offload, see the plan's `gathered` in the app tier). `s.tokens` is the
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
    comm: &dyn Fn(PassPoint) -> usize,
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
    let (td, vd) = (
        Dims::text(cfg, s.lse_per_head),
        Dims::vision(cfg, s.lse_per_head),
    );
    let images = p > 0;
    let (lv, lt) = (cfg.vision_layers_used(), cfg.text_config.num_hidden_layers);
    let f = |n: usize| round_size(4 * n);
    let hd = cfg.text_config.head_dim();
    let tl = TextTerms::new(&td, hd, t, a, lt, feat);
    let (cp_fwd, cp_bwd) = feat.cp.buffers(&td, hd, t, a);
    // The whole batch's tokens (the spliced embeddings and their gradient, on every CP rank).
    let tw = s.whole_tokens.max(t);

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
        text_embed: f(tw * d),
        text_layer: tl.o + tl.kept,
        final_norm: blocks(&[4 * t, a * t * d]),
        // A training forward overwrites the logits with their gradient (`head::forward`).
        head: match mode {
            LossMode::Full => f(t * v),
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
            comm(PassPoint::Fwd(ve)),
            0,
        ));
        let scratch = vd.fwd_scratch(p);
        let fallback = ph("vision forward", saved.vision_embed, 0, 0, scratch);
        phases.push(highest(
            (0..lv).map(|i| {
                let kept = saved.vision_embed + (i + 1) * saved.vision_layer;
                let c = comm(PassPoint::Fwd(layout.vision_layer(i)));
                ph("vision forward", kept, 0, c, scratch)
            }),
            fallback,
        ));
        live += saved.vision_embed + lv * saved.vision_layer + saved.projector;
        let scratch = blocks(&[
            4 * p * dv,
            4 * m * mm * dv,
            4 * m * mm * dv,
            4 * m * dv,
            4 * m * d,
        ]);
        let c = comm(PassPoint::Fwd(layout.projector()));
        phases.push(ph("projector forward", live, 0, c, scratch));
    }
    // The spliced embeddings are layer 0's input (`O` of the text terms).
    let c = comm(PassPoint::Fwd(layout.text_embed()));
    phases.push(ph("text embed forward", live + saved.text_embed, 0, c, 0));
    if tw > t {
        // A CP rank copies its rows out of the whole batch's (its shard and the real rows
        // gathered on the way; at most all of them), then lets the whole batch's go.
        let split = saved.text_embed + 2 * f(t * d);
        phases.push(ph("cp split", live + split, 0, 0, 0));
    }
    let scratch = td.fwd_scratch(t) + cp_fwd;
    let dropped = tl.all - tl.kept;
    phases.push(highest(
        (0..lt).map(|l| {
            let c = comm(PassPoint::Fwd(layout.text_layer(l)));
            ph(
                "text forward",
                live + tl.at_forward(l),
                0,
                c,
                scratch + dropped,
            )
        }),
        ph("text forward", live + tl.o, 0, 0, scratch),
    ));
    live += tl.after_forward() + saved.final_norm;
    let head_fwd = comm(PassPoint::Fwd(layout.text_head()));
    phases.push(ph("final norm forward", live, 0, head_fwd, f(t * d)));
    phases.push(ph("head forward", live, saved.head + chunk, head_fwd, 0));
    let host_activations = tl.host();

    // The backward, with every saved activation live.
    let trains = |part| trainable.contains(&part);
    let vision_needed = trains(Part::Vision) || dpixels;
    let image_needed = images && (trains(Part::Projector) || vision_needed);
    let want_dx0 = trains(Part::Text) || image_needed;
    let done = |phases| MemoryPlan {
        params,
        grads,
        saved,
        host_activations,
        phases,
    };
    if !want_dx0 && trainable.is_empty() {
        return done(phases);
    }
    let logits = saved.head + chunk;
    let head_bwd = comm(PassPoint::Bwd(layout.text_head()));
    phases.push(ph("head backward", live, logits, head_bwd, f(t * d)));
    // The final norm's backward runs with the decoder backward's buffers, the head group
    // still held; each layer's with its own group.
    let base = 2 * f(t * d) + td.bwd_scratch(t, a);
    let head_step = ph("text backward", live, saved.head, head_bwd, base);
    let layers = (0..lt).flat_map(|l| {
        let g = layout.text_layer(l);
        let scratch = base + tl.backward(l);
        let bwd = ph(
            "text backward",
            live,
            saved.head,
            comm(PassPoint::Bwd(g)),
            scratch + cp_bwd,
        );
        // A full recompute runs the layer's forward exchange first, beside the same
        // tensors but before the layer's gradient buffer is made.
        let again = (feat.recompute == Recompute::Full).then(|| {
            let c = comm(PassPoint::Recompute(g));
            ph("text backward", live, saved.head, c, scratch + cp_fwd)
        });
        std::iter::once(bwd).chain(again)
    });
    phases.push(highest(layers.chain([head_step]), head_step));
    if want_dx0 {
        // Under CP the gradient is the whole batch's rows again (a rank's own rows copied
        // in, zero elsewhere). That copy's transient, about 2·T·D with the rank's rows, is
        // not a phase of its own: it comes before the embedding's gradient (V·D) exists,
        // which is larger unless a batch holds more than half a vocabulary of tokens.
        let c = comm(PassPoint::Bwd(layout.text_embed()));
        phases.push(ph(
            "splice backward",
            live,
            saved.head,
            c,
            f(tw * d) + f(m * d),
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
        let c = comm(PassPoint::Bwd(layout.projector()));
        let at = ph(
            "projector backward",
            live,
            saved.head,
            c,
            f(m * d) + dvis + scratch,
        );
        phases.push(at);
        if vision_needed {
            let scratch = 2 * f(p * dv) + vd.bwd_scratch(p, a);
            // The patch embedding's step is counted with the layers' working set (it holds
            // less: an upper bound for a sharded rank, nothing for one that holds its groups).
            let embed = comm(PassPoint::Bwd(ParamLayout::VISION_EMBED));
            let embed = ph("vision backward", live, saved.head, embed, scratch);
            let layers = (0..lv).map(|i| {
                let c = comm(PassPoint::Bwd(layout.vision_layer(i)));
                ph("vision backward", live, saved.head, c, scratch)
            });
            phases.push(highest(layers.chain([embed]), embed));
        }
    }
    done(phases)
}
