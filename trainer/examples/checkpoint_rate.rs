//! Times a checkpoint save, a full load (`Snapshot::load`) and an export of an HF config's
//! model with random weights, text part training (AdamW moments saved), vision tower and
//! projector frozen. Speed is measured here, never asserted in tests.
//!
//! ```sh
//! cargo run --release -p cannon-trainer --example checkpoint_rate -- \
//!     ../shared/bench/mistral3-bench [SCRATCH_DIR]
//! ```

use cannon_runtime::rng::SplitMix64;
use cannon_trainer::model::optim::{AdamW, AdamWConfig};
use cannon_trainer::model::{
    DeviceCtx, LossMode, Mistral3, Mistral3Config, ParamLayout, Params, Part,
};
use cannon_trainer::train::checkpoint::{
    export, hf_config_json, Checkpoint, CheckpointDir, DataState, ExportOptions, Progress, Snapshot,
};
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let Some(config) = args.next() else {
        eprintln!("usage: checkpoint_rate HF_CONFIG_DIR [SCRATCH_DIR]");
        std::process::exit(2);
    };
    let scratch = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("cannon-checkpoint-rate"));
    std::fs::remove_dir_all(&scratch).ok();
    let cfg = Mistral3Config::from_file(&PathBuf::from(&config).join("config.json"))?;
    let layout = ParamLayout::new(&cfg);
    let exec = DeviceCtx::cpu();
    let mut rng = SplitMix64::new(1);
    let host: Vec<Vec<f32>> = layout
        .groups
        .iter()
        .map(|g| (0..g.len).map(|_| rng.unit_f64() as f32 - 0.5).collect())
        .collect();
    let model = Mistral3 {
        params: Params::from_host(&exec, layout, &host)?,
        cfg: cfg.clone(),
        loss_mode: LossMode::Full,
        memory: Default::default(),
        exec,
    };
    drop(host);
    let grads = model.grads(&[Part::Text])?;
    let opt = AdamW::new(&model.exec, AdamWConfig::default(), &grads)?;
    drop(grads);
    let state = Snapshot {
        model_config: hf_config_json(&cfg),
        model,
        opt,
        progress: Progress {
            step: 1,
            config: serde_json::json!({}),
            scheduler: serde_json::json!({}),
            data: DataState::default(),
            rng: 0,
        },
    };
    let dir = CheckpointDir::new(scratch.join("ckpt"));
    let t = Instant::now();
    let path = state.save(&dir, 0)?;
    let save_s = t.elapsed().as_secs_f64();
    let bytes: u64 = std::fs::read_dir(&path)?
        .flatten()
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .sum();
    let mb = bytes as f64 / 1e6;
    println!(
        "{} parameters; checkpoint {mb:.0} MB: save {save_s:.2} s ({:.0} MB/s, fsync included)",
        state.model.params.layout.num_params(),
        mb / save_s
    );
    drop(state);

    let t = Instant::now();
    let mut ckpt = Checkpoint::open(&path)?;
    let back = Snapshot::load(&mut ckpt, DeviceCtx::cpu())?;
    let load_s = t.elapsed().as_secs_f64();
    println!("load {load_s:.2} s ({:.0} MB/s)", mb / load_s);
    drop(back);

    let t = Instant::now();
    let r = export(&mut ckpt, &scratch.join("hf"), &ExportOptions::default())?;
    let export_s = t.elapsed().as_secs_f64();
    println!(
        "export {:.0} MB: {export_s:.2} s ({:.0} MB/s)",
        r.total_bytes as f64 / 1e6,
        r.total_bytes as f64 / 1e6 / export_s
    );
    std::fs::remove_dir_all(&scratch).ok();
    Ok(())
}
