//! The validation loss of a run: the mean next-token loss over the trained targets of a
//! held-out set, computed by the ranks on their shards during training (`train.eval_every`)
//! with no gradient and the weights untouched, so a run with validation trains exactly as
//! one without.
//!
//! ```text
//! chunk   train.eval_batch samples of the set, in file order
//! rank r  rows fsdp::rank_rows(n, r, world): images decoded, padded batch, forward with the
//!         run's loss mode (loss divided by 1) -> (summed loss, trained targets)
//! sum     both summed over the ranks (f64 gathered and added in rank order, targets as i64)
//! mean    sum of the chunks' losses / sum of their targets
//! ```
//!
//! The mean is over targets, as the training loss of a step is, so the two are on one scale.

use super::EvalError;
use crate::model::ActElem;
use crate::parallel::fsdp::{rank_rows, FsdpError, FsdpRank};
use crate::train::data::batch::pad_batch;
use crate::train::data::dataset::{load_each, DataSet, Prepared};
use crate::train::data::image::ImageConfig;
use crate::train::data::DataError;
use serde::Serialize;

/// What the validation found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ValidationLoss {
    /// Mean loss over the trained targets of the set (NaN when it has none).
    pub loss: f64,
    /// Trained targets it is the mean of (`eval_tokens` in the metrics).
    pub targets: usize,
    /// Samples scored.
    pub samples: usize,
    /// Samples left out because an image failed to decode.
    pub skipped: usize,
}

/// The validation loss of `data` (images processed with `image_cfg`, rows padded with
/// `pad_id`), `rows` samples per forward over the ranks together. Collective: every rank
/// calls it with the same set and gets the same figures.
pub fn validation_loss_on<A: ActElem>(
    rank: &mut FsdpRank,
    data: &DataSet,
    image_cfg: &ImageConfig,
    pad_id: u32,
    rows: usize,
) -> Result<ValidationLoss, EvalError> {
    if data.samples.is_empty() {
        return Err(EvalError::Input(format!(
            "{}: no usable held-out sample",
            data.path.display()
        )));
    }
    let (r, world) = (rank.rank(), rank.world_size());
    let failed = |e: FsdpError| EvalError::Input(format!("rank {r}: {e}"));
    let (mut sum, mut counts) = (0.0, [0i64; 3]);
    for chunk in data.samples.chunks(rows.max(1)) {
        let mine: Vec<&Prepared> = chunk[rank_rows(chunk.len(), r, world)].iter().collect();
        let mut samples = Vec::with_capacity(mine.len());
        let mut skipped = 0i64;
        for (p, made) in mine.iter().zip(load_each(&mine, image_cfg)) {
            match made {
                Ok(s) => samples.push(s),
                Err(e) if e.skippable_at_load() => {
                    eprintln!(
                        "warning: {}:{}: held-out sample skipped: {e}",
                        data.path.display(),
                        p.line
                    );
                    skipped += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        // No padding multiple: every row is as long as the longest sample, nothing more.
        let batch = match samples.is_empty() {
            true => None,
            false => Some(pad_batch(&samples, pad_id, 1).map_err(DataError::from)?),
        };
        let (s, t) = rank
            .forward_loss::<A>(batch.as_ref())
            .map_err(failed)?
            .unwrap_or((0.0, 0));
        sum += rank.all_reduce_scalar(s).map_err(failed)?;
        let mut c = [t as i64, samples.len() as i64, skipped];
        rank.all_reduce_sum_i64(&mut c).map_err(failed)?;
        for (a, b) in counts.iter_mut().zip(c) {
            *a += b;
        }
    }
    let [targets, samples, skipped] = counts.map(|c| c.max(0) as usize);
    Ok(ValidationLoss {
        loss: if targets > 0 {
            sum / targets as f64
        } else {
            f64::NAN
        },
        targets,
        samples,
        skipped,
    })
}
