//! The index cache's file: a read dataset ([`DataSet`] but its spec and path, which the
//! reader brings) in a compact binary form.
//!
//! ```text
//! header   magic "CANNONIX", format version u32, key [32], payload length u64,
//!          payload hash64 u64 (all little-endian)
//! payload  layout u8, the 8 stats, dropped lines, bad records, samples
//! sample   line, token count, ids, labels, images (path, height, width)
//! ```
//!
//! Integers are LEB128 varints: most ids and every image token take one to three bytes
//! instead of four. Labels are either the ids or IGNORE_INDEX token by token (the template
//! trains on answers, see `truncate::assemble`), so they are stored as the lengths of the
//! alternating ignored / trained runs; a sample whose labels are anything else keeps them
//! whole. The payload's hash is checked before anything is decoded, and decoding checks
//! every length against the bytes left, so a cut or damaged file is found, not trusted.

use super::super::dataset::{DataSet, DatasetStats, Prepared};
use super::super::hash::hash64;
use super::super::records::Layout;
use super::super::DataError;
use cannon_kernels::cross_entropy::IGNORE_INDEX;
use std::path::{Path, PathBuf};

/// The file's first bytes.
pub const MAGIC: &[u8; 8] = b"CANNONIX";
/// Bumped whenever the layout of the file changes.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 8 + 4 + 32 + 8 + 8;

/// What [`decode`] gives back: everything of a [`DataSet`] but its path and spec.
#[derive(Debug)]
pub struct Decoded {
    pub layout: Layout,
    pub samples: Vec<Prepared>,
    pub bad: Vec<DataError>,
    pub dropped: Vec<usize>,
    pub stats: DatasetStats,
}

/// The whole file for `ds` under `key`, or why it cannot be written (a path that is not
/// bytes this platform can write back, which only happens off Unix).
pub fn encode(ds: &DataSet, key: &[u8; 32]) -> Result<Vec<u8>, String> {
    let mut w = Writer(Vec::with_capacity(64 + ds.stats.tokens * 2));
    w.0.push(match ds.layout {
        Layout::Jsonl => 0,
        Layout::JsonArray => 1,
    });
    let st = &ds.stats;
    for v in [
        st.lines,
        st.samples,
        st.tokens,
        st.label_tokens,
        st.images,
        st.truncated,
        st.dropped_truncated,
        st.bad_lines,
    ] {
        w.uint(v as u64);
    }
    w.uint(ds.dropped.len() as u64);
    for &line in &ds.dropped {
        w.uint(line as u64);
    }
    w.uint(ds.bad.len() as u64);
    for e in &ds.bad {
        match e {
            DataError::BadLine { path, line, reason } => {
                w.0.push(0);
                w.path(path)?;
                w.uint(*line as u64);
                w.bytes(reason.as_bytes());
            }
            DataError::PlaceholderMismatch {
                sample,
                placeholders,
                images,
            } => {
                w.0.push(1);
                w.bytes(sample.as_bytes());
                w.uint(*placeholders as u64);
                w.uint(*images as u64);
            }
            other => {
                w.0.push(2);
                w.bytes(other.to_string().as_bytes());
            }
        }
    }
    w.uint(ds.samples.len() as u64);
    for p in &ds.samples {
        w.uint(p.line as u64);
        w.uint(p.input_ids.len() as u64);
        for &id in &p.input_ids {
            w.uint(id as u64);
        }
        w.labels(&p.input_ids, &p.labels);
        w.uint(p.images.len() as u64);
        for (path, &[h, wd]) in p.images.iter().zip(&p.image_sizes) {
            w.path(path)?;
            w.uint(h as u64);
            w.uint(wd as u64);
        }
    }
    let payload = w.0;
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&hash64(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Reads a whole file written by [`encode`] under `key`; any mismatch (magic, version, key,
/// length, hash, a value out of range) is the reason it is not used.
pub fn decode(file: &[u8], key: &[u8; 32]) -> Result<Decoded, String> {
    if file.len() < HEADER_LEN || &file[..8] != MAGIC {
        return Err("not an index file".into());
    }
    let version = u32::from_le_bytes([file[8], file[9], file[10], file[11]]);
    if version != FORMAT_VERSION {
        return Err(format!(
            "format version {version}, this build reads {FORMAT_VERSION}"
        ));
    }
    if &file[12..44] != key {
        return Err("made for other inputs (its key differs)".into());
    }
    let le64 = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&file[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let (len, hash) = (le64(44), le64(52));
    let payload = &file[HEADER_LEN..];
    if payload.len() as u64 != len {
        return Err(format!(
            "payload of {} bytes where the header says {len} (cut short?)",
            payload.len()
        ));
    }
    if hash64(payload) != hash {
        return Err("payload hash mismatch (damaged)".into());
    }
    let mut r = Reader { b: payload, at: 0 };
    let layout = match r.byte()? {
        0 => Layout::Jsonl,
        1 => Layout::JsonArray,
        b => return Err(format!("layout {b}")),
    };
    let mut v = [0usize; 8];
    for x in &mut v {
        *x = r.usize()?;
    }
    let stats = DatasetStats {
        lines: v[0],
        samples: v[1],
        tokens: v[2],
        label_tokens: v[3],
        images: v[4],
        truncated: v[5],
        dropped_truncated: v[6],
        bad_lines: v[7],
    };
    let n = r.count()?;
    let mut dropped = Vec::with_capacity(n);
    for _ in 0..n {
        dropped.push(r.usize()?);
    }
    let n = r.count()?;
    let mut bad = Vec::with_capacity(n);
    for _ in 0..n {
        bad.push(match r.byte()? {
            0 => DataError::BadLine {
                path: r.path()?,
                line: r.usize()?,
                reason: r.string()?,
            },
            1 => DataError::PlaceholderMismatch {
                sample: r.string()?,
                placeholders: r.usize()?,
                images: r.usize()?,
            },
            2 => DataError::Recorded(r.string()?),
            t => return Err(format!("bad record kind {t}")),
        });
    }
    let n = r.count()?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let line = r.usize()?;
        let len = r.count()?;
        let mut input_ids = Vec::with_capacity(len);
        for _ in 0..len {
            input_ids.push(u32::try_from(r.uint()?).map_err(|_| "token id out of range")?);
        }
        let labels = r.labels(&input_ids)?;
        let k = r.count()?;
        let (mut images, mut image_sizes) = (Vec::with_capacity(k), Vec::with_capacity(k));
        for _ in 0..k {
            images.push(r.path()?);
            image_sizes.push([r.u32()?, r.u32()?]);
        }
        samples.push(Prepared {
            line,
            input_ids,
            labels,
            images,
            image_sizes,
        });
    }
    if r.at != r.b.len() {
        return Err(format!("{} bytes left over", r.b.len() - r.at));
    }
    if samples.len() != stats.samples || bad.len() != stats.bad_lines {
        return Err("sample or bad-record counts disagree with the stats".into());
    }
    Ok(Decoded {
        layout,
        samples,
        bad,
        dropped,
        stats,
    })
}

struct Writer(Vec<u8>);

impl Writer {
    fn uint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    fn bytes(&mut self, b: &[u8]) {
        self.uint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn path(&mut self, p: &Path) -> Result<(), String> {
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            self.bytes(p.as_os_str().as_bytes());
            Ok(())
        }
        #[cfg(not(unix))]
        {
            let s = p
                .to_str()
                .ok_or_else(|| format!("{}: not a UTF-8 path", p.display()))?;
            self.bytes(s.as_bytes());
            Ok(())
        }
    }

    /// Kind 0: run lengths, alternately ignored and trained (equal to the id), starting with
    /// an ignored run (maybe empty). Kind 1: every label, zigzag-encoded.
    fn labels(&mut self, ids: &[u32], labels: &[i32]) {
        let masked = labels.len() == ids.len()
            && labels
                .iter()
                .zip(ids)
                .all(|(&l, &id)| l == IGNORE_INDEX || l as i64 == id as i64);
        if !masked {
            self.0.push(1);
            self.uint(labels.len() as u64);
            for &l in labels {
                self.uint(((l << 1) ^ (l >> 31)) as u32 as u64);
            }
            return;
        }
        self.0.push(0);
        let mut runs = Vec::new();
        let (mut trained, mut run) = (false, 0u64);
        for &l in labels {
            if (l != IGNORE_INDEX) != trained {
                runs.push(run);
                trained = !trained;
                run = 0;
            }
            run += 1;
        }
        runs.push(run);
        self.uint(runs.len() as u64);
        for r in runs {
            self.uint(r);
        }
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let v = *self.b.get(self.at).ok_or("cut short")?;
        self.at += 1;
        Ok(v)
    }

    fn uint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn usize(&mut self) -> Result<usize, String> {
        usize::try_from(self.uint()?).map_err(|_| "value out of range".to_string())
    }

    fn u32(&mut self) -> Result<u32, String> {
        u32::try_from(self.uint()?).map_err(|_| "value out of range".to_string())
    }

    /// A count of items of at least one byte each: never more than the bytes left, so a
    /// damaged count cannot ask for a huge allocation.
    fn count(&mut self) -> Result<usize, String> {
        let n = self.usize()?;
        if n > self.b.len() - self.at {
            return Err(format!(
                "a count of {n} with {} bytes left",
                self.b.len() - self.at
            ));
        }
        Ok(n)
    }

    fn raw(&mut self) -> Result<&[u8], String> {
        let n = self.count()?;
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn string(&mut self) -> Result<String, String> {
        String::from_utf8(self.raw()?.to_vec()).map_err(|_| "a message is not UTF-8".into())
    }

    fn path(&mut self) -> Result<PathBuf, String> {
        let raw = self.raw()?;
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStrExt;
            Ok(PathBuf::from(std::ffi::OsStr::from_bytes(raw)))
        }
        #[cfg(not(unix))]
        {
            std::str::from_utf8(raw)
                .map(PathBuf::from)
                .map_err(|_| "a path is not UTF-8".into())
        }
    }

    fn labels(&mut self, ids: &[u32]) -> Result<Vec<i32>, String> {
        match self.byte()? {
            0 => {
                let n = self.count()?;
                let mut labels = Vec::with_capacity(ids.len());
                let mut trained = false;
                for _ in 0..n {
                    let run = self.usize()?;
                    let from = labels.len();
                    let to = from
                        .checked_add(run)
                        .filter(|&t| t <= ids.len())
                        .ok_or("label runs longer than the sample")?;
                    if trained {
                        labels.extend(ids[from..to].iter().map(|&id| id as i32));
                    } else {
                        labels.resize(to, IGNORE_INDEX);
                    }
                    trained = !trained;
                }
                if labels.len() != ids.len() {
                    return Err("label runs shorter than the sample".into());
                }
                Ok(labels)
            }
            1 => {
                let n = self.count()?;
                let mut labels = Vec::with_capacity(n);
                for _ in 0..n {
                    let z = self.u32()?;
                    labels.push(((z >> 1) as i32) ^ -((z & 1) as i32));
                }
                Ok(labels)
            }
            k => Err(format!("label kind {k}")),
        }
    }
}
