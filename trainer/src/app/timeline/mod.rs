//! `cannon plot --trace`: a step profiler's Chrome trace (`train.profile_steps`) drawn as a
//! timeline picture (SVG or PNG), and the time each category of span takes per rank.
//!
//! Perfetto shows a trace interactively, but a document (the README, a report, an issue)
//! needs a picture, and a screenshot of a browser is not something a server can take. The
//! picture keeps Perfetto's reading: one band per rank and track (host, and device when the
//! rank has device spans), time across in milliseconds from the first span, a span inside
//! another one row below it, one colour per category with a legend, and a span's name inside
//! its rectangle where it fits.
//!
//! - [`read`]: the trace's complete events as tracks of spans with their rows, and the time
//!   per category;
//! - [`draw`]: the layout, and the SVG and PNG writers.

pub mod draw;
pub mod read;

use crate::app::chart::{self, ChartError, Format};
use read::{category_ms, Trace};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Why a trace was not drawn.
#[derive(Debug, thiserror::Error)]
pub enum TimelineError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{0}: not a Chrome trace (expected an object with a `traceEvents` array, or an array \
         of events)"
    )]
    NotTrace(PathBuf),
    #[error("{path}: event {index}: {reason}")]
    Event {
        path: PathBuf,
        index: usize,
        reason: String,
    },
    #[error(
        "{0}: no complete events (\"ph\": \"X\") to draw; is it a trace written by \
         train.profile_steps?"
    )]
    NoSpans(PathBuf),
    #[error(transparent)]
    Chart(#[from] ChartError),
}

/// Draws `trace` to `path` (SVG or PNG by its extension) at `size`, or at the default size
/// (1200 wide, as tall as the rows need); returns the size drawn.
pub fn write(
    trace: &Trace,
    path: &Path,
    size: Option<(u32, u32)>,
) -> Result<(u32, u32), TimelineError> {
    let format = Format::of(path)?;
    if let Some((w, h)) = size {
        let side = chart::MIN_SIDE..=chart::MAX_SIDE;
        if !side.contains(&w) || !side.contains(&h) {
            return Err(ChartError::Size { w, h }.into());
        }
    }
    // The layout measures labels with the embedded font, whichever the format.
    chart::register_font()?;
    let (items, size) = draw::layout(trace, size);
    match format {
        Format::Svg => {
            std::fs::write(path, draw::svg(&items, size)).map_err(|source| ChartError::Io {
                path: path.to_path_buf(),
                source,
            })?
        }
        Format::Png => chart::save_png(path, size, draw::pixels(&items, size)?)?,
    }
    Ok(size)
}

/// The time per category and track as a text table: each category's time (its spans merged
/// where they overlap, children included) and its share of the track's `step` spans' time
/// (a device track's share is of its rank's host steps, the device having none).
pub fn category_table(trace: &Trace) -> String {
    let cats = trace.categories();
    let totals: Vec<_> = trace.tracks.iter().map(category_ms).collect();
    let step_ms = |i: usize| -> Option<f64> {
        let own = totals[i].get("step").copied().filter(|v| *v > 0.0);
        own.or_else(|| {
            let pid = trace.tracks[i].pid;
            trace
                .tracks
                .iter()
                .zip(&totals)
                .filter(|(t, _)| t.pid == pid)
                .filter_map(|(_, m)| m.get("step").copied())
                .reduce(f64::max)
                .filter(|v| *v > 0.0)
        })
    };
    const COL: usize = 20;
    let name_w = cats.iter().map(String::len).fold(10, usize::max);
    let mut out = String::new();
    let _ = write!(out, "{:name_w$}", "category");
    for t in &trace.tracks {
        let _ = write!(out, "{:>COL$}", t.label);
    }
    out.push('\n');
    for c in &cats {
        let _ = write!(out, "{c:name_w$}");
        for (i, m) in totals.iter().enumerate() {
            let cell = match (m.get(c), step_ms(i)) {
                (None, _) => "-".to_string(),
                (Some(ms), Some(step)) => format!("{ms:.2} ms {:5.1}%", 100.0 * ms / step),
                (Some(ms), None) => format!("{ms:.2} ms      "),
            };
            let _ = write!(out, "{cell:>COL$}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_shares_of_the_step() {
        let t = Trace::parse(
            Path::new("t.json"),
            r#"[{"ph": "X", "name": "step 1", "cat": "step", "ts": 0, "dur": 4000},
                {"ph": "X", "name": "mm", "cat": "gemm", "ts": 1000, "dur": 1000},
                {"ph": "X", "name": "mm", "cat": "gemm", "tid": 1, "ts": 1000, "dur": 500}]"#,
        )
        .unwrap();
        let table = category_table(&t);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3, "{table}");
        assert!(lines[0].contains("pid 0 tid 0") && lines[0].contains("pid 0 tid 1"));
        let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(cells(lines[1]), ["step", "4.00", "ms", "100.0%", "-"]);
        // The device-like track's share is of the host's steps.
        assert_eq!(
            cells(lines[2]),
            ["gemm", "1.00", "ms", "25.0%", "0.50", "ms", "12.5%"]
        );
    }
}
