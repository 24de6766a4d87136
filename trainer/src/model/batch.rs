//! The one training batch: what the train tier's data loader (`train::data::Loader`) produces and what
//! the model consumes ([`crate::model::Mistral3::forward`]), with no conversion in between.
//!
//! ```text
//! input_ids     [rows*seq] u32   row-major; padding = the tokenizer's pad id
//! labels        [rows*seq] i32   unshifted (label t is token t's target id); IGNORE_INDEX on
//!                                prompts and padding; the model shifts within each sequence
//! position_ids  [rows*seq] u32   0.. restarting at every packed sample and at the padding tail
//! cu_seqlens    [S]        usize cumulative ENDS of the S packed sequences over all rows (no
//!                                leading 0, the attention kernels' convention)
//! images        per image [C, h, w] f32 pixels back to back + (h, w): the vision tower turns
//!                                the sizes into its own per-image cu_seqlens before merging
//! ```
//!
//! A sequence starts at every row start and wherever `position_ids[t] != position_ids[t-1] + 1`
//! (transformers 5.x's rule for packed input, [`sequence_ends`]); `cu_seqlens`, when given,
//! must say the same, so the two can never disagree. Padding therefore gets positions
//! `0, 1, ...` of its own: it forms one last sequence per row that no real token attends to,
//! whereas positions that repeat (0, 0, ...) would split it into one-token sequences and
//! positions that continue the last sample would join the padding to it.

use cannon_kernels::cross_entropy::IGNORE_INDEX;
use std::borrow::Cow;
use std::ops::Range;

/// A batch whose parts disagree. Every variant says which part and by how much.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error(
        "input_ids ({ids}) and labels ({labels}) must both hold rows*seq = {rows}x{seq} > 0 tokens"
    )]
    Tokens {
        ids: usize,
        labels: usize,
        rows: usize,
        seq: usize,
    },
    #[error("position_ids hold {got} values for {tokens} tokens")]
    Positions { got: usize, tokens: usize },
    #[error(
        "cu_seqlens {given:?} disagree with the sequences the position ids start ({derived:?})"
    )]
    CuSeqlens {
        given: Vec<usize>,
        derived: Vec<usize>,
    },
    #[error("label {label} at token {index} is neither {IGNORE_INDEX} nor a token id")]
    Label { index: usize, label: i32 },
    #[error("image {index}: {reason}")]
    Image { index: usize, reason: String },
    #[error("pixel_values hold {got} values, the images' sizes need {want}")]
    Pixels { got: usize, want: usize },
    #[error("a packed row of {used} tokens overflows seq = {seq}")]
    RowOverflow { used: usize, seq: usize },
}

/// The images of a batch, in the order their `[IMG]` blocks appear in the tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Images {
    pub channels: usize,
    /// Each image's pixels `[C, h, w]` (channels first, no padding), back to back.
    pub pixel_values: Vec<f32>,
    /// `(height, width)` of each image in pixels.
    pub sizes: Vec<(usize, usize)>,
}

impl Images {
    pub fn new(channels: usize) -> Self {
        Images {
            channels,
            ..Images::default()
        }
    }

    pub fn len(&self) -> usize {
        self.sizes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sizes.is_empty()
    }

    /// Where image `i`'s pixels lie in [`Images::pixel_values`] (and in a pixel gradient).
    pub fn range(&self, i: usize) -> Range<usize> {
        let c = self.channels;
        let start: usize = self.sizes[..i].iter().map(|&(h, w)| c * h * w).sum();
        let (h, w) = self.sizes[i];
        start..start + c * h * w
    }

    /// Pixel values the sizes call for.
    pub fn expected_len(&self) -> usize {
        self.sizes.iter().map(|&(h, w)| self.channels * h * w).sum()
    }

    /// Appends one image of `pixels [C, h, w]`.
    pub fn push(&mut self, h: usize, w: usize, pixels: &[f32]) -> Result<(), BatchError> {
        let want = self.channels * h * w;
        if pixels.len() != want || want == 0 {
            return Err(BatchError::Image {
                index: self.len(),
                reason: format!(
                    "{} pixel values for a {}x{h}x{w} image (none may be empty)",
                    pixels.len(),
                    self.channels
                ),
            });
        }
        self.pixel_values.extend_from_slice(pixels);
        self.sizes.push((h, w));
        Ok(())
    }

    /// Crops images zero padded to `[N, C, H, W]` (transformers' `pixel_values`) to their
    /// `sizes`.
    pub fn from_padded(
        padded: &[f32],
        shape: [usize; 4],
        sizes: &[(usize, usize)],
    ) -> Result<Self, BatchError> {
        let [n, c, hp, wp] = shape;
        if n != sizes.len() || padded.len() != n * c * hp * wp {
            return Err(BatchError::Pixels {
                got: padded.len(),
                want: sizes.len() * c * hp * wp,
            });
        }
        let mut img = Images::new(c);
        for (i, &(h, w)) in sizes.iter().enumerate() {
            if h > hp || w > wp {
                return Err(BatchError::Image {
                    index: i,
                    reason: format!("size {h}x{w} does not fit the padded {hp}x{wp}"),
                });
            }
            let mut pixels = Vec::with_capacity(c * h * w);
            for ch in 0..c {
                for y in 0..h {
                    let row = ((i * c + ch) * hp + y) * wp;
                    pixels.extend_from_slice(&padded[row..row + w]);
                }
            }
            img.push(h, w, &pixels)?;
        }
        Ok(img)
    }

    /// `values` laid out like [`Images::pixel_values`] (the pixels, or their gradient), zero
    /// padded to `[N, C, Hmax, Wmax]` for comparison with transformers' tensors.
    pub fn to_padded(&self, values: &[f32]) -> Result<(Vec<f32>, [usize; 4]), BatchError> {
        if values.len() != self.expected_len() {
            return Err(BatchError::Pixels {
                got: values.len(),
                want: self.expected_len(),
            });
        }
        let c = self.channels;
        let hp = self.sizes.iter().map(|s| s.0).max().unwrap_or(0);
        let wp = self.sizes.iter().map(|s| s.1).max().unwrap_or(0);
        let mut out = vec![0.0; self.len() * c * hp * wp];
        for (i, &(h, w)) in self.sizes.iter().enumerate() {
            let src = &values[self.range(i)];
            for ch in 0..c {
                for y in 0..h {
                    let dst = ((i * c + ch) * hp + y) * wp;
                    let from = (ch * h + y) * w;
                    out[dst..dst + w].copy_from_slice(&src[from..from + w]);
                }
            }
        }
        Ok((out, [self.len(), c, hp, wp]))
    }

    /// `[IMG]` tokens the images stand for: one per `merge x merge` patches of `patch` pixels
    /// (floor, as the patch merger drops odd rows and columns).
    pub fn image_tokens(&self, patch: usize, merge: usize) -> usize {
        let (p, m) = (patch.max(1), merge.max(1));
        self.sizes
            .iter()
            .map(|&(h, w)| (h / p / m) * (w / p / m))
            .sum()
    }

    fn check(&self) -> Result<(), BatchError> {
        if let Some(i) = self.sizes.iter().position(|&(h, w)| h == 0 || w == 0) {
            return Err(BatchError::Image {
                index: i,
                reason: "empty image".into(),
            });
        }
        if self.pixel_values.len() != self.expected_len() {
            return Err(BatchError::Pixels {
                got: self.pixel_values.len(),
                want: self.expected_len(),
            });
        }
        Ok(())
    }
}

/// One training batch: `rows` rows of `seq` tokens and the images they refer to (see the
/// module docs for the layout).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub rows: usize,
    pub seq: usize,
    /// `[rows*seq]` token ids.
    pub input_ids: Vec<u32>,
    /// `[rows*seq]` target ids, [`IGNORE_INDEX`] where nothing is trained.
    pub labels: Vec<i32>,
    /// `[rows*seq]` position ids; empty means `0..seq` in every row.
    pub position_ids: Vec<u32>,
    /// Cumulative ends of the packed sequences over all rows; empty means derived from the
    /// position ids ([`sequence_ends`]), which they must equal when given.
    pub cu_seqlens: Vec<usize>,
    pub images: Images,
    /// Real samples in each row (metrics only; empty for a hand-made batch).
    pub samples_per_row: Vec<usize>,
}

impl Batch {
    pub fn tokens(&self) -> usize {
        self.rows * self.seq
    }

    /// The position ids, `0..seq` per row unless given.
    pub fn positions(&self) -> Cow<'_, [u32]> {
        if !self.position_ids.is_empty() {
            return Cow::Borrowed(&self.position_ids);
        }
        Cow::Owned((0..self.rows).flat_map(|_| 0..self.seq as u32).collect())
    }

    /// Ends of the packed sequences, as given or derived from the positions.
    pub fn sequence_ends(&self) -> Cow<'_, [usize]> {
        if !self.cu_seqlens.is_empty() {
            return Cow::Borrowed(&self.cu_seqlens);
        }
        Cow::Owned(sequence_ends(&self.positions(), self.seq))
    }

    /// Next-token targets: position t is trained on the label at t+1 when t+1 is in the same
    /// packed sequence, else ignored, as transformers' ForCausalLMLoss shifts each row.
    pub fn targets(&self) -> Vec<i32> {
        let mut out = vec![IGNORE_INDEX; self.labels.len()];
        let mut start = 0;
        for &end in self.sequence_ends().iter() {
            // Within [start, end): t predicts t+1; the sequence's last token predicts nothing.
            // (`get` keeps a batch whose lengths disagree from panicking; `check` rejects it.)
            let (Some(o), Some(l)) = (out.get_mut(start..end), self.labels.get(start + 1..)) else {
                break;
            };
            o.iter_mut()
                .zip(l)
                .take((end - start).saturating_sub(1))
                .for_each(|(o, &l)| *o = l);
            start = end;
        }
        out
    }

    /// Checks that the parts agree: token counts, positions, cu_seqlens, label values and
    /// image pixel counts. Vocabulary bounds and `[IMG]` counts need the model's config and are
    /// checked by the model.
    pub fn check(&self) -> Result<(), BatchError> {
        let n = self.tokens();
        if self.input_ids.len() != n || self.labels.len() != n || n == 0 {
            return Err(BatchError::Tokens {
                ids: self.input_ids.len(),
                labels: self.labels.len(),
                rows: self.rows,
                seq: self.seq,
            });
        }
        if !self.position_ids.is_empty() && self.position_ids.len() != n {
            return Err(BatchError::Positions {
                got: self.position_ids.len(),
                tokens: n,
            });
        }
        if !self.cu_seqlens.is_empty() {
            let derived = sequence_ends(&self.positions(), self.seq);
            if derived != self.cu_seqlens {
                return Err(BatchError::CuSeqlens {
                    given: self.cu_seqlens.clone(),
                    derived,
                });
            }
        }
        if let Some((index, &label)) = self
            .labels
            .iter()
            .enumerate()
            .find(|&(_, &l)| l != IGNORE_INDEX && l < 0)
        {
            return Err(BatchError::Label { index, label });
        }
        self.images.check()
    }
}

/// Cumulative ends of the packed sequences of rows of `seq` tokens with these position ids: a
/// sequence starts at every row start and wherever a position is not its predecessor's + 1.
pub fn sequence_ends(pos: &[u32], seq: usize) -> Vec<usize> {
    let mut ends = Vec::new();
    for t in 1..pos.len() {
        if t % seq.max(1) == 0 || pos[t] != pos[t - 1].wrapping_add(1) {
            ends.push(t);
        }
    }
    if !pos.is_empty() {
        ends.push(pos.len());
    }
    ends
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_images_round_trip() {
        let sizes = [(2, 3), (1, 1)];
        let padded: Vec<f32> = (0..2 * 2 * 2 * 3).map(|x| x as f32).collect();
        let img = Images::from_padded(&padded, [2, 2, 2, 3], &sizes).unwrap();
        assert_eq!(img.range(1), 12..14);
        assert_eq!(&img.pixel_values[12..], &[12.0, 18.0]);
        let (back, shape) = img.to_padded(&img.pixel_values).unwrap();
        assert_eq!(shape, [2, 2, 2, 3]);
        // Image 0 fills its padded box; image 1 keeps only its one pixel per channel.
        assert_eq!(&back[..12], &padded[..12]);
        assert_eq!(back[12], 12.0);
        assert_eq!(back[18], 18.0);
        assert_eq!(back.iter().filter(|&&x| x != 0.0).count(), 11 + 2);
        assert!(Images::from_padded(&padded, [2, 2, 2, 3], &[(3, 3), (1, 1)]).is_err());
        assert!(img.to_padded(&[0.0; 3]).is_err());
    }

    #[test]
    fn disagreeing_parts_are_errors() {
        let ok = Batch {
            rows: 1,
            seq: 4,
            input_ids: vec![1; 4],
            labels: vec![IGNORE_INDEX, 5, 6, IGNORE_INDEX],
            position_ids: vec![0, 1, 0, 1],
            cu_seqlens: vec![2, 4],
            ..Batch::default()
        };
        ok.check().unwrap();
        assert_eq!(ok.targets(), [5, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]);
        let bad = [
            Batch {
                labels: vec![0; 3],
                ..ok.clone()
            },
            Batch {
                position_ids: vec![0; 3],
                ..ok.clone()
            },
            Batch {
                cu_seqlens: vec![4],
                ..ok.clone()
            },
            Batch {
                labels: vec![0, -1, 0, 0],
                ..ok.clone()
            },
            Batch {
                images: Images {
                    channels: 3,
                    pixel_values: vec![0.0; 5],
                    sizes: vec![(1, 2)],
                },
                ..ok.clone()
            },
        ];
        for b in bad {
            assert!(b.check().is_err(), "{b:?}");
        }
    }
}
