//! Writing a model as an HF directory: `config.json` and one f32 `model.safetensors` under the
//! transformers 5.x names of [`ParamLayout`], which [`super::Mistral3::load`] (and
//! transformers) read back.
//!
//! The file is written under a temporary name and renamed when complete, so a crash leaves
//! either the previous file or the new one, never half of one.

use super::params::ParamLayout;
use super::weights::WeightsError;
use super::{Mistral3, ModelError};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes host groups laid out by `layout` to `path` as f32 safetensors.
pub fn write_safetensors(
    path: &Path,
    layout: &ParamLayout,
    groups: &[Vec<f32>],
) -> Result<(), WeightsError> {
    let bytes: Vec<Vec<u8>> = groups
        .iter()
        .map(|g| g.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let mut views = Vec::new();
    for (g, slot) in layout.slots() {
        let r = slot.range();
        let data = &bytes[g][r.start * 4..r.end * 4];
        let view = TensorView::new(Dtype::F32, slot.shape.clone(), data).map_err(|e| {
            WeightsError::Format {
                path: path.to_path_buf(),
                reason: format!("{}: {e}", slot.name),
            }
        })?;
        views.push((slot.name.clone(), view));
    }
    let tmp = path.with_extension("safetensors.partial");
    safetensors::serialize_to_file(views, None, &tmp).map_err(|e| WeightsError::Format {
        path: tmp.clone(),
        reason: e.to_string(),
    })?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Writes `model` into `dir` (created if needed): `config_json` as `config.json` and the f32
/// parameters as `model.safetensors`.
pub fn save_hf(
    model: &Mistral3,
    config_json: &serde_json::Value,
    dir: &Path,
) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let host = model.params.to_host(model.exec.stream())?;
    write_safetensors(&dir.join("model.safetensors"), &model.params.layout, &host)?;
    let cfg = dir.join("config.json");
    let text = serde_json::to_string_pretty(config_json).unwrap_or_default();
    std::fs::write(&cfg, text + "\n").map_err(io(&cfg))?;
    Ok(())
}
