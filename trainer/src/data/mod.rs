//! Data pipeline: Tekken tokenizer, Mistral template, Pixtral images, truncation filter,
//! padding and packing, resumable shuffling, and a synthetic shapes dataset.

pub mod error;
pub mod image;
pub mod pretok;
pub mod tekken;

pub use error::{DataError, Result};
pub use tekken::Tekken;
