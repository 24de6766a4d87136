//! `cannon verify --device npu` on the shared tiny fixture: the whole model (forward, every
//! gradient, the AdamW steps) on npu:0 through the aclnn path, against the float64 reference,
//! in f32 and bf16, held to the same bars as on the CPU (`Tolerances`). Here the CANN is the
//! emulator (`select_for_tests`); on an Ascend host the same tests run the hardware.
//!
//! The emulator rejects any host read of device memory that is not a copy, so a pass also
//! says the model keeps to copies: index data (RoPE tables, cu_seqlens, ...) is uploaded.

#![cfg(feature = "npu")]

mod common;
use common::shared_path;

use cannon_runtime::Device;
use cannon_trainer::app::verify::{verify, Reference, Report};
use cannon_trainer::model::{DeviceCtx, Mistral3, Precision};
use std::path::PathBuf;
use std::process::Command;

fn fixture() -> PathBuf {
    shared_path("reference/mistral3-tiny")
}

/// The CANN under test; Some(path) when it is the emulator.
fn cann() -> Option<PathBuf> {
    match cannon_sys::emulator::select_for_tests() {
        Ok(cannon_sys::emulator::TestCann::Emulator(p)) => Some(p),
        Ok(_) => None,
        Err(e) => panic!("{e}"),
    }
}

/// One model on npu:0 at a time: scratch blocks go back to the device's caching allocator as
/// soon as their op is queued, which is safe for later work on the same stream only; two
/// tests on two streams of one device at once would break it (as in kernels' npu_ops).
static NPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn verify_on_npu(prec: Precision) -> Report {
    cann();
    let _g = NPU.lock().unwrap_or_else(|p| p.into_inner());
    let dir = fixture();
    let model = Mistral3::load_on(&dir, DeviceCtx::new(Device::Npu(0)).unwrap()).unwrap();
    assert_eq!(model.exec.device(), Device::Npu(0));
    let reference = Reference::load(&dir.join("reference.safetensors")).unwrap();
    verify(&model, &reference, prec, None).unwrap()
}

fn assert_passes(report: &Report, what: &str) {
    let failed: Vec<String> = report
        .rows
        .iter()
        .filter(|r| !r.pass)
        .map(|r| format!("{} rel_l2 {:.3e} > {:.1e}", r.name, r.rel_l2, r.tol))
        .collect();
    assert!(failed.is_empty(), "{what}: {failed:#?}");
    // The same 76 rows as on the CPU (verify.rs): 4 outputs, 46 gradients, 3 independence
    // rows, 2 training curves, 21 trained parameters. Nothing compared would prove nothing.
    assert_eq!(report.rows.len(), 76, "{what}: {:#?}", report.rows);
}

#[test]
fn shared_fixture_passes_on_the_npu_f32() {
    assert_passes(&verify_on_npu(Precision::F32), "f32");
}

#[test]
fn shared_fixture_passes_on_the_npu_bf16() {
    assert_passes(&verify_on_npu(Precision::Bf16), "bf16");
}

/// The command line as a user runs it: the emulator through `CANNON_CANN_EMULATOR`, the CANN
/// in use printed, every row passing (exit 0).
#[test]
fn verify_command_runs_on_the_npu() {
    let Some(emu) = cann() else {
        eprintln!("skipped on the installed CANN: this test points the binary at the emulator");
        return;
    };
    let dir = fixture();
    let out = Command::new(env!("CARGO_BIN_EXE_cannon"))
        .args(["verify", "--device", "npu", "--reference"])
        .arg(&dir)
        .env(cannon_sys::emulator::ENV, &emu)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(&format!("CANN: CANN emulator at {}", emu.display())),
        "{stderr}"
    );
    assert!(stdout.contains("verify: 76 passed, 0 failed"), "{stdout}");
}
