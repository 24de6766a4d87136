//! `cannon doctor`: what this build and this machine can run on — devices, CANN libraries
//! (found, or every place that was searched, and whether they are the CANN emulator) and the
//! CPU features the kernels use — followed by a runtime self-check on the CPU and, when
//! AscendCL reports devices, on NPU 0.

use cannon_runtime::{CachingAllocator, Device, DeviceBuffer, Stream};
use std::process::ExitCode;

/// CPU features the kernels select at run time, in the order a user cares about.
fn cpu_features() -> Vec<(&'static str, bool)> {
    #[cfg(target_arch = "x86_64")]
    {
        vec![
            ("avx2", std::arch::is_x86_feature_detected!("avx2")),
            ("fma", std::arch::is_x86_feature_detected!("fma")),
            ("avx512f", std::arch::is_x86_feature_detected!("avx512f")),
            ("avx512bw", std::arch::is_x86_feature_detected!("avx512bw")),
            (
                "avx512bf16",
                std::arch::is_x86_feature_detected!("avx512bf16"),
            ),
        ]
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// Allocates, copies and frees on `device` through the same API the trainer uses (a private
/// allocator on the CPU, the device's own on an NPU); returns what went wrong, if anything.
fn self_check(device: Device) -> Result<String, cannon_runtime::Error> {
    let alloc = match device {
        Device::Cpu => CachingAllocator::new_cpu(),
        Device::Npu(_) | Device::Meta => device.allocator()?,
    };
    let stream = Stream::new(device)?;
    let host: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    let mut a = DeviceBuffer::<f32>::alloc_in(&alloc, host.len())?;
    a.memcpy_htod(&stream, &host)?;
    let mut b = DeviceBuffer::<f32>::alloc_zeros_in(&alloc, host.len())?;
    b.memcpy_dtod(&stream, &a.view())?;
    if b.clone_dtoh(&stream)? != host {
        return Ok("FAILED: host -> device -> device -> host round trip changed values".into());
    }
    let stats = alloc.stats();
    Ok(format!(
        "ok (round trip of {} f32; allocated {} B, reserved {} B)",
        host.len(),
        stats.allocated,
        stats.reserved
    ))
}

/// The line `verify` and `train` start with in an NPU build: which CANN this process uses
/// (the emulator named by `CANNON_CANN_EMULATOR`, or the installed libraries' paths).
pub(crate) fn cann_line() -> String {
    format!("CANN: {}", cannon_sys::emulator::cann_in_use())
}

pub fn run() -> ExitCode {
    println!("cannon {}", env!("CARGO_PKG_VERSION"));
    println!(
        "build: npu feature {}",
        if cfg!(feature = "npu") { "on" } else { "off" }
    );
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    println!("devices: {} ({threads} threads)", Device::Cpu);
    let npus = Device::npu_count();
    if cfg!(feature = "npu") {
        println!("devices: {npus} NPU(s) reported by AscendCL");
    }
    let feats = cpu_features();
    if !feats.is_empty() {
        let list: Vec<String> = feats
            .iter()
            .map(|(n, on)| format!("{n}:{}", if *on { "yes" } else { "no" }))
            .collect();
        println!("cpu features: {}", list.join(" "));
    }
    if let Some(line) = super::launch::describe_env() {
        println!("{line}");
    }
    match super::launch::collective_check() {
        None => {}
        Some(Ok(line)) => println!("collectives: {line}"),
        Some(Err(e)) => {
            println!("collectives: FAILED: {e}");
            return ExitCode::FAILURE;
        }
    }
    println!("CANN libraries (dlopened at run time):");
    for line in cannon_sys::probe().to_string().lines() {
        println!("  {line}");
    }
    println!("CANN runtime available: {}", cannon_sys::is_available());
    let mut devices = vec![Device::Cpu];
    if npus > 0 {
        // In a launched job, this rank's NPU.
        let local: u32 = std::env::var("LOCAL_RANK")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        devices.push(Device::Npu(local));
    }
    let mut ok = true;
    for d in devices {
        match self_check(d) {
            Ok(report) => {
                ok &= report.starts_with("ok");
                println!("self-check {d}: {report}");
            }
            Err(e) => {
                ok = false;
                println!("self-check {d}: FAILED: {e}");
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
