//! Token embedding: a row gather forward, a scatter-add backward.
//!
//! ```text
//! forward   out[t, :] = W[ids[t], :]
//! backward  dW[v, :] += sum_{t : ids[t] = v} dout[t, :]
//!
//! ids: [T] u32   W: [V, D]   out, dout: [T, D]   dW: [V, D] f32
//! ```
//!
//! The backward **accumulates** into dW (llm.c's convention) and is deterministic: each row of
//! dW is owned by one task, which adds its tokens' gradients in increasing t. An id >= V is an
//! [`KernelError::InvalidArgument`] naming the token, the id and the vocabulary size.

mod cpu;
pub mod device;
pub mod host;
pub(crate) mod npu;
#[cfg(test)]
mod tests;

use crate::error::{check_len, KernelError, Result};
use cannon_runtime::Float;

fn check_ids(op: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    match ids.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        Some((t, id)) => Err(KernelError::InvalidArgument {
            op,
            detail: format!("token {t} has id {id}, outside the vocabulary of {vocab}"),
        }),
        None => Ok(()),
    }
}

fn vocab_of(op: &'static str, len: usize, dim: usize) -> Result<usize> {
    if dim == 0 || !len.is_multiple_of(dim) {
        return Err(KernelError::Shape {
            op,
            detail: format!("table has {len} elements, not a multiple of the width {dim}"),
        });
    }
    Ok(len / dim)
}

/// The rules of [`embedding_forward`](host::embedding_forward) on every backend (the device-level entry point checks
/// them before any backend runs): a table `weight` of whole rows of `dim`, `out` of
/// `ids.len()` rows (lengths given) and every id inside the table. Gives the vocabulary.
pub(crate) fn check_forward(out: usize, ids: &[u32], weight: usize, dim: usize) -> Result<usize> {
    let op = "embedding_forward";
    let vocab = vocab_of(op, weight, dim)?;
    check_len(op, "out", out, ids.len() * dim)?;
    check_ids(op, ids, vocab)?;
    Ok(vocab)
}

/// The rules of [`embedding_backward`](host::embedding_backward) on every backend: a table `dweight` of whole rows of
/// `dim`, `dout` of `ids.len()` rows and every id inside the table. Gives the vocabulary.
pub(crate) fn check_backward(
    dweight: usize,
    dout: usize,
    ids: &[u32],
    dim: usize,
) -> Result<usize> {
    let op = "embedding_backward";
    let vocab = vocab_of(op, dweight, dim)?;
    check_len(op, "dout", dout, ids.len() * dim)?;
    check_ids(op, ids, vocab)?;
    Ok(vocab)
}
