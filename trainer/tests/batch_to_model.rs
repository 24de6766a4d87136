//! The data loader's batch is the model's batch: a synthetic shapes set (written by the same
//! function as `cannon data synth`) read with the Tekken tokenizer, padded and packed by the
//! loader, goes straight into a tiny Mistral3's forward and backward.

mod common;
use common::shared_path;

use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_runtime::rng::SplitMix64;
use cannon_trainer::model::{
    BackwardSteps, BatchError, DeviceCtx, Grads, LossMode, Mistral3, Mistral3Config, ModelError,
    ParamLayout, Params, Part,
};
use cannon_trainer::parallel::fsdp::{rank_rows, rank_share};
use cannon_trainer::train::data::shuffle::Position;
use cannon_trainer::train::data::{synth, Batch, DataConfig, Loader, Tekken};
use cannon_trainer::train::flops::{shape_flops, step_flops};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Truncated vocabulary: 1000 specials + 1048 byte-level ranks keep the embedding and the
/// logits small while every text still encodes.
const VOCAB: u32 = 2048;

fn tok() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| {
        Tekken::from_file(shared_path("tokenizers/tekken_240911.json"), Some(VOCAB)).unwrap()
    })
}

/// A synthetic set shared by the tests of this file (written once).
fn dataset() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("cannon-batch-to-model-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        synth::write(&dir, 24, 11).unwrap().train
    })
}

/// A tiny Mistral3 whose vocabulary is the tokenizer's, whose [IMG] id is the tokenizer's and
/// whose vision patch size is the image processor's (14, merged 2x2), with small random
/// weights (norm weights 1) so that every gradient is non-zero.
fn tiny_model() -> Mistral3 {
    let img = tok().special_id("[IMG]").unwrap();
    let cfg = common::tiny_vlm_config_json(img, tok().vocab_size(), 2);
    let cfg = Mistral3Config::from_json(&cfg).unwrap();
    let layout = ParamLayout::new(&cfg);
    let mut host: Vec<Vec<f32>> = layout.groups.iter().map(|g| vec![0.0; g.len]).collect();
    let mut rng = SplitMix64::new(5);
    for (g, slot) in layout.slots() {
        let w = &mut host[g][slot.range()];
        if slot.name.contains("norm") || slot.name.contains("ln_pre") {
            w.fill(1.0);
        } else {
            w.iter_mut()
                .for_each(|x| *x = (rng.unit_f64() as f32 - 0.5) * 0.2);
        }
    }
    let exec = DeviceCtx::cpu();
    let params = Params::from_host(&exec, layout, &host).unwrap();
    Mistral3 {
        cfg,
        params,
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    }
}

fn loader(pack: bool, batch_size: usize) -> Loader {
    let cfg = DataConfig {
        dataset: Some(dataset().clone()),
        max_len: 160,
        batch_size,
        pack,
        seed: 3,
        ..DataConfig::default()
    };
    Loader::open(&cfg, tok(), Position::default()).unwrap()
}

/// Every tensor of every trained group has a non-zero gradient; frozen groups have no buffer.
fn assert_grads(model: &Mistral3, grads: &Grads, trained: &[Part], what: &str) {
    let host = grads.to_host(model.exec.stream()).unwrap();
    for (g, layout) in model.params.layout.groups.iter().enumerate() {
        let buf = host[g].as_deref();
        if !trained.contains(&layout.part) {
            assert!(buf.is_none(), "{what}: frozen group {g} has a buffer");
            continue;
        }
        let buf = buf.unwrap();
        for s in &layout.slots {
            let v = &buf[s.range()];
            assert!(
                v.iter().all(|x| x.is_finite()),
                "{what}: {} not finite",
                s.name
            );
            assert!(
                v.iter().any(|&x| x != 0.0),
                "{what}: {} is all zero",
                s.name
            );
        }
    }
}

fn check_batch_trains(model: &Mistral3, batch: &Batch, what: &str) {
    assert!(!batch.images.is_empty(), "{what}: the batch has images");
    let acts = model.forward::<f32>(batch).unwrap();
    assert!(
        acts.loss().is_finite() && acts.loss() > 0.0,
        "{what}: loss {}",
        acts.loss()
    );
    assert!(acts.targets.iter().any(|&t| t != IGNORE_INDEX));
    let layout = &model.params.layout;
    let (lv, lt) = (layout.vision_layers, layout.text_layers);

    // The default: vision tower and projector frozen, no backward of theirs runs.
    let mut grads = model.grads(&[Part::Text]).unwrap();
    let visited = model.backward(batch, &acts, &mut grads, None).unwrap();
    let text_only = BackwardSteps {
        text_layers: lt,
        ..BackwardSteps::default()
    };
    assert_eq!(visited, text_only, "{what}");
    assert_grads(model, &grads, &[Part::Text], what);

    // The vision tower trains, the projector stays frozen: the projector's backward runs (the
    // gradient must pass through it) but it gets no buffer.
    let trained = [Part::Vision, Part::Text];
    let mut grads = model.grads(&trained).unwrap();
    let visited = model.backward(batch, &acts, &mut grads, None).unwrap();
    let everything = BackwardSteps {
        text_layers: lt,
        projector: true,
        vision_layers: lv,
        patch_embed: true,
        vision_cp_calls: 0,
    };
    assert_eq!(visited, everything, "{what}");
    assert_grads(model, &grads, &trained, what);
}

#[test]
fn padded_loader_batch_trains_the_model() {
    let model = tiny_model();
    let batch = loader(false, 2).next_batch().unwrap();
    assert_eq!(batch.samples_per_row, [1, 1]);
    check_batch_trains(&model, &batch, "padded");
}

#[test]
fn packed_loader_batch_trains_the_model() {
    let model = tiny_model();
    let batch = loader(true, 2).next_batch().unwrap();
    assert!(
        batch.samples_per_row.iter().all(|&n| n >= 2),
        "{:?}",
        batch.samples_per_row
    );
    // The model's sequences are the loader's: the padding tail is one sequence per row.
    let acts = model.forward::<f32>(&batch).unwrap();
    assert_eq!(acts.text.cu_seqlens, batch.cu_seqlens);
    check_batch_trains(&model, &batch, "packed");
}

/// Packing only changes which rows the samples share: the loss (a mean over the same trained
/// tokens) equals the padded batches' over the same samples.
#[test]
fn packed_and_padded_batches_of_the_same_samples_agree() {
    let model = tiny_model();
    let packed = loader(true, 2).next_batch().unwrap();
    let n: usize = packed.samples_per_row.iter().sum();
    // Both loaders walk the same shuffled order: n one-sample rows hold the same samples.
    let mut padded = loader(false, 1);
    let (mut sum, mut count) = (0.0, 0usize);
    for _ in 0..n {
        let b = padded.next_batch().unwrap();
        let acts = model.forward::<f32>(&b).unwrap();
        let k = acts.targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
        sum += acts.loss() * k as f64;
        count += k;
    }
    let acts = model.forward::<f32>(&packed).unwrap();
    let k = acts.targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    assert_eq!(k, count);
    let mean = sum / count as f64;
    // The same f32 kernels on the same sequences; only GEMM blocking over more rows differs.
    assert!(
        (acts.loss() - mean).abs() <= 1e-5 * mean,
        "{} vs {mean}",
        acts.loss()
    );
}

#[test]
fn a_batch_whose_parts_disagree_is_a_clear_error() {
    let model = tiny_model();
    let batch = loader(true, 2).next_batch().unwrap();
    let img = model.cfg.image_token_index;

    // One [IMG] token too few: rejected before any vision compute.
    let mut b = batch.clone();
    let at = b.input_ids.iter().position(|&t| t == img).unwrap();
    b.input_ids[at] = 1100;
    let want = batch.input_ids.iter().filter(|&&t| t == img).count();
    match model.forward::<f32>(&b).map(|_| ()) {
        Err(ModelError::ImageTokens { tokens, features }) => {
            assert_eq!((tokens, features), (want - 1, want));
        }
        other => panic!("expected an image token mismatch, got {other:?}"),
    }

    // cu_seqlens that say otherwise than the positions.
    let mut b = batch.clone();
    b.cu_seqlens.remove(0);
    let err = model.forward::<f32>(&b).map(|_| ()).unwrap_err();
    assert!(
        matches!(err, ModelError::Batch(BatchError::CuSeqlens { .. })),
        "{err}"
    );

    // Labels shorter than the ids.
    let mut b = batch.clone();
    b.labels.pop();
    let err = model.forward::<f32>(&b).map(|_| ()).unwrap_err();
    assert!(
        matches!(err, ModelError::Batch(BatchError::Tokens { .. })),
        "{err}"
    );

    // A label past the vocabulary.
    let mut b = batch;
    let at = b.labels.iter().position(|&l| l != IGNORE_INDEX).unwrap();
    b.labels[at] = model.cfg.text_config.vocab_size as i32;
    let err = model.forward::<f32>(&b).map(|_| ()).unwrap_err();
    assert!(matches!(err, ModelError::Input(_)), "{err}");
}

/// A rank of a sharded run reads only its rows (`Loader::next_rows`): they are exactly its
/// part of the whole batch (`fsdp::rank_share`: tokens, positions, sequences and images), the
/// stream moves by the whole batch, and the shape the rank reports the step from is the whole
/// batch's (tokens, samples, sequences, image sizes, FLOPs), for padded and packed batches and
/// for worlds with fewer rows than ranks.
#[test]
fn a_ranks_rows_from_the_loader_are_its_share_of_the_whole_batch() {
    let cfg = tiny_model().cfg;
    let pad = tok().pad_id();
    for (pack, rows) in [(false, 3), (true, 3), (false, 1)] {
        for world in [1, 2, 4] {
            let mut whole = loader(pack, rows);
            let mut ranks: Vec<Loader> = (0..world).map(|_| loader(pack, rows)).collect();
            // Two batches: the second starts where the whole first batch left the stream.
            for _ in 0..2 {
                let full = whole.next_batch().unwrap();
                for (r, l) in ranks.iter_mut().enumerate() {
                    let what = format!("pack {pack}, {rows} rows, rank {r} of {world}");
                    let (mine, shape) =
                        l.next_rows(|n| rank_rows(n, r, world), |_| Ok(())).unwrap();
                    let share = rank_share(&cfg, std::slice::from_ref(&full), r, world).unwrap();
                    match share.as_slice() {
                        [] => assert_eq!(mine.rows, 0, "{what}"),
                        [part] => assert_eq!(&mine, part, "{what}"),
                        more => panic!("{what}: {} parts", more.len()),
                    }
                    assert_eq!((shape.rows, shape.seq), (full.rows, full.seq), "{what}");
                    assert_eq!(shape.sequence_ends, full.cu_seqlens, "{what}");
                    assert_eq!(shape.image_sizes, full.images.sizes, "{what}");
                    let samples: usize = full.samples_per_row.iter().sum();
                    assert_eq!(shape.samples, samples, "{what}");
                    let real = full.input_ids.iter().filter(|&&t| t != pad).count();
                    assert_eq!(shape.sample_tokens, real, "{what}");
                    let lens: Vec<usize> = full
                        .sequence_ends()
                        .iter()
                        .scan(0, |s, &e| Some(e - std::mem::replace(s, e)))
                        .collect();
                    // The padding tails are the sequences of pad tokens alone.
                    let padding = lens.len() - shape.sample_lens.len();
                    assert_eq!(shape.sample_lens.iter().sum::<usize>(), real, "{what}");
                    for trained in [&[Part::Text][..], &[Part::Vision, Part::Text]] {
                        let (model, all) = (
                            shape_flops(&cfg, &shape, trained),
                            step_flops(&cfg, &full, trained),
                        );
                        // The run's MFU counts the samples' work, not the padding's.
                        match padding {
                            0 => assert!(
                                (model.total - all.total).abs() <= 1e-12 * all.total,
                                "{what}"
                            ),
                            _ => assert!(model.total < all.total, "{what}"),
                        }
                    }
                    assert_eq!(l.position(), whole.position(), "{what}");
                }
            }
        }
    }
}
