//! Reading a conversation dataset (LLaMA-Factory / MindSpeed-MM layouts) into tokenized
//! samples: a JSONL file or one JSON array ([`super::records`]), each record read through the
//! dataset's schema (`super::schema`: `messages` or ShareGPT `conversations`, or the columns
//! a `dataset_info.json` entry maps, see [`super::info`]), image paths relative to the dataset's
//! media folder. Every record is turned into a tokenized sample or reported as bad (with its
//! line number) and skipped; a bad record never stops the reading of the rest.

use super::batch::Sample;
use super::image::{self, ImageConfig};
use super::info::DatasetSpec;
use super::records::{self, Layout, Record};
use super::template::{self, check_roles, count_placeholders, SpecialIds};
use super::truncate::{assemble, validate_input_ids, LabelPolicy};
use super::{DataError, Result, Tekken};
use rayon::prelude::*;
use std::path::{Path, PathBuf};

/// A sample ready for batching: ids, labels and where its images are.
#[derive(Debug, Clone, PartialEq)]
pub struct Prepared {
    /// 1-based line of the dataset file the sample's record starts on.
    pub line: usize,
    pub input_ids: Vec<u32>,
    pub labels: Vec<i32>,
    pub images: Vec<PathBuf>,
    /// Resized (height, width) of each image.
    pub image_sizes: Vec<[u32; 2]>,
}

impl Prepared {
    /// The sample with its images decoded, resized and normalised. An image that no longer
    /// decodes to the size its header gave when the dataset was read is
    /// [`DataError::ImageChanged`]: the batch's shape was planned from that size.
    pub fn load(&self, image: &ImageConfig) -> Result<Sample> {
        let images = self
            .images
            .iter()
            .zip(&self.image_sizes)
            .map(|(path, &[want_h, want_w])| {
                let img = image::load_and_process(path, image)?;
                if (img.height, img.width) != (want_h, want_w) {
                    return Err(DataError::ImageChanged {
                        path: path.clone(),
                        want_w,
                        want_h,
                        found_w: img.width,
                        found_h: img.height,
                    });
                }
                Ok(img)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Sample {
            input_ids: self.input_ids.clone(),
            labels: self.labels.clone(),
            images,
        })
    }
}

/// `prepared` loaded in order, their images processed over the thread pool (one after the
/// other they took a fifth of a step of the built-in default while the other threads
/// waited); the first failing sample in order is the error.
pub fn load_samples(prepared: &[&Prepared], image: &ImageConfig) -> Result<Vec<Sample>> {
    load_each(prepared, image).into_iter().collect()
}

/// `prepared` loaded over the thread pool, each sample's outcome in order (the loader skips
/// the ones whose images turn out not to decode, see [`DataError::skippable_at_load`]).
pub fn load_each(prepared: &[&Prepared], image: &ImageConfig) -> Vec<Result<Sample>> {
    prepared.par_iter().map(|p| p.load(image)).collect()
}

/// What reading a dataset found.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DatasetStats {
    /// Records read: non-blank JSONL lines, or elements of a JSON array.
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
    /// Records skipped as bad (see `DataSet::bad`).
    pub bad_lines: usize,
}

/// Settings that shape the samples.
#[derive(Debug, Clone)]
pub struct SampleSettings<'a> {
    pub max_len: usize,
    /// The run's system prompt, for samples that bring none (see
    /// [`template::encode_run_system`]).
    pub system_prompt: Option<&'a str>,
    pub image: &'a ImageConfig,
    pub labels: LabelPolicy,
}

impl SampleSettings<'_> {
    /// Rejects settings no sample can be made with (zero lengths would otherwise turn every
    /// record into a drop, or every image into one token).
    pub fn check(&self) -> Result<()> {
        let i = self.image;
        for (name, v) in [
            ("max_len", self.max_len as u64),
            ("image.longest_edge", i.longest_edge as u64),
            ("image.patch_size", i.patch_size as u64),
            ("image.merge_size", i.merge_size as u64),
        ] {
            if v == 0 {
                return Err(DataError::Config(format!("{name} must be > 0")));
            }
        }
        Ok(())
    }
}

/// A dataset read into tokenized samples.
#[derive(Debug)]
pub struct DataSet {
    /// The dataset file.
    pub path: PathBuf,
    /// Where it came from and how it was read.
    pub spec: DatasetSpec,
    pub layout: Layout,
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

/// Records prepared together over the thread pool: enough to keep every thread busy (a
/// record costs a header read per image and its tokenization), few enough that a large file
/// is never held as JSON values.
const CHUNK: usize = 4096;

impl DataSet {
    /// Reads and tokenizes a file with the guessed schema, images relative to its folder.
    /// Only an unreadable file (or an array that is not JSON) is an error.
    pub fn read(path: &Path, tok: &Tekken, s: &SampleSettings) -> Result<Self> {
        Self::open(&DatasetSpec::file(path), tok, s)
    }

    /// Reads and tokenizes the dataset `spec` names (see [`DatasetSpec::resolve`]). Images
    /// are checked by their headers only (a missing file, or one that is not an image, makes
    /// its record bad); their pixels are decoded when a sample is loaded for a step
    /// ([`Prepared::load`]), where a file cut after its header is found.
    pub fn open(spec: &DatasetSpec, tok: &Tekken, s: &SampleSettings) -> Result<Self> {
        s.check()?;
        let path = spec.file.as_path();
        let raw = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
        let ids = SpecialIds::from_tekken(tok)?;
        let layout = records::layout(&raw);
        let mut ds = DataSet {
            path: path.to_path_buf(),
            spec: spec.clone(),
            layout,
            samples: Vec::new(),
            bad: Vec::new(),
            dropped: Vec::new(),
            stats: DatasetStats::default(),
        };
        let mut chunk = Vec::with_capacity(CHUNK);
        records::for_each(path, &raw, |r| {
            chunk.push(r);
            if chunk.len() == CHUNK {
                ds.take(spec, layout, &mut chunk, tok, &ids, s);
            }
        })?;
        ds.take(spec, layout, &mut chunk, tok, &ids, s);
        Ok(ds)
    }

    /// Decodes every image of the kept samples in full (over the thread pool), as reading
    /// the set no longer does: the samples whose images fail, as (line, error) in sample
    /// order. What `cannon data check --decode` reports; a run skips such samples instead.
    pub fn undecodable(&self) -> Vec<(usize, DataError)> {
        let failed: Vec<Option<(usize, DataError)>> = self
            .samples
            .par_iter()
            .map(|p| {
                p.images
                    .iter()
                    .find_map(|path| image::load_rgb(path).err())
                    .map(|e| (p.line, e))
            })
            .collect();
        failed.into_iter().flatten().collect()
    }

    /// Prepares `chunk` over the thread pool and adds the outcomes in record order.
    fn take(
        &mut self,
        spec: &DatasetSpec,
        layout: Layout,
        chunk: &mut Vec<Record>,
        tok: &Tekken,
        ids: &SpecialIds,
        s: &SampleSettings,
    ) {
        let made: Vec<(usize, Result<Outcome>)> = chunk
            .par_drain(..)
            .map(|r| (r.line, prepare(spec, layout, r, tok, ids, s)))
            .collect();
        for (line, outcome) in made {
            self.stats.lines += 1;
            match outcome {
                Ok(Outcome::Kept(p, truncated)) => {
                    self.stats.samples += 1;
                    self.stats.tokens += p.input_ids.len();
                    self.stats.label_tokens += p.labels.iter().filter(|&&l| l >= 0).count();
                    self.stats.images += p.images.len();
                    self.stats.truncated += truncated as usize;
                    self.samples.push(p);
                }
                Ok(Outcome::Dropped) => {
                    self.stats.dropped_truncated += 1;
                    self.dropped.push(line);
                }
                Err(e) => {
                    self.stats.bad_lines += 1;
                    self.bad.push(e);
                }
            }
        }
    }
}

/// One record of [`pick_records`]: its 1-based position and line, and the sample it makes (or
/// why it makes none).
#[derive(Debug)]
pub struct PickedRecord {
    pub index: usize,
    pub line: usize,
    pub sample: Result<Prepared>,
}

/// The records of `spec` whose 1-based position `want` accepts, read as a run reads them, one
/// after the other (what `cannon data show` prints). A record that truncation drops is
/// [`DataError::BadLine`] saying so.
pub fn pick_records(
    spec: &DatasetSpec,
    tok: &Tekken,
    s: &SampleSettings,
    want: &dyn Fn(usize) -> bool,
) -> Result<Vec<PickedRecord>> {
    s.check()?;
    let path = spec.file.as_path();
    let raw = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
    let ids = SpecialIds::from_tekken(tok)?;
    let layout = records::layout(&raw);
    let mut out = Vec::new();
    records::for_each(path, &raw, |r| {
        if !want(r.index) {
            return;
        }
        let (index, line) = (r.index, r.line);
        let sample = match prepare(spec, layout, r, tok, &ids, s) {
            Ok(Outcome::Kept(p, _)) => Ok(p),
            Ok(Outcome::Dropped) => Err(DataError::BadLine {
                path: spec.file.clone(),
                line,
                reason: format!(
                    "dropped: truncation to {} tokens cuts an image's token block",
                    s.max_len
                ),
            }),
            Err(e) => Err(e),
        };
        out.push(PickedRecord {
            index,
            line,
            sample,
        });
    })?;
    Ok(out)
}

fn prepare(
    spec: &DatasetSpec,
    layout: Layout,
    r: Record,
    tok: &Tekken,
    ids: &SpecialIds,
    s: &SampleSettings,
) -> Result<Outcome> {
    let line_no = r.line;
    // An array element is named by its position too: several may start on one line.
    let at = match layout {
        Layout::Jsonl => String::new(),
        Layout::JsonArray => format!("sample {}: ", r.index),
    };
    let bad = |reason: String| DataError::BadLine {
        path: spec.file.clone(),
        line: line_no,
        reason: format!("{at}{reason}"),
    };
    let value = r.value.map_err(bad)?;
    let parsed = spec.schema.conversation(&value).map_err(bad)?;
    check_roles(&parsed.messages).map_err(bad)?;
    let placeholders = count_placeholders(&parsed.messages);
    if placeholders != parsed.images.len() {
        return Err(DataError::PlaceholderMismatch {
            sample: format!("{}:{line_no}", spec.file.display()),
            placeholders,
            images: parsed.images.len(),
        });
    }
    let mut images = Vec::with_capacity(parsed.images.len());
    let mut blocks = Vec::with_capacity(parsed.images.len());
    let mut sizes = Vec::with_capacity(parsed.images.len());
    let mut grids = Vec::with_capacity(parsed.images.len());
    for rel in &parsed.images {
        let p = spec.image_path(rel);
        // The header alone gives the size (and so the token block): decoding every image of
        // a large set here cost every rank of a node minutes before the first step.
        let (w0, h0) = image::header_size(&p).map_err(|e| bad(e.to_string()))?;
        let (h, w) = image::processed_size(w0, h0, s.image);
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
    let a = assemble(&turns, s.max_len, s.labels);
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
