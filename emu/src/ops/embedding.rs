//! aclnnEmbedding and aclnnEmbeddingDenseBackward (aclnn_embedding.h,
//! aclnn_embedding_dense_backward.h; docs/cann-api.md §4).
//!
//! `out[i] = weight[indices[i]]` (weight `[V, D]`, indices INT64/INT32 of any shape, out
//! `indices.shape + [D]`); the backward writes `out [numWeights, D]`, the scatter-add of
//! `grad` rows by index (f32 accumulation, one rounding), skipping row `paddingIdx` (an index
//! past the table, e.g. torch's -1 as uint64, means no padding row); `scaleGradByFreq`
//! divides each row by its index's count. An index outside the table is a device-side fault
//! when the op runs (the host cannot read device indices), reported at the next synchronise.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

const INDEX: &[aclDataType] = &[ACL_INT64, ACL_INT32];

fn row_index(i: i64, v: usize, at: usize) -> EmuResult<usize> {
    if i < 0 || i as usize >= v {
        return Err(EmuError::new(
            cannon_sys::acl::ACL_ERROR_RT_AICORE_EXCEPTION,
            format!(
                "index {i} at position {at} is outside the table of {v} rows (aicore exception)"
            ),
        ));
    }
    Ok(i as usize)
}

/// # Safety
/// The C contract of aclnnEmbeddingGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnEmbeddingGetWorkspaceSize(
    weight: *const aclTensor,
    indices: *const aclTensor,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnEmbedding", workspaceSize, executor, || {
            let (w, idx, o) = (
                tensor(weight, "weight")?,
                tensor(indices, "indices")?,
                tensor(out, "out")?,
            );
            check(&w, "weight", FLOATS)?;
            check(&idx, "indices", INDEX)?;
            check(&o, "out", &[w.dtype])?;
            if w.dims.len() != 2 {
                return Err(invalid(format!(
                    "weight has shape {:?}, expected [V, D]",
                    w.dims
                )));
            }
            let mut want = idx.dims.clone();
            want.push(w.dims[1]);
            if o.dims != want {
                return Err(invalid(format!(
                    "out has shape {:?}, expected {want:?}",
                    o.dims
                )));
            }
            let device = device_of(&[&w, &idx, &o])?;
            let (v, d) = (w.dims[0] as usize, w.dims[1] as usize);
            let job: OpJob = Arc::new(move || {
                let ids = read_i64(&idx)?;
                crate::with_float!(w.dtype, E => {
                    let ov = {
                        // The table in place when it is contiguous: a forward reads a few
                        // rows of it, and a copy of a 131 k-row table is GBs.
                        // SAFETY: only read, and `out` is written after the slice's last use.
                        let borrowed = match w.is_contiguous() {
                            true => access::span_slice::<E>(&w)?,
                            false => None,
                        };
                        let owned: Vec<E>;
                        let wv: &[E] = match borrowed {
                            Some(b) => b,
                            None => {
                                owned = read_as(&w)?;
                                &owned
                            }
                        };
                        let mut ov = Vec::with_capacity(ids.len() * d);
                        for (at, &i) in ids.iter().enumerate() {
                            let r = row_index(i, v, at)?;
                            ov.extend_from_slice(&wv[r * d..(r + 1) * d]);
                        }
                        ov
                    };
                    access::write(&o, &ov)
                })
            });
            Ok(Plan {
                workspace: 0,
                device,
                job,
            })
        })
    }
}

/// # Safety
/// The C contract of aclnnEmbeddingDenseBackwardGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnEmbeddingDenseBackwardGetWorkspaceSize(
    grad: *const aclTensor,
    indices: *const aclTensor,
    numWeights: u64,
    paddingIdx: u64,
    scaleGradByFreq: bool,
    out: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1(
            "aclnnEmbeddingDenseBackward",
            workspaceSize,
            executor,
            || {
                let (g, idx, o) = (
                    tensor(grad, "grad")?,
                    tensor(indices, "indices")?,
                    tensor(out, "out")?,
                );
                check(&g, "grad", FLOATS)?;
                check(&idx, "indices", INDEX)?;
                check(&o, "out", &[g.dtype])?;
                let d = *g.dims.last().ok_or_else(|| invalid("grad is 0-D"))?;
                if g.dims[..g.dims.len() - 1] != idx.dims[..] {
                    return Err(invalid(format!(
                        "grad {:?} must be indices {:?} + [D]",
                        g.dims, idx.dims
                    )));
                }
                if o.dims != [numWeights as i64, d] {
                    return Err(invalid(format!(
                        "out has shape {:?}, expected [{numWeights}, {d}]",
                        o.dims
                    )));
                }
                let device = device_of(&[&g, &idx, &o])?;
                let (v, d) = (numWeights as usize, d as usize);
                let job: OpJob = Arc::new(move || {
                    let ids = read_i64(&idx)?;
                    let gv = read_f32(&g)?;
                    // An f32 gradient table is summed into in place when it shares no byte
                    // with the inputs (it is as large as the embedding: hundreds of MB).
                    let direct = match o.dtype == ACL_FLOAT
                        && access::disjoint(&o, &g)
                        && access::disjoint(&o, &idx)
                    {
                        // SAFETY: the only slice of `out`, which no input shares a byte with;
                        // this job is the only work on it.
                        true => access::span_slice_mut::<f32>(&o)?,
                        false => None,
                    };
                    let in_place = direct.is_some();
                    let mut owned = Vec::new();
                    let acc: &mut [f32] = match direct {
                        Some(a) => {
                            a.fill(0.0);
                            a
                        }
                        None => {
                            owned.resize(v * d, 0f32);
                            &mut owned
                        }
                    };
                    let mut count = vec![0u32; v];
                    for (at, &i) in ids.iter().enumerate() {
                        let r = row_index(i, v, at)?;
                        if r as u64 == paddingIdx {
                            continue;
                        }
                        count[r] += 1;
                        for (a, x) in acc[r * d..(r + 1) * d]
                            .iter_mut()
                            .zip(&gv[at * d..(at + 1) * d])
                        {
                            *a += x;
                        }
                    }
                    if scaleGradByFreq {
                        for (r, &c) in count.iter().enumerate().filter(|(_, &c)| c > 1) {
                            acc[r * d..(r + 1) * d]
                                .iter_mut()
                                .for_each(|a| *a /= c as f32);
                        }
                    }
                    match in_place {
                        true => Ok(()),
                        false => write_f32(&o, &owned),
                    }
                });
                Ok(Plan {
                    workspace: 0,
                    device,
                    job,
                })
            },
        )
    }
}

aclnn_phase2!(aclnnEmbedding, aclnnEmbeddingDenseBackward);
