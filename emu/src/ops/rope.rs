//! aclnnRotaryPositionEmbedding (aclnn_rotary_position_embedding.h; docs/cann-api.md §4).
//!
//! `out = x * cos + rotate(x) * sin` on 4-D x (BSND / BNSD / SBND, D even and <= 1024), cos
//! and sin of x's dtype broadcasting to x with D last. `mode` 0 is rotate-half
//! (`rotate(x) = [-x2, x1]`), 1 interleave (`(x0, x1) -> (-x1, x0)` per pair); modes 2 and 3
//! (quarter, interleave-half) are valid on CANN but not implemented by the emulator. f32
//! arithmetic, one rounding to x's dtype. The grad op is not exported: cannon's RoPE backward
//! is the forward call with `-sin` (the inverse rotation), see kernels/src/rope/npu.rs.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

/// # Safety
/// The C contract of aclnnRotaryPositionEmbeddingGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnRotaryPositionEmbeddingGetWorkspaceSize(
    x: *const aclTensor,
    cos: *const aclTensor,
    sin: *const aclTensor,
    mode: i64,
    out: *mut aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1(
            "aclnnRotaryPositionEmbedding",
            workspaceSize,
            executor,
            || {
                let (x, c, s, o) = (
                    tensor(x, "x")?,
                    tensor(cos, "cos")?,
                    tensor(sin, "sin")?,
                    tensor(out, "out")?,
                );
                check(&x, "x", FLOATS)?;
                for (t, n) in [(&c, "cos"), (&s, "sin"), (&o, "out")] {
                    check(t, n, &[x.dtype])?;
                }
                if x.dims.len() != 4 {
                    return Err(invalid(format!(
                        "x has shape {:?}; the op takes 4-D x (BSND, BNSD or SBND)",
                        x.dims
                    )));
                }
                let d = x.dims[3];
                if d % 2 != 0 || d > 1024 || d == 0 {
                    return Err(invalid(format!(
                        "head dim {d} must be even and in 1..=1024"
                    )));
                }
                same_shape(&x, "x", &o, "out")?;
                same_shape(&c, "cos", &s, "sin")?;
                if c.dims.len() != 4
                    || c.dims[3] != d
                    || broadcast_shape(&c.dims, &x.dims)? != x.dims
                {
                    return Err(invalid(format!(
                        "cos/sin {:?} must broadcast to x {:?} with the same D",
                        c.dims, x.dims
                    )));
                }
                match mode {
                0 | 1 => {}
                2 | 3 => return Err(invalid(format!("mode {mode} is valid on CANN but not implemented by the emulator"))),
                m => return Err(invalid(format!("mode {m} is not one of 0 (half), 1 (interleave), 2 (quarter), 3 (interleave-half)"))),
            }
                let device = device_of(&[&x, &c, &s, &o])?;
                let d = d as usize;
                let job: OpJob = Arc::new(move || {
                    let xv = read_f32(&x)?;
                    let cv = expand(&read_f32(&c)?, &c.dims, &x.dims);
                    let sv = expand(&read_f32(&s)?, &s.dims, &x.dims);
                    let mut y = vec![0f32; xv.len()];
                    for (r, row) in xv.chunks(d).enumerate() {
                        for i in 0..d {
                            let rot = if mode == 0 {
                                if i < d / 2 {
                                    -row[i + d / 2]
                                } else {
                                    row[i - d / 2]
                                }
                            } else if i % 2 == 0 {
                                -row[i + 1]
                            } else {
                                row[i - 1]
                            };
                            let k = r * d + i;
                            y[k] = row[i] * cv[k] + rot * sv[k];
                        }
                    }
                    write_f32(&o, &y)
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

aclnn_phase2!(aclnnRotaryPositionEmbedding);
