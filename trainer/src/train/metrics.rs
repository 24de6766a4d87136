//! What a run reports: one JSON line per logged step (for machines), the same numbers as
//! TensorBoard scalars when asked (`log.tensorboard`, [`RunLog`]), and a progress bar on a
//! terminal or plain log lines otherwise (for people).

use super::error::TrainError;
use super::tensorboard::EventWriter;
use crate::train::eval::loss::ValidationLoss;
use crate::train::eval::EvalReport;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One optimizer step's record (a line of `metrics.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    /// Optimizer steps done, this one included (1-based).
    pub step: usize,
    /// Mean loss over the step's trained targets (all micro batches).
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate this step's update used.
    pub lr: f64,
    /// Wall time of the step: loading its micro batches, forward, backward, clip, AdamW.
    pub step_ms: f64,
    /// Of which reading and batching the data.
    pub data_ms: f64,
    /// Non-padding tokens of the step per second of `step_ms`.
    pub tokens_per_s: f64,
    /// Model FLOPs of the step's samples (padding excluded) / (step time x the GEMM peak
    /// measured at start-up, or the best step rate when a step beat it): never above 1.
    pub mfu: f64,
    /// The allocator's peaks over this step (torch's max_memory_allocated / _reserved).
    pub max_allocated_mib: f64,
    pub max_reserved_mib: f64,
    /// The same peaks of the rank that reached the highest (the figure that must fit a
    /// device; rank 0's above).
    pub max_allocated_mib_worst_rank: f64,
    pub max_reserved_mib_worst_rank: f64,
    /// Samples the dataset reading dropped because truncation would cut an image block
    /// (the whole set is read and filtered before the first step).
    pub dropped_samples: u64,
    /// Samples the loader skipped since this process started because an image failed to
    /// decode (the set is read by image headers; a file cut after its header is found when
    /// its sample is loaded). In a sharded run, those of rank 0's rows.
    pub skipped_samples: u64,
    /// Samples and non-padding tokens consumed so far.
    pub samples: u64,
    pub tokens: u64,
    /// Trained targets of this step (the loss's divisor).
    pub targets: usize,
    /// The step was not applied: its loss or gradient norm was not finite (written only
    /// when true).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// Steps skipped so far in the run.
    pub skipped_steps: u64,
}

/// A validation record (`train.eval_every`): `{"step": N, "eval_loss": ..., "eval_tokens":
/// ...}`, with the synthetic default's greedy accuracy overall and per question type
/// (`eval_accuracy`, `eval_accuracy_colour`, ...). It has no `loss`, so readers of the step
/// records pass over it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalLossRecord {
    /// Optimizer steps done when it was taken.
    pub step: usize,
    /// Mean loss over the held-out set's trained targets (`null` when not finite).
    pub eval_loss: f64,
    /// Trained targets of the mean.
    pub eval_tokens: usize,
    pub eval_samples: usize,
    /// Held-out samples left out because an image failed to decode.
    pub eval_skipped: usize,
    /// Wall time of the validation (not part of any step's `step_ms`).
    pub eval_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_accuracy: Option<f64>,
    /// `eval_accuracy_<type>` for each question type scored.
    #[serde(flatten)]
    pub eval_accuracy_by_type: BTreeMap<String, f64>,
}

impl EvalLossRecord {
    pub fn new(
        step: usize,
        v: &ValidationLoss,
        accuracy: Option<&EvalReport>,
        took: Duration,
    ) -> Self {
        let by_type = accuracy.map_or_else(BTreeMap::new, |rep| {
            rep.per_kind
                .iter()
                .map(|k| (format!("eval_accuracy_{}", k.kind.name()), k.accuracy))
                .collect()
        });
        EvalLossRecord {
            step,
            eval_loss: v.loss,
            eval_tokens: v.targets,
            eval_samples: v.samples,
            eval_skipped: v.skipped,
            eval_ms: took.as_secs_f64() * 1e3,
            eval_accuracy: accuracy.map(|r| r.accuracy()),
            eval_accuracy_by_type: by_type,
        }
    }

    /// The progress line: `eval step 40: loss 1.2345 over 5120 tokens, accuracy 81.2% (...)`.
    pub fn line(&self) -> String {
        let mut s = format!(
            "eval step {}: loss {:.4} over {} tokens ({} samples, {:.1} s)",
            self.step,
            self.eval_loss,
            self.eval_tokens,
            self.eval_samples,
            self.eval_ms / 1e3
        );
        if let Some(a) = self.eval_accuracy {
            s += &format!(", accuracy {:.1}%", 100.0 * a);
            let per: Vec<String> = self
                .eval_accuracy_by_type
                .iter()
                .map(|(k, a)| {
                    let kind = k.trim_start_matches("eval_accuracy_");
                    format!("{kind} {:.1}%", 100.0 * a)
                })
                .collect();
            if !per.is_empty() {
                s += &format!(" ({})", per.join(", "));
            }
        }
        s
    }
}

impl StepRecord {
    /// The record's numbers as (name, value), `step` aside: taken from its JSON form, so that
    /// a field added to the record is plotted without being listed here. `skipped` is 0 or 1
    /// (always present), and a non-finite loss or norm (JSON null: the record has no optional
    /// field) is NaN.
    pub fn scalars(&self) -> Vec<(String, f64)> {
        let mut out = json_scalars(self);
        if !out.iter().any(|(name, _)| name == "skipped") {
            out.push(("skipped".into(), f64::from(u8::from(self.skipped))));
        }
        out
    }
}

/// The numbers of a record's JSON form as (name, value), `step` aside (the scalars' x): a
/// boolean is 0 or 1, a JSON null (how a non-finite f64 is written) NaN.
fn json_scalars<T: Serialize>(rec: &T) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(rec) {
        for (name, v) in fields {
            let x = match v {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::Bool(b) => Some(f64::from(u8::from(b))),
                serde_json::Value::Null => Some(f64::NAN),
                _ => None,
            };
            if let Some(x) = x.filter(|_| name != "step") {
                out.push((name, x));
            }
        }
    }
    out
}

/// The final record: `{"eval": {...}}`.
#[derive(Debug, Clone, Serialize)]
pub struct EvalRecord<'a> {
    pub eval: &'a EvalReport,
}

impl EvalRecord<'_> {
    /// The evaluation's numbers as `eval/...` scalars: overall accuracy and counts, and the
    /// accuracy and counts of each question type (`eval/colour/accuracy`).
    pub fn scalars(&self) -> Vec<(String, f64)> {
        let e = self.eval;
        let mut out = vec![
            ("eval/accuracy".to_string(), e.accuracy()),
            ("eval/samples".to_string(), e.samples as f64),
            ("eval/correct".to_string(), e.correct as f64),
            ("eval/skipped".to_string(), e.skipped as f64),
        ];
        for k in &e.per_kind {
            let kind = k.kind.name();
            out.push((format!("eval/{kind}/accuracy"), k.accuracy));
            out.push((format!("eval/{kind}/correct"), k.correct as f64));
            out.push((format!("eval/{kind}/total"), k.total as f64));
        }
        out
    }
}

/// Where a run's records go: `metrics.jsonl`, and with `log.tensorboard` the same numbers as
/// TensorBoard scalars, each record to both at once so that the two never disagree on which
/// steps were logged.
#[derive(Debug)]
pub struct RunLog {
    jsonl: JsonlWriter,
    tensorboard: Option<EventWriter>,
}

impl RunLog {
    /// Opens `jsonl` (appended to when the run resumes after step `first` > 0, else written
    /// anew) and, with `tensorboard` a folder, a new event file in it whose run starts at step
    /// `first + 1` (TensorBoard drops what earlier files of the folder hold from there on, as
    /// a fresh `metrics.jsonl` drops an older run's lines).
    pub fn open(
        jsonl: &Path,
        first: usize,
        tensorboard: Option<&Path>,
    ) -> Result<Self, TrainError> {
        let jsonl = JsonlWriter::open(jsonl, first > 0).map_err(|source| TrainError::Io {
            path: jsonl.to_path_buf(),
            source,
        })?;
        let tensorboard = match tensorboard {
            Some(dir) => {
                let mut w = EventWriter::create(dir)?;
                w.start(first as u64 + 1)?;
                Some(w)
            }
            None => None,
        };
        Ok(RunLog { jsonl, tensorboard })
    }

    /// The event file being written, if any.
    pub fn tensorboard(&self) -> Option<&Path> {
        self.tensorboard.as_ref().map(EventWriter::path)
    }

    /// Logs a step: a line of `metrics.jsonl`, and its scalars.
    pub fn step(&mut self, rec: &StepRecord) -> Result<(), TrainError> {
        self.line(rec)?;
        if let Some(tb) = &mut self.tensorboard {
            tb.scalars(rec.step as u64, &rec.scalars())?;
        }
        Ok(())
    }

    /// Logs a validation: its `metrics.jsonl` record, and its numbers as scalars
    /// (`eval_loss`, `eval_tokens`, `eval_accuracy_colour`, ...) at its step.
    pub fn validation(&mut self, rec: &EvalLossRecord) -> Result<(), TrainError> {
        self.line(rec)?;
        if let Some(tb) = &mut self.tensorboard {
            tb.scalars(rec.step as u64, &json_scalars(rec))?;
        }
        Ok(())
    }

    /// Logs the final evaluation: its `metrics.jsonl` record, and its scalars at `step` (the
    /// run's last).
    pub fn eval(&mut self, step: usize, rep: &EvalReport) -> Result<(), TrainError> {
        let rec = EvalRecord { eval: rep };
        self.line(&rec)?;
        if let Some(tb) = &mut self.tensorboard {
            tb.scalars(step as u64, &rec.scalars())?;
        }
        Ok(())
    }

    fn line<T: Serialize>(&mut self, rec: &T) -> Result<(), TrainError> {
        self.jsonl.write(rec).map_err(|source| TrainError::Io {
            path: self.jsonl.path().to_path_buf(),
            source,
        })
    }
}

/// Appends JSON lines to a file, flushed after each line so that a killed run keeps what it
/// logged.
#[derive(Debug)]
pub struct JsonlWriter {
    path: PathBuf,
    file: std::io::BufWriter<std::fs::File>,
}

impl JsonlWriter {
    /// Creates (or appends to, when resuming) `path`.
    pub fn open(path: &Path, append: bool) -> std::io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(path)?;
        Ok(JsonlWriter {
            path: path.to_path_buf(),
            file: std::io::BufWriter::new(file),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn write<T: Serialize>(&mut self, record: &T) -> std::io::Result<()> {
        serde_json::to_writer(&mut self.file, record)?;
        self.file.write_all(b"\n")?;
        self.file.flush()
    }
}

/// Progress for people: an indicatif bar (step, loss, tokens/s, ETA) when stderr is a
/// terminal, else a plain line at most every `min_gap` (and for the last step).
#[derive(Debug)]
pub struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    last_line: Option<Instant>,
    min_gap: Duration,
    started: Instant,
}

impl Progress {
    pub fn new(total: usize, start_step: usize) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total as u64);
            let style = ProgressStyle::with_template(
                "{bar:30} step {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_position(start_step as u64);
            bar
        });
        Progress {
            bar,
            total,
            last_line: None,
            min_gap: Duration::from_secs(5),
            started: Instant::now(),
        }
    }

    pub fn update(&mut self, r: &StepRecord, done_since_start: usize) {
        let msg = format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s{}",
            r.loss,
            r.lr,
            r.tokens_per_s,
            if r.skipped {
                " SKIPPED (not finite)"
            } else {
                ""
            }
        );
        if let Some(bar) = &self.bar {
            bar.set_position(r.step as u64);
            bar.set_message(msg);
            return;
        }
        let last = r.step == self.total;
        if !last && self.last_line.is_some_and(|t| t.elapsed() < self.min_gap) {
            return;
        }
        self.last_line = Some(Instant::now());
        let elapsed = self.started.elapsed().as_secs_f64();
        let per_step = elapsed / done_since_start.max(1) as f64;
        let eta = per_step * (self.total - r.step) as f64;
        eprintln!(
            "step {}/{} {msg} grad_norm {:.3} step {:.0} ms eta {}",
            r.step,
            self.total,
            r.grad_norm,
            r.step_ms,
            clock(eta)
        );
    }

    /// Prints a line without breaking the bar.
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// `1h02m03s`, `4m05s` or `6s`.
pub fn clock(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}h{m:02}m{s:02}s")
    } else if m > 0 {
        format!("{m}m{s:02}s")
    } else {
        format!("{s}s")
    }
}
