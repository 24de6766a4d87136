//! Round trip of cannon's safetensors writer and reader on arbitrary tensors: every value read
//! back is the value written, rounded once to the tensor's dtype (the oracle is `half`'s
//! round-to-nearest-even), whatever the chunks it was written in and the range it is read by;
//! and the `safetensors` crate reads the same header and bytes (an independent reader).

use cannon_trainer::model::st::{StDtype, StReader, StWriter, TensorSpec};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn dtype() -> impl Strategy<Value = StDtype> {
    prop_oneof![Just(StDtype::F32), Just(StDtype::Bf16), Just(StDtype::F16)]
}

/// Finite values across the ranges the dtypes round differently in (f16 overflows past
/// 65504 to infinity, which is what torch does too, so the oracle rounds the same way).
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        -4.0f32..4.0,
        -1e5f32..1e5,
        Just(0.0f32),
        Just(-0.0f32),
        Just(1e-8f32)
    ]
}

fn tensors() -> impl Strategy<Value = Vec<(StDtype, Vec<usize>, Vec<f32>)>> {
    let one = (dtype(), prop::collection::vec(0usize..5, 0..3)).prop_flat_map(|(dt, shape)| {
        let n = shape.iter().product::<usize>();
        (Just(dt), Just(shape), prop::collection::vec(value(), n..=n))
    });
    prop::collection::vec(one, 1..6)
}

fn rounded(dt: StDtype, x: f32) -> f32 {
    match dt {
        StDtype::F32 => x,
        StDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        StDtype::F16 => half::f16::from_f32(x).to_f32(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn written_tensors_read_back_rounded_once(ts in tensors(), chunk in 1usize..7, cut in 0usize..100) {
        let dir = std::env::temp_dir().join(format!("cannon-st-rt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rt.safetensors");
        let specs: Vec<TensorSpec> = ts
            .iter()
            .enumerate()
            .map(|(i, (dt, shape, _))| TensorSpec { name: format!("t{i}"), dtype: *dt, shape: shape.clone() })
            .collect();
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let mut w = StWriter::create(&path, specs, &meta).unwrap();
        for (_, _, vals) in &ts {
            for c in vals.chunks(chunk) {
                w.write_f32(c).unwrap();
            }
        }
        let size = w.finish().unwrap();
        prop_assert_eq!(size, std::fs::metadata(&path).unwrap().len());

        let r = StReader::open(&path).unwrap();
        prop_assert_eq!(r.metadata().get("format").map(String::as_str), Some("pt"));
        let bytes = std::fs::read(&path).unwrap();
        let other = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (i, (dt, shape, vals)) in ts.iter().enumerate() {
            let name = format!("t{i}");
            let e = r.entry(&name).unwrap();
            prop_assert_eq!(&e.shape, shape);
            let view = other.tensor(&name).unwrap();
            prop_assert_eq!(view.shape(), shape.as_slice());
            prop_assert_eq!(view.data().len(), vals.len() * dt.size());
            // A range cut somewhere inside, read widened: each value rounded once.
            let n = vals.len();
            let a = if n == 0 { 0 } else { cut % (n + 1) };
            let mut got = vec![f32::NAN; n - a];
            r.read_widened(&name, a..n, &mut got).unwrap();
            for (j, (g, x)) in got.iter().zip(&vals[a..]).enumerate() {
                let want = rounded(*dt, *x);
                prop_assert!(
                    g.to_bits() == want.to_bits(),
                    "{name}[{}] {:?}: wrote {x}, read {g}, want {want}", a + j, dt
                );
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
