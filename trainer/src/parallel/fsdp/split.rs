//! How a step's micro batches are dealt to the ranks: each micro batch's rows are cut into
//! `world` contiguous parts as even as the row count allows (`even_counts`), and rank r takes
//! part r of every micro batch. The global batch (every row of every micro batch) is the same
//! whatever the world size, so N ranks take the step one rank takes; with the loss divided by
//! the step's global target count, their summed gradients are the same up to f32 rounding.
//!
//! Rows carry their images: the images of a batch are in the order of their `[IMG]` blocks,
//! so a row's images are the next ones whose token counts add up to its `[IMG]` tokens.

use super::FsdpError;
use crate::model::batch::{Batch, Images};
use crate::model::Mistral3Config;
use cannon_runtime::comm::even_counts;
use std::ops::Range;

/// Rows `rows` of `batch` as a batch of their own: their tokens, labels, positions,
/// sequence ends, sample counts and the images their `[IMG]` tokens refer to.
pub fn split_rows(
    cfg: &Mistral3Config,
    batch: &Batch,
    rows: Range<usize>,
) -> Result<Batch, FsdpError> {
    let (s, n) = (batch.seq, batch.rows);
    if rows.start > rows.end || rows.end > n || batch.input_ids.len() != n * s {
        return Err(FsdpError::Invalid(format!(
            "rows {rows:?} of a batch of {n} rows x {s} tokens ({} ids)",
            batch.input_ids.len()
        )));
    }
    let toks = rows.start * s..rows.end * s;
    let (patch, merge) = (cfg.vision_config.patch_size, cfg.spatial_merge_size);
    let per_image = |i: usize| {
        let (h, w) = batch.images.sizes[i];
        (h / patch / merge) * (w / patch / merge)
    };
    // The images of the rows before ours, then ours.
    let img_tokens = |r: Range<usize>| {
        batch.input_ids[r.start * s..r.end * s]
            .iter()
            .filter(|&&t| t == cfg.image_token_index)
            .count()
    };
    let take = |mut from: usize, mut tokens: usize| -> Result<usize, FsdpError> {
        while tokens > 0 {
            if from >= batch.images.len() || per_image(from) > tokens {
                return Err(FsdpError::Invalid(format!(
                    "the [IMG] tokens of rows {rows:?} do not match the batch's images"
                )));
            }
            tokens -= per_image(from);
            from += 1;
        }
        Ok(from)
    };
    let first = take(0, img_tokens(0..rows.start))?;
    let last = take(first, img_tokens(rows.clone()))?;
    let mut images = Images::new(batch.images.channels);
    if last > first {
        let px = batch.images.range(first).start..batch.images.range(last - 1).end;
        images.pixel_values = batch.images.pixel_values[px].to_vec();
        images.sizes = batch.images.sizes[first..last].to_vec();
    }
    let slice = |v: &Vec<u32>| {
        if v.is_empty() {
            Vec::new()
        } else {
            v[toks.clone()].to_vec()
        }
    };
    // Sequences never cross a row start, so the ends inside our rows are ours.
    let cu_seqlens = batch
        .cu_seqlens
        .iter()
        .filter(|&&e| e > toks.start && e <= toks.end)
        .map(|&e| e - toks.start)
        .collect();
    let samples_per_row = if batch.samples_per_row.is_empty() {
        Vec::new()
    } else {
        batch.samples_per_row[rows.clone()].to_vec()
    };
    Ok(Batch {
        rows: rows.len(),
        seq: s,
        input_ids: batch.input_ids[toks.clone()].to_vec(),
        labels: batch.labels[toks.clone()].to_vec(),
        position_ids: slice(&batch.position_ids),
        cu_seqlens,
        images,
        samples_per_row,
    })
}

/// Rank `rank`'s part of every micro batch of a step (see the module docs); micro batches
/// of fewer rows than ranks leave some ranks without a part of them.
pub fn rank_share(
    cfg: &Mistral3Config,
    micro: &[Batch],
    rank: usize,
    world: usize,
) -> Result<Vec<Batch>, FsdpError> {
    let mut out = Vec::with_capacity(micro.len());
    for b in micro {
        let mine = rank_rows(b.rows, rank, world);
        if !mine.is_empty() {
            out.push(split_rows(cfg, b, mine)?);
        }
    }
    Ok(out)
}

/// Rank `rank`'s rows of a micro batch of `rows` rows (see the module docs): empty for a
/// rank past the rows, or past the world.
pub fn rank_rows(rows: usize, rank: usize, world: usize) -> Range<usize> {
    let counts = even_counts(rows, world);
    let start: usize = counts[..rank.min(world)].iter().sum();
    start..start + counts.get(rank).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Mistral3Config {
        Mistral3Config::from_json(
            r#"{"model_type": "mistral3", "image_token_index": 10, "spatial_merge_size": 2,
            "text_config": {"model_type": "mistral", "vocab_size": 64, "hidden_size": 8,
              "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
              "num_key_value_heads": 1, "head_dim": 8},
            "vision_config": {"model_type": "pixtral", "hidden_size": 8,
              "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 1,
              "head_dim": 8, "num_channels": 1, "patch_size": 2, "image_size": 8}}"#,
        )
        .unwrap()
    }

    /// Three rows: row 0 holds two images (4 and 1 tokens), row 1 none, row 2 one (1 token).
    fn batch() -> Batch {
        let s = 8;
        let mut ids = vec![1u32; 3 * s];
        for t in [1, 2, 3, 4, 6, 2 * s + 3] {
            ids[t] = 10;
        }
        let mut images = Images::new(1);
        for (k, (h, w)) in [(8, 8), (4, 4), (4, 4)].into_iter().enumerate() {
            let px: Vec<f32> = (0..h * w).map(|i| (k * 100 + i) as f32).collect();
            images.push(h, w, &px).unwrap();
        }
        let position_ids: Vec<u32> = (0..3).flat_map(|_| 0..s as u32).collect();
        Batch {
            rows: 3,
            seq: s,
            input_ids: ids,
            labels: (0..3 * s as i32).collect(),
            position_ids,
            cu_seqlens: vec![8, 16, 24],
            images,
            samples_per_row: vec![1, 0, 2],
        }
    }

    #[test]
    fn rows_keep_their_images_and_sequences() {
        let (c, b) = (cfg(), batch());
        b.check().unwrap();
        let first = split_rows(&c, &b, 0..1).unwrap();
        assert_eq!(first.images.sizes, vec![(8, 8), (4, 4)]);
        assert_eq!(first.images.pixel_values, b.images.pixel_values[..64 + 16]);
        let rest = split_rows(&c, &b, 1..3).unwrap();
        assert_eq!(rest.images.sizes, vec![(4, 4)]);
        assert_eq!(rest.images.pixel_values[0], 200.0);
        assert_eq!(rest.cu_seqlens, vec![8, 16]);
        assert_eq!(rest.labels[0], 8);
        assert_eq!(rest.samples_per_row, vec![0, 2]);
        for part in [&first, &rest] {
            part.check().unwrap();
        }
        let none = split_rows(&c, &b, 1..2).unwrap();
        assert!(none.images.is_empty());
        // Every rank's share together is the batch again.
        let shares: Vec<Vec<Batch>> = (0..2)
            .map(|r| rank_share(&c, std::slice::from_ref(&b), r, 2).unwrap())
            .collect();
        let ids: Vec<u32> = shares
            .iter()
            .flatten()
            .flat_map(|p| p.input_ids.clone())
            .collect();
        assert_eq!(ids, b.input_ids);
        assert_eq!(
            rank_share(&c, &[split_rows(&c, &b, 0..1).unwrap()], 1, 2).unwrap(),
            vec![]
        );
    }

    #[test]
    fn rows_whose_tokens_do_not_match_the_images_are_an_error() {
        let (c, mut b) = (cfg(), batch());
        b.images.sizes.pop();
        b.images.pixel_values.truncate(64 + 16);
        let e = split_rows(&c, &b, 2..3).unwrap_err().to_string();
        assert!(e.contains("rows 2..3"), "{e}");
        assert!(split_rows(&c, &batch(), 2..4).is_err());
    }
}
