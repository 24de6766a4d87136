//! `cannon train --set parallel.device=npu` as a user runs it, on the CANN emulator here (an
//! installed CANN on an Ascend host): 20 steps on one process (npu:0, unsharded), then the
//! same run as 2 processes under `cannon launch --nproc 2` (one NPU each, FSDP over HCCL).
//! The two loss curves from the metrics JSONL must agree: normalised mean absolute loss
//! difference `sum|l2 - l1| / sum|l1| <= 1e-5` in f32 (the FSDP bar: the global batch and
//! the loss divisor do not depend on the rank count, so the runs differ only by the order of
//! f32 gradient sums).

#![cfg(feature = "npu")]

mod common;

use cannon_trainer::train::data::synth;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");
const STEPS: usize = 20;

/// The CANN for the child processes: the emulator's path (None on an installed CANN).
fn emulator() -> Option<PathBuf> {
    match cannon_sys::emulator::select_for_tests() {
        Ok(cannon_sys::emulator::TestCann::Emulator(p)) => Some(p),
        Ok(_) => None,
        Err(e) => panic!("{e}"),
    }
}

fn sets(data: &Path, dir: &Path) -> Vec<String> {
    sets_with(data, dir, STEPS, &[])
}

/// `--set` arguments of a run of `steps` steps, with `extra` keys.
fn sets_with(data: &Path, dir: &Path, steps: usize, extra: &[&str]) -> Vec<String> {
    let tok = common::shared_path("tokenizers/tekken_240911.json");
    let mut keys = vec![
        format!("data.dataset={}", data.display()),
        format!("data.tokenizer={}", tok.display()),
        format!("log.dir={}", dir.display()),
        format!("train.steps={steps}"),
        "train.micro_batch=4".into(),
        "train.warmup_steps=2".into(),
        "parallel.device=npu".into(),
    ];
    keys.extend(extra.iter().map(|s| s.to_string()));
    keys.iter()
        .flat_map(|s| ["--set".to_string(), s.clone()])
        .collect()
}

/// A free local port for a job's rendezvous.
fn free_port() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port().to_string()
}

fn run(cmd: &mut Command, emu: &Option<PathBuf>) -> String {
    if let Some(p) = emu {
        cmd.env(cannon_sys::emulator::ENV, p);
    }
    let out = cmd.output().unwrap();
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{so}\n{se}");
    so + &se
}

/// The `loss` of every step in a metrics JSONL (the final `eval` record has none).
fn losses(dir: &Path) -> Vec<f64> {
    let text = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter_map(|v| v["loss"].as_f64())
        .collect()
}

#[test]
fn two_processes_on_the_npu_follow_one() {
    let emu = emulator();
    let root = std::env::temp_dir().join(format!("cannon-train-npu-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let data = synth::write(&root.join("data"), 40, 5).unwrap().train;

    let one = root.join("one");
    let text = run(Command::new(BIN).arg("train").args(sets(&data, &one)), &emu);
    if emu.is_some() {
        assert!(text.contains("CANN: CANN emulator at"), "{text}");
    }
    assert!(text.contains("device: npu:0"), "{text}");

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let two = root.join("two");
    let text = run(
        Command::new(BIN)
            .args(["launch", "--nproc", "2", "--master-port", &port.to_string()])
            .args(["--", "train"])
            .args(sets(&data, &two)),
        &emu,
    );
    assert!(
        text.contains("rank 1 of 2 on npu:1 (FSDP over HCCL)"),
        "{text}"
    );
    assert!(text.contains("rank 1 of 2: trained 20 steps"), "{text}");

    let (l1, l2) = (losses(&one), losses(&two));
    assert_eq!(l1.len(), STEPS, "{l1:?}");
    assert_eq!(l2.len(), STEPS, "{l2:?}");
    let num: f64 = l1.iter().zip(&l2).map(|(a, b)| (a - b).abs()).sum();
    let d = num / l1.iter().map(|a| a.abs()).sum::<f64>();
    eprintln!("2 vs 1 process on the NPU: normalised mean absolute loss difference {d:e}");
    assert!(
        d <= 1e-5,
        "2 vs 1 process loss diff {d:e}: {l2:?} vs {l1:?}"
    );
    // The runs really trained: the loss moved.
    assert!(l1[STEPS - 1] < l1[0], "{l1:?}");
    assert!(
        two.join("final").exists() || text.contains("final model"),
        "{text}"
    );
    std::fs::remove_dir_all(&root).ok();
}

/// `train.offload_optimizer` on the NPU as a user runs it: one process (the master weights
/// and moments in pinned host memory, each group copied to npu:0 for its use) and a job of
/// 2 processes (each rank's shards in pinned memory, copied into a staging buffer before
/// each HCCL all-gather) give the losses of the same runs without the offload, bit for bit
/// (the same kernels and collectives on the same values, in the same order).
#[test]
fn the_optimizer_offload_on_the_npu_trains_bit_for_bit() {
    let emu = emulator();
    let root = std::env::temp_dir().join(format!("cannon-train-npu-offl-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let data = synth::write(&root.join("data"), 40, 5).unwrap().train;
    let steps = 6;
    let off = ["train.offload_optimizer=true"];
    let one = |dir: &Path, extra: &[&str]| {
        run(
            Command::new(BIN)
                .arg("train")
                .args(sets_with(&data, dir, steps, extra)),
            &emu,
        );
        losses(dir)
    };
    let two = |dir: &Path, extra: &[&str]| {
        let text = run(
            Command::new(BIN)
                .args(["launch", "--nproc", "2", "--master-port", &free_port()])
                .args(["--", "train"])
                .args(sets_with(&data, dir, steps, extra)),
            &emu,
        );
        assert!(text.contains("rank 1 of 2: trained 6 steps"), "{text}");
        losses(dir)
    };
    let bits = |v: &[f64]| -> Vec<u64> { v.iter().map(|x| x.to_bits()).collect() };
    let (plain, offl) = (
        one(&root.join("one"), &[]),
        one(&root.join("one-offl"), &off),
    );
    assert_eq!(plain.len(), steps, "{plain:?}");
    assert_eq!(
        bits(&offl),
        bits(&plain),
        "1 process: {offl:?} vs {plain:?}"
    );
    let (plain, offl) = (
        two(&root.join("two"), &[]),
        two(&root.join("two-offl"), &off),
    );
    assert_eq!(plain.len(), steps, "{plain:?}");
    assert_eq!(
        bits(&offl),
        bits(&plain),
        "2 processes: {offl:?} vs {plain:?}"
    );
    std::fs::remove_dir_all(&root).ok();
}

/// Context parallelism on the NPU as a user runs it: `cannon launch --nproc 2` with
/// `parallel.cp_size = 2`, Ulysses (HCCL all-to-all around FlashAttention) and Ring (K/V
/// blocks by HCCL send/recv, FlashAttention per block merged by aclnnRingAttentionUpdate),
/// and 4 processes of hybrid (Ulysses 2 inside, Ring 2 across), against one process on
/// npu:0. Both CP ranks take the same rows and split their tokens, so
/// the runs differ only in the order of f32 sums (the attention merge, the gradient
/// reduce-scatter): the FSDP bar, normalised mean absolute loss difference <= 1e-5.
#[test]
fn context_parallel_on_the_npu_follows_one_process() {
    let emu = emulator();
    let root = std::env::temp_dir().join(format!("cannon-train-npu-cp-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let data = synth::write(&root.join("data"), 40, 5).unwrap().train;
    let steps = 6;
    let one = root.join("one");
    run(
        Command::new(BIN)
            .arg("train")
            .args(sets_with(&data, &one, steps, &[])),
        &emu,
    );
    let l1 = losses(&one);
    assert_eq!(l1.len(), steps, "{l1:?}");
    let layouts: [(&str, usize, &[&str]); 3] = [
        (
            "ulysses",
            2,
            &["parallel.cp_size=2", "parallel.cp_algo=ulysses"],
        ),
        ("ring", 2, &["parallel.cp_size=2", "parallel.cp_algo=ring"]),
        (
            "hybrid",
            4,
            &[
                "parallel.cp_size=4",
                "parallel.cp_algo=hybrid",
                "parallel.ulysses_size=2",
            ],
        ),
    ];
    for (algo, n, keys) in layouts {
        let dir = root.join(algo);
        let text = run(
            Command::new(BIN)
                .args([
                    "launch",
                    "--nproc",
                    &n.to_string(),
                    "--master-port",
                    &free_port(),
                ])
                .args(["--", "train"])
                .args(sets_with(&data, &dir, steps, keys)),
            &emu,
        );
        assert!(
            text.contains(&format!("rank 1 of {n}: trained 6 steps")),
            "{text}"
        );
        let l2 = losses(&dir);
        assert_eq!(l2.len(), steps, "{algo}: {l2:?}");
        let num: f64 = l1.iter().zip(&l2).map(|(a, b)| (a - b).abs()).sum();
        let d = num / l1.iter().map(|a| a.abs()).sum::<f64>();
        eprintln!(
            "{algo} {n} on the NPU vs 1 process: normalised mean absolute loss difference {d:e}"
        );
        assert!(d <= 1e-5, "{algo}: loss diff {d:e}: {l2:?} vs {l1:?}");
    }
    // Without a job to hold them, two CP ranks are an error naming the key, not a silent
    // one-rank run.
    let out = Command::new(BIN)
        .arg("train")
        .args(sets_with(
            &data,
            &root.join("alone"),
            steps,
            &["parallel.cp_size=2"],
        ))
        .envs(emu.iter().map(|p| (cannon_sys::emulator::ENV, p)))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("parallel.cp_size = 2") && err.contains("cannon launch"),
        "{err}"
    );
    std::fs::remove_dir_all(&root).ok();
}
