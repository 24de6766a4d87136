//! The step-time table `cannon compare` prints for each run, the figures a run is set beside
//! the PyTorch seed with (issue 26), so two runs' speed and memory are read side by side:
//! mean, median and p95 step time, samples/s, the whole run's time, and peak allocated and
//! reserved memory.
//!
//! Definitions (each run over its own step records in the window, not only the steps both
//! runs logged: a run's speed does not depend on the other's log):
//! - counted steps: the step records in `--from..=--to` with a finite `step_ms`;
//! - median: the middle time of the sorted counted times, the mean of the two middle ones
//!   for an even count (Python's `statistics.median`, as the seed);
//! - p95: nearest rank, the `ceil(0.95 n)`-th smallest counted time;
//! - samples/s: the `samples` counter's growth from a base record to the last counted step,
//!   over the time of the steps in between. The base is the last record before the first
//!   counted step, or, when the window opens the log, the first counted step itself (what it
//!   consumed is not known). The time is the sum of those steps' `step_ms`; when the run
//!   logged only every N-th step it is their mean times the steps between;
//! - wall time: the sum of `step_ms` over every step record of the run (the window aside):
//!   the training steps' time, start-up and checkpoint writes excluded. When steps are missing
//!   from the log (`log.every` > 1) the table says how many were logged;
//! - peaks: the largest `max_allocated_mib` / `max_reserved_mib` over the window's step
//!   records; a record's `*_worst_rank` field (the largest over the ranks) is taken over its
//!   rank-0 figure when present.

use super::runlog::RunLog;

/// One run's column of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct StepTimes {
    /// Steps whose time was counted, ascending.
    pub counted: Vec<u64>,
    pub mean_ms: f64,
    pub median_ms: f64,
    pub p95_ms: f64,
    pub samples_per_s: Option<f64>,
    /// Sum of `step_ms` over every step record, and how many records and which steps.
    pub wall_ms: f64,
    pub wall_records: usize,
    pub wall_steps: (u64, u64),
    pub peak_allocated_mib: Option<f64>,
    pub peak_reserved_mib: Option<f64>,
    /// A `*_worst_rank` figure was used for a peak.
    pub worst_rank: bool,
}

/// The median of sorted values (the mean of the two middle ones for an even count).
pub fn median(sorted: &[f64]) -> f64 {
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The nearest-rank percentile `p` (0..=100) of sorted values: the `ceil(p n / 100)`-th
/// smallest (the smallest for p = 0).
pub fn nearest_rank(sorted: &[f64], p: u32) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    let rank = (p.min(100) as usize * n).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// The table's column for `log` over `lo..=hi`; `None` when no step in the window logged a
/// time.
pub fn step_times(log: &RunLog, lo: u64, hi: u64) -> Option<StepTimes> {
    let ms_field = log.field("step_ms")?;
    let timed = |s: &u64| log.step_value(*s, ms_field).filter(|v| v.is_finite());
    let counted: Vec<(u64, f64)> = log
        .steps
        .range(lo..=hi)
        .filter_map(|(s, _)| timed(s).map(|ms| (*s, ms)))
        .collect();
    if counted.is_empty() {
        return None;
    }
    let mut sorted: Vec<f64> = counted.iter().map(|c| c.1).collect();
    sorted.sort_by(f64::total_cmp);
    let mean_ms = sorted.iter().sum::<f64>() / sorted.len() as f64;
    let (first, last) = (counted[0].0, counted[counted.len() - 1].0);

    let samples_per_s = log.field("samples").and_then(|f| {
        let base = log
            .steps
            .range(..first)
            .next_back()
            .map_or(first, |(s, _)| *s);
        let grown = log.step_value(last, f)? - log.step_value(base, f)?;
        let between: Vec<f64> = log
            .steps
            .range(base + 1..=last)
            .filter_map(|(s, _)| timed(s))
            .collect();
        if between.is_empty() || !grown.is_finite() {
            return None;
        }
        let mean = between.iter().sum::<f64>() / between.len() as f64;
        let seconds = mean * (last - base) as f64 / 1e3;
        (seconds > 0.0).then(|| grown / seconds)
    });

    let all: Vec<f64> = log.steps.keys().filter_map(timed).collect();
    let wall_steps = (
        log.steps.keys().next().copied().unwrap_or(0),
        log.steps.keys().next_back().copied().unwrap_or(0),
    );

    let mut worst_rank = false;
    let mut peak = |name: &str| {
        let rank0 = log.field(name);
        let worst = log.field(&format!("{name}_worst_rank"));
        log.steps
            .range(lo..=hi)
            .filter_map(|(s, _)| {
                let w = worst
                    .and_then(|f| log.step_value(*s, f))
                    .filter(|v| v.is_finite());
                worst_rank |= w.is_some();
                w.or_else(|| rank0.and_then(|f| log.step_value(*s, f)))
                    .filter(|v| v.is_finite())
            })
            .reduce(f64::max)
    };
    let peak_allocated_mib = peak("max_allocated_mib");
    let peak_reserved_mib = peak("max_reserved_mib");

    Some(StepTimes {
        counted: counted.iter().map(|c| c.0).collect(),
        mean_ms,
        median_ms: median(&sorted),
        p95_ms: nearest_rank(&sorted, 95),
        samples_per_s,
        wall_ms: all.iter().sum(),
        wall_records: all.len(),
        wall_steps,
        peak_allocated_mib,
        peak_reserved_mib,
        worst_rank,
    })
}

/// `1..=4 (4 steps)`, or `1..=9 (3 steps)` when some in the range were not timed or logged.
fn counted_text(t: &StepTimes) -> String {
    let (a, b) = (t.counted[0], t.counted[t.counted.len() - 1]);
    let n = t.counted.len();
    format!("{a}..={b} ({n} step{})", if n == 1 { "" } else { "s" })
}

/// The table under `compare`'s lines: one column per run, `n/a` where a run lacks the field.
pub fn table(runs: [(&str, Option<&StepTimes>); 2], window: &str) -> String {
    let col = |f: &dyn Fn(&StepTimes) -> String| -> [String; 2] {
        runs.map(|(_, t)| t.map_or("n/a (no step_ms)".to_string(), f))
    };
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("n/a".to_string(), |v| format!("{v:.digits$}"));
    let rows: Vec<(&str, [String; 2])> = vec![
        ("steps counted", col(&counted_text)),
        ("mean step_ms", col(&|t| format!("{:.1}", t.mean_ms))),
        ("median step_ms", col(&|t| format!("{:.1}", t.median_ms))),
        ("p95 step_ms", col(&|t| format!("{:.1}", t.p95_ms))),
        ("samples/s", col(&|t| opt(t.samples_per_s, 2))),
        (
            "wall time s",
            col(&|t| {
                let (a, b) = t.wall_steps;
                let span = b.saturating_sub(a) + 1;
                let logged = if t.wall_records as u64 == span {
                    String::new()
                } else {
                    format!(", {} logged", t.wall_records)
                };
                format!("{:.1} (steps {a}..={b}{logged})", t.wall_ms / 1e3)
            }),
        ),
        (
            "peak allocated MiB",
            col(&|t| {
                opt(t.peak_allocated_mib, 1) + if t.worst_rank { " (worst rank)" } else { "" }
            }),
        ),
        (
            "peak reserved MiB",
            col(&|t| opt(t.peak_reserved_mib, 1) + if t.worst_rank { " (worst rank)" } else { "" }),
        ),
    ];
    let width = rows
        .iter()
        .map(|r| r.1[0].len())
        .chain([runs[0].0.len()])
        .max()
        .unwrap_or(0)
        + 3;
    let mut out = format!(
        "step times in the window {window} (each run's own timed steps; median as Python's \
         statistics.median,\n  p95 nearest rank; wall time: sum of step_ms over the whole run)\n"
    );
    out += &format!("{:<20}{:<width$}{}\n", "", runs[0].0, runs[1].0);
    for (label, [a, b]) in rows {
        out += &format!("{label:<20}{a:<width$}{b}\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_nearest_rank() {
        assert_eq!(median(&[1.0, 2.0, 3.0]), 2.0);
        assert_eq!(median(&[1.0, 2.0, 3.0, 10.0]), 2.5);
        let twenty: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(nearest_rank(&twenty, 95), 19.0);
        assert_eq!(nearest_rank(&[5.0, 7.0, 9.0], 95), 9.0);
        assert_eq!(nearest_rank(&[5.0, 7.0, 9.0], 0), 5.0);
        assert!(nearest_rank(&[], 95).is_nan());
    }
}
