//! `cannon plan --measure`: the plan's layout run through cannon's own step on meta ranks
//! (torchtitan's estimate on fake tensors, here on [`cannon_runtime::Device::Meta`]): N
//! in-process ranks whose buffers have sizes and no storage, whose collectives check every
//! call and move nothing, and whose caching allocators count what each rank would hold.
//! Start-up draws nothing (each rank's shards are placed, not filled) and the steps compute
//! nothing, so a 24B layout measures in seconds and a few MB of host memory. The meta device
//! sizes what it saves as an NPU does (attention's softmax statistics), so the figures
//! compare with `--device npu` plans; like the plan, they are the model's own allocator's
//! (CANN's operator workspaces are outside both).
//!
//! Batches are `bench`'s synthetic rows, one image per row of the plan's image size rounded
//! down to the patch x merge grid the model takes (the plan is made again at that size when
//! it differs, so both describe the same rows).

use super::PlanSettings;
use crate::bench::bench_batch;
use crate::cp::{CpAlgo, CpSettings};
use crate::fsdp::{rank_share, run_meta_ranks, FsdpError, FsdpRank, FsdpSettings, ShardSource};
use crate::model::init::Init;
use crate::model::{Act, MemoryFeatures, Precision};
use std::time::Duration;

/// What one meta rank's allocators measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetaRank {
    /// Device bytes allocated once the rank's shards exist (start-up).
    pub start_up: usize,
    /// Device bytes allocated when the last measured step began.
    pub step_start: usize,
    /// The device allocator's `max_allocated` over the last measured step.
    pub step_peak: usize,
    /// The host pool's `max_allocated` over the run (offloaded state and activations).
    pub host_peak: usize,
}

/// The image side (pixels) the measured rows use: the plan's, rounded down to the grid of
/// patch x merge pixels that the synthetic batch (and the model) takes. 0 for text only.
pub fn image_side(s: &PlanSettings) -> usize {
    if s.images_per_row == 0 {
        return 0;
    }
    let cfg = &s.model;
    let cell = cfg.vision_config.patch_size * cfg.spatial_merge_size;
    let image = crate::data::image::ImageConfig {
        longest_edge: s.longest_edge,
        patch_size: cfg.vision_config.patch_size as u32,
        merge_size: cfg.spatial_merge_size as u32,
        ..crate::data::image::ImageConfig::default()
    };
    let side = image.output_size(s.longest_edge, s.longest_edge).0 as usize;
    side - side % cell.max(1)
}

/// Runs start-up and `steps` optimizer steps of `s`'s layout on `s.nproc` meta ranks and
/// returns each rank's figures (the last step's). `steps` >= 1 (2 measures a step after a
/// warm one, as the plan tests do).
pub fn measure(s: &PlanSettings, steps: usize) -> Result<Vec<MetaRank>, FsdpError> {
    if steps == 0 {
        return Err(FsdpError::Invalid(
            "--measure needs at least one step".into(),
        ));
    }
    if s.images_per_row > 1 {
        return Err(FsdpError::Invalid(format!(
            "--measure builds rows of one image; --images-per-row {} is not measured",
            s.images_per_row
        )));
    }
    match s.precision {
        Precision::F32 => measure_as::<f32>(s, steps),
        Precision::Bf16 => measure_as::<half::bf16>(s, steps),
    }
}

fn measure_as<A: Act>(s: &PlanSettings, steps: usize) -> Result<Vec<MetaRank>, FsdpError> {
    let cfg = &s.model;
    let img = image_side(s);
    // bench_batch wants an image; a text-only plan is not measured this way (yet).
    if img == 0 {
        return Err(FsdpError::Invalid(
            "--measure builds rows with one image: --images-per-row 0 is not measured".into(),
        ));
    }
    let micro = (0..s.grad_accum.max(1))
        .map(|i| bench_batch(cfg, s.micro_batch, s.max_len, img, i as u64))
        .collect::<Result<Vec<_>, _>>()?;
    // The bench's optimizer and clip (values do not change what is allocated); the
    // plan's freeze list, loss and memory features.
    let settings = FsdpSettings {
        frozen: s.frozen.clone(),
        loss_mode: s.loss,
        memory: MemoryFeatures {
            offload_optimizer: s.offload_optimizer,
            ..s.features.memory()
        },
        ..crate::bench::bench_settings()
    };
    let c = s.features.cp;
    let cp = CpSettings {
        size: c.size.max(1),
        algo: match c.algo {
            crate::model::memory::CpAlgo::Ulysses => CpAlgo::Ulysses,
            crate::model::memory::CpAlgo::Ring => CpAlgo::Ring,
            crate::model::memory::CpAlgo::Hybrid => CpAlgo::Hybrid,
        },
        ulysses_size: c.ulysses.max(1),
    };
    run_meta_ranks(s.nproc.max(1), Duration::from_secs(600), |comm, exec| {
        let source = ShardSource::Random {
            seed: 0,
            init: Init::Normal(0.02),
        };
        let rank = FsdpRank::new(comm, exec.clone(), cfg.clone(), source, settings.clone())?;
        let start_up = rank.exec().allocator().stats().allocated;
        let mut rank = rank.with_cp(cp)?;
        let (replica, replicas) = rank.data_parallel();
        let mine = rank_share(cfg, &micro, replica, replicas)?;
        let mut out = MetaRank {
            start_up,
            ..MetaRank::default()
        };
        for _ in 0..steps {
            let st = rank.step::<A>(&mine, 1e-4)?;
            out.step_start = st.memory.start_allocated;
            out.step_peak = st.memory.max_allocated;
        }
        out.host_peak = rank
            .exec()
            .host_pool()
            .map_or(0, |p| p.stats().peak_allocated);
        Ok(out)
    })
}

/// The measured figures beside the plan's, per rank: start-up (the bytes held across
/// steps), the step's `max_allocated`, and the host pool's peak (offloaded state and
/// activations), each with its difference from the plan.
pub fn text(p: &super::Plan, ranks: &[MetaRank]) -> String {
    use super::report::gib;
    use std::fmt::Write;
    let rel = |m: usize, planned: usize| -> String {
        match planned {
            0 if m == 0 => "=".into(),
            0 => "(none planned)".into(),
            _ => format!(
                "{:+.2} %",
                (m as f64 - planned as f64) / planned as f64 * 100.0
            ),
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:>12} {:>12} {:>9}   {:>12} {:>12} {:>9}   {:>12} {:>12} {:>9}",
        "rank", "start-up", "planned", "", "step peak", "planned", "", "host peak", "planned", ""
    );
    for (r, m) in ranks.iter().enumerate() {
        let Some(rp) = p.ranks.iter().find(|x| x.ranks.0 <= r && r <= x.ranks.1) else {
            let _ = writeln!(out, "{r:<6} (no plan for this rank)");
            continue;
        };
        let host = rp.host_optimizer + rp.host_activations;
        let _ = writeln!(
            out,
            "{r:<6} {:>12} {:>12} {:>9}   {:>12} {:>12} {:>9}   {:>12} {:>12} {:>9}",
            gib(m.start_up),
            gib(rp.resident()),
            rel(m.start_up, rp.resident()),
            gib(m.step_peak),
            gib(rp.peak()),
            rel(m.step_peak, rp.peak()),
            gib(m.host_peak),
            gib(host),
            rel(m.host_peak, host),
        );
    }
    out
}
