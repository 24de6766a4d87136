//! The optimizer offload on an NPU (`--features npu`; the CANN emulator when the machine has
//! no CANN): the f32 master weights and AdamW's moments in the host pool's pinned memory,
//! each group copied to the device for its use (the next one ahead on the pool's copy
//! stream) and streamed through it for its update. The emulator rejects host memory where a
//! kernel wants device memory, so a pass or an update that handed a kernel the host copy
//! fails here; it runs each stream on its own thread, so the copies and the compute really
//! are ordered by the events (a missing wait is a race, not caught every time: removing the
//! wait on a prefetched group did not fail this test in one try). One test in this file: the
//! device allocator is the process's.
#![cfg(feature = "npu")]

mod fsdp_fixture;
use fsdp_fixture as fx;

use cannon_runtime::Device;
use cannon_trainer::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use cannon_trainer::model::{DeviceCtx, LossMode, Mistral3, ParamLayout, Params, Part};

#[test]
fn optimizer_offload_on_the_npu_trains_bit_for_bit_from_pinned_host_memory() {
    cannon_sys::emulator::select_for_tests().unwrap();
    let cfg = fx::config();
    let host = fx::init(&cfg, 5);
    let batches = fx::global_batch(3, 9);
    let layout = ParamLayout::new(&cfg);
    let round = cannon_runtime::alloc::round_size;
    let trainable = [Part::Projector, Part::Text];
    let masters: usize = layout.groups.iter().map(|g| round(4 * g.len)).sum();
    let moments: usize = 2 * layout
        .groups
        .iter()
        .filter(|g| trainable.contains(&g.part))
        .map(|g| round(4 * g.len))
        .sum::<usize>();
    let run = |offload: bool| {
        let exec = DeviceCtx::new(Device::Npu(0))
            .unwrap()
            .with_host_pool()
            .unwrap();
        let params = Params::from_host(&exec, layout.clone(), &host).unwrap();
        let mut m = Mistral3 {
            cfg: cfg.clone(),
            params,
            loss_mode: LossMode::Full,
            memory: Default::default(),
            exec: exec.clone(),
        };
        let mut grads = m.grads(&trainable).unwrap();
        let hp = AdamWConfig {
            lr: 1e-2,
            ..AdamWConfig::default()
        };
        let mut opt = AdamW::new(&exec, hp, &grads).unwrap();
        let st = exec.stream();
        if offload {
            let before = exec.memory().allocated;
            opt.offload(&exec, &mut m.params).unwrap();
            st.synchronize().unwrap();
            assert!(m.params.is_offloaded());
            assert_eq!(
                before - exec.memory().allocated,
                masters + moments,
                "the masters' and moments' device blocks were freed"
            );
        }
        let mut losses = Vec::new();
        for _ in 0..2 {
            for b in &batches {
                grads.zero(st).unwrap();
                let acts = m.forward::<f32>(b).unwrap();
                m.backward(b, &acts, &mut grads, None).unwrap();
                losses.push(acts.loss().to_bits());
                drop(acts);
                clip_grad_norm(st, &mut grads, 1.0).unwrap();
                opt.update(st, &mut m.params, &grads, 1e-2).unwrap();
            }
        }
        let mut state: Vec<Vec<u32>> = m
            .params
            .to_host(st)
            .unwrap()
            .iter()
            .map(|g| g.iter().map(|x| x.to_bits()).collect())
            .collect();
        for t in opt.m.iter().chain(&opt.v).flatten() {
            state.push(t.to_host(st).unwrap().iter().map(|x| x.to_bits()).collect());
        }
        (losses, state)
    };
    let (l0, s0) = run(false);
    let (l1, s1) = run(true);
    assert_eq!(l1, l0, "losses");
    assert!(s1 == s0, "parameters or moments differ");
}
