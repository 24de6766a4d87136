//! The memory of a training step on the device's caching allocator against the formulas of
//! `model::memory`: the measured `max_allocated` of a forward + backward equals the plan's
//! peak to the byte (every tensor is one block rounded up to 512 bytes, and the plan rounds
//! every term the same way), bf16 saved activations lower it, and a second identical step
//! reserves nothing new.
//!
//! Each model gets a private allocator, so tests running in parallel threads (or anything
//! else in the process) cannot move its figures. With `--features npu` the same check runs on
//! an NPU (the CANN emulator when the machine has none), where attention saves more.

mod common;
use common::shared_path;

use cannon_kernels::Tensor;
use cannon_runtime::{CachingAllocator, Stream};
use cannon_trainer::model::config::HiddenAct;
use cannon_trainer::model::memory::{plan, MemoryPlan, StepShape};
use cannon_trainer::model::{
    ActElem, Batch, DeviceCtx, LossMode, Mistral3, Part, Precision, StepMemory,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn fixture(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match name {
        "shared" => shared_path("reference/mistral3-tiny"),
        own => root.join("tests/fixtures/model").join(own),
    }
}

fn batch(dir: &Path) -> Batch {
    let r = cannon_trainer::app::verify::Reference::load(&dir.join("reference.safetensors"));
    r.unwrap().batch().unwrap()
}

/// The fixture's model on a private host allocator.
fn model(dir: &Path) -> Mistral3 {
    let exec = DeviceCtx::with_allocator(Arc::new(Stream::cpu()), CachingAllocator::new_cpu());
    Mistral3::load_on(dir, exec.unwrap()).unwrap()
}

const ALL: [Part; 3] = [Part::Vision, Part::Projector, Part::Text];

/// One measured step (after a warm-up step: the figures must not depend on the cache), with
/// gradients for `trainable` and the pixel gradient if asked; checks the plan and returns the
/// figures.
fn check<A: ActElem>(
    model: &Mistral3,
    batch: &Batch,
    trainable: &[Part],
    dpixels: bool,
    what: &str,
) -> (StepMemory, MemoryPlan) {
    let mut grads = model.grads(trainable).unwrap();
    let mut dpix: Option<Tensor<f32>> = dpixels.then(|| {
        let n = batch.images.pixel_values.len();
        model.exec.zeros(&[n]).unwrap()
    });
    let alloc = model.exec.allocator();
    let (_, first) = model
        .measure_step::<A>(batch, &mut grads, dpix.as_mut())
        .unwrap();
    let device_allocs = alloc.stats().num_device_allocs;
    let (_, mem) = model
        .measure_step::<A>(batch, &mut grads, dpix.as_mut())
        .unwrap();

    let shape = StepShape::of(&model.cfg, batch, model.exec.device()).unwrap();
    let p = plan(
        &model.cfg,
        &shape,
        A::PRECISION,
        model.loss_mode,
        trainable,
        dpixels,
    );
    let dpix_bytes = dpix.as_ref().map_or(0, |_| {
        cannon_runtime::alloc::round_size(4 * batch.images.pixel_values.len())
    });
    assert_eq!(
        mem.start_allocated,
        p.params + p.grads + dpix_bytes,
        "{what}: parameters + gradients + pixel gradient"
    );
    assert_eq!(
        mem.max_allocated - mem.start_allocated,
        p.peak(),
        "{what}: measured peak vs the plan (peak phase {}): {p:#?}",
        p.peak_phase()
    );
    assert_eq!(mem, first, "{what}: a second step has other figures");
    assert_eq!(
        alloc.stats().num_device_allocs,
        device_allocs,
        "{what}: the second step reserved new blocks"
    );
    assert!(mem.max_reserved >= mem.max_allocated, "{what}: {mem:?}");
    (mem, p)
}

#[test]
fn step_peak_equals_the_plan_on_every_fixture() {
    for name in ["shared", "gqa1", "wide", "tiny-seed7-sharded-4x"] {
        let dir = fixture(name);
        let (m, b) = (model(&dir), batch(&dir));
        check::<f32>(&m, &b, &ALL, true, &format!("{name} f32"));
        check::<half::bf16>(&m, &b, &ALL, true, &format!("{name} bf16"));
    }
}

#[test]
fn step_peak_equals_the_plan_for_frozen_parts_and_chunked_loss() {
    let dir = fixture("shared");
    let (mut m, b) = (model(&dir), batch(&dir));
    // The default: vision tower and projector frozen (no vision or projector backward).
    check::<f32>(&m, &b, &[Part::Text], false, "text only");
    // The projector trains, the tower does not (the projector's throwaway input gradient).
    check::<f32>(&m, &b, &[Part::Projector], false, "projector only");
    // Nothing trains: no backward below the head, so only the forward phases.
    check::<f32>(&m, &b, &[], false, "nothing trains");
    for rows in [7, 1000] {
        m.loss_mode = LossMode::Chunked(rows);
        check::<f32>(&m, &b, &ALL, true, &format!("chunked {rows}"));
        check::<half::bf16>(
            &m,
            &b,
            &[Part::Text],
            false,
            &format!("chunked {rows} bf16"),
        );
    }
    // Pixtral's GELU gate keeps one more [P, Iv] product in each pass.
    m.loss_mode = LossMode::Full;
    m.cfg.vision_config.hidden_act = HiddenAct::Gelu;
    check::<f32>(&m, &b, &ALL, true, "gelu gate");
}

/// bf16 saved activations take half the bytes of f32 ones; the peak drops by about the
/// difference of the saved activations that are stored as `A` (the f32 ones, the gradients and
/// the parameters are the same in both runs).
#[test]
fn bf16_activations_lower_the_peak() {
    let dir = fixture("shared");
    let (m, b) = (model(&dir), batch(&dir));
    let (f, pf) = check::<f32>(&m, &b, &ALL, true, "f32");
    let (h, ph) = check::<half::bf16>(&m, &b, &ALL, true, "bf16");
    // The figures, for `cargo test --test memory -- --nocapture`.
    for (what, mem, p) in [("f32", &f, &pf), ("bf16", &h, &ph)] {
        eprintln!(
            "{what}: max_allocated {} = start {} + plan peak {} ({}), max_reserved {}; saved \
             {:?}",
            mem.max_allocated,
            mem.start_allocated,
            p.peak(),
            p.peak_phase(),
            mem.max_reserved,
            p.saved
        );
    }
    assert!(h.max_allocated < f.max_allocated, "bf16 {h:?} vs f32 {f:?}");
    assert!(ph.saved.text_layer < pf.saved.text_layer);
    assert!(ph.saved.vision_layer < pf.saved.vision_layer);
    assert_eq!(ph.saved.text_embed, pf.saved.text_embed);
    assert_eq!((ph.params, ph.grads), (pf.params, pf.grads));
    assert_eq!(Precision::Bf16, <half::bf16 as ActElem>::PRECISION);
}

/// On an NPU the attention saves aclnn's softmax max and sum (16 f32 per token and head)
/// where the CPU saves one log-sum-exp; the plan for the NPU counts them, and the model's
/// private allocator (CANN's operator workspaces go to the device's shared one) peaks at that
/// plan to the byte.
#[cfg(feature = "npu")]
#[test]
fn on_an_npu_the_step_peak_equals_the_npu_plan() {
    use cannon_runtime::alloc::round_size;
    use cannon_runtime::Device;
    cannon_sys::emulator::select_for_tests().unwrap();
    let d = Device::Npu(0);
    let dir = fixture("shared");
    let stream = Arc::new(Stream::new(d).unwrap());
    let exec = DeviceCtx::with_allocator(stream, d.private_allocator().unwrap()).unwrap();
    let m = Mistral3::load_on(&dir, exec).unwrap();
    let b = batch(&dir);
    let (_, npu) = check::<f32>(&m, &b, &ALL, true, "npu f32");
    check::<half::bf16>(&m, &b, &[Part::Text], false, "npu bf16, text only");

    // The CPU's plan of the same step: each layer's statistics are 16 times smaller.
    let cpu_shape = StepShape::of(&m.cfg, &b, Device::Cpu).unwrap();
    let cpu = plan(&m.cfg, &cpu_shape, Precision::F32, m.loss_mode, &ALL, true);
    let t = b.input_ids.len();
    let p = cpu_shape.patches;
    let (hq, hv) = (
        m.cfg.text_config.num_attention_heads,
        m.cfg.vision_config.num_attention_heads,
    );
    assert_eq!(
        npu.saved.text_layer - cpu.saved.text_layer,
        round_size(64 * t * hq) - round_size(4 * t * hq)
    );
    assert_eq!(
        npu.saved.vision_layer - cpu.saved.vision_layer,
        round_size(64 * p * hv) - round_size(4 * p * hv)
    );
}
