//! `cannon plan`: the device memory of a training step, per rank, before anything runs, from
//! an HF config and the run's settings, and whether it fits in a given device memory; and
//! every other phase of the run, on the device and the host, per rank, process and node
//! (`run_phases`).
//!
//! The activation terms are the model's own ([`crate::model::memory`], which a test checks
//! to the byte against the caching allocator); this module adds what a run holds around a
//! forward + backward:
//!
//! ```text
//! rows per rank      ceil(micro_batch / dp) with dp = nproc / cp_size (rows split as the
//!                    trainer splits them: the first ranks take one more when uneven)
//! tokens per rank    rows x max_len / cp_size (rows padded to max_len: the worst case; the
//!                    CP layout pads to a multiple of 2·cp for its head-tail chunks, Ulysses
//!                    too); one image per row
//!                    of longest_edge x longest_edge pixels, rounded up to the patch size
//! one rank (or no FSDP)  params 4·N, grads 4·N_trained, moments 8·N_trained, as allocated
//!                    (one block per group, rounded to 512 bytes)
//! FSDP over W ranks  per group of len n: shard s = ceil(n / W); params 4·s, grads 4·s and
//!                    moments 8·s for trained groups; while a step runs its group's gathered
//!                    buffer 4·s·W and the next group's (the prefetch) are alive, plus the
//!                    group's full gradient 4·s·W in the backward (and a 4·s reduce-scatter
//!                    part from the second micro batch of grad_accum on)
//! offload optimizer  the f32 master weights (4·s per group) and the AdamW moments (8·s per
//!                    trained group) on the host, one block each; gradients stay on the
//!                    device. One rank: a pass copies each group in at its point of use and
//!                    the next one ahead (`model::source`), so at a group's step the device
//!                    holds its 4·n and the next fetching step's (the same terms as an FSDP
//!                    rank's gathered groups, without gradients). FSDP: the rank keeps a
//!                    staging buffer of the largest shard, 4·max s (two such slots on an
//!                    NPU, where the next copy runs ahead), on the device, which each host
//!                    shard is copied into for its all-gather; the gathered groups
//!                    are as without the offload. The update copies one trained group's p,
//!                    m and v to the device at a time (`model::optim::adamw_group`): 3·4·s
//!                    of the largest, after the pass
//! ```
//!
//! The parameters ARE the master weights in this trainer (f32; bf16 GEMMs round them on the
//! fly), so there is no separate master copy (its line is 0). The planned peak is the
//! allocator's `max_allocated`; `max_reserved` is at least that (blocks are reused per size,
//! see `model::memory`), so a plan within a few percent of the device memory is tight.

pub mod measure;
pub(crate) mod report;
pub(crate) mod run_phases;
pub(crate) mod settings;

pub use run_phases::{run_peaks, RunPeaks, RunPhase};
pub use settings::{PlanError, PlanSettings};

use crate::model::memory::{plan_with, MemoryPlan, PassPoint, Phase, StepFeatures, StepShape};
use crate::model::source::PlanInputs;
use crate::model::{GroupOrder, LossMode, ParamLayout};
use crate::parallel::fsdp::ShardLayout;
use crate::train::data::image::ImageConfig;
use cannon_runtime::alloc::round_size;

/// The plan of one rank (ranks with the same rows share one).
#[derive(Clone, Debug, PartialEq)]
pub struct RankPlan {
    /// The ranks this plan is for (first, last).
    pub ranks: (usize, usize),
    /// Rows and text tokens of the rank's micro batch; vision patches of its images.
    pub rows: usize,
    pub tokens: usize,
    pub patches: usize,
    /// Device bytes held across steps: the parameters (with the optimizer offload: none on
    /// one rank, the staging buffer of an FSDP rank), gradients, master weights (0: the
    /// parameters are the masters), moments.
    pub params: usize,
    pub grads: usize,
    pub master: usize,
    pub moments: usize,
    /// The step (above what is held across steps), as the model's memory plan gives it.
    pub step: MemoryPlan,
    /// Device bytes of the optimizer update's streamed state (offload optimizer).
    pub optimizer_in_flight: usize,
    /// Host bytes: saved activations offloaded, optimizer state offloaded (the master
    /// weights and the moments).
    pub host_activations: usize,
    pub host_optimizer: usize,
}

impl RankPlan {
    /// Bytes held across steps.
    pub fn resident(&self) -> usize {
        self.params + self.grads + self.master + self.moments
    }

    /// The step's high point above the resident bytes.
    pub fn step_peak(&self) -> usize {
        self.step.peak().max(self.optimizer_in_flight)
    }

    /// The planned `max_allocated` of a step.
    pub fn peak(&self) -> usize {
        self.resident() + self.step_peak()
    }

    /// The phase at the high point, with its parts.
    pub fn peak_phase(&self) -> Phase {
        match self.step.peak_at() {
            Some(p) if p.total() >= self.optimizer_in_flight => *p,
            _ => Phase {
                name: "optimizer update",
                comm: self.optimizer_in_flight,
                ..Phase::default()
            },
        }
    }

    /// The largest communication buffers of any phase.
    pub fn comm_max(&self) -> usize {
        self.step.phases.iter().map(|p| p.comm).max().unwrap_or(0)
    }
}

/// The plan of every rank.
#[derive(Clone, Debug)]
pub struct Plan {
    pub settings: PlanSettings,
    /// Per distinct rank plan.
    pub ranks: Vec<RankPlan>,
    /// Image side in pixels after resizing (0: no image).
    pub image_side: usize,
    /// The held-out evaluation's forward on the rank with the most rows: its share of a
    /// micro batch's rows split over every rank (no CP), nothing training, the full logits
    /// kept; above the rank's resident bytes, as a step's plan.
    pub eval: MemoryPlan,
}

impl Plan {
    /// The plan of rank `r` (None past the last rank).
    pub fn rank(&self, r: usize) -> Option<&RankPlan> {
        self.ranks.iter().find(|x| x.ranks.0 <= r && r <= x.ranks.1)
    }

    /// The largest planned peak over the ranks.
    pub fn peak(&self) -> usize {
        self.ranks.iter().map(RankPlan::peak).max().unwrap_or(0)
    }

    /// Whether every rank's planned peak fits in `bytes`.
    pub fn fits(&self, bytes: u64) -> bool {
        self.peak() as u64 <= bytes
    }
}

/// Rows of each of `ranks` ranks sharing `rows` (the trainer's split: the first
/// `rows % ranks` take one more).
pub fn even_counts(rows: usize, ranks: usize) -> Vec<usize> {
    let ranks = ranks.max(1);
    (0..ranks)
        .map(|r| rows / ranks + usize::from(r < rows % ranks))
        .collect()
}

/// Plans every rank of `s`.
pub fn plan(s: &PlanSettings) -> Result<Plan, PlanError> {
    let cfg = &s.model;
    let world = s.nproc;
    let cp = s.features.cp.size.max(1);
    let dp = world / cp;
    let layout = ParamLayout::new(cfg);
    let (patch, merge) = (cfg.vision_config.patch_size, cfg.spatial_merge_size);
    let image = ImageConfig {
        longest_edge: s.longest_edge,
        patch_size: patch as u32,
        merge_size: merge as u32,
        ..ImageConfig::default()
    };
    let side = if s.images_per_row == 0 {
        0
    } else {
        image.output_size(s.longest_edge, s.longest_edge).0 as usize
    };
    let per_image_tokens = (side / patch / merge).pow(2);
    let image_block = if side == 0 {
        0
    } else {
        // [IMG] x cols + [IMG_BREAK] per row ([IMG_END] last)
        (side / patch / merge) * (side / patch / merge + 1)
    };
    if s.images_per_row * image_block + 1 >= s.max_len {
        return Err(PlanError::Invalid {
            key: "data.max_len",
            value: s.max_len.to_string(),
            reason: format!(
                "a row must hold BOS and {} image block(s) of {image_block} tokens (an image of \
                 {side} x {side} px) and some text",
                s.images_per_row
            ),
        });
    }
    let sharded = world > 1 && s.fsdp;
    let cut = ShardLayout::new(&layout, if sharded { world } else { 1 });
    let trains = |g: usize| !s.frozen.contains(&layout.groups[g].part);
    let trainable: Vec<_> = [
        crate::model::Part::Vision,
        crate::model::Part::Projector,
        crate::model::Part::Text,
    ]
    .into_iter()
    .filter(|p| !s.frozen.contains(p))
    .collect();
    // Bytes per element of the device copy of the parameters (and of gathered groups): f32,
    // the master weights themselves, with or without the optimizer offload.
    let pa = 4;
    let shard = |g: usize| cut.groups[g].shard;
    let groups = 0..layout.groups.len();
    let sum = |bytes: &dyn Fn(usize) -> usize, only_trained: bool| -> usize {
        groups
            .clone()
            .filter(|&g| !only_trained || trains(g))
            .map(|g| round_size(bytes(g)))
            .sum()
    };
    let grads = sum(&|g| 4 * shard(g), true);
    let (params, master, moments, host_optimizer, optimizer_in_flight) = if s.offload_optimizer {
        // p per group and m + v per trained group on the host, one block each; an FSDP
        // rank's staging buffer on the device; one group's p, m, v on the device during its
        // update.
        let host = sum(&|g| pa * shard(g), false) + sum(&|g| 4 * shard(g), true) * 2;
        let slots = cannon_runtime::HostPool::staging_slots(s.device);
        let staging = match sharded {
            true => round_size(slots * pa * cut.largest_shard()),
            false => 0,
        };
        let largest = groups
            .clone()
            .filter(|&g| trains(g))
            .map(|g| round_size(4 * shard(g)) * 3)
            .max()
            .unwrap_or(0);
        (staging, 0, 0, host, largest)
    } else {
        let params = sum(&|g| pa * shard(g), false);
        (params, 0, sum(&|g| 4 * shard(g), true) * 2, 0, 0)
    };

    // A rank's batch of `rows` rows of `max_len` tokens, `tokens` of them its own (T/cp
    // under context parallel), with the plan's images.
    let shape_of = |rows: usize, tokens: usize, trained_targets: bool| {
        let images = rows * s.images_per_row;
        StepShape {
            tokens,
            whole_tokens: rows * s.max_len,
            patches: images * (side / patch).pow(2),
            merged: images * per_image_tokens,
            pixels: images * cfg.vision_config.num_channels * side * side,
            trained_targets,
            lse_per_head: cannon_kernels::attention::lse_per_head(s.device),
        }
    };
    let mut ranks: Vec<RankPlan> = Vec::new();
    for (r, &rows) in even_counts(s.micro_batch, dp).iter().enumerate() {
        let text = rows * s.max_len;
        // `cp::CpLayout`: 2·r chunks of C = u·ceil(T / 2·cp) tokens, 2·C / u per rank.
        let tokens = match cp {
            1 => text,
            _ => text.div_ceil(2 * cp) * 2,
        };
        let shape = shape_of(rows, tokens, true);
        let patches = shape.patches;
        let pass = GroupOrder::new(
            cfg,
            &layout,
            PlanInputs {
                trains: &trains,
                images: patches > 0,
                dpixels: false,
            },
        );
        let comm = |at: PassPoint| -> usize {
            match (sharded, s.offload_optimizer) {
                (true, _) => gathered(&pass, &cut, at, pa, Some(s.grad_accum > 1)),
                // One rank with its groups in the host pool: the copied-in groups.
                (false, true) => gathered(&pass, &cut, at, pa, None),
                (false, false) => 0,
            }
        };
        let step = plan_with(
            cfg,
            &shape,
            s.precision,
            s.loss,
            &trainable,
            false,
            &s.features,
            &comm,
        );
        let plan = RankPlan {
            ranks: (r * cp, r * cp + cp - 1),
            rows,
            tokens,
            patches,
            params,
            grads,
            master,
            moments,
            host_activations: step.host_activations,
            step,
            optimizer_in_flight,
            host_optimizer,
        };
        match ranks.last_mut() {
            Some(last) if last.rows == rows => last.ranks.1 = plan.ranks.1,
            _ => ranks.push(plan),
        }
    }
    // The evaluation: whole rows (no CP) split over the world, nothing trains, full logits.
    let eval = {
        let rows = s.micro_batch.div_ceil(cut.world);
        let shape = shape_of(rows, rows * s.max_len, false);
        let patches = shape.patches;
        let none = |_: usize| false;
        let pass = GroupOrder::new(
            cfg,
            &layout,
            PlanInputs {
                trains: &none,
                images: patches > 0,
                dpixels: false,
            },
        );
        let comm = |at: PassPoint| -> usize {
            match (sharded, s.offload_optimizer) {
                (true, _) => gathered(&pass, &cut, at, pa, Some(false)),
                (false, true) => gathered(&pass, &cut, at, pa, None),
                (false, false) => 0,
            }
        };
        let features = StepFeatures {
            cp: Default::default(),
            ..s.features
        };
        plan_with(
            cfg,
            &shape,
            s.precision,
            LossMode::Full,
            &[],
            false,
            &features,
            &comm,
        )
    };
    Ok(Plan {
        settings: s.clone(),
        ranks,
        image_side: side,
        eval,
    })
}

/// Bytes of the buffers a sharded rank holds at step `at` of its pass plan besides its
/// shards: the step's gathered group (if it fetches), the next fetching step's (prefetched
/// when this one was entered), and in the backward the group's full gradient (plus the
/// reduce-scatter's part when it is added to a shard already written this step), which
/// a layer's recompute does not hold yet.
/// `sharded_grads`: Some(grad_accum > 1) for a sharded rank; None for one rank whose groups
/// are copied in from the host pool (`cut` over one rank), which has the same groups alive
/// and no full gradients (its gradients are resident).
pub fn gathered(
    pass: &GroupOrder,
    cut: &ShardLayout,
    at: PassPoint,
    elem: usize,
    sharded_grads: Option<bool>,
) -> usize {
    let full = |g: usize| cut.groups[g].padded(cut.world);
    let g_bytes = |g: usize| round_size(elem * full(g));
    match at {
        PassPoint::Fwd(g) => {
            let Some(i) = pass.forward.iter().position(|&x| x == g) else {
                return 0;
            };
            g_bytes(g) + pass.forward.get(i + 1).map_or(0, |&n| g_bytes(n))
        }
        PassPoint::Bwd(g) | PassPoint::Recompute(g) => {
            let Some(i) = pass.backward.iter().position(|x| x.group == g) else {
                return 0;
            };
            let step = pass.backward[i];
            let own = if step.fetch { g_bytes(g) } else { 0 };
            let next = pass.backward[i + 1..]
                .iter()
                .find(|x| x.fetch)
                .map_or(0, |x| g_bytes(x.group));
            // From the second micro batch on, the reduce-scatter lands in a part that is
            // added to the shard: it is allocated at the release, after a fetching step has
            // let its weights go (which are larger), so only a step that fetches nothing
            // (the text embedding's) holds it on top of the rest.
            let Some(accum) = sharded_grads else {
                return own + next;
            };
            let part = if accum && !step.fetch {
                round_size(4 * cut.groups[g].shard)
            } else {
                0
            };
            let grad = if step.release && matches!(at, PassPoint::Bwd(_)) {
                round_size(4 * full(g)) + part
            } else {
                0
            };
            own + next + grad
        }
    }
}

/// The loss mode's name for reports.
pub fn loss_name(l: LossMode) -> String {
    match l {
        LossMode::Full => "full".into(),
        LossMode::Chunked(c) => format!("chunked {c}"),
    }
}
