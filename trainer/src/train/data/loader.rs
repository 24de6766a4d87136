//! The stream of batches the trainer consumes: a read dataset, a resumable shuffled order, and
//! padding or packing.

use super::batch::{RowBuilder, Sample};
use super::dataset::{load_each, DataSet, DatasetStats, Prepared, SampleSettings};
use super::image::ImageConfig;
use super::index::IndexUse;
use super::info::DatasetSpec;
use super::shuffle::{Position, Shuffler};
use super::truncate::LabelPolicy;
use super::{Batch, DataError, Result, Tekken};
use serde::Deserialize;
use std::ops::Range;
use std::path::PathBuf;

/// Data settings, embeddable in the trainer's TOML as a `[data]` table.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// A JSONL or JSON array file, or the name of an entry of `dataset_dir/dataset_info.json`;
    /// None lets the trainer pick its default (the synthetic shapes set).
    pub dataset: Option<PathBuf>,
    /// LLaMA-Factory's `dataset_dir`: where `dataset_info.json` is looked for and what relative
    /// image paths start from (None: the dataset file's folder).
    pub dataset_dir: Option<PathBuf>,
    /// tekken.json.
    pub tokenizer: Option<PathBuf>,
    /// Truncated vocabulary size (mistral-common `Tekkenizer(vocab_size=)`); None: the file's.
    pub vocab_size: Option<u32>,
    /// Longest sample / packed row in tokens (cutoff_len).
    pub max_len: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// Pack several samples per row instead of padding one per row.
    pub pack: bool,
    /// Padded rows are rounded up to a multiple of this.
    pub pad_to_multiple_of: usize,
    /// Shuffling seed.
    pub seed: u64,
    /// System prompt for samples that bring none (none for the synthetic set).
    pub system_prompt: Option<String>,
    pub image: ImageConfig,
    /// Which tokens are trained.
    pub labels: LabelPolicy,
    /// The index cache folder ([`super::index`]); None: the dataset is read every time.
    pub cache_dir: Option<PathBuf>,
    /// The fraction of the set held out for validation ([`super::holdout`]), which the
    /// loader never serves; 0: none.
    pub eval_split: f64,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            dataset: None,
            dataset_dir: None,
            tokenizer: None,
            vocab_size: None,
            max_len: 2048,
            batch_size: 1,
            pack: false,
            pad_to_multiple_of: 8,
            seed: 42,
            system_prompt: None,
            image: ImageConfig::default(),
            labels: LabelPolicy::default(),
            cache_dir: None,
            eval_split: 0.0,
        }
    }
}

impl DataConfig {
    pub fn sample_settings(&self) -> SampleSettings<'_> {
        SampleSettings {
            max_len: self.max_len,
            system_prompt: self.system_prompt.as_deref(),
            image: &self.image,
            labels: self.labels,
        }
    }
}

/// What a batch is before any image is read, for the step's metrics and FLOPs
/// (`crate::train::flops::shape_flops`): it equals what the whole [`Batch`] gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchShape {
    pub rows: usize,
    pub seq: usize,
    /// Cumulative ends of the sequences over all rows (the batch's `cu_seqlens`).
    pub sequence_ends: Vec<usize>,
    /// (height, width) of every image in batch order (the batch's `images.sizes`).
    pub image_sizes: Vec<(usize, usize)>,
    /// Samples in the batch (the sum of its `samples_per_row`).
    pub samples: usize,
    /// Tokens of the samples, padding excluded.
    pub sample_tokens: usize,
    /// Each sample's length in tokens, in batch order (the sequences of `sequence_ends`
    /// without the padding tails): what the model FLOPs of MFU count.
    pub sample_lens: Vec<usize>,
}

impl BatchShape {
    /// Tokens with padding (`rows x seq`).
    pub fn tokens(&self) -> usize {
        self.rows * self.seq
    }
}

/// Endless, deterministic batches over a dataset; restartable from [`Loader::position`].
///
/// A sample whose image fails to decode when its batch is made (a file cut after its header,
/// which reading the dataset does not find; see [`DataError::skippable_at_load`]) is skipped:
/// the batch is made again from the stream without it, the sample is counted
/// ([`Loader::skipped_samples`]), a warning names it once, and later epochs pass over it.
/// Without such a sample the batches are the ones the stream gives, whatever the history;
/// with one, every loader that meets it makes the same batches (a resumed one meets it again
/// at the same place). Ranks that read only their own rows (see [`Loader::next_rows`]) share
/// what they find, so each skips every bad sample of the batch.
#[derive(Debug)]
pub struct Loader {
    data: DataSet,
    cfg: DataConfig,
    pad_id: u32,
    order: Shuffler,
    /// Samples found undecodable by this loader, by dataset index.
    skipped: Vec<bool>,
    skipped_count: usize,
    /// How the index cache was used, when the loader read the dataset through it.
    index: Option<IndexUse>,
}

impl Loader {
    /// Reads `cfg.dataset` with `tok` (through the index cache in `cfg.cache_dir`, if set),
    /// leaves out its `cfg.eval_split` held-out part and starts at `pos`.
    pub fn open(cfg: &DataConfig, tok: &Tekken, pos: Position) -> Result<Self> {
        let path = cfg
            .dataset
            .as_ref()
            .ok_or_else(|| DataError::Config("no dataset given".into()))?;
        let spec = DatasetSpec::resolve(path, cfg.dataset_dir.as_deref())?;
        let settings = cfg.sample_settings();
        let (mut data, index) = match &cfg.cache_dir {
            Some(dir) => {
                let (d, used) = DataSet::open_cached(&spec, tok, &settings, dir)?;
                (d, Some(used))
            }
            None => (DataSet::open(&spec, tok, &settings)?, None),
        };
        if cfg.eval_split > 0.0 {
            data.split_off_holdout(cfg.eval_split, cfg.seed);
        }
        let mut loader = Self::new(data, cfg, tok.pad_id(), pos)?;
        loader.index = index;
        Ok(loader)
    }

    /// Batches over an already read dataset.
    pub fn new(data: DataSet, cfg: &DataConfig, pad_id: u32, pos: Position) -> Result<Self> {
        if data.samples.is_empty() {
            return Err(DataError::Config(format!(
                "{}: no usable sample ({} bad lines, {} dropped by truncation)",
                data.path.display(),
                data.stats.bad_lines,
                data.stats.dropped_truncated
            )));
        }
        if cfg.batch_size == 0 || cfg.max_len == 0 {
            return Err(DataError::Config(
                "batch_size and max_len must be > 0".into(),
            ));
        }
        let order = Shuffler::new(data.samples.len(), cfg.seed, pos);
        let skipped = vec![false; data.samples.len()];
        Ok(Loader {
            data,
            cfg: cfg.clone(),
            pad_id,
            order,
            skipped,
            skipped_count: 0,
            index: None,
        })
    }

    /// What reading the dataset found.
    pub fn stats(&self) -> &DatasetStats {
        &self.data.stats
    }
    /// Samples this loader skipped because an image failed to decode (each counted once).
    pub fn skipped_samples(&self) -> usize {
        self.skipped_count
    }
    /// How the index cache was used ([`Loader::open`] with a `cache_dir`).
    pub fn index(&self) -> Option<&IndexUse> {
        self.index.as_ref()
    }
    pub fn dataset(&self) -> &DataSet {
        &self.data
    }
    /// Where the next batch starts: store it in a checkpoint, pass it to `open` to resume.
    pub fn position(&self) -> Position {
        self.order.position()
    }

    /// Moves the stream to `pos` (a checkpoint's loader position) without reading the
    /// dataset again.
    pub fn seek(&mut self, pos: Position) {
        self.order = Shuffler::new(self.data.samples.len(), self.cfg.seed, pos);
    }

    /// Sample `i` of the dataset with its images processed.
    pub fn sample(&self, i: usize) -> Result<Sample> {
        self.data.samples[i].load(&self.cfg.image)
    }

    /// The next batch. On error the position is left where it was.
    pub fn next_batch(&mut self) -> Result<Batch> {
        Ok(self.next_rows(|rows| 0..rows, |_| Ok(()))?.0)
    }

    /// Rows `pick(rows)` of the next batch, at the whole batch's length, and the whole
    /// batch's `BatchShape`: a rank of a sharded run reads only its own rows' images yet
    /// reports the step's tokens, samples and FLOPs. The rows are the ones
    /// [`Loader::next_batch`] makes (the same sequences, positions and images), and the
    /// stream moves by the whole batch. A picked sample whose image does not decode is
    /// skipped (see [`Loader`]); any other error leaves the position where it was.
    ///
    /// `agree` sums a vector over the loaders that share the stream (the ranks of a run;
    /// one loader passes `|_| Ok(())`), and is called the same number of times on each of
    /// them: once per attempt at the batch, with one flag for "a picked sample failed
    /// otherwise" and one per sample of the whole batch, set where a picked sample's image
    /// did not decode. Every loader then skips the samples any of them found, so the ranks
    /// make the same batches and count the same skipped samples, and an error on one rank
    /// is an error on all of them rather than a collective left waiting.
    pub fn next_rows(
        &mut self,
        pick: impl FnOnce(usize) -> Range<usize>,
        mut agree: impl FnMut(&mut [i64]) -> Result<()>,
    ) -> Result<(Batch, BatchShape)> {
        self.check_usable()?;
        // Both layouts make exactly batch_size rows.
        let range = pick(self.cfg.batch_size);
        let (order, rows, samples) = loop {
            let mut order = self.order.clone();
            let rows = if self.cfg.pack {
                self.packed_rows(&mut order)?
            } else {
                self.padded_rows(&mut order)?
            };
            if rows.get(range.clone()).is_none() {
                let n = rows.len();
                return Err(DataError::Config(format!(
                    "rows {range:?} of a batch of {n}"
                )));
            }
            if let Some(samples) = self.make_samples(&rows, range.clone(), &mut agree)? {
                break (order, rows, samples);
            }
        };
        let shape = self.shape(&rows);
        let picked = &rows[range];
        let mut b = RowBuilder::new(shape.seq, self.pad_id);
        b.reserve_pixels(&samples);
        let mut rest = &samples[..];
        for row in picked {
            let (this, next) = rest.split_at(row.len());
            // A sample longer than max_len (never read so, but a bad dataset must not
            // panic) is an error here.
            b.push_row(this)?;
            rest = next;
        }
        self.order = order;
        Ok((b.finish(), shape))
    }

    /// The shape of the batch of `rows`, from the samples' token counts and image sizes
    /// alone: rows of `max_len` when packing, else of the longest sample rounded up to
    /// `pad_to_multiple_of` (8 in LLaMA-Factory's collator, which keeps the shapes few);
    /// sequences as [`RowBuilder`] lays them out (each sample, then the padding tail).
    fn shape(&self, rows: &[Vec<usize>]) -> BatchShape {
        let len = |i: usize| self.data.samples[i].input_ids.len();
        let seq = if self.cfg.pack {
            self.cfg.max_len
        } else {
            let longest = rows.iter().flatten().map(|&i| len(i)).max().unwrap_or(0);
            let m = self.cfg.pad_to_multiple_of.max(1);
            longest.div_ceil(m) * m
        };
        let mut shape = BatchShape {
            rows: rows.len(),
            seq,
            sequence_ends: Vec::new(),
            image_sizes: Vec::new(),
            samples: 0,
            sample_tokens: 0,
            sample_lens: Vec::new(),
        };
        for (r, row) in rows.iter().enumerate() {
            let mut end = r * seq;
            for &i in row {
                let p = &self.data.samples[i];
                if len(i) > 0 {
                    end += len(i);
                    shape.sequence_ends.push(end);
                    shape.sample_lens.push(len(i));
                }
                shape.sample_tokens += len(i);
                let sizes = p.image_sizes.iter().map(|&[h, w]| (h as usize, w as usize));
                shape.image_sizes.extend(sizes);
            }
            if end < (r + 1) * seq {
                shape.sequence_ends.push((r + 1) * seq);
            }
            shape.samples += row.len();
        }
        shape
    }

    /// The samples of rows `picked` of `rows` (a range inside it), in order (see
    /// [`load_each`]); None when some sample of the batch
    /// failed to decode here or on another loader (see [`Loader::next_rows`]) and was marked
    /// skipped: the batch is to be made again without it. The first other error in row
    /// order is the error, and nothing is marked.
    fn make_samples(
        &mut self,
        rows: &[Vec<usize>],
        picked: Range<usize>,
        agree: &mut impl FnMut(&mut [i64]) -> Result<()>,
    ) -> Result<Option<Vec<Sample>>> {
        let whole: Vec<usize> = rows.iter().flatten().copied().collect();
        // Where the picked samples start among the whole batch's.
        let first: usize = rows[..picked.start].iter().map(Vec::len).sum();
        let index: Vec<usize> = rows[picked].iter().flatten().copied().collect();
        let prepared: Vec<&Prepared> = index.iter().map(|&i| &self.data.samples[i]).collect();
        let made = load_each(&prepared, &self.cfg.image);
        // flags[0]: a fatal error here; flags[1 + k]: sample k of the batch is skippable.
        let mut flags = vec![0i64; 1 + whole.len()];
        let mut first_fatal = None;
        let mut seen = Vec::new();
        for (k, m) in made.iter().enumerate() {
            match m {
                Err(e) if !e.skippable_at_load() => {
                    flags[0] = 1;
                    first_fatal.get_or_insert(k);
                }
                Err(e) => {
                    flags[1 + first + k] = 1;
                    seen.push((index[k], e.to_string()));
                }
                Ok(_) => {}
            }
        }
        agree(&mut flags)?;
        if flags[0] > 0 {
            return Err(match first_fatal {
                Some(k) => made
                    .into_iter()
                    .nth(k)
                    .and_then(|m| m.err())
                    .unwrap_or_else(empty),
                None => DataError::Ranks(format!(
                    "{}: another rank could not make its rows (its error says why)",
                    self.data.path.display()
                )),
            });
        }
        if flags[1..].iter().all(|&f| f == 0) {
            return Ok(Some(made.into_iter().flatten().collect()));
        }
        for (&i, _) in whole.iter().zip(&flags[1..]).filter(|(_, &f)| f > 0) {
            if self.skipped[i] {
                continue;
            }
            self.skipped[i] = true;
            self.skipped_count += 1;
            // The loader that met the error names it; the others follow silently.
            if let Some((_, e)) = seen.iter().find(|(j, _)| *j == i) {
                eprintln!(
                    "warning: {}:{}: sample skipped: {e}",
                    self.data.path.display(),
                    self.data.samples[i].line
                );
            }
        }
        self.check_usable()?;
        Ok(None)
    }

    /// An error once every sample is skipped (the stream would have nothing to give).
    fn check_usable(&self) -> Result<()> {
        if self.skipped_count == self.data.samples.len() {
            return Err(DataError::Config(format!(
                "{}: every sample was skipped (no image decodes)",
                self.data.path.display()
            )));
        }
        Ok(())
    }

    /// The next sample of `order` not skipped (it exists: not every sample is skipped).
    fn next_usable(&self, order: &mut Shuffler) -> Option<usize> {
        self.skip_marked(order);
        order.next()
    }

    /// Moves `order` past the skipped samples at its head.
    fn skip_marked(&self, order: &mut Shuffler) {
        while order.peek().is_some_and(|i| self.skipped[i]) {
            order.next();
        }
    }

    /// One sample per row.
    fn padded_rows(&self, order: &mut Shuffler) -> Result<Vec<Vec<usize>>> {
        (0..self.cfg.batch_size)
            .map(|_| self.next_usable(order).map(|i| vec![i]).ok_or_else(empty))
            .collect()
    }

    /// Fills each row in stream order: a sample that does not fit closes the row and starts
    /// the next one, so the stream position alone says where packing resumes.
    fn packed_rows(&self, order: &mut Shuffler) -> Result<Vec<Vec<usize>>> {
        let mut rows = Vec::with_capacity(self.cfg.batch_size);
        for _ in 0..self.cfg.batch_size {
            let mut row = Vec::new();
            let mut used = 0;
            loop {
                self.skip_marked(order);
                let i = order.peek().ok_or_else(empty)?;
                let len = self.data.samples[i].input_ids.len();
                if !row.is_empty() && used + len > self.cfg.max_len {
                    break;
                }
                order.next();
                row.push(i);
                used += len;
            }
            rows.push(row);
        }
        Ok(rows)
    }
}

fn empty() -> DataError {
    DataError::Config("empty dataset".into())
}
