//! Every op's NPU body run for real against the host emulation of CANN (`cannon-cann-emu`),
//! through the public device-level API (`cannon_kernels::ops::*`) on `Device::Npu(0)`, and
//! compared with the same call on the CPU backend (whose kernels the unit tests check against
//! float64 references).
//!
//! Tolerances: the emulator runs the same CPU kernels or f32 arithmetic with one rounding, so
//! f32 results agree with the CPU path to f32 rounding of a different summation order (rel L2
//! <= 1e-6 unless stated) and bf16 results to within one bf16 rounding of a few elements
//! (rel L2 <= 4e-3, well inside the project's bf16 bars of 0.015 forward / 0.04 gradients).
//! On an installed CANN [`bar`] widens them to the project's bars.
//!
//! Every test calls `emu()` first so the CANN is chosen before the first CANN call: the
//! emulator here, an installed CANN on an Ascend host (the same comparisons then check the
//! hardware; only the emulator's own message texts are not checked there).

#![cfg(feature = "npu")]

mod dense;
mod gelu;
mod layers;
mod rest;
mod ring;

use cannon_runtime::{Device, DeviceBuffer, Element, Float, Stream};
use half::bf16;

/// Picks the CANN to test against (the emulator, or an installed CANN on an Ascend host);
/// true when it is the emulator.
pub(crate) fn emu() -> bool {
    match cannon_sys::emulator::select_for_tests() {
        Ok(c) => c.is_emulator(),
        Err(e) => panic!("{e}"),
    }
}

/// The bar for a comparison with the CPU path: `tol` (what the emulator, which runs the CPU
/// kernels, must meet), or on an installed CANN the project's gradient bars (bf16 0.04, f32
/// 1e-4), since hardware kernels round and sum in their own order.
pub(crate) fn bar(tol: f64, bf16: bool) -> f64 {
    if emu() {
        tol
    } else if bf16 {
        tol.max(0.04)
    } else {
        tol.max(1e-4)
    }
}

/// One test at a time on the NPU. Scratch and workspace blocks go back to the device's
/// caching allocator as soon as the op using them is queued, which is safe for reuse by later
/// work on the same stream only (torch's rule without record_stream); two tests on two
/// streams of one device at once would break it, as two streams would in a training step.
pub(crate) static NPU: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A CPU stream and an NPU stream, and the NPU for this test alone.
pub(crate) fn streams() -> (std::sync::MutexGuard<'static, ()>, Stream, Stream) {
    emu();
    let g = NPU.lock().unwrap_or_else(|p| p.into_inner());
    (
        g,
        Stream::new(Device::Cpu).unwrap(),
        Stream::new(Device::Npu(0)).unwrap(),
    )
}

pub(crate) fn up<T: Element>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::clone_htod(s, v).unwrap()
}

pub(crate) fn down<T: Element>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    s.synchronize().unwrap();
    b.clone_dtoh(s).unwrap()
}

pub(crate) fn f64s<T: Float>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f32() as f64).collect()
}

pub(crate) fn bf(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}
