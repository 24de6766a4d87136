//! Data pipeline: Tekken tokenizer, Mistral template, Pixtral images, truncation filter,
//! padding and packing, resumable shuffling, and a synthetic shapes dataset.
//!
//! Flow: [`info::DatasetSpec::resolve`] (a file, or a name in a LLaMA-Factory
//! `dataset_info.json`) -> [`dataset::DataSet::open`] (JSONL or JSON array records -> schema ->
//! checked, tokenized, truncated samples, bad records counted; images checked by their headers)
//! through the index cache ([`index`]: what that reading produced, kept once per node) ->
//! [`loader::Loader`] (shuffled resumable order -> padded or packed batches with processed
//! images; a sample whose image no longer decodes is skipped and counted). The batches are
//! [`crate::model::batch::Batch`], the model's own input.

pub mod batch;
pub mod dataset;
pub(crate) mod error;
pub(crate) mod hash;
pub mod holdout;
pub mod image;
pub mod index;
pub mod info;
pub(crate) mod loader;
pub mod pretok;
pub mod records;
pub(crate) mod schema;
pub mod show;
pub mod shuffle;
pub mod synth;
pub(crate) mod tekken;
pub mod template;
pub mod truncate;

pub use crate::model::batch::Batch;
pub use error::{DataError, Result};
pub use info::DatasetSpec;
pub use loader::{DataConfig, Loader};
pub use shuffle::Position;
pub use tekken::Tekken;
