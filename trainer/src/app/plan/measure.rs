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
use crate::app::bench::bench_batch;
use crate::model::init::Init;
use crate::model::weights::HfWeights;
use crate::model::{ActElem, DeviceCtx, MemoryFeatures, Precision};
use crate::parallel::cp::{CpAlgo, CpSettings};
use crate::parallel::fsdp::{
    rank_share, run_meta_ranks, FsdpError, FsdpRank, FsdpSettings, ShardSource,
};
use crate::train::checkpoint::{CheckpointDir, Progress};
use crate::train::eval::score::greedy_ids;
use crate::train::resume::save_rank;
use cannon_kernels::Tensor;
use cannon_runtime::{host_count, Stream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What one meta rank measured in one phase of a run besides its step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetaPhase {
    /// The phase's name, as `super::run_phases` names it.
    pub name: &'static str,
    /// The device allocator's `max_allocated` over the phase.
    pub device: usize,
    /// Host bytes at the phase's peak: the host pool's `max_allocated` over the phase (the
    /// offloaded state) plus what the rank's thread allocated on top of what it held when
    /// the phase began (read pieces, host copies, the written group; `0` when the binary
    /// does not count its host allocations, [`cannon_runtime::host_count`]).
    pub host: usize,
}

/// What one meta rank's allocators measured.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetaRank {
    /// Device bytes allocated once the rank's shards exist (start-up).
    pub start_up: usize,
    /// Device bytes allocated when the last measured step began.
    pub step_start: usize,
    /// The device allocator's `max_allocated` over the last measured step.
    pub step_peak: usize,
    /// The host pool's `max_allocated` over the run (offloaded state and activations).
    pub host_peak: usize,
    /// Start-up from a random init, checkpoint save, export (the final model), evaluation, start-up
    /// from HF weights (the exported model) and resume, in that order.
    pub phases: Vec<MetaPhase>,
}

/// The image side (pixels) the measured rows use: the plan's, rounded down to the grid of
/// patch x merge pixels that the synthetic batch (and the model) takes. 0 for text only.
pub fn image_side(s: &PlanSettings) -> usize {
    if s.images_per_row == 0 {
        return 0;
    }
    let cfg = &s.model;
    let cell = cfg.vision_config.patch_size * cfg.spatial_merge_size;
    let image = crate::train::data::image::ImageConfig {
        longest_edge: s.longest_edge,
        patch_size: cfg.vision_config.patch_size as u32,
        merge_size: cfg.spatial_merge_size as u32,
        ..crate::train::data::image::ImageConfig::default()
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

fn measure_as<A: ActElem>(s: &PlanSettings, steps: usize) -> Result<Vec<MetaRank>, FsdpError> {
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
    let world = s.nproc.max(1);
    let eval_rows = s.micro_batch.div_ceil(world) * world;
    let eval_batch = [bench_batch(cfg, eval_rows, s.max_len, img, 7)?];
    // The bench's optimizer and clip (values do not change what is allocated); the
    // plan's freeze list, loss and memory features.
    let settings = FsdpSettings {
        frozen: s.frozen.clone(),
        loss_mode: s.loss,
        memory: MemoryFeatures {
            offload_optimizer: s.offload_optimizer,
            ..s.features.memory()
        },
        ..crate::app::bench::bench_settings()
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
    // The checkpoint and the final model are written for sizes only (sparse files: their
    // headers on disk), in a folder of this measurement, removed at the end.
    let scratch = Scratch::new()?;
    let ckpt_dir = CheckpointDir::new(scratch.0.join("checkpoints"));
    let final_dir = scratch.0.join("final");
    let model_json = crate::train::checkpoint::hf_config_json(cfg);
    let layout = crate::model::ParamLayout::new(cfg);
    run_meta_ranks(world, Duration::from_secs(600), |comm, exec| {
        let random = ShardSource::Random {
            seed: 0,
            init: Init::Normal(0.02),
        };
        let start = Phase::begin(&exec);
        let rank = FsdpRank::new(comm, exec.clone(), cfg.clone(), random, settings.clone())?;
        let mut phases = vec![start.end(rank.exec(), "start-up (init)")];
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
        let bad = |e: crate::train::checkpoint::CheckpointError| FsdpError::Invalid(e.to_string());
        let save = Phase::begin(rank.exec());
        let progress = Progress {
            step: steps as u64,
            config: serde_json::json!({ "measured": "cannon plan --measure" }),
            scheduler: serde_json::Value::Null,
            data: Default::default(),
            rng: 0,
        };
        let saved = save_rank(
            &ckpt_dir,
            1,
            &model_json,
            &rank,
            progress,
            Vec::new(),
            f64::INFINITY,
        )
        .map_err(bad)?;
        phases.push(save.end(rank.exec(), "checkpoint save"));
        let export = Phase::begin(rank.exec());
        let out_dir = (rank.rank() == 0).then_some((final_dir.as_path(), &model_json));
        rank.write_hf(out_dir)?;
        phases.push(export.end(rank.exec(), "export (final model)"));
        // The held-out evaluation's forward of the rank's rows of a held-out batch of a micro
        // batch's rows (split over the whole world: no CP), its argmaxes read in pieces. Every
        // rank gets the plan's full share (meta ranks agree on their own counts).
        let rows = rank_share(cfg, &eval_batch, rank.rank(), rank.world_size())?;
        let vocab = cfg.text_config.vocab_size;
        let eval = Phase::begin(rank.exec());
        let read = |t: &Tensor<f32>, st: &Stream| greedy_ids(t, vocab, st);
        rank.forward_logits::<A, _>(rows.first(), read)?;
        phases.push(eval.end(rank.exec(), "evaluation"));
        // A start-up from HF weights (the final model just written, read for sizes only),
        // then the resume from the checkpoint: each a new rank on the same communicator.
        let comm = rank.into_comm();
        // Every rank opens the file rank 0 has finished.
        comm.barrier(exec.stream())?;
        let weights = HfWeights::open(&final_dir, &layout)
            .map_err(crate::model::ModelError::from)?
            .without_data();
        let load = Phase::begin(&exec);
        let from = ShardSource::Weights(&weights);
        let rank = FsdpRank::new(comm, exec.clone(), cfg.clone(), from, settings.clone())?;
        phases.push(load.end(rank.exec(), "start-up (load)"));
        let comm = rank.into_comm();
        let resume = Phase::begin(&exec);
        let from = ShardSource::Checkpoint(&saved);
        let rank = FsdpRank::new(comm, exec.clone(), cfg.clone(), from, settings.clone())?;
        phases.push(resume.end(rank.exec(), "resume"));
        drop(rank);
        out.phases = phases;
        Ok(out)
    })
}

/// Whether the plan's phase `planned` is the measured `measured`: the plan's one start-up
/// ("init or load") stands for both measured ones.
pub fn same_phase(planned: &str, measured: &str) -> bool {
    planned == measured || (planned.starts_with("start-up") && measured.starts_with("start-up"))
}

/// A folder of one measurement, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self, FsdpError> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("cannon-measure-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            FsdpError::Invalid(format!("--measure: cannot create {}: {e}", dir.display()))
        })?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The figures of a rank when a phase begins, to measure the phase's peaks against. A phase
/// ends on the rank's exec, whose host pool (made by `FsdpRank::new` under an offload) the
/// exec a rank starts from does not have.
struct Phase {
    thread_held: isize,
}

impl Phase {
    fn begin(exec: &DeviceCtx) -> Self {
        exec.allocator().reset_peak();
        if let Some(p) = exec.host_pool() {
            p.allocator().reset_peak();
        }
        host_count::reset_peak();
        Phase {
            thread_held: host_count::stats().allocated,
        }
    }

    fn end(self, exec: &DeviceCtx, name: &'static str) -> MetaPhase {
        let pool = exec
            .host_pool()
            .map_or(0, |p| p.allocator().stats().peak_allocated);
        let thread = host_count::stats().peak_allocated - self.thread_held;
        MetaPhase {
            name,
            device: exec.allocator().stats().peak_allocated,
            host: pool + thread.max(0) as usize,
        }
    }
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
        let Some(rp) = p.rank(r) else {
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
    // The other phases, at their worst rank against the plan's worst (rank 0 writes, so
    // its host bytes include what only it holds).
    let planned = super::run_phases::run_peaks(p, 0, true);
    let _ = writeln!(
        out,
        "\n{:<26} {:>12} {:>12} {:>9}   {:>12} {:>12} {:>9}",
        "phase (worst rank)", "device", "planned", "", "host", "planned", ""
    );
    let names = ranks.first().map_or(&[][..], |r| &r.phases[..]);
    for (i, ph) in names.iter().enumerate() {
        let at = |f: fn(&MetaPhase) -> usize| {
            ranks
                .iter()
                .filter_map(|r| r.phases.get(i).map(f))
                .max()
                .unwrap_or(0)
        };
        let (device, host) = (at(|x| x.device), at(|x| x.host));
        match planned.phases.iter().find(|x| same_phase(x.name, ph.name)) {
            Some(pl) => {
                let pl_host = pl.host + pl.host_rank0;
                let _ = writeln!(
                    out,
                    "{:<26} {:>12} {:>12} {:>9}   {:>12} {:>12} {:>9}",
                    ph.name,
                    gib(device),
                    gib(pl.device),
                    rel(device, pl.device),
                    gib(host),
                    gib(pl_host),
                    rel(host, pl_host),
                );
            }
            None => {
                let _ = writeln!(out, "{:<26} {:>12} (not planned)", ph.name, gib(device));
            }
        }
    }
    if !host_count::installed() {
        let _ = writeln!(out, "(this binary does not count its host allocations)");
    }
    out
}
