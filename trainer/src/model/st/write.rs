//! Writing a safetensors file: the header first, then the data streamed behind it.

use super::format::{io, Result, StDtype, StError, TensorSpec};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};

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
                return Err(StError::Argument(format!(
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
        let mut w = StWriter {
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
        };
        // Leading empty tensors are complete before a byte is written: without this step the
        // first piece went to an empty tensor and was refused as an overrun.
        w.next_tensor();
        Ok(w)
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

    fn overrun(&self, n: usize) -> StError {
        let what = match self.specs.get(self.cur) {
            Some(s) => format!(
                "{n} elements written to {} which has {} left",
                s.name,
                s.numel() - self.cur_done
            ),
            None => format!("{n} elements written after the last tensor"),
        };
        StError::Shard {
            path: self.path.clone(),
            reason: what,
        }
    }

    /// The name of the tensor the next piece goes to (None when all are written).
    pub fn current(&self) -> Option<&str> {
        self.specs.get(self.cur).map(|s| s.name.as_str())
    }

    /// Checks that every tensor is complete, flushes and fsyncs; returns the file's size.
    pub fn finish(self) -> Result<u64> {
        if self.written != self.total {
            return Err(StError::Shard {
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
        let file = self.out.into_inner().map_err(|e| StError::Io {
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
