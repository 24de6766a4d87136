//! `cannon bench features`: every memory and parallel feature against the same run with it
//! off, as the seed's acceptance table does: same config, same global batch and sample order,
//! 20 steps, statistics over steps 6..=20.
//!
//! ```text
//! row                 off (baseline)                     on
//! ulysses             parallel.nproc=2                   + cp_size=2, cp_algo=ulysses
//! ring                parallel.nproc=2                   + cp_size=2, cp_algo=ring
//! hybrid              parallel.nproc=4                   + cp_size=4, cp_algo=hybrid,
//!                                                          ulysses_size=2
//! recompute           (the config)                       train.recompute=full
//! chunk_loss          (the config)                       train.loss_chunk=256
//! offload_activations (the config)                       train.offload_activations=true
//! offload_optimizer   (the config)                       train.offload_optimizer=true
//! ```
//!
//! The context-parallel baselines run the same number of ranks as data parallel (cp_size 1),
//! so both hold the same global batch and only the split of each sequence differs. Each row
//! runs its baseline, the feature, and its baseline again: the difference between the two
//! baseline runs is the row's noise (the loss difference of a repeat, 0 for a deterministic
//! run, and the step-time change of a repeat), and the step-time change is taken against the
//! mean of the two, so a machine whose load drifts shows it in the noise. A row whose keys
//! the config does not know (a feature this build lacks) is reported unavailable with the
//! reason, and the table goes on.
//!
//! Per row: the normalised mean absolute loss difference `sum|on - off| / sum|off|`, the
//! change of the largest per-step `max_allocated` and `max_reserved` (the runtime
//! allocator's, rank 0's for several ranks) and of the mean step time, each as on vs off.

use crate::model::DeviceCtx;
use crate::train::config::TrainConfig;
use crate::train::sharded::Ranks;
use crate::train::{ResolvedRun, RunSetup, TrainError};
use cannon_runtime::{CachingAllocator, Stream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Steps of every run, and the first step the statistics use (1-based).
pub const STEPS: usize = 20;
pub const FIRST: usize = 6;

/// One feature of the table: the overrides of its baseline and of its run.
#[derive(Clone, Debug, PartialEq)]
pub struct Feature {
    pub name: &'static str,
    /// Applied to the config for both runs.
    pub base: Vec<String>,
    /// Applied after `base` for the run with the feature on.
    pub on: Vec<String>,
}

/// The seven rows, in the table's order.
pub fn features() -> Vec<Feature> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cp = |name, nproc: &str, on: &[&str]| Feature {
        name,
        base: s(&[nproc]),
        on: s(on),
    };
    let one = |name, on: &str| Feature {
        name,
        base: Vec::new(),
        on: s(&[on]),
    };
    vec![
        cp(
            "ulysses",
            "parallel.nproc=2",
            &["parallel.cp_size=2", "parallel.cp_algo=ulysses"],
        ),
        cp(
            "ring",
            "parallel.nproc=2",
            &["parallel.cp_size=2", "parallel.cp_algo=ring"],
        ),
        cp(
            "hybrid",
            "parallel.nproc=4",
            &[
                "parallel.cp_size=4",
                "parallel.cp_algo=hybrid",
                "parallel.ulysses_size=2",
            ],
        ),
        one("recompute", "train.recompute=full"),
        one("chunk_loss", "train.loss_chunk=256"),
        one("offload_activations", "train.offload_activations=true"),
        one("offload_optimizer", "train.offload_optimizer=true"),
    ]
}

/// What one run of 20 steps recorded, per step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunTrace {
    pub loss: Vec<f64>,
    pub step_ms: Vec<f64>,
    pub max_allocated_mib: Vec<f64>,
    pub max_reserved_mib: Vec<f64>,
}

impl RunTrace {
    /// Steps `FIRST..=STEPS` (0-based indices `FIRST-1..`).
    fn window(v: &[f64]) -> &[f64] {
        &v[(FIRST - 1).min(v.len())..]
    }

    fn peak(v: &[f64]) -> f64 {
        Self::window(v).iter().copied().fold(0.0, f64::max)
    }

    fn mean(v: &[f64]) -> f64 {
        let w = Self::window(v);
        w.iter().sum::<f64>() / w.len().max(1) as f64
    }
}

/// `sum|a - b| / sum|b|` over the window (0 when b sums to 0 and a equals it).
pub fn loss_diff(a: &[f64], b: &[f64]) -> f64 {
    let (a, b) = (RunTrace::window(a), RunTrace::window(b));
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum();
    let den: f64 = b.iter().map(|y| y.abs()).sum();
    if den == 0.0 {
        if num == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        num / den
    }
}

/// One measured row.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub loss_diff: f64,
    /// Off and on figures: the largest per-step peak (MiB) and the mean step time (ms).
    pub max_allocated_mib: (f64, f64),
    pub max_reserved_mib: (f64, f64),
    pub step_ms: (f64, f64),
    /// The baseline against its repeat: loss difference and step-time change (fraction).
    pub noise_loss: f64,
    pub noise_time: f64,
}

fn change((off, on): (f64, f64)) -> f64 {
    if off == 0.0 {
        0.0
    } else {
        on / off - 1.0
    }
}

impl Measured {
    pub fn alloc_change(&self) -> f64 {
        change(self.max_allocated_mib)
    }
    pub fn reserved_change(&self) -> f64 {
        change(self.max_reserved_mib)
    }
    pub fn time_change(&self) -> f64 {
        change(self.step_ms)
    }
}

/// A row of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub feature: Feature,
    pub result: Result<Measured, String>,
}

/// Runs the table on the config `file` with `sets` applied to every run, its runs' folders
/// under `work` (removed after each run). `only` limits it to the named rows.
pub fn run(
    file: Option<&Path>,
    sets: &[String],
    work: &Path,
    only: Option<&[String]>,
) -> Result<Vec<Row>, TrainError> {
    // The config itself must be usable: that is an error, not an unavailable row.
    TrainConfig::load(file, sets)?;
    let mut rows = Vec::new();
    let mut k = 0;
    for f in features() {
        if only.is_some_and(|o| !o.iter().any(|n| n == f.name)) {
            continue;
        }
        let mut with = sets.to_vec();
        with.extend(f.base.iter().cloned());
        let base_cfg = TrainConfig::load(file, &with);
        with.extend(f.on.iter().cloned());
        let on_cfg = TrainConfig::load(file, &with);
        let (base_cfg, on_cfg) = match (base_cfg, on_cfg) {
            (Ok(b), Ok(o)) => (b, o),
            (Err(e), _) | (_, Err(e)) => {
                rows.push(Row {
                    feature: f,
                    result: Err(format!("unavailable: {e}")),
                });
                continue;
            }
        };
        // Baseline, feature, baseline again: the machine's drift over the three runs shows
        // in the noise instead of in the feature's figures.
        let result = (|| -> Result<Measured, TrainError> {
            let mut next = || {
                k += 1;
                work.join(format!("run{k}"))
            };
            let b1 = run_one(base_cfg.clone(), &next())?;
            let on = run_one(on_cfg, &next())?;
            let b2 = run_one(base_cfg, &next())?;
            Ok(measure(&b1, &b2, &on))
        })()
        .map_err(|e| e.to_string());
        rows.push(Row { feature: f, result });
    }
    Ok(rows)
}

/// The statistics of a row from the two baseline runs (before and after) and the run with
/// the feature on: loss and memory against the first baseline (every run is deterministic:
/// the second one repeats them, which the noise shows), step time against the mean of both.
pub fn measure(b1: &RunTrace, b2: &RunTrace, on: &RunTrace) -> Measured {
    let (t1, t2) = (RunTrace::mean(&b1.step_ms), RunTrace::mean(&b2.step_ms));
    Measured {
        loss_diff: loss_diff(&on.loss, &b1.loss),
        max_allocated_mib: (
            RunTrace::peak(&b1.max_allocated_mib),
            RunTrace::peak(&on.max_allocated_mib),
        ),
        max_reserved_mib: (
            RunTrace::peak(&b1.max_reserved_mib),
            RunTrace::peak(&on.max_reserved_mib),
        ),
        step_ms: ((t1 + t2) / 2.0, RunTrace::mean(&on.step_ms)),
        noise_loss: loss_diff(&b2.loss, &b1.loss),
        noise_time: change((t1, t2)),
    }
}

/// Trains `cfg` for [`STEPS`] steps in the folder `dir` (no checkpoints, no evaluation, a
/// private allocator) and returns its per-step figures.
pub fn run_one(mut cfg: TrainConfig, dir: &Path) -> Result<RunTrace, TrainError> {
    cfg.train.steps = Some(STEPS);
    cfg.train.epochs = None;
    cfg.checkpoint.every = 0;
    cfg.checkpoint.resume = crate::train::config::Resume::Latest(false);
    cfg.checkpoint.dir = Some(dir.join("checkpoints"));
    cfg.log.dir = Some(dir.to_path_buf());
    cfg.log.jsonl = Some(dir.join("metrics.jsonl"));
    cfg.log.every = 1;
    cfg.validate()?;
    let mut plan = ResolvedRun::resolve(cfg, None)?;
    plan.eval_dataset = None;
    let exec = DeviceCtx::with_allocator(Arc::new(Stream::cpu()), CachingAllocator::new_cpu())
        .map_err(crate::model::ModelError::from)?;
    let mut setup = RunSetup::new(plan, &exec)?;
    let jsonl = setup.plan.jsonl.clone();
    let ranks = match setup.plan.cfg.parallel.nproc {
        0 | 1 => Ranks::Solo(exec),
        n => Ranks::Cpu(n),
    };
    crate::train::sharded::run_sharded_on(&mut setup, ranks, &mut [])?;
    let trace = read_trace(&jsonl)?;
    let _ = std::fs::remove_dir_all(dir);
    if trace.loss.len() != STEPS {
        return Err(TrainError::Input(format!(
            "the run logged {} steps, {STEPS} expected",
            trace.loss.len()
        )));
    }
    Ok(trace)
}

/// The per-step records of a metrics JSONL file.
pub fn read_trace(path: &Path) -> Result<RunTrace, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut t = RunTrace::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| TrainError::Input(format!("{}: {e}", path.display())))?;
        if v.get("step").is_none() {
            continue;
        }
        let num = |k: &str| {
            v.get(k).and_then(serde_json::Value::as_f64).ok_or_else(|| {
                TrainError::Input(format!("{}: a step record without {k}", path.display()))
            })
        };
        t.loss.push(num("loss")?);
        t.step_ms.push(num("step_ms")?);
        t.max_allocated_mib.push(num("max_allocated_mib")?);
        t.max_reserved_mib.push(num("max_reserved_mib")?);
    }
    Ok(t)
}

fn pct(x: f64) -> String {
    format!("{:+.1} %", 100.0 * x)
}

/// The table, one line per row (the seed's columns).
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<20} | {:>10} | {:>24} | {:>24} | {:>22} | {}\n",
        "feature",
        "loss diff",
        "max alloc change (MiB)",
        "max reserved change",
        "step time change (ms)",
        "noise (loss diff, time)"
    );
    out.push_str(&format!("{}\n", "-".repeat(140)));
    for r in rows {
        match &r.result {
            Ok(m) => out.push_str(&format!(
                "{:<20} | {:>10.2e} | {:>9} {:>6.1}->{:<6.1} | {:>9} {:>6.1}->{:<6.1} | {:>8} \
                 {:>5.0}->{:<5.0} | {:.1e}, {}\n",
                r.feature.name,
                m.loss_diff,
                pct(m.alloc_change()),
                m.max_allocated_mib.0,
                m.max_allocated_mib.1,
                pct(m.reserved_change()),
                m.max_reserved_mib.0,
                m.max_reserved_mib.1,
                pct(m.time_change()),
                m.step_ms.0,
                m.step_ms.1,
                m.noise_loss,
                pct(m.noise_time),
            )),
            Err(why) => out.push_str(&format!("{:<20} | {why}\n", r.feature.name)),
        }
    }
    out
}

/// The rows as JSON: `{"steps": 20, "from_step": 6, "rows": [{"feature": ..., ...}]}`.
pub fn to_json(rows: &[Row]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let f = &r.feature;
            let mut o = serde_json::json!({
                "feature": f.name,
                "base_overrides": f.base,
                "on_overrides": f.on,
            });
            match &r.result {
                Ok(m) => {
                    o["available"] = true.into();
                    o["loss_diff"] = m.loss_diff.into();
                    o["max_allocated_mib"] = serde_json::json!({"off": m.max_allocated_mib.0, "on": m.max_allocated_mib.1, "change": m.alloc_change()});
                    o["max_reserved_mib"] = serde_json::json!({"off": m.max_reserved_mib.0, "on": m.max_reserved_mib.1, "change": m.reserved_change()});
                    o["step_ms"] = serde_json::json!({"off": m.step_ms.0, "on": m.step_ms.1, "change": m.time_change()});
                    o["noise"] = serde_json::json!({"loss_diff": m.noise_loss, "step_time_change": m.noise_time});
                }
                Err(why) => {
                    o["available"] = false.into();
                    o["reason"] = why.clone().into();
                }
            }
            o
        })
        .collect();
    serde_json::json!({"steps": STEPS, "from_step": FIRST, "rows": rows})
}

/// The default work folder of the runs: a fresh folder in the system's temporary directory.
pub fn work_dir() -> PathBuf {
    std::env::temp_dir().join(format!("cannon-bench-features-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace(loss: f64, ms: f64, alloc: f64) -> RunTrace {
        let n = STEPS;
        RunTrace {
            loss: (0..n).map(|i| loss + i as f64).collect(),
            step_ms: vec![ms; n],
            max_allocated_mib: (0..n).map(|i| alloc + i as f64).collect(),
            max_reserved_mib: vec![2.0 * alloc; n],
        }
    }

    /// The window starts at step 6: a difference in steps 1-5 does not count.
    #[test]
    fn statistics_use_steps_six_to_twenty() {
        let b = trace(1.0, 100.0, 10.0);
        let mut early = b.clone();
        early.loss[4] += 5.0;
        assert_eq!(loss_diff(&early.loss, &b.loss), 0.0);
        let mut late = b.clone();
        late.loss[5] += 1.5;
        let den: f64 = (5..STEPS).map(|i| 1.0 + i as f64).sum();
        assert!((loss_diff(&late.loss, &b.loss) - 1.5 / den).abs() < 1e-15);

        let on = trace(1.0, 150.0, 5.0);
        let b2 = trace(1.0, 200.0, 10.0);
        let m = measure(&b, &b2, &on);
        assert_eq!(m.loss_diff, 0.0);
        assert_eq!(m.max_allocated_mib, (10.0 + 19.0, 5.0 + 19.0));
        assert_eq!(m.max_reserved_mib, (20.0, 10.0));
        assert_eq!(m.step_ms, (150.0, 150.0));
        assert_eq!(m.time_change(), 0.0);
        assert_eq!(m.noise_time, 1.0);
        assert!((m.reserved_change() + 0.5).abs() < 1e-15);
    }
}
