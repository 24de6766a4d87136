//! `log.tensorboard = true`: a run's TensorBoard event files hold what its `metrics.jsonl`
//! holds, read back with the trainer's own reader: every logged step's numbers at their step,
//! the final evaluation at the last step; a run resumed after a crash adds a file that marks
//! where it restarts, so that the two files together give the steps `metrics.jsonl` ends with.

mod common;

use cannon_trainer::model::DeviceCtx;
use cannon_trainer::train::config::TrainConfig;
use cannon_trainer::train::data::synth;
use cannon_trainer::train::metrics::StepRecord;
use cannon_trainer::train::resume;
use cannon_trainer::train::sharded::{run_sharded_on, Ranks};
use cannon_trainer::train::tensorboard::{event_files, read_events, EventData, FILE_VERSION};
use cannon_trainer::train::{ResolvedRun, RunSetup, StepHook, TrainError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// The `--set` overrides of a short run of the tiny model on a small synthetic set in `root`
/// (made here), into `root/run`.
fn sets(root: &Path) -> Vec<String> {
    let data = root.join("data");
    if !data.join("heldout.jsonl").is_file() {
        synth::write(&data, 40, 5).unwrap();
    }
    let path = |p: PathBuf| format!("{:?}", p.display().to_string());
    vec![
        format!("data.dataset={}", path(data.join("train.jsonl"))),
        format!("data.eval_dataset={}", path(data.join("heldout.jsonl"))),
        format!("data.tokenizer={}", path(common::tekken())),
        "data.max_len=256".into(),
        "data.longest_edge=56".into(),
        "train.micro_batch=3".into(),
        "train.steps=4".into(),
        "train.warmup_steps=1".into(),
        "train.eval_batch=4".into(),
        format!("log.dir={}", path(root.join("run"))),
        "log.tensorboard=true".into(),
    ]
}

/// `metrics.jsonl`'s step records, the last one of each step (a resumed run logs again the
/// steps after its checkpoint), and its eval record.
fn jsonl(run: &Path) -> (BTreeMap<i64, serde_json::Value>, serde_json::Value) {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let (mut steps, mut eval) = (BTreeMap::new(), serde_json::Value::Null);
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        match v["step"].as_i64() {
            Some(s) => {
                steps.insert(s, v);
            }
            None => eval = v["eval"].clone(),
        }
    }
    (steps, eval)
}

/// The scalars of a TensorBoard folder as TensorBoard shows them: its files in name order,
/// a `SessionLog START` at step s dropping what earlier files hold at s and after; by step,
/// then by tag.
fn tensorboard(dir: &Path) -> BTreeMap<i64, BTreeMap<String, f32>> {
    let mut out: BTreeMap<i64, BTreeMap<String, f32>> = BTreeMap::new();
    for file in event_files(dir).unwrap() {
        let events = read_events(&file).unwrap();
        assert_eq!(
            events[0].what,
            EventData::FileVersion(FILE_VERSION.into()),
            "{}",
            file.display()
        );
        for ev in events {
            match ev.what {
                EventData::SessionStart => out.retain(|&s, _| s < ev.step),
                EventData::Scalars(values) => out.entry(ev.step).or_default().extend(values),
                _ => {}
            }
        }
    }
    out
}

/// Every step of `metrics.jsonl` is in TensorBoard with the same numbers (as f32), the
/// evaluation at the last step.
fn assert_same(run: &Path, steps: usize) {
    let (records, eval) = jsonl(run);
    let tb = tensorboard(&run.join("tensorboard"));
    assert_eq!(records.len(), steps);
    assert_eq!(
        tb.keys().collect::<Vec<_>>(),
        records.keys().collect::<Vec<_>>()
    );
    for (step, rec) in &records {
        let got = &tb[step];
        for tag in ["loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_ms"] {
            assert!(got.contains_key(tag), "step {step}: no {tag} in {got:?}");
        }
        for tag in [
            "data_ms",
            "max_allocated_mib",
            "max_reserved_mib",
            "samples",
        ] {
            assert!(got.contains_key(tag), "step {step}: no {tag} in {got:?}");
        }
        assert_eq!(got["skipped"], 0.0);
        for (name, v) in rec.as_object().unwrap() {
            if let (Some(x), true) = (v.as_f64(), name != "step") {
                assert_eq!(got[name], x as f32, "step {step}: {name}");
            }
        }
        assert_eq!(got["loss"], rec["loss"].as_f64().unwrap() as f32);
    }
    let last = &tb[&(steps as i64)];
    let accuracy = eval["correct"].as_f64().unwrap() / eval["samples"].as_f64().unwrap();
    assert_eq!(last["eval/accuracy"], accuracy as f32, "{last:?}");
    assert_eq!(last["eval/samples"], 4.0);
    for k in eval["per_kind"].as_array().unwrap() {
        let tag = format!("eval/{}/accuracy", k["kind"].as_str().unwrap());
        assert_eq!(last[&tag], k["accuracy"].as_f64().unwrap() as f32, "{tag}");
    }
}

#[test]
fn train_writes_every_metric_as_a_tensorboard_scalar() {
    let root = common::scratch("train-tensorboard", "cli");
    let mut cmd = Command::new(BIN);
    cmd.arg("train");
    for s in sets(&root) {
        cmd.args(["--set", &s]);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let run = root.join("run");
    assert_eq!(event_files(&run.join("tensorboard")).unwrap().len(), 1);
    assert_same(&run, 4);
}

/// Stops the run after step `at`, past its last checkpoint: a crash.
struct CrashAfter(usize);

impl StepHook for CrashAfter {
    fn after_step(&mut self, _: &ResolvedRun, rec: &StepRecord) -> Result<(), TrainError> {
        if rec.step == self.0 {
            return Err(TrainError::Input("simulated crash".into()));
        }
        Ok(())
    }
}

fn train(root: &Path, extra: &[&str], hooks: &mut [&mut (dyn StepHook + Send)]) -> bool {
    let mut sets = sets(root);
    sets.extend(extra.iter().map(|s| s.to_string()));
    let plan = ResolvedRun::resolve(TrainConfig::load(None, &sets).unwrap(), None).unwrap();
    let ckpt = resume::resume_from(&plan).unwrap();
    let mut setup = RunSetup::new(plan, &DeviceCtx::cpu()).unwrap();
    if let Some(c) = &ckpt {
        resume::resume_setup(&mut setup, c).unwrap();
    }
    run_sharded_on(&mut setup, Ranks::Solo(DeviceCtx::cpu()), hooks).is_ok()
}

#[test]
fn a_resumed_run_adds_a_file_that_replaces_the_steps_after_the_checkpoint() {
    let root = common::scratch("train-tensorboard", "resume");
    // Checkpoint at step 2, crash after step 3: step 3 is logged, then logged again.
    assert!(!train(
        &root,
        &["checkpoint.every=2"],
        &mut [&mut CrashAfter(3)]
    ));
    let dir = root.join("run/tensorboard");
    let first = event_files(&dir).unwrap();
    assert_eq!(first.len(), 1);
    let crashed = tensorboard(&dir);
    assert_eq!(crashed.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);

    assert!(train(
        &root,
        &["checkpoint.every=2", "checkpoint.resume=true"],
        &mut []
    ));
    let files = event_files(&dir).unwrap();
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(files[0], first[0], "the crashed run's file is kept, first");
    let resumed = read_events(&files[1]).unwrap();
    assert_eq!(
        (resumed[1].step, &resumed[1].what),
        (3, &EventData::SessionStart)
    );
    assert_same(&root.join("run"), 4);
    // The crashed run's step 3 and the resumed one's are the same step from the same state.
    assert_eq!(crashed[&3]["loss"], tensorboard(&dir)[&3]["loss"]);
}
