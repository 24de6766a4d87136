//! Writing a model as an HF directory: `config.json` and one f32 `model.safetensors` under the
//! transformers 5.x names of [`ParamLayout`], which [`super::Mistral3::load`] (and
//! transformers) read back.
//!
//! The file is streamed one parameter group at a time ([`HfWriter`]): the header first
//! (every tensor's name, shape and offset follow from the layout), then each group's values
//! as they arrive, so a writer holds one group on the host, never the model (a sharded run
//! gathers one group, writes it, drops it). It is written under a temporary name and renamed
//! when complete, so a crash leaves either the previous file or the new one, never half of
//! one. One process and N ranks write the same bytes for the same weights.

use super::params::ParamLayout;
use super::weights::WeightsError;
use super::{Mistral3, ModelError};
use crate::model::st::{StDtype, StError, StWriter, TensorSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> WeightsError + '_ {
    move |source| WeightsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// An HF model directory being written group by group (see the module docs).
pub struct HfWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: StWriter,
    /// Every group's slot lengths, in the order they are written (a piece written must not
    /// straddle two tensors).
    groups: Vec<Vec<usize>>,
    next: usize,
}

impl HfWriter {
    /// Creates `dir` if needed, writes `config_json` as `config.json`, and starts
    /// `model.safetensors` (under a temporary name) with the header of `layout`'s tensors.
    pub fn create(
        dir: &Path,
        layout: &ParamLayout,
        config_json: &serde_json::Value,
    ) -> Result<Self, WeightsError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let cfg = dir.join("config.json");
        let text = serde_json::to_string_pretty(config_json).unwrap_or_default();
        std::fs::write(&cfg, text + "\n").map_err(io(&cfg))?;
        let path = dir.join("model.safetensors");
        let tmp = path.with_extension("safetensors.partial");
        let specs = layout
            .slots()
            .map(|(_, s)| TensorSpec {
                name: s.name.clone(),
                dtype: StDtype::F32,
                shape: s.shape.clone(),
            })
            .collect();
        let format = |e: StError| WeightsError::Format {
            path: tmp.clone(),
            reason: e.to_string(),
        };
        // As transformers' `save_pretrained` and `cannon export` mark their files.
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let out = StWriter::create(&tmp, specs, &meta).map_err(format)?;
        Ok(HfWriter {
            path,
            tmp: tmp.clone(),
            out,
            groups: layout
                .groups
                .iter()
                .map(|g| g.slots.iter().map(|s| s.len()).collect())
                .collect(),
            next: 0,
        })
    }

    /// A writer of sizes only, for a meta device's model: the file gets its header and
    /// size but no data (`StWriter::without_data`).
    pub fn without_data(mut self) -> Self {
        self.out = self.out.without_data();
        self
    }

    /// Appends the next group's `len` values (its slots are laid end to end in the order of
    /// the header).
    pub fn write_group(&mut self, values: &[f32]) -> Result<(), WeightsError> {
        let slots = self.groups.get(self.next).cloned().unwrap_or_default();
        let want = self.groups.get(self.next).map(|s| s.iter().sum::<usize>());
        if want != Some(values.len()) {
            return Err(WeightsError::Format {
                path: self.tmp.clone(),
                reason: format!(
                    "group {} given {} values, the layout has {want:?}",
                    self.next,
                    values.len()
                ),
            });
        }
        let mut at = 0;
        for len in slots {
            self.out
                .write_f32(&values[at..at + len])
                .map_err(|e| WeightsError::Format {
                    path: self.tmp.clone(),
                    reason: e.to_string(),
                })?;
            at += len;
        }
        self.next += 1;
        Ok(())
    }

    /// Completes the file (every group written) and moves it into place.
    pub fn finish(self) -> Result<PathBuf, WeightsError> {
        if self.next != self.groups.len() {
            return Err(WeightsError::Format {
                path: self.tmp.clone(),
                reason: format!("{} of {} groups written", self.next, self.groups.len()),
            });
        }
        let tmp = self.tmp.clone();
        self.out.finish().map_err(|e| WeightsError::Format {
            path: tmp.clone(),
            reason: e.to_string(),
        })?;
        std::fs::rename(&tmp, &self.path).map_err(io(&self.path))?;
        Ok(self.path)
    }
}

/// Writes host groups laid out by `layout` to `dir` (with `config_json`) as f32 safetensors.
pub fn write_hf(
    dir: &Path,
    layout: &ParamLayout,
    config_json: &serde_json::Value,
    groups: &[Vec<f32>],
) -> Result<(), WeightsError> {
    let mut w = HfWriter::create(dir, layout, config_json)?;
    for g in groups {
        w.write_group(g)?;
    }
    w.finish().map(|_| ())
}

/// Writes `model` into `dir` (created if needed): `config_json` as `config.json` and the f32
/// parameters as `model.safetensors`, one group at a time from the model's device.
pub fn save_hf(
    model: &Mistral3,
    config_json: &serde_json::Value,
    dir: &Path,
) -> Result<(), ModelError> {
    let layout = &model.params.layout;
    let mut w = HfWriter::create(dir, layout, config_json)?;
    let st = model.exec.stream();
    for group in &model.params.data {
        w.write_group(&group.to_host(st)?)?;
    }
    w.finish()?;
    Ok(())
}
