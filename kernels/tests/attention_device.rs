//! Attention's device-level entry points: on CPU buffers they give exactly the slice-level
//! results (the plumbing test: which buffer is which), and operands off the stream's device are typed errors.

use cannon_kernels::attention::{self, Qkv, QkvBuf, QkvGrad, QkvGradBuf, VarlenAttention};
use cannon_kernels::ops;
use cannon_kernels::testutil::Rng;
use cannon_kernels::KernelError;
use cannon_runtime::{CachingAllocator, DeviceBuffer, Stream};

#[test]
fn device_level_equals_slice_level_on_cpu() {
    let cu = [5usize, 5, 12];
    let (t, hq, hkv, d) = (12, 4, 2, 24);
    let a = VarlenAttention::new(&cu, t, hq, hkv, d, true);
    let mut rng = Rng::new(7);
    let (q, k, v, dout) = (
        rng.normal_vec(t * hq * d, 1.0),
        rng.normal_vec(t * hkv * d, 1.0),
        rng.normal_vec(t * hkv * d, 1.0),
        rng.normal_vec(t * hq * d, 1.0),
    );

    // Slice level.
    let (mut out, mut lse) = (vec![0.0; t * hq * d], vec![0.0; t * hq]);
    attention::host::forward(
        &a,
        Qkv {
            q: &q,
            k: &k,
            v: &v,
        },
        &mut out,
        &mut lse,
    )
    .unwrap();
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let g = QkvGrad {
        dq: &mut dq,
        dk: &mut dk,
        dv: &mut dv,
    };
    attention::host::backward(
        &a,
        Qkv {
            q: &q,
            k: &k,
            v: &v,
        },
        &out,
        &lse,
        &dout,
        g,
    )
    .unwrap();

    // Device level on CPU buffers.
    let s = Stream::cpu();
    let al = CachingAllocator::new_cpu();
    let up = |x: &[f32]| DeviceBuffer::clone_htod(&s, x).unwrap();
    let (bq, bk, bv, bdout) = (up(&q), up(&k), up(&v), up(&dout));
    let (qv, kv, vv) = (bq.view(), bk.view(), bv.view());
    let x = QkvBuf {
        q: &qv,
        k: &kv,
        v: &vv,
    };
    let mut bout = DeviceBuffer::<f32>::alloc_in(&al, out.len()).unwrap();
    let mut blse = DeviceBuffer::<f32>::alloc_in(&al, lse.len()).unwrap();
    ops::attention_forward(&s, &a, x, &mut bout.view_mut(), &mut blse.view_mut()).unwrap();
    assert_eq!(bout.as_host_slice().unwrap(), &out[..]);
    assert_eq!(blse.as_host_slice().unwrap(), &lse[..]);

    let mut bdq = DeviceBuffer::<f32>::alloc_in(&al, dq.len()).unwrap();
    let mut bdk = DeviceBuffer::<f32>::alloc_in(&al, dk.len()).unwrap();
    let mut bdv = DeviceBuffer::<f32>::alloc_in(&al, dv.len()).unwrap();
    {
        let (mut gq, mut gk, mut gv) = (bdq.view_mut(), bdk.view_mut(), bdv.view_mut());
        let g = QkvGradBuf {
            dq: &mut gq,
            dk: &mut gk,
            dv: &mut gv,
        };
        let (o, l, d) = (bout.view(), blse.view(), bdout.view());
        ops::attention_backward(&s, &a, x, &o, &l, &d, g).unwrap();
    }
    assert_eq!(bdq.as_host_slice().unwrap(), &dq[..]);
    assert_eq!(bdk.as_host_slice().unwrap(), &dk[..]);
    assert_eq!(bdv.as_host_slice().unwrap(), &dv[..]);

    // A wrong-length output is the slice-level shape error, not a panic.
    let mut short = DeviceBuffer::<f32>::alloc_in(&al, out.len() - 1).unwrap();
    let e =
        ops::attention_forward(&s, &a, x, &mut short.view_mut(), &mut blse.view_mut()).unwrap_err();
    assert!(
        matches!(
            e,
            KernelError::Shape {
                op: "attention_forward",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn npu_state_size_is_the_ops_softmax_max_and_sum() {
    let cu = [3usize];
    let a = VarlenAttention::new(&cu, 3, 1, 1, 4, false);
    // softmaxMax + softmaxSum, T * Hq * 8 f32 each.
    assert_eq!(attention::lse_len_npu(&a), 2 * 3 * 8);
}
