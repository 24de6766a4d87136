//! aclnnMatmul and aclnnMm (aclnn_matmul.h, aclnn_mm.h; docs/cann-api.md §4).
//!
//! `out = self @ mat2`; transposed operands come as strided views (the ops accept
//! non-contiguous tensors). Mm is 2-D only; Matmul also takes 3-D operands whose batch dims
//! match or are 1 (broadcast). Products run on cannon-kernels' f32 GEMM; bf16 operands are
//! widened exactly and the f32 result is rounded once to `out`'s dtype (the cube unit's f32
//! accumulation). `cubeMathType` must be one of the documented values (0 KEEP_DTYPE,
//! 1 ALLOW_FP32_DOWN_PRECISION, 2 USE_FP16, 3 USE_HF32); 2 (fp16 products) is rejected
//! because the emulator does not model fp16.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_kernels::gemm::{host::gemm_f32, Dims, Trans};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};

/// Workspace the emulated Matmul asks for (a split-K style scratch; any size exercises the
/// caller's workspace path).
const WORKSPACE: u64 = 16 << 10;

fn plan(
    a: Arc<TensorDesc>,
    b: Arc<TensorDesc>,
    out: Arc<TensorDesc>,
    cube: i8,
    only_2d: bool,
) -> EmuResult<Plan> {
    check(&a, "self", FLOATS)?;
    check(&b, "mat2", FLOATS)?;
    check(&out, "out", FLOATS)?;
    if a.dtype != b.dtype {
        return Err(invalid("self and mat2 have different dtypes"));
    }
    if out.dtype != a.dtype {
        return Err(invalid(format!(
            "out is {}, self and mat2 are {}: out must have the operands' dtype",
            crate::nnopbase::tensor::dtype_name(out.dtype),
            crate::nnopbase::tensor::dtype_name(a.dtype)
        )));
    }
    match cube {
        0 | 1 | 3 => {}
        2 => {
            return Err(invalid(
                "cubeMathType 2 (USE_FP16) is not implemented by the emulator",
            ))
        }
        c => return Err(invalid(format!("cubeMathType {c} is not one of 0..=3"))),
    }
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let ok_rank = if only_2d {
        ra == 2 && rb == 2
    } else {
        (2..=3).contains(&ra) && (2..=3).contains(&rb)
    };
    if !ok_rank {
        return Err(invalid(format!(
            "self {:?} and mat2 {:?}: {} ",
            a.dims,
            b.dims,
            if only_2d {
                "Mm takes 2-D tensors"
            } else {
                "the emulator's Matmul takes 2-D or 3-D tensors"
            }
        )));
    }
    let (m, k) = (a.dims[ra - 2], a.dims[ra - 1]);
    let (k2, n) = (b.dims[rb - 2], b.dims[rb - 1]);
    if k != k2 {
        return Err(invalid(format!(
            "self {:?} and mat2 {:?}: inner dims {k} and {k2} differ",
            a.dims, b.dims
        )));
    }
    let ba = if ra == 3 { a.dims[0] } else { 1 };
    let bb = if rb == 3 { b.dims[0] } else { 1 };
    if ba != bb && ba != 1 && bb != 1 {
        return Err(invalid(format!(
            "batch dims {ba} and {bb} do not broadcast"
        )));
    }
    let batch = ba.max(bb);
    let want: Vec<i64> = if ra == 3 || rb == 3 {
        vec![batch, m, n]
    } else {
        vec![m, n]
    };
    if out.dims != want {
        return Err(invalid(format!(
            "out has shape {:?}, expected {want:?}",
            out.dims
        )));
    }
    let device = device_of(&[&a, &b, &out])?;
    let (m, n, k, ba, bb, batch) = (
        m as usize,
        n as usize,
        k as usize,
        ba as usize,
        bb as usize,
        batch as usize,
    );
    let job: OpJob = Arc::new(move || {
        if in_place(&a, &b, &out, (m, n, k), (ba, bb, batch))? {
            return Ok(());
        }
        let av = read_f32(&a)?;
        let bv = read_f32(&b)?;
        let mut c = vec![0f32; batch * m * n];
        for i in 0..batch {
            let ai = if ba == 1 { 0 } else { i };
            let bi = if bb == 1 { 0 } else { i };
            gemm_f32(
                Trans::N,
                Trans::N,
                Dims { m, n, k },
                1.0,
                &av[ai * m * k..(ai + 1) * m * k],
                k.max(1),
                &bv[bi * k * n..(bi + 1) * k * n],
                n.max(1),
                0.0,
                &mut c[i * m * n..(i + 1) * m * n],
                n.max(1),
            )
            .map_err(kernel)?;
        }
        write_f32(&out, &c)
    });
    Ok(Plan {
        workspace: WORKSPACE,
        device,
        job,
    })
}

/// How `gemm` reads an f32 operand in place: its span from the first element, whether it is
/// stored transposed, its row stride and its batch stride (0 without a batch).
struct Operand<'a> {
    data: &'a [f32],
    trans: Trans,
    ld: usize,
    batch: usize,
}

/// `t` in place when its matrices are row-major or transposed windows of its memory (a
/// transposed weight is a strided view of the stored one): the lm-head's weight and gradient
/// are hundreds of MB, which a copy would hold a second time on the host.
///
/// # Safety
/// As [`access::span_slice`].
unsafe fn operand<'a>(t: &TensorDesc) -> EmuResult<Option<Operand<'a>>> {
    if t.dtype != ACL_FLOAT || t.strides.iter().any(|&s| s < 0) {
        return Ok(None);
    }
    let r = t.dims.len();
    let (rows, cols) = (t.dims[r - 2].max(1), t.dims[r - 1].max(1));
    let (s0, s1) = (t.strides[r - 2], t.strides[r - 1]);
    let (trans, ld) = if s1 == 1 && s0 >= cols {
        (Trans::N, s0)
    } else if s0 == 1 && s1 >= rows {
        (Trans::T, s1)
    } else {
        return Ok(None);
    };
    let batch = if r == 3 && t.dims[0] > 1 {
        t.strides[0] as usize
    } else {
        0
    };
    // SAFETY: forwarded to the caller.
    let Some(data) = (unsafe { access::span_slice::<f32>(t) })? else {
        return Ok(None);
    };
    Ok(Some(Operand {
        data,
        trans,
        ld: ld as usize,
        batch,
    }))
}

/// The f32 product straight from and into device memory when the operands can be read in
/// place and `out` is contiguous and shares no byte with them; false (nothing done) otherwise.
fn in_place(
    a: &TensorDesc,
    b: &TensorDesc,
    out: &TensorDesc,
    (m, n, k): (usize, usize, usize),
    (ba, bb, batch): (usize, usize, usize),
) -> EmuResult<bool> {
    if out.dtype != ACL_FLOAT || !access::disjoint(out, a) || !access::disjoint(out, b) {
        return Ok(false);
    }
    // SAFETY: this job is the only work on the three tensors, and `out` (the only one
    // written) shares no byte with `a` or `b` (checked above).
    let (Some(av), Some(bv), Some(c)) = (unsafe {
        (
            operand(a)?,
            operand(b)?,
            access::span_slice_mut::<f32>(out)?,
        )
    }) else {
        return Ok(false);
    };
    fn at<'a>(o: &Operand<'a>, i: usize) -> EmuResult<&'a [f32]> {
        o.data
            .get(i * o.batch..)
            .ok_or_else(|| invalid(format!("internal: batch {i} lies past its view")))
    }
    for i in 0..batch {
        let ai = if ba == 1 { 0 } else { i };
        let bi = if bb == 1 { 0 } else { i };
        gemm_f32(
            av.trans,
            bv.trans,
            Dims { m, n, k },
            1.0,
            at(&av, ai)?,
            av.ld,
            at(&bv, bi)?,
            bv.ld,
            0.0,
            &mut c[i * m * n..(i + 1) * m * n],
            n.max(1),
        )
        .map_err(kernel)?;
    }
    Ok(true)
}

/// # Safety
/// The C contract of aclnnMatmulGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnMatmulGetWorkspaceSize(
    self_: *const aclTensor,
    mat2: *const aclTensor,
    out: *mut aclTensor,
    cubeMathType: i8,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnMatmul", workspaceSize, executor, || {
            plan(
                tensor(self_, "self")?,
                tensor(mat2, "mat2")?,
                tensor(out, "out")?,
                cubeMathType,
                false,
            )
        })
    }
}

/// # Safety
/// The C contract of aclnnMmGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnMmGetWorkspaceSize(
    self_: *const aclTensor,
    mat2: *const aclTensor,
    out: *mut aclTensor,
    cubeMathType: i8,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers.
    unsafe {
        phase1("aclnnMm", workspaceSize, executor, || {
            plan(
                tensor(self_, "self")?,
                tensor(mat2, "mat2")?,
                tensor(out, "out")?,
                cubeMathType,
                true,
            )
        })
    }
}

aclnn_phase2!(aclnnMatmul, aclnnMm);
