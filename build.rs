//! The facade's build script: records how the binary was built so `cannon doctor` can tell
//! a user whether this build has the NPU paths and which target features it was compiled for.
//! CANN itself is never searched at build time (the libraries are dlopened at run time).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    println!("cargo:rustc-env=CANNON_TARGET_FEATURES={features}");
    let npu = std::env::var_os("CARGO_FEATURE_NPU").is_some();
    println!("cargo:rustc-env=CANNON_BUILT_WITH_NPU={npu}");
}
