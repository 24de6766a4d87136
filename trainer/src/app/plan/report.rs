//! `cannon plan`'s output: the per-rank table, its JSON, and the feature table (every
//! memory feature set on top of the given settings, and whether each fits).

use super::{loss_name, plan, Plan, PlanError, PlanSettings, RankPlan, RunPeaks};
use crate::model::memory::CpAlgo;
use crate::model::LossMode;
use crate::model::Recompute;
use serde_json::{json, Value};

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes as GiB with two decimals ("0" for none).
pub fn gib(bytes: usize) -> String {
    if bytes == 0 {
        "0".into()
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB)
    }
}

/// The features of `s` in words.
pub fn features(s: &PlanSettings) -> String {
    let f = &s.features;
    let cp = if f.cp.size > 1 {
        let algo = match f.cp.algo {
            CpAlgo::Ulysses => "ulysses".to_string(),
            CpAlgo::Ring => "ring".to_string(),
            CpAlgo::Hybrid => format!("hybrid (ulysses {})", f.cp.ulysses),
        };
        format!("cp {} {algo}", f.cp.size)
    } else {
        "cp 1".into()
    };
    let recompute = match f.recompute {
        Recompute::None => "none",
        Recompute::Full => "full",
        Recompute::Selective => "selective",
    };
    format!(
        "recompute {recompute}, loss {}, offload activations {}, offload optimizer {}, {cp}",
        loss_name(s.loss),
        on(f.offload_activations),
        on(s.offload_optimizer),
    )
}

/// `npu` or `cpu`: the kind of device the ranks run on (each rank has its own).
pub fn device_name(s: &PlanSettings) -> &'static str {
    if s.device.is_cpu() {
        "cpu"
    } else {
        "npu"
    }
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The human-readable report of `p` against `device` bytes.
pub fn text(p: &Plan, device: u64) -> String {
    let s = &p.settings;
    let cfg = &s.model;
    let layout = crate::model::ParamLayout::new(cfg);
    let total: usize = layout.groups.iter().map(|g| g.len).sum();
    let trained: usize = layout
        .groups
        .iter()
        .filter(|g| !s.frozen.contains(&g.part))
        .map(|g| g.len)
        .sum();
    let cp = s.features.cp.size.max(1);
    let mut out = format!(
        "cannon plan: {} ({:.2} B parameters, {:.2} B trained), {}, {} rank(s) = dp {} x cp {cp}, \
         FSDP {}, on {}\n",
        s.dir.display(),
        total as f64 / 1e9,
        trained as f64 / 1e9,
        s.precision,
        s.nproc,
        s.nproc / cp,
        if s.nproc > 1 && s.fsdp { "on" } else { "off" },
        device_name(s),
    );
    out += &format!(
        "batch: micro_batch {} (rows over the dp ranks) x max_len {}, {} image(s) of {} px per \
         row, grad_accum {}\nfeatures: {}\n\n",
        s.micro_batch,
        s.max_len,
        s.images_per_row,
        p.image_side,
        s.grad_accum,
        features(s)
    );
    let cols: Vec<String> = p
        .ranks
        .iter()
        .map(|r| {
            if r.ranks.0 == r.ranks.1 {
                format!("rank {}", r.ranks.0)
            } else {
                format!("ranks {}-{}", r.ranks.0, r.ranks.1)
            }
        })
        .collect();
    out += &format!("{:<44}", "");
    for c in &cols {
        out += &format!("{c:>16}");
    }
    out += "\n";
    let mut row = |name: &str, f: &dyn Fn(&RankPlan) -> String| {
        out += &format!("{name:<44}");
        for r in &p.ranks {
            out += &format!("{:>16}", f(r));
        }
        out += "\n";
    };
    let at = |r: &RankPlan| r.peak_phase();
    row("rows, text tokens, vision patches", &|r| {
        format!("{}, {}, {}", r.rows, r.tokens, r.patches)
    });
    row("device parameters (f32 masters or staging)", &|r| {
        gib(r.params)
    });
    row("gradients (f32, sharded)", &|r| gib(r.grads));
    row("master weights (separate copy)", &|r| gib(r.master));
    row("AdamW moments m + v", &|r| gib(r.moments));
    row("saved activations per text layer", &|r| {
        gib(r.step.saved.text_layer)
    });
    row("saved activations per vision layer", &|r| {
        gib(r.step.saved.vision_layer)
    });
    row("saved activations at the peak", &|r| gib(at(r).saved));
    row("logits at the peak", &|r| gib(at(r).logits));
    row("communication buffers at the peak", &|r| gib(at(r).comm));
    row("communication buffers, largest", &|r| gib(r.comm_max()));
    row("workspace (working tensors) at the peak", &|r| {
        gib(at(r).scratch)
    });
    row("peak phase", &|r| at(r).name.to_string());
    row("planned peak (max_allocated)", &|r| gib(r.peak()));
    row("host memory (offloaded)", &|r| {
        gib(r.host_activations + r.host_optimizer)
    });
    let peak = p.peak();
    out += &format!(
        "\ndevice memory {} per rank: {}\n",
        gib(device as usize),
        if p.fits(device) && peak as f64 > 0.9 * device as f64 {
            format!(
                "fits, tight (peak {}, {:.0} % of the device: the allocator's cached blocks \
                 and an NPU's own workspace come on top of max_allocated)",
                gib(peak),
                100.0 * peak as f64 / device as f64
            )
        } else if p.fits(device) {
            format!(
                "fits (peak {}, {:.0} % of the device)",
                gib(peak),
                100.0 * peak as f64 / device as f64
            )
        } else {
            format!(
                "does NOT fit (peak {}, {:.0} % of the device)",
                gib(peak),
                100.0 * peak as f64 / device as f64
            )
        }
    );
    out
}

/// The run's phases (device and host per rank), and the peaks per process and per node.
pub fn phases_text(r: &RunPeaks, cpu: bool) -> String {
    let mut out = format!(
        "\nevery phase of the run, worst rank{}:\n{:<44}{:>16}{:>16}{:>16}\n",
        if cpu {
            " (CPU ranks: device memory is host memory)"
        } else {
            ""
        },
        "",
        "device/rank",
        "host/rank",
        "+ rank 0 host"
    );
    for f in &r.phases {
        out += &format!(
            "{:<44}{:>16}{:>16}{:>16}\n",
            f.name,
            gib(f.device),
            gib(f.host),
            gib(f.host_rank0)
        );
    }
    out += &format!(
        "{:<44}{:>16}\n",
        "run peak, device per rank",
        gib(r.device_per_rank)
    );
    out += &format!(
        "{:<44}{:>16}\n",
        format!("host per process ({} rank(s))", r.ranks_per_process),
        gib(r.host_per_process)
    );
    if cpu {
        out += &format!(
            "{:<44}{:>16}\n",
            "per process, device + host",
            gib(r.process_total)
        );
    }
    out += &format!(
        "{:<44}{:>16}\n",
        format!("host per node ({} rank(s))", r.ranks_per_node),
        gib(r.host_per_node)
    );
    out
}

/// One rank's plan as JSON (bytes).
fn rank_json(r: &RankPlan) -> Value {
    let at = r.peak_phase();
    json!({
        "ranks": [r.ranks.0, r.ranks.1],
        "rows": r.rows,
        "tokens": r.tokens,
        "patches": r.patches,
        "params": r.params,
        "grads": r.grads,
        "master_weights": r.master,
        "moments": r.moments,
        "saved_per_text_layer": r.step.saved.text_layer,
        "saved_per_vision_layer": r.step.saved.vision_layer,
        "saved_at_peak": at.saved,
        "logits_at_peak": at.logits,
        "comm_at_peak": at.comm,
        "comm_max": r.comm_max(),
        "workspace_at_peak": at.scratch,
        "peak_phase": at.name,
        "step_peak": r.step_peak(),
        "peak": r.peak(),
        "host_activations": r.host_activations,
        "host_optimizer": r.host_optimizer,
        "phases": r.step.phases.iter().map(|p| json!({
            "name": p.name, "saved": p.saved, "logits": p.logits, "comm": p.comm,
            "scratch": p.scratch, "total": p.total(),
        })).collect::<Vec<_>>(),
    })
}

/// The plan as JSON, with the run's phases and the feature table when given.
pub fn to_json(
    p: &Plan,
    device: u64,
    peaks: Option<&RunPeaks>,
    table: Option<&[FeatureRow]>,
) -> Value {
    let s = &p.settings;
    let mut v = json!({
        "config": s.dir.display().to_string(),
        "device": device_name(s),
        "dtype": s.precision.to_string(),
        "nproc": s.nproc,
        "fsdp": s.fsdp && s.nproc > 1,
        "micro_batch": s.micro_batch,
        "max_len": s.max_len,
        "image_side": p.image_side,
        "features": features(s),
        "device_memory": device,
        "peak": p.peak(),
        "fits": p.fits(device),
        "ranks": p.ranks.iter().map(rank_json).collect::<Vec<_>>(),
    });
    if let Some(r) = peaks {
        v["run"] = serde_json::to_value(r).unwrap_or_default();
    }
    if let Some(rows) = table {
        v["feature_table"] = rows
            .iter()
            .map(|r| {
                json!({"name": r.name, "features": r.features, "peak": r.peak,
                       "peak_phase": r.phase, "saved_at_peak": r.saved,
                       "logits_at_peak": r.logits, "comm_at_peak": r.comm,
                       "fits": r.peak as u64 <= device, "host": r.host})
            })
            .collect();
    }
    v
}

/// One line of the feature table.
#[derive(Clone, Debug, PartialEq)]
pub struct FeatureRow {
    pub name: String,
    pub features: String,
    pub peak: usize,
    pub phase: &'static str,
    /// Saved activations, logits and communication buffers at the peak.
    pub saved: usize,
    pub logits: usize,
    pub comm: usize,
    pub host: usize,
}

/// The feature sets of the table, on top of `base` (whose own features are cleared first).
pub fn feature_table(base: &PlanSettings) -> Result<Vec<FeatureRow>, PlanError> {
    let mut none = base.clone();
    none.features = Default::default();
    none.loss = LossMode::Full;
    none.offload_optimizer = false;
    type Edit = fn(&mut PlanSettings);
    let sets: Vec<(&str, Edit)> = vec![
        ("none", |_| {}),
        ("recompute full", |s| s.features.recompute = Recompute::Full),
        ("recompute selective", |s| {
            s.features.recompute = Recompute::Selective
        }),
        ("chunk loss 1024", |s| s.loss = LossMode::Chunked(1024)),
        ("offload activations", |s| {
            s.features.offload_activations = true
        }),
        ("offload optimizer", |s| s.offload_optimizer = true),
        ("cp 2 ulysses", |s| *s = s.with_cp(2, CpAlgo::Ulysses, 1)),
        ("cp 2 ring", |s| *s = s.with_cp(2, CpAlgo::Ring, 1)),
        ("cp 4 ulysses", |s| *s = s.with_cp(4, CpAlgo::Ulysses, 1)),
        ("cp 4 ring", |s| *s = s.with_cp(4, CpAlgo::Ring, 1)),
        ("cp 4 hybrid (ulysses 2)", |s| {
            *s = s.with_cp(4, CpAlgo::Hybrid, 2)
        }),
        ("recompute full + chunk loss", |s| {
            s.features.recompute = Recompute::Full;
            s.loss = LossMode::Chunked(1024);
        }),
        ("recompute selective + chunk loss", |s| {
            s.features.recompute = Recompute::Selective;
            s.loss = LossMode::Chunked(1024);
        }),
        ("chunk loss + offload activations", |s| {
            s.loss = LossMode::Chunked(1024);
            s.features.offload_activations = true;
        }),
        ("chunk loss + offload optimizer", |s| {
            s.loss = LossMode::Chunked(1024);
            s.offload_optimizer = true;
        }),
        ("recompute full + chunk loss + offload optimizer", |s| {
            s.features.recompute = Recompute::Full;
            s.loss = LossMode::Chunked(1024);
            s.offload_optimizer = true;
        }),
        ("cp 2 ulysses + chunk loss", |s| {
            *s = s.with_cp(2, CpAlgo::Ulysses, 1);
            s.loss = LossMode::Chunked(1024);
        }),
        ("cp 4 ring + recompute full + chunk loss", |s| {
            *s = s.with_cp(4, CpAlgo::Ring, 1);
            s.features.recompute = Recompute::Full;
            s.loss = LossMode::Chunked(1024);
        }),
        ("all: recompute full, chunk loss, offload both", |s| {
            s.features.recompute = Recompute::Full;
            s.loss = LossMode::Chunked(1024);
            s.features.offload_activations = true;
            s.offload_optimizer = true;
        }),
    ];
    let mut rows = Vec::new();
    for (name, edit) in sets {
        let mut s = none.clone();
        edit(&mut s);
        // A CP set that does not apply to this world (cp must divide nproc) is left out.
        if s.check().is_err() {
            continue;
        }
        let p = plan(&s)?;
        let Some(worst) = p.ranks.iter().max_by_key(|r| r.peak()) else {
            continue;
        };
        let at = worst.peak_phase();
        rows.push(FeatureRow {
            name: name.to_string(),
            features: features(&s),
            peak: p.peak(),
            phase: at.name,
            saved: at.saved,
            logits: at.logits,
            comm: at.comm,
            host: worst.host_activations + worst.host_optimizer,
        });
    }
    Ok(rows)
}

/// The feature table as Markdown.
pub fn table_markdown(rows: &[FeatureRow], device: u64) -> String {
    let mut out = String::from(
        "| feature set | planned peak per rank | peak phase | saved activations | logits | \
         comm. buffers | host memory | fits |\n|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.name,
            gib(r.peak),
            r.phase,
            gib(r.saved),
            gib(r.logits),
            gib(r.comm),
            gib(r.host),
            if r.peak as u64 <= device { "yes" } else { "no" }
        );
    }
    out
}
