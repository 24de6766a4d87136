//! Building the one [`Batch`] from samples: rows of whole samples back to back (one per row
//! when padding, several when packing), each row padded to the batch's length. Positions
//! restart at every sample and at the padding tail, and `cu_seqlens` lists the same sequences
//! (see [`crate::model::batch`] for why the padding is a sequence of its own).

use super::image::PixtralImage;
use crate::model::batch::{Batch, BatchError, Images};
use cannon_kernels::cross_entropy::IGNORE_INDEX;

/// Channels of a processed image (RGB).
pub const CHANNELS: usize = 3;

/// One tokenized sample with its processed images (in placeholder order).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub input_ids: Vec<u32>,
    pub labels: Vec<i32>,
    pub images: Vec<PixtralImage>,
}

/// Appends rows of whole samples to a batch of rows of `seq` tokens.
#[derive(Debug, Clone)]
pub struct RowBuilder {
    batch: Batch,
    pad_id: u32,
}

impl RowBuilder {
    pub fn new(seq: usize, pad_id: u32) -> Self {
        RowBuilder {
            batch: Batch {
                seq,
                images: Images::new(CHANNELS),
                ..Batch::default()
            },
            pad_id,
        }
    }

    /// Appends one row made of `samples`; their total length must be <= seq, and each one's
    /// ids and labels must be as long. On error the batch is left as it was.
    pub fn push_row(&mut self, samples: &[Sample]) -> Result<(), BatchError> {
        let seq = self.batch.seq;
        let used: usize = samples.iter().map(|s| s.input_ids.len()).sum();
        if used > seq {
            return Err(BatchError::RowOverflow { used, seq });
        }
        if let Some(s) = samples.iter().find(|s| s.labels.len() != s.input_ids.len()) {
            return Err(BatchError::Tokens {
                ids: s.input_ids.len(),
                labels: s.labels.len(),
                rows: 1,
                seq: s.input_ids.len(),
            });
        }
        // On a bad image the images pushed so far are cut off again: cloning the batch's images
        // to keep them intact copied every earlier row's pixels once per row (quadratic in the
        // rows; 8 % of a step of the built-in default).
        let images = &mut self.batch.images;
        let kept = (images.pixel_values.len(), images.sizes.len());
        for im in samples.iter().flat_map(|s| &s.images) {
            if let Err(e) = images.push(im.height as usize, im.width as usize, &im.pixels) {
                images.pixel_values.truncate(kept.0);
                images.sizes.truncate(kept.1);
                return Err(e);
            }
        }
        let b = &mut self.batch;
        let start = b.input_ids.len();
        for s in samples.iter().filter(|s| !s.input_ids.is_empty()) {
            b.input_ids.extend_from_slice(&s.input_ids);
            b.labels.extend_from_slice(&s.labels);
            b.position_ids.extend(0..s.input_ids.len() as u32);
            b.cu_seqlens.push(b.input_ids.len());
        }
        let pad = seq - used;
        if pad > 0 {
            b.input_ids.extend(std::iter::repeat_n(self.pad_id, pad));
            b.labels.extend(std::iter::repeat_n(IGNORE_INDEX, pad));
            b.position_ids.extend(0..pad as u32);
            b.cu_seqlens.push(start + seq);
        }
        b.samples_per_row.push(samples.len());
        b.rows += 1;
        Ok(())
    }

    /// Room for the pixel values of `samples` (a batch's images are known before its rows
    /// are pushed: one allocation instead of a doubling per growth).
    pub fn reserve_pixels(&mut self, samples: &[Sample]) {
        let n = samples
            .iter()
            .flat_map(|s| &s.images)
            .map(|im| im.pixels.len());
        self.batch.images.pixel_values.reserve(n.sum());
    }

    pub fn finish(self) -> Batch {
        self.batch
    }
}

/// One sample per row, padded to the longest rounded up to a multiple of `multiple_of` (8 in
/// LLaMA-Factory's collator, which keeps the shapes few).
pub fn pad_batch(samples: &[Sample], pad_id: u32, multiple_of: usize) -> Result<Batch, BatchError> {
    let longest = samples.iter().map(|s| s.input_ids.len()).max().unwrap_or(0);
    let m = multiple_of.max(1);
    let mut b = RowBuilder::new(longest.div_ceil(m) * m, pad_id);
    b.reserve_pixels(samples);
    for s in samples {
        b.push_row(std::slice::from_ref(s))?;
    }
    Ok(b.finish())
}
