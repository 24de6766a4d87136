//! Compile-time checks that the generated wrappers have the documented C signatures
//! (docs/cann-api.md §1.1, §2, §3.2-3.3, §4, §5) with the loader's `Result` around the C return
//! type. A mismatch is a build error of this test target, which CI builds with
//! `--all-targets`. (dtype/format are both `int`, so their order is checked at run time in
//! tests/fake_cann.rs.)

// The point of this file is spelling out whole C signatures.
#![allow(clippy::type_complexity)]

use std::ffi::{c_char, c_void};

use cannon_sys::acl::*;
use cannon_sys::aclnn::*;
use cannon_sys::hccl::*;
use cannon_sys::Error;

type R<T> = Result<T, Error>;
type Ex = *mut *mut aclOpExecutor;
type T = *const aclTensor;

// aclCreateTensor(viewDims, viewDimsNum, dataType, stride, offset, format, storageDims,
//                 storageDimsNum, tensorData)
const _: unsafe fn(
    *const i64,
    u64,
    aclDataType,
    *const i64,
    i64,
    aclFormat,
    *const i64,
    u64,
    *mut c_void,
) -> R<*mut aclTensor> = aclCreateTensor;
const _: unsafe fn(*const i64, u64) -> R<*mut aclIntArray> = aclCreateIntArray;
const _: unsafe fn(*mut c_void, aclDataType) -> R<*mut aclScalar> = aclCreateScalar;
const _: unsafe fn(*mut aclOpExecutor) -> R<aclnnStatus> = aclSetAclOpExecutorRepeatable;
const _: unsafe fn(*mut aclOpExecutor) -> R<aclnnStatus> = aclDestroyAclOpExecutor;

// Phase 2 of every op: (workspace, workspaceSize, executor, stream).
macro_rules! phase2 {
    ($($f:ident),* $(,)?) => {$(
        const _: unsafe fn(*mut c_void, u64, *mut aclOpExecutor, aclrtStream) -> R<aclnnStatus> =
            $f;
    )*};
}
phase2!(
    aclnnFlashAttentionVarLenScore,
    aclnnFlashAttentionUnpaddingScoreGrad,
    aclnnMatmul,
    aclnnMm,
    aclnnRmsNorm,
    aclnnRmsNormGrad,
    aclnnSwiGlu,
    aclnnSwiGluGrad,
    aclnnRotaryPositionEmbedding,
    aclnnRotaryPositionEmbeddingGrad,
    aclnnCrossEntropyLoss,
    aclnnCrossEntropyLossGrad,
    aclnnApplyAdamWV2,
    aclnnCast,
    aclnnAdd,
    aclnnAdds,
    aclnnInplaceAdd,
    aclnnMul,
    aclnnMuls,
    aclnnInplaceMul,
    aclnnInplaceMuls,
    aclnnEmbedding,
    aclnnEmbeddingDenseBackward,
);

// q, k, v, realShift, dropMask, paddingMask, attenMask, prefix, actualSeqQLen, actualSeqKvLen,
// scaleValue, keepProb, preTokens, nextTokens, headNum, inputLayout, innerPrecise, sparseMode,
// softmaxMax, softmaxSum, softmaxOut, attentionOut, workspaceSize, executor
type IA = *const aclIntArray;
const _: unsafe fn(
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    IA,
    IA,
    IA,
    f64,
    f64,
    i64,
    i64,
    i64,
    *mut c_char,
    i64,
    i64,
    T,
    T,
    T,
    T,
    *mut u64,
    Ex,
) -> R<aclnnStatus> = aclnnFlashAttentionVarLenScoreGetWorkspaceSize;
// q, k, v, dy, pse, dropMask, paddingMask, attenMask, softmaxMax, softmaxSum, softmaxIn,
// attentionIn, prefix, actualSeqQLen, actualSeqKvLen, scale, keepProb, pre, next, headNum,
// layout, innerPrecise, sparseMode, dq, dk, dv, dpse, workspaceSize, executor
const _: unsafe fn(
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    T,
    IA,
    IA,
    IA,
    f64,
    f64,
    i64,
    i64,
    i64,
    *mut c_char,
    i64,
    i64,
    T,
    T,
    T,
    T,
    *mut u64,
    Ex,
) -> R<aclnnStatus> = aclnnFlashAttentionUnpaddingScoreGradGetWorkspaceSize;
const _: unsafe fn(T, T, *mut aclTensor, i8, *mut u64, Ex) -> R<aclnnStatus> =
    aclnnMatmulGetWorkspaceSize;
const _: unsafe fn(T, T, f64, T, T, *mut u64, Ex) -> R<aclnnStatus> = aclnnRmsNormGetWorkspaceSize;
const _: unsafe fn(T, T, T, T, T, T, *mut u64, Ex) -> R<aclnnStatus> =
    aclnnRmsNormGradGetWorkspaceSize;
const _: unsafe fn(T, i64, T, *mut u64, Ex) -> R<aclnnStatus> = aclnnSwiGluGetWorkspaceSize;
const _: unsafe fn(T, T, i64, T, *mut u64, Ex) -> R<aclnnStatus> = aclnnSwiGluGradGetWorkspaceSize;
const _: unsafe fn(
    T,
    T,
    T,
    *mut c_char,
    i64,
    f64,
    f64,
    bool,
    T,
    T,
    T,
    T,
    *mut u64,
    Ex,
) -> R<aclnnStatus> = aclnnCrossEntropyLossGetWorkspaceSize;
const _: unsafe fn(
    T,
    T,
    T,
    T,
    T,
    T,
    *mut c_char,
    i64,
    f64,
    f64,
    T,
    *mut u64,
    Ex,
) -> R<aclnnStatus> = aclnnCrossEntropyLossGradGetWorkspaceSize;
// varRef, mRef, vRef, maxGradNormRef, grad, step, lr, beta1, beta2, weightDecay, eps, amsgrad,
// maximize
type M = *mut aclTensor;
const _: unsafe fn(
    M,
    M,
    M,
    M,
    T,
    T,
    f32,
    f32,
    f32,
    f32,
    f32,
    bool,
    bool,
    *mut u64,
    Ex,
) -> R<aclnnStatus> = aclnnApplyAdamWV2GetWorkspaceSize;
const _: unsafe fn(T, aclDataType, M, *mut u64, Ex) -> R<aclnnStatus> = aclnnCastGetWorkspaceSize;
const _: unsafe fn(T, T, *const aclScalar, M, *mut u64, Ex) -> R<aclnnStatus> =
    aclnnAddGetWorkspaceSize;
const _: unsafe fn(T, T, M, *mut u64, Ex) -> R<aclnnStatus> = aclnnMulGetWorkspaceSize;
const _: unsafe fn(T, T, M, *mut u64, Ex) -> R<aclnnStatus> = aclnnEmbeddingGetWorkspaceSize;
const _: unsafe fn(T, T, u64, u64, bool, T, *mut u64, Ex) -> R<aclnnStatus> =
    aclnnEmbeddingDenseBackwardGetWorkspaceSize;

// Runtime.
const _: unsafe fn(*mut *mut c_void, usize, aclrtMemMallocPolicy) -> R<aclError> = aclrtMalloc;
const _: unsafe fn(
    *mut c_void,
    usize,
    *const c_void,
    usize,
    aclrtMemcpyKind,
    aclrtStream,
) -> R<aclError> = aclrtMemcpyAsync;
const _: unsafe fn(*mut c_void, usize, i32, usize, aclrtStream) -> R<aclError> = aclrtMemsetAsync;
const _: unsafe fn(aclrtMemAttr, *mut usize, *mut usize) -> R<aclError> = aclrtGetMemInfo;
const _: unsafe fn(*mut f32, aclrtEvent, aclrtEvent) -> R<aclError> = aclrtEventElapsedTime;
const _: unsafe fn(*mut aclrtEvent, u32) -> R<aclError> = aclrtCreateEventWithFlag;
const _: unsafe fn(aclrtEvent, *mut aclrtEventRecordedStatus) -> R<aclError> =
    aclrtQueryEventStatus;

// HCCL.
const _: unsafe fn(
    *mut c_void,
    *mut c_void,
    u64,
    HcclDataType,
    HcclReduceOp,
    HcclComm,
    aclrtStream,
) -> R<HcclResult> = HcclAllReduce;
const _: unsafe fn(u32, *const HcclRootInfo, u32, *mut HcclComm) -> R<HcclResult> =
    HcclCommInitRootInfo;
const _: unsafe fn(
    *const c_void,
    *const c_void,
    *const c_void,
    HcclDataType,
    *const c_void,
    *const c_void,
    *const c_void,
    HcclDataType,
    HcclComm,
    aclrtStream,
) -> R<HcclResult> = HcclAlltoAllV;
const _: unsafe fn(HcclResult) -> R<*const c_char> = HcclGetErrorString;
const _: () = assert!(std::mem::size_of::<HcclRootInfo>() == HCCL_ROOT_INFO_BYTES as usize);
