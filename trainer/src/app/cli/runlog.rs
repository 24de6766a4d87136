//! One reader of a run's `metrics.jsonl` for `cannon compare` and `cannon plot`, so that both
//! agree on which lines are steps, which step a resumed run's re-logged line replaces, and
//! what a `null` means.
//!
//! A metrics file is JSONL. Three kinds of object count:
//! - a step record: a whole-number `step` and a `loss` (a number, or `null` for a loss that was
//!   not finite: serde_json writes NaN so);
//! - an eval record: a `step` and an `eval_loss` but no `loss` (the validation loss logged
//!   every N steps, with `eval_tokens` beside it);
//! - anything else is skipped: the final `{"eval": {...}}`, a header, and every object whose
//!   `kind`, `type` or `event` is neither `step` nor `train` (unless it is an eval record).
//!
//! Every top-level number of a counted record is kept by its field name (`null` as NaN), so a
//! plot can ask for any of them. A step logged twice (a resumed run re-logs the steps after its
//! checkpoint) counts with its last record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a metrics file cannot be read (the commands exit 2).
#[derive(Debug, thiserror::Error)]
pub enum RunLogError {
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
}

/// A run argument's metrics file: `<dir>/metrics.jsonl` for a run folder, else the path
/// itself.
pub fn metrics_file(arg: &Path) -> PathBuf {
    if arg.is_dir() {
        arg.join("metrics.jsonl")
    } else {
        arg.to_path_buf()
    }
}

/// `lo..=hi` as the messages print it (`..=` alone for the whole run).
pub fn window_text(from: Option<u64>, to: Option<u64>) -> String {
    format!(
        "{}..={}",
        from.map_or(String::new(), |f| f.to_string()),
        to.map_or(String::new(), |t| t.to_string())
    )
}

/// The numbers of one record, by field index into [`RunLog::fields`]. `None`: the record has
/// no such number (absent, or not a number); `Some(NaN)`: it logged `null`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    values: Vec<Option<f64>>,
    /// `"skipped": true`: the step was not applied (its loss or gradient norm was not finite).
    pub skipped: bool,
}

impl Record {
    fn get(&self, field: usize) -> Option<f64> {
        self.values.get(field).copied().flatten()
    }
}

/// A metrics file's step and eval records, by step.
#[derive(Debug, Clone, Default)]
pub struct RunLog {
    /// The file read.
    pub path: PathBuf,
    /// Every numeric field name seen in a counted record (`step` excluded), in order of first
    /// appearance.
    fields: Vec<String>,
    /// Step records (with a `loss`).
    pub steps: BTreeMap<u64, Record>,
    /// Eval records (an `eval_loss` and no `loss`).
    pub evals: BTreeMap<u64, Record>,
}

impl RunLog {
    /// Reads `path` (a JSONL file). A file with no counted record is not an error here: each
    /// command says what it missed.
    pub fn read(path: &Path) -> Result<Self, RunLogError> {
        let text = std::fs::read_to_string(path).map_err(|source| RunLogError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut log = RunLog {
            path: path.to_path_buf(),
            ..RunLog::default()
        };
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            log.parse_line(line)
                .map_err(|reason| RunLogError::Malformed {
                    path: path.to_path_buf(),
                    line: i + 1,
                    reason,
                })?;
        }
        Ok(log)
    }

    fn parse_line(&mut self, line: &str) -> Result<(), String> {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
        let obj = v
            .as_object()
            .ok_or_else(|| "a metrics record must be a JSON object".to_string())?;
        let Some(step) = obj.get("step") else {
            return Ok(());
        };
        let eval = !obj.contains_key("loss") && obj.contains_key("eval_loss");
        let other_kind = ["kind", "type", "event"].iter().any(|k| {
            obj.get(*k)
                .and_then(|v| v.as_str())
                .is_some_and(|s| s != "step" && s != "train")
        });
        if !eval && (other_kind || !obj.contains_key("loss")) {
            return Ok(());
        }
        let step = step
            .as_u64()
            .ok_or_else(|| format!("`step` must be a whole number >= 0, found {step}"))?;
        // The fields each command relies on must be numbers; the others are kept when they are.
        for key in ["loss", "eval_loss", "step_ms"] {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => {}
                Some(v) if v.is_number() => {}
                Some(v) => return Err(format!("`{key}` must be a number, found {v}")),
            }
        }
        let mut rec = Record {
            values: Vec::with_capacity(self.fields.len()),
            skipped: obj.get("skipped").and_then(|s| s.as_bool()) == Some(true),
        };
        for (key, value) in obj {
            let x = match value {
                serde_json::Value::Null => f64::NAN,
                serde_json::Value::Number(n) => match n.as_f64() {
                    Some(x) => x,
                    None => continue,
                },
                _ => continue,
            };
            if key == "step" {
                continue;
            }
            let field = self.field_or_insert(key);
            if rec.values.len() <= field {
                rec.values.resize(field + 1, None);
            }
            rec.values[field] = Some(x);
        }
        let map = if eval {
            &mut self.evals
        } else {
            &mut self.steps
        };
        map.insert(step, rec);
        Ok(())
    }

    fn field_or_insert(&mut self, name: &str) -> usize {
        match self.fields.iter().position(|f| f == name) {
            Some(i) => i,
            None => {
                self.fields.push(name.to_string());
                self.fields.len() - 1
            }
        }
    }

    /// The index of a numeric field, if any counted record had it.
    pub fn field(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f == name)
    }

    /// Every numeric field name a counted record had (`step` excluded).
    pub fn fields(&self) -> &[String] {
        &self.fields
    }

    /// Whether `name` comes only from eval records (sparse points: not smoothed, drawn with
    /// dots).
    pub fn is_eval_field(&self, name: &str) -> bool {
        let Some(field) = self.field(name) else {
            return false;
        };
        let has = |m: &BTreeMap<u64, Record>| m.values().any(|r| r.get(field).is_some());
        has(&self.evals) && !has(&self.steps)
    }

    /// Whether the file had no step and no eval record.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.evals.is_empty()
    }

    /// `field`'s value in the step record of `step`, if logged.
    pub fn step_value(&self, step: u64, field: usize) -> Option<f64> {
        self.steps.get(&step).and_then(|r| r.get(field))
    }

    /// Every `(step, value, skipped)` of `name` in `lo..=hi`, by step: from the step records,
    /// and from the eval records for the steps no step record gave a value (an eval record's
    /// numbers are the eval's own, such as `eval_loss`). Non-finite values are kept.
    pub fn series(&self, name: &str, lo: u64, hi: u64) -> Vec<(u64, f64, bool)> {
        let Some(field) = self.field(name) else {
            return Vec::new();
        };
        let mut out: BTreeMap<u64, (f64, bool)> = BTreeMap::new();
        for (s, r) in self.evals.range(lo..=hi) {
            if let Some(v) = r.get(field) {
                out.insert(*s, (v, r.skipped));
            }
        }
        for (s, r) in self.steps.range(lo..=hi) {
            if let Some(v) = r.get(field) {
                out.insert(*s, (v, r.skipped));
            }
        }
        out.into_iter().map(|(s, (v, k))| (s, v, k)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(lines: &[&str]) -> RunLog {
        let path = std::env::temp_dir().join(format!(
            "cannon-runlog-{}-{}.jsonl",
            std::process::id(),
            lines.len()
        ));
        std::fs::write(&path, lines.join("\n")).unwrap();
        let log = RunLog::read(&path).unwrap();
        std::fs::remove_file(&path).ok();
        log
    }

    #[test]
    fn steps_evals_nulls_and_relogged_steps() {
        let log = read(&[
            r#"{"kind":"config","lr":1}"#,
            r#"{"step":1,"loss":5.0,"lr":0.1,"note":"x"}"#,
            r#"{"step":1,"loss":null,"lr":0.2,"skipped":true}"#,
            r#"{"step":2,"eval_loss":3.0,"eval_tokens":8}"#,
            r#"{"kind":"eval","step":2,"loss":9.0}"#,
            r#"{"eval":{"accuracy":1.0}}"#,
        ]);
        assert_eq!(log.steps.len(), 1);
        assert_eq!(log.evals.len(), 1);
        let loss = log.series("loss", 0, u64::MAX);
        assert_eq!(loss.len(), 1);
        assert!(
            loss[0].1.is_nan() && loss[0].2,
            "the last record of step 1 counts"
        );
        assert_eq!(log.series("lr", 0, 9), vec![(1, 0.2, true)]);
        assert_eq!(log.series("eval_loss", 0, 9), vec![(2, 3.0, false)]);
        assert!(log.is_eval_field("eval_loss") && !log.is_eval_field("loss"));
        assert!(log.field("note").is_none(), "strings are not metrics");
        assert!(log.field("step").is_none());
    }
}
