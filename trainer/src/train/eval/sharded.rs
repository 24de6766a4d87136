//! The held-out evaluation on the ranks of a run, each on its shards and its own rows: the
//! end of `cannon train` and `cannon eval` on one rank or N. No process reads the model back
//! whole, and every row's forward runs once, on the rank that holds it (see `super::score`).

use super::score::{evaluate_chunks, greedy_ids, score_rows, Shared};
use super::{EvalError, EvalReport};
use crate::model::ActElem;
use crate::parallel::fsdp::{rank_rows, FsdpRank};
use crate::train::data::dataset::DataSet;
use crate::train::data::image::ImageConfig;
use crate::train::data::Tekken;
use cannon_kernels::Tensor;
use cannon_runtime::Stream;

/// Scores `data` (read with `tok`, images processed with `image_cfg`) in chunks of `rows`
/// samples on `rank` and its peers. Collective: every rank calls it with the same set; each
/// returns the same report.
pub fn evaluate_on<A: ActElem>(
    rank: &mut FsdpRank,
    data: &DataSet,
    tok: &Tekken,
    image_cfg: &ImageConfig,
    rows: usize,
) -> Result<EvalReport, EvalError> {
    let vocab = rank.cfg().text_config.vocab_size;
    let (r, world) = (rank.rank(), rank.world_size());
    let failed = |e: crate::parallel::fsdp::FsdpError| EvalError::Input(format!("rank {r}: {e}"));
    evaluate_chunks(data, tok, rows, |chunk| {
        let mine = rank_rows(chunk.len(), r, world);
        let forward = |b: Option<&crate::model::Batch>| {
            let read = |t: &Tensor<f32>, st: &Stream| greedy_ids(t, vocab, st);
            rank.forward_logits::<A, _>(b, read).map_err(failed)
        };
        let rows = &chunk[mine.clone()];
        let found = score_rows(rows, image_cfg, tok.pad_id(), &data.path, forward)?;
        if world == 1 {
            return Ok(found);
        }
        let shared = Shared::new(chunk);
        let mut values = shared.encode(mine.start, &found)?;
        rank.all_reduce_sum_i64(&mut values).map_err(failed)?;
        shared.decode(&values)
    })
}
