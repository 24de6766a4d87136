//! safetensors files written and read one tensor (or one piece of a tensor) at a time: the
//! format's dtypes, tensor specs and errors ([`StDtype`], [`TensorSpec`], [`StError`]), the
//! writer [`StWriter`], the reader [`StReader`]. A file format, below the checkpoints that use
//! it.
//!
//! The `safetensors` crate serialises from, and parses into, one buffer holding the whole
//! file. A checkpoint shard or an exported shard can be many GiB, and a resharded load needs a
//! few ranges out of several files, so here the header is written first (every tensor's name,
//! dtype, shape and offsets are known up front) and the data streamed behind it, and a reader
//! parses only the header and then seeks to the bytes it wants. The layout is the standard one
//! (8-byte little-endian header length, JSON header padded with spaces to a multiple of 8,
//! then the data), so the `safetensors` crate, transformers and `Mistral3::load` read these
//! files, and the tests check that they do.

pub(crate) mod format;
pub(crate) mod read;
pub(crate) mod write;

pub use format::{StDtype, StError, TensorSpec};
pub use read::{StReader, READ_PIECE};
pub use write::StWriter;
