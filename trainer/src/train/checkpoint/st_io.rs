//! safetensors files written and read one tensor (or one piece of a tensor) at a time: the
//! format's dtypes and the writer here, the reader in [`super::st_read`].
//!
//! The `safetensors` crate serialises from, and parses into, one buffer holding the whole
//! file. A checkpoint shard or an exported shard can be many GiB, and a resharded load needs a
//! few ranges out of several files, so here the header is written first (every tensor's name,
//! dtype, shape and offsets are known up front) and the data streamed behind it, and a reader
//! parses only the header and then seeks to the bytes it wants. The layout is the standard one
//! (8-byte little-endian header length, JSON header padded with spaces to a multiple of 8,
//! then the data), so the `safetensors` crate, transformers and `Mistral3::load` read these
//! files, and the tests check that they do.

use super::error::{io, CheckpointError, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};

/// The element types written here: f32 (checkpoints, f32 exports) and bf16 (bf16 exports);
/// f16 too, which HF checkpoints may hold (read and widened like bf16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StDtype {
    F32,
    Bf16,
    F16,
}

impl StDtype {
    pub fn size(self) -> usize {
        match self {
            StDtype::F32 => 4,
            StDtype::Bf16 | StDtype::F16 => 2,
        }
    }

    /// The header's spelling.
    pub fn name(self) -> &'static str {
        match self {
            StDtype::F32 => "F32",
            StDtype::Bf16 => "BF16",
            StDtype::F16 => "F16",
        }
    }

    pub(super) fn parse(s: &str) -> Option<Self> {
        match s {
            "F32" => Some(StDtype::F32),
            "BF16" => Some(StDtype::Bf16),
            "F16" => Some(StDtype::F16),
            _ => None,
        }
    }
}

/// One tensor of a file being written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> u64 {
        (self.numel() * self.dtype.size()) as u64
    }
}

/// Headers larger than this are not safetensors headers (the crate's own limit is 100 MB).
pub(super) const MAX_HEADER: u64 = 100_000_000;

/// Writes a safetensors file: the header at creation, then the tensors' data in the order of
/// the specs, in pieces of any size that do not straddle two tensors.
pub struct StWriter {
    path: PathBuf,
    out: BufWriter<File>,
    specs: Vec<TensorSpec>,
    /// The tensor being written and how many of its elements are written.
    cur: usize,
    cur_done: usize,
    written: u64,
    total: u64,
    scratch: Vec<u8>,
    /// The file's size once complete (header and data).
    end: u64,
    /// False: sizes only (see [`StWriter::without_data`]).
    data: bool,
}

impl StWriter {
    /// Creates (truncates) `path` and writes the header for `specs` with `metadata`.
    pub fn create(
        path: &Path,
        specs: Vec<TensorSpec>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert(
                "__metadata__".into(),
                serde_json::to_value(metadata).unwrap_or_default(),
            );
        }
        let mut offset = 0u64;
        for s in &specs {
            if s.name == "__metadata__" || header.contains_key(&s.name) {
                return Err(CheckpointError::Argument(format!(
                    "{}: tensor name {} is reserved or repeated",
                    path.display(),
                    s.name
                )));
            }
            let end = offset + s.bytes();
            header.insert(
                s.name.clone(),
                serde_json::json!({"dtype": s.dtype.name(), "shape": s.shape, "data_offsets": [offset, end]}),
            );
            offset = end;
        }
        let mut text = serde_json::Value::Object(header).to_string().into_bytes();
        // Pad with spaces so the data starts 8-byte aligned, as the safetensors crate does.
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let end = 8 + text.len() as u64 + offset;
        let file = File::create(path).map_err(io(path))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&(text.len() as u64).to_le_bytes())
            .and_then(|()| out.write_all(&text))
            .map_err(io(path))?;
        Ok(StWriter {
            path: path.to_path_buf(),
            out,
            specs,
            cur: 0,
            cur_done: 0,
            written: 0,
            total: offset,
            scratch: Vec::new(),
            end,
            data: true,
        })
    }

    /// A writer of sizes only, for the meta device's values that do not exist: every piece
    /// is checked and its conversion buffer allocated as when writing, but no byte of data
    /// is written (the file is extended at [`Self::finish`] without being filled, so it is
    /// sparse: a 24B model's checkpoint measured this way takes its headers on disk).
    pub fn without_data(mut self) -> Self {
        self.data = false;
        self
    }

    /// Appends `data` to the tensor being written (converted to its dtype; bf16 rounds to
    /// nearest even, as torch does).
    pub fn write_f32(&mut self, data: &[f32]) -> Result<()> {
        let Some(spec) = self.specs.get(self.cur) else {
            return Err(self.overrun(data.len()));
        };
        let left = spec.numel() - self.cur_done;
        if data.len() > left {
            return Err(self.overrun(data.len()));
        }
        self.scratch.clear();
        if !self.data {
            let bytes = data.len() * spec.dtype.size();
            self.scratch.reserve_exact(bytes);
            self.out
                .seek(std::io::SeekFrom::Current(bytes as i64))
                .map_err(io(&self.path))?;
            self.written += bytes as u64;
            self.cur_done += data.len();
            self.next_tensor();
            return Ok(());
        }
        match spec.dtype {
            StDtype::F32 => {
                self.scratch.reserve_exact(data.len() * 4);
                for x in data {
                    self.scratch.extend_from_slice(&x.to_le_bytes());
                }
            }
            StDtype::Bf16 => {
                self.scratch.reserve_exact(data.len() * 2);
                for x in data {
                    let b = half::bf16::from_f32(*x).to_bits();
                    self.scratch.extend_from_slice(&b.to_le_bytes());
                }
            }
            StDtype::F16 => {
                self.scratch.reserve_exact(data.len() * 2);
                for x in data {
                    let b = half::f16::from_f32(*x).to_bits();
                    self.scratch.extend_from_slice(&b.to_le_bytes());
                }
            }
        }
        self.out.write_all(&self.scratch).map_err(io(&self.path))?;
        self.written += self.scratch.len() as u64;
        self.cur_done += data.len();
        self.next_tensor();
        Ok(())
    }

    /// Steps over the tensor being written (and any empty ones after it) once it is complete.
    fn next_tensor(&mut self) {
        while self
            .specs
            .get(self.cur)
            .is_some_and(|s| self.cur_done == s.numel())
        {
            self.cur += 1;
            self.cur_done = 0;
        }
    }

    fn overrun(&self, n: usize) -> CheckpointError {
        let what = match self.specs.get(self.cur) {
            Some(s) => format!(
                "{n} elements written to {} which has {} left",
                s.name,
                s.numel() - self.cur_done
            ),
            None => format!("{n} elements written after the last tensor"),
        };
        CheckpointError::Shard {
            path: self.path.clone(),
            reason: what,
        }
    }

    /// The name of the tensor the next piece goes to (None when all are written).
    pub fn current(&self) -> Option<&str> {
        self.specs.get(self.cur).map(|s| s.name.as_str())
    }

    /// Bytes of tensor data written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Checks that every tensor is complete, flushes and fsyncs; returns the file's size.
    pub fn finish(self) -> Result<u64> {
        if self.written != self.total {
            return Err(CheckpointError::Shard {
                path: self.path.clone(),
                reason: format!(
                    "{} of {} data bytes written (next tensor: {})",
                    self.written,
                    self.total,
                    self.current().unwrap_or("-")
                ),
            });
        }
        let path = self.path;
        let file = self.out.into_inner().map_err(|e| CheckpointError::Io {
            path: path.clone(),
            source: e.into_error(),
        })?;
        if !self.data {
            file.set_len(self.end).map_err(io(&path))?;
        }
        file.sync_all().map_err(io(&path))?;
        let len = file.metadata().map_err(io(&path))?.len();
        Ok(len)
    }
}
