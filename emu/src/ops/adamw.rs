//! aclnnApplyAdamWV2 (aclnn_apply_adam_w_v2.h; docs/cann-api.md §0 item 8, §4), on
//! cannon-kernels' AdamW (torch's order of operations).
//!
//! In place on var, m, v; grad of the same shape and dtype (FLOAT; FLOAT16/BFLOAT16 are valid
//! on CANN but not implemented by the emulator). `step` is a one-element DEVICE tensor (INT64
//! or FLOAT) holding t - 1: the op adds 1 itself (torch_npu passes step - 1). amsgrad needs
//! maxGradNormOptionalRef and is not implemented by the emulator; maximize negates grad.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

/// # Safety
/// The C contract of aclnnApplyAdamWV2GetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnApplyAdamWV2GetWorkspaceSize(
    varRef: *mut aclTensor,
    mRef: *mut aclTensor,
    vRef: *mut aclTensor,
    maxGradNormOptionalRef: *mut aclTensor,
    grad: *const aclTensor,
    step: *const aclTensor,
    lr: f32,
    beta1: f32,
    beta2: f32,
    weightDecay: f32,
    eps: f32,
    amsgrad: bool,
    maximize: bool,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnApplyAdamWV2", workspaceSize, executor, || {
            let (p, m, v, g, st) = (
                tensor(varRef, "varRef")?,
                tensor(mRef, "mRef")?,
                tensor(vRef, "vRef")?,
                tensor(grad, "grad")?,
                tensor(step, "step")?,
            );
            if amsgrad || !maxGradNormOptionalRef.is_null() {
                return Err(invalid("amsgrad (maxGradNormOptionalRef) is valid on CANN but not implemented by the emulator"));
            }
            for (t, name) in [(&p, "varRef"), (&m, "mRef"), (&v, "vRef"), (&g, "grad")] {
                check(t, name, &[ACL_FLOAT])?;
                same_shape(&p, "varRef", t, name)?;
            }
            check(&st, "step", &[ACL_INT64, ACL_FLOAT])?;
            if st.numel() != 1 {
                return Err(invalid(format!(
                    "step has shape {:?}; it is a one-element tensor",
                    st.dims
                )));
            }
            for (name, x) in [
                ("lr", lr),
                ("beta1", beta1),
                ("beta2", beta2),
                ("weightDecay", weightDecay),
                ("eps", eps),
            ] {
                if !x.is_finite() {
                    return Err(invalid(format!("{name} = {x} is not finite")));
                }
            }
            let device = device_of(&[&p, &m, &v, &g, &st])?;
            let hp = cannon_kernels::adamw::AdamW {
                lr: lr as f64,
                beta1: beta1 as f64,
                beta2: beta2 as f64,
                eps: eps as f64,
                weight_decay: weightDecay as f64,
            };
            let job: OpJob = Arc::new(move || {
                let before = match st.dtype {
                    ACL_INT64 => access::read::<i64>(&st)?[0] as f64,
                    _ => access::read::<f32>(&st)?[0] as f64,
                };
                if !(before >= 0.0 && before.fract() == 0.0) {
                    return Err(invalid(format!(
                        "step holds {before}; it must be a whole number >= 0 (t - 1)"
                    )));
                }
                let t = before as u64 + 1;
                if step_in_place(&p, &m, &v, &g, &st, maximize, t, &hp)? {
                    return Ok(());
                }
                let (mut pv, mut mv, mut vv) = (
                    access::read::<f32>(&p)?,
                    access::read::<f32>(&m)?,
                    access::read::<f32>(&v)?,
                );
                let mut gv = access::read::<f32>(&g)?;
                if maximize {
                    gv.iter_mut().for_each(|x| *x = -*x);
                }
                cannon_kernels::adamw::host::adamw_step(&mut pv, &gv, &mut mv, &mut vv, t, &hp)
                    .map_err(kernel)?;
                access::write(&p, &pv)?;
                access::write(&m, &mv)?;
                access::write(&v, &vv)
            });
            Ok(Plan {
                workspace: 0,
                device,
                job,
            })
        })
    }
}

aclnn_phase2!(aclnnApplyAdamWV2);

/// The update straight on device memory when the four f32 tensors are contiguous and no two
/// of them (nor the step counter) share a byte: a shard's four tensors copied to the host
/// and three copied back would hold the shard's size seven times over (the embedding's shard
/// of a 1B model: 470 MB); false (nothing done) otherwise.
#[allow(clippy::too_many_arguments)]
fn step_in_place(
    p: &TensorDesc,
    m: &TensorDesc,
    v: &TensorDesc,
    g: &TensorDesc,
    st: &TensorDesc,
    maximize: bool,
    t: u64,
    hp: &cannon_kernels::adamw::AdamW,
) -> EmuResult<bool> {
    let all = [p, m, v, g, st];
    let apart =
        (0..all.len()).all(|i| (i + 1..all.len()).all(|j| access::disjoint(all[i], all[j])));
    if maximize || !apart {
        return Ok(false);
    }
    // SAFETY: this job is the only work on its tensors, and no two of them share a byte
    // (checked above): the three written slices and the read one are distinct memory.
    let (Some(pv), Some(mv), Some(vv), Some(gv)) = (unsafe {
        (
            access::span_slice_mut::<f32>(p)?,
            access::span_slice_mut::<f32>(m)?,
            access::span_slice_mut::<f32>(v)?,
            access::span_slice_mut::<f32>(g)?,
        )
    }) else {
        return Ok(false);
    };
    cannon_kernels::adamw::host::adamw_step(pv, gv, mv, vv, t, hp).map_err(kernel)?;
    Ok(true)
}
