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

use super::exec::Exec;
use super::params::{ParamLayout, Params};
use super::ModelError;
use safetensors::{Dtype, SafeTensors};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a safetensors file: {reason}")]
    Format { path: PathBuf, reason: String },
    #[error("{path}: bad index: {reason}")]
    Index { path: PathBuf, reason: String },
    #[error("no weights in {0}: expected model.safetensors or model.safetensors.index.json")]
    NoWeights(PathBuf),
    #[error("checkpoint lacks tensor {name} (and {more} more)")]
    Missing { name: String, more: usize },
    #[error("{path}: tensor {name} is not a parameter of this model config")]
    Unexpected { path: PathBuf, name: String },
    #[error("{path}: tensor {name} appears twice (also as {other})")]
    Duplicate {
        path: PathBuf,
        name: String,
        other: String,
    },
    #[error("{path}: tensor {name} has shape {found:?}, the config needs {expected:?}")]
    Shape {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: tensor {name} has dtype {dtype}; f32, bf16 and f16 are supported")]
    Dtype {
        path: PathBuf,
        name: String,
        dtype: String,
    },
}

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

/// The files of the checkpoint in `dir`: the shards of `model.safetensors.index.json`, else
/// the single `model.safetensors`.
fn checkpoint_files(dir: &Path) -> Result<FileList, WeightsError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index).map_err(|source| WeightsError::Io {
            path: index.clone(),
            source,
        })?;
        let bad = |reason: String| WeightsError::Index {
            path: index.clone(),
            reason,
        };
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
pub fn load_params(exec: &Exec, dir: &Path, layout: ParamLayout) -> Result<Params, ModelError> {
    let data = load_host(dir, &layout)?;
    Params::from_host(exec, layout, &data)
}

/// Loads the checkpoint in `dir` into host groups laid out by `layout`.
pub fn load_host(dir: &Path, layout: &ParamLayout) -> Result<Vec<Vec<f32>>, WeightsError> {
    let mut params = HostParams {
        layout,
        data: layout.groups.iter().map(|g| vec![0.0; g.len]).collect(),
    };
    // 5.x name -> the name it was loaded under, to report duplicates.
    let mut loaded: HashMap<String, String> = HashMap::new();
    for (path, expected) in checkpoint_files(dir)? {
        let bytes = std::fs::read(&path).map_err(|source| WeightsError::Io {
            path: path.clone(),
            source,
        })?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| WeightsError::Format {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let names: Vec<String> = match expected {
            Some(names) => names,
            None => st.names().into_iter().map(String::from).collect(),
        };
        for name in names {
            let view = st.tensor(&name).map_err(|e| WeightsError::Index {
                path: path.clone(),
                reason: format!("tensor {name} listed in the index is not in the file: {e}"),
            })?;
            let canon = canonical_name(&name);
            let Some((g, s)) = params.layout.find(&canon) else {
                return Err(WeightsError::Unexpected { path, name });
            };
            if let Some(other) = loaded.insert(canon.clone(), name.clone()) {
                return Err(WeightsError::Duplicate { path, name, other });
            }
            let slot = params.layout.groups[g].slots[s].clone();
            if view.shape() != slot.shape.as_slice() {
                return Err(WeightsError::Shape {
                    path,
                    name,
                    found: view.shape().to_vec(),
                    expected: slot.shape,
                });
            }
            let dst = &mut params.data[g][slot.range()];
            if !widen(view.dtype(), view.data(), dst) {
                return Err(WeightsError::Dtype {
                    path,
                    name,
                    dtype: format!("{:?}", view.dtype()),
                });
            }
        }
    }
    let missing: Vec<&str> = params
        .layout
        .slots()
        .map(|(_, s)| s.name.as_str())
        .filter(|n| !loaded.contains_key(*n))
        .collect();
    if let Some(first) = missing.first() {
        return Err(WeightsError::Missing {
            name: first.to_string(),
            more: missing.len() - 1,
        });
    }
    Ok(params.data)
}

/// Host groups being filled from a checkpoint.
struct HostParams<'a> {
    layout: &'a ParamLayout,
    data: Vec<Vec<f32>>,
}

/// Widens little-endian f32/bf16/f16 bytes into `dst`; false for any other dtype.
/// The caller has checked the shape, so `bytes` holds exactly `dst.len()` elements.
pub fn widen(dtype: Dtype, bytes: &[u8], dst: &mut [f32]) -> bool {
    match dtype {
        Dtype::F32 => {
            for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
                *d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Dtype::BF16 => {
            for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        Dtype::F16 => {
            for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        _ => return false,
    }
    true
}
