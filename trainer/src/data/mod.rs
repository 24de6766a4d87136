//! Data pipeline: Tekken tokenizer, Mistral template, Pixtral images, truncation filter,
//! padding and packing, resumable shuffling, and a synthetic shapes dataset.
//!
//! Flow: [`dataset::DataSet::read`] (JSONL -> checked, tokenized, truncated samples, bad lines
//! counted) -> [`loader::Loader`] (shuffled resumable order -> padded or packed batches with
//! processed images). The batches are [`crate::batch::Batch`], the model's own input.

pub mod batch;
pub mod dataset;
pub mod error;
pub mod image;
pub mod loader;
pub mod pretok;
pub mod shuffle;
pub mod synth;
pub mod tekken;
pub mod template;
pub mod truncate;

pub use crate::batch::Batch;
pub use error::{DataError, Result};
pub use loader::{DataConfig, Loader};
pub use shuffle::Position;
pub use tekken::Tekken;
