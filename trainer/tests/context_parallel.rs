//! Context parallelism (Ulysses, Ring, hybrid) equals one rank: loss and every gradient group
//! on the shared tiny fixture and on small random models with images and packed sequences,
//! at lengths that do not divide by the CP layout; the vision tower issues no CP collective;
//! CP composed with FSDP (dp 2 x cp 2 of Ulysses and Ring, dp 2 x hybrid 2 x 2) follows the
//! one-rank run over several steps; and bf16 activations under CP (bars of their own, see
//! `bf16_ulysses_and_ring_equal_one_rank_in_bf16`).
//!
//! Tolerance (f32): relative L2 per gradient group <= 1e-5, loss relative <= 1e-6 (measured:
//! at most 1.2e-6 and 3e-8). A CP rank
//! computes the same per-token arithmetic as one rank, but sums differ in order: weight
//! gradients are a GEMM over each rank's token shard then a sum over ranks instead of one
//! GEMM over all tokens, and Ring attention sums each row's keys block by block and merges
//! them with the log-sum-exp instead of in 64-key tiles. Each such regrouping moves a sum by
//! ~f32 eps (6e-8) times the square root of its terms (<= ~100 here), ~1e-6; the bar leaves
//! a margin while a wrong mask, a missing block or a lost token changes gradients by O(1e-2)
//! or more (checked by `dropping_one_token_is_caught`).

mod common;
#[path = "fsdp_fixture/mod.rs"]
mod fsdp_fixture;

use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_trainer::model::batch::Batch;
use cannon_trainer::model::{
    ActElem, DeviceCtx, MemoryFeatures, Mistral3, Mistral3Config, ModelPass, ParamLayout, Params,
    Part, Recompute,
};
use cannon_trainer::parallel::cp::{CpAlgo, CpGroup, CpSettings};
use cannon_trainer::parallel::fsdp::{run_cpu_ranks, FsdpRank};
use common::shared_path;
use fsdp_fixture::*;
use std::time::Duration;

const ALL: [Part; 3] = [Part::Vision, Part::Projector, Part::Text];
const TIMEOUT: Duration = Duration::from_secs(60);

type HostGrads = Vec<Option<Vec<f32>>>;

fn settings(size: usize, algo: CpAlgo, ulysses_size: usize) -> CpSettings {
    CpSettings {
        size,
        algo,
        ulysses_size,
    }
}

/// The layouts every equivalence test runs: cp 2 and 4 of each algorithm, hybrid 2 x 2.
fn layouts() -> Vec<CpSettings> {
    vec![
        settings(2, CpAlgo::Ulysses, 1),
        settings(4, CpAlgo::Ulysses, 1),
        settings(2, CpAlgo::Ring, 1),
        settings(4, CpAlgo::Ring, 1),
        settings(4, CpAlgo::Hybrid, 2),
    ]
}

/// One rank: mean loss and every gradient group of `batch`.
fn one_rank(cfg: &Mistral3Config, host: &[Vec<f32>], batch: &Batch) -> (f64, HostGrads) {
    one_rank_as::<f32>(cfg, host, batch)
}

/// [`one_rank`] with activations stored as `A` (bf16: the trainer's `train.dtype = bf16`).
fn one_rank_as<A: ActElem>(
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batch: &Batch,
) -> (f64, HostGrads) {
    let exec = DeviceCtx::cpu();
    let params = Params::from_host(&exec, ParamLayout::new(cfg), host).unwrap();
    let mut grads = cannon_trainer::model::Grads::new(&exec, &params.layout, &ALL).unwrap();
    let pass = pass(cfg, &exec, &params, MemoryFeatures::default());
    let acts = pass.forward::<A>(batch).unwrap();
    pass.backward(batch, &acts, &mut grads, None).unwrap();
    (acts.loss(), grads.to_host(exec.stream()).unwrap())
}

fn pass<'a>(
    cfg: &'a Mistral3Config,
    exec: &'a DeviceCtx,
    params: &'a Params,
    memory: MemoryFeatures,
) -> ModelPass<'a> {
    ModelPass {
        cfg,
        exec,
        loss_mode: cannon_trainer::model::LossMode::Full,
        params,
        loss_norm: cannon_kernels::cross_entropy::LossNorm::Mean,
        logits: cannon_trainer::model::Logits::Grad,
        memory,
        cp: None,
    }
}

/// What the CP ranks of one pass report (rank 0's view, the others checked equal).
struct CpRun {
    loss: f64,
    grads: HostGrads,
    /// CP calls during the vision + projector forward and backward, every rank.
    vision_calls: Vec<u64>,
    /// CP calls of the whole pass, every rank.
    all_calls: Vec<u64>,
}

/// `s.size` CP ranks on `batch`: the loss (sums of losses and targets over the group) and
/// the gradients summed over the group.
fn cp_ranks(cfg: &Mistral3Config, host: &[Vec<f32>], batch: &Batch, s: CpSettings) -> CpRun {
    cp_ranks_with(cfg, host, batch, s, MemoryFeatures::default())
}

/// [`cp_ranks`] with recompute and activation offload as `memory` says.
fn cp_ranks_with(
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batch: &Batch,
    s: CpSettings,
    memory: MemoryFeatures,
) -> CpRun {
    cp_ranks_as::<f32>(cfg, host, batch, s, memory)
}

/// [`cp_ranks_with`] with activations stored as `A`.
fn cp_ranks_as<A: ActElem>(
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batch: &Batch,
    s: CpSettings,
    memory: MemoryFeatures,
) -> CpRun {
    let per_rank = run_cpu_ranks(s.size, TIMEOUT, |comm, exec| {
        let exec = match memory.needs_host_pool() {
            true => exec.with_host_pool()?,
            false => exec,
        };
        let st = exec.stream();
        let group = CpGroup::whole(comm, s, st)?;
        let params = Params::from_host(&exec, ParamLayout::new(cfg), host)?;
        let mut grads = cannon_trainer::model::Grads::new(&exec, &params.layout, &ALL)?;
        let pass = ModelPass {
            cp: Some(&group),
            ..pass(cfg, &exec, &params, memory)
        };
        let before = group.calls();
        let acts = pass.forward::<A>(batch)?;
        let vision_bwd = pass
            .backward(batch, &acts, &mut grads, None)?
            .vision_cp_calls;
        let all = group.calls() - before;
        let sums = group.sum(&[acts.head.sum, acts.head.targets as f64], st)?;
        group.all_reduce_grads(&mut grads, st)?;
        let vision = acts.vision_cp_calls + vision_bwd;
        Ok((sums[0] / sums[1], grads.to_host(st)?, vision, all))
    })
    .unwrap();
    let vision_calls = per_rank.iter().map(|r| r.2).collect();
    let all_calls = per_rank.iter().map(|r| r.3).collect();
    let (loss, grads, ..) = per_rank.into_iter().next().unwrap();
    CpRun {
        loss,
        grads,
        vision_calls,
        all_calls,
    }
}

fn rel_l2_f32(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    num.sqrt() / den.sqrt().max(1e-30)
}

/// The largest relative L2 difference over the gradient groups, and the group's index.
fn worst(a: &HostGrads, b: &HostGrads) -> (f64, usize) {
    let mut w = (0.0, 0);
    for (g, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
        assert_eq!(x.len(), y.len());
        let e = rel_l2_f32(x, y);
        if e > w.0 {
            w = (e, g);
        }
    }
    w
}

/// Checks every layout on `batch` against one rank.
fn check_all(what: &str, cfg: &Mistral3Config, host: &[Vec<f32>], batch: &Batch) {
    let (loss1, grads1) = one_rank(cfg, host, batch);
    for s in layouts() {
        let run = cp_ranks(cfg, host, batch, s);
        let dl = (run.loss - loss1).abs() / loss1.abs();
        let (dg, g) = worst(&run.grads, &grads1);
        eprintln!(
            "{what} T={} {} cp={} u={}: loss rel {dl:.1e}, worst grad rel L2 {dg:.1e} (group {g})",
            batch.tokens(),
            s.algo,
            s.size,
            s.ulysses_size
        );
        assert!(dl <= 1e-6, "{what} {s:?}: loss {} vs {loss1}", run.loss);
        assert!(dg <= 1e-5, "{what} {s:?}: group {g} rel L2 {dg:e}");
        assert!(
            run.vision_calls.iter().all(|&n| n == 0),
            "{what} {s:?}: the vision tower issued CP calls {:?}",
            run.vision_calls
        );
        assert!(
            run.all_calls.iter().all(|&n| n > 0),
            "{what} {s:?}: the decoder exchanged nothing {:?}",
            run.all_calls
        );
    }
}

/// `batch` cut to its first `n` tokens (one row): images stay (their tokens are early).
fn truncated(b: &Batch, n: usize) -> Batch {
    let mut b = b.clone();
    assert_eq!(b.rows, 1);
    b.seq = n;
    b.input_ids.truncate(n);
    b.labels.truncate(n);
    b.position_ids.truncate(n);
    b.cu_seqlens.clear();
    b
}

/// The shared tiny Mistral3 (`../shared/reference/mistral3-tiny`): its config, its weights
/// as host groups, and the reference batch.
fn shared_fixture() -> (Mistral3Config, Vec<Vec<f32>>, Batch) {
    let dir = shared_path("reference/mistral3-tiny");
    let model = Mistral3::load(&dir).unwrap();
    let r =
        cannon_trainer::app::verify::Reference::load(&dir.join("reference.safetensors")).unwrap();
    let host = model.params.to_host(model.exec.stream()).unwrap();
    (model.cfg.clone(), host, r.batch().unwrap())
}

#[test]
fn shared_fixture_every_layout_equals_one_rank() {
    let (cfg, host, batch) = shared_fixture();
    check_all("fixture", &cfg, &host, &batch);
}

/// Random model, an image and packed sequences, at 24 tokens and at 23 and 21 (not a
/// multiple of 2 x cp: padding at the end).
#[test]
fn packed_rows_with_images_at_uneven_lengths_equal_one_rank() {
    let cfg = config();
    let host = init(&cfg, 11);
    let mut rng = cannon_runtime::rng::SplitMix64::new(5);
    let packed = micro_batch(&mut rng, true, true);
    assert!(packed.sequence_ends().len() >= 2, "two packed sequences");
    for n in [24, 23, 21] {
        let b = truncated(&packed, n);
        b.check().unwrap();
        check_all("packed", &cfg, &host, &b);
    }
    let plain = micro_batch(&mut rng, false, false);
    check_all("text", &cfg, &host, &truncated(&plain, 19));
}

/// The test can fail: a CP rank that loses its last token (its target ignored) moves the
/// loss and gradients far past the bar.
#[test]
fn dropping_one_token_is_caught() {
    let cfg = config();
    let host = init(&cfg, 11);
    let mut rng = cannon_runtime::rng::SplitMix64::new(5);
    let b = micro_batch(&mut rng, true, true);
    let (loss1, grads1) = one_rank(&cfg, &host, &b);
    let mut cut = b.clone();
    let last = cut.labels.len() - 1;
    cut.labels[last] = IGNORE_INDEX;
    let run = cp_ranks(&cfg, &host, &cut, settings(2, CpAlgo::Ring, 1));
    let (dg, _) = worst(&run.grads, &grads1);
    assert!(
        (run.loss - loss1).abs() / loss1 > 1e-4 || dg > 1e-3,
        "a dropped token went unnoticed: {dg:e}"
    );
}

#[test]
fn head_counts_the_layout_cannot_split_are_errors_naming_the_key() {
    let cfg = config(); // 4 q heads, 2 kv heads
    let e = settings(8, CpAlgo::Ulysses, 1)
        .check(
            cfg.text_config.num_attention_heads,
            cfg.text_config.num_key_value_heads,
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("parallel.cp_size") && e.contains("4 query heads"),
        "{e}"
    );
    let e = settings(6, CpAlgo::Hybrid, 4)
        .check(
            cfg.text_config.num_attention_heads,
            cfg.text_config.num_key_value_heads,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("parallel.ulysses_size"), "{e}");
    // Ring splits tokens, not heads: any size goes.
    settings(8, CpAlgo::Ring, 1)
        .check(
            cfg.text_config.num_attention_heads,
            cfg.text_config.num_key_value_heads,
        )
        .unwrap();
    // Ulysses over 4 with 2 kv heads repeats each kv head twice.
    settings(4, CpAlgo::Ulysses, 1)
        .check(
            cfg.text_config.num_attention_heads,
            cfg.text_config.num_key_value_heads,
        )
        .unwrap();
}

/// dp 2 x cp 2 (Ulysses, Ring) with FSDP over the 4 ranks, and dp 2 x hybrid 2 x 2 over 8,
/// follow the one-rank run: 4 steps of a global batch of 4 micro batches (2 per replica),
/// losses within 1e-5 normalised difference and final parameters within 1e-5 relative L2
/// (the FSDP test's bars: AdamW's normalisation amplifies gradient rounding little over a
/// few steps).
#[test]
fn fsdp_dp2_cp_equals_one_rank() {
    let cfg = config();
    let host = init(&cfg, 3);
    let batches = global_batch(4, 9);
    let s = fsdp_fixture::settings(&[]);
    let steps = 4;
    let (ref_losses, _, ref_params) = run_unsharded(&cfg, &host, &batches, &s, steps);
    for cp in [
        settings(2, CpAlgo::Ulysses, 1),
        settings(2, CpAlgo::Ring, 1),
        settings(4, CpAlgo::Hybrid, 2),
    ] {
        let out = dp2_cp_run(&cfg, &host, &batches, &s, cp, steps);
        for (losses, params) in &out {
            let dl = loss_diff(losses, &ref_losses);
            let dp = rel_l2(params, &ref_params);
            eprintln!(
                "fsdp dp 2 x cp {} {}: loss diff {dl:.1e}, params rel L2 {dp:.1e}",
                cp.size, cp.algo
            );
            assert!(dl <= 1e-5, "{:?}: loss diff {dl:e}", cp.algo);
            assert!(dp <= 1e-5, "{:?}: params rel L2 {dp:e}", cp.algo);
        }
    }
}

/// `steps` FSDP steps of dp 2 x `cp` (`2 * cp.size` CPU ranks, replica r taking micro
/// batches r, r + 2, ...): every rank's losses and final full parameters.
fn dp2_cp_run(
    cfg: &Mistral3Config,
    host: &[Vec<f32>],
    batches: &[Batch],
    s: &cannon_trainer::parallel::fsdp::FsdpSettings,
    cp: CpSettings,
    steps: usize,
) -> Vec<(Vec<f64>, Vec<Vec<f32>>)> {
    run_cpu_ranks(2 * cp.size, TIMEOUT, |comm, exec| {
        let rank = FsdpRank::new(
            comm,
            exec,
            cfg.clone(),
            cannon_trainer::parallel::fsdp::ShardSource::Full(host),
            s.clone(),
        )?;
        let mut rank = rank.with_cp(cp)?;
        let (replica, replicas) = rank.data_parallel();
        assert_eq!(replicas, 2);
        let mine: Vec<Batch> = batches
            .iter()
            .skip(replica)
            .step_by(replicas)
            .cloned()
            .collect();
        let mut losses = Vec::new();
        for _ in 0..steps {
            losses.push(rank.step::<f32>(&mine, s.adamw.lr)?.loss);
        }
        let full = rank.gather_full_params()?;
        Ok((losses, full.to_host(rank.exec().stream())?))
    })
    .unwrap()
}

/// Every memory feature at once (full recompute, chunked loss, activation and optimizer
/// offload) on FSDP dp 2 x CP 2 of each algo follows the same layout with none over 4 steps.
/// Recompute and both offloads are bit-identical on their own (tests above and in
/// memory_features); the chunked loss regroups the loss's f32 sums, so the bar is float
/// rounding: 1e-6 on the losses and on the final parameters' relative L2.
#[test]
fn every_memory_feature_with_fsdp_and_cp_follows_the_plain_run() {
    let cfg = config();
    let host = init(&cfg, 3);
    let batches = global_batch(4, 9);
    let plain = fsdp_fixture::settings(&[]);
    let mut all = plain.clone();
    all.loss_mode = cannon_trainer::model::LossMode::Chunked(5);
    all.memory = MemoryFeatures {
        recompute: Recompute::Full,
        offload_activations: true,
        offload_optimizer: true,
    };
    for cp in [
        settings(2, CpAlgo::Ulysses, 1),
        settings(2, CpAlgo::Ring, 1),
    ] {
        let want = dp2_cp_run(&cfg, &host, &batches, &plain, cp, 4);
        let got = dp2_cp_run(&cfg, &host, &batches, &all, cp, 4);
        for ((gl, gp), (wl, wp)) in got.iter().zip(&want) {
            let dl = loss_diff(gl, wl);
            let dp = rel_l2(gp, wp);
            eprintln!(
                "dp 2 x cp 2 {} with every memory feature: loss diff {dl:.1e}, params {dp:.1e}",
                cp.algo
            );
            assert!(dl <= 1e-6, "{:?}: loss diff {dl:e}", cp.algo);
            assert!(dp <= 1e-6, "{:?}: params rel L2 {dp:e}", cp.algo);
        }
    }
}

fn config_err(sets: &[&str]) -> String {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    match cannon_trainer::train::config::TrainConfig::load(None, &sets) {
        Ok(c) => panic!("accepted {sets:?}: {:?}", c.parallel),
        Err(e) => e.to_string(),
    }
}

/// The `[parallel]` CP and EP keys: defaults, what each layout gives, and errors that name
/// the key and say why.
#[test]
fn parallel_config_keys() {
    use cannon_trainer::train::config::TrainConfig;
    let c = TrainConfig::load(None, &[]).unwrap();
    assert_eq!(c.parallel.cp(), CpSettings::default());
    assert_eq!(c.parallel.ep_size, 1);
    let sets = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let c = TrainConfig::load(
        None,
        &sets(&[
            "parallel.nproc=8",
            "parallel.cp_size=4",
            "parallel.cp_algo=\"hybrid\"",
            "parallel.ulysses_size=2",
        ]),
    )
    .unwrap();
    assert_eq!(c.parallel.cp(), settings(4, CpAlgo::Hybrid, 2));
    assert_eq!(c.parallel.cp().degrees(), (2, 2));
    // The effective config round-trips (it is saved with checkpoints).
    let text = toml::to_string(&c).unwrap();
    assert_eq!(TrainConfig::from_toml(&text).unwrap(), c);

    let e = config_err(&["parallel.nproc=6", "parallel.cp_size=4"]);
    assert!(
        e.contains("parallel.cp_size") && e.contains("nproc = 6"),
        "{e}"
    );
    let e = config_err(&["parallel.ep_size=2"]);
    assert!(e.contains("parallel.ep_size") && e.contains("dense"), "{e}");
    let e = config_err(&[
        "parallel.nproc=4",
        "parallel.cp_size=4",
        "parallel.cp_algo=\"hybrid\"",
    ]);
    assert!(e.contains("parallel.ulysses_size"), "{e}");
    let e = config_err(&[
        "parallel.nproc=4",
        "parallel.cp_size=4",
        "parallel.cp_algo=\"hybrid\"",
        "parallel.ulysses_size=3",
    ]);
    assert!(e.contains("must divide parallel.cp_size = 4"), "{e}");
    let e = config_err(&["parallel.ulysses_size=2"]);
    assert!(e.contains("only cp_algo = hybrid"), "{e}");
    let e = config_err(&["parallel.cp_algo=\"tree\""]);
    assert!(e.contains("cp_algo"), "{e}");
    let e = config_err(&["parallel.cp_size=0"]);
    assert!(e.contains("parallel.cp_size"), "{e}");
}

/// Recompute and activation offload on CP ranks: a recomputed layer runs its forward again,
/// exchanges included, in the same order on every rank, on the same inputs, so loss and
/// gradients are bit-identical to keeping everything (tolerance 0: no sum is regrouped), and
/// the full recompute issues one more forward's exchanges per layer.
#[test]
fn recompute_and_offload_under_cp_are_bit_identical() {
    let (cfg, host, batch) = shared_fixture();
    let cfg = &cfg;
    let memory = |recompute, offload_activations| MemoryFeatures {
        recompute,
        offload_activations,
        offload_optimizer: false,
    };
    for s in [
        settings(2, CpAlgo::Ulysses, 1),
        settings(2, CpAlgo::Ring, 1),
        settings(4, CpAlgo::Hybrid, 2),
    ] {
        let plain = cp_ranks(cfg, &host, &batch, s);
        for (recompute, offload) in [
            (Recompute::Selective, false),
            (Recompute::None, true),
            (Recompute::Full, true),
        ] {
            let run = cp_ranks_with(cfg, &host, &batch, s, memory(recompute, offload));
            let what = format!("{s:?} {recompute:?} offload {offload}");
            assert_eq!(run.loss.to_bits(), plain.loss.to_bits(), "{what}: loss");
            assert_eq!(run.grads, plain.grads, "{what}: gradients");
            let first = run.all_calls[0];
            assert!(
                run.all_calls.iter().all(|&n| n == first),
                "{what}: {:?}",
                run.all_calls
            );
            match recompute {
                Recompute::Full => assert!(first > plain.all_calls[0], "{what}: no re-exchange"),
                _ => assert_eq!(first, plain.all_calls[0], "{what}: exchanges"),
            }
        }
    }
}

/// `(part, tensor name, relative L2 of a against b)` of every parameter tensor's gradient.
fn per_tensor(layout: &ParamLayout, a: &HostGrads, b: &HostGrads) -> Vec<(Part, String, f64)> {
    let mut out = Vec::new();
    for (g, group) in layout.groups.iter().enumerate() {
        let (x, y) = (a[g].as_ref().unwrap(), b[g].as_ref().unwrap());
        for slot in &group.slots {
            let n: usize = slot.shape.iter().product();
            let r = slot.offset..slot.offset + n;
            let e = rel_l2_f32(&x[r.clone()], &y[r]);
            out.push((group.part, format!("group {g} {}", slot.name), e));
        }
    }
    out
}

/// The largest of `errs` in each part, with the tensor's name.
fn worst_per_part(errs: &[(Part, String, f64)]) -> Vec<(Part, String, f64)> {
    ALL.iter()
        .filter_map(|&p| {
            errs.iter()
                .filter(|e| e.0 == p)
                .max_by(|a, b| a.2.total_cmp(&b.2))
                .cloned()
        })
        .collect()
}

/// bf16 activations under CP (`train.dtype = bf16`): Ulysses 2 and Ring 2 against one rank,
/// both in bf16, on the shared fixture and on packed rows with an image at 23 tokens.
/// Bars per tensor (each parameter tensor's gradient, relative L2) and for the loss,
/// set from what this test measured (AMD EPYC, 2 cores; it prints every figure):
///
/// - Ulysses: the all-to-all moves stored values and computes nothing, so every bf16
///   rounding sees the same f32 value as on one rank; what differs is the order of f32 sums
///   (weight gradients over each rank's tokens, then over ranks), as in f32. The f32 bars
///   hold: loss 1e-6, every tensor 1e-5 (measured: loss 0, tensors at most 2.7e-7).
/// - Ring: the attention output is merged block by block with the log-sum-exp in f32 and
///   stored in bf16 once, as one rank stores its kernel's f32 output; the two f32 values
///   differ by f32 rounding (~1e-7), and where one lies next to a bf16 rounding boundary
///   the stored values differ by one bf16 ulp (2^-8 relative). The same happens to the
///   attention gradients (f32 per block, stored in bf16), and those one-ulp flips reach
///   every gradient upstream. Bars: loss 1e-4 (measured 2.6e-5), decoder and embedding
///   tensors 1e-2 (measured 3.7e-3), projector and vision tensors 2e-2 (measured 7.9e-3:
///   their gradient comes through the image features' gradient, whose rows partly cancel,
///   so the same absolute flips are larger relative ones); a margin of 2.5x or more.
///
/// For scale the test prints one rank in bf16 against f32: loss 1.8e-4, tensors up to
/// 2.2e-2 (decoder), 2.4e-2 (vision), 3.8e-2 (projector): Ring's difference under bf16 is
/// well below what bf16 itself costs, while a lost token or block moves gradients by
/// O(1e-1) (`dropping_one_token_is_caught`).
#[test]
fn bf16_ulysses_and_ring_equal_one_rank_in_bf16() {
    use half::bf16;
    let fixture = shared_fixture();
    let cfg = config();
    let mut rng = cannon_runtime::rng::SplitMix64::new(5);
    let packed = (
        cfg.clone(),
        init(&cfg, 11),
        truncated(&micro_batch(&mut rng, true, true), 23),
    );
    // (loss, decoder and embedding tensors, projector and vision tensors)
    let bars = |algo| match algo {
        CpAlgo::Ring => (1e-4, 1e-2, 2e-2),
        _ => (1e-6, 1e-5, 1e-5),
    };
    for (what, (cfg, host, batch)) in [("fixture", fixture), ("packed 23", packed)] {
        let layout = ParamLayout::new(&cfg);
        let (loss1, grads1) = one_rank_as::<bf16>(&cfg, &host, &batch);
        let (loss32, grads32) = one_rank(&cfg, &host, &batch);
        let scale = worst_per_part(&per_tensor(&layout, &grads1, &grads32));
        eprintln!(
            "{what}: one rank bf16 vs f32: loss rel {:.1e}, worst per part {scale:?}",
            (loss1 - loss32).abs() / loss32.abs()
        );
        for s in [
            settings(2, CpAlgo::Ulysses, 1),
            settings(2, CpAlgo::Ring, 1),
        ] {
            let run = cp_ranks_as::<bf16>(&cfg, &host, &batch, s, MemoryFeatures::default());
            let dl = (run.loss - loss1).abs() / loss1.abs();
            let errs = per_tensor(&layout, &run.grads, &grads1);
            eprintln!(
                "{what} bf16 {} cp 2: loss rel {dl:.1e}, worst per part {:?}",
                s.algo,
                worst_per_part(&errs)
            );
            let (loss_bar, text_bar, image_bar) = bars(s.algo);
            assert!(dl <= loss_bar, "{what} {s:?}: loss {} vs {loss1}", run.loss);
            for (part, name, e) in &errs {
                let bar = match part {
                    Part::Text => text_bar,
                    Part::Projector | Part::Vision => image_bar,
                };
                assert!(*e <= bar, "{what} {s:?}: {name} rel L2 {e:e}");
            }
        }
    }
}
