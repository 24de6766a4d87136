//! Reading a safetensors file a piece at a time: the header parsed and checked up front,
//! then positioned reads of only the bytes asked for, widened to f32 (the format is
//! [`super::format`], the writer [`super::write`]).

use super::format::{io, Result, StDtype, StError, MAX_HEADER};
use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::{Path, PathBuf};

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
        let bad = |reason: String| StError::Shard {
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
            // Checked: a header is file content, and a wrapped product or offset would read
            // other bytes (the header's own text) as the tensor.
            let numel = shape
                .iter()
                .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
                .filter(|&n| n <= MAX_NUMEL)
                .ok_or_else(|| {
                    bad(format!(
                        "{name}: shape {shape:?} holds more than {MAX_NUMEL} elements"
                    ))
                })?;
            let need = numel * dtype.size() as u64;
            if offsets.1 < offsets.0 || offsets.1 - offsets.0 != need {
                return Err(bad(format!(
                    "{name}: offsets {offsets:?} do not hold {numel} {} elements",
                    dtype.name()
                )));
            }
            let end = data_start.checked_add(offsets.1).filter(|&e| e <= file_len);
            let Some(end) = end else {
                return Err(bad(format!(
                    "{name} ends past byte {file_len}, the end of the file (truncated?)"
                )));
            };
            let bytes = data_start + offsets.0..end;
            tensors.insert(
                name,
                Entry {
                    dtype,
                    shape,
                    bytes,
                },
            );
        }
        check_disjoint(&tensors, data_start).map_err(bad)?;
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
            Some(e) if e.dtype != StDtype::F32 => Err(StError::Shard {
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
        let bad = |reason: String| StError::Shard {
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
}

/// No tensor of a file holds more elements (2^40: 4 TB of f32, far past any one weight).
pub const MAX_NUMEL: u64 = 1 << 40;

/// Two tensors may not share bytes: a file whose entries overlap was not written by a
/// safetensors writer, and reading it would give one tensor's bytes to another.
/// Spans are named as the header names them: offsets from the start of the data.
fn check_disjoint(
    tensors: &HashMap<String, Entry>,
    data_start: u64,
) -> std::result::Result<(), String> {
    let mut spans: Vec<(&Range<u64>, &str)> = tensors
        .iter()
        .filter(|(_, e)| !e.bytes.is_empty())
        .map(|(n, e)| (&e.bytes, n.as_str()))
        .collect();
    spans.sort_by_key(|(r, n)| (r.start, *n));
    for w in spans.windows(2) {
        let ((a, an), (b, bn)) = (w[0], w[1]);
        if b.start < a.end {
            return Err(format!(
                "tensors {an} and {bn} share data bytes {}..{}",
                b.start - data_start,
                a.end.min(b.end) - data_start
            ));
        }
    }
    Ok(())
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
    use crate::model::st::format::TensorSpec;
    use crate::model::st::write::StWriter;
    use std::collections::BTreeMap;

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
        let mut whole = vec![0.0; a.len()];
        r.read_f32_into("x.a", 0..a.len(), &mut whole).unwrap();
        assert_eq!(whole, a);
        let n = r.entry("b16").map_or(0, Entry::numel);
        let mut b16 = vec![0.0; n];
        assert!(
            r.read_f32_into("b16", 0..n, &mut b16).is_err(),
            "bf16 is not read as f32"
        );
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

    /// A file of `header` (JSON) and `data` bytes, as a writer would frame it.
    fn raw_file(name: &str, header: &str, data: &[u8]) -> PathBuf {
        let path = tmp(name);
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Headers whose sizes or offsets wrap 64 bits, or whose tensors share bytes, are errors
    /// naming the tensor: before, a wrapped offset read the header's own text as the weight.
    #[test]
    fn wrapping_overlapping_and_huge_entries_are_errors() {
        let wrap = u64::MAX - 31;
        let cases = [
            (
                "wrap.safetensors",
                format!(r#"{{"w":{{"dtype":"F32","shape":[4],"data_offsets":[{wrap},{}]}}}}"#, wrap + 16),
                "w ends past byte",
            ),
            (
                "shape.safetensors",
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#.to_string(),
                "holds more than",
            ),
            (
                "past-limit.safetensors",
                r#"{"w":{"dtype":"F32","shape":[2199023255552],"data_offsets":[0,0]}}"#.to_string(),
                "holds more than",
            ),
            (
                "overlap.safetensors",
                r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#.to_string(),
                "tensors a and b share data bytes 8..16",
            ),
        ];
        for (file, header, needle) in cases {
            let path = raw_file(file, &header, &[0u8; 16]);
            let err = StReader::open(&path).unwrap_err().to_string();
            assert!(err.contains(needle), "{file}: {err}");
        }
        // The same framing with sound entries opens: the cases fail for their fault only.
        let ok = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}"#;
        let r = StReader::open(&raw_file("ok.safetensors", ok, &[0u8; 16])).unwrap();
        assert_eq!(
            r.entry("b").map(|e| e.bytes.clone()),
            Some(8 + ok.len() as u64 + 8..8 + ok.len() as u64 + 16)
        );
    }
}
