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

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use crate::nnopbase::INT_ARRAYS;
use cannon_kernels::attention::{
    host::block_backward_accumulate, host::block_forward_merge, BlockAttention, BlockPair, Qkv,
    QkvGrad, VarlenAttention,
};
use cannon_sys::aclnn::{aclIntArray, aclOpExecutor, aclnnStatus};
use std::ffi::{c_char, CStr};

const MASK: i64 = 2048;

/// The checked arguments both ops share.
struct Fa {
    q: Arc<TensorDesc>,
    k: Arc<TensorDesc>,
    v: Arc<TensorDesc>,
    mask: Option<Arc<TensorDesc>>,
    cu: Vec<usize>,
    /// Cumulative key/value ends: `cu` for self-attention.
    cu_kv: Vec<usize>,
    heads: usize,
    kv_heads: usize,
    d: usize,
    causal: bool,
    scale: f32,
}

impl Fa {
    fn attention(&self) -> VarlenAttention<'_> {
        VarlenAttention::new(
            &self.cu,
            self.q.dims[0] as usize,
            self.heads,
            self.kv_heads,
            self.d,
            self.causal,
        )
        .with_scale(self.scale)
    }

    /// Queries and keys/values of different lengths.
    fn cross(&self) -> bool {
        self.cu != self.cu_kv
    }

    /// Sequence `i` of the queries against sequence `i` of the keys, for the block kernel.
    fn pairs(&self) -> Vec<BlockPair> {
        let starts = |cu: &[usize]| {
            std::iter::once(0)
                .chain(cu.iter().copied())
                .collect::<Vec<_>>()
        };
        let (sq, sk) = (starts(&self.cu), starts(&self.cu_kv));
        (0..self.cu.len())
            .map(|i| BlockPair {
                q: sq[i]..sq[i + 1],
                k: sk[i]..sk[i + 1],
                causal: self.causal,
            })
            .collect()
    }

    fn block<'p>(&self, pairs: &'p [BlockPair]) -> BlockAttention<'p> {
        BlockAttention {
            pairs,
            q_tokens: self.q.dims[0] as usize,
            k_tokens: self.k.dims[0] as usize,
            q_heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.d,
            scale: self.scale,
        }
    }
}

fn seq_lens(h: *const aclIntArray, name: &str, t: i64) -> EmuResult<Vec<usize>> {
    if h.is_null() {
        return Err(EmuError::new(
            PARAM_NULLPTR,
            format!("{name} is null: the TND layout needs the cumulative sequence lengths"),
        ));
    }
    let a = INT_ARRAYS
        .get(h as usize)
        .map_err(|e| EmuError::new(e.code, format!("{name}: {}", e.message)))?;
    if a.is_empty() || a.len() > 2048 {
        return Err(invalid(format!(
            "{name} has {} entries; the batch must be 1..=2048",
            a.len()
        )));
    }
    // Trailing zeros mark unused batches (CANN's `[2, 5, 9, 0, 0]`).
    let used = a.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
    let mut prev = 0i64;
    for (i, &end) in a[..used].iter().enumerate() {
        if end < prev {
            return Err(invalid(format!(
                "{name} {:?} is not cumulative: entry {i} ({end}) is below the previous end {prev} (the arrays hold cumulative ends without a leading 0, not lengths)",
                &a[..]
            )));
        }
        prev = end;
    }
    if prev != t {
        return Err(invalid(format!(
            "{name} {:?} ends at {prev}, but the tensors hold T = {t} tokens",
            &a[..]
        )));
    }
    Ok(a[..used].iter().map(|&x| x as usize).collect())
}

#[allow(clippy::too_many_arguments)]
fn check_common(
    q: Arc<TensorDesc>,
    k: Arc<TensorDesc>,
    v: Arc<TensorDesc>,
    unsupported: &[(*const aclTensor, &str)],
    mask: *const aclTensor,
    prefix: *const aclIntArray,
    seq_q: *const aclIntArray,
    seq_kv: *const aclIntArray,
    scale: f64,
    keep_prob: f64,
    pre: i64,
    next: i64,
    head_num: i64,
    layout: *const c_char,
    inner_precise: i64,
    sparse_mode: i64,
    max_d: usize,
) -> EmuResult<Fa> {
    if layout.is_null() {
        return Err(EmuError::new(PARAM_NULLPTR, "inputLayout is null"));
    }
    // SAFETY: non-null C string (the caller's contract).
    let l = unsafe { CStr::from_ptr(layout) }
        .to_string_lossy()
        .into_owned();
    if l != "TND" {
        return Err(invalid(format!(
            "inputLayout {l:?}: the varlen ops take \"TND\""
        )));
    }
    for (t, n) in [(&q, "query"), (&k, "key"), (&v, "value")] {
        check(t, n, FLOATS)?;
        if t.dims.len() != 3 {
            return Err(invalid(format!(
                "{n} has shape {:?}; TND tensors are [T, N, D]",
                t.dims
            )));
        }
    }
    if k.dtype != q.dtype || v.dtype != q.dtype {
        return Err(invalid("query, key and value must have one dtype"));
    }
    for (p, n) in unsupported {
        if !p.is_null() {
            return Err(invalid(format!(
                "{n} is not implemented by the emulator (pass null)"
            )));
        }
    }
    if !prefix.is_null() {
        return Err(invalid(
            "prefixOptional is for sparse modes 5/6, which the emulator does not implement",
        ));
    }
    let (t, n, d) = (q.dims[0], q.dims[1], q.dims[2]);
    let t_kv = k.dims[0];
    if v.dims[0] != t_kv || k.dims[1] != v.dims[1] {
        return Err(invalid(format!(
            "key {:?}, value {:?}: T and Nkv must agree",
            k.dims, v.dims
        )));
    }
    if k.dims[2] != d {
        return Err(invalid(format!(
            "key's head dim {} differs from query's {d}",
            k.dims[2]
        )));
    }
    if v.dims[2] != d {
        return Err(invalid(format!("value's head dim {} != {d}: Dv < D is valid on CANN but not implemented by the emulator", v.dims[2])));
    }
    if d < 1 || d as usize > max_d {
        return Err(invalid(format!("head dim {d} is outside 1..={max_d}")));
    }
    let nkv = k.dims[1];
    if head_num != n {
        return Err(invalid(format!(
            "headNum {head_num} differs from query's N = {n}"
        )));
    }
    if !(1..=256).contains(&n) || nkv < 1 || n % nkv != 0 {
        return Err(invalid(format!(
            "N = {n} query heads must be in 1..=256 and a multiple of the {nkv} key/value heads"
        )));
    }
    if !scale.is_finite() {
        return Err(invalid(format!("scaleValue {scale} is not finite")));
    }
    if keep_prob != 1.0 {
        return Err(invalid(format!(
            "keepProb {keep_prob}: dropout is not implemented by the emulator (pass 1)"
        )));
    }
    if !(0..=2).contains(&inner_precise) {
        return Err(invalid(format!(
            "innerPrecise {inner_precise} is not 0, 1 or 2"
        )));
    }
    let cu = seq_lens(seq_q, "actualSeqQLenOptional", t)?;
    let cukv = seq_lens(seq_kv, "actualSeqKvLenOptional", t_kv)?;
    if cu.len() != cukv.len() {
        return Err(invalid(format!(
            "actualSeqQLenOptional names {} sequences, actualSeqKvLenOptional {}",
            cu.len(),
            cukv.len()
        )));
    }
    let lens = |cu: &[usize]| {
        let mut prev = 0;
        cu.iter()
            .map(|&e| {
                let l = e - prev;
                prev = e;
                l
            })
            .collect::<Vec<_>>()
    };
    let (lq, lkv) = (lens(&cu), lens(&cukv));
    let maxlen = lq.iter().chain(&lkv).copied().max().unwrap_or(0) as i64;
    let mask = opt_tensor(mask, "attenMaskOptional")?;
    let causal = match sparse_mode {
        0 => {
            if mask.is_some() {
                return Err(invalid("sparseMode 0 with an explicit mask is not implemented by the emulator (use 2/3 for causal)"));
            }
            if pre < maxlen || next < maxlen {
                return Err(invalid(format!(
                    "sparseMode 0 with preTokens {pre} / nextTokens {next} below the longest sequence ({maxlen}) is a sliding window, not implemented by the emulator"
                )));
            }
            false
        }
        2 | 3 => {
            let Some(m) = &mask else {
                return Err(EmuError::new(
                    PARAM_NULLPTR,
                    format!("sparseMode {sparse_mode} needs the 2048 x 2048 compressed attenMask"),
                ));
            };
            check(m, "attenMaskOptional", &[ACL_BOOL, ACL_UINT8])?;
            if let Some(i) = (0..lq.len()).find(|&i| lq[i] != lkv[i]) {
                return Err(invalid(format!(
                    "sparseMode {sparse_mode} on sequence {i} of {} queries and {} keys: causal \
                     attention between sequences of different lengths is valid on CANN but \
                     not implemented by the emulator",
                    lq[i], lkv[i]
                )));
            }
            if m.dims != [MASK, MASK] {
                return Err(invalid(format!("attenMask has shape {:?}; sparseMode {sparse_mode} takes the compressed [2048, 2048] mask", m.dims)));
            }
            true
        }
        1 | 4 | 6 | 7 | 8 => {
            return Err(invalid(format!(
            "sparseMode {sparse_mode} is valid for TND on CANN but not implemented by the emulator"
        )))
        }
        m => {
            return Err(invalid(format!(
                "sparseMode {m} is not valid for the TND layout (0-4, 6-8)"
            )))
        }
    };
    Ok(Fa {
        q,
        k,
        v,
        mask,
        cu,
        cu_kv: cukv,
        heads: n as usize,
        kv_heads: nkv as usize,
        d: d as usize,
        causal,
        scale: scale as f32,
    })
}

fn check_softmax(t: &TensorDesc, name: &str, fa: &Fa) -> EmuResult<()> {
    check(t, name, &[ACL_FLOAT])?;
    let want = fa.q.dims[0] as usize * fa.heads * 8;
    if t.numel() != want {
        return Err(invalid(format!(
            "{name} holds {} values; TND takes T * N * 8 = {want}",
            t.numel()
        )));
    }
    Ok(())
}

/// The compressed causal mask must be `triu(ones(2048, 2048), 1)`.
fn check_mask(m: &Option<Arc<TensorDesc>>) -> EmuResult<()> {
    let Some(m) = m else { return Ok(()) };
    let v = access::read::<u8>(m)?;
    for (i, row) in v.chunks(MASK as usize).enumerate() {
        if let Some(j) = row
            .iter()
            .enumerate()
            .position(|(j, &x)| (x != 0) != (j > i))
        {
            return Err(invalid(format!(
                "attenMask[{i}][{j}] = {}: the compressed causal mask is triu(ones(2048, 2048), 1)",
                row[j]
            )));
        }
    }
    Ok(())
}

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
