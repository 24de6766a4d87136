//! aclnnRingAttentionUpdate (aclnn_ring_attention_update.h): merges two FlashAttention
//! results of the same queries by their softmax statistics, ring attention's step.
//!
//! ```text
//! m   = max(prev_max, cur_max)
//! p   = prev_sum e^(prev_max - m),  c = cur_sum e^(cur_max - m),  sum = p + c
//! out = prev_out p / sum + cur_out c / sum           (f32 arithmetic, one rounding on store)
//! ```
//!
//! (CANN's page writes the sum's second term without `cur_sum`; its reference code, the one
//! MindSpeed ships, multiplies by it, which is what merging two softmaxes needs.) Validated as
//! documented: attention outputs of one dtype (FLOAT or BFLOAT16; FLOAT16 valid on CANN, not
//! implemented here) and one shape, statistics FLOAT of one shape with a last dimension of 8.
//! The emulator implements the "SBH" layout: outputs `[S, B, H]`, statistics `[B, N, S, 8]`
//! (`H = N * D`), `actualSeqQlenOptional` null; "TND" (valid on CANN, with the sequence
//! lengths and D a multiple of 64) is refused by name.

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};
use std::ffi::{c_char, CStr};

/// # Safety
/// The C contract of aclnnRingAttentionUpdateGetWorkspaceSize (handles from this library,
/// `inputLayoutOptional` null or a C string, writable out-pointers).
#[no_mangle]
#[allow(clippy::too_many_arguments)] // the C signature
pub unsafe extern "C" fn aclnnRingAttentionUpdateGetWorkspaceSize(
    prevAttnOut: *const aclTensor,
    prevSoftmaxMax: *const aclTensor,
    prevSoftmaxSum: *const aclTensor,
    curAttnOut: *const aclTensor,
    curSoftmaxMax: *const aclTensor,
    curSoftmaxSum: *const aclTensor,
    actualSeqQlenOptional: *const aclTensor,
    inputLayoutOptional: *mut c_char,
    attnOutOut: *const aclTensor,
    softmaxMaxOut: *const aclTensor,
    softmaxSumOut: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers; the layout is null or a C string.
    unsafe {
        phase1("aclnnRingAttentionUpdate", workspaceSize, executor, || {
            let layout = if inputLayoutOptional.is_null() {
                "SBH".to_string()
            } else {
                CStr::from_ptr(inputLayoutOptional)
                    .to_string_lossy()
                    .into_owned()
            };
            match layout.as_str() {
                "SBH" => {}
                "TND" => {
                    return Err(invalid(
                        "inputLayout \"TND\" is valid on CANN but not implemented by the \
                         emulator (use \"SBH\")",
                    ))
                }
                l => {
                    return Err(invalid(format!(
                        "inputLayout {l:?}: takes \"SBH\" or \"TND\""
                    )))
                }
            }
            if !actualSeqQlenOptional.is_null() {
                return Err(invalid(
                    "actualSeqQlenOptional is for the TND layout; pass null with \"SBH\"",
                ));
            }
            let outs = [
                (tensor(prevAttnOut, "prevAttnOut")?, "prevAttnOut"),
                (tensor(curAttnOut, "curAttnOut")?, "curAttnOut"),
                (tensor(attnOutOut, "attnOutOut")?, "attnOutOut"),
            ];
            let stats = [
                (tensor(prevSoftmaxMax, "prevSoftmaxMax")?, "prevSoftmaxMax"),
                (tensor(prevSoftmaxSum, "prevSoftmaxSum")?, "prevSoftmaxSum"),
                (tensor(curSoftmaxMax, "curSoftmaxMax")?, "curSoftmaxMax"),
                (tensor(curSoftmaxSum, "curSoftmaxSum")?, "curSoftmaxSum"),
                (tensor(softmaxMaxOut, "softmaxMaxOut")?, "softmaxMaxOut"),
                (tensor(softmaxSumOut, "softmaxSumOut")?, "softmaxSumOut"),
            ];
            let (o0, n0) = &outs[0];
            check(o0, n0, &[ACL_FLOAT, ACL_BF16])?;
            if o0.dims.len() != 3 {
                return Err(invalid(format!(
                    "{n0} has shape {:?}; SBH outputs are [S, B, H]",
                    o0.dims
                )));
            }
            for (t, n) in &outs[1..] {
                check(t, n, &[o0.dtype])?;
                same_shape(o0, n0, t, n)?;
            }
            let (s0, sn0) = &stats[0];
            check(s0, sn0, &[ACL_FLOAT])?;
            let (s, b, h) = (o0.dims[0], o0.dims[1], o0.dims[2]);
            let heads = s0.dims.get(1).copied().unwrap_or(0);
            if s0.dims.len() != 4
                || s0.dims[0] != b
                || s0.dims[2] != s
                || s0.dims[3] != 8
                || heads < 1
                || h % heads != 0
            {
                return Err(invalid(format!(
                    "{sn0} has shape {:?}; with outputs [S, B, H] = {:?} SBH statistics are \
                     [B, N, S, 8] with H a multiple of N",
                    s0.dims, o0.dims
                )));
            }
            for (t, n) in &stats[1..] {
                check(t, n, &[ACL_FLOAT])?;
                same_shape(s0, sn0, t, n)?;
            }
            let all: Vec<&Arc<TensorDesc>> = outs
                .iter()
                .map(|(t, _)| t)
                .chain(stats.iter().map(|(t, _)| t))
                .collect();
            let device = device_of(&all)?;
            let [(po, _), (co, _), (oo, _)] = outs;
            let [(pm, _), (ps, _), (cm, _), (cs, _), (om, _), (os, _)] = stats;
            let dims = (s as usize, b as usize, heads as usize, (h / heads) as usize);
            let job: OpJob = Arc::new(move || {
                // Every input is read before anything is written: outputs may alias inputs.
                let (pov, cov) = (read_f32(&po)?, read_f32(&co)?);
                let (pmv, psv) = (access::read::<f32>(&pm)?, access::read::<f32>(&ps)?);
                let (cmv, csv) = (access::read::<f32>(&cm)?, access::read::<f32>(&cs)?);
                let (s, b, n, d) = dims;
                let mut out = vec![0f32; pov.len()];
                let (mut mx, mut sm) = (vec![0f32; pmv.len()], vec![0f32; psv.len()]);
                for bi in 0..b {
                    for hi in 0..n {
                        for si in 0..s {
                            let st = ((bi * n + hi) * s + si) * 8;
                            let m = pmv[st].max(cmv[st]);
                            let p = psv[st] * (pmv[st] - m).exp();
                            let c = csv[st] * (cmv[st] - m).exp();
                            let sum = p + c;
                            mx[st..st + 8].fill(m);
                            sm[st..st + 8].fill(sum);
                            let o = (si * b + bi) * n * d + hi * d;
                            for x in o..o + d {
                                out[x] = pov[x] * (p / sum) + cov[x] * (c / sum);
                            }
                        }
                    }
                }
                write_f32(&oo, &out)?;
                access::write(&om, &mx)?;
                access::write(&os, &sm)
            });
            Ok(Plan {
                workspace: 0,
                device,
                job,
            })
        })
    }
}

aclnn_phase2!(aclnnRingAttentionUpdate);
