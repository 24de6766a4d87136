//! The memory features against the plain step: chunked loss within 1e-6 of the full loss;
//! recompute (full, selective), activation offload and optimizer offload bit for bit equal
//! to keeping everything on the device, with lower allocator figures; the same with FSDP
//! ranks; and the plan's formulas equal to the measured peak in every combination.
//!
//! The model is the FSDP fixture's tiny Mistral3 with four decoder layers (with two, the
//! offloaded layer's reload overlaps the last layer's backward and the peak cannot fall).

mod fsdp_fixture;
use fsdp_fixture as fx;

use cannon_runtime::{CachingAllocator, Stream};
use cannon_trainer::model::batch::Batch;
use cannon_trainer::model::memory::{plan_with, StepFeatures, StepShape};
use cannon_trainer::model::offload::Stored;
use cannon_trainer::model::optim::{clip_grad_norm, AdamW};
use cannon_trainer::model::{
    ActElem, DeviceCtx, Grads, LossMode, MemoryFeatures, Mistral3, Mistral3Config, ParamLayout,
    Params, Part, Recompute,
};
use cannon_trainer::parallel::fsdp::FsdpSettings;
use std::sync::Arc;

const ALL: [Part; 3] = [Part::Vision, Part::Projector, Part::Text];

fn config() -> Mistral3Config {
    let mut cfg = fx::config();
    cfg.text_config.num_hidden_layers = 4;
    cfg
}

/// A private allocator (the figures are this model's alone) with a host pool.
fn exec() -> DeviceCtx {
    DeviceCtx::with_allocator(Arc::new(Stream::cpu()), CachingAllocator::new_cpu())
        .unwrap()
        .with_host_pool()
        .unwrap()
}

fn model(cfg: &Mistral3Config, memory: MemoryFeatures, loss_mode: LossMode) -> Mistral3 {
    let exec = exec();
    let host = fx::init(cfg, 7);
    let params = Params::from_host(&exec, ParamLayout::new(cfg), &host).unwrap();
    Mistral3 {
        cfg: cfg.clone(),
        params,
        loss_mode,
        memory,
        exec,
    }
}

/// Two rows: one with an image, one packed without.
fn batch() -> Batch {
    let mut rng = cannon_runtime::rng::SplitMix64::new(3);
    let a = fx::micro_batch(&mut rng, true, false);
    let b = fx::micro_batch(&mut rng, false, true);
    let cat = |x: &[u32], y: &[u32]| [x, y].concat();
    Batch {
        rows: 2,
        seq: fx::SEQ,
        input_ids: cat(&a.input_ids, &b.input_ids),
        labels: [a.labels.as_slice(), &b.labels].concat(),
        position_ids: cat(&a.positions(), &b.positions()),
        images: a.images,
        ..Batch::default()
    }
}

fn features(recompute: Recompute, offload: bool) -> MemoryFeatures {
    MemoryFeatures {
        recompute,
        offload_activations: offload,
        offload_optimizer: false,
    }
}

/// Loss, every gradient group on the host, and the measured step (after a warm-up step).
fn step<A: ActElem>(m: &Mistral3, b: &Batch) -> (f64, Vec<Option<Vec<f32>>>, usize) {
    let mut grads = m.grads(&ALL).unwrap();
    m.measure_step::<A>(b, &mut grads, None).unwrap();
    grads.zero(m.exec.stream()).unwrap();
    let (loss, mem) = m.measure_step::<A>(b, &mut grads, None).unwrap();
    let host = host_grads(&grads, &m.exec);
    (loss, host, mem.max_allocated - mem.start_allocated)
}

fn host_grads(g: &Grads, exec: &DeviceCtx) -> Vec<Option<Vec<f32>>> {
    g.data
        .iter()
        .map(|t| t.as_ref().map(|t| t.to_host(exec.stream()).unwrap()))
        .collect()
}

fn bits(v: &[Option<Vec<f32>>]) -> Vec<Option<Vec<u32>>> {
    v.iter()
        .map(|g| g.as_ref().map(|g| g.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

#[test]
fn recompute_and_offload_give_bit_identical_gradients_and_lower_peaks() {
    let cfg = config();
    let b = batch();
    let plain = model(&cfg, MemoryFeatures::default(), LossMode::Full);
    let (loss0, g0, peak0) = step::<f32>(&plain, &b);
    let (loss0h, g0h, _) = step::<half::bf16>(&plain, &b);
    let mut peaks = Vec::new();
    for r in [Recompute::None, Recompute::Selective, Recompute::Full] {
        for offload in [false, true] {
            let what = format!("{r:?}, offload {offload}");
            let m = model(&cfg, features(r, offload), LossMode::Full);
            let (loss, g, peak) = step::<f32>(&m, &b);
            assert_eq!(loss.to_bits(), loss0.to_bits(), "{what}: loss");
            assert!(bits(&g) == bits(&g0), "{what}: f32 gradients differ");
            let (lossh, gh, _) = step::<half::bf16>(&m, &b);
            assert_eq!(lossh.to_bits(), loss0h.to_bits(), "{what}: bf16 loss");
            assert!(bits(&gh) == bits(&g0h), "{what}: bf16 gradients differ");
            peaks.push((what, peak));
        }
    }
    eprintln!("plain peak {peak0}: {peaks:?}");
    for (what, peak) in &peaks[1..] {
        assert!(*peak < peak0, "{what}: peak {peak} not below {peak0}");
    }
    // Keeping less saves more: selective < none, full < selective (with or without offload).
    assert!(
        peaks[2].1 < peaks[0].1 && peaks[4].1 < peaks[2].1,
        "{peaks:?}"
    );
    assert!(
        peaks[3].1 < peaks[1].1 && peaks[5].1 < peaks[3].1,
        "{peaks:?}"
    );
}

/// The plan's formulas for every combination equal the allocator's peak to the byte, and
/// the host pool holds what the plan says was offloaded.
#[test]
fn plan_equals_the_measured_peak_with_every_feature() {
    let cfg = config();
    let b = batch();
    for chunk in [LossMode::Full, LossMode::Chunked(5)] {
        for r in [Recompute::None, Recompute::Selective, Recompute::Full] {
            for offload in [false, true] {
                let mem = features(r, offload);
                let m = model(&cfg, mem, chunk);
                for trainable in [&ALL[..], &[Part::Text]] {
                    let what = format!("{chunk:?} {r:?} offload {offload} {trainable:?}");
                    let mut grads = m.grads(trainable).unwrap();
                    m.measure_step::<f32>(&b, &mut grads, None).unwrap();
                    let (_, got) = m.measure_step::<f32>(&b, &mut grads, None).unwrap();
                    let shape = StepShape::of(&cfg, &b, m.exec.device()).unwrap();
                    let feat = StepFeatures::from(mem);
                    let p = plan_with(
                        &cfg,
                        &shape,
                        f32::PRECISION,
                        chunk,
                        trainable,
                        false,
                        &feat,
                        &|_| 0,
                    );
                    assert_eq!(
                        got.max_allocated - got.start_allocated,
                        p.peak(),
                        "{what}: measured vs the plan (peak phase {}): {p:#?}",
                        p.peak_phase()
                    );
                    let host = m.exec.host_pool().unwrap().stats();
                    assert_eq!(host.allocated, 0, "{what}: the host pool kept blocks");
                    assert_eq!(
                        host.peak_allocated, p.host_activations,
                        "{what}: host bytes"
                    );
                    m.exec.host_pool().unwrap().allocator().reset_peak();
                }
            }
        }
    }
}

/// Chunked loss vs the full logits: the chunks change only the order of f32 sums (the lm_head
/// weight gradient is accumulated chunk by chunk, the log-sum-exp per row is the same), so
/// loss and gradients agree to f32 rounding of those sums; the bar 1e-6 (relative: the loss
/// against itself, each gradient group in L2 against its own norm) is about 10 ulps.
#[test]
fn chunked_loss_matches_the_full_loss_within_1e_6() {
    let cfg = config();
    let b = batch();
    let full = model(&cfg, MemoryFeatures::default(), LossMode::Full);
    let (loss, g, _) = step::<f32>(&full, &b);
    for rows in [1, 5, 16, 1000] {
        let m = model(&cfg, MemoryFeatures::default(), LossMode::Chunked(rows));
        let (lc, gc, _) = step::<f32>(&m, &b);
        let rel = (lc - loss).abs() / loss.abs();
        assert!(rel <= 1e-6, "chunk {rows}: loss {lc} vs {loss} ({rel:.2e})");
        for (i, (a, r)) in gc.iter().zip(&g).enumerate() {
            let (Some(a), Some(r)) = (a, r) else {
                assert_eq!(a.is_some(), r.is_some());
                continue;
            };
            let e = fx::rel_l2(std::slice::from_ref(a), std::slice::from_ref(r));
            assert!(e <= 1e-6, "chunk {rows}, group {i}: relative L2 {e:.2e}");
        }
    }
}

/// Bytes of one block per tensor of these lengths (f32), as the caching allocators round them.
fn f32_blocks(lens: impl Iterator<Item = usize>) -> usize {
    lens.map(|n| cannon_runtime::alloc::round_size(4 * n)).sum()
}

/// Master weights and moments in the host pool, streamed per group: the same losses and
/// parameters bit for bit over four AdamW steps (f32 and bf16 activations); every group is
/// in the host pool and its bytes left the device (resident bytes fall by exactly the
/// masters' and moments' blocks, which the pool holds); and the step's `max_allocated`
/// (forward, backward, clip, update) falls by at least the master weights' bytes.
#[test]
fn optimizer_offload_is_bit_identical_and_moves_masters_and_moments_off_the_device() {
    let cfg = config();
    let b = batch();
    let layout = ParamLayout::new(&cfg);
    let masters = f32_blocks(layout.groups.iter().map(|g| g.len));
    let run = |offload: bool, bf16: bool| {
        let mut m = model(&cfg, MemoryFeatures::default(), LossMode::Full);
        let mut grads = m.grads(&ALL).unwrap();
        let before = m.exec.memory().allocated;
        let mut opt = AdamW::new(&m.exec, Default::default(), &grads).unwrap();
        if offload {
            let exec = m.exec.clone();
            opt.offload(&exec, &mut m.params).unwrap();
            assert!(
                m.params.data.iter().all(Stored::is_host),
                "a group on the device"
            );
            let moments = opt.m.iter().chain(&opt.v).flatten();
            assert!(
                moments.clone().all(Stored::is_host),
                "a moment on the device"
            );
        }
        // Device bytes held across steps besides the gradients (which stay).
        let resident = m.exec.memory().allocated + masters - before;
        let host = m.exec.host_pool().unwrap().stats().allocated;
        let exec = m.exec.clone();
        let st = exec.stream();
        let (mut losses, mut peak) = (Vec::new(), 0);
        for _ in 0..4 {
            exec.allocator().reset_peak();
            grads.zero(st).unwrap();
            let loss = if bf16 {
                let acts = m.forward::<half::bf16>(&b).unwrap();
                m.backward(&b, &acts, &mut grads, None).unwrap();
                acts.loss()
            } else {
                let acts = m.forward::<f32>(&b).unwrap();
                m.backward(&b, &acts, &mut grads, None).unwrap();
                acts.loss()
            };
            losses.push(loss.to_bits());
            clip_grad_norm(st, &mut grads, 1.0).unwrap();
            opt.update(st, &mut m.params, &grads, 1e-2).unwrap();
            peak = peak.max(exec.allocator().stats().peak_allocated);
        }
        let moments: Vec<Vec<u32>> = opt
            .m
            .iter()
            .chain(&opt.v)
            .flatten()
            .map(|t| t.to_host(st).unwrap().iter().map(|x| x.to_bits()).collect())
            .collect();
        let params = m.params.to_host(st).unwrap();
        let params: Vec<u32> = params.iter().flatten().map(|x| x.to_bits()).collect();
        (losses, params, moments, resident, host, peak)
    };
    for bf16 in [false, true] {
        let (l0, p0, m0, dev0, host0, peak0) = run(false, bf16);
        let (l1, p1, m1, dev1, host1, peak1) = run(true, bf16);
        assert_eq!(l1, l0, "bf16 {bf16}: losses differ");
        assert!(
            p1 == p0,
            "bf16 {bf16}: the offloaded optimizer's parameters differ"
        );
        assert!(
            m1 == m0,
            "bf16 {bf16}: the offloaded optimizer's moments differ"
        );
        assert_eq!(host0, 0);
        // Masters (every group) and moments (every group trains here) were resident.
        assert_eq!(dev0, 3 * masters, "bf16 {bf16}: plain resident");
        assert_eq!(
            dev1, 0,
            "bf16 {bf16}: masters or moments left on the device"
        );
        assert_eq!(host1, 3 * masters, "bf16 {bf16}: the host pool's bytes");
        eprintln!(
            "bf16 {bf16}: max_allocated {peak0} B -> {peak1} B (masters {masters} B, \
             moments {} B)",
            2 * masters
        );
        assert!(
            peak0 - peak1 >= masters,
            "bf16 {bf16}: max_allocated fell by {} B, the masters are {masters} B",
            peak0 - peak1
        );
    }
}

/// With the master weights in the host pool, the forward + backward's peak is the plan's to
/// the byte: the model's terms plus, at each group's step, that group copied in and the next
/// one ahead (`plan::gathered` over one rank, as for an FSDP rank's gathered groups without
/// full gradients); the pool holds exactly the masters' blocks after the step.
#[test]
fn plan_equals_the_measured_peak_with_the_masters_on_the_host() {
    use cannon_trainer::model::source::PlanInputs;
    use cannon_trainer::model::GroupOrder;
    use cannon_trainer::parallel::fsdp::ShardLayout;
    let cfg = config();
    let b = batch();
    let layout = ParamLayout::new(&cfg);
    let masters = f32_blocks(layout.groups.iter().map(|g| g.len));
    let one = ShardLayout::new(&layout, 1);
    for chunk in [LossMode::Full, LossMode::Chunked(5)] {
        for (r, offload) in [
            (Recompute::None, false),
            (Recompute::Selective, true),
            (Recompute::Full, false),
        ] {
            let mem = features(r, offload);
            let mut m = model(&cfg, mem, chunk);
            let exec = m.exec.clone();
            m.params.offload(&exec).unwrap();
            for trainable in [&ALL[..], &[Part::Text]] {
                let what = format!("{chunk:?} {r:?} offload activations {offload} {trainable:?}");
                let mut grads = m.grads(trainable).unwrap();
                m.measure_step::<f32>(&b, &mut grads, None).unwrap();
                let (_, got) = m.measure_step::<f32>(&b, &mut grads, None).unwrap();
                let trains = |g: usize| trainable.contains(&layout.groups[g].part);
                let inputs = PlanInputs {
                    trains: &trains,
                    images: true,
                    dpixels: false,
                };
                let pass = GroupOrder::new(&cfg, &layout, inputs);
                let shape = StepShape::of(&cfg, &b, m.exec.device()).unwrap();
                let fetched = |at| cannon_trainer::app::plan::gathered(&pass, &one, at, 4, None);
                let p = plan_with(
                    &cfg,
                    &shape,
                    f32::PRECISION,
                    chunk,
                    trainable,
                    false,
                    &StepFeatures::from(mem),
                    &fetched,
                );
                assert_eq!(
                    got.max_allocated - got.start_allocated,
                    p.peak(),
                    "{what}: measured vs the plan (peak phase {}): {p:#?}",
                    p.peak_phase()
                );
                let host = m.exec.host_pool().unwrap().stats();
                assert_eq!(
                    host.allocated, masters,
                    "{what}: the pool holds the masters"
                );
            }
        }
    }
}

/// FSDP ranks with the master weights and moments in the host pool: losses, final
/// parameters and every rank's saved state (masters and moments) bit for bit those of the
/// ranks without the offload over four steps, and each rank's resident bytes fall by
/// exactly its shards' blocks less the staging buffer.
#[test]
fn fsdp_optimizer_offload_is_bit_identical_and_moves_the_shards_off_the_device() {
    use cannon_trainer::parallel::fsdp::ShardLayout;
    let cfg = config();
    let host = fx::init(&cfg, 13);
    let batches = fx::global_batch(4, 6);
    let base: FsdpSettings = fx::settings(&[Part::Vision]);
    let plain = fx::run_sharded::<f32>(2, &cfg, &host, &batches, &base, 4);
    let s = FsdpSettings {
        memory: MemoryFeatures {
            offload_optimizer: true,
            ..MemoryFeatures::default()
        },
        ..base.clone()
    };
    let on = fx::run_sharded::<f32>(2, &cfg, &host, &batches, &s, 4);
    let losses =
        |run: &fx::Run| -> Vec<u64> { run.stats.iter().map(|s| s.loss.to_bits()).collect() };
    assert_eq!(losses(&on), losses(&plain), "losses");
    let bits = |v: &[Vec<f32>]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
    assert!(bits(&on.params) == bits(&plain.params), "parameters differ");
    assert!(
        on.states == plain.states,
        "shard states (masters, moments) differ"
    );
    let layout = ParamLayout::new(&cfg);
    let cut = ShardLayout::new(&layout, 2);
    let trained = |g: usize| layout.groups[g].part != Part::Vision;
    let shards = f32_blocks(cut.groups.iter().map(|c| c.shard));
    let moments = 2 * f32_blocks(
        (0..cut.groups.len())
            .filter(|&g| trained(g))
            .map(|g| cut.groups[g].shard),
    );
    let staging = f32_blocks(cut.groups.iter().map(|c| c.shard).max().into_iter());
    for rank in 0..2 {
        assert_eq!(
            plain.resident[rank] - on.resident[rank],
            shards + moments - staging,
            "rank {rank}: resident {} vs {}",
            on.resident[rank],
            plain.resident[rank]
        );
        assert!(on.peak[rank] < plain.peak[rank], "rank {rank}: peak");
    }
}

/// FSDP ranks with every bit-exact feature on (recompute, both offloads) train like FSDP
/// ranks without, bit for bit, with less resident memory (moments on the host) and lower
/// peaks (activations).
#[test]
fn fsdp_ranks_with_the_memory_features_train_bit_for_bit_alike() {
    let cfg = config();
    let host = fx::init(&cfg, 11);
    let batches = fx::global_batch(4, 5);
    let base: FsdpSettings = fx::settings(&[]);
    let plain = fx::run_sharded::<f32>(2, &cfg, &host, &batches, &base, 3);
    for r in [Recompute::Selective, Recompute::Full] {
        let s = FsdpSettings {
            memory: MemoryFeatures {
                recompute: r,
                offload_activations: true,
                offload_optimizer: true,
            },
            ..base.clone()
        };
        let on = fx::run_sharded::<f32>(2, &cfg, &host, &batches, &s, 3);
        let losses =
            |run: &fx::Run| -> Vec<u64> { run.stats.iter().map(|s| s.loss.to_bits()).collect() };
        assert_eq!(losses(&on), losses(&plain), "{r:?}: losses");
        let eq = on
            .params
            .iter()
            .flatten()
            .zip(plain.params.iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(eq, "{r:?}: parameters differ");
        for rank in 0..2 {
            assert!(
                on.resident[rank] < plain.resident[rank],
                "{r:?} rank {rank}: resident {} vs {}",
                on.resident[rank],
                plain.resident[rank]
            );
            assert!(
                on.peak[rank] < plain.peak[rank],
                "{r:?} rank {rank}: peak {} vs {}",
                on.peak[rank],
                plain.peak[rank]
            );
        }
    }
}

/// Offload needs the exec's host pool: without one the forward says so.
#[test]
fn offload_without_a_host_pool_is_an_error() {
    let cfg = config();
    let exec =
        DeviceCtx::with_allocator(Arc::new(Stream::cpu()), CachingAllocator::new_cpu()).unwrap();
    let host = fx::init(&cfg, 7);
    let params = Params::from_host(&exec, ParamLayout::new(&cfg), &host).unwrap();
    let m = Mistral3 {
        cfg: cfg.clone(),
        params,
        loss_mode: LossMode::Full,
        memory: features(Recompute::None, true),
        exec,
    };
    let err = m.forward::<f32>(&batch()).unwrap_err().to_string();
    assert!(err.contains("host pool"), "{err}");
}

/// `[train]`'s keys reach the model: loss_chunk 0 is the full loss, N > 0 chunks of N; the
/// recompute names and the offload flags map one to one; a bad value names its key.
#[test]
fn train_keys_select_the_features() {
    use cannon_trainer::train::config::TrainConfig;
    use cannon_trainer::train::memory_features;
    let cfg = TrainConfig::load(None, &[]).unwrap();
    assert_eq!(
        memory_features(&cfg.train),
        (LossMode::Full, MemoryFeatures::default())
    );
    let sets = [
        "train.loss_chunk=128",
        "train.recompute=selective",
        "train.offload_activations=true",
        "train.offload_optimizer=true",
    ]
    .map(String::from);
    let cfg = TrainConfig::load(None, &sets).unwrap();
    let want = MemoryFeatures {
        recompute: Recompute::Selective,
        offload_activations: true,
        offload_optimizer: true,
    };
    assert_eq!(memory_features(&cfg.train), (LossMode::Chunked(128), want));
    let full = TrainConfig::load(None, &["train.recompute=full".into()]).unwrap();
    assert_eq!(memory_features(&full.train).1.recompute, Recompute::Full);
    let err = TrainConfig::load(None, &["train.recompute=partial".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.recompute"), "{err}");
    let err = TrainConfig::load(None, &["train.loss_chunk=-1".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("train.loss_chunk"), "{err}");
}
