//! Reading a JSONL conversation dataset (LLaMA-Factory / MindSpeed-MM layout):
//! `{"messages":[{"role":..,"content":..}], "images":["a.png", ...]}` per line, image paths
//! relative to the file. Every line is turned into a tokenized sample or reported as bad (with
//! its line number) and skipped; a bad line never stops the reading of the rest.

use super::image::{self, ImageConfig};
use super::template::{self, check_roles, count_placeholders, Message, SpecialIds};
use super::truncate::{assemble, validate_input_ids};
use super::{DataError, Result, Tekken};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Unknown keys (ids, sources, ...) are ignored, as LLaMA-Factory does.
#[derive(Deserialize)]
struct Line {
    messages: Vec<Message>,
    #[serde(default)]
    images: Vec<String>,
    /// LLaMA-Factory allows a per-sample system prompt beside the messages.
    #[serde(default)]
    system: Option<String>,
}

/// A sample ready for batching: ids, labels and where its images are.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// 1-based line in the dataset file.
    pub line: usize,
    pub input_ids: Vec<u32>,
    pub labels: Vec<i32>,
    pub images: Vec<PathBuf>,
    /// Resized (height, width) of each image.
    pub image_sizes: Vec<[u32; 2]>,
}

/// What reading a dataset found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DatasetStats {
    /// Non-empty lines read.
    pub lines: usize,
    /// Samples kept.
    pub samples: usize,
    /// Tokens of the kept samples.
    pub tokens: usize,
    /// Trained tokens (labels != IGNORE_INDEX) of the kept samples.
    pub label_tokens: usize,
    /// Images of the kept samples.
    pub images: usize,
    /// Kept samples whose text was cut by truncation (every image block intact).
    pub truncated: usize,
    /// Samples dropped because truncation cut an image block.
    pub dropped_truncated: usize,
    /// Lines skipped as bad (see `DataSet::bad`).
    pub bad_lines: usize,
}

/// Settings that shape the samples.
#[derive(Debug, Clone)]
pub struct SampleSettings<'a> {
    pub max_len: usize,
    pub system_prompt: Option<&'a str>,
    pub image: &'a ImageConfig,
}

/// A dataset read into tokenized samples.
#[derive(Debug)]
pub struct DataSet {
    pub path: PathBuf,
    pub samples: Vec<Prepared>,
    /// One [`DataError::BadLine`] (or image/sample error) per skipped line.
    pub bad: Vec<DataError>,
    /// Lines of the samples dropped by truncation.
    pub dropped: Vec<usize>,
    pub stats: DatasetStats,
}

enum Outcome {
    Kept(Prepared, bool),
    Dropped,
}

impl DataSet {
    /// Reads and tokenizes the whole file. Only an unreadable file is an error.
    pub fn read(path: &Path, tok: &Tekken, s: &SampleSettings) -> Result<Self> {
        let raw = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        let ids = SpecialIds::from_tekken(tok)?;
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut ds = DataSet {
            path: path.to_path_buf(),
            samples: Vec::new(),
            bad: Vec::new(),
            dropped: Vec::new(),
            stats: DatasetStats::default(),
        };
        // Split bytes, not text: one line of invalid UTF-8 is a bad line, not a bad file.
        for (i, raw_line) in raw.split(|&b| b == b'\n').enumerate() {
            let line = std::str::from_utf8(raw_line).map_err(|e| DataError::BadLine {
                path: path.to_path_buf(),
                line: i + 1,
                reason: format!("not UTF-8: {e}"),
            });
            if line.as_ref().is_ok_and(|l| l.trim().is_empty()) {
                continue;
            }
            ds.stats.lines += 1;
            let outcome = line
                .and_then(|l| prepare(path, &dir, i + 1, l.trim_end_matches('\r'), tok, &ids, s));
            match outcome {
                Ok(Outcome::Kept(p, truncated)) => {
                    ds.stats.samples += 1;
                    ds.stats.tokens += p.input_ids.len();
                    ds.stats.label_tokens += p.labels.iter().filter(|&&l| l >= 0).count();
                    ds.stats.images += p.images.len();
                    ds.stats.truncated += truncated as usize;
                    ds.samples.push(p);
                }
                Ok(Outcome::Dropped) => {
                    ds.stats.dropped_truncated += 1;
                    ds.dropped.push(i + 1);
                }
                Err(e) => {
                    ds.stats.bad_lines += 1;
                    ds.bad.push(e);
                }
            }
        }
        Ok(ds)
    }
}

fn prepare(
    path: &Path,
    dir: &Path,
    line_no: usize,
    line: &str,
    tok: &Tekken,
    ids: &SpecialIds,
    s: &SampleSettings,
) -> Result<Outcome> {
    let bad = |reason: String| DataError::BadLine {
        path: path.to_path_buf(),
        line: line_no,
        reason,
    };
    let parsed: Line = serde_json::from_str(line).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    check_roles(&parsed.messages).map_err(bad)?;
    let placeholders = count_placeholders(&parsed.messages);
    if placeholders != parsed.images.len() {
        return Err(DataError::PlaceholderMismatch {
            sample: format!("{}:{line_no}", path.display()),
            placeholders,
            images: parsed.images.len(),
        });
    }
    let mut images = Vec::with_capacity(parsed.images.len());
    let mut blocks = Vec::with_capacity(parsed.images.len());
    let mut sizes = Vec::with_capacity(parsed.images.len());
    let mut grids = Vec::with_capacity(parsed.images.len());
    for rel in &parsed.images {
        let p = dir.join(rel);
        // Decoding the whole image here catches truncated files before training starts.
        let img = image::load_regularized(&p, s.image).map_err(|e| bad(e.to_string()))?;
        let (h, w) = s.image.output_size(img.height(), img.width());
        let block = image::image_block(h, w, s.image, ids.image);
        if block.is_empty() {
            let min = s.image.patch_size * s.image.merge_size;
            let e = DataError::ImageTooSmall {
                path: p,
                width: w,
                height: h,
                min,
            };
            return Err(bad(e.to_string()));
        }
        grids.push(s.image.token_grid(h, w));
        sizes.push([h, w]);
        blocks.push(block);
        images.push(p);
    }
    let system = parsed.system.as_deref().or(s.system_prompt);
    let turns = template::encode_turns(tok, ids, &parsed.messages, system, &blocks);
    let a = assemble(&turns, s.max_len);
    if a.truncated && !validate_input_ids(&a.input_ids, &grids, ids.image) {
        return Ok(Outcome::Dropped);
    }
    Ok(Outcome::Kept(
        Prepared {
            line: line_no,
            input_ids: a.input_ids,
            labels: a.labels,
            images,
            image_sizes: sizes,
        },
        a.truncated,
    ))
}
