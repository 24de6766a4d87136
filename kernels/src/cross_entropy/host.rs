//! The slice-level API of [`super`] on host memory: the CPU kernels themselves, each
//! checking the op's rules and running the code of `cpu.rs`. [`crate::ops`] runs these on
//! the buffers' host slices when the stream is on the CPU.

use super::*;

/// Loss over full logits `[N, V]`; when `d_logits` is given, writes the gradient there.
pub fn cross_entropy(
    logits: &[f32],
    labels: &[i32],
    vocab: usize,
    d_logits: Option<&mut [f32]>,
    norm: LossNorm,
) -> Result<CeStats> {
    let d_len = d_logits.as_ref().map(|d| d.len());
    let (count, div) = check_full("cross_entropy", labels, vocab, logits.len(), d_len, norm)?;
    let Some(div) = div else {
        if let Some(d) = d_logits {
            d.fill(0.0);
        }
        return Ok(CeStats {
            loss: 0.0,
            sum: 0.0,
            count,
        });
    };
    let mut losses = vec![0.0f64; labels.len()];
    cpu::rows(
        logits,
        d_logits,
        labels,
        &mut losses,
        vocab,
        (1.0 / div) as f32,
    );
    let sum = cpu::ordered_sum(&losses);
    Ok(CeStats {
        loss: sum / div,
        sum,
        count,
    })
}

/// As [`cross_entropy`] with the gradient, overwriting `logits` `[N, V]` with d_logits
/// (saves the second `[N, V]` buffer).
pub fn cross_entropy_in_place(
    logits: &mut [f32],
    labels: &[i32],
    vocab: usize,
    norm: LossNorm,
) -> Result<CeStats> {
    let op = "cross_entropy_in_place";
    let (count, div) = check_full(op, labels, vocab, logits.len(), None, norm)?;
    let Some(div) = div else {
        logits.fill(0.0);
        return Ok(CeStats {
            loss: 0.0,
            sum: 0.0,
            count,
        });
    };
    let mut losses = vec![0.0f64; labels.len()];
    cpu::rows_in_place(logits, labels, &mut losses, vocab, (1.0 / div) as f32);
    let sum = cpu::ordered_sum(&losses);
    Ok(CeStats {
        loss: sum / div,
        sum,
        count,
    })
}

/// Loss (and, with `with_grad`, its gradient handed to `producer.backward`) over `labels.len()`
/// rows whose logits `producer` makes `chunk_rows` rows at a time; at most `chunk_rows x V`
/// f32 are held. Blocks whose labels are all ignored are skipped entirely (they add nothing
/// to the loss and their gradient is zero), so the producer sees no call for them.
pub fn cross_entropy_chunked<P: ChunkedLogits>(
    producer: &mut P,
    labels: &[i32],
    vocab: usize,
    chunk_rows: usize,
    norm: LossNorm,
    with_grad: bool,
) -> std::result::Result<CeStats, P::Error> {
    let (count, div) = check_chunked(labels, vocab, chunk_rows, norm)?;
    let Some(div) = div else {
        return Ok(CeStats {
            loss: 0.0,
            sum: 0.0,
            count,
        });
    };
    let scale = (1.0 / div) as f32;
    let chunk_rows = chunk_rows.min(labels.len());
    let mut buf = vec![0.0f32; chunk_rows * vocab];
    let mut losses = vec![0.0f64; chunk_rows];
    let mut sum = 0.0f64;
    for r0 in (0..labels.len()).step_by(chunk_rows.max(1)) {
        let rows = r0..(r0 + chunk_rows).min(labels.len());
        let lab = &labels[rows.clone()];
        if lab.iter().all(|&l| l == IGNORE_INDEX) {
            continue;
        }
        let (buf, losses) = (&mut buf[..lab.len() * vocab], &mut losses[..lab.len()]);
        producer.logits(rows.clone(), buf)?;
        if with_grad {
            cpu::rows_in_place(buf, lab, losses, vocab, scale);
        } else {
            cpu::rows(buf, None, lab, losses, vocab, scale);
        }
        // Continue the same left-to-right f64 sum as the full path: identical results.
        sum = losses.iter().fold(sum, |s, &l| s + l);
        if with_grad {
            producer.backward(rows, buf)?;
        }
    }
    Ok(CeStats {
        loss: sum / div,
        sum,
        count,
    })
}
