//! `cannon export`: a checkpoint's weights consolidated into a Hugging Face checkpoint
//! (`config.json` + `model.safetensors`, or shards + `model.safetensors.index.json`) that
//! transformers' `Mistral3ForConditionalGeneration.from_pretrained` loads.
//!
//! Tensor names are transformers 5.x names (`model.language_model.*`, `model.vision_tower.*`,
//! `model.multi_modal_projector.*`, `lm_head.weight`), the names the 5.x model's state dict
//! has and that 4.x (>= 4.52, which reads both spellings) loads too; every parameter of the
//! model is written, frozen parts (vision tower, projector) included: a checkpoint stores
//! them unchanged from the weights the run started from (or its random init). Shards are cut
//! as transformers' `save_pretrained` cuts them: tensors in order, a new file when the next
//! tensor would push the current one past `max_shard_size`.

use super::error::{io, CheckpointError, Result};
use super::hf_config::export_config;
use super::load::Checkpoint;
use crate::durable::{rename_synced, sync_dir, unique_sibling, write_synced};
use crate::model::st::{StDtype, StWriter, TensorSpec};
use crate::model::{ParamLayout, Precision};
use crate::parallel::fsdp::Kind;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The small file every export writes, by which `--force` knows an earlier export (the only
/// kind of folder it replaces).
pub const EXPORT_MARKER: &str = "cannon_export.json";
pub const SINGLE_FILE: &str = "model.safetensors";

/// transformers' default `max_shard_size` ("5GB", decimal).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// The safetensors dtype of tensors exported in `p`: the f32 master weights as they are, or
/// rounded to bf16 (nearest even), half the size.
fn st_dtype(p: Precision) -> StDtype {
    match p {
        Precision::F32 => StDtype::F32,
        Precision::Bf16 => StDtype::Bf16,
    }
}

/// transformers' name of `p` (config.json's `dtype`).
pub fn torch_dtype_name(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "float32",
        Precision::Bf16 => "bfloat16",
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// Largest shard in bytes (a single tensor larger than this gets a shard of its own).
    pub max_shard_size: u64,
    /// The exported tensors' precision.
    pub dtype: Precision,
    /// Replace an earlier export in `out` (never anything else).
    pub force: bool,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions {
            max_shard_size: DEFAULT_MAX_SHARD_SIZE,
            dtype: Precision::F32,
            force: false,
        }
    }
}

/// What an export wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportReport {
    pub out: PathBuf,
    pub step: u64,
    /// Weight files, in order.
    pub files: Vec<String>,
    pub tensors: usize,
    /// Bytes of tensor data (the index's `metadata.total_size`).
    pub total_bytes: u64,
}

/// Parses a size as transformers writes it: `5GB`, `500MB`, `2GiB`, `10KB`, or plain bytes.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = (t[..split].trim(), t[split..].trim().to_ascii_uppercase());
    let mult: u64 = match unit.as_str() {
        "" | "B" => 1,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "KIB" => 1 << 10,
        "MIB" => 1 << 20,
        "GIB" => 1 << 30,
        _ => 0,
    };
    let bad = || {
        CheckpointError::Argument(format!(
            "size {s:?}: expected a number of bytes or a number with KB, MB, GB, KiB, MiB or GiB"
        ))
    };
    let n: f64 = num.parse().map_err(|_| bad())?;
    if mult == 0 || !n.is_finite() || n <= 0.0 {
        return Err(bad());
    }
    Ok((n * mult as f64) as u64)
}

/// [`parse_size`] as a clap value parser.
pub fn parse_size_arg(s: &str) -> std::result::Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// One tensor to write: its group, its element range there, and its name and shape.
struct Planned {
    group: usize,
    range: std::ops::Range<usize>,
    spec: TensorSpec,
}

/// Cuts the tensors into files of at most `max` bytes each.
fn plan(layout: &ParamLayout, dtype: StDtype, max: u64) -> Vec<Vec<Planned>> {
    let mut files: Vec<Vec<Planned>> = vec![Vec::new()];
    let mut size = 0u64;
    for (g, slot) in layout.slots() {
        let spec = TensorSpec {
            name: slot.name.clone(),
            dtype,
            shape: slot.shape.clone(),
        };
        let bytes = spec.bytes();
        let cur = files.last_mut().expect("never empty");
        if !cur.is_empty() && size + bytes > max {
            files.push(Vec::new());
            size = 0;
        }
        size += bytes;
        files.last_mut().expect("never empty").push(Planned {
            group: g,
            range: slot.range(),
            spec,
        });
    }
    files
}

/// Whether `path` is missing or an empty directory.
fn vacant(path: &Path) -> Result<bool> {
    match std::fs::read_dir(path) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(io(path)(e)),
    }
}

/// Whether `name` is a file an export writes.
fn export_file(name: &str) -> bool {
    let shard = name
        .strip_prefix("model-")
        .and_then(|r| r.strip_suffix(".safetensors"))
        .and_then(|r| r.split_once("-of-"))
        .is_some_and(|(a, b)| {
            [a, b]
                .iter()
                .all(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()))
        });
    shard
        || [EXPORT_MARKER, "config.json", SINGLE_FILE, INDEX_FILE].contains(&name)
        || MODEL_FOLDER_FILES.contains(&name)
}

/// Refuses to replace `out` unless it is an earlier export: it holds the marker, or (an
/// export of an older cannon, before the marker) a `config.json` and nothing but the files an
/// export writes. A run folder, a checkpoint or anything else is never replaced.
fn check_replaceable(out: &Path) -> Result<()> {
    if !out.is_dir() {
        return Err(CheckpointError::NotAnExport {
            path: out.to_path_buf(),
            found: "no folder".into(),
        });
    }
    let mut foreign = Vec::new();
    let mut names = Vec::new();
    for e in std::fs::read_dir(out).map_err(io(out))? {
        let e = e.map_err(io(out))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let is_file = e.file_type().map_err(io(out))?.is_file();
        if !(is_file && export_file(&name)) {
            foreign.push(name.clone());
        }
        names.push(name);
    }
    let marked = names.iter().any(|n| n == EXPORT_MARKER);
    let looks = names.iter().any(|n| n == "config.json");
    if foreign.is_empty() && (marked || looks) {
        return Ok(());
    }
    foreign.sort();
    foreign.truncate(5);
    Err(CheckpointError::NotAnExport {
        path: out.to_path_buf(),
        found: if foreign.is_empty() {
            "no config.json".into()
        } else {
            foreign.join(", ")
        },
    })
}

/// `p` made absolute with its symlinks resolved, as far as it exists (a missing tail is
/// appended as given).
fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = std::fs::canonicalize(p) {
        return c;
    }
    match (p.parent(), p.file_name()) {
        (Some(parent), Some(name)) => {
            let parent = if parent.as_os_str().is_empty() {
                Path::new(".")
            } else {
                parent
            };
            absolute(parent).join(name)
        }
        _ => std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf()),
    }
}

/// Refuses an `out` that is, holds or lies inside the checkpoint being read: writing there
/// would replace the input mid-read (and `--force` would delete it).
fn check_apart(out: &Path, checkpoint: &Path) -> Result<()> {
    let (o, c) = (absolute(out), absolute(checkpoint));
    if o.starts_with(&c) || c.starts_with(&o) {
        return Err(CheckpointError::OverlapsCheckpoint {
            out: out.to_path_buf(),
            checkpoint: checkpoint.to_path_buf(),
        });
    }
    Ok(())
}

/// The files of a model folder besides its weights and config that a checkpoint may carry
/// (see `ResolvedRun::model_folder_files`) and an export copies.
pub const MODEL_FOLDER_FILES: [&str; 2] = ["tekken.json", "SYSTEM_PROMPT.txt"];

/// Writes `ckpt`'s model as an HF checkpoint in `out`: built in a folder of its own beside
/// it (`<out>.tmp-<pid>-<nanos>`), every file and the folder fsynced, then renamed into
/// place. `out` must be missing or empty, or with `opts.force` an earlier export; it must not
/// overlap the checkpoint.
pub fn export(ckpt: &mut Checkpoint, out: &Path, opts: &ExportOptions) -> Result<ExportReport> {
    if opts.max_shard_size == 0 {
        return Err(CheckpointError::Argument(
            "max_shard_size must be > 0".into(),
        ));
    }
    check_apart(out, ckpt.dir())?;
    let replace = !vacant(out)?;
    if replace && !opts.force {
        return Err(CheckpointError::Exists {
            path: out.to_path_buf(),
        });
    }
    if replace {
        check_replaceable(out)?;
    }
    let cfg = ckpt.model_config()?;
    let layout = ParamLayout::new(&cfg);
    ckpt.manifest().check_layout(&layout)?;
    let config = export_config(&ckpt.model_config_json()?, torch_dtype_name(opts.dtype));

    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let tmp = unique_sibling(out, "tmp");
    std::fs::create_dir(&tmp).map_err(io(&tmp))?;
    let written = write_export(ckpt, &tmp, &layout, &config, opts).and_then(|r| {
        sync_dir(&tmp)?;
        commit(&tmp, out, replace)?;
        Ok(r)
    });
    match written {
        Ok((names, tensors, total)) => Ok(ExportReport {
            out: out.to_path_buf(),
            step: ckpt.step(),
            files: names,
            tensors,
            total_bytes: total,
        }),
        Err(e) => {
            // Our own folder only: whatever else is beside `out` is someone else's.
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// Moves the finished `tmp` to `out`; an earlier export there (`replace`, checked) goes
/// aside first and is removed once the new one is in place.
fn commit(tmp: &Path, out: &Path, replace: bool) -> Result<()> {
    if !replace {
        // A missing or empty `out`: a rename replaces an empty directory.
        rename_synced(tmp, out)?;
        return Ok(());
    }
    let old = unique_sibling(out, "replaced");
    rename_synced(out, &old)?;
    rename_synced(tmp, out)?;
    std::fs::remove_dir_all(&old).map_err(io(&old))
}

/// Writes the export's files into `tmp`; returns the weight files, the tensor count and the
/// data bytes.
fn write_export(
    ckpt: &mut Checkpoint,
    tmp: &Path,
    layout: &ParamLayout,
    config: &serde_json::Value,
    opts: &ExportOptions,
) -> Result<(Vec<String>, usize, u64)> {
    let files = plan(layout, st_dtype(opts.dtype), opts.max_shard_size);
    let n = files.len();
    let names: Vec<String> = (0..n)
        .map(|i| {
            if n == 1 {
                SINGLE_FILE.to_string()
            } else {
                format!("model-{:05}-of-{n:05}.safetensors", i + 1)
            }
        })
        .collect();
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let mut weight_map = BTreeMap::new();
    let mut total = 0u64;
    let mut tensors = 0;
    // The group being written, read whole once (groups are written in order).
    let mut cached: Option<(usize, Vec<f32>)> = None;
    for (file, name) in files.iter().zip(&names) {
        let specs = file.iter().map(|p| p.spec.clone()).collect();
        let mut w = StWriter::create(&tmp.join(name), specs, &meta)?;
        for p in file {
            if cached.as_ref().map(|c| c.0) != Some(p.group) {
                cached = Some((p.group, ckpt.read_group(Kind::Param, p.group)?));
            }
            let data = &cached.as_ref().expect("read above").1;
            w.write_f32(&data[p.range.clone()])?;
            weight_map.insert(p.spec.name.clone(), name.clone());
            total += p.spec.bytes();
            tensors += 1;
        }
        w.finish()?;
    }
    if n > 1 {
        let index = serde_json::json!({
            "metadata": {"total_size": total},
            "weight_map": weight_map,
        });
        write_json(&tmp.join(INDEX_FILE), &index)?;
    }
    write_json(&tmp.join("config.json"), config)?;
    // The model folder's tokenizer and system prompt, as the run saved them with the
    // checkpoint: an exported fine-tune is a folder the next run and a server read them from.
    for name in MODEL_FOLDER_FILES {
        let from = ckpt.dir().join(name);
        if from.is_file() {
            let bytes = std::fs::read(&from).map_err(io(&from))?;
            write_synced(&tmp.join(name), &bytes)?;
        }
    }
    let marker = serde_json::json!({
        "format": "cannon-export",
        "step": ckpt.step(),
        "checkpoint": ckpt.dir().display().to_string(),
    });
    write_json(&tmp.join(EXPORT_MARKER), &marker)?;
    Ok((names, tensors, total))
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(v).unwrap_or_default();
    text.push(b'\n');
    Ok(write_synced(path, &text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_transformers() {
        assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5 KB").unwrap(), 1500);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "0", "-1MB", "5XB", "GB", "nanGB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
