//! `cannon plot RUN... -o FILE.svg|png`: one or several runs' metrics on shared axes, one
//! coloured line per run, one panel per metric (stacked, sharing the step axis), so that runs
//! are looked at without exporting to another tool.
//!
//! A RUN is a run folder (its `metrics.jsonl`) or a metrics JSONL file, read by
//! [`runlog`](super::runlog) as `cannon compare` reads it. The legend names a run by its folder
//! (a folder argument, or a file named `metrics.jsonl`) or else by the file's stem.
//!
//! What is drawn, and why:
//! - any numeric field of the step records, and of the eval records (`eval_loss`,
//!   `eval_tokens`), by step;
//! - `--smooth W`: the trailing moving average of the last W logged points (the point itself
//!   and the W-1 before it, fewer at the start), solid over the raw line drawn faint; a plain
//!   window rather than TensorBoard's EMA, because its value at a step is the mean of named
//!   records and does not depend on how far back the run started. Eval records' metrics are
//!   not smoothed: they come every N steps, are already means over the held-out tokens, and
//!   a window of them would lag by W evals; they are drawn with a dot at each eval;
//! - a step logged `"skipped": true` was not applied because its loss or gradient norm was
//!   not finite (or absurd): it is left out of the `loss` and `grad_norm` lines, which it would
//!   squash or break, and marked by a cross on the panel's bottom edge in the run's colour;
//!   its other fields (time, learning rate, counters) are true and stay;
//! - a non-finite value (`null`) cannot be drawn and is left out.
//!
//! `--trace TRACE.json` draws a step profiler's trace as a timeline instead (see
//! [`timeline`](crate::app::timeline)).

use super::runlog::{metrics_file, window_text, RunLog, RunLogError};
use crate::app::chart::{self, ChartError, Figure, Panel, Series};
use crate::app::timeline::{self, read::Trace};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
#[command(
    after_help = "A step logged with \"skipped\": true (not applied: its loss or gradient \
                        norm was not finite) is left out of the loss and grad_norm lines and \
                        marked by a cross on the panel's bottom edge. Exit codes: 0 written, 2 \
                        unusable input (the message names the file or metric)."
)]
pub struct PlotArgs {
    /// Runs to draw, one line each: a run folder (its metrics.jsonl) or a metrics JSONL file.
    #[arg(required_unless_present = "trace", value_name = "RUN_OR_JSONL")]
    pub runs: Vec<PathBuf>,
    /// Draw a step profiler's Chrome trace (train.profile_steps writes <log.dir>/trace.json)
    /// as a timeline instead: a band per rank and track, nested spans in rows, a colour per
    /// category; prints each category's time and share of the step per rank.
    #[arg(
        long,
        value_name = "TRACE_JSON",
        conflicts_with_all = ["runs", "metric", "smooth", "from", "to"]
    )]
    pub trace: Option<PathBuf>,
    /// Metrics to draw, one panel each, comma-separated: any numeric field of the records
    /// (loss, grad_norm, lr, step_ms, tokens_per_s, mfu, max_allocated_mib, ...) or eval_loss
    /// from the validation records.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "loss",
        value_name = "NAME,..."
    )]
    pub metric: Vec<String>,
    /// Draw the trailing moving average of the last W logged points (not an EMA) over the
    /// raw line, which is drawn faint (eval_* metrics are not smoothed).
    #[arg(long, value_name = "W", value_parser = clap::value_parser!(u32).range(1..))]
    pub smooth: Option<u32>,
    /// First step drawn (inclusive).
    #[arg(long)]
    pub from: Option<u64>,
    /// Last step drawn (inclusive).
    #[arg(long)]
    pub to: Option<u64>,
    /// The chart to write: .svg or .png.
    #[arg(short = 'o', long = "out", value_name = "FILE", value_parser = chart_path)]
    pub out: PathBuf,
    /// Size in pixels, WIDTHxHEIGHT (default 1000 wide, 340 high per panel; a timeline: 1200
    /// wide, as high as its rows need).
    #[arg(long, value_name = "WxH", value_parser = size)]
    pub size: Option<(u32, u32)>,
}

/// `-o`/`--plot` must name an SVG or PNG file: checked before any input is read.
pub fn chart_path(s: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(s);
    chart::Format::of(&p).map_err(|e| e.to_string())?;
    Ok(p)
}

/// `WIDTHxHEIGHT`.
fn size(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("expected WIDTHxHEIGHT in pixels, such as 1200x800, found `{s}`");
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let (w, h) = (
        w.trim().parse::<u32>().map_err(|_| bad())?,
        h.trim().parse::<u32>().map_err(|_| bad())?,
    );
    let side = chart::MIN_SIDE..=chart::MAX_SIDE;
    if !side.contains(&w) || !side.contains(&h) {
        return Err(format!(
            "each side must be in {}..={} pixels, found {w}x{h}",
            chart::MIN_SIDE,
            chart::MAX_SIDE
        ));
    }
    Ok((w, h))
}

/// Why nothing was drawn (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(transparent)]
    Read(#[from] RunLogError),
    #[error("{0}: no step or eval records (objects with `step` and `loss` or `eval_loss`)")]
    NoRecords(PathBuf),
    #[error("unknown metric `{metric}`; the runs have: {available}")]
    UnknownMetric { metric: String, available: String },
    #[error("no run has a finite `{metric}` in steps {window}")]
    NoPoints { metric: String, window: String },
    #[error("--from {from} is after --to {to}")]
    EmptyWindow { from: u64, to: u64 },
    #[error(transparent)]
    Chart(#[from] ChartError),
}

/// The legend's name of a run: its folder's name for a folder or a `metrics.jsonl`, else the
/// file's stem (a `metrics` stem would name every run alike).
pub fn run_name(arg: &Path) -> String {
    let folder = |p: &Path| {
        std::path::absolute(p)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    };
    let name = if arg.is_dir() {
        folder(&normalised(arg))
    } else if arg.file_stem().is_some_and(|s| s == "metrics") {
        arg.parent()
            .map(|p| {
                if p.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    p
                }
            })
            .and_then(|p| folder(&normalised(p)))
    } else {
        arg.file_stem().map(|s| s.to_string_lossy().into_owned())
    };
    name.unwrap_or_else(|| arg.display().to_string())
}

/// `.` and `..` resolved without touching the file system beyond the current directory, so
/// `./metrics.jsonl` and `cannon plot ..` are named after the folders they mean.
fn normalised(p: &Path) -> PathBuf {
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// Gives repeated legend names a `#2`, `#3`, ... so every line stays identifiable.
fn unique(names: Vec<String>) -> Vec<String> {
    let mut seen: HashSet<String> = HashSet::new();
    names
        .into_iter()
        .map(|n| {
            let mut candidate = n.clone();
            let mut k = 2;
            while !seen.insert(candidate.clone()) {
                candidate = format!("{n} #{k}");
                k += 1;
            }
            candidate
        })
        .collect()
}

/// Which metrics a skipped step is left out of: the values whose non-finiteness skipped it.
fn skip_hides(metric: &str) -> bool {
    matches!(metric, "loss" | "grad_norm")
}

/// One run's line of `metric` over `lo..=hi`; `None` when the run has no finite value and no
/// skipped step there.
pub fn run_series(
    log: &RunLog,
    name: &str,
    colour: usize,
    metric: &str,
    (lo, hi): (u64, u64),
    smooth: Option<u32>,
) -> Option<Series> {
    let mut points = Vec::new();
    let mut skipped = Vec::new();
    for (step, v, skip) in log.series(metric, lo, hi) {
        if skip && skip_hides(metric) {
            skipped.push(step as f64);
        } else if v.is_finite() {
            points.push((step as f64, v));
        }
    }
    if points.is_empty() && skipped.is_empty() {
        return None;
    }
    let evals = log.is_eval_field(metric);
    let smoothed = smooth
        .filter(|w| *w > 1 && !evals)
        .map(|w| trailing_mean(&points, w));
    Some(Series {
        name: name.to_string(),
        colour,
        points,
        smoothed,
        skipped,
        dots: evals,
    })
}

/// The mean of each point and the `w - 1` points before it (fewer at the start).
pub fn trailing_mean(points: &[(f64, f64)], w: u32) -> Vec<(f64, f64)> {
    let w = w.max(1) as usize;
    let mut sum = 0.0;
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            sum += y;
            if i >= w {
                sum -= points[i - w].1;
            }
            (x, sum / (i + 1).min(w) as f64)
        })
        .collect()
}

/// The step range every panel shares: the drawn points' (and skipped steps') first and last.
pub fn x_range(panels: &[Panel]) -> (f64, f64) {
    let steps = panels.iter().flat_map(|p| {
        p.series.iter().flat_map(|s| {
            s.points
                .iter()
                .map(|p| p.0)
                .chain(s.skipped.iter().copied())
        })
    });
    steps.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    })
}

/// Reads the runs and builds the figure (nothing is written).
pub fn figure(args: &PlotArgs) -> Result<Figure, PlotError> {
    let (lo, hi) = (args.from.unwrap_or(0), args.to.unwrap_or(u64::MAX));
    if lo > hi {
        return Err(PlotError::EmptyWindow { from: lo, to: hi });
    }
    let mut logs = Vec::with_capacity(args.runs.len());
    for arg in &args.runs {
        let log = RunLog::read(&metrics_file(arg))?;
        if log.is_empty() {
            return Err(PlotError::NoRecords(log.path));
        }
        logs.push(log);
    }
    let names = unique(args.runs.iter().map(|a| run_name(a)).collect());
    let mut available: Vec<&str> = Vec::new();
    for f in logs.iter().flat_map(|l| l.fields()) {
        if !available.contains(&f.as_str()) {
            available.push(f);
        }
    }
    let mut panels = Vec::with_capacity(args.metric.len());
    for metric in &args.metric {
        let metric = metric.trim();
        if !available.contains(&metric) {
            return Err(PlotError::UnknownMetric {
                metric: metric.to_string(),
                available: available.join(", "),
            });
        }
        let series: Vec<Series> = logs
            .iter()
            .zip(&names)
            .enumerate()
            .filter_map(|(i, (log, name))| run_series(log, name, i, metric, (lo, hi), args.smooth))
            .collect();
        if series.iter().all(|s| s.points.is_empty()) {
            return Err(PlotError::NoPoints {
                metric: metric.to_string(),
                window: window_text(args.from, args.to),
            });
        }
        for (log, name) in logs.iter().zip(&names) {
            if !series.iter().any(|s| &s.name == name) {
                eprintln!(
                    "cannon plot: note: {name} ({}) has no `{metric}` to draw",
                    log.path.display()
                );
            }
        }
        panels.push(Panel {
            title: metric.to_string(),
            series,
        });
    }
    let x = x_range(&panels);
    Ok(Figure { panels, x })
}

/// Exit codes: 0 the chart was written, 2 it was not (a missing or malformed file, a file
/// with no records, an unknown metric, an unsupported extension, an unwritable output).
pub fn run(args: PlotArgs) -> ExitCode {
    if let Some(trace) = &args.trace {
        return run_trace(trace, &args.out, args.size);
    }
    let result = figure(&args).and_then(|fig| {
        let size = args.size.unwrap_or(chart::default_size(fig.panels.len()));
        chart::write(&fig, &args.out, size)?;
        Ok(fig)
    });
    match result {
        Ok(fig) => {
            let lines: usize = fig.panels.iter().map(|p| p.series.len()).sum();
            println!(
                "wrote {} ({} panel{}, {lines} line{})",
                args.out.display(),
                fig.panels.len(),
                if fig.panels.len() == 1 { "" } else { "s" },
                if lines == 1 { "" } else { "s" },
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannon plot: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--trace`: the timeline, then the category table on stdout; exit codes as for runs.
fn run_trace(trace: &Path, out: &Path, size: Option<(u32, u32)>) -> ExitCode {
    let result = Trace::read(trace).and_then(|t| {
        let drawn = timeline::write(&t, out, size)?;
        Ok((t, drawn))
    });
    match result {
        Ok((t, (w, h))) => {
            let report = format!(
                "wrote {} ({w}x{h}: {} spans on {} tracks, {:.2} ms)\n\n\
                 time by category (spans merged where they overlap, children included; \
                 share of the rank's step spans)\n{}",
                out.display(),
                t.span_count(),
                t.tracks.len(),
                t.end_ms,
                timeline::category_table(&t)
            );
            // The picture is written: a closed pipe (`| head`) loses only the report.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), report.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannon plot: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_mean_averages_the_last_w_points() {
        let p = [(1.0, 1.0), (2.0, 3.0), (3.0, 5.0), (4.0, 7.0)];
        assert_eq!(
            trailing_mean(&p, 2),
            vec![(1.0, 1.0), (2.0, 2.0), (3.0, 4.0), (4.0, 6.0)]
        );
        assert_eq!(trailing_mean(&p, 1), p.to_vec());
        assert_eq!(trailing_mean(&p, 10)[3], (4.0, 4.0));
    }

    #[test]
    fn names_are_folders_or_stems_and_unique() {
        assert_eq!(run_name(Path::new("runs/a/metrics.jsonl")), "a");
        assert_eq!(run_name(Path::new("runs/baseline.jsonl")), "baseline");
        assert_eq!(
            unique(vec!["a".into(), "a".into(), "b".into(), "a".into()]),
            vec!["a", "a #2", "b", "a #3"]
        );
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(size("1200x800"), Ok((1200, 800)));
        assert!(size("12x800").is_err());
        assert!(size("1200").is_err());
    }
}
