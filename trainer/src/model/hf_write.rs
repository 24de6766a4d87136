//! Writing a model as an HF directory: `config.json` and one f32 `model.safetensors` under the
//! transformers 5.x names of [`ParamLayout`], which [`super::Mistral3::load`] (and
//! transformers) read back.
//!
//! The file is streamed one parameter group at a time ([`HfWriter`]): the header first
//! (every tensor's name, shape and offset follow from the layout), then each group's values
//! as they arrive, so a writer holds one group on the host, never the model (a sharded run
//! gathers one group, writes it, drops it). It is written under a temporary name, fsynced and
//! renamed when complete, the folder fsynced; `config.json` follows it the same way (never
//! written in place), so a crash leaves either the previous files or the new ones, never half
//! of one, and a folder whose `config.json` is new holds the new weights. One process and N
//! ranks write the same bytes for the same weights.

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
    /// `config.json`'s contents, committed after the weights.
    config: Vec<u8>,
    tmp: PathBuf,
    out: StWriter,
    /// Every group's slot lengths, in the order they are written (a piece written must not
    /// straddle two tensors).
    groups: Vec<Vec<usize>>,
    next: usize,
}

impl HfWriter {
    /// Creates `dir` if needed and starts `model.safetensors` (under a temporary name) with
    /// the header of `layout`'s tensors; `config_json` becomes `config.json` at [`Self::finish`].
    pub fn create(
        dir: &Path,
        layout: &ParamLayout,
        config_json: &serde_json::Value,
    ) -> Result<Self, WeightsError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let text = serde_json::to_string_pretty(config_json).unwrap_or_default();
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
            config: (text + "\n").into_bytes(),
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

    /// Completes the file (every group written, fsynced), moves it into place and writes
    /// `config.json` beside it, each renamed into place with the folder fsynced.
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
        let fs = |e: crate::durable::FsError| WeightsError::Io {
            path: e.path,
            source: e.source,
        };
        crate::durable::rename_synced(&tmp, &self.path).map_err(fs)?;
        let cfg = crate::durable::parent_of(&self.path).join("config.json");
        crate::durable::replace_file(&cfg, &self.config).map_err(fs)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::tiny_config;

    /// An unfinished write leaves the folder's earlier `config.json` and weights as they were
    /// (no config written ahead of its weights); a finished one replaces both and leaves no
    /// temporary file.
    #[test]
    fn config_json_follows_complete_weights_and_is_never_written_in_place() {
        let dir = std::env::temp_dir().join(format!("cannon-hf-write-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), "old").unwrap();
        let layout = ParamLayout::new(&tiny_config());
        let groups: Vec<Vec<f32>> = layout.groups.iter().map(|g| vec![0.5; g.len]).collect();
        let cfg = serde_json::json!({"model_type": "mistral3"});

        let mut w = HfWriter::create(&dir, &layout, &cfg).unwrap();
        w.write_group(&groups[0]).unwrap();
        assert!(w.finish().is_err(), "finished with groups missing");
        assert_eq!(
            std::fs::read_to_string(dir.join("config.json")).unwrap(),
            "old"
        );
        assert!(!dir.join("model.safetensors").exists());

        write_hf(&dir, &layout, &cfg, &groups).unwrap();
        let written: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(written, cfg);
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".partial"))
            .collect();
        names.sort();
        assert_eq!(names, ["config.json", "model.safetensors"]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
