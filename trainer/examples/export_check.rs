//! Writes what `export_check.py` compares with transformers: an HF reference model trained a
//! few AdamW steps (text part; vision tower and projector frozen), saved as a checkpoint,
//! exported with `cannon export`'s library call, and our forward's logits on the reference
//! batch after training.
//!
//! ```sh
//! cargo run --release -p cannon-trainer --example export_check -- \
//!     ../shared/reference/mistral3-tiny /tmp/export-check
//! /path/to/venv/bin/python trainer/examples/export_check.py \
//!     ../shared/reference/mistral3-tiny /tmp/export-check
//! ```
//!
//! Output in OUT: `ckpt/step-000003/` (the checkpoint), `hf/` (the export), `ours.safetensors`
//! (`logits` `[B, S, V]` f32 and `loss`).

use cannon_runtime::comm::Communicator;
use cannon_trainer::app::verify::Reference;
use cannon_trainer::model::optim::AdamW;
use cannon_trainer::model::{Mistral3, Part};
use cannon_trainer::parallel::fsdp::{FsdpRank, FsdpSettings, ShardSource};
use cannon_trainer::train::checkpoint::{
    export, Checkpoint, CheckpointDir, DataState, ExportOptions, Progress, Snapshot,
};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(reference), Some(out)) = (args.next(), args.next()) else {
        eprintln!("usage: export_check REFERENCE_DIR OUT_DIR");
        std::process::exit(2);
    };
    let (reference, out) = (PathBuf::from(reference), PathBuf::from(out));
    std::fs::remove_dir_all(&out).ok();
    let mut model = Mistral3::load(&reference)?;
    let fixture = Reference::load(&reference.join("reference.safetensors"))?;
    let batch = fixture.batch()?;
    let (mut settings, _) = fixture.train_settings(&model)?;
    settings.frozen = vec![Part::Vision, Part::Projector];
    let steps = 3;
    // The training run's step, a world of one.
    let host = model.params.to_host(model.exec.stream())?;
    let comm = Communicator::solo(model.exec.device(), std::time::Duration::from_secs(600));
    let fsdp = FsdpSettings::from_train(&settings);
    let source = ShardSource::Full(&host);
    let mut rank = FsdpRank::new(comm, model.exec.clone(), model.cfg.clone(), source, fsdp)?;
    let mut losses = Vec::new();
    for _ in 0..steps {
        let s = rank.step::<f32>(std::slice::from_ref(&batch), settings.adamw.lr)?;
        losses.push(s.loss);
    }
    model.params = rank.gather_full_params()?;
    drop(rank);
    eprintln!("trained {steps} steps, losses {losses:?}");

    let grads = model.grads(&[Part::Text])?;
    let opt = AdamW::new(&model.exec, settings.adamw, &grads)?;
    let raw = std::fs::read_to_string(reference.join("config.json"))?;
    let state = Snapshot {
        model_config: serde_json::from_str(&raw)?,
        model: model.try_clone()?,
        opt,
        progress: Progress {
            step: steps as u64,
            config: serde_json::json!({}),
            scheduler: serde_json::json!({}),
            data: DataState::default(),
            rng: 0,
        },
    };
    let dir = CheckpointDir::new(out.join("ckpt"));
    let saved = state.save(&dir, 0)?;
    let mut ckpt = Checkpoint::open(&saved)?;
    let report = export(&mut ckpt, &out.join("hf"), &ExportOptions::default())?;
    eprintln!(
        "exported {} tensors to {}",
        report.tensors,
        report.out.display()
    );

    let acts = model.forward::<f32>(&batch)?;
    let logits = acts
        .logits()
        .ok_or("the full loss mode keeps the logits")?
        .to_host(model.exec.stream())?;
    let v = model.cfg.text_config.vocab_size;
    let logits_bytes: Vec<u8> = logits.iter().flat_map(|x| x.to_le_bytes()).collect();
    let loss = (acts.loss() as f32).to_le_bytes();
    let tensors = [
        (
            "logits",
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                vec![batch.rows, batch.seq, v],
                &logits_bytes,
            )?,
        ),
        (
            "loss",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![], &loss)?,
        ),
    ];
    safetensors::serialize_to_file(tensors, None, &out.join("ours.safetensors"))?;
    eprintln!("our loss after training: {}", acts.loss());
    Ok(())
}
