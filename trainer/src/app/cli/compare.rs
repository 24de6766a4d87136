//! `cannon compare A.jsonl B.jsonl`: the acceptance check between two training runs, as the
//! seed's: over the steps both runs logged in a window, the normalised mean absolute loss
//! difference `sum|a-b| / sum|b|` (B is the reference) and each run's mean step time.
//!
//! A metrics file is JSONL. A step record is an object with a numeric `step` and a `loss`
//! (a number, or `null` for a loss that was not finite: serde_json writes NaN so), and
//! optionally `step_ms`. Records of another kind (an `eval` record, a header) are skipped: those
//! without `step`/`loss`, and those whose `kind`, `type` or `event` is neither `step` nor
//! `train`. A step logged twice (a resumed run re-logs the steps after its checkpoint) counts
//! with its last record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The run under test (metrics JSONL).
    pub a: PathBuf,
    /// The reference run (metrics JSONL): the difference is normalised by its losses.
    pub b: PathBuf,
    /// First step of the window (inclusive).
    #[arg(long)]
    pub from: Option<u64>,
    /// Last step of the window (inclusive).
    #[arg(long)]
    pub to: Option<u64>,
    /// Largest accepted `sum|a-b| / sum|b|` (the seed's 2 %).
    #[arg(long, default_value_t = 0.02, value_parser = threshold)]
    pub threshold: f64,
}

/// A threshold is a finite number >= 0 (anything else is a usage error, exit 2).
fn threshold(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        Ok(t) => Err(format!("must be a finite number >= 0, found {t}")),
        Err(e) => Err(e.to_string()),
    }
}

/// What one metrics file says about a step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepRecord {
    /// NaN when the run logged a non-finite loss (`null`).
    pub loss: f64,
    pub step_ms: Option<f64>,
}

/// Why the inputs cannot be compared (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Malformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{0}: no step records (objects with `step` and `loss`)")]
    NoSteps(PathBuf),
    #[error("no step is in both runs{window} ({a}: steps {a_range}; {b}: steps {b_range})")]
    NoCommonSteps {
        a: PathBuf,
        b: PathBuf,
        a_range: String,
        b_range: String,
        window: String,
    },
    #[error("--from {from} is after --to {to}")]
    EmptyWindow { from: u64, to: u64 },
}

/// The comparison over the common steps of the window.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// Steps compared, ascending.
    pub steps: Vec<u64>,
    /// `sum|a-b| / sum|b|` (0 when both sums are 0; NaN when a loss was not finite).
    pub loss_diff: f64,
    /// Mean `step_ms` of each run over the compared steps that logged it.
    pub mean_step_ms: [Option<f64>; 2],
}

impl Comparison {
    /// `mean_step_ms` of A over B's.
    pub fn step_time_ratio(&self) -> Option<f64> {
        match self.mean_step_ms {
            [Some(a), Some(b)] if b > 0.0 => Some(a / b),
            _ => None,
        }
    }
}

/// Reads a metrics JSONL file into its step records, by step.
pub fn read_metrics(path: &Path) -> Result<BTreeMap<u64, StepRecord>, CompareError> {
    let text = std::fs::read_to_string(path).map_err(|source| CompareError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| CompareError::Malformed {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| bad("a metrics record must be a JSON object".into()))?;
        let other_kind = ["kind", "type", "event"].iter().any(|k| {
            obj.get(*k)
                .and_then(|v| v.as_str())
                .is_some_and(|s| s != "step" && s != "train")
        });
        let (Some(step), Some(loss)) = (obj.get("step"), obj.get("loss")) else {
            continue;
        };
        if other_kind {
            continue;
        }
        let step = step
            .as_u64()
            .ok_or_else(|| bad(format!("`step` must be a whole number >= 0, found {step}")))?;
        let loss = match loss {
            serde_json::Value::Null => f64::NAN,
            l => l
                .as_f64()
                .ok_or_else(|| bad(format!("`loss` must be a number, found {l}")))?,
        };
        let step_ms = match obj.get("step_ms") {
            None | Some(serde_json::Value::Null) => None,
            Some(t) => Some(
                t.as_f64()
                    .ok_or_else(|| bad(format!("`step_ms` must be a number, found {t}")))?,
            ),
        };
        out.insert(step, StepRecord { loss, step_ms });
    }
    if out.is_empty() {
        return Err(CompareError::NoSteps(path.to_path_buf()));
    }
    Ok(out)
}

fn range(m: &BTreeMap<u64, StepRecord>) -> String {
    match (m.keys().next(), m.keys().next_back()) {
        (Some(a), Some(b)) => format!("{a}..={b}"),
        _ => "none".into(),
    }
}

/// Compares run `a` with reference `b` over the steps both logged in `[from, to]`.
pub fn compare(
    paths: [&Path; 2],
    a: &BTreeMap<u64, StepRecord>,
    b: &BTreeMap<u64, StepRecord>,
    from: Option<u64>,
    to: Option<u64>,
) -> Result<Comparison, CompareError> {
    let (lo, hi) = (from.unwrap_or(0), to.unwrap_or(u64::MAX));
    if lo > hi {
        return Err(CompareError::EmptyWindow { from: lo, to: hi });
    }
    let steps: Vec<u64> = a
        .range(lo..=hi)
        .filter(|(s, _)| b.contains_key(s))
        .map(|(s, _)| *s)
        .collect();
    if steps.is_empty() {
        let window = match (from, to) {
            (None, None) => String::new(),
            _ => format!(
                " in the window {}..={}",
                from.map_or(String::new(), |f| f.to_string()),
                to.map_or(String::new(), |t| t.to_string())
            ),
        };
        return Err(CompareError::NoCommonSteps {
            a: paths[0].to_path_buf(),
            b: paths[1].to_path_buf(),
            a_range: range(a),
            b_range: range(b),
            window,
        });
    }
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    let mut time = [(0.0f64, 0usize); 2];
    for s in &steps {
        let (ra, rb) = (a[s], b[s]);
        diff += (ra.loss - rb.loss).abs();
        norm += rb.loss.abs();
        for (t, r) in time.iter_mut().zip([ra, rb]) {
            if let Some(ms) = r.step_ms {
                t.0 += ms;
                t.1 += 1;
            }
        }
    }
    let loss_diff = if diff == 0.0 { 0.0 } else { diff / norm };
    let mean = |(sum, n): (f64, usize)| (n > 0).then(|| sum / n as f64);
    Ok(Comparison {
        steps,
        loss_diff,
        mean_step_ms: [mean(time[0]), mean(time[1])],
    })
}

/// Exit codes: 0 the difference is within the threshold, 1 above it (or not finite), 2 the
/// inputs cannot be compared (missing file, malformed line, no common step).
pub fn run(args: CompareArgs) -> ExitCode {
    let fail = |e: CompareError| {
        eprintln!("cannon compare: {e}");
        ExitCode::from(2)
    };
    let (a, b) = match (read_metrics(&args.a), read_metrics(&args.b)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let c = match compare([&args.a, &args.b], &a, &b, args.from, args.to) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    let ms = |m: Option<f64>| m.map_or("n/a (no step_ms)".to_string(), |v| format!("{v:.1}"));
    println!("A (run)            {}", args.a.display());
    println!("B (reference)      {}", args.b.display());
    println!(
        "steps compared     {} ({}..={})",
        c.steps.len(),
        c.steps[0],
        c.steps[c.steps.len() - 1]
    );
    println!(
        "loss diff          {:.6e}  (sum|a-b| / sum|b|)",
        c.loss_diff
    );
    println!("threshold          {:.6e}", args.threshold);
    println!("mean step_ms A     {}", ms(c.mean_step_ms[0]));
    println!("mean step_ms B     {}", ms(c.mean_step_ms[1]));
    match c.step_time_ratio() {
        Some(r) => println!("step time A/B      {r:.3}"),
        None => println!("step time A/B      n/a"),
    }
    // NaN fails: a run whose loss went non-finite does not match anything.
    if c.loss_diff <= args.threshold {
        println!("PASS");
        ExitCode::SUCCESS
    } else {
        println!("FAIL: loss difference above the threshold");
        ExitCode::from(1)
    }
}
