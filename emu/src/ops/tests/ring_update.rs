//! aclnnRingAttentionUpdate against the merge of two softmaxes written out here in f64, and
//! its argument checks.

use super::*;
use crate::ops::ring_update::*;
use std::ffi::c_char;

/// S = 3 rows, B = 1, N = 2 heads of D = 2: outputs `[3, 1, 4]`, statistics `[1, 2, 3, 8]`.
const OUT: [i64; 3] = [3, 1, 4];
const STATS: [i64; 4] = [1, 2, 3, 8];

fn stats(per_row: &[f32; 6]) -> Vec<f32> {
    per_row.iter().flat_map(|&x| [x; 8]).collect()
}

#[test]
fn merges_two_softmaxes_in_place() {
    let po: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let co: Vec<f32> = (0..12).map(|i| 2.0 - i as f32 * 0.125).collect();
    // (head, row) statistics; the first row of head 0 is an empty accumulator.
    let (pm, ps) = (
        [-1e30, 0.5, -2.0, 1.0, 3.0, 0.0],
        [1.0, 2.0, 0.5, 1.5, 4.0, 1.0],
    );
    let (cm, cs) = (
        [0.25, 1.5, -3.0, 1.0, -1.0, 2.0],
        [3.0, 1.0, 2.0, 0.5, 1.0, 6.0],
    );
    let prev = [
        Dev::f32(&po, &OUT),
        Dev::f32(&stats(&pm), &STATS),
        Dev::f32(&stats(&ps), &STATS),
    ];
    let cur = [
        Dev::f32(&co, &OUT),
        Dev::f32(&stats(&cm), &STATS),
        Dev::f32(&stats(&cs), &STATS),
    ];
    let mut layout = *b"SBH\0";
    let (ws, ex) = phase1_ok(|w, e| {
        // SAFETY: live handles from this test (the outputs are the previous accumulators)
        // and valid out-pointers.
        unsafe {
            aclnnRingAttentionUpdateGetWorkspaceSize(
                prev[0].t,
                prev[1].t,
                prev[2].t,
                cur[0].t,
                cur[1].t,
                cur[2].t,
                std::ptr::null(),
                layout.as_mut_ptr() as *mut c_char,
                prev[0].t,
                prev[1].t,
                prev[2].t,
                w,
                e,
            )
        }
    });
    launch(ws, ex, aclnnRingAttentionUpdate).unwrap();
    let (out, mx, sm) = (
        prev[0].get::<f32>(),
        prev[1].get::<f32>(),
        prev[2].get::<f32>(),
    );
    for h in 0..2 {
        for s in 0..3 {
            let i = h * 3 + s;
            let m = (pm[i] as f64).max(cm[i] as f64);
            let p = ps[i] as f64 * (pm[i] as f64 - m).exp();
            let c = cs[i] as f64 * (cm[i] as f64 - m).exp();
            assert_eq!(
                mx[i * 8..i * 8 + 8],
                [m as f32; 8],
                "max of head {h} row {s}"
            );
            assert!(
                (sm[i * 8] as f64 - (p + c)).abs() <= 1e-6 * (p + c),
                "sum {h} {s}"
            );
            for d in 0..2 {
                let x = s * 4 + h * 2 + d;
                let want = (po[x] as f64 * p + co[x] as f64 * c) / (p + c);
                assert!(
                    (out[x] as f64 - want).abs() <= 1e-6,
                    "out {x}: {} vs {want}",
                    out[x]
                );
            }
        }
    }
}

#[test]
fn layout_dtype_and_shape_errors_name_the_argument() {
    let o = Dev::f32(&[0.0; 12], &OUT);
    let st = Dev::f32(&[1.0; 48], &STATS);
    let bf = Dev::new(&[0u16; 12], &OUT, ACL_BF16);
    let short = Dev::f32(&[1.0; 32], &[1, 2, 2, 8]);
    let call = |layout: &[u8], cur: *const aclTensor, cur_max: *const aclTensor| {
        let mut l = layout.to_vec();
        phase1_err(|w, e| {
            // SAFETY: live handles from this test and valid out-pointers.
            unsafe {
                aclnnRingAttentionUpdateGetWorkspaceSize(
                    o.t,
                    st.t,
                    st.t,
                    cur,
                    cur_max,
                    st.t,
                    std::ptr::null(),
                    l.as_mut_ptr() as *mut c_char,
                    o.t,
                    st.t,
                    st.t,
                    w,
                    e,
                )
            }
        })
    };
    let m = call(b"TND\0", o.t, st.t);
    assert!(
        m.contains("TND") && m.contains("not implemented by the emulator"),
        "{m}"
    );
    let m = call(b"BSH\0", o.t, st.t);
    assert!(m.contains("\"BSH\""), "{m}");
    let m = call(b"SBH\0", bf.t, st.t);
    assert!(m.contains("curAttnOut"), "{m}");
    let m = call(b"SBH\0", o.t, short.t);
    assert!(m.contains("curSoftmaxMax"), "{m}");
}
