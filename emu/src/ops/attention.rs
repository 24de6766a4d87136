//! aclnnFlashAttentionVarLenScore and aclnnFlashAttentionUnpaddingScoreGrad in TND layout
//! (aclnn_flash_attention_score{,_grad}.h; docs/cann-api.md §3), on cannon-kernels' varlen
//! attention.
//!
//! Validated as CANN documents the ops: q `[T, N, D]`, k/v `[T, Nkv, D]` of one dtype (FLOAT
//! or BFLOAT16; FLOAT16 valid on CANN, not implemented here), `inputLayout` exactly "TND",
//! `headNum` = N <= 256 and a multiple of Nkv, D in 1..=768 forward and 1..=512 backward,
//! `actualSeqQLen/KvLen` host arrays of cumulative ends without a leading 0 (non-decreasing,
//! ending at T, 1..=2048 entries; trailing zeros for unused batches allowed), `keepProb` 1
//! (dropout is not implemented), `sparseMode` 0 without a mask (full attention; pre/next
//! tokens must then cover the sequences) or 2/3 (causal; for Sq == Skv per sequence both are
//! the same triangle) with the 2048 x 2048 BOOL/UINT8 `triu(ones, 1)` mask, which the job
//! checks element by element. Query and key/value sequences may differ in length (a ring
//! attention block: queries against another rank's keys) for full attention; causal modes
//! need equal lengths per sequence here (CANN aligns the triangle bottom-right otherwise).
//! pse, dropMask, paddingMask and prefix must be null.
//!
//! softmaxMax/softmaxSum (FLOAT, T * N * 8 values each, NTD order) are the op's opaque
//! forward-to-backward state; here max holds the row's log-sum-exp and sum holds 1 (so that
//! max + ln(sum) is the log-sum-exp, as for the real pair), repeated 8 times.
#![allow(non_snake_case)]

mod args;

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use args::{check_common, check_mask, check_softmax};
use cannon_kernels::attention::{
    host::block_backward_accumulate, host::block_forward_merge, Qkv, QkvGrad,
};
use cannon_sys::aclnn::{aclIntArray, aclOpExecutor, aclnnStatus};
use std::ffi::c_char;

/// # Safety
/// The C contract of aclnnFlashAttentionVarLenScoreGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnFlashAttentionVarLenScoreGetWorkspaceSize(
    query: *const aclTensor,
    key: *const aclTensor,
    value: *const aclTensor,
    realShiftOptional: *const aclTensor,
    dropMaskOptional: *const aclTensor,
    paddingMaskOptional: *const aclTensor,
    attenMaskOptional: *const aclTensor,
    prefixOptional: *const aclIntArray,
    actualSeqQLenOptional: *const aclIntArray,
    actualSeqKvLenOptional: *const aclIntArray,
    scaleValue: f64,
    keepProb: f64,
    preTokens: i64,
    nextTokens: i64,
    headNum: i64,
    inputLayout: *mut c_char,
    innerPrecise: i64,
    sparseMode: i64,
    softmaxMaxOut: *const aclTensor,
    softmaxSumOut: *const aclTensor,
    softmaxOutOut: *const aclTensor,
    attentionOutOut: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers; inputLayout is null or a C string.
    unsafe {
        phase1(
            "aclnnFlashAttentionVarLenScore",
            workspaceSize,
            executor,
            || {
                let fa = check_common(
                    tensor(query, "query")?,
                    tensor(key, "key")?,
                    tensor(value, "value")?,
                    &[
                        (realShiftOptional, "realShiftOptional (pse)"),
                        (dropMaskOptional, "dropMaskOptional"),
                        (paddingMaskOptional, "paddingMaskOptional"),
                    ],
                    attenMaskOptional,
                    prefixOptional,
                    actualSeqQLenOptional,
                    actualSeqKvLenOptional,
                    scaleValue,
                    keepProb,
                    preTokens,
                    nextTokens,
                    headNum,
                    inputLayout,
                    innerPrecise,
                    sparseMode,
                    768,
                )?;
                let (mx, sm, out) = (
                    tensor(softmaxMaxOut, "softmaxMaxOut")?,
                    tensor(softmaxSumOut, "softmaxSumOut")?,
                    tensor(attentionOutOut, "attentionOutOut")?,
                );
                if let Some(so) = opt_tensor(softmaxOutOut, "softmaxOutOut")? {
                    if so.numel() != 0 {
                        return Err(invalid(
                            "softmaxOutOut is a reserved placeholder: pass null or an empty tensor",
                        ));
                    }
                }
                check_softmax(&mx, "softmaxMaxOut", &fa)?;
                check_softmax(&sm, "softmaxSumOut", &fa)?;
                check(&out, "attentionOutOut", &[fa.q.dtype])?;
                same_shape(&fa.q, "query", &out, "attentionOutOut")?;
                let mut ts = vec![&fa.q, &fa.k, &fa.v, &mx, &sm, &out];
                if let Some(m) = &fa.mask {
                    ts.push(m);
                }
                let device = device_of(&ts)?;
                let job: OpJob = Arc::new(move || {
                    check_mask(&fa.mask)?;
                    let a = fa.attention();
                    let (t, n) = (a.tokens, a.q_heads);
                    let mut lse = vec![0f32; t * n];
                    crate::with_float!(fa.q.dtype, E => {
                        let (q, k, v): (Vec<E>, Vec<E>, Vec<E>) = (read_as(&fa.q)?, read_as(&fa.k)?, read_as(&fa.v)?);
                        if fa.cross() {
                            // The block kernel merges into f32 accumulators that start empty.
                            let pairs = fa.pairs();
                            let mut o = vec![0f32; q.len()];
                            lse.fill(f32::NEG_INFINITY);
                            block_forward_merge(&fa.block(&pairs), &q, &k, &v, &mut o, &mut lse).map_err(kernel)?;
                            write_f32(&out, &o)
                        } else {
                            let mut o = q.clone();
                            cannon_kernels::attention::host::forward(&a, Qkv { q: &q, k: &k, v: &v }, &mut o, &mut lse).map_err(kernel)?;
                            access::write(&out, &o)
                        }
                    })?;
                    // NTD order, 8 copies per row.
                    let mut m = vec![0f32; t * n * 8];
                    for h in 0..n {
                        for tok in 0..t {
                            m[(h * t + tok) * 8..(h * t + tok + 1) * 8].fill(lse[tok * n + h]);
                        }
                    }
                    access::write(&mx, &m)?;
                    access::write(&sm, &vec![1f32; t * n * 8])
                });
                Ok(Plan {
                    workspace: 64 << 10,
                    device,
                    job,
                })
            },
        )
    }
}

/// # Safety
/// The C contract of aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize(
    query: *const aclTensor,
    keyIn: *const aclTensor,
    value: *const aclTensor,
    dy: *const aclTensor,
    pseShiftOptional: *const aclTensor,
    dropMaskOptional: *const aclTensor,
    paddingMaskOptional: *const aclTensor,
    attenMaskOptional: *const aclTensor,
    softmaxMaxOptional: *const aclTensor,
    softmaxSumOptional: *const aclTensor,
    softmaxInOptional: *const aclTensor,
    attentionInOptional: *const aclTensor,
    prefixOptional: *const aclIntArray,
    actualSeqQLenOptional: *const aclIntArray,
    actualSeqKvLenOptional: *const aclIntArray,
    scaleValue: f64,
    keepProb: f64,
    preTokens: i64,
    nextTokens: i64,
    headNum: i64,
    inputLayout: *mut c_char,
    innerPrecise: i64,
    sparseMode: i64,
    dqOut: *const aclTensor,
    dkOut: *const aclTensor,
    dvOut: *const aclTensor,
    dpseOut: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers; inputLayout is null or a C string.
    unsafe {
        phase1(
            "aclnnFlashAttentionUnpaddingScoreGrad",
            workspaceSize,
            executor,
            || {
                let fa = check_common(
                    tensor(query, "query")?,
                    tensor(keyIn, "keyIn")?,
                    tensor(value, "value")?,
                    &[
                        (pseShiftOptional, "pseShiftOptional"),
                        (dropMaskOptional, "dropMaskOptional"),
                        (paddingMaskOptional, "paddingMaskOptional"),
                        (softmaxInOptional, "softmaxInOptional"),
                        (dpseOut, "dpseOut"),
                    ],
                    attenMaskOptional,
                    prefixOptional,
                    actualSeqQLenOptional,
                    actualSeqKvLenOptional,
                    scaleValue,
                    keepProb,
                    preTokens,
                    nextTokens,
                    headNum,
                    inputLayout,
                    innerPrecise,
                    sparseMode,
                    512,
                )?;
                let dyt = tensor(dy, "dy")?;
                let (mx, sm) = match (opt_tensor(softmaxMaxOptional, "softmaxMaxOptional")?, opt_tensor(softmaxSumOptional, "softmaxSumOptional")?) {
                (Some(a), Some(b)) => (a, b),
                _ => return Err(EmuError::new(PARAM_NULLPTR, "softmaxMax/softmaxSum from the forward are required (the emulator does not recompute them)")),
            };
                let Some(out) = opt_tensor(attentionInOptional, "attentionInOptional")? else {
                    return Err(EmuError::new(
                        PARAM_NULLPTR,
                        "attentionInOptional (the forward's output) is required",
                    ));
                };
                let (dq, dk, dv) = (
                    tensor(dqOut, "dqOut")?,
                    tensor(dkOut, "dkOut")?,
                    tensor(dvOut, "dvOut")?,
                );
                check_softmax(&mx, "softmaxMaxOptional", &fa)?;
                check_softmax(&sm, "softmaxSumOptional", &fa)?;
                for (t, n, like, ln) in [
                    (&dyt, "dy", &fa.q, "query"),
                    (&out, "attentionInOptional", &fa.q, "query"),
                    (&dq, "dqOut", &fa.q, "query"),
                    (&dk, "dkOut", &fa.k, "keyIn"),
                    (&dv, "dvOut", &fa.v, "value"),
                ] {
                    check(t, n, &[fa.q.dtype])?;
                    same_shape(like, ln, t, n)?;
                }
                let mut ts = vec![&fa.q, &fa.k, &fa.v, &dyt, &mx, &sm, &out, &dq, &dk, &dv];
                if let Some(m) = &fa.mask {
                    ts.push(m);
                }
                let device = device_of(&ts)?;
                let job: OpJob = Arc::new(move || {
                    check_mask(&fa.mask)?;
                    let a = fa.attention();
                    let (t, n) = (a.tokens, a.q_heads);
                    let (mv, sv) = (access::read::<f32>(&mx)?, access::read::<f32>(&sm)?);
                    let mut lse = vec![0f32; t * n];
                    for h in 0..n {
                        for tok in 0..t {
                            let i = (h * t + tok) * 8;
                            lse[tok * n + h] = mv[i] + sv[i].ln();
                        }
                    }
                    crate::with_float!(fa.q.dtype, E => {
                        let (q, k, v): (Vec<E>, Vec<E>, Vec<E>) = (read_as(&fa.q)?, read_as(&fa.k)?, read_as(&fa.v)?);
                        let (o, g): (Vec<E>, Vec<E>) = (read_as(&out)?, read_as(&dyt)?);
                        if fa.cross() {
                            let pairs = fa.pairs();
                            let (mut gq, mut gk, mut gv) = (vec![0f32; q.len()], vec![0f32; k.len()], vec![0f32; v.len()]);
                            block_backward_accumulate(&fa.block(&pairs), (&q, &k, &v), &o, &lse, &g, &mut gq, &mut gk, &mut gv).map_err(kernel)?;
                            write_f32(&dq, &gq)?;
                            write_f32(&dk, &gk)?;
                            return write_f32(&dv, &gv);
                        }
                        let (mut gq, mut gk, mut gv) = (q.clone(), k.clone(), v.clone());
                        cannon_kernels::attention::host::backward(
                            &a,
                            Qkv { q: &q, k: &k, v: &v },
                            &o,
                            &lse,
                            &g,
                            QkvGrad { dq: &mut gq, dk: &mut gk, dv: &mut gv },
                        )
                        .map_err(kernel)?;
                        access::write(&dq, &gq)?;
                        access::write(&dk, &gk)?;
                        access::write(&dv, &gv)
                    })
                });
                Ok(Plan {
                    workspace: 64 << 10,
                    device,
                    job,
                })
            },
        )
    }
}

aclnn_phase2!(
    aclnnFlashAttentionVarLenScore,
    aclnnFlashAttentionUnpaddingScoreGrad
);
