//! Where a dataset is and how to read it: a file given directly, or a name looked up in a
//! LLaMA-Factory `dataset_info.json` in `dataset_dir` (as LLaMA-Factory's `dataset:` +
//! `dataset_dir:` and MindSpeed-MM's `basic_parameters` do).
//!
//! An entry gives `file_name` (relative to `dataset_dir`), `formatting` (`alpaca`, the default,
//! or `sharegpt`), `columns` and `tags`. As in LLaMA-Factory's `DatasetAttr.set_attr`, an entry
//! that has a `columns` (or `tags`) table takes only the keys it lists: the ones it leaves out
//! are unset, not defaulted (so `tags` without `system_tag` accepts no system message). Hub and
//! script entries (`hf_hub_url`, `ms_hub_url`, `script_url`) and preference data (`ranking`)
//! are errors naming the entry; other keys (`file_sha1`, `subset`, ...) are ignored.

use super::schema::{Columns, Formatting, Mapped, Schema, Tags};
use super::{DataError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// The file LLaMA-Factory reads in `dataset_dir`.
pub const DATASET_INFO: &str = "dataset_info.json";

/// A dataset to read: its file, the folder relative image paths start from, and its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetSpec {
    /// The entry's name when it came from a `dataset_info.json`.
    pub name: Option<String>,
    /// JSON array or JSONL file.
    pub file: PathBuf,
    /// Relative image paths are joined to this (`dataset_dir`, or the file's folder).
    pub media_dir: PathBuf,
    pub schema: Schema,
}

impl DatasetSpec {
    /// A file read with the guessed schema, images relative to its folder.
    pub fn file(path: &Path) -> Self {
        DatasetSpec {
            name: None,
            file: path.to_path_buf(),
            media_dir: parent(path),
            schema: Schema::Auto,
        }
    }

    /// Resolves `dataset` as LLaMA-Factory would: with a `dataset_dir` that holds a
    /// `dataset_info.json` naming `dataset`, that entry; otherwise `dataset` is a file (as given,
    /// or inside `dataset_dir`) read with the guessed schema, images relative to `dataset_dir`
    /// (or, without one, the file's folder).
    pub fn resolve(dataset: &Path, dataset_dir: Option<&Path>) -> Result<Self> {
        let Some(dir) = dataset_dir else {
            return Ok(Self::file(dataset));
        };
        if !dir.is_dir() {
            return Err(DataError::Config(format!(
                "dataset_dir {} is not a folder",
                dir.display()
            )));
        }
        let info_path = dir.join(DATASET_INFO);
        let info = if info_path.is_file() {
            Some(read_info(&info_path)?)
        } else {
            None
        };
        if let (Some(info), Some(name)) = (&info, dataset.to_str()) {
            if let Some(entry) = info.get(name) {
                return from_entry(&info_path, dir, name, entry);
            }
        }
        let file = [dataset.to_path_buf(), dir.join(dataset)]
            .into_iter()
            .find(|p| p.is_file());
        match file {
            Some(file) => Ok(DatasetSpec {
                name: None,
                file,
                media_dir: dir.to_path_buf(),
                schema: Schema::Auto,
            }),
            None => {
                let names = match &info {
                    Some(info) => {
                        let mut n: Vec<&str> = info.keys().map(String::as_str).collect();
                        n.sort_unstable();
                        format!(
                            "not an entry of {} (entries: {})",
                            info_path.display(),
                            n.join(", ")
                        )
                    }
                    None => format!("no {} to look it up in", info_path.display()),
                };
                Err(DataError::Config(format!(
                    "dataset `{}`: no such file (looked at {} and {}) and {names}",
                    dataset.display(),
                    dataset.display(),
                    dir.join(dataset).display()
                )))
            }
        }
    }

    /// Where a path written in a record points: absolute paths as they are; relative ones
    /// joined to `media_dir`, or (as LLaMA-Factory's `_find_medias` does) taken as given when
    /// that file does not exist but the path as given does.
    pub fn image_path(&self, rel: &str) -> PathBuf {
        let joined = self.media_dir.join(rel);
        if !joined.exists() && Path::new(rel).is_file() {
            return PathBuf::from(rel);
        }
        joined
    }
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn read_info(path: &Path) -> Result<Map<String, Value>> {
    let raw = crate::bounded::read_capped(path, crate::bounded::MAX_SMALL_FILE)
        .map_err(|e| DataError::io(path, e))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|source| DataError::Json {
        path: path.to_path_buf(),
        source,
    })?;
    match v {
        Value::Object(m) => Ok(m),
        _ => Err(DataError::Config(format!(
            "{}: must be an object of named dataset entries",
            path.display()
        ))),
    }
}

fn from_entry(info_path: &Path, dir: &Path, name: &str, entry: &Value) -> Result<DatasetSpec> {
    let bad =
        |why: String| DataError::Config(format!("{} entry `{name}`: {why}", info_path.display()));
    let e = entry
        .as_object()
        .ok_or_else(|| bad("must be an object".into()))?;
    for hub in ["hf_hub_url", "ms_hub_url", "script_url", "cloud_file_name"] {
        if e.contains_key(hub) {
            return Err(bad(format!(
                "`{hub}` datasets are downloaded or scripted, which this trainer does not do: \
                 give a local `file_name`"
            )));
        }
    }
    if e.get("ranking").and_then(Value::as_bool) == Some(true) {
        return Err(bad(
            "preference (`ranking`) datasets are not supported".into()
        ));
    }
    let file_name = match e.get("file_name") {
        Some(Value::String(s)) => s,
        _ => return Err(bad("no `file_name` string".into())),
    };
    let file = dir.join(file_name);
    if file.is_dir() {
        return Err(bad(format!(
            "`file_name` {} is a folder; name one JSON or JSONL file",
            file.display()
        )));
    }
    let formatting = match e.get("formatting") {
        None | Some(Value::Null) => Formatting::Alpaca,
        Some(Value::String(s)) if s == "alpaca" => Formatting::Alpaca,
        Some(Value::String(s)) if s == "sharegpt" => Formatting::Sharegpt,
        Some(other) => {
            return Err(bad(format!(
                "`formatting` must be \"alpaca\" or \"sharegpt\", found {other}"
            )))
        }
    };
    let table = |key: &str| -> Result<Option<&Map<String, Value>>> {
        match e.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(_) => Err(bad(format!("`{key}` must be an object"))),
        }
    };
    // LLaMA-Factory's set_attr: a listed table sets every key, missing ones to None.
    let get = |t: &Map<String, Value>, table: &str, key: &str| -> Result<Option<String>> {
        match t.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(bad(format!("`{table}.{key}` must be a string"))),
        }
    };
    let mut columns = Columns::default();
    if let Some(t) = table("columns")? {
        columns = Columns {
            messages: get(t, "columns", "messages")?,
            images: get(t, "columns", "images")?,
            system: get(t, "columns", "system")?,
            prompt: get(t, "columns", "prompt")?,
            query: get(t, "columns", "query")?,
            response: get(t, "columns", "response")?,
            history: get(t, "columns", "history")?,
        };
    }
    if formatting == Formatting::Sharegpt && columns.messages.is_none() {
        return Err(bad(
            "`columns` lists no `messages` column (a sharegpt dataset needs one)".into(),
        ));
    }
    let mut tags = Tags::default();
    if let Some(t) = table("tags")? {
        tags = Tags {
            role_tag: get(t, "tags", "role_tag")?,
            content_tag: get(t, "tags", "content_tag")?,
            user_tag: get(t, "tags", "user_tag")?,
            assistant_tag: get(t, "tags", "assistant_tag")?,
            system_tag: get(t, "tags", "system_tag")?,
            observation_tag: get(t, "tags", "observation_tag")?,
            function_tag: get(t, "tags", "function_tag")?,
        };
        if formatting == Formatting::Sharegpt {
            for (key, v) in [
                ("role_tag", &tags.role_tag),
                ("content_tag", &tags.content_tag),
            ] {
                if v.is_none() {
                    return Err(bad(format!("`tags` lists no `{key}`")));
                }
            }
        }
    }
    Ok(DatasetSpec {
        name: Some(name.to_string()),
        file,
        media_dir: dir.to_path_buf(),
        schema: Schema::Mapped(Box::new(Mapped {
            formatting,
            columns,
            tags,
        })),
    })
}
