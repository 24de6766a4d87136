//! `cannon verify`: the command line over [`crate::app::verify`]. Prints one row per compared
//! tensor, then `verify: N passed, M failed`; exit 1 on any failure, 2 on unusable input.
//!
//! `--device npu` (a build with `--features npu`) loads the model onto npu:0 and runs every
//! step there (forward, backward, the AdamW steps) through the aclnn path, on the CANN in use
//! (printed first: an installed CANN, or the emulator `CANNON_CANN_EMULATOR` names); only the
//! comparisons read results back, through device-to-host copies.

use crate::app::verify::{verify, Reference, VerifyError};
use crate::model::Precision;
use crate::model::{DeviceCtx, LossMode, Mistral3};
use crate::train::config::DeviceKind;
use cannon_runtime::Device;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Fixture directory: config.json, the model weights, reference.safetensors.
    #[arg(long)]
    pub reference: PathBuf,
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    #[arg(long, value_parser = super::precision_arg(), default_value = "f32")]
    pub dtype: Precision,
    /// AdamW steps to run (default: the fixture's `train.steps`; at most that many).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Chunked loss: at most this many rows of logits at a time (the logits are then never
    /// materialised, so `out.logits` is not compared).
    #[arg(long)]
    pub loss_chunk_size: Option<usize>,
}

/// `cannon verify`: exit 0 all pass, 1 a failed comparison, 2 unusable input.
pub fn run(args: VerifyArgs) -> ExitCode {
    let exec = match args.device {
        DeviceKind::Cpu => DeviceCtx::cpu(),
        DeviceKind::Npu if !cfg!(feature = "npu") => {
            eprintln!(
                "cannon verify: --device npu needs a build with `--features npu` (this build \
                 has the CPU backend only)"
            );
            return ExitCode::from(2);
        }
        DeviceKind::Npu => {
            // Which CANN runs the model (an installed one, or the emulator that
            // CANNON_CANN_EMULATOR names), before anything touches it.
            eprintln!("{}", super::doctor::cann_line());
            match DeviceCtx::new(Device::Npu(0)) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("cannon verify: npu:0: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    };
    let prec = args.dtype;
    let chunk = args.loss_chunk_size;
    let result = Mistral3::load_on(&args.reference, exec)
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
