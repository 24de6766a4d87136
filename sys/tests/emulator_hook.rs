//! `CANNON_CANN_EMULATOR`: every library resolves from the one named file, whatever
//! `ASCEND_HOME_PATH` offers, and the probe says the emulator is in use. The "emulator" here
//! is the fake CANN of tests/fake_cann built as one file (the real emulator is exercised by the
//! runtime's NPU tests), with a different fake runtime library under `ASCEND_HOME_PATH` that
//! must not be picked. Its own test binary: the environment is set before the first CANN call.

use std::path::{Path, PathBuf};
use std::process::Command;

use cannon_sys::loader::{self, Lib};
use cannon_sys::{acl, emulator};

fn cc(out: &Path, defines: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_cann/fake_cann.c");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O0", "-Wall", "-Werror"])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg(&src)
        .arg("-o")
        .arg(out)
        .status()
        .expect("a C compiler (cc) is needed to build the fake CANN libraries");
    assert!(status.success(), "cc failed for {}", out.display());
}

#[test]
fn every_library_comes_from_the_emulator_file_and_the_probe_says_so() {
    let root =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("emu-hook-{}", std::process::id()));
    let lib64 = root.join("lib64");
    std::fs::create_dir_all(&lib64).unwrap();
    let emu = root.join("libfake_emu.so");
    cc(
        &emu,
        &["FAKE_ACL", "FAKE_NNOPBASE", "FAKE_OPAPI", "FAKE_HCCL"],
    );
    // A decoy installed CANN: only its runtime library.
    cc(&lib64.join("libascendcl.so"), &["FAKE_ACL"]);

    // Set before any CANN call of this process (this binary's only test).
    std::env::set_var("ASCEND_HOME_PATH", &root);
    std::env::set_var(emulator::ENV, &emu);

    assert_eq!(emulator::selected(), Some(emu.as_path()));
    let shown = emu.display().to_string();
    for lib in Lib::ALL {
        let l = loader::library(lib).unwrap_or_else(|e| panic!("{lib}: {e}"));
        assert_eq!(l.paths(), vec![shown.clone()], "{lib}");
    }
    let mut n = 0u32;
    // SAFETY: the fake writes one u32.
    assert_eq!(unsafe { acl::aclrtGetDeviceCount(&mut n) }, Ok(0));
    assert_eq!(n, 3);
    // The HCCL symbol resolves from the same file (the decoy has none).
    assert!(loader::library(Lib::Hccl)
        .unwrap()
        .symbol(c"HcclGetRankSize")
        .is_ok());

    let report = cannon_sys::probe().to_string();
    assert!(
        report.contains(&format!("CANN in use: the CANN emulator at {shown}")),
        "{report}"
    );
    assert!(emulator::cann_in_use().starts_with("CANN emulator at "));
    // The choice is made: another emulator path is refused, the same one accepted.
    assert!(emulator::use_emulator(&emu).is_ok());
    assert!(matches!(
        emulator::use_emulator("/elsewhere/libcannon_cann_emu.so"),
        Err(emulator::EmulatorError::AlreadySelected { .. })
    ));
    std::fs::remove_dir_all(&root).unwrap();
}
