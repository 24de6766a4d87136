//! safetensors files written and read one tensor (or one piece of a tensor) at a time.
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
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Read, Seek, Write};
use std::ops::Range;
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

    fn parse(s: &str) -> Option<Self> {
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
const MAX_HEADER: u64 = 100_000_000;

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

/// One tensor of a file being read: where its bytes are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    /// Byte range in the file.
    pub bytes: Range<u64>,
}

impl Entry {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A safetensors file opened for reading pieces of its tensors. Reads are positioned
/// (`pread`), so one reader serves several threads, and only the bytes asked for are read:
/// not a memory map, whose pages would count in the process's resident memory.
#[derive(Debug)]
pub struct StReader {
    path: PathBuf,
    file: File,
    tensors: HashMap<String, Entry>,
    /// Tensors of a dtype this reader cannot widen: name -> the header's dtype.
    unsupported: HashMap<String, String>,
    metadata: HashMap<String, String>,
    /// False: sizes only (see [`StReader::without_data`]).
    data: bool,
}

impl StReader {
    /// Reads and checks the header: every tensor must lie inside the file (a truncated file
    /// is an error here, not a short read later).
    pub fn open(path: &Path) -> Result<Self> {
        let bad = |reason: String| CheckpointError::Shard {
            path: path.to_path_buf(),
            reason,
        };
        let mut file = File::open(path).map_err(io(path))?;
        let file_len = file.metadata().map_err(io(path))?.len();
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|e| bad(format!("cannot read the header length: {e}")))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER || 8 + n > file_len {
            return Err(bad(format!(
                "header of {n} bytes in a file of {file_len} bytes"
            )));
        }
        let mut text = vec![0u8; n as usize];
        file.read_exact(&mut text).map_err(io(path))?;
        let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&text)
            .map_err(|e| bad(format!("header is not a JSON object: {e}")))?;
        let data_start = 8 + n;
        let mut tensors = HashMap::new();
        let mut unsupported = HashMap::new();
        let mut metadata = HashMap::new();
        for (name, v) in header {
            if name == "__metadata__" {
                metadata = serde_json::from_value(v)
                    .map_err(|e| bad(format!("__metadata__ is not a string map: {e}")))?;
                continue;
            }
            if let Some(d) = v.get("dtype").and_then(|d| d.as_str()) {
                if StDtype::parse(d).is_none() {
                    unsupported.insert(name, d.to_string());
                    continue;
                }
            }
            let (dtype, shape, offsets) =
                parse_entry(&v).ok_or_else(|| bad(format!("bad header entry for {name}")))?;
            let numel: usize = shape.iter().product();
            let need = (numel * dtype.size()) as u64;
            if offsets.1 < offsets.0 || offsets.1 - offsets.0 != need {
                return Err(bad(format!(
                    "{name}: offsets {offsets:?} do not hold {numel} {} elements",
                    dtype.name()
                )));
            }
            let bytes = data_start + offsets.0..data_start + offsets.1;
            if bytes.end > file_len {
                return Err(bad(format!(
                    "{name} ends at byte {} of a {file_len}-byte file (truncated?)",
                    bytes.end
                )));
            }
            tensors.insert(
                name,
                Entry {
                    dtype,
                    shape,
                    bytes,
                },
            );
        }
        Ok(StReader {
            path: path.to_path_buf(),
            file,
            tensors,
            unsupported,
            metadata,
            data: true,
        })
    }

    /// A reader of sizes only, for the meta device: every read is checked and its piece
    /// buffer allocated as when reading, but no byte is read and `dst` is left as it is.
    pub fn without_data(mut self) -> Self {
        self.data = false;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.tensors.get(name)
    }

    /// Every tensor's name, those of unsupported dtypes included.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors
            .keys()
            .chain(self.unsupported.keys())
            .map(String::as_str)
    }

    /// The header's dtype of tensor `name` when it is one this reader cannot widen.
    pub fn unsupported(&self, name: &str) -> Option<&str> {
        self.unsupported.get(name).map(String::as_str)
    }

    /// Elements `range` of the f32 tensor `name`, into `dst` (of the range's length).
    pub fn read_f32_into(&self, name: &str, range: Range<usize>, dst: &mut [f32]) -> Result<()> {
        match self.tensors.get(name) {
            Some(e) if e.dtype != StDtype::F32 => Err(CheckpointError::Shard {
                path: self.path.clone(),
                reason: format!("{name} is {}, not F32", e.dtype.name()),
            }),
            _ => self.read_widened(name, range, dst),
        }
    }

    /// Elements `range` of tensor `name` of any supported dtype, widened to f32 into `dst`
    /// (of the range's length). An f32 tensor's bytes are read straight into `dst` (on a
    /// little-endian host they are its values: no second copy through a buffer); other
    /// dtypes are read in pieces of at most [`READ_PIECE`] bytes and widened, so a range of
    /// any size costs no more than that beside `dst`.
    pub fn read_widened(&self, name: &str, range: Range<usize>, dst: &mut [f32]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        let bad = |reason: String| CheckpointError::Shard {
            path: self.path.clone(),
            reason,
        };
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| bad(format!("no tensor {name}")))?;
        if range.start > range.end || range.end > e.numel() || dst.len() != range.len() {
            return Err(bad(format!(
                "elements {range:?} of {name} ({} elements) into {} slots",
                e.numel(),
                dst.len()
            )));
        }
        let size = e.dtype.size();
        let per_piece = (READ_PIECE / size).max(1);
        if self.data && e.dtype == StDtype::F32 && cfg!(target_endian = "little") {
            let at = e.bytes.start + (size * range.start) as u64;
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
            return self.file.read_exact_at(bytes, at).map_err(io(&self.path));
        }
        // Sizes only (a meta rank) allocate the piece for every dtype: what a widened read
        // holds, the plan's bound for a load whatever the files' dtype.
        let mut raw = vec![0u8; size * per_piece.min(range.len())];
        if !self.data {
            return Ok(());
        }
        for (i, out) in dst.chunks_mut(per_piece).enumerate() {
            let at = e.bytes.start + (size * (range.start + i * per_piece)) as u64;
            let raw = &mut raw[..size * out.len()];
            self.file.read_exact_at(raw, at).map_err(io(&self.path))?;
            widen(e.dtype, raw, out);
        }
        Ok(())
    }

    /// The whole f32 tensor `name`.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let n = self.entry(name).map_or(0, Entry::numel);
        let mut v = vec![0.0; n];
        self.read_f32_into(name, 0..n, &mut v)?;
        Ok(v)
    }
}

/// The most bytes [`StReader::read_widened`] reads at once.
pub const READ_PIECE: usize = 16 << 20;

/// Little-endian `dtype` elements of `raw` widened into `dst` (as many as `dst` holds).
fn widen(dtype: StDtype, raw: &[u8], dst: &mut [f32]) {
    match dtype {
        StDtype::F32 => {
            for (d, b) in dst.iter_mut().zip(raw.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        StDtype::Bf16 => {
            for (d, b) in dst.iter_mut().zip(raw.chunks_exact(2)) {
                *d = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        StDtype::F16 => {
            for (d, b) in dst.iter_mut().zip(raw.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
    }
}

/// `{"dtype": "F32", "shape": [..], "data_offsets": [a, b]}`.
fn parse_entry(v: &serde_json::Value) -> Option<(StDtype, Vec<usize>, (u64, u64))> {
    let dtype = StDtype::parse(v.get("dtype")?.as_str()?)?;
    let shape = v
        .get("shape")?
        .as_array()?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<Vec<_>>>()?;
    let off = v.get("data_offsets")?.as_array()?;
    if off.len() != 2 {
        return None;
    }
    Some((dtype, shape, (off[0].as_u64()?, off[1].as_u64()?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cannon-st-io-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d.join(name)
    }

    /// What the writer streams is what the `safetensors` crate parses, bit for bit, and what
    /// the reader reads back in pieces.
    #[test]
    fn streamed_file_reads_back_with_the_crate_and_in_pieces() {
        let path = tmp("a.safetensors");
        let a: Vec<f32> = (0..10).map(|i| i as f32 * 0.37 - 1.0).collect();
        let b: Vec<f32> = vec![f32::MIN_POSITIVE, -0.0, 1e30, 3.5];
        let specs = vec![
            TensorSpec {
                name: "x.a".into(),
                dtype: StDtype::F32,
                shape: vec![2, 5],
            },
            TensorSpec {
                name: "empty".into(),
                dtype: StDtype::F32,
                shape: vec![0],
            },
            TensorSpec {
                name: "b16".into(),
                dtype: StDtype::Bf16,
                shape: vec![4],
            },
        ];
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let mut w = StWriter::create(&path, specs, &meta).unwrap();
        w.write_f32(&a[..3]).unwrap();
        w.write_f32(&a[3..]).unwrap();
        assert_eq!(w.current(), Some("b16"));
        w.write_f32(&b).unwrap();
        assert!(w.write_f32(&[1.0]).is_err());
        let size = w.finish().unwrap();

        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len() as u64, size);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let x = st.tensor("x.a").unwrap();
        assert_eq!(x.shape(), &[2, 5]);
        let back: Vec<f32> = x
            .data()
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(
            back.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        let h = st.tensor("b16").unwrap();
        assert_eq!(h.dtype(), safetensors::Dtype::BF16);
        let want: Vec<u8> = b
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes())
            .collect();
        assert_eq!(h.data(), want.as_slice());

        let r = StReader::open(&path).unwrap();
        assert_eq!(r.metadata().get("format").map(String::as_str), Some("pt"));
        let mut piece = vec![0.0; 4];
        r.read_f32_into("x.a", 4..8, &mut piece).unwrap();
        assert_eq!(piece, a[4..8]);
        assert_eq!(r.read_f32("x.a").unwrap(), a);
        assert!(r.read_f32("b16").is_err(), "bf16 is not read as f32");
        assert!(r.read_f32_into("x.a", 8..11, &mut [0.0; 3]).is_err());
    }

    #[test]
    fn unfinished_and_truncated_files_are_errors() {
        let path = tmp("b.safetensors");
        let specs = vec![TensorSpec {
            name: "w".into(),
            dtype: StDtype::F32,
            shape: vec![1000],
        }];
        let mut w = StWriter::create(&path, specs.clone(), &BTreeMap::new()).unwrap();
        w.write_f32(&[1.0; 10]).unwrap();
        let err = w.finish().unwrap_err().to_string();
        assert!(err.contains("40 of 4000 data bytes"), "{err}");

        let mut w = StWriter::create(&path, specs, &BTreeMap::new()).unwrap();
        w.write_f32(&[1.0; 1000]).unwrap();
        let size = w.finish().unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(size - 1).unwrap();
        let err = StReader::open(&path).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
    }
}
