//! `cannon compare A.jsonl B.jsonl`: the acceptance check between two training runs, as the
//! seed's: over the steps both runs logged in a window, the normalised mean absolute loss
//! difference `sum|a-b| / sum|b|` (B is the reference) and each run's mean step time.
//!
//! Under those lines, each run's step-time table (mean, median, p95, samples/s, wall time,
//! peak memory: [`steptime`]); with `--plot FILE`, a chart of the two loss curves over their
//! difference.
//!
//! A metrics file is JSONL, read by [`runlog`](super::runlog): a step record is an object with
//! a numeric `step` and a `loss` (a number, or `null` for a loss that was not finite: serde_json
//! writes NaN so), and optionally `step_ms`. Records of another kind (an `eval` record, a
//! header) are skipped: those without `step`/`loss`, and those whose `kind`, `type` or `event`
//! is neither `step` nor `train`. A step logged twice (a resumed run re-logs the steps after
//! its checkpoint) counts with its last record. A run folder stands for its `metrics.jsonl`.

use super::plot::{self, run_name};
use super::runlog::{metrics_file, window_text, RunLog, RunLogError};
use super::steptime;
use crate::app::chart::{self, Figure, Panel, Series};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The run under test (metrics JSONL, or a run folder: its metrics.jsonl).
    pub a: PathBuf,
    /// The reference run (metrics JSONL or run folder): the difference is normalised by its
    /// losses.
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
    /// Also draw both loss curves over the window and their difference a - b (a second
    /// panel) to this .svg or .png file.
    #[arg(long, value_name = "FILE", value_parser = plot::chart_path)]
    pub plot: Option<PathBuf>,
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
    #[error(transparent)]
    Read(#[from] RunLogError),
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

/// The `loss` and `step_ms` of a metrics file's step records, by step (see
/// [`runlog`](super::runlog) for what counts).
pub fn step_records(log: &RunLog) -> Result<BTreeMap<u64, StepRecord>, CompareError> {
    let (loss, ms) = (log.field("loss"), log.field("step_ms"));
    let out: BTreeMap<u64, StepRecord> = log
        .steps
        .keys()
        .map(|&s| {
            let rec = StepRecord {
                // A step record always has a `loss`; absent would be a bug of the reader.
                loss: loss.and_then(|f| log.step_value(s, f)).unwrap_or(f64::NAN),
                step_ms: ms
                    .and_then(|f| log.step_value(s, f))
                    .filter(|v| !v.is_nan()),
            };
            (s, rec)
        })
        .collect();
    if out.is_empty() {
        return Err(CompareError::NoSteps(log.path.clone()));
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

/// The two loss curves over `lo..=hi` and, below, `a - b` over the compared steps where both
/// losses are finite.
fn loss_figure(
    logs: [&RunLog; 2],
    names: [&str; 2],
    c: &Comparison,
    (lo, hi): (u64, u64),
) -> Figure {
    let curves: Vec<Series> = logs
        .iter()
        .zip(names)
        .enumerate()
        .filter_map(|(i, (log, name))| plot::run_series(log, name, i, "loss", (lo, hi), None))
        .collect();
    let loss = |log: &RunLog, s: u64| {
        let rec = log.steps.get(&s)?;
        let v = log.step_value(s, log.field("loss")?)?;
        (v.is_finite() && !rec.skipped).then_some(v)
    };
    let diff: Vec<(f64, f64)> = c
        .steps
        .iter()
        .filter_map(|&s| Some((s as f64, loss(logs[0], s)? - loss(logs[1], s)?)))
        .collect();
    let panels = vec![
        Panel {
            title: "loss".into(),
            series: curves,
        },
        Panel {
            title: "loss difference (a - b)".into(),
            series: vec![Series {
                name: format!("{} - {}", names[0], names[1]),
                colour: 2,
                points: diff,
                smoothed: None,
                skipped: Vec::new(),
                dots: false,
            }],
        },
    ];
    let x = plot::x_range(&panels);
    Figure { panels, x }
}

/// The legend's names: the runs' folder or stem, or `a` and `b` when those are the same.
fn plot_names(a: &Path, b: &Path) -> [String; 2] {
    let (na, nb) = (run_name(a), run_name(b));
    if na == nb {
        [format!("a ({na})"), format!("b ({nb})")]
    } else {
        [na, nb]
    }
}

/// Exit codes: 0 the difference is within the threshold, 1 above it (or not finite), 2 the
/// inputs cannot be compared (missing file, malformed line, no common step) or the plot could
/// not be written.
pub fn run(args: CompareArgs) -> ExitCode {
    let fail = |e: CompareError| {
        eprintln!("cannon compare: {e}");
        ExitCode::from(2)
    };
    let (fa, fb) = (metrics_file(&args.a), metrics_file(&args.b));
    let read = |p: &Path| -> Result<(RunLog, BTreeMap<u64, StepRecord>), CompareError> {
        let log = RunLog::read(p)?;
        let steps = step_records(&log)?;
        Ok((log, steps))
    };
    let ((log_a, a), (log_b, b)) = match (read(&fa), read(&fb)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => return fail(e),
    };
    let c = match compare([&fa, &fb], &a, &b, args.from, args.to) {
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
    let window = (args.from.unwrap_or(0), args.to.unwrap_or(u64::MAX));
    let times = [&log_a, &log_b].map(|log| steptime::step_times(log, window.0, window.1));
    println!();
    print!(
        "{}",
        steptime::table(
            [("A", times[0].as_ref()), ("B", times[1].as_ref())],
            &window_text(args.from, args.to)
        )
    );
    if let Some(out) = &args.plot {
        let names = plot_names(&args.a, &args.b);
        let fig = loss_figure([&log_a, &log_b], [&names[0], &names[1]], &c, window);
        if let Err(e) = chart::write(&fig, out, chart::default_size(fig.panels.len())) {
            eprintln!("cannon compare: {e}");
            return ExitCode::from(2);
        }
        println!("plot               {}", out.display());
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
