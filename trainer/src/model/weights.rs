//! Loading HF safetensors checkpoints into the flat parameter groups.
//!
//! A directory holds either `model.safetensors` or a sharded checkpoint
//! (`model.safetensors.index.json` whose `weight_map` names the file of every tensor). Names
//! may be transformers 5.x (`model.language_model.*`, `model.vision_tower.*`,
//! `model.multi_modal_projector.*`, `lm_head.*`) or the 4.x on-disk names
//! (`language_model.model.*`, `vision_tower.*`, `multi_modal_projector.*`,
//! `language_model.lm_head.*`); both map to the 5.x names of [`ParamLayout`]. Tensors may be
//! f32, bf16 or f16 and are widened to f32. A tensor the model lacks, one it needs but the
//! checkpoint lacks, a wrong shape, a duplicate or another dtype is an error naming it.

use super::params::{ParamLayout, Params};
use super::ModelError;
use crate::model::st::StReader;
use cannon_kernels::device_ctx::DeviceCtx;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};

pub use super::error::WeightsError;

/// The 5.x name of a parameter written under either naming scheme.
pub fn canonical_name(name: &str) -> String {
    const LEGACY: [(&str, &str); 4] = [
        ("language_model.model.", "model.language_model."),
        ("language_model.lm_head.", "lm_head."),
        ("vision_tower.", "model.vision_tower."),
        ("multi_modal_projector.", "model.multi_modal_projector."),
    ];
    for (old, new) in LEGACY {
        if let Some(rest) = name.strip_prefix(old) {
            return format!("{new}{rest}");
        }
    }
    name.to_string()
}

/// The 4.x on-disk name of a 5.x parameter name (the inverse of [`canonical_name`]).
pub fn legacy_name(name: &str) -> String {
    const NEW: [(&str, &str); 4] = [
        ("model.language_model.", "language_model.model."),
        ("lm_head.", "language_model.lm_head."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    ];
    for (new, old) in NEW {
        if let Some(rest) = name.strip_prefix(new) {
            return format!("{old}{rest}");
        }
    }
    name.to_string()
}

/// Checkpoint files, each with the tensor names the index assigns to it (None: all).
type FileList = Vec<(PathBuf, Option<Vec<String>>)>;

/// The largest `model.safetensors.index.json` read: the 24B model's is 60 KB (one line per
/// tensor), so 64 MiB leaves room for any model while a hostile file cannot fill memory.
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The files of the checkpoint in `dir`: the shards of `model.safetensors.index.json`, else
/// the single `model.safetensors`.
fn checkpoint_files(dir: &Path) -> Result<FileList, WeightsError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let bad = |reason: String| WeightsError::Index {
            path: index.clone(),
            reason,
        };
        let io = |source| WeightsError::Io {
            path: index.clone(),
            source,
        };
        let len = std::fs::metadata(&index).map_err(io)?.len();
        if len > MAX_INDEX_BYTES {
            return Err(bad(format!(
                "{len} bytes is past {MAX_INDEX_BYTES}, the largest index this trainer reads"
            )));
        }
        let text = std::fs::read_to_string(&index).map_err(io)?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
        let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("weight_map[{tensor}] is not a file name")))?;
            if file.contains('/') || file.contains("..") {
                return Err(bad(format!(
                    "weight_map[{tensor}] = {file} leaves the directory"
                )));
            }
            files
                .entry(file.to_string())
                .or_default()
                .push(tensor.clone());
        }
        return Ok(files
            .into_iter()
            .map(|(f, names)| (dir.join(f), Some(names)))
            .collect());
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(vec![(single, None)]);
    }
    Err(WeightsError::NoWeights(dir.to_path_buf()))
}

/// Loads the checkpoint in `dir` into groups laid out by `layout` on `exec`'s device (read
/// and widened on the host, then uploaded group by group).
pub fn load_params(
    exec: &DeviceCtx,
    dir: &Path,
    layout: ParamLayout,
) -> Result<Params, ModelError> {
    let data = load_host(dir, &layout)?;
    Params::from_host(exec, layout, &data)
}

/// Loads the checkpoint in `dir` into host groups laid out by `layout` (the whole model:
/// a sharded run reads its ranges through [`HfWeights`] instead).
pub fn load_host(dir: &Path, layout: &ParamLayout) -> Result<Vec<Vec<f32>>, WeightsError> {
    let w = HfWeights::open(dir, layout)?;
    (0..layout.groups.len())
        .map(|g| w.read(g, 0..layout.groups[g].len))
        .collect()
}

/// An HF checkpoint opened for reading any element range of any parameter group: every file's
/// header is read and every tensor checked against the layout (name, shape, dtype, none
/// missing, none twice) when it is opened; the data is read only when a range is asked for,
/// and only that range's bytes, widened to f32 piece by piece. The readers are positioned
/// reads, so the ranks of one process share one `HfWeights`.
#[derive(Debug)]
pub struct HfWeights {
    layout: ParamLayout,
    files: Vec<StReader>,
    /// For every group, for every slot: the file holding it and the tensor's name there.
    at: Vec<Vec<(usize, String)>>,
}

impl HfWeights {
    /// The checkpoint read for sizes only, by a meta device's ranks: every range is checked
    /// and its pieces allocated as usual, no byte is read (`StReader::without_data`).
    pub fn without_data(mut self) -> Self {
        self.files = self.files.into_iter().map(StReader::without_data).collect();
        self
    }

    /// Opens the checkpoint in `dir` (see the module docs) for `layout`.
    pub fn open(dir: &Path, layout: &ParamLayout) -> Result<Self, WeightsError> {
        let mut files = Vec::new();
        let mut at: Vec<Vec<Option<(usize, String)>>> = layout
            .groups
            .iter()
            .map(|g| vec![None; g.slots.len()])
            .collect();
        // 5.x name -> the name it was found under, to report duplicates.
        let mut found: HashMap<String, String> = HashMap::new();
        for (path, expected) in checkpoint_files(dir)? {
            let reader = StReader::open(&path).map_err(|e| WeightsError::Format {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let mut names: Vec<String> = match expected {
                Some(names) => names,
                None => reader.names().map(String::from).collect(),
            };
            // The header is a JSON object: report problems in a stable order.
            names.sort();
            let f = files.len();
            for name in names {
                let entry = reader.entry(&name);
                let dtype = reader.unsupported(&name);
                if entry.is_none() && dtype.is_none() {
                    return Err(WeightsError::Index {
                        path,
                        reason: format!("tensor {name} listed in the index is not in the file"),
                    });
                }
                let canon = canonical_name(&name);
                let Some((g, s)) = layout.find(&canon) else {
                    return Err(WeightsError::Unexpected { path, name });
                };
                if let Some(other) = found.insert(canon, name.clone()) {
                    return Err(WeightsError::Duplicate { path, name, other });
                }
                let slot = &layout.groups[g].slots[s];
                let Some(entry) = entry else {
                    let dtype = dtype.unwrap_or_default().to_string();
                    return Err(WeightsError::Dtype { path, name, dtype });
                };
                if entry.shape != slot.shape {
                    return Err(WeightsError::Shape {
                        path,
                        name,
                        found: entry.shape.clone(),
                        expected: slot.shape.clone(),
                    });
                }
                at[g][s] = Some((f, name));
            }
            files.push(reader);
        }
        let missing: Vec<&str> = layout
            .slots()
            .map(|(_, s)| s.name.as_str())
            .filter(|n| !found.contains_key(*n))
            .collect();
        if let Some(first) = missing.first() {
            return Err(WeightsError::Missing {
                name: first.to_string(),
                more: missing.len() - 1,
            });
        }
        let at = at
            .into_iter()
            .map(|slots| slots.into_iter().flatten().collect())
            .collect();
        Ok(HfWeights {
            layout: layout.clone(),
            files,
            at,
        })
    }

    /// Elements `range` of group `g` into `dst` (of the range's length): the bytes of the
    /// slots the range covers, widened to f32.
    pub fn read_into(
        &self,
        g: usize,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), WeightsError> {
        let group = self.layout.groups.get(g);
        let len = group.map_or(0, |gr| gr.len);
        if group.is_none() || range.start > range.end || range.end > len || dst.len() != range.len()
        {
            return Err(WeightsError::Range(format!(
                "elements {range:?} of group {g} ({len} elements) into {} values",
                dst.len()
            )));
        }
        let slots = self.layout.groups[g].slots.iter().zip(&self.at[g]);
        for (slot, (f, name)) in slots {
            let r = slot.range();
            let (a, b) = (r.start.max(range.start), r.end.min(range.end));
            if a >= b {
                continue;
            }
            let file = &self.files[*f];
            let out = &mut dst[a - range.start..b - range.start];
            file.read_widened(name, a - r.start..b - r.start, out)
                .map_err(|e| WeightsError::Format {
                    path: file.path().to_path_buf(),
                    reason: e.to_string(),
                })?;
        }
        Ok(())
    }

    /// Elements `range` of group `g`.
    pub fn read(&self, g: usize, range: Range<usize>) -> Result<Vec<f32>, WeightsError> {
        let mut v = vec![0.0; range.len()];
        self.read_into(g, range, &mut v)?;
        Ok(v)
    }
}
