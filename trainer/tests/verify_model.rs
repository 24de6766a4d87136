//! Model-level equivalences on the shared tiny fixture's weights: the chunked loss equals the
//! full one, and a row packing two sequences equals the two sequences as separate rows.

mod common;
use common::shared_path;

use cannon_trainer::model::{ActElem, Batch, LossMode, Mistral3, ModelError, Part};
use std::path::PathBuf;

fn shared_fixture() -> PathBuf {
    shared_path("reference/mistral3-tiny")
}

fn shared_batch() -> Batch {
    let dir = shared_fixture();
    let r = cannon_trainer::app::verify::Reference::load(&dir.join("reference.safetensors"));
    r.unwrap().batch().unwrap()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    num.sqrt() / den.sqrt().max(1e-30)
}

const ALL: [Part; 3] = [Part::Vision, Part::Projector, Part::Text];

/// Host copies of every gradient group (None: frozen).
type HostGrads = Vec<Option<Vec<f32>>>;

/// Loss, every gradient group and the pixel gradient (read back to the host).
fn loss_and_grads<A: ActElem>(model: &Mistral3, batch: &Batch) -> (f64, HostGrads, Vec<f32>) {
    let st = model.exec.stream();
    let acts = model.forward::<A>(batch).unwrap();
    let mut grads = model.grads(&ALL).unwrap();
    let mut dpix = model
        .exec
        .zeros(&[batch.images.pixel_values.len()])
        .unwrap();
    model
        .backward(batch, &acts, &mut grads, Some(&mut dpix))
        .unwrap();
    (
        acts.loss(),
        grads.to_host(st).unwrap(),
        dpix.to_host(st).unwrap(),
    )
}

/// The chunked loss sums the same per-row f64 losses as the full one and feeds the lm_head
/// backward chunk by chunk, so only the f32 summation order of `dW_lm += dl^T xf` over chunks
/// (and of `dxf` rows, none) differs: 1e-6 relative covers that with margin (f32 eps 6e-8
/// times a few chunk sums).
fn chunked_matches_full<A: ActElem>() {
    let mut model = Mistral3::load(&shared_fixture()).unwrap();
    let batch = shared_batch();
    let (loss, grads, dpix) = loss_and_grads::<A>(&model, &batch);
    // 7 does not divide the 96 tokens: the last chunk is short.
    for rows in [7, 32, 1000] {
        model.loss_mode = LossMode::Chunked(rows);
        let acts = model.forward::<A>(&batch).unwrap();
        assert!(acts.logits().is_none(), "chunked mode kept the logits");
        let (l, g, dp) = loss_and_grads::<A>(&model, &batch);
        assert!(
            (l - loss).abs() <= 1e-6 * loss.abs(),
            "{rows}: {l} vs {loss}"
        );
        for (i, (a, b)) in g.iter().zip(&grads).enumerate() {
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            let e = rel_l2(a, b);
            assert!(e <= 1e-6, "chunk {rows}, group {i}: rel_l2 {e:e}");
        }
        assert!(rel_l2(&dp, &dpix) <= 1e-6);
    }
}

#[test]
fn chunked_loss_equals_full_f32() {
    chunked_matches_full::<f32>();
}

#[test]
fn chunked_loss_equals_full_bf16() {
    chunked_matches_full::<half::bf16>();
}

#[test]
fn zero_chunk_size_is_an_input_error() {
    let mut model = Mistral3::load(&shared_fixture()).unwrap();
    model.loss_mode = LossMode::Chunked(0);
    let err = model
        .forward::<f32>(&shared_batch())
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, ModelError::Input(_)), "{err}");
}

/// Two text-only sequences of `s` tokens: ids from a fixed LCG avoiding the special ids, every
/// label trained.
fn two_sequences(vocab: u32, s: usize) -> (Vec<u32>, Vec<i32>) {
    let mut x = 12345u64;
    let ids: Vec<u32> = (0..2 * s)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            16 + ((x >> 33) as u32) % (vocab - 16)
        })
        .collect();
    let labels = ids.iter().map(|&i| i as i32).collect();
    (ids, labels)
}

/// Packing restarts the position ids, which splits the row into two causal sequences
/// (transformers 5.x's rule): logits, loss and gradients equal the two-row batch. The same
/// kernels run on the same rows (attention per sequence, GEMMs over all tokens), so 1e-6
/// relative only leaves room for summation order.
#[test]
fn packed_row_equals_separate_rows() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let vocab = model.cfg.text_config.vocab_size as u32;
    let s = 12;
    let (ids, labels) = two_sequences(vocab, s);
    let rows = Batch {
        input_ids: ids.clone(),
        labels: labels.clone(),
        rows: 2,
        seq: s,
        ..Batch::default()
    };
    let packed = Batch {
        position_ids: (0..s as u32).chain(0..s as u32).collect(),
        rows: 1,
        seq: 2 * s,
        ..rows.clone()
    };
    let st = model.exec.stream();
    let logits =
        |a: &cannon_trainer::model::ForwardActs<f32>| a.logits().unwrap().to_host(st).unwrap();
    let a = model.forward::<f32>(&rows).unwrap();
    let b = model.forward::<f32>(&packed).unwrap();
    assert_eq!(a.targets, b.targets);
    assert_eq!(b.text.cu_seqlens, vec![s, 2 * s]);
    assert!(rel_l2(&logits(&b), &logits(&a)) <= 1e-6);
    assert!((a.loss() - b.loss()).abs() <= 1e-6 * a.loss());
    let text = [Part::Text];
    let (mut ga, mut gb) = (model.grads(&text).unwrap(), model.grads(&text).unwrap());
    model.backward(&rows, &a, &mut ga, None).unwrap();
    model.backward(&packed, &b, &mut gb, None).unwrap();
    let (ga, gb) = (ga.to_host(st).unwrap(), gb.to_host(st).unwrap());
    for (x, y) in gb
        .iter()
        .zip(&ga)
        .filter_map(|(x, y)| Some((x.as_ref()?, y.as_ref()?)))
    {
        assert!(rel_l2(x, y) <= 1e-6);
    }

    // Without the restart the second sequence sees the first: its logits change.
    let unpacked = Batch {
        position_ids: Vec::new(),
        ..packed.clone()
    };
    let c = model.forward::<f32>(&unpacked).unwrap();
    let v = vocab as usize;
    let (lb, lc) = (logits(&b), logits(&c));
    assert!(rel_l2(&lc[..s * v], &lb[..s * v]) <= 1e-6);
    assert!(rel_l2(&lc[s * v..], &lb[s * v..]) > 1e-3);
}

#[test]
fn bad_position_ids_are_an_input_error() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let vocab = model.cfg.text_config.vocab_size as u32;
    let (ids, labels) = two_sequences(vocab, 4);
    let batch = Batch {
        input_ids: ids,
        labels,
        position_ids: vec![0; 3],
        rows: 1,
        seq: 8,
        ..Batch::default()
    };
    let err = model.forward::<f32>(&batch).map(|_| ()).unwrap_err();
    assert!(matches!(err, ModelError::Batch(_)), "{err}");
}

#[test]
fn position_past_the_model_is_an_input_error() {
    let model = Mistral3::load(&shared_fixture()).unwrap();
    let vocab = model.cfg.text_config.vocab_size as u32;
    let (ids, labels) = two_sequences(vocab, 4);
    let far = model.cfg.text_config.max_position_embeddings as u32;
    let batch = Batch {
        input_ids: ids,
        labels,
        position_ids: (far..far + 8).collect(),
        rows: 1,
        seq: 8,
        ..Batch::default()
    };
    let err = model.forward::<f32>(&batch).map(|_| ()).unwrap_err();
    assert!(err.to_string().contains("max_position_embeddings"), "{err}");
}
