//! Batches: (a) padded rows with an attention mask, (b) packed rows of several samples with
//! per-sample position_ids and cumulative sequence lengths for varlen attention.

use super::image::PixtralImage;
use super::template::IGNORE;

/// One tokenized sample with its processed images (in placeholder order).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub input_ids: Vec<u32>,
    pub labels: Vec<i32>,
    pub images: Vec<PixtralImage>,
}

/// Rows padded to a common length. Row-major [batch, seq_len] for the token tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct PaddedBatch {
    pub batch: usize,
    pub seq_len: usize,
    /// [batch, seq_len], pad id after each sample.
    pub input_ids: Vec<u32>,
    /// [batch, seq_len], IGNORE on prompts and padding.
    pub labels: Vec<i32>,
    /// [batch, seq_len], 1 on tokens, 0 on padding.
    pub attention_mask: Vec<u8>,
    /// [batch, seq_len], 0.. per row (0 on padding).
    pub position_ids: Vec<u32>,
    /// The images of all rows, in row order then placeholder order; each [3, H, W].
    pub pixel_values: Vec<PixtralImage>,
    /// (height, width) of each image.
    pub image_sizes: Vec<[u32; 2]>,
}

/// Pads samples to the longest, rounded up to a multiple of `multiple_of` (8 in LLaMA-Factory's
/// collator, which keeps the shapes few).
pub fn pad_batch(samples: &[Sample], pad_id: u32, multiple_of: usize) -> PaddedBatch {
    let longest = samples.iter().map(|s| s.input_ids.len()).max().unwrap_or(0);
    let m = multiple_of.max(1);
    let seq_len = longest.div_ceil(m) * m;
    let n = samples.len() * seq_len;
    let mut b = PaddedBatch {
        batch: samples.len(),
        seq_len,
        input_ids: Vec::with_capacity(n),
        labels: Vec::with_capacity(n),
        attention_mask: Vec::with_capacity(n),
        position_ids: Vec::with_capacity(n),
        pixel_values: Vec::new(),
        image_sizes: Vec::new(),
    };
    for s in samples {
        let (len, pad) = (s.input_ids.len(), seq_len - s.input_ids.len());
        b.input_ids.extend_from_slice(&s.input_ids);
        b.input_ids.extend(std::iter::repeat_n(pad_id, pad));
        b.labels.extend_from_slice(&s.labels);
        b.labels.extend(std::iter::repeat_n(IGNORE, pad));
        b.attention_mask.extend(std::iter::repeat_n(1u8, len));
        b.attention_mask.extend(std::iter::repeat_n(0u8, pad));
        b.position_ids.extend(0..len as u32);
        b.position_ids.extend(std::iter::repeat_n(0, pad));
        push_images(&mut b.pixel_values, &mut b.image_sizes, s);
    }
    b
}

fn push_images(pixels: &mut Vec<PixtralImage>, sizes: &mut Vec<[u32; 2]>, s: &Sample) {
    for im in &s.images {
        sizes.push([im.height, im.width]);
        pixels.push(im.clone());
    }
}

/// Rows each holding several whole samples back to back, padded to exactly `seq_len`.
#[derive(Debug, Clone, PartialEq)]
pub struct PackedBatch {
    pub batch: usize,
    pub seq_len: usize,
    /// [batch, seq_len]
    pub input_ids: Vec<u32>,
    /// [batch, seq_len]
    pub labels: Vec<i32>,
    /// [batch, seq_len]: 0.. restarting at each sample; 0 on padding.
    pub position_ids: Vec<u32>,
    /// Per row, [segments + 1] offsets within the row: 0, end of sample 1, ..., seq_len. The
    /// padding tail, when there is one, is a last segment of its own (labels IGNORE), so the
    /// offsets always cover the row as flash-attention's varlen interface expects.
    pub cu_seqlens: Vec<Vec<u32>>,
    /// Number of real samples in each row.
    pub samples_per_row: Vec<usize>,
    pub pixel_values: Vec<PixtralImage>,
    pub image_sizes: Vec<[u32; 2]>,
}

impl PackedBatch {
    pub fn new(seq_len: usize) -> Self {
        PackedBatch {
            batch: 0,
            seq_len,
            input_ids: Vec::new(),
            labels: Vec::new(),
            position_ids: Vec::new(),
            cu_seqlens: Vec::new(),
            samples_per_row: Vec::new(),
            pixel_values: Vec::new(),
            image_sizes: Vec::new(),
        }
    }

    /// Appends one row made of `samples` (their total length must be <= seq_len).
    pub fn push_row(&mut self, samples: &[Sample], pad_id: u32) {
        let mut cu = vec![0u32];
        let start = self.input_ids.len();
        for s in samples {
            self.input_ids.extend_from_slice(&s.input_ids);
            self.labels.extend_from_slice(&s.labels);
            self.position_ids.extend(0..s.input_ids.len() as u32);
            cu.push((self.input_ids.len() - start) as u32);
            push_images(&mut self.pixel_values, &mut self.image_sizes, s);
        }
        let used = self.input_ids.len() - start;
        debug_assert!(used <= self.seq_len, "packed row overflows");
        let pad = self.seq_len.saturating_sub(used);
        self.input_ids.extend(std::iter::repeat_n(pad_id, pad));
        self.labels.extend(std::iter::repeat_n(IGNORE, pad));
        self.position_ids.extend(std::iter::repeat_n(0, pad));
        if pad > 0 {
            cu.push(self.seq_len as u32);
        }
        self.cu_seqlens.push(cu);
        self.samples_per_row.push(samples.len());
        self.batch += 1;
    }
}
