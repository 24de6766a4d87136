//! The arguments both flash-attention ops share, checked as CANN documents them (see the
//! parent module), and the kernels' views of them.

use crate::nnopbase::INT_ARRAYS;
use crate::ops::*;
use cannon_kernels::attention::{BlockAttention, BlockPair, VarlenAttention};
use cannon_sys::aclnn::aclIntArray;
use std::ffi::{c_char, CStr};

const MASK: i64 = 2048;

/// The checked arguments both ops share.
pub(super) struct Fa {
    pub(super) q: Arc<TensorDesc>,
    pub(super) k: Arc<TensorDesc>,
    pub(super) v: Arc<TensorDesc>,
    pub(super) mask: Option<Arc<TensorDesc>>,
    pub(super) cu: Vec<usize>,
    /// Cumulative key/value ends: `cu` for self-attention.
    pub(super) cu_kv: Vec<usize>,
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) d: usize,
    pub(super) causal: bool,
    pub(super) scale: f32,
}

impl Fa {
    pub(super) fn attention(&self) -> VarlenAttention<'_> {
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
    pub(super) fn cross(&self) -> bool {
        self.cu != self.cu_kv
    }

    /// Sequence `i` of the queries against sequence `i` of the keys, for the block kernel.
    pub(super) fn pairs(&self) -> Vec<BlockPair> {
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

    pub(super) fn block<'p>(&self, pairs: &'p [BlockPair]) -> BlockAttention<'p> {
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
pub(super) fn check_common(
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

pub(super) fn check_softmax(t: &TensorDesc, name: &str, fa: &Fa) -> EmuResult<()> {
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
pub(super) fn check_mask(m: &Option<Arc<TensorDesc>>) -> EmuResult<()> {
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
