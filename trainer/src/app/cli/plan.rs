//! `cannon plan --config DIR [--set key=value ...] --device-memory GiB [--device npu|cpu]
//! [--json FILE] [--table]`: the device memory of a training step per rank, before anything
//! runs (see [`crate::app::plan`]), and every phase of the run on the device and the host, per
//! rank, process and node ([`crate::app::plan::run_phases`]); with `--measure`, the layout run on
//! meta ranks beside the plan ([`crate::app::plan::measure`]). Exit codes: 0 every phase fits, 1
//! one does not, 2 unusable input.

use crate::app::plan::{self, report, PlanSettings};
use crate::train::config::DeviceKind;
use cannon_runtime::Device;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// HF model directory (its config.json is read; no weights are needed).
    #[arg(long)]
    pub config: PathBuf,
    /// A run config key (`cannon train`'s, e.g. train.micro_batch=8, data.max_len=2048,
    /// train.dtype=bf16, parallel.nproc=8) or a planner key: parallel.cp_size,
    /// parallel.cp_algo (ulysses|ring|hybrid), parallel.ulysses_size, train.recompute
    /// (none|full|selective), train.loss_chunk (rows, 0 = full loss),
    /// train.offload_activations, train.offload_optimizer.
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    pub sets: Vec<String>,
    /// Memory of one device in GiB (e.g. 64).
    #[arg(long, value_name = "GiB", allow_negative_numbers = true)]
    pub device_memory: f64,
    /// The device each rank runs on: `npu` (an Ascend NPU, whose device memory the plan is
    /// for) or `cpu` (the trainer's CPU ranks, e.g. to compare with `cannon train`'s
    /// `max_allocated`). They differ in what attention saves for its backward: an NPU keeps
    /// aclnn's softmax max and sum (16 f32 per token and head), the CPU one log-sum-exp.
    #[arg(long, value_enum, default_value_t = DeviceKind::Npu)]
    pub device: DeviceKind,
    /// Images per row (each longest_edge x longest_edge pixels, the largest the data can
    /// bring); 0 for text only.
    #[arg(long, default_value_t = 1)]
    pub images_per_row: usize,
    /// Also plan every memory feature set on top of these settings and print the table.
    #[arg(long)]
    pub table: bool,
    /// Ranks per node, for the node's host memory (default: every rank of a CPU run, whose
    /// ranks share one process; 8 NPUs per node).
    #[arg(long, default_value_t = 0)]
    pub nproc_per_node: usize,
    /// Plan the held-out evaluation at the end (every rank a forward of its rows on its
    /// shards).
    #[arg(long)]
    pub eval: bool,
    /// Write the plan (and the table) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also run the layout's start-up and two steps through cannon's own step on meta
    /// ranks (sizes, no storage: any model size in seconds) and print each rank's measured
    /// bytes beside the plan's. Meta ranks save what an NPU does: needs `--device npu`.
    #[arg(long)]
    pub measure: bool,
}

pub fn run(args: PlanArgs) -> ExitCode {
    match go(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("cannon plan: {e}");
            ExitCode::from(2)
        }
    }
}

fn go(a: &PlanArgs) -> Result<bool, String> {
    let gib = a.device_memory;
    if !(gib.is_finite() && gib > 0.0) {
        return Err(format!(
            "--device-memory {gib}: must be a number of GiB > 0"
        ));
    }
    let device = (gib * (1u64 << 30) as f64) as u64;
    let mut s =
        PlanSettings::load(&a.config, &a.sets, a.images_per_row).map_err(|e| e.to_string())?;
    s.device = match a.device {
        DeviceKind::Cpu => Device::Cpu,
        DeviceKind::Npu => Device::Npu(0),
    };
    if a.measure {
        // The measured rows' images are on the model's patch x merge grid: plan those.
        let side = plan::measure::image_side(&s);
        if side > 0 && side as u32 != s.longest_edge {
            println!(
                "(--measure: images of {side} x {side} px, the patch x merge grid below \
                 data.longest_edge = {}; planned at that size)",
                s.longest_edge
            );
            s.longest_edge = side as u32;
        }
    }
    let p = plan::plan(&s).map_err(|e| e.to_string())?;
    print!("{}", report::text(&p, device));
    if a.measure {
        if !matches!(s.device, Device::Npu(_)) {
            return Err(
                "--measure runs meta ranks, which save what an NPU does: use \
                        --device npu"
                    .into(),
            );
        }
        let t0 = std::time::Instant::now();
        let ranks = plan::measure::measure(&s, 2).map_err(|e| format!("--measure: {e}"))?;
        println!(
            "\nmeasured on {} meta ranks (start-up, 2 steps, a checkpoint save, the export, the evaluation's forward, a start-up from the export and a resume; {:.1} s):",
            ranks.len(),
            t0.elapsed().as_secs_f64()
        );
        print!("{}", plan::measure::text(&p, &ranks));
    }
    let peaks = plan::run_peaks(&p, a.nproc_per_node, a.eval);
    print!("{}", report::phases_text(&peaks, s.device.is_cpu()));
    let table = if a.table {
        let rows = report::feature_table(&s).map_err(|e| e.to_string())?;
        println!("\nfeature sets on these settings:\n");
        print!("{}", report::table_markdown(&rows, device));
        Some(rows)
    } else {
        None
    };
    if let Some(path) = &a.json {
        let v = report::to_json(&p, device, Some(&peaks), table.as_deref());
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(p.fits(device) && peaks.device_per_rank as u64 <= device)
}
