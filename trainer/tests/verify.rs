//! `cannon verify` against the eager float64 fixtures: the shared tiny model, the variants
//! under tests/fixtures/model/, a negative control (a perturbed weight must fail), and the
//! binary's exit codes.
//!
//! Tolerances are DESIGN.md's ([`Tolerances`], the project's one table), applied inside
//! `verify`; the tests assert that every row passes, or for the negative control that rows
//! fail.

mod common;
use common::shared_path;

use cannon_trainer::app::verify::{verify, Reference, Report, Tolerances};
use cannon_trainer::model::{Mistral3, Precision};
use std::path::{Path, PathBuf};
use std::process::Command;

fn shared_fixture() -> PathBuf {
    shared_path("reference/mistral3-tiny")
}

fn own_fixtures() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs
}

fn run_verify(dir: &Path, prec: Precision) -> Report {
    let model = Mistral3::load(dir).unwrap();
    let reference = Reference::load(&dir.join("reference.safetensors")).unwrap();
    verify(&model, &reference, prec, None).unwrap()
}

fn assert_all_pass(dir: &Path, prec: Precision) {
    let report = run_verify(dir, prec);
    let failed: Vec<String> = report
        .rows
        .iter()
        .filter(|r| !r.pass)
        .map(|r| format!("{} rel_l2 {:.3e} > {:.0e}", r.name, r.rel_l2, r.tol))
        .collect();
    assert!(failed.is_empty(), "{}: {failed:#?}", dir.display());
    // Forward, every gradient, the training rows: a fixture that compared nothing proves nothing.
    assert!(report.rows.iter().any(|r| r.name == "out.logits"));
    assert!(report.rows.iter().any(|r| r.name.starts_with("grad.")));
    assert!(report
        .rows
        .iter()
        .any(|r| r.name.starts_with("train.final.")));
}

#[test]
fn shared_fixture_passes_f32() {
    let report = run_verify(&shared_fixture(), Precision::F32);
    assert_eq!(report.failed(), 0, "{:#?}", report.rows);
    // 4 outputs, 46 gradients (45 parameters + pixel_values), 3 independence rows,
    // 2 training curves, 21 trained (language model) parameters.
    assert_eq!(report.rows.len(), 76, "{:#?}", report.rows);
}

#[test]
fn own_fixtures_pass_f32() {
    let dirs = own_fixtures();
    assert!(
        dirs.len() >= 3,
        "expected the generated fixtures, found {dirs:?}"
    );
    for dir in dirs {
        assert_all_pass(&dir, Precision::F32);
    }
}

/// bf16 mixed precision (`model::ops`: bf16 GEMM/attention operands and saved activations,
/// f32 master weights, norms, softmax, loss and gradients) meets DESIGN.md's bf16 bars on
/// every fixture: `Tolerances::BF16`, each row held to the bar of its kind.
#[test]
fn all_fixtures_pass_bf16() {
    for dir in std::iter::once(shared_fixture()).chain(own_fixtures()) {
        let report = run_verify(&dir, Precision::Bf16);
        let failed: Vec<String> = report
            .rows
            .iter()
            .filter(|r| !r.pass)
            .map(|r| format!("{} rel_l2 {:.3e} > {:.1e}", r.name, r.rel_l2, r.tol))
            .collect();
        assert!(failed.is_empty(), "{}: {failed:#?}", dir.display());
        for r in &report.rows {
            let bars = Tolerances::BF16;
            let want = match r.name.split('.').next() {
                Some("out") => bars.forward,
                Some("grad") => bars.grad,
                Some("train") if r.name == "train.grad_norm" => bars.grad,
                Some("train") => bars.trained,
                _ => 0.0,
            };
            assert_eq!(r.tol, want, "{}: {r:?}", dir.display());
        }
        assert!(report.rows.iter().any(|r| r.name.starts_with("grad.")));
    }
}

#[test]
fn perturbed_weight_fails() {
    let dir = shared_fixture();
    let mut model = Mistral3::load(&dir).unwrap();
    let reference = Reference::load(&dir.join("reference.safetensors")).unwrap();
    let name = "model.language_model.layers.0.mlp.down_proj.weight";
    let st = model.exec.stream();
    let mut w = model.params.read(st, name).unwrap();
    for w in &mut w {
        *w += 1e-3;
    }
    model.params.write(st, name, &w).unwrap();
    let report = verify(&model, &reference, Precision::F32, None).unwrap();
    let failed: Vec<&str> = report
        .rows
        .iter()
        .filter(|r| !r.pass)
        .map(|r| r.name.as_str())
        .collect();
    assert!(failed.contains(&"out.logits"), "{failed:?}");
    assert!(failed.contains(&"grad.model.language_model.layers.0.mlp.up_proj.weight"));
    // The vision tower does not see the language model: its forward still passes.
    assert!(!failed.contains(&"out.vision_last_hidden"));
}

fn cannon(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cannon"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn binary_prints_the_table_and_exit_codes() {
    let fixture = shared_fixture();
    let fixture = fixture.to_str().unwrap();
    let (code, stdout, _) = cannon(&["verify", "--reference", fixture]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout
        .lines()
        .any(|l| l.starts_with("out.logits") && l.ends_with("PASS")));
    assert_eq!(stdout.lines().last(), Some("verify: 76 passed, 0 failed"));

    let (code, _, stderr) = cannon(&["verify", "--reference", "/nonexistent/fixture"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("config.json"), "{stderr}");

    let (code, _, stderr) = cannon(&["verify", "--reference", fixture, "--steps", "9"]);
    assert_eq!(code, 2, "{stderr}");

    let (code, stdout, _) = cannon(&["verify", "--reference", fixture, "--dtype", "bf16"]);
    assert_eq!(code, 0, "{stdout}");
    assert_eq!(stdout.lines().last(), Some("verify: 76 passed, 0 failed"));

    // Chunked loss: the logits row gives way to a note, everything else is compared.
    let args = ["verify", "--reference", fixture, "--loss-chunk-size", "7"];
    let (code, stdout, _) = cannon(&args);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("logits never materialised"), "{stdout}");
    assert_eq!(stdout.lines().last(), Some("verify: 75 passed, 0 failed"));
    let (code, _, stderr) = cannon(&["verify", "--reference", fixture, "--loss-chunk-size", "0"]);
    assert_eq!(code, 2, "{stderr}");

    let (code, stdout, _) = cannon(&["verify", "--reference", fixture, "--steps", "1"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("trained parameters not compared"));

    #[cfg(not(feature = "npu"))]
    {
        let (code, _, stderr) = cannon(&["verify", "--reference", fixture, "--device", "npu"]);
        assert_eq!(code, 2);
        assert!(stderr.contains("--features npu"), "{stderr}");
    }
}
