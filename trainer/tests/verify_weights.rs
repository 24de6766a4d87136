//! Checkpoint loading (single file / sharded, 4.x / 5.x names, f32 / bf16 / f16) and the
//! model's input checks, on the shared tiny fixture rewritten into temporary directories.

mod common;
use common::shared_path;

use cannon_trainer::model::weights::{legacy_name, load_host, load_params, HfWeights};
use cannon_trainer::model::{
    BackwardSteps, Batch, DeviceCtx, Mistral3, Mistral3Config, ModelError, ParamLayout, Part,
    WeightsError,
};
use safetensors::{serialize, Dtype, View};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

fn shared_fixture() -> PathBuf {
    shared_path("reference/mistral3-tiny")
}

/// A tensor for `safetensors::serialize`.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::BF16 => values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        _ => values.iter().flat_map(|&v| v.to_le_bytes()).collect(),
    }
}

/// A scratch directory holding the shared config and the given tensors as model.safetensors.
fn write_checkpoint(tag: &str, tensors: Vec<(String, Raw)>) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "cannon-verify-weights-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        shared_fixture().join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let views: Vec<(String, &Raw)> = tensors.iter().map(|(n, r)| (n.clone(), r)).collect();
    let bytes = serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    dir
}

/// The shared model's tensors, renamed by `name` and stored as `dtype`.
fn tensors(model: &Mistral3, name: impl Fn(&str) -> String, dtype: Dtype) -> Vec<(String, Raw)> {
    let host = model.params.to_host(model.exec.stream()).unwrap();
    model
        .params
        .layout
        .slots()
        .map(|(g, s)| {
            let values = &host[g][s.range()];
            let raw = Raw {
                dtype,
                shape: s.shape.clone(),
                bytes: encode(values, dtype),
            };
            (name(&s.name), raw)
        })
        .collect()
}

/// What a rank of a sharded run reads of a bf16 checkpoint (its element range of every
/// group, from the bytes of that range only) is its cut of the whole load, for any world
/// size, with ranges that start and end inside tensors and span several.
#[test]
fn ranges_of_a_checkpoint_are_the_whole_load_cut() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let dir = write_checkpoint("ranges", tensors(&model, legacy_name, Dtype::BF16));
    let layout = model.params.layout.clone();
    let whole = load_host(&dir, &layout).unwrap();
    let w = HfWeights::open(&dir, &layout).unwrap();
    for world in [1usize, 2, 3, 8] {
        for (g, full) in whole.iter().enumerate() {
            let shard = full.len().div_ceil(world);
            for r in 0..world {
                let (a, b) = (
                    (r * shard).min(full.len()),
                    ((r + 1) * shard).min(full.len()),
                );
                let got = w.read(g, a..b).unwrap();
                assert_eq!(got, full[a..b], "group {g}, rank {r} of {world}");
            }
        }
    }
    let last = layout.groups.len() - 1;
    let past = layout.groups[last].len + 1;
    assert!(matches!(w.read(last, 0..past), Err(WeightsError::Range(_))));
    std::fs::remove_dir_all(&dir).ok();
}

fn load(dir: &Path) -> Result<Mistral3, ModelError> {
    let r = Mistral3::load(dir);
    std::fs::remove_dir_all(dir).ok();
    r
}

#[test]
fn legacy_names_and_half_precision_load() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let st = model.exec.stream();
    let host = |m: &Mistral3| m.params.to_host(st).unwrap();
    let same = write_checkpoint("legacy", tensors(&model, legacy_name, Dtype::F32));
    assert_eq!(host(&load(&same).unwrap()), host(&model));
    for (tag, dtype) in [("bf16", Dtype::BF16), ("f16", Dtype::F16)] {
        let dir = write_checkpoint(tag, tensors(&model, |n| n.to_string(), dtype));
        let (want_all, got_all) = (host(&model), host(&load(&dir).unwrap()));
        for (g, s) in model.params.layout.slots() {
            let want = &want_all[g][s.range()];
            let got = &got_all[g][s.range()];
            for (&w, &x) in want.iter().zip(got) {
                let r = match dtype {
                    Dtype::BF16 => half::bf16::from_f32(w).to_f32(),
                    _ => half::f16::from_f32(w).to_f32(),
                };
                assert_eq!(x.to_bits(), r.to_bits(), "{} as {tag}", s.name);
            }
        }
    }
}

fn expect_weights_error(tag: &str, t: Vec<(String, Raw)>, needle: &str) {
    let dir = write_checkpoint(tag, t);
    match load(&dir) {
        Err(ModelError::Weights(e)) => {
            let msg = e.to_string();
            assert!(
                msg.contains(needle),
                "{tag}: {msg:?} should name {needle:?}"
            );
        }
        other => panic!(
            "{tag}: expected a weights error, got {:?}",
            other.map(|_| ())
        ),
    }
}

#[test]
fn missing_extra_misshaped_and_bad_dtype_tensors_are_named() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let five = |n: &str| n.to_string();
    let victim = "model.language_model.layers.1.self_attn.k_proj.weight";

    let mut t = tensors(&model, five, Dtype::F32);
    t.retain(|(n, _)| n != victim);
    expect_weights_error("missing", t, victim);

    let mut t = tensors(&model, five, Dtype::F32);
    t.push((
        "model.language_model.layers.7.mlp.up_proj.weight".into(),
        Raw {
            dtype: Dtype::F32,
            shape: vec![1],
            bytes: vec![0; 4],
        },
    ));
    expect_weights_error("extra", t, "layers.7.mlp.up_proj");

    let mut t = tensors(&model, five, Dtype::F32);
    for (n, r) in t.iter_mut() {
        if n == victim {
            r.shape = vec![r.shape[1], r.shape[0]];
        }
    }
    expect_weights_error("shape", t, victim);

    let mut t = tensors(&model, five, Dtype::F32);
    for (n, r) in t.iter_mut() {
        if n == victim {
            r.dtype = Dtype::I32;
        }
    }
    expect_weights_error("dtype", t, victim);

    // The same tensor under both naming schemes.
    let mut t = tensors(&model, five, Dtype::F32);
    let dup = tensors(&model, legacy_name, Dtype::F32)
        .into_iter()
        .find(|(n, _)| n == &legacy_name(victim))
        .unwrap();
    t.push(dup);
    expect_weights_error("dup", t, "twice");
}

/// The index is file content: a huge one is refused by its size before it is read (a sparse
/// file, so the test writes nothing), and a shard name leaving the folder is refused.
#[test]
fn oversized_and_escaping_indexes_are_named() {
    let cfg = Mistral3Config::from_file(&shared_fixture().join("config.json")).unwrap();
    let layout = ParamLayout::new(&cfg);
    let dir = std::env::temp_dir().join(format!("cannon-index-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let index = dir.join("model.safetensors.index.json");
    let f = std::fs::File::create(&index).unwrap();
    f.set_len(cannon_trainer::model::weights::MAX_INDEX_BYTES + 1)
        .unwrap();
    drop(f);
    let err = HfWeights::open(&dir, &layout).unwrap_err().to_string();
    assert!(
        err.contains("the largest index this trainer reads"),
        "{err}"
    );
    std::fs::write(
        &index,
        r#"{"weight_map":{"lm_head.weight":"../x.safetensors"}}"#,
    )
    .unwrap();
    let err = HfWeights::open(&dir, &layout).unwrap_err().to_string();
    assert!(err.contains("leaves the directory"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn no_checkpoint_is_an_error() {
    let cfg = Mistral3Config::from_file(&shared_fixture().join("config.json")).unwrap();
    let exec = DeviceCtx::cpu();
    let err = load_params(&exec, Path::new("/nonexistent"), ParamLayout::new(&cfg)).unwrap_err();
    assert!(
        matches!(err, ModelError::Weights(WeightsError::NoWeights(_))),
        "{err}"
    );
}

fn shared_batch() -> Batch {
    let dir = shared_fixture();
    let r = cannon_trainer::app::verify::Reference::load(&dir.join("reference.safetensors"));
    r.unwrap().batch().unwrap()
}

#[test]
fn image_token_count_mismatch_names_both_counts() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let mut batch = shared_batch();
    let img = model.cfg.image_token_index;
    let pos = batch.input_ids.iter().position(|&t| t == img).unwrap();
    batch.input_ids[pos] = 100;
    match model.forward::<f32>(&batch) {
        Err(ModelError::ImageTokens { tokens, features }) => {
            assert_eq!((tokens, features), (21, 22));
        }
        other => panic!("expected the count mismatch, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn frozen_parts_get_no_gradient_and_run_no_backward() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let batch = shared_batch();
    let acts = model.forward::<f32>(&batch).unwrap();
    let layout = &model.params.layout;
    let (lv, lt) = (layout.vision_layers, layout.text_layers);
    let st = model.exec.stream();
    let mut all = model
        .grads(&[Part::Vision, Part::Projector, Part::Text])
        .unwrap();
    let visited = model.backward(&batch, &acts, &mut all, None).unwrap();
    let all = all.to_host(st).unwrap();
    let everything = BackwardSteps {
        text_layers: lt,
        projector: true,
        vision_layers: lv,
        patch_embed: true,
        vision_cp_calls: 0,
    };
    assert_eq!(visited, everything);

    // The default: vision tower and projector frozen. No backward step of theirs runs.
    let mut text = model.grads(&[Part::Text]).unwrap();
    let visited = model.backward(&batch, &acts, &mut text, None).unwrap();
    let text = text.to_host(st).unwrap();
    let text_only = BackwardSteps {
        text_layers: lt,
        ..BackwardSteps::default()
    };
    assert_eq!(visited, text_only);
    for (g, group) in layout.groups.iter().enumerate() {
        match group.part {
            Part::Text => assert_eq!(text[g], all[g], "group {g}"),
            _ => assert!(text[g].is_none(), "frozen group {g} has a gradient"),
        }
    }

    // Only the projector trains: the tower below it is not visited.
    let mut proj = model.grads(&[Part::Projector]).unwrap();
    let visited = model.backward(&batch, &acts, &mut proj, None).unwrap();
    let proj = proj.to_host(st).unwrap();
    let to_projector = BackwardSteps {
        text_layers: lt,
        projector: true,
        ..BackwardSteps::default()
    };
    assert_eq!(visited, to_projector);
    let g = layout.projector();
    assert_eq!(proj[g], all[g]);

    // Frozen language model, trained vision tower: gradients flow through the frozen text
    // layers into the tower and match the all-trainable run.
    let mut vision = model.grads(&[Part::Vision]).unwrap();
    let visited = model.backward(&batch, &acts, &mut vision, None).unwrap();
    let vision = vision.to_host(st).unwrap();
    assert_eq!(visited, everything);
    for g in 0..=lv {
        assert_eq!(vision[g], all[g], "vision group {g}");
    }

    // Nothing trains and no pixel gradient is asked for: no backward at all below the head.
    let mut none = model.grads(&[]).unwrap();
    let visited = model.backward(&batch, &acts, &mut none, None).unwrap();
    assert_eq!(visited, BackwardSteps::default());
}
