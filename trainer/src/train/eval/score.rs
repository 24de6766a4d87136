//! Scoring held-out rows: each chunk of `train.eval_batch` samples is split over the ranks
//! that evaluate (one process: all of it), each rank runs the forward of its rows and reads
//! their greedy answers off the logits ([`score_rows`]); the ranks then exchange the answers as
//! token ids ([`Shared`]), so every rank holds the chunk's outcomes and the report is built
//! from them in file order ([`evaluate_chunks`]), the same report whatever the world size.
//!
//! ```text
//! chunk      rows 0..n of the set, in file order
//! rank r     rows fsdp::rank_rows(n, r, world): images decoded, padded batch, forward,
//!            argmax at every position (logits read in 16 MiB pieces) -> RowOutcome per row
//! exchange   per row [status, want ids (-1 padded), got ids (-1 padded)], the row's budget
//!            its prepared length; each rank fills its rows, zeros elsewhere; one sum
//! ```

use super::{argmax, Answer, EvalError, EvalReport, Kind, KindScore};
use crate::model::batch::Batch;
use crate::train::data::batch::pad_batch;
use crate::train::data::dataset::{load_each, DataSet, Prepared};
use crate::train::data::image::ImageConfig;
use crate::train::data::{DataError, Tekken};
use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::Stream;
use std::path::Path;

/// What the rank that ran a held-out row found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowOutcome {
    /// An image of the row failed to decode (a file cut after its header): left out, as in
    /// training.
    Skipped,
    /// The reference answer's tokens (every trained position's target), what greedy decoding
    /// wrote up to its first wrong token (that token included), and whether it was right.
    Scored {
        want: Vec<u32>,
        got: Vec<u32>,
        correct: bool,
    },
}

/// Bytes of logits copied to the host at a time to read their argmaxes: the logits of a batch
/// stay on the device (at 24B, 1 GiB a row of 2048 tokens over a vocabulary of 131072).
pub const GREEDY_PIECE: usize = 16 << 20;

/// The argmax of every position of `[positions, vocab]` logits on the device (the first on
/// ties, as torch.argmax; NaN never wins), read in pieces of at most [`GREEDY_PIECE`] bytes.
pub fn greedy_ids(
    logits: &Tensor<f32>,
    vocab: usize,
    st: &Stream,
) -> Result<Vec<u32>, KernelError> {
    let vocab = vocab.max(1);
    let positions = logits.numel() / vocab;
    let per_piece = (GREEDY_PIECE / (4 * vocab)).max(1);
    let mut piece = vec![0.0f32; per_piece.min(positions) * vocab];
    let mut ids = Vec::with_capacity(positions);
    for start in (0..positions).step_by(per_piece) {
        let end = (start + per_piece).min(positions);
        let host = &mut piece[..(end - start) * vocab];
        logits
            .view()
            .slice(start * vocab..end * vocab)?
            .memcpy_dtoh(st, host)?;
        ids.extend(host.chunks_exact(vocab).map(|x| argmax(x) as u32));
    }
    Ok(ids)
}

/// Loads `rows` (their images decoded with `image_cfg`), pads them into one batch and reads
/// each row's greedy answer off `forward`'s argmax at every position of the batch
/// (`[rows·seq]`, [`greedy_ids`] of the logits). `forward` is called
/// exactly once, with `None` when no row is left (every image skipped, or no row given): a
/// rank of a sharded evaluation still takes part in the chunk's collectives then. `path`
/// names the set in the warnings of skipped rows.
pub fn score_rows(
    rows: &[&Prepared],
    image_cfg: &ImageConfig,
    pad_id: u32,
    path: &Path,
    mut forward: impl FnMut(Option<&Batch>) -> Result<Option<Vec<u32>>, EvalError>,
) -> Result<Vec<RowOutcome>, EvalError> {
    let mut out = Vec::with_capacity(rows.len());
    let mut samples = Vec::with_capacity(rows.len());
    for (p, made) in rows.iter().zip(load_each(rows, image_cfg)) {
        match made {
            Ok(s) => {
                out.push(None);
                samples.push(s);
            }
            Err(e) if e.skippable_at_load() => {
                eprintln!(
                    "warning: {}:{}: held-out sample skipped: {e}",
                    path.display(),
                    p.line
                );
                out.push(Some(RowOutcome::Skipped));
            }
            Err(e) => return Err(e.into()),
        }
    }
    if samples.is_empty() {
        forward(None)?;
        return Ok(out
            .into_iter()
            .map(|o| o.unwrap_or(RowOutcome::Skipped))
            .collect());
    }
    // No padding multiple: every row is as long as the longest sample, nothing more.
    let batch: Batch = pad_batch(&samples, pad_id, 1).map_err(DataError::from)?;
    let ids = forward(Some(&batch))?.ok_or_else(|| {
        EvalError::Input("the forward of a held-out batch returned no logits".into())
    })?;
    if ids.len() != batch.rows * batch.seq {
        return Err(EvalError::Input(format!(
            "{} greedy tokens for {} rows of {} tokens",
            ids.len(),
            batch.rows,
            batch.seq
        )));
    }
    let targets = batch.targets();
    let mut scored = (0..batch.rows).map(|r| {
        let (mut want, mut got, mut correct) = (Vec::new(), Vec::new(), true);
        for t in (r * batch.seq..(r + 1) * batch.seq).filter(|&t| targets[t] != IGNORE_INDEX) {
            let arg = ids[t];
            want.push(targets[t] as u32);
            if correct {
                got.push(arg);
            }
            correct &= arg as i32 == targets[t];
        }
        RowOutcome::Scored { want, got, correct }
    });
    Ok(out
        .into_iter()
        .map(|o| o.or_else(|| scored.next()).unwrap_or(RowOutcome::Skipped))
        .collect())
}

/// Scores every sample of `data`, `rows` per chunk: `outcomes` gives the outcome of each
/// row of a chunk (in order), and the report is built from them with `tok`'s decoding.
pub fn evaluate_chunks(
    data: &DataSet,
    tok: &Tekken,
    rows: usize,
    mut outcomes: impl FnMut(&[&Prepared]) -> Result<Vec<RowOutcome>, EvalError>,
) -> Result<EvalReport, EvalError> {
    if data.samples.is_empty() {
        return Err(EvalError::Input(format!(
            "{}: no usable held-out sample",
            data.path.display()
        )));
    }
    let mut report = EvalReport::default();
    for chunk in data.samples.chunks(rows.max(1)) {
        let chunk: Vec<&Prepared> = chunk.iter().collect();
        let found = outcomes(&chunk)?;
        if found.len() != chunk.len() {
            return Err(EvalError::Input(format!(
                "{} outcomes for a chunk of {} held-out rows",
                found.len(),
                chunk.len()
            )));
        }
        for (p, o) in chunk.iter().zip(found) {
            let RowOutcome::Scored { want, got, correct } = o else {
                report.skipped += 1;
                continue;
            };
            let prompt: Vec<u32> = p
                .input_ids
                .iter()
                .zip(&p.labels)
                .filter(|&(_, &l)| l == IGNORE_INDEX)
                .map(|(&id, _)| id)
                .collect();
            report.samples += 1;
            report.correct += correct as usize;
            report.answers.push(Answer {
                line: p.line,
                kind: Kind::classify(&tok.decode(&prompt)?),
                expected: tok.decode(&want)?,
                got: tok.decode(&got)?,
                correct,
            });
        }
    }
    for kind in Kind::ALL {
        let of: Vec<&Answer> = report.answers.iter().filter(|a| a.kind == kind).collect();
        if of.is_empty() {
            continue;
        }
        let correct = of.iter().filter(|a| a.correct).count();
        report.per_kind.push(KindScore {
            kind,
            correct,
            total: of.len(),
            accuracy: correct as f64 / of.len() as f64,
            chance: kind.chance(),
            target: kind.target(),
        });
    }
    Ok(report)
}

/// A chunk's outcomes as one vector of integers that the ranks sum: each row has a slot of
/// `1 + 2·len` values (`len` its prepared token count, which bounds both answers), every rank
/// writes the rows it ran and leaves the others zero.
pub struct Shared {
    /// Start of each row's slot, and the end of the last.
    starts: Vec<usize>,
}

/// A row's status in its slot (0: no rank wrote it).
const SKIPPED: i64 = 1;
const WRONG: i64 = 2;
const CORRECT: i64 = 3;

impl Shared {
    pub fn new(chunk: &[&Prepared]) -> Self {
        let mut starts = vec![0];
        for p in chunk {
            starts.push(starts[starts.len() - 1] + 1 + 2 * p.input_ids.len());
        }
        Shared { starts }
    }

    /// The exchange vector with the outcomes of rows `first..first + mine.len()` written in.
    pub fn encode(&self, first: usize, mine: &[RowOutcome]) -> Result<Vec<i64>, EvalError> {
        let mut out = vec![0i64; self.starts[self.starts.len() - 1]];
        for (i, o) in mine.iter().enumerate() {
            let row = first + i;
            let (start, end) = match (self.starts.get(row), self.starts.get(row + 1)) {
                (Some(&s), Some(&e)) => (s, e),
                _ => {
                    return Err(EvalError::Input(format!(
                        "held-out row {row} of a chunk of {}",
                        self.starts.len() - 1
                    )))
                }
            };
            let slot = &mut out[start..end];
            let len = (slot.len() - 1) / 2;
            slot[1..].fill(-1);
            match o {
                RowOutcome::Skipped => slot[0] = SKIPPED,
                RowOutcome::Scored { want, got, correct } => {
                    if want.len() > len || got.len() > len {
                        return Err(EvalError::Input(format!(
                            "held-out row {row}: an answer of {} tokens in a row of {len}",
                            want.len()
                        )));
                    }
                    slot[0] = if *correct { CORRECT } else { WRONG };
                    for (d, &t) in slot[1..].iter_mut().zip(want) {
                        *d = i64::from(t);
                    }
                    for (d, &t) in slot[1 + len..].iter_mut().zip(got) {
                        *d = i64::from(t);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every row's outcome from the summed vector (each row written by exactly one rank).
    pub fn decode(&self, summed: &[i64]) -> Result<Vec<RowOutcome>, EvalError> {
        let rows = self.starts.len() - 1;
        if summed.len() != self.starts[rows] {
            return Err(EvalError::Input(format!(
                "{} exchanged values for held-out slots of {}",
                summed.len(),
                self.starts[rows]
            )));
        }
        let ids = |s: &[i64]| -> Vec<u32> {
            s.iter()
                .take_while(|&&t| t >= 0)
                .map(|&t| t as u32)
                .collect()
        };
        (0..rows)
            .map(|row| {
                let slot = &summed[self.starts[row]..self.starts[row + 1]];
                let len = (slot.len() - 1) / 2;
                match slot[0] {
                    SKIPPED => Ok(RowOutcome::Skipped),
                    WRONG | CORRECT => Ok(RowOutcome::Scored {
                        want: ids(&slot[1..1 + len]),
                        got: ids(&slot[1 + len..]),
                        correct: slot[0] == CORRECT,
                    }),
                    s => Err(EvalError::Input(format!(
                        "held-out row {row}: status {s} after the exchange (no rank or \
                         several ranks scored it)"
                    ))),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(len: usize) -> Prepared {
        Prepared {
            line: 1,
            input_ids: vec![5; len],
            labels: vec![IGNORE_INDEX; len],
            images: Vec::new(),
            image_sizes: Vec::new(),
        }
    }

    #[test]
    fn outcomes_written_by_different_ranks_sum_to_every_row() {
        let ps = [prepared(4), prepared(2), prepared(3)];
        let chunk: Vec<&Prepared> = ps.iter().collect();
        let shared = Shared::new(&chunk);
        let rows = vec![
            RowOutcome::Scored {
                want: vec![7, 8],
                got: vec![7, 9],
                correct: false,
            },
            RowOutcome::Skipped,
            RowOutcome::Scored {
                want: vec![0, 1, 2],
                got: vec![0, 1, 2],
                correct: true,
            },
        ];
        // Rank 0 ran row 0, rank 1 rows 1 and 2.
        let a = shared.encode(0, &rows[..1]).unwrap();
        let b = shared.encode(1, &rows[1..]).unwrap();
        let sum: Vec<i64> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(shared.decode(&sum).unwrap(), rows);
        // A row nobody ran, or one two ranks ran, is an error rather than a silent score.
        assert!(shared.decode(&a).is_err());
        let twice: Vec<i64> = a.iter().zip(&a).map(|(x, y)| x + y).collect();
        assert!(shared.decode(&twice).is_err());
    }

    #[test]
    fn an_answer_longer_than_its_row_is_refused() {
        let ps = [prepared(1)];
        let chunk: Vec<&Prepared> = ps.iter().collect();
        let long = RowOutcome::Scored {
            want: vec![1, 2],
            got: vec![1],
            correct: true,
        };
        assert!(Shared::new(&chunk).encode(0, &[long]).is_err());
    }
}
