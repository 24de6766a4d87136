//! `cannon verify`: the command line over [`crate::verify`]. Prints one row per compared
//! tensor, then `verify: N passed, M failed`; exit 1 on any failure, 2 on unusable input.

use crate::model::{LossMode, Mistral3, Precision};
use crate::verify::{verify, Reference, VerifyError};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Fixture directory: config.json, the model weights, reference.safetensors.
    #[arg(long)]
    pub reference: PathBuf,
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// AdamW steps to run (default: the fixture's `train.steps`; at most that many).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Chunked loss: at most this many rows of logits at a time (the logits are then never
    /// materialised, so `out.logits` is not compared).
    #[arg(long)]
    pub loss_chunk_size: Option<usize>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    Npu,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeArg {
    F32,
    Bf16,
}

/// `cannon verify`: exit 0 all pass, 1 a failed comparison, 2 unusable input.
pub fn run(args: VerifyArgs) -> ExitCode {
    if args.device == DeviceArg::Npu {
        if cfg!(feature = "npu") {
            eprintln!("{}", super::doctor::cann_line());
            eprintln!("cannon verify: the Mistral3 model has no NPU path yet; use --device cpu");
        } else {
            eprintln!(
                "cannon verify: --device npu needs a build with `--features npu` (this build \
                 has the CPU backend only)"
            );
        }
        return ExitCode::from(2);
    }
    let prec = match args.dtype {
        DtypeArg::F32 => Precision::F32,
        DtypeArg::Bf16 => Precision::Bf16,
    };
    let chunk = args.loss_chunk_size;
    let result = Mistral3::load(&args.reference)
        .map_err(VerifyError::from)
        .and_then(|mut model| {
            if let Some(rows) = chunk {
                if rows == 0 {
                    return Err(VerifyError::Unusable(
                        "--loss-chunk-size must be > 0".into(),
                    ));
                }
                model.loss_mode = LossMode::Chunked(rows);
            }
            let reference = Reference::load(&args.reference.join("reference.safetensors"))?;
            verify(&model, &reference, prec, args.steps)
        });
    match result {
        Ok(report) => {
            report.print();
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("cannon verify: {e}");
            ExitCode::from(2)
        }
    }
}
