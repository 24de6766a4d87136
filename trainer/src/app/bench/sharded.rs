//! `cannon bench step --nproc N`: the same steps as [`super::run`], on N in-process CPU ranks
//! of an FSDP run (`crate::parallel::fsdp`): the B rows are split into N contiguous parts of B/N rows,
//! one micro batch per rank; every rank holds 1/N of the parameters, gradients and AdamW
//! state. Rank 0's wall time per step is the step time (every step ends in collectives, so
//! the ranks finish together); the allocator figures are the largest rank's. The GEMM peak is
//! probed before the ranks start and after they end, not between steps.

use super::{bench_batch, peak_rss_mib, random_host, StepBench, StepReport, GEMM_PEAK_N};
use crate::model::optim::AdamWConfig;
use crate::model::{ActElem, DeviceCtx, LossMode, Mistral3Config, ModelError, ParamLayout, Part};
use crate::parallel::fsdp::{run_cpu_ranks, split_rows, FsdpError, FsdpRank, FsdpSettings};
use crate::train::flops::{gemm_peak, step_flops};
use cannon_kernels::Precision;
use std::time::{Duration, Instant};

/// Times `b.warmup + b.steps` sharded steps on `nproc` CPU ranks.
pub fn run_sharded(
    cfg: &Mistral3Config,
    b: &StepBench,
    nproc: usize,
) -> Result<StepReport, FsdpError> {
    match b.precision {
        Precision::F32 => run_as::<f32>(cfg, b, nproc),
        Precision::Bf16 => run_as::<half::bf16>(cfg, b, nproc),
    }
}

fn run_as<A: ActElem>(
    cfg: &Mistral3Config,
    b: &StepBench,
    nproc: usize,
) -> Result<StepReport, FsdpError> {
    if b.steps == 0 {
        return Err(ModelError::Input("--steps must be > 0".into()).into());
    }
    if nproc == 0 || !b.batch.is_multiple_of(nproc) {
        return Err(FsdpError::Invalid(format!(
            "--batch {} must split evenly over --nproc {nproc} ranks",
            b.batch
        )));
    }
    let host = random_host(cfg, b.seed);
    let batch = bench_batch(cfg, b.batch, b.seq, b.img, b.seed)?;
    let per = b.batch / nproc;
    // Measured before the ranks start, so it has the whole machine as each step does.
    let gemm_peak_flops =
        gemm_peak(&DeviceCtx::cpu(), b.precision, GEMM_PEAK_N, 4).map_err(ModelError::from)?;
    let settings = FsdpSettings {
        adamw: AdamWConfig {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        },
        max_grad_norm: 1.0,
        frozen: vec![Part::Vision, Part::Projector],
        loss_mode: LossMode::Full,
        memory: Default::default(),
    };
    let per_rank = run_cpu_ranks(nproc, Duration::from_secs(600), |comm, exec| {
        let r = comm.rank();
        let mine = [split_rows(cfg, &batch, r * per..(r + 1) * per)?];
        let alloc = exec.allocator().clone();
        let mut rank = FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            crate::parallel::fsdp::ShardSource::Full(&host),
            settings.clone(),
        )?;
        let (mut times, mut loss, mut peaks, mut allocs0) = (Vec::new(), 0.0, (0, 0), 0);
        for i in 0..b.warmup + b.steps {
            if i == b.warmup {
                allocs0 = alloc.stats().num_device_allocs;
            }
            let t0 = Instant::now();
            let st = rank.step::<A>(&mine, settings.adamw.lr)?;
            if i >= b.warmup {
                times.push(t0.elapsed().as_secs_f64());
                peaks.0 = peaks.0.max(st.memory.max_allocated);
                peaks.1 = peaks.1.max(st.memory.max_reserved);
            }
            loss = st.loss;
        }
        let allocs = alloc.stats().num_device_allocs - allocs0;
        Ok((times, loss, peaks, allocs))
    })?;
    // And after they end: probing between steps would stall every rank's collectives, so
    // the steps are held against the machine's speed just before and just after them.
    let peak_after =
        gemm_peak(&DeviceCtx::cpu(), b.precision, GEMM_PEAK_N, 2).map_err(ModelError::from)?;
    let mut times = per_rank[0].0.clone();
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let model_flops = step_flops(cfg, &batch, &[Part::Text]).total;
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    let max_allocated = per_rank.iter().map(|r| r.2 .0).max().unwrap_or(0);
    let max_reserved = per_rank.iter().map(|r| r.2 .1).max().unwrap_or(0);
    let layout = ParamLayout::new(cfg);
    let trainable_params = layout
        .groups
        .iter()
        .filter(|g| !settings.frozen.contains(&g.part))
        .map(|g| g.len)
        .sum();
    Ok(StepReport {
        precision: b.precision,
        threads: rayon::current_num_threads(),
        nproc,
        batch: b.batch,
        seq: b.seq,
        median_step_s: median,
        min_step_s: times[0],
        tokens_per_s: (b.batch * b.seq) as f64 / median,
        peak_rss_mib: peak_rss_mib(),
        trainable_params,
        loss: per_rank[0].1,
        max_allocated_mib: mib(max_allocated),
        max_reserved_mib: mib(max_reserved),
        model_flops,
        gemm_peak_flops: gemm_peak_flops.max(peak_after),
        // The busiest rank's.
        device_allocs_per_step: per_rank.iter().map(|r| r.3).max().unwrap_or(0) as f64
            / b.steps as f64,
        step_over_floor: Some(median * 0.5 * (gemm_peak_flops + peak_after) / model_flops),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn tiny() -> Mistral3Config {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/reference/mistral3-tiny");
        Mistral3Config::from_file(&p.join("config.json")).unwrap_or_else(|e| {
            panic!(
                "missing {}: the shared fixtures live beside the project ({e})",
                p.display()
            )
        })
    }

    /// Two ranks of one row each run the unsharded bench's steps: the same last loss up to
    /// the order of the f32 gradient sums (the 1 vs N bar of the FSDP tests); each rank holds
    /// half the trainable state and one row's activations, so its peak is lower.
    #[test]
    fn two_ranks_step_like_one() {
        let cfg = tiny();
        let b = StepBench {
            batch: 2,
            seq: 32,
            img: 8,
            steps: 2,
            warmup: 1,
            precision: Precision::F32,
            seed: 1,
        };
        let one = super::super::run(&cfg, &b).unwrap();
        let two = run_sharded(&cfg, &b, 2).unwrap();
        assert!(
            (one.loss - two.loss).abs() <= 1e-5 * one.loss,
            "{} vs {}",
            one.loss,
            two.loss
        );
        assert_eq!((two.nproc, two.trainable_params), (2, one.trainable_params));
        // Gathered groups and reduce-scatter buffers come back from each rank's cache, which
        // the CPU keeps within 1/8 of its high water (`alloc::HOST_RESERVE_SLACK`): a rank's
        // sizes then need a few blocks a step anew (5 here), no more than a handful.
        let slack = 1.0 + 1.0 / cannon_runtime::alloc::HOST_RESERVE_SLACK as f64;
        assert!(two.max_reserved_mib <= slack * two.max_allocated_mib + 1e-9);
        assert!(
            two.device_allocs_per_step <= 8.0,
            "{}",
            two.device_allocs_per_step
        );
        assert!(two.to_json().contains("\"nproc\": 2"));
        // Against the mean of the two probes, which is at most the best one `floor_s` uses.
        let over = two
            .step_over_floor
            .expect("the sharded run probes around its steps");
        let bound = two.median_step_s / two.floor_s() * (1.0 + 1e-12);
        assert!(over > 0.0 && over <= bound, "{over} vs {bound}");
        assert!(two.max_allocated_mib < one.max_allocated_mib);
        let e = run_sharded(&cfg, &b, 3).unwrap_err().to_string();
        assert!(e.contains("--nproc 3"), "{e}");
    }
}
