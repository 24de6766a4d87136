//! aclnnCrossEntropyLoss and aclnnCrossEntropyLossGrad (aclnn_cross_entropy_loss{,_grad}.h;
//! docs/cann-api.md §4).
//!
//! input `[N, C]` (FLOAT or BFLOAT16), target `[N]` INT64/INT32, reduction "mean" / "sum" /
//! "none" (loss `[N]` for none, one element otherwise), rows whose target is `ignoreIndex`
//! carry no loss and no gradient; logProb `[N, C]` (input's dtype) feeds the grad. The z-loss
//! outputs must be passed (CANN: "must be passed, unused") and are left untouched.
//! labelSmoothing, class weights and z-loss are valid on CANN but not implemented by the
//! emulator (a named error). Arithmetic: f64 log-sum-exp per row, f32 outputs.
#![allow(non_snake_case)]

use super::*;
use crate::aclnn_phase2;
use crate::nnopbase::executor::{phase1, OpJob, Plan};
use cannon_sys::aclnn::{aclOpExecutor, aclnnStatus};
use std::ffi::{c_char, CStr};

#[derive(Clone, Copy, PartialEq)]
enum Reduction {
    Mean,
    Sum,
    None,
}

/// # Safety
/// `p` is null or a C string.
unsafe fn reduction(p: *const c_char) -> EmuResult<Reduction> {
    if p.is_null() {
        // The parameter is optional; CANN's default is "mean".
        return Ok(Reduction::Mean);
    }
    // SAFETY: the caller's contract.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy();
    match s.as_ref() {
        "mean" => Ok(Reduction::Mean),
        "sum" => Ok(Reduction::Sum),
        "none" => Ok(Reduction::None),
        other => Err(invalid(format!(
            "reduction {other:?} is not \"mean\", \"sum\" or \"none\""
        ))),
    }
}

fn unimplemented_extras(weight: bool, smoothing: f64, zscale: f64) -> EmuResult<()> {
    if weight {
        return Err(invalid(
            "class weights are valid on CANN but not implemented by the emulator",
        ));
    }
    if smoothing != 0.0 {
        return Err(invalid(format!(
            "labelSmoothing {smoothing}: label smoothing is not implemented by the emulator"
        )));
    }
    if zscale != 0.0 {
        return Err(invalid(format!(
            "lseSquareScaleForZloss {zscale}: z-loss is not implemented by the emulator"
        )));
    }
    Ok(())
}

fn rows_cols(input: &TensorDesc, target: &TensorDesc) -> EmuResult<(usize, usize)> {
    if input.dims.len() != 2 || target.dims.len() != 1 || target.dims[0] != input.dims[0] {
        return Err(invalid(format!(
            "input {:?} must be [N, C] and target {:?} [N]",
            input.dims, target.dims
        )));
    }
    Ok((input.dims[0] as usize, input.dims[1] as usize))
}

fn loss_shape(r: Reduction, n: usize, loss: &TensorDesc) -> EmuResult<()> {
    let ok = match r {
        Reduction::None => loss.dims == [n as i64],
        _ => loss.numel() == 1,
    };
    if !ok {
        return Err(invalid(format!(
            "loss has shape {:?}: [N] for reduction none, one element otherwise",
            loss.dims
        )));
    }
    Ok(())
}

/// The class of row `i`, or None for an ignored row; a target outside 0..C faults.
fn class(t: i64, ignore: i64, c: usize, i: usize) -> EmuResult<Option<usize>> {
    if t == ignore {
        return Ok(None);
    }
    if t < 0 || t as usize >= c {
        return Err(EmuError::new(
            cannon_sys::acl::ACL_ERROR_RT_AICORE_EXCEPTION,
            format!("target {t} of row {i} is outside 0..{c} and not ignoreIndex {ignore} (aicore exception)"),
        ));
    }
    Ok(Some(t as usize))
}

/// # Safety
/// The C contract of aclnnCrossEntropyLossGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnCrossEntropyLossGetWorkspaceSize(
    input: *const aclTensor,
    target: *const aclTensor,
    weightOptional: *const aclTensor,
    reductionOptional: *mut c_char,
    ignoreIndex: i64,
    labelSmoothing: f64,
    lseSquareScaleForZloss: f64,
    returnZloss: bool,
    lossOut: *const aclTensor,
    logProbOut: *const aclTensor,
    zlossOut: *const aclTensor,
    lseForZlossOut: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers; reductionOptional is null or a C string.
    unsafe {
        phase1("aclnnCrossEntropyLoss", workspaceSize, executor, || {
            let (x, t) = (tensor(input, "input")?, tensor(target, "target")?);
            let (loss, lp) = (
                tensor(lossOut, "lossOut")?,
                tensor(logProbOut, "logProbOut")?,
            );
            tensor(zlossOut, "zlossOut")?;
            tensor(lseForZlossOut, "lseForZlossOut")?;
            unimplemented_extras(
                !weightOptional.is_null(),
                labelSmoothing,
                lseSquareScaleForZloss,
            )?;
            if returnZloss {
                return Err(invalid(
                    "returnZloss = true: z-loss is not implemented by the emulator",
                ));
            }
            let red = reduction(reductionOptional)?;
            check(&x, "input", FLOATS)?;
            check(&t, "target", &[ACL_INT64, ACL_INT32])?;
            check(&loss, "lossOut", &[x.dtype])?;
            check(&lp, "logProbOut", &[x.dtype])?;
            let (n, c) = rows_cols(&x, &t)?;
            same_shape(&x, "input", &lp, "logProbOut")?;
            loss_shape(red, n, &loss)?;
            let device = device_of(&[&x, &t, &loss, &lp])?;
            let job: OpJob = Arc::new(move || {
                let xv = read_f32(&x)?;
                let tv = read_i64(&t)?;
                let mut logp = vec![0f32; n * c];
                let mut per = vec![0f64; n];
                let mut count = 0usize;
                for i in 0..n {
                    let row = &xv[i * c..(i + 1) * c];
                    let mx = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
                    let lse = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
                    for (o, &v) in logp[i * c..(i + 1) * c].iter_mut().zip(row) {
                        *o = (v as f64 - lse) as f32;
                    }
                    if let Some(k) = class(tv[i], ignoreIndex, c, i)? {
                        per[i] = lse - row[k] as f64;
                        count += 1;
                    }
                }
                let lv: Vec<f32> = match red {
                    Reduction::None => per.iter().map(|&v| v as f32).collect(),
                    Reduction::Sum => vec![per.iter().sum::<f64>() as f32],
                    // torch: the mean over no counted row is NaN.
                    Reduction::Mean => vec![(per.iter().sum::<f64>() / count as f64) as f32],
                };
                write_f32(&loss, &lv)?;
                write_f32(&lp, &logp)
            });
            Ok(Plan {
                workspace: 1024,
                device,
                job,
            })
        })
    }
}

/// # Safety
/// The C contract of aclnnCrossEntropyLossGradGetWorkspaceSize.
#[no_mangle]
pub unsafe extern "C" fn aclnnCrossEntropyLossGradGetWorkspaceSize(
    gradLoss: *const aclTensor,
    logProb: *const aclTensor,
    target: *const aclTensor,
    weightOptional: *const aclTensor,
    gradZlossOptional: *const aclTensor,
    lseForZlossOptional: *const aclTensor,
    reductionOptional: *mut c_char,
    ignoreIndex: i64,
    labelSmoothing: f64,
    lseSquareScaleForZloss: f64,
    out: *const aclTensor,
    workspaceSize: *mut u64,
    executor: *mut *mut aclOpExecutor,
) -> aclnnStatus {
    // SAFETY: forwarded out-pointers; reductionOptional is null or a C string.
    unsafe {
        phase1("aclnnCrossEntropyLossGrad", workspaceSize, executor, || {
            let (g, lp, t, o) = (
                tensor(gradLoss, "gradLoss")?,
                tensor(logProb, "logProb")?,
                tensor(target, "target")?,
                tensor(out, "out")?,
            );
            unimplemented_extras(
                !weightOptional.is_null(),
                labelSmoothing,
                lseSquareScaleForZloss,
            )?;
            if !gradZlossOptional.is_null() || !lseForZlossOptional.is_null() {
                return Err(invalid(
                    "z-loss gradients are not implemented by the emulator",
                ));
            }
            let red = reduction(reductionOptional)?;
            check(&lp, "logProb", FLOATS)?;
            check(&g, "gradLoss", &[lp.dtype])?;
            check(&t, "target", &[ACL_INT64, ACL_INT32])?;
            check(&o, "out", &[lp.dtype])?;
            let (n, c) = rows_cols(&lp, &t)?;
            same_shape(&lp, "logProb", &o, "out")?;
            loss_shape(red, n, &g)?;
            let device = device_of(&[&g, &lp, &t, &o])?;
            let job: OpJob = Arc::new(move || {
                let gv = read_f32(&g)?;
                let lpv = read_f32(&lp)?;
                let tv = read_i64(&t)?;
                let classes: Vec<Option<usize>> = (0..n)
                    .map(|i| class(tv[i], ignoreIndex, c, i))
                    .collect::<EmuResult<_>>()?;
                let counted = classes.iter().filter(|k| k.is_some()).count();
                let mut dx = vec![0f32; n * c];
                for (i, k) in classes.iter().enumerate() {
                    let Some(k) = *k else { continue };
                    let scale = match red {
                        Reduction::None => gv[i],
                        Reduction::Sum => gv[0],
                        Reduction::Mean => gv[0] / counted as f32,
                    };
                    for (j, (d, &l)) in dx[i * c..(i + 1) * c]
                        .iter_mut()
                        .zip(&lpv[i * c..(i + 1) * c])
                        .enumerate()
                    {
                        *d = (l.exp() - (j == k) as u8 as f32) * scale;
                    }
                }
                write_f32(&o, &dx)
            });
            Ok(Plan {
                workspace: 1024,
                device,
                job,
            })
        })
    }
}

aclnn_phase2!(aclnnCrossEntropyLoss, aclnnCrossEntropyLossGrad);
