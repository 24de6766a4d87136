//! TensorBoard event files, written and read without TensorFlow or a protobuf crate.
//!
//! `log.tensorboard = true` makes a run write its metrics as TensorBoard scalars under
//! `<log.dir>/tensorboard/`, so that `tensorboard --logdir` plots a run while it trains.
//! The format is small enough to write by hand, which keeps the trainer free of a protobuf
//! code generator and of TensorFlow's C library:
//!
//! ```text
//! file    record*                    events.out.tfevents.<unix secs>.<host>.<pid>.<n>
//! record  u64 LE length | u32 LE masked CRC32C(length) | data | u32 LE masked CRC32C(data)
//! data    Event { double wall_time = 1; int64 step = 2; string file_version = 3;
//!                 Summary summary = 5; SessionLog session_log = 7 }
//!         Summary { repeated Value value = 1 }   Value { string tag = 1; float simple_value = 2 }
//!         SessionLog { Status status = 1 }       (START = 1)
//! ```
//!
//! (TFRecord framing, as `tensorflow/core/lib/io/record_writer.cc` writes it; the messages
//! are `tensorflow/core/util/event.proto` and `framework/summary.proto`, only the fields
//! used here.) The first record carries `file_version = "brain.Event:2"`, then one
//! `SessionLog START` at the first step the file logs, then one event per
//! [`EventWriter::scalars`] call.
//!
//! The reader ([`read_events`], [`read_scalars`]) checks both CRCs of every record and decodes
//! what the writer writes; it is what the tests compare a run's `metrics.jsonl` with.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// The `file_version` of the first event: TensorBoard reads version 2 files' `SessionLog
/// START` as a restart (see [`EventWriter::start`]).
pub const FILE_VERSION: &str = "brain.Event:2";

/// `Event.session_log`'s field number (6 is the deprecated `log_message`).
const SESSION_LOG: u32 = 7;

/// The `SessionLog.status` value START.
const SESSION_START: u64 = 1;

/// How reading or writing an event file fails; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum TensorBoardError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A record whose CRC does not match, or whose data is not an event.
    #[error("{path}: the record at byte {offset}: {what}")]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// The file ends inside a record: what a writer stopped in the middle of one leaves.
    #[error(
        "{path}: the file ends inside its last record (at byte {offset}: {have} of its {need} \
         bytes), as a writer stopped while writing it leaves it; the {whole} record(s) before \
         it are whole"
    )]
    Truncated {
        path: PathBuf,
        offset: u64,
        have: u64,
        need: u64,
        whole: usize,
    },
}

// ---------------------------------------------------------------------------------------
// CRC32C (Castagnoli), the checksum of TFRecord framing.

/// The reflected Castagnoli polynomial (0x1EDC6F41 bit-reversed).
const CASTAGNOLI: u32 = 0x82F6_3B78;

/// One byte's CRC step, for each byte value: a table makes the checksum a lookup per byte
/// instead of eight shifts, and event records are small enough that slicing-by-8 would not
/// pay for its tables.
const CRC_TABLE: [u32; 256] = crc_table();

const fn crc_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ CASTAGNOLI
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

/// The CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c = CRC_TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

/// The CRC as TFRecord stores it: rotated and offset, because a CRC computed over data that
/// embeds CRCs is otherwise weak (TensorFlow's `crc32c::Mask`).
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// `data` framed as one TFRecord.
fn frame(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

// ---------------------------------------------------------------------------------------
// Protobuf encoding of the few messages written.

const VARINT: u32 = 0;
const FIXED64: u32 = 1;
const LEN: u32 = 2;
const FIXED32: u32 = 5;

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

fn put_key(buf: &mut Vec<u8>, field: u32, wire: u32) {
    put_varint(buf, u64::from(field << 3 | wire));
}

fn put_bytes(buf: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_key(buf, field, LEN);
    put_varint(buf, bytes.len() as u64);
    buf.extend_from_slice(bytes);
}

/// What an event carries besides its time and step.
enum Body<'a, S> {
    FileVersion(&'a str),
    SessionStart,
    Scalars(&'a [(S, f64)]),
}

/// An encoded `Event`. Protobuf's wire format lets fields come in any order; field number
/// order is what protobuf's own encoders write, so the bytes match theirs.
fn encode_event<S: AsRef<str>>(wall_time: f64, step: i64, body: Body<'_, S>) -> Vec<u8> {
    let mut ev = Vec::new();
    put_key(&mut ev, 1, FIXED64);
    ev.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        // proto3 leaves zero scalars out; a negative int64 is its ten-byte two's complement.
        put_key(&mut ev, 2, VARINT);
        put_varint(&mut ev, step as u64);
    }
    match body {
        Body::FileVersion(v) => put_bytes(&mut ev, 3, v.as_bytes()),
        Body::SessionStart => {
            let mut log = Vec::new();
            put_key(&mut log, 1, VARINT);
            put_varint(&mut log, SESSION_START);
            put_bytes(&mut ev, SESSION_LOG, &log);
        }
        Body::Scalars(values) => {
            let mut summary = Vec::new();
            for (tag, value) in values {
                let mut v = Vec::new();
                put_bytes(&mut v, 1, tag.as_ref().as_bytes());
                put_key(&mut v, 2, FIXED32);
                // `simple_value` is a float: what TensorBoard plots is the f32 of the metric.
                v.extend_from_slice(&(*value as f32).to_le_bytes());
                put_bytes(&mut summary, 1, &v);
            }
            put_bytes(&mut ev, 5, &summary);
        }
    }
    ev
}

// ---------------------------------------------------------------------------------------
// Writing.

/// Tells apart the files one process opens within the same second (TensorBoard's writers
/// end their file names with such a counter too).
static FILE_COUNTER: AtomicU32 = AtomicU32::new(0);

/// An open event file in a run's TensorBoard folder. Each record is handed to the kernel as it
/// is made (one `write` of the framed bytes, no buffer left in the process), so a killed run
/// keeps every record it wrote, whole.
#[derive(Debug)]
pub struct EventWriter {
    path: PathBuf,
    file: File,
}

impl EventWriter {
    /// Makes `dir` if needed and starts a new event file in it (never one that exists:
    /// TensorBoard merges every file of a folder into one run, so a resumed run adds its own).
    pub fn create(dir: &Path) -> Result<Self, TensorBoardError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| TensorBoardError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (host, pid) = (hostname(), std::process::id());
        loop {
            let n = FILE_COUNTER.fetch_add(1, Ordering::Relaxed);
            let path = dir.join(format!("events.out.tfevents.{secs:010}.{host}.{pid}.{n}"));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    let mut w = EventWriter { path, file };
                    w.record(encode_event::<&str>(
                        wall_time(),
                        0,
                        Body::FileVersion(FILE_VERSION),
                    ))?;
                    return Ok(w);
                }
                // Another writer of this process took the name in the same second.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io(&path)(e)),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Marks `step` as where this file's run starts. TensorBoard then drops the events of
    /// earlier files in the folder at `step` and after: the steps a killed run logged past its
    /// last checkpoint, which the resumed run logs again, or an older run's in a reused folder.
    pub fn start(&mut self, step: u64) -> Result<(), TensorBoardError> {
        self.record(encode_event::<&str>(
            wall_time(),
            step as i64,
            Body::SessionStart,
        ))
    }

    /// Writes `values` (tag, value) as the scalars of `step`, in one event (nothing for none).
    pub fn scalars<S: AsRef<str>>(
        &mut self,
        step: u64,
        values: &[(S, f64)],
    ) -> Result<(), TensorBoardError> {
        if values.is_empty() {
            return Ok(());
        }
        self.record(encode_event(
            wall_time(),
            step as i64,
            Body::Scalars(values),
        ))
    }

    fn record(&mut self, data: Vec<u8>) -> Result<(), TensorBoardError> {
        self.file
            .write_all(&frame(&data))
            .map_err(|source| TensorBoardError::Io {
                path: self.path.clone(),
                source,
            })
    }
}

/// Seconds since the Unix epoch, as events carry them.
fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// This machine's name, as TensorBoard's writers put it into file names (`localhost` when
/// it cannot be had); a `/` would make it a path, so it is replaced.
fn hostname() -> String {
    #[cfg(unix)]
    {
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer, which this
        // frame owns; it is read only up to the first NUL or its end.
        let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
        if rc == 0 {
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            let name = String::from_utf8_lossy(&buf[..end]).replace('/', "_");
            if !name.is_empty() {
                return name;
            }
        }
    }
    "localhost".to_string()
}

// ---------------------------------------------------------------------------------------
// Reading.

/// One event of a file, as far as this module knows its fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub what: EventData,
}

#[derive(Debug, Clone, PartialEq)]
pub enum EventData {
    /// The first event of a file.
    FileVersion(String),
    /// A `SessionLog START`: the run (re)starts at this step.
    SessionStart,
    /// The summary's values that carry a `simple_value` (tag, value); others are left out.
    Scalars(Vec<(String, f32)>),
    /// Anything else (another status of a session log, graphs, ...).
    Other,
}

/// One scalar of a file.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    pub value: f32,
    pub wall_time: f64,
}

/// Every event of the file at `path`, in file order, with both CRCs of every record checked.
pub fn read_events(path: &Path) -> Result<Vec<Event>, TensorBoardError> {
    let bytes = std::fs::read(path).map_err(|source| TensorBoardError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let corrupt = |offset: usize, what: String| TensorBoardError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        what,
    };
    let mut events = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        let truncated = |need: u64| TensorBoardError::Truncated {
            path: path.to_path_buf(),
            offset: at as u64,
            have: rest.len() as u64,
            need,
            whole: events.len(),
        };
        let (Some(len), Some(len_crc)) = (le_u64(rest, 0), le_u32(rest, 8)) else {
            return Err(truncated(12));
        };
        if masked_crc32c(&rest[..8]) != len_crc {
            return Err(corrupt(at, "the CRC of its length does not match".into()));
        }
        // The length is checked by its CRC, so a huge one is the file's real claim.
        let need = len.saturating_add(16);
        if need > rest.len() as u64 {
            return Err(truncated(need));
        }
        let data = &rest[12..12 + len as usize];
        let data_crc = le_u32(rest, 12 + len as usize).unwrap_or_default();
        if masked_crc32c(data) != data_crc {
            return Err(corrupt(at, "the CRC of its data does not match".into()));
        }
        events.push(decode_event(data).map_err(|what| corrupt(at, what))?);
        at += need as usize;
    }
    Ok(events)
}

/// The scalars of the file at `path` (see [`read_events`]), in file order.
pub fn read_scalars(path: &Path) -> Result<Vec<Scalar>, TensorBoardError> {
    let mut out = Vec::new();
    for ev in read_events(path)? {
        if let EventData::Scalars(values) = ev.what {
            out.extend(values.into_iter().map(|(tag, value)| Scalar {
                tag,
                step: ev.step,
                value,
                wall_time: ev.wall_time,
            }));
        }
    }
    Ok(out)
}

/// The event files of a TensorBoard folder, in the order TensorBoard reads them (by name,
/// which starts with the file's creation time).
pub fn event_files(dir: &Path) -> Result<Vec<PathBuf>, TensorBoardError> {
    let io = |source| TensorBoardError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        let is_events = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.contains("tfevents"));
        if is_events && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    let bytes = b.get(at..at.checked_add(8)?)?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    let bytes = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// A cursor over a protobuf message's bytes; errors say what was malformed.
struct Fields<'a> {
    buf: &'a [u8],
    at: usize,
}

/// A field's value, by wire type.
enum Value<'a> {
    Varint(u64),
    Fixed64(u64),
    Bytes(&'a [u8]),
    Fixed32(u32),
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Fields { buf, at: 0 }
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.at)
                .ok_or("a varint runs past the message's end")?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint longer than ten bytes".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(|| format!("a field of {n} bytes runs past the message's end"))?;
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }

    /// The next (field number, value), or None at the end.
    fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, String> {
        if self.at == self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let field = u32::try_from(key >> 3).map_err(|_| format!("a field number of {key}"))?;
        let value = match (key & 7) as u32 {
            VARINT => Value::Varint(self.varint()?),
            FIXED64 => Value::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().map_err(|_| "fixed64")?,
            )),
            LEN => {
                let n = usize::try_from(self.varint()?).map_err(|_| "a length past usize")?;
                Value::Bytes(self.take(n)?)
            }
            FIXED32 => Value::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().map_err(|_| "fixed32")?,
            )),
            w => return Err(format!("field {field} has wire type {w}")),
        };
        Ok(Some((field, value)))
    }
}

fn utf8(b: &[u8], what: &str) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
}

fn decode_event(data: &[u8]) -> Result<Event, String> {
    let (mut wall_time, mut step, mut what) = (0.0, 0i64, EventData::Other);
    let mut f = Fields::new(data);
    while let Some((field, value)) = f.next_field()? {
        match (field, value) {
            (1, Value::Fixed64(bits)) => wall_time = f64::from_bits(bits),
            (2, Value::Varint(v)) => step = v as i64,
            (3, Value::Bytes(b)) => what = EventData::FileVersion(utf8(b, "file_version")?),
            (5, Value::Bytes(b)) => what = EventData::Scalars(decode_summary(b)?),
            (SESSION_LOG, Value::Bytes(b)) => {
                let mut status = 0;
                let mut log = Fields::new(b);
                while let Some((field, value)) = log.next_field()? {
                    if let (1, Value::Varint(v)) = (field, value) {
                        status = v;
                    }
                }
                if status == SESSION_START {
                    what = EventData::SessionStart;
                }
            }
            (1 | 2 | 3 | 5 | SESSION_LOG, _) => {
                return Err(format!("event field {field} has the wrong wire type"))
            }
            _ => {}
        }
    }
    Ok(Event {
        wall_time,
        step,
        what,
    })
}

fn decode_summary(data: &[u8]) -> Result<Vec<(String, f32)>, String> {
    let mut values = Vec::new();
    let mut f = Fields::new(data);
    while let Some((field, value)) = f.next_field()? {
        let Value::Bytes(b) = value else { continue };
        if field != 1 {
            continue;
        }
        let (mut tag, mut simple) = (String::new(), None);
        let mut v = Fields::new(b);
        while let Some((field, value)) = v.next_field()? {
            match (field, value) {
                (1, Value::Bytes(t)) => tag = utf8(t, "a tag")?,
                (2, Value::Fixed32(bits)) => simple = Some(f32::from_bits(bits)),
                _ => {}
            }
        }
        if let Some(value) = simple {
            values.push((tag, value));
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("cannon-tensorboard-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        d
    }

    #[test]
    fn crc32c_matches_the_standard_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        // RFC 3720 (iSCSI), appendix B.4.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        let up: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(&up), 0x46DD_794E);
        let down: Vec<u8> = (0..32).rev().collect();
        assert_eq!(crc32c(&down), 0x113F_DB5C);
    }

    #[test]
    fn varints_are_protobufs() {
        let enc = |v: u64| {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            b
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(1), [1]);
        assert_eq!(enc(300), [0xac, 0x02]);
        assert_eq!(enc(-1i64 as u64).len(), 10);
        for v in [0, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            assert_eq!(Fields::new(&enc(v)).varint(), Ok(v));
        }
    }

    #[test]
    fn scalars_read_back_as_written() {
        let dir = scratch("round-trip");
        let mut w = EventWriter::create(&dir).unwrap();
        let name = w.path().file_name().unwrap().to_str().unwrap().to_string();
        // events.out.tfevents.<10-digit secs>.<host>.<pid>.<n>; the host may hold dots.
        let parts: Vec<&str> = name.split('.').collect();
        assert_eq!(parts[..3], ["events", "out", "tfevents"], "{name}");
        assert!(
            parts[3].len() == 10 && parts[3].parse::<u64>().is_ok(),
            "{name}"
        );
        assert_eq!(
            parts[parts.len() - 2],
            std::process::id().to_string(),
            "{name}"
        );
        assert!(parts[parts.len() - 1].parse::<u32>().is_ok(), "{name}");
        w.start(1).unwrap();
        w.scalars(1, &[("loss", 2.5), ("lr", 1e-3), ("eval/accuracy", 0.25)])
            .unwrap();
        w.scalars(2, &[("loss", f64::NAN), ("größe/ü", -7.0)])
            .unwrap();
        w.scalars(3_000_000_000, &[("loss", 1.0 / 3.0)]).unwrap();
        w.scalars::<&str>(4, &[]).unwrap();

        let events = read_events(w.path()).unwrap();
        assert_eq!(
            events[0].what,
            EventData::FileVersion(FILE_VERSION.to_string())
        );
        assert_eq!(
            (events[1].step, &events[1].what),
            (1, &EventData::SessionStart)
        );
        assert_eq!(events.len(), 5, "version, start and three scalar events");
        assert!(events.iter().all(|e| e.wall_time > 1.6e9));

        let s = read_scalars(w.path()).unwrap();
        let got: Vec<(&str, i64, f32)> = s.iter().map(|s| (&*s.tag, s.step, s.value)).collect();
        assert_eq!(
            got[..3],
            [
                ("loss", 1, 2.5),
                ("lr", 1, 1e-3),
                ("eval/accuracy", 1, 0.25)
            ]
        );
        assert!(got[3].0 == "loss" && got[3].1 == 2 && got[3].2.is_nan());
        assert_eq!(
            got[4..],
            [("größe/ü", 2, -7.0), ("loss", 3_000_000_000, 1.0 / 3.0)]
        );

        // A second writer in the folder gets a file of its own.
        let w2 = EventWriter::create(&dir).unwrap();
        assert_ne!(w2.path(), w.path());
        assert_eq!(event_files(&dir).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// An event as protobuf's Python encoder writes it (`event_pb2.Event(wall_time=1.5,
    /// step=7, summary=Summary(value=[Value(tag="loss", simple_value=0.5)]))
    /// .SerializeToString()`), framed as TensorFlow's record writer frames it.
    #[test]
    fn the_bytes_are_protobufs_and_tfrecords() {
        let ev = encode_event(1.5, 7, Body::Scalars(&[("loss", 0.5)]));
        let want = [
            0x09, 0, 0, 0, 0, 0, 0, 0xf8, 0x3f, 0x10, 0x07, 0x2a, 0x0d, 0x0a, 0x0b, 0x0a, 0x04,
            b'l', b'o', b's', b's', 0x15, 0, 0, 0, 0x3f,
        ];
        assert_eq!(ev, want);
        let framed = frame(&ev);
        assert_eq!(framed.len(), 12 + ev.len() + 4);
        assert_eq!(framed[..8], (ev.len() as u64).to_le_bytes());
        assert_eq!(framed[8..12], masked_crc32c(&framed[..8]).to_le_bytes());
        // As TensorBoard's Python reader computes it (`pywrap_tensorflow.masked_crc32c`).
        assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
        let v = encode_event::<&str>(1.5, 0, Body::FileVersion(FILE_VERSION));
        assert_eq!(v[9..], *b"\x1a\x0dbrain.Event:2");
        let start = encode_event::<&str>(2.0, 3, Body::SessionStart);
        assert_eq!(start, [9, 0, 0, 0, 0, 0, 0, 0, 64, 16, 3, 58, 2, 8, 1]);
    }

    fn two_records(name: &str) -> (PathBuf, Vec<u8>) {
        let dir = scratch(name);
        let mut w = EventWriter::create(&dir).unwrap();
        w.scalars(1, &[("loss", 1.0)]).unwrap();
        let path = w.path().to_path_buf();
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes)
    }

    #[test]
    fn a_changed_byte_is_found_and_named() {
        let (path, bytes) = two_records("corrupt");
        let first = 12 + le_u64(&bytes, 0).unwrap() as usize + 4;
        for (at, says) in [(first + 3, "of its length"), (first + 20, "of its data")] {
            let mut b = bytes.clone();
            b[at] ^= 0x10;
            std::fs::write(&path, &b).unwrap();
            let err = read_events(&path).unwrap_err();
            let msg = err.to_string();
            assert!(
                matches!(err, TensorBoardError::Corrupt { offset, .. } if offset == first as u64),
                "{msg}"
            );
            assert!(
                msg.contains(&path.display().to_string()) && msg.contains(says),
                "{msg}"
            );
            assert!(msg.contains(&format!("at byte {first}")), "{msg}");
        }
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
    }

    #[test]
    fn a_file_cut_inside_its_last_record_says_so() {
        let (path, bytes) = two_records("truncated");
        let first = 12 + le_u64(&bytes, 0).unwrap() as usize + 4;
        for cut in [first + 5, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let err = read_events(&path).unwrap_err();
            let msg = err.to_string();
            match err {
                TensorBoardError::Truncated {
                    offset,
                    have,
                    whole,
                    ..
                } => {
                    assert_eq!(
                        (offset, have, whole),
                        (first as u64, (cut - first) as u64, 1)
                    );
                }
                other => panic!("{other}"),
            }
            assert!(msg.contains("ends inside its last record"), "{msg}");
        }
        // Cut between records: the whole ones read.
        std::fs::write(&path, &bytes[..first]).unwrap();
        assert_eq!(read_events(&path).unwrap().len(), 1);
        std::fs::remove_dir_all(path.parent().unwrap()).ok();
    }
}
