//! `cannon export --checkpoint DIR --out DIR`: a checkpoint's model as a Hugging Face
//! checkpoint (`config.json` + safetensors, sharded with `model.safetensors.index.json` past
//! `--max-shard-size`) that transformers' `Mistral3ForConditionalGeneration` loads.

use crate::model::Precision;
use crate::train::checkpoint::{export, parse_size_arg, Checkpoint, ExportOptions};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct ExportArgs {
    /// A checkpoint directory (step-N/), or a run's checkpoint folder (its latest complete one).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Output directory: must not exist or be empty (see --force), and must not be, hold or
    /// lie inside the checkpoint. Built in `<out>.tmp-<pid>-<nanos>` and renamed when complete.
    #[arg(long)]
    pub out: PathBuf,
    /// Largest weight file, e.g. 5GB, 500MB, 2GiB or bytes; a model over it is sharded with
    /// model.safetensors.index.json.
    #[arg(long, default_value = "5GB", value_parser = parse_size_arg)]
    pub max_shard_size: u64,
    /// Stored dtype: the f32 master weights, or rounded to bf16.
    #[arg(long, value_parser = super::precision_arg(), default_value = "f32")]
    pub dtype: Precision,
    /// Replace an earlier export in --out (recognised by its cannon_export.json, or, from an
    /// older cannon, by holding only the files an export writes). Anything else, a run folder
    /// above all, is never replaced.
    #[arg(long)]
    pub force: bool,
}

/// Exit 0 on success, 2 on unusable input (no checkpoint, a bad one, an occupied --out).
pub fn run(args: ExportArgs) -> ExitCode {
    let opts = ExportOptions {
        max_shard_size: args.max_shard_size,
        dtype: args.dtype,
        force: args.force,
    };
    let result = Checkpoint::open(&args.checkpoint).and_then(|mut ckpt| {
        eprintln!(
            "cannon export: step {} from {}",
            ckpt.step(),
            ckpt.dir().display()
        );
        export(&mut ckpt, &args.out, &opts)
    });
    match result {
        Ok(r) => {
            println!(
                "exported step {}: {} tensors, {:.1} MB in {} file(s) to {}",
                r.step,
                r.tensors,
                r.total_bytes as f64 / 1e6,
                r.files.len(),
                r.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannon export: {e}");
            ExitCode::from(2)
        }
    }
}
