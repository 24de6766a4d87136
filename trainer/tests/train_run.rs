//! `cannon train` end to end on a tiny config (JSONL metrics with every field, the final eval
//! record, run_identity.json, the saved config, `cannon eval` on the final model), `--dry-run`,
//! and gradient accumulation: two micro batches of B rows give the loss and gradients of one
//! batch of 2B rows.

mod common;

use cannon_runtime::comm::Communicator;
use cannon_trainer::model::init::{self, Init};
use cannon_trainer::model::optim::AdamWConfig;
use cannon_trainer::model::{DeviceCtx, LossMode, Mistral3, ParamLayout, Part};
use cannon_trainer::parallel::fsdp::{FsdpRank, FsdpSettings, ShardSource};
use cannon_trainer::train::config::preset::{self, PresetSizes};
use cannon_trainer::train::data::batch::pad_batch;
use cannon_trainer::train::data::shuffle::Position;
use cannon_trainer::train::data::{synth, DataConfig, Loader, Tekken};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

fn tmp(name: &str) -> PathBuf {
    common::scratch("train-run", name)
}

/// A small synthetic set shared by the tests of this file.
fn dataset() -> &'static PathBuf {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let d = tmp("data");
        synth::write(&d, 40, 5).unwrap();
        d
    })
}

fn tiny_toml(out: &Path) -> String {
    format!(
        r#"
[model]
config = "tiny"
seed = 1

[data]
dataset = "{data}/train.jsonl"
eval_dataset = "{data}/heldout.jsonl"
tokenizer = "{tok}"
vocab_size = 1280
max_len = 256
longest_edge = 56

[train]
micro_batch = 3
grad_accum = 2
steps = 3
lr = 1e-3
warmup_steps = 1
min_lr = 1e-4
eval_batch = 4

[log]
dir = "{out}"
every = 1
"#,
        data = dataset().display(),
        tok = common::tekken().display(),
        out = out.display()
    )
}

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (o.status.code().unwrap_or(-1), s(o.stdout), s(o.stderr))
}

#[test]
fn train_writes_metrics_identity_config_and_a_model_eval_reads() {
    let dir = tmp("e2e");
    let out = dir.join("run");
    let cfg = dir.join("tiny.toml");
    std::fs::write(&cfg, tiny_toml(&out)).unwrap();
    let (code, stdout, stderr) = run(&["train", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("# effective config"), "{stdout}");
    assert!(stdout.contains("question"), "the accuracy table: {stdout}");

    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "3 steps and the eval record:\n{text}");
    let fields = [
        "step",
        "loss",
        "grad_norm",
        "lr",
        "step_ms",
        "tokens_per_s",
        "mfu",
        "max_allocated_mib",
        "max_reserved_mib",
        "dropped_samples",
        "skipped_samples",
    ];
    for (i, l) in lines[..3].iter().enumerate() {
        for f in fields {
            let v = l[f]
                .as_f64()
                .unwrap_or_else(|| panic!("{f} missing in {l}"));
            assert!(v.is_finite() && v >= 0.0, "{f} = {v}");
        }
        assert_eq!(l["step"], i + 1);
        assert!(l["loss"].as_f64().unwrap() > 0.0);
        assert!(l["mfu"].as_f64().unwrap() > 0.0 && l["mfu"].as_f64().unwrap() < 1.0);
        assert!(l["max_allocated_mib"].as_f64().unwrap() > 0.0);
        assert!(l["max_reserved_mib"].as_f64() >= l["max_allocated_mib"].as_f64());
    }
    // Warm-up of 1 step then cosine over 2: lr, then (lr + min_lr) / 2 = 5.5e-4.
    assert_eq!(lines[0]["lr"].as_f64().unwrap(), 1e-3);
    assert!((lines[2]["lr"].as_f64().unwrap() - 5.5e-4).abs() < 1e-12);
    let eval = &lines[3]["eval"];
    assert_eq!(eval["samples"], 4, "{eval}");
    assert!(eval["per_kind"].as_array().is_some_and(|k| !k.is_empty()));

    let id: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run_identity.json")).unwrap())
            .unwrap();
    for role in [
        "dataset",
        "eval_dataset",
        "tokenizer",
        "config",
        "effective_config",
    ] {
        let sha = id["files"][role]["sha256"].as_str().unwrap_or_default();
        assert_eq!(sha.len(), 64, "{role}: {id}");
    }
    let want = cannon_trainer::train::digest::sha256_file(&cfg).unwrap();
    assert_eq!(id["files"]["config"]["sha256"], want.as_str());
    assert!(id["source_revision"]
        .as_str()
        .is_some_and(|s| !s.is_empty()));
    assert!(id["versions"]["cannon"].is_string());

    // The saved config reads back, with the resolved paths written in.
    let saved = std::fs::read_to_string(out.join("config.toml")).unwrap();
    let c = cannon_trainer::train::config::TrainConfig::from_toml(&saved).unwrap();
    assert_eq!(c.train.steps, Some(3));
    assert_eq!(c.log.dir.as_deref(), Some(out.as_path()));

    // `cannon eval` on the final model gives the run's own held-out accuracy.
    let (code, stdout, stderr) =
        run(&["eval", "--checkpoint", out.join("final").to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("(4 samples)"), "{stdout}");
    let acc = 100.0 * eval["correct"].as_u64().unwrap() as f64 / 4.0;
    let all = stdout.lines().find(|l| l.starts_with("all ")).unwrap();
    assert!(all.contains(&format!("{acc:.1}%")), "{acc} in {all}");
}

/// Two ranks score the held-out set together on their shards (no process reads the final
/// model back): the run's record equals `cannon eval` on the final model, per question type,
/// on 1, 2 or 3 ranks.
#[test]
fn two_ranks_evaluate_on_their_shards_as_eval_does_on_the_final_model() {
    let dir = tmp("e2e-2");
    let out = dir.join("run");
    let cfg = dir.join("tiny.toml");
    std::fs::write(&cfg, tiny_toml(&out)).unwrap();
    let cfg = cfg.to_str().unwrap();
    let (code, stdout, stderr) = run(&["train", "--config", cfg, "--set", "parallel.nproc=2"]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let eval = &last["eval"];
    assert_eq!(eval["samples"], 4, "{eval}");
    let (code, stdout, stderr) =
        run(&["eval", "--checkpoint", out.join("final").to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    for k in eval["per_kind"].as_array().unwrap() {
        let name = k["kind"].as_str().unwrap();
        let acc = 100.0 * k["accuracy"].as_f64().unwrap();
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} in {stdout}"));
        let want = format!("{} {:.1}%", k["total"], acc);
        let got: Vec<&str> = line.split_whitespace().skip(1).take(2).collect();
        assert_eq!(got.join(" "), want, "{name}: {line}");
    }
    // `cannon eval` runs on the run's 2 ranks (its saved config) or on any other number,
    // each rank reading its slices of the weights: the same report.
    for n in [1, 3] {
        let set = format!("parallel.nproc={n}");
        let final_dir = out.join("final");
        let args = [
            "eval",
            "--checkpoint",
            final_dir.to_str().unwrap(),
            "--set",
            &set,
        ];
        let (code, other, stderr) = run(&args);
        assert_eq!(code, 0, "{other}\n{stderr}");
        assert_eq!(other, stdout, "{n} rank(s)");
    }
}

#[test]
fn dry_run_checks_and_prints_without_training() {
    let dir = tmp("dry");
    let out = dir.join("run");
    let cfg = dir.join("tiny.toml");
    std::fs::write(&cfg, tiny_toml(&out)).unwrap();
    let (code, stdout, stderr) = run(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        "train.lr=5e-4",
        "--dry-run",
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("lr = 0.0005"), "{stdout}");
    assert!(stdout.contains("samples"), "the dataset was read: {stdout}");
    let cmd = stdout
        .lines()
        .find(|l| l.starts_with("# command:"))
        .unwrap();
    assert!(
        cmd.contains("--set train.lr=5e-4") && !cmd.contains("--dry-run"),
        "{cmd}"
    );
    assert!(!out.exists(), "a dry run writes nothing");

    // A dataset that is not there is named, exit 2.
    let (code, _, stderr) = run(&[
        "train",
        "--config",
        cfg.to_str().unwrap(),
        "--set",
        "data.dataset=/nonexistent/train.jsonl",
        "--dry-run",
    ]);
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent/train.jsonl"), "{stderr}");
    // A bad value is named, exit 2.
    let (code, _, stderr) = run(&["train", "--set", "train.lr=-1", "--dry-run"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("train.lr = -1: must be > 0"), "{stderr}");
}

/// Without `log.dir`, every process of a multi-process job must name the same run folder:
/// `CANNON_RUN_ID` (what `cannon launch` sets on one node) names it, and a job without it is
/// refused rather than letting each process pick a folder from its own start time.
#[test]
fn a_job_of_several_processes_shares_one_run_folder() {
    let dir = tmp("run-id");
    let cfg = dir.join("no-dir.toml");
    let text = tiny_toml(&dir).replace(&format!("dir = \"{}\"\n", dir.display()), "");
    assert!(!text.contains("dir ="), "{text}");
    std::fs::write(&cfg, text).unwrap();
    let dry = |env: &[(&str, &str)]| {
        let o = Command::new(BIN)
            .args(["train", "--config", cfg.to_str().unwrap(), "--dry-run"])
            .current_dir(&dir)
            .env_remove("CANNON_RUN_ID")
            .env_remove("WORLD_SIZE")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
        (o.status.code().unwrap_or(-1), s(o.stdout), s(o.stderr))
    };
    let (code, stdout, stderr) = dry(&[("CANNON_RUN_ID", "job-7")]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("dir = \"runs/job-7\""), "{stdout}");
    // A job of several processes is an NPU job: on the CPU (this config's device) it is
    // refused, each process would train the whole model into the one folder.
    let (code, _, stderr) = dry(&[("WORLD_SIZE", "2"), ("CANNON_RUN_ID", "job-7")]);
    assert_eq!(code, 2);
    assert!(stderr.contains("parallel.nproc=2"), "{stderr}");
    let (code, _, stderr) = dry(&[("WORLD_SIZE", "2")]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("WORLD_SIZE") && stderr.contains("log.dir"),
        "{stderr}"
    );
    let (code, _, stderr) = dry(&[("CANNON_RUN_ID", "../up")]);
    assert_eq!(code, 2);
    assert!(stderr.contains("CANNON_RUN_ID"), "{stderr}");
    // One process alone still gets a fresh dated folder.
    let (code, stdout, stderr) = dry(&[]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("dir = \"runs/20"), "{stdout}");
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num.sqrt() / den.sqrt().max(1e-30)
}

/// The loss and the gradient of every group of one training step over `micro` (the
/// trainer's step, a world of one): AdamW's first moment after its first step is
/// `(1 - beta1) g` = `g / 10`, read back and scaled (no clipping, no learning rate).
fn grads_of(
    model: &Mistral3,
    micro: &[cannon_trainer::train::data::Batch],
) -> (f64, Vec<Vec<f32>>) {
    let st = model.exec.stream();
    let host = model.params.to_host(st).unwrap();
    let settings = FsdpSettings {
        adamw: AdamWConfig {
            lr: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        },
        max_grad_norm: 0.0,
        frozen: vec![],
        loss_mode: LossMode::Full,
        memory: Default::default(),
    };
    let comm = Communicator::solo(model.exec.device(), std::time::Duration::from_secs(60));
    let source = ShardSource::Full(&host);
    let mut rank = FsdpRank::new(
        comm,
        model.exec.clone(),
        model.cfg.clone(),
        source,
        settings,
    )
    .unwrap();
    let stats = rank.step::<f32>(micro, 0.0).unwrap();
    let (_, m, _) = rank.shards();
    let grads = m
        .iter()
        .map(|m| {
            let m = m.as_ref().unwrap().to_host(st).unwrap();
            m.into_iter().map(|x| x / 0.1).collect()
        })
        .collect();
    (stats.loss, grads)
}

/// The tokenizer (vocabulary 1280) and a tiny two-layer Mistral3 of its vocabulary.
fn tiny_model() -> (Tekken, cannon_trainer::model::Mistral3Config) {
    let tok = Tekken::from_file(common::tekken(), Some(1280)).unwrap();
    let sizes = PresetSizes {
        text_hidden: 32,
        text_intermediate: 64,
        text_layers: 2,
        text_heads: 4,
        text_kv_heads: 2,
        vision_hidden: 32,
        vision_intermediate: 64,
        vision_layers: 1,
        vision_heads: 2,
        rope_theta: 10_000.0,
    };
    let img = tok.special_id("[IMG]").unwrap();
    let cfg = preset::config(sizes, tok.vocab_size() as usize, img, 14).unwrap();
    (tok, cfg)
}

#[test]
fn two_micro_batches_equal_one_batch_of_both() {
    let (tok, cfg) = tiny_model();
    let exec = DeviceCtx::cpu();
    let params = init::random_params(&exec, ParamLayout::new(&cfg), 2, Init::FanIn).unwrap();
    let model = Mistral3 {
        cfg,
        params,
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    };
    let dc = DataConfig {
        dataset: Some(dataset().join("train.jsonl")),
        max_len: 256,
        batch_size: 1,
        image: cannon_trainer::train::data::image::ImageConfig {
            longest_edge: 56,
            ..Default::default()
        },
        ..DataConfig::default()
    };
    let loader = Loader::open(&dc, &tok, Position::default()).unwrap();
    let samples: Vec<_> = (0..4).map(|i| loader.sample(i).unwrap()).collect();
    let labels = |s: &[cannon_trainer::train::data::batch::Sample]| -> usize {
        s.iter()
            .map(|s| s.labels.iter().filter(|&&l| l >= 0).count())
            .sum()
    };
    // Different target counts per micro batch, so a mean of means would differ.
    assert_ne!(labels(&samples[..2]), labels(&samples[2..]));
    let pad = tok.pad_id();
    let whole = pad_batch(&samples, pad, 8).unwrap();
    let halves = [
        pad_batch(&samples[..2], pad, 8).unwrap(),
        pad_batch(&samples[2..], pad, 8).unwrap(),
    ];
    let (loss_whole, g_whole) = grads_of(&model, std::slice::from_ref(&whole));
    let (loss_halves, g_halves) = grads_of(&model, &halves);
    // f32 rounding: the two layouts sum the same terms in different orders (one GEMM over 4
    // rows vs two accumulating GEMMs, different padding); relative differences of a few ulp
    // of the sums, far below 1e-5.
    assert!(
        (loss_whole - loss_halves).abs() <= 1e-6 * loss_whole,
        "{loss_whole} vs {loss_halves}"
    );
    for (g, (a, b)) in g_halves.iter().zip(&g_whole).enumerate() {
        let e = rel_l2(a, b);
        assert!(e <= 1e-5, "group {g}: relative L2 {e:e}");
    }
    // Each micro batch divided by its own target count is a different gradient: the check
    // above can fail.
    let mut g = model
        .grads(&[Part::Vision, Part::Projector, Part::Text])
        .unwrap();
    for b in &halves {
        let acts = model.forward::<f32>(b).unwrap();
        model.backward(b, &acts, &mut g, None).unwrap();
    }
    let means = g.to_host(model.exec.stream()).unwrap();
    let e = rel_l2(
        means.last().unwrap().as_ref().unwrap(),
        g_whole.last().unwrap(),
    );
    assert!(e > 1e-2, "mean of means should differ, relative L2 {e:e}");
}

/// The held-out evaluation on N ranks, each on its shards and its own rows of every chunk,
/// gives the one-process model's report answer for answer (the logits are the same bits),
/// with chunks that do not split evenly and a held-out image cut after its header (skipped by
/// the rank that holds its row, counted once).
#[test]
fn ranks_evaluating_their_own_rows_give_the_one_process_report() {
    use cannon_trainer::parallel::fsdp::run_cpu_ranks;
    use cannon_trainer::train::data::dataset::{DataSet, SampleSettings};
    use cannon_trainer::train::data::info::DatasetSpec;
    use cannon_trainer::train::eval::{evaluate, sharded::evaluate_on};
    use cannon_trainer::train::resolve::image_config;

    let (tok, cfg) = tiny_model();
    let layout = ParamLayout::new(&cfg);
    let host: Vec<Vec<f32>> = (0..layout.groups.len())
        .map(|g| init::random_range(&layout, g, 0..layout.groups[g].len, 4, Init::FanIn).unwrap())
        .collect();
    let exec = DeviceCtx::cpu();
    let model = Mistral3 {
        cfg: cfg.clone(),
        params: cannon_trainer::model::Params::from_host(&exec, layout.clone(), &host).unwrap(),
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    };

    // A held-out set of its own (one image is cut): 8 samples, chunks of 3.
    let dir = tmp("eval-rows");
    synth::write(&dir, 80, 7).unwrap();
    let heldout = dir.join("heldout.jsonl");
    let first = std::fs::read_to_string(&heldout).unwrap();
    let record: serde_json::Value = serde_json::from_str(first.lines().nth(1).unwrap()).unwrap();
    let image = dir.join(record["images"][0].as_str().unwrap());
    let bytes = std::fs::read(&image).unwrap();
    std::fs::write(&image, &bytes[..bytes.len() / 2]).unwrap();
    let image_cfg = image_config(&cfg, 56);
    let settings = SampleSettings {
        max_len: 256,
        system_prompt: None,
        image: &image_cfg,
        labels: Default::default(),
    };
    let data = DataSet::open(&DatasetSpec::file(&heldout), &tok, &settings).unwrap();
    let rows = 3;
    assert!(
        data.samples.len() > 2 * rows,
        "{} samples",
        data.samples.len()
    );
    let want = evaluate::<f32>(&model, &data, &tok, &image_cfg, rows).unwrap();
    assert_eq!(want.skipped, 1, "the cut image's sample is skipped");
    assert_eq!(want.samples + 1, data.samples.len());

    let frozen = FsdpSettings {
        adamw: AdamWConfig::default(),
        max_grad_norm: 0.0,
        frozen: vec![Part::Vision, Part::Projector, Part::Text],
        loss_mode: LossMode::Full,
        memory: Default::default(),
    };
    for world in [1, 2, 3] {
        let got = run_cpu_ranks(world, std::time::Duration::from_secs(60), |comm, exec| {
            let source = ShardSource::Full(&host);
            let mut rank = FsdpRank::new(comm, exec, cfg.clone(), source, frozen.clone())?;
            evaluate_on::<f32>(&mut rank, &data, &tok, &image_cfg, rows)
                .map_err(|e| cannon_trainer::parallel::fsdp::FsdpError::Invalid(e.to_string()))
        })
        .unwrap();
        for (r, rep) in got.iter().enumerate() {
            assert_eq!(rep, &want, "{world} ranks, rank {r}");
            assert_eq!(rep.answers, want.answers, "{world} ranks, rank {r}");
        }
    }
}
