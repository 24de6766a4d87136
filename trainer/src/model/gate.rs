//! The gated activation of a block's MLP, `act(gate) * up`, and its backward: SiLU (Mistral,
//! one swiglu kernel) or GELU (Pixtral's class default, the gelu kernel and a product). Its
//! own module because the GELU path is checked against finite differences here, apart from
//! the block.

use super::config::HiddenAct;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::Stream;

type Result<T> = std::result::Result<T, KernelError>;

/// `hidden[T,I] = act(gate) * up` in f32 (overwrites `hidden`). SiLU is the swiglu kernel;
/// the GELU gate (Pixtral's default `hidden_act`) is the gelu kernel and an elementwise
/// product.
pub(super) fn gated_forward(
    stream: &Stream,
    act: HiddenAct,
    gate: &Tensor<f32>,
    up: &Tensor<f32>,
    hidden: &mut Tensor<f32>,
    tmp: Option<&mut Tensor<f32>>,
) -> Result<()> {
    match act {
        HiddenAct::Silu => {
            ops::swiglu_forward(stream, &mut hidden.view_mut(), &gate.view(), &up.view())
        }
        HiddenAct::Gelu => {
            let tmp = tmp.ok_or_else(missing_tmp)?;
            ops::gelu_forward(stream, &mut tmp.view_mut(), &gate.view())?;
            ops::mul(stream, &mut hidden.view_mut(), &tmp.view(), &up.view())
        }
    }
}

/// Backward of [`gated_forward`]: OVERWRITES `dgate`, `dup` from `dh`.
pub(super) fn gated_backward(
    stream: &Stream,
    act: HiddenAct,
    (gate, up, dh): (&Tensor<f32>, &Tensor<f32>, &Tensor<f32>),
    dgate: &mut Tensor<f32>,
    dup: &mut Tensor<f32>,
    tmp: Option<&mut Tensor<f32>>,
) -> Result<()> {
    dgate.zero(stream)?;
    match act {
        HiddenAct::Silu => {
            dup.zero(stream)?;
            let (mut dg, mut du) = (dgate.view_mut(), dup.view_mut());
            ops::swiglu_backward(
                stream,
                &mut dg,
                &mut du,
                &dh.view(),
                &gate.view(),
                &up.view(),
            )
        }
        HiddenAct::Gelu => {
            // d up = gelu(gate) dh;  d gate = gelu'(gate) (dh up)
            let tmp = tmp.ok_or_else(missing_tmp)?;
            ops::gelu_forward(stream, &mut dup.view_mut(), &gate.view())?;
            ops::mul_into(stream, &mut dup.view_mut(), &dh.view())?;
            ops::mul(stream, &mut tmp.view_mut(), &dh.view(), &up.view())?;
            ops::gelu_backward(stream, &mut dgate.view_mut(), &tmp.view(), &gate.view())
        }
    }
}

fn missing_tmp() -> KernelError {
    KernelError::InvalidArgument {
        op: "block",
        detail: "GELU gate without its scratch tensor".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cannon_kernels::device_ctx::DeviceCtx;

    /// The gated activations' backward against central differences of their forward, for both
    /// gates (the fixtures only exercise SiLU; Pixtral's class default is GELU). f32 central
    /// differences with step 1e-2 on O(1) inputs are good to ~1e-4 relative; the bar is 1e-3.
    #[test]
    fn gated_backward_matches_finite_differences() {
        let exec = DeviceCtx::cpu();
        let st = exec.stream();
        let n = 64;
        let val = |i: usize, k: f32| (i as f32 * k).sin() * 2.5;
        let gate: Vec<f32> = (0..n).map(|i| val(i, 0.37)).collect();
        let up: Vec<f32> = (0..n).map(|i| val(i, 0.71)).collect();
        let dh: Vec<f32> = (0..n).map(|i| val(i, 1.13)).collect();
        let t = |v: &[f32]| exec.upload(v, &[v.len()]).unwrap();
        let (gt, ut, dht) = (t(&gate), t(&up), t(&dh));
        for act in [HiddenAct::Silu, HiddenAct::Gelu] {
            let (mut dg, mut du, mut tmp) = (t(&[0.0; 64]), t(&[0.0; 64]), t(&[0.0; 64]));
            gated_backward(st, act, (&gt, &ut, &dht), &mut dg, &mut du, Some(&mut tmp)).unwrap();
            let (dg, du) = (dg.to_host(st).unwrap(), du.to_host(st).unwrap());
            let h = |g: f32, u: f32| {
                let (mut h, mut tmp) = (t(&[0.0]), t(&[0.0]));
                gated_forward(st, act, &t(&[g]), &t(&[u]), &mut h, Some(&mut tmp)).unwrap();
                h.to_host(st).unwrap()[0]
            };
            let eps = 1e-2;
            for i in 0..n {
                let fd_g = (h(gate[i] + eps, up[i]) - h(gate[i] - eps, up[i])) / (2.0 * eps);
                let fd_u = (h(gate[i], up[i] + eps) - h(gate[i], up[i] - eps)) / (2.0 * eps);
                for (got, want) in [(dg[i], dh[i] * fd_g), (du[i], dh[i] * fd_u)] {
                    let err = (got - want).abs() / want.abs().max(1.0);
                    assert!(err < 1e-3, "{act:?} {i}: {got} vs {want}");
                }
            }
        }
    }
}
