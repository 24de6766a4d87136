//! `cannon train` with checkpoints: a run that crashes after step 4 and is resumed
//! (`checkpoint.resume = true`) from its step-3 checkpoint ends with the uninterrupted run's
//! losses and weights, bit for bit; `cannon eval` reads the checkpoint like the final model;
//! an export of the checkpoint is the `[model] weights` of a new run.

mod common;

use cannon_trainer::model::{DeviceCtx, Mistral3, Precision};
use cannon_trainer::train::checkpoint::Kind;
use cannon_trainer::train::checkpoint::{export, Checkpoint, ExportOptions};
use cannon_trainer::train::config::TrainConfig;
use cannon_trainer::train::data::synth;
use cannon_trainer::train::metrics::StepRecord;
use cannon_trainer::train::resume;
use cannon_trainer::train::sharded::{run_sharded, run_sharded_on, Ranks};
use cannon_trainer::train::{ResolvedRun, RunSetup, RunSummary, StepHook, TrainError};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// A fresh folder per test (tests of this file run in parallel).
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-train-resume-{}-{test}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

fn plan(root: &Path, run: &str, extra: &[&str]) -> ResolvedRun {
    let tok = common::shared_path("tokenizers/tekken_240911.json");
    let mut sets: Vec<String> = vec![
        format!(
            "data.dataset={:?}",
            root.join("data/train.jsonl").display().to_string()
        ),
        format!("data.tokenizer={:?}", tok.display().to_string()),
        format!("log.dir={:?}", root.join(run).display().to_string()),
        "train.steps=6".into(),
        "train.micro_batch=4".into(),
        "train.grad_accum=2".into(),
        "train.warmup_steps=2".into(),
        "checkpoint.every=3".into(),
        "checkpoint.keep_last=1".into(),
        "log.every=1".into(),
    ];
    sets.extend(extra.iter().map(|s| s.to_string()));
    let cfg = TrainConfig::load(None, &sets).unwrap();
    ResolvedRun::resolve(cfg, None).unwrap()
}

/// Stops the run after step `at` (its update done, its checkpoint not due): a crash.
struct CrashAfter(usize);

impl StepHook for CrashAfter {
    fn after_step(&mut self, _: &ResolvedRun, rec: &StepRecord) -> Result<(), TrainError> {
        if rec.step == self.0 {
            return Err(TrainError::Input("simulated crash".into()));
        }
        Ok(())
    }
}

/// `plan` run by `cannon train`'s loop (one process alone, or its `parallel.nproc` CPU
/// ranks), resumed from the checkpoint `checkpoint.resume` names if there is one.
fn train(
    plan: ResolvedRun,
    hooks: &mut [&mut (dyn StepHook + Send)],
) -> Result<RunSummary, TrainError> {
    let ckpt = resume::resume_from(&plan).unwrap();
    let mut setup = RunSetup::new(plan, &DeviceCtx::cpu()).unwrap();
    if let Some(c) = &ckpt {
        resume::resume_setup(&mut setup, c).unwrap();
    }
    let ranks = match setup.plan.cfg.parallel.nproc {
        1 => Ranks::Solo(DeviceCtx::cpu()),
        n => Ranks::Cpu(n),
    };
    run_sharded_on(&mut setup, ranks, hooks)
}

/// The bits of a checkpoint's weights and AdamW moments, with its counters (step, data
/// position, consumed samples and tokens) and AdamW's step.
fn state(dir: &Path) -> (Vec<Vec<u32>>, String) {
    let mut c = Checkpoint::open(dir).unwrap();
    let groups = c.manifest().groups.clone();
    let mut out = Vec::new();
    for (g, e) in groups.iter().enumerate() {
        let kinds: &[Kind] = match e.trained {
            true => &[Kind::Param, Kind::ExpAvg, Kind::ExpAvgSq],
            false => &[Kind::Param],
        };
        for &k in kinds {
            let v = c.read_group(k, g).unwrap();
            out.push(v.iter().map(|x| x.to_bits()).collect());
        }
    }
    let m = c.manifest();
    let counters = format!(
        "step {} data {:?} adam {}",
        m.step, m.data, m.optimizer.step
    );
    (out, counters)
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_crashed_run_resumed_from_its_checkpoint_matches_the_uninterrupted_run() {
    let root = scratch("one-rank");
    synth::write(&root.join("data"), 48, 3).unwrap();

    // The uninterrupted run.
    let full = train(plan(&root, "a", &[]), &mut []).unwrap();
    assert_eq!(full.losses.len(), 6);
    let last = full.last_checkpoint.clone().unwrap();
    assert_eq!(last.file_name().unwrap(), "step-000006");

    // The same run, crashing after step 4 (its last checkpoint: step 3).
    let err = train(plan(&root, "b", &[]), &mut [&mut CrashAfter(4)]).unwrap_err();
    assert!(err.to_string().contains("simulated crash"), "{err}");
    assert!(root.join("b/checkpoints/step-000003").is_dir());

    // Resumed in the same run folder.
    let p = plan(&root, "b", &["checkpoint.resume=true"]);
    let ckpt = resume::resume_from(&p)
        .unwrap()
        .expect("the step-3 checkpoint");
    let mut probe = RunSetup::new(p.clone(), &DeviceCtx::cpu()).unwrap();
    let r = resume::resume_setup(&mut probe, &ckpt).unwrap();
    assert_eq!(
        (r.step, r.world_size, r.schedule_changed.clone()),
        (3, 1, None)
    );
    drop(probe);
    let rest = train(p, &mut []).unwrap();
    assert_eq!(
        bits(&rest.losses),
        bits(&full.losses[3..]),
        "{:?} vs {:?}",
        rest.losses,
        full.losses
    );
    // Weights, AdamW moments and step, data position and counts: all the same.
    assert_eq!(
        state(&root.join("b/checkpoints/step-000006")),
        state(&last),
        "the step-6 checkpoints"
    );
    assert_eq!(
        final_params(&rest.final_model),
        final_params(&full.final_model)
    );

    // keep_last = 1 left the final checkpoint only; its run config is beside it.
    let ckpts = root.join("b/checkpoints");
    let left: Vec<String> = std::fs::read_dir(&ckpts)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["step-000006"]);
    assert!(ckpts.join("step-000006/cannon_train.toml").is_file());

    // cannon eval reads the checkpoint folder like the final model, with the same answers.
    let heldout = root.join("data/heldout.jsonl");
    let eval = |dir: &Path| {
        let o = Command::new(BIN)
            .args(["eval", "--checkpoint"])
            .arg(dir)
            .arg("--dataset")
            .arg(&heldout)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(0), "{err}");
        String::from_utf8(o.stdout).unwrap()
    };
    // The first line names the folder; the table is the same.
    let table = |out: String| out.lines().skip(1).collect::<Vec<_>>().join("\n");
    let from_ckpt = table(eval(&ckpts));
    assert!(from_ckpt.contains("colour"), "{from_ckpt}");
    assert_eq!(from_ckpt, table(eval(&root.join("b/final"))));

    start_from_export(&root, &full.final_model);
}

/// A run's checkpoint exported (sharded, bf16) is a `[model] config` + `weights` another run
/// starts from: the weights its ranks read are the checkpoint's (the run's final model),
/// rounded to bf16.
fn start_from_export(root: &Path, trained: &Path) {
    let hf = root.join("hf");
    let mut ckpt = Checkpoint::open(&root.join("a/checkpoints")).unwrap();
    let opts = ExportOptions {
        max_shard_size: 200_000,
        dtype: Precision::Bf16,
        force: false,
    };
    let report = export(&mut ckpt, &hf, &opts).unwrap();
    assert!(report.files.len() > 1, "{:?}", report.files);
    let dir = format!("{:?}", hf.display().to_string());
    let p = plan(
        root,
        "from-export",
        &[
            &format!("model.config={dir}"),
            &format!("model.weights={dir}"),
        ],
    );
    let setup = RunSetup::new(p, &DeviceCtx::cpu()).unwrap();
    let cannon_trainer::train::setup::Weights::Hf(w) = &setup.weights else {
        panic!("the run does not start from the exported weights");
    };
    let trained = Mistral3::load(trained).unwrap();
    let st = trained.exec.stream();
    for (g, x) in trained.params.data.iter().enumerate() {
        let want: Vec<f32> = x
            .to_host(st)
            .unwrap()
            .iter()
            .map(|v| half::bf16::from_f32(*v).to_f32())
            .collect();
        assert_eq!(w.read(g, 0..want.len()).unwrap(), want, "group {g}");
    }
}

/// `sum|a - b| / sum|b|`, the seed's loss-curve comparison.
fn normalised_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum();
    num / b.iter().map(|y| y.abs()).sum::<f64>()
}

/// A run on 2 FSDP ranks saves one file per rank; resumed from its step-3 checkpoint on 2
/// ranks it continues bit for bit, and on 1 or 4 ranks (resharded) it follows the same loss
/// curve within the FSDP equivalence bar (normalised difference <= 1e-5 in f32: only the
/// order of the gradient sums over ranks differs).
#[test]
fn a_sharded_run_saves_per_rank_and_resumes_on_any_world_size() {
    let root = scratch("sharded");
    synth::write(&root.join("data"), 48, 3).unwrap();
    let two = ["parallel.nproc=2", "checkpoint.keep_last=2"];
    let full = sharded(plan(&root, "a", &two), None);
    assert_eq!(full.losses.len(), 6);
    let step3 = root.join("a/checkpoints/step-000003");
    let ckpt = Checkpoint::open(&step3).unwrap();
    assert_eq!(ckpt.manifest().world_size, 2);
    assert_eq!(ckpt.manifest().files.len(), 2);
    assert!(ckpt.manifest().groups.iter().all(|g| g.shards.len() == 2));
    assert!(root
        .join("a/checkpoints/step-000006/manifest.json")
        .is_file());

    let from3 = format!("checkpoint.resume={:?}", step3.display().to_string());
    let resumed = |run: &str, nproc: &str| -> (Vec<f64>, PathBuf) {
        let p = plan(&root, run, &[nproc, &from3]);
        let ckpt = resume::resume_from(&p).unwrap().unwrap();
        let rest = sharded(p, Some(&ckpt));
        (rest.losses, rest.final_model)
    };
    let (rest, b) = resumed("b", "parallel.nproc=2");
    assert_eq!(
        bits(&rest),
        bits(&full.losses[3..]),
        "{rest:?} vs {:?}",
        full.losses
    );
    assert_eq!(
        final_params(&b),
        final_params(&full.final_model),
        "final weights"
    );

    // The 2-rank step-6 checkpoint exports (consolidated) to the run's final weights.
    let hf = root.join("hf");
    let mut last = Checkpoint::open(&root.join("a/checkpoints")).unwrap();
    assert_eq!(last.step(), 6);
    export(&mut last, &hf, &ExportOptions::default()).unwrap();
    let exported = Mistral3::load(&hf).unwrap();
    let st = exported.exec.stream();
    let bits_of = |x: &cannon_trainer::model::offload::Stored| -> Vec<u32> {
        x.to_host(st).unwrap().iter().map(|v| v.to_bits()).collect()
    };
    let got: Vec<Vec<u32>> = exported.params.data.iter().map(bits_of).collect();
    assert_eq!(
        got,
        final_params(&full.final_model),
        "export of the sharded checkpoint"
    );

    for nproc in ["parallel.nproc=1", "parallel.nproc=4"] {
        let (rest, _) = resumed(&nproc.replace('=', "-"), nproc);
        let d = normalised_diff(&rest, &full.losses[3..]);
        eprintln!("resumed on {nproc}: normalised loss difference {d:e}");
        assert!(
            d <= 1e-5,
            "{nproc}: normalised loss difference {d:e}: {rest:?} vs {:?}",
            full.losses
        );
    }
}

#[test]
fn resume_latest_without_a_run_folder_is_a_usage_error() {
    let o = Command::new(BIN)
        .args(["train", "--set", "checkpoint.resume=true", "--dry-run"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("log.dir"), "{err}");
}

/// The final parameters of a run, bit patterns.
/// The bits of the final model a run wrote into `dir` (its `final/` folder).
fn final_params(dir: &Path) -> Vec<Vec<u32>> {
    let m = Mistral3::load(dir).unwrap();
    let p = m.params.to_host(m.exec.stream()).unwrap();
    p.iter()
        .map(|g| g.iter().map(|v| v.to_bits()).collect())
        .collect()
}

/// A sharded run of `plan` (resumed from `ckpt` when given): its summary.
fn sharded(plan: ResolvedRun, ckpt: Option<&Checkpoint>) -> cannon_trainer::train::RunSummary {
    let mut setup = RunSetup::new(plan, &DeviceCtx::cpu()).unwrap();
    if let Some(c) = ckpt {
        assert_eq!(resume::resume_setup(&mut setup, c).unwrap().step, 3);
    }
    run_sharded(&mut setup).unwrap()
}

/// The optimizer offload (`train.offload_optimizer`: master weights and moments in the host
/// pool) through `cannon train`'s loop: one process and 2 FSDP ranks train bit for bit like
/// the runs without it (losses, final weights and, one process, moments); a crashed
/// one-process run resumed from its step-3 checkpoint (masters and moments read back into
/// the host pool) ends with the uninterrupted run's losses, weights and moments; the 2-rank
/// run resumed from its step-3 checkpoint on 2 ranks ends as it did. That the masters and
/// moments live in the host pool, and what that leaves on the device, is checked by the
/// `memory_features` and `plan` tests on the ranks themselves.
#[test]
fn the_optimizer_offload_trains_and_resumes_bit_for_bit() {
    let root = scratch("offload");
    synth::write(&root.join("data"), 48, 3).unwrap();
    let off = "train.offload_optimizer=true";

    let want = train(plan(&root, "plain", &[]), &mut []).unwrap();
    let full = train(plan(&root, "a", &[off]), &mut []).unwrap();
    assert_eq!(bits(&full.losses), bits(&want.losses));
    let last = |run: &str| root.join(run).join("checkpoints/step-000006");
    assert_eq!(
        state(&last("a")),
        state(&last("plain")),
        "weights and AdamW moments"
    );

    let err = train(plan(&root, "b", &[off]), &mut [&mut CrashAfter(4)]).unwrap_err();
    assert!(err.to_string().contains("simulated crash"), "{err}");
    let p = plan(&root, "b", &[off, "checkpoint.resume=true"]);
    let rest = train(p, &mut []).unwrap();
    assert_eq!(bits(&rest.losses), bits(&full.losses[3..]));
    assert_eq!(
        state(&last("b")),
        state(&last("a")),
        "resumed weights and AdamW moments"
    );

    let two = ["parallel.nproc=2", "checkpoint.keep_last=2"];
    let want = sharded(plan(&root, "s0", &two), None);
    let full = sharded(plan(&root, "s1", &[two[0], two[1], off]), None);
    assert_eq!(bits(&full.losses), bits(&want.losses));
    assert_eq!(
        final_params(&full.final_model),
        final_params(&want.final_model),
        "2 ranks: final weights"
    );
    let step3 = root.join("s1/checkpoints/step-000003");
    let from3 = format!("checkpoint.resume={:?}", step3.display().to_string());
    let p = plan(&root, "s2", &[two[0], off, &from3]);
    let ckpt = resume::resume_from(&p).unwrap().unwrap();
    let rest = sharded(p, Some(&ckpt));
    assert_eq!(bits(&rest.losses), bits(&full.losses[3..]));
    assert_eq!(
        final_params(&rest.final_model),
        final_params(&full.final_model),
        "2 ranks resumed: final weights"
    );
}
