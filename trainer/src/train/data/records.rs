//! A dataset file's records: the lines of a JSONL file, or the elements of one JSON array (the
//! `.json` files LLaMA-Factory and MindSpeed-MM ship, e.g. `mllm_demo.json`). The layout is told
//! by the first character that is not whitespace: `[` opens an array, anything else is JSONL.
//!
//! Each record carries the 1-based line it starts on, so a bad record is reported where an
//! editor shows it. A JSONL line that is not UTF-8 or not JSON is a bad record and the reading
//! goes on; an array that is not valid JSON as a whole cannot be split into records and is an
//! error of the file (serde_json names the line and column).

use super::{DataError, Result};
use serde_json::value::RawValue;
use serde_json::Value;
use std::path::Path;

/// How the file was laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Jsonl,
    JsonArray,
}

/// One record: where it is and its JSON, or why it is not JSON.
#[derive(Debug)]
pub struct Record {
    /// 1-based line the record starts on.
    pub line: usize,
    /// 1-based position among the records (array element, or non-blank JSONL line).
    pub index: usize,
    pub value: std::result::Result<Value, String>,
}

/// The layout of `raw`: a JSON array when its first non-whitespace byte (after a UTF-8 BOM) is
/// `[`.
pub fn layout(raw: &[u8]) -> Layout {
    let body = raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw);
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => Layout::JsonArray,
        _ => Layout::Jsonl,
    }
}

/// Hands each record of a file's bytes to `f`, in order (blank JSONL lines are skipped, not
/// records). Records are parsed one at a time, so a large file is never held as JSON values.
pub fn for_each(path: &Path, raw: &[u8], f: impl FnMut(Record)) -> Result<Layout> {
    let body = raw.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(raw);
    let l = layout(raw);
    match l {
        Layout::Jsonl => jsonl(body, f),
        Layout::JsonArray => array(path, body, f)?,
    }
    Ok(l)
}

fn jsonl(raw: &[u8], mut f: impl FnMut(Record)) {
    let mut index = 0;
    // Split bytes, not text: one line of invalid UTF-8 is a bad line, not a bad file.
    for (i, raw_line) in raw.split(|&b| b == b'\n').enumerate() {
        let value = match std::str::from_utf8(raw_line) {
            Err(e) => Err(format!("not UTF-8: {e}")),
            Ok(l) if l.trim().is_empty() => continue,
            Ok(l) => serde_json::from_str(l.trim_end_matches('\r'))
                .map_err(|e| format!("invalid JSON: {e}")),
        };
        index += 1;
        f(Record {
            line: i + 1,
            index,
            value,
        });
    }
}

fn array(path: &Path, raw: &[u8], mut f: impl FnMut(Record)) -> Result<()> {
    let json_err = |source| DataError::Json {
        path: path.to_path_buf(),
        source,
    };
    let text = std::str::from_utf8(raw).map_err(|e| DataError::BadLine {
        path: path.to_path_buf(),
        line: 1 + raw[..e.valid_up_to()]
            .iter()
            .filter(|&&b| b == b'\n')
            .count(),
        reason: format!("a JSON array file must be UTF-8: {e}"),
    })?;
    // Raw elements borrow the text, so each one's offset (hence its line) is known.
    let elems: Vec<&RawValue> = serde_json::from_str(text).map_err(json_err)?;
    let base = text.as_ptr() as usize;
    let (mut line, mut seen) = (1, 0);
    for (i, e) in elems.iter().enumerate() {
        let at = e.get().as_ptr() as usize - base;
        line += text.as_bytes()[seen..at]
            .iter()
            .filter(|&&b| b == b'\n')
            .count();
        seen = at;
        f(Record {
            line,
            index: i + 1,
            value: serde_json::from_str(e.get()).map_err(|e| format!("invalid JSON: {e}")),
        });
    }
    Ok(())
}
