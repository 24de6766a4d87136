//! Reading a Chrome trace into tracks of spans, each span given the row it is drawn in, and
//! the time each category takes per track.
//!
//! Only complete events (`"ph": "X"`: a start and a duration) are spans; the profiler writes
//! nothing else besides the `"ph": "M"` names of processes and threads, which label the
//! tracks. A track is one (`pid`, `tid`): a rank's host or device. Times are milliseconds from
//! the trace's first span, so that the axis reads as time into the profiled steps rather than
//! since the process started.

use super::TimelineError;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Two instants closer than this (ms) are one: the trace writes microseconds to 3 decimals,
/// so a span that ends where its parent ends may read a nanosecond past it.
const EPS_MS: f64 = 1e-5;

/// One complete event.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub name: String,
    pub cat: String,
    /// Milliseconds from the trace's first span.
    pub start_ms: f64,
    pub dur_ms: f64,
    /// 0 for a span inside no other on its track, 1 for one inside a depth-0 span, ...
    pub depth: usize,
}

impl Span {
    pub fn end_ms(&self) -> f64 {
        self.start_ms + self.dur_ms
    }
}

/// The spans of one process and thread (a rank's host or device), in start order.
#[derive(Debug, Clone, PartialEq)]
pub struct Track {
    pub pid: u64,
    pub tid: u64,
    /// `rank 0 host`: the process's and thread's names from the metadata, else their ids.
    pub label: String,
    pub spans: Vec<Span>,
    /// Rows the spans need: one more than the deepest depth.
    pub rows: usize,
}

/// A trace as it is drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    pub path: PathBuf,
    /// By process, then thread.
    pub tracks: Vec<Track>,
    /// The last span's end (ms from the first span's start).
    pub end_ms: f64,
}

impl Trace {
    pub fn read(path: &Path) -> Result<Self, TimelineError> {
        let text = std::fs::read_to_string(path).map_err(|source| TimelineError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// `text` as the contents of `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, TimelineError> {
        let root: Value = serde_json::from_str(text).map_err(|source| TimelineError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        // The JSON Object Format, or the bare JSON Array Format Chrome also opens.
        let events = match &root {
            Value::Object(o) => o.get("traceEvents").and_then(Value::as_array),
            Value::Array(a) => Some(a),
            _ => None,
        }
        .ok_or_else(|| TimelineError::NotTrace(path.to_path_buf()))?;

        let mut processes: BTreeMap<u64, String> = BTreeMap::new();
        let mut threads: BTreeMap<(u64, u64), String> = BTreeMap::new();
        let mut raw: BTreeMap<(u64, u64), Vec<RawSpan>> = BTreeMap::new();
        for (index, e) in events.iter().enumerate() {
            let bad = |reason: String| TimelineError::Event {
                path: path.to_path_buf(),
                index,
                reason,
            };
            let e = e
                .as_object()
                .ok_or_else(|| bad("not a JSON object".into()))?;
            let id = |key: &str| -> Result<u64, TimelineError> {
                match e.get(key) {
                    None => Ok(0),
                    Some(v) => v
                        .as_u64()
                        .ok_or_else(|| bad(format!("`{key}` is not a whole number: {v}"))),
                }
            };
            match e.get("ph").and_then(Value::as_str) {
                Some("X") => {
                    let ts = number(e, "ts").map_err(bad)?;
                    let dur = number(e, "dur").map_err(bad)?;
                    if dur < 0.0 {
                        return Err(bad(format!("negative `dur` {dur}")));
                    }
                    let name = text_field(e, "name").unwrap_or_default();
                    let cat = text_field(e, "cat").unwrap_or_else(|| "uncategorised".into());
                    raw.entry((id("pid")?, id("tid")?))
                        .or_default()
                        .push((name, cat, ts, dur));
                }
                Some("M") => {
                    let name = e
                        .get("args")
                        .and_then(|a| a.get("name"))
                        .and_then(Value::as_str);
                    match (e.get("name").and_then(Value::as_str), name) {
                        (Some("process_name"), Some(n)) => {
                            processes.insert(id("pid")?, n.to_string());
                        }
                        (Some("thread_name"), Some(n)) => {
                            threads.insert((id("pid")?, id("tid")?), n.to_string());
                        }
                        _ => {}
                    }
                }
                // Other phases (instants, counters, begin/end pairs) are not drawn.
                _ => {}
            }
        }

        let origin = raw
            .values()
            .flatten()
            .map(|s| s.2)
            .fold(f64::INFINITY, f64::min);
        if !origin.is_finite() {
            return Err(TimelineError::NoSpans(path.to_path_buf()));
        }
        let mut end_ms: f64 = 0.0;
        let tracks = raw
            .into_iter()
            .map(|((pid, tid), spans)| {
                let mut spans: Vec<Span> = spans
                    .into_iter()
                    .map(|(name, cat, ts, dur)| Span {
                        name,
                        cat,
                        start_ms: (ts - origin) / 1e3,
                        dur_ms: dur / 1e3,
                        depth: 0,
                    })
                    .collect();
                let rows = assign_depths(&mut spans);
                end_ms = spans.iter().map(Span::end_ms).fold(end_ms, f64::max);
                let process = processes
                    .get(&pid)
                    .cloned()
                    .unwrap_or_else(|| format!("pid {pid}"));
                let thread = threads
                    .get(&(pid, tid))
                    .cloned()
                    .unwrap_or_else(|| format!("tid {tid}"));
                Track {
                    pid,
                    tid,
                    label: format!("{process} {thread}"),
                    spans,
                    rows,
                }
            })
            .collect();
        Ok(Trace {
            path: path.to_path_buf(),
            tracks,
            end_ms,
        })
    }

    pub fn span_count(&self) -> usize {
        self.tracks.iter().map(|t| t.spans.len()).sum()
    }

    /// The categories present, the profiler's in its order (outermost first), then any other
    /// alphabetically.
    pub fn categories(&self) -> Vec<String> {
        let mut cats: Vec<String> = Vec::new();
        for t in &self.tracks {
            for s in &t.spans {
                if !cats.contains(&s.cat) {
                    cats.push(s.cat.clone());
                }
            }
        }
        cats.sort_by_key(|c| category_order(c));
        cats
    }
}

/// The profiler's categories (`cannon_runtime::trace::Cat`), outermost first: the legend's
/// and the table's order.
pub const CATEGORIES: [&str; 11] = [
    "step",
    "layer",
    "gemm",
    "attention",
    "norm",
    "loss",
    "optimizer",
    "collective",
    "copy",
    "data",
    "eval",
];

fn category_order(cat: &str) -> (usize, String) {
    let known = CATEGORIES.iter().position(|c| *c == cat);
    (known.unwrap_or(CATEGORIES.len()), cat.to_string())
}

/// A complete event as read, by (pid, tid): name, category, `ts` and `dur` still in the
/// trace's microseconds (the origin is known only once every event is read).
type RawSpan = (String, String, f64, f64);

fn number(e: &Map<String, Value>, key: &str) -> Result<f64, String> {
    match e.get(key) {
        Some(v) => v
            .as_f64()
            .filter(|x| x.is_finite())
            .ok_or_else(|| format!("`{key}` is not a number: {v}")),
        None => Err(format!("a complete event (\"ph\": \"X\") without `{key}`")),
    }
}

fn text_field(e: &Map<String, Value>, key: &str) -> Option<String> {
    e.get(key).and_then(Value::as_str).map(str::to_string)
}

/// Sorts `spans` by start (the longer first at one start, so a parent precedes the child
/// that opens with it) and gives each the number of spans still open when it starts: its
/// nesting depth, since one thread's spans nest. A span that overlaps the open one without
/// lying inside it (not from this profiler) also goes a row down, so rectangles never cover
/// each other. Returns the rows used.
pub fn assign_depths(spans: &mut [Span]) -> usize {
    spans.sort_by(|a, b| {
        a.start_ms
            .total_cmp(&b.start_ms)
            .then(b.dur_ms.total_cmp(&a.dur_ms))
    });
    let mut open: Vec<f64> = Vec::new();
    let mut rows = 0;
    for s in spans {
        while open.last().is_some_and(|&end| end <= s.start_ms + EPS_MS) {
            open.pop();
        }
        s.depth = open.len();
        open.push(s.end_ms());
        rows = rows.max(open.len());
    }
    rows
}

/// Time per category on one track: each category's spans merged where they overlap (a
/// category nested in itself counts once), so a total is wall time spent inside that
/// category, children included (a layer's time holds its ops').
pub fn category_ms(track: &Track) -> BTreeMap<String, f64> {
    let mut by_cat: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for s in &track.spans {
        by_cat
            .entry(s.cat.clone())
            .or_default()
            .push((s.start_ms, s.end_ms()));
    }
    by_cat
        .into_iter()
        .map(|(cat, mut iv)| {
            iv.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut total = 0.0;
            let mut cur: Option<(f64, f64)> = None;
            for (a, b) in iv {
                cur = match cur {
                    Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
                    Some((ca, cb)) => {
                        total += cb - ca;
                        Some((a, b))
                    }
                    None => Some((a, b)),
                };
            }
            if let Some((a, b)) = cur {
                total += b - a;
            }
            (cat, total)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(start_ms: f64, dur_ms: f64, cat: &str) -> Span {
        Span {
            name: String::new(),
            cat: cat.into(),
            start_ms,
            dur_ms,
            depth: 0,
        }
    }

    #[test]
    fn depth_is_containment() {
        // step [0,10] > layer [1,5] > gemm [1,2], gemm [3,4]; layer [5,9] (starts where the
        // first ends) > gemm [6,9] (ends with its parent).
        let mut s = vec![
            span(3.0, 1.0, "gemm"),
            span(0.0, 10.0, "step"),
            span(1.0, 1.0, "gemm"),
            span(5.0, 4.0, "layer"),
            span(1.0, 4.0, "layer"),
            span(6.0, 3.0, "gemm"),
        ];
        assert_eq!(assign_depths(&mut s), 3);
        let got: Vec<(f64, usize)> = s.iter().map(|s| (s.start_ms, s.depth)).collect();
        assert_eq!(
            got,
            [(0.0, 0), (1.0, 1), (1.0, 2), (3.0, 2), (5.0, 1), (6.0, 2)]
        );
    }

    #[test]
    fn category_time_merges_overlaps() {
        let t = Track {
            pid: 0,
            tid: 0,
            label: String::new(),
            spans: vec![
                span(0.0, 10.0, "step"),
                span(1.0, 4.0, "layer"),
                span(2.0, 1.0, "layer"),
                span(6.0, 2.0, "layer"),
            ],
            rows: 3,
        };
        let ms = category_ms(&t);
        assert_eq!(ms["step"], 10.0);
        assert_eq!(ms["layer"], 6.0);
    }

    #[test]
    fn traces_parse_with_names_and_errors() {
        let p = Path::new("t.json");
        let t = Trace::parse(
            p,
            r#"{"traceEvents": [
                {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "rank 1"}},
                {"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "host"}},
                {"ph": "X", "name": "b", "cat": "gemm", "pid": 1, "tid": 0, "ts": 2000, "dur": 500},
                {"ph": "X", "name": "a", "cat": "step", "pid": 0, "tid": 0, "ts": 1000, "dur": 3000}
            ]}"#,
        )
        .unwrap();
        assert_eq!(t.tracks.len(), 2);
        assert_eq!(t.tracks[0].label, "pid 0 tid 0");
        assert_eq!(t.tracks[1].label, "rank 1 host");
        assert_eq!(t.tracks[1].spans[0].start_ms, 1.0);
        assert_eq!(t.end_ms, 3.0);
        assert_eq!(t.categories(), ["step", "gemm"]);
        let err = |text: &str| Trace::parse(p, text).unwrap_err().to_string();
        assert!(err("{").contains("not JSON"));
        assert!(err(r#"{"a": 1}"#).contains("not a Chrome trace"));
        assert!(err(r#"[{"ph": "M"}]"#).contains("no complete events"));
        assert!(err(r#"[{"ph": "X", "ts": 1}]"#).contains("event 0"));
    }
}
