//! Spans for a step profiler: named, classed intervals recorded by the thread that runs a
//! rank's work, written as a Chrome trace (Perfetto and `chrome://tracing` open it).
//!
//! A thread records only between [`start`] and [`finish`]; everywhere else a span costs one
//! relaxed atomic load (no thread has started: the common case) or a thread-local read, so
//! the ops can be instrumented once, always. On a device whose stream runs its work inline
//! (the CPU) a span is the host time between its creation and its drop, which is the work's
//! time. On an NPU the host only enqueues: [`span_on`] records an [`Event`] on the stream at
//! both ends, and [`finish`] reads the device times off them after synchronising, placed on
//! the host clock by a reference event recorded at [`start`]; those spans go on a track of
//! their own beside the host's.

use crate::stream::{Event, Stream};
use std::cell::RefCell;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// What a span is, for colouring and totals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cat {
    /// A whole step.
    Step,
    /// A layer's (or a part's) forward or backward.
    Layer,
    Gemm,
    Attention,
    /// RMSNorm, RoPE, activations, casts and other element-wise work.
    Norm,
    /// The lm_head's loss.
    Loss,
    /// Gradient clipping and AdamW.
    Optimizer,
    Collective,
    /// Host-device copies.
    Copy,
    /// Reading and batching the data.
    Data,
    /// The held-out loss.
    Eval,
}

impl Cat {
    pub fn name(self) -> &'static str {
        match self {
            Cat::Step => "step",
            Cat::Layer => "layer",
            Cat::Gemm => "gemm",
            Cat::Attention => "attention",
            Cat::Norm => "norm",
            Cat::Loss => "loss",
            Cat::Optimizer => "optimizer",
            Cat::Collective => "collective",
            Cat::Copy => "copy",
            Cat::Data => "data",
            Cat::Eval => "eval",
        }
    }
}

/// One recorded interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    pub name: &'static str,
    /// A layer's or step's number, shown after the name.
    pub index: Option<usize>,
    pub cat: Cat,
    /// Microseconds since the recording's epoch.
    pub start_us: f64,
    pub dur_us: f64,
    /// Timed on the device (an NPU's events), not the host.
    pub device: bool,
}

impl Span {
    /// `text.layer 3 forward`-style label: the name with its index.
    pub fn label(&self) -> String {
        match self.index {
            Some(i) => format!("{} {i}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// A span timed by events on a device stream, read at [`finish`].
struct Pending {
    name: &'static str,
    index: Option<usize>,
    cat: Cat,
    begin: Event,
    end: Event,
}

struct Recorder {
    epoch: Instant,
    spans: Vec<Span>,
    pending: Vec<Pending>,
    /// The device reference: an event recorded at `start` on the stream, and when.
    reference: Option<(Event, Instant)>,
}

thread_local! {
    static RECORDER: RefCell<Option<Recorder>> = const { RefCell::new(None) };
}

/// Threads recording now: 0 keeps every span a single load.
static RECORDING: AtomicUsize = AtomicUsize::new(0);

/// Starts recording on this thread; times count from `epoch` (the same for every rank of a
/// process, so their tracks line up). With `stream` on a device that does not run inline, a
/// reference event is recorded on it for the device spans. A recording already running on
/// the thread is dropped.
pub fn start(epoch: Instant, stream: Option<&Stream>) {
    let reference = stream.filter(|s| !s.device().runs_inline()).and_then(|s| {
        let mut e = Event::new(s.device()).ok()?;
        e.record(s).ok()?;
        Some((e, Instant::now()))
    });
    RECORDER.with(|r| {
        let old = r.borrow_mut().replace(Recorder {
            epoch,
            spans: Vec::new(),
            pending: Vec::new(),
            reference,
        });
        if old.is_none() {
            RECORDING.fetch_add(1, Ordering::SeqCst);
        }
    });
}

/// Stops this thread's recording and returns its spans in start order (none if it was not
/// recording). Device spans are read after their events complete (this waits for them).
pub fn finish() -> Vec<Span> {
    let Some(rec) = RECORDER.with(|r| r.borrow_mut().take()) else {
        return Vec::new();
    };
    RECORDING.fetch_sub(1, Ordering::SeqCst);
    let Recorder {
        epoch,
        mut spans,
        pending,
        reference,
    } = rec;
    if let Some((reference, at)) = &reference {
        let base_us = at.saturating_duration_since(epoch).as_secs_f64() * 1e6;
        for p in pending {
            let times = p.end.synchronize().and_then(|_| {
                let from = reference.elapsed_ms(&p.begin)?;
                let dur = p.begin.elapsed_ms(&p.end)?;
                Ok((from, dur))
            });
            // A span whose events cannot be read is left out: a trace is best effort.
            if let Ok((from, dur)) = times {
                spans.push(Span {
                    name: p.name,
                    index: p.index,
                    cat: p.cat,
                    start_us: base_us + f64::from(from) * 1e3,
                    dur_us: f64::from(dur) * 1e3,
                    device: true,
                });
            }
        }
    }
    spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    spans
}

/// Whether this thread is recording.
pub fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed) > 0 && RECORDER.with(|r| r.borrow().is_some())
}

/// A span open until dropped.
#[must_use = "a span ends when it is dropped"]
pub struct Guard<'s> {
    open: Option<Open<'s>>,
}

struct Open<'s> {
    name: &'static str,
    index: Option<usize>,
    cat: Cat,
    at: Instant,
    device: Option<(Event, &'s Stream)>,
}

/// A host-timed span of `cat` named `name`.
pub fn span(name: &'static str, cat: Cat) -> Guard<'static> {
    open(name, None, cat, None)
}

/// A span with a number (a layer, a step).
pub fn span_at(name: &'static str, index: usize, cat: Cat) -> Guard<'static> {
    open(name, Some(index), cat, None)
}

/// A span of work enqueued on `stream`: host-timed where the stream runs inline, timed by
/// events on the device otherwise.
pub fn span_on<'s>(stream: &'s Stream, name: &'static str, cat: Cat) -> Guard<'s> {
    open(name, None, cat, Some(stream))
}

fn open<'s>(
    name: &'static str,
    index: Option<usize>,
    cat: Cat,
    stream: Option<&'s Stream>,
) -> Guard<'s> {
    if !recording() {
        return Guard { open: None };
    }
    let device = stream.filter(|s| !s.device().runs_inline()).and_then(|s| {
        let mut e = Event::new(s.device()).ok()?;
        e.record(s).ok()?;
        Some((e, s))
    });
    Guard {
        open: Some(Open {
            name,
            index,
            cat,
            at: Instant::now(),
            device,
        }),
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let Some(o) = self.open.take() else {
            return;
        };
        let end = Instant::now();
        RECORDER.with(|r| {
            let mut r = r.borrow_mut();
            let Some(rec) = r.as_mut() else {
                return;
            };
            if let Some((begin, stream)) = o.device {
                if let Ok(mut e) = Event::new(stream.device()) {
                    if e.record(stream).is_ok() {
                        rec.pending.push(Pending {
                            name: o.name,
                            index: o.index,
                            cat: o.cat,
                            begin,
                            end: e,
                        });
                    }
                }
                // The host side too: how long enqueueing took.
            }
            rec.spans.push(Span {
                name: o.name,
                index: o.index,
                cat: o.cat,
                start_us: o.at.saturating_duration_since(rec.epoch).as_secs_f64() * 1e6,
                dur_us: end.saturating_duration_since(o.at).as_secs_f64() * 1e6,
                device: false,
            });
        });
    }
}

/// Writes the Chrome trace JSON of `ranks` (rank, its spans) to `path`: one process per
/// rank (`rank N`), its host spans on thread 0 and its device spans on thread 1, complete
/// events (`"ph": "X"`) in microseconds with the class as `cat`.
pub fn write_chrome(path: &Path, ranks: &[(usize, Vec<Span>)]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [")?;
    let mut first = true;
    let mut sep = |out: &mut std::io::BufWriter<std::fs::File>| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            writeln!(out, ",")?;
        }
        Ok(())
    };
    for (rank, spans) in ranks {
        sep(&mut out)?;
        write!(
            out,
            "{{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": {rank}, \"tid\": 0, \
             \"args\": {{\"name\": \"rank {rank}\"}}}}"
        )?;
        for (tid, what) in [(0, "host"), (1, "device")] {
            sep(&mut out)?;
            write!(
                out,
                "{{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": {rank}, \"tid\": {tid}, \
                 \"args\": {{\"name\": \"{what}\"}}}}"
            )?;
        }
        for s in spans {
            sep(&mut out)?;
            let name = json_string(&s.label());
            write!(
                out,
                "{{\"ph\": \"X\", \"name\": {name}, \"cat\": \"{}\", \"pid\": {rank}, \
                 \"tid\": {}, \"ts\": {:.3}, \"dur\": {:.3}}}",
                s.cat.name(),
                u8::from(s.device),
                s.start_us,
                s.dur_us
            )?;
        }
    }
    writeln!(out, "\n]}}")?;
    out.flush()
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_recorded_only_between_start_and_finish() {
        drop(span("before", Cat::Gemm));
        assert!(finish().is_empty());
        let (epoch, stream) = (Instant::now(), Stream::cpu());
        start(epoch, Some(&stream));
        {
            let _outer = span_at("layer", 3, Cat::Layer);
            let _inner = span_on(&stream, "gemm", Cat::Gemm);
        }
        let spans = finish();
        drop(span("after", Cat::Gemm));
        assert!(finish().is_empty());
        let labels: Vec<String> = spans.iter().map(Span::label).collect();
        assert_eq!(labels, ["layer 3", "gemm"]);
        // The inner span lies within the outer one.
        let (o, i) = (&spans[0], &spans[1]);
        assert!(i.start_us >= o.start_us && i.start_us + i.dur_us <= o.start_us + o.dur_us);
        assert!(spans.iter().all(|s| !s.device));
    }

    #[test]
    fn the_chrome_trace_is_json_with_one_process_per_rank() {
        let dir = std::env::temp_dir().join(format!("cannon-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.json");
        let s = |name, cat, start_us| Span {
            name,
            index: None,
            cat,
            start_us,
            dur_us: 2.5,
            device: false,
        };
        let ranks = vec![
            (
                0,
                vec![
                    s("gemm", Cat::Gemm, 1.0),
                    s("all \"gather\"", Cat::Collective, 4.0),
                ],
            ),
            (1, vec![s("gemm", Cat::Gemm, 1.5)]),
        ];
        write_chrome(&path, &ranks).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let events = v["traceEvents"].as_array().unwrap();
        let complete: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 3);
        assert_eq!(complete[1]["name"], "all \"gather\"");
        assert_eq!(complete[1]["cat"], "collective");
        assert_eq!(complete[2]["pid"], 1);
        std::fs::remove_dir_all(&dir).ok();
    }
}
