//! `cannon doctor` in an NPU build, run as a user would with `CANNON_CANN_EMULATOR` set: it
//! says the emulator is in use, resolves every library from it, and passes its NPU self-check
//! (allocate, copy host -> device -> device -> host on npu:0); without the variable it reports
//! an installed CANN searched for as before.

#![cfg(feature = "npu")]

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

#[test]
fn doctor_reports_the_emulator_and_its_npu_self_check_passes() {
    let emu = match cannon_sys::emulator::select_for_tests() {
        Ok(cannon_sys::emulator::TestCann::Emulator(p)) => p,
        Ok(_) => {
            eprintln!("skipped on the installed CANN: this test runs doctor on the emulator");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let out = Command::new(BIN)
        .arg("doctor")
        .env(cannon_sys::emulator::ENV, &emu)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = emu.display().to_string();
    assert!(
        text.contains(&format!("CANN in use: the CANN emulator at {shown}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("found     libhccl.so: {shown}")),
        "{text}"
    );
    assert!(
        text.contains("devices: 8 NPU(s) reported by AscendCL"),
        "{text}"
    );
    assert!(text.contains("self-check npu:0: ok"), "{text}");

    let out = Command::new(BIN)
        .arg("doctor")
        .env_remove(cannon_sys::emulator::ENV)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("CANN in use: an installed CANN"), "{text}");
    assert!(!text.contains("libcannon_cann_emu"), "{text}");
}
