//! The reference fixture (shared/reference/make_reference.py): `reference.safetensors`'s
//! tensors, widened to f64, and its string metadata: the input batch (`input.*`), the
//! expected outputs and gradients (`out.*`, `grad.*`), and the training run (`train.*`: the
//! AdamW settings, the frozen parts, per-step losses and grad norms, the final parameters).

use super::VerifyError;
use crate::model::optim::AdamWConfig;
use crate::model::{Batch, Images, Mistral3, Part};
use crate::train::TrainSettings;
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

/// The fixture's tensors (widened to f64, with their shapes) and metadata.
#[derive(Debug, Clone)]
pub struct Reference {
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
    pub meta: BTreeMap<String, String>,
}

impl Reference {
    pub fn load(path: &Path) -> Result<Self, VerifyError> {
        let bad = |reason: String| VerifyError::Reference {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f64> = match view.dtype() {
                Dtype::F64 => data
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    .collect(),
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as f64)
                    .collect(),
                Dtype::I64 => data
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f64)
                    .collect(),
                other => return Err(bad(format!("tensor {name}: unsupported dtype {other:?}"))),
            };
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        Ok(Reference {
            tensors: tensors.into_iter().collect(),
            meta: meta.into_iter().collect(),
        })
    }

    /// A tensor by name (shape, values), or an error naming the missing tensor.
    pub fn get(&self, name: &str) -> Result<&(Vec<usize>, Vec<f64>), VerifyError> {
        self.tensors
            .get(name)
            .ok_or_else(|| VerifyError::Unusable(format!("reference lacks tensor {name}")))
    }

    fn meta_f64(&self, key: &str) -> Result<f64, VerifyError> {
        let v = self
            .meta
            .get(key)
            .ok_or_else(|| VerifyError::Unusable(format!("reference metadata lacks {key}")))?;
        v.parse()
            .map_err(|_| VerifyError::Unusable(format!("metadata {key} = {v} is not a number")))
    }

    /// The batch in `input.*`.
    pub fn batch(&self) -> Result<Batch, VerifyError> {
        let (ids_shape, ids) = self.get("input.input_ids")?;
        let (_, labels) = self.get("input.labels")?;
        let [rows, seq] = ids_shape[..] else {
            return Err(VerifyError::Unusable(format!(
                "input.input_ids has shape {ids_shape:?}, expected [B, S]"
            )));
        };
        let (pshape, pix) = self.get("input.pixel_values")?;
        let (_, sizes) = self.get("input.image_sizes")?;
        let sizes: Vec<(usize, usize)> = sizes
            .chunks_exact(2)
            .map(|s| (s[0] as usize, s[1] as usize))
            .collect();
        let images = match pshape[..] {
            [n, c, h, w] if n == sizes.len() && !sizes.is_empty() => {
                let pix: Vec<f32> = pix.iter().map(|&x| x as f32).collect();
                Images::from_padded(&pix, [n, c, h, w], &sizes)
                    .map_err(|e| VerifyError::Unusable(format!("input.pixel_values: {e}")))?
            }
            _ if sizes.is_empty() => Images::default(),
            _ => {
                return Err(VerifyError::Unusable(format!(
                    "input.pixel_values {pshape:?} does not match {} image sizes",
                    sizes.len()
                )))
            }
        };
        Ok(Batch {
            input_ids: ids.iter().map(|&x| x as u32).collect(),
            labels: labels.iter().map(|&x| x as i32).collect(),
            rows,
            seq,
            images,
            ..Batch::default()
        })
    }

    /// The training run the fixture recorded: its AdamW settings and frozen parts (for
    /// `model`'s parameter names), and how many steps it holds.
    pub fn train_settings(&self, model: &Mistral3) -> Result<(TrainSettings, usize), VerifyError> {
        let betas: Vec<f64> = self
            .meta
            .get("train.betas")
            .and_then(|b| serde_json::from_str(b).ok())
            .filter(|b: &Vec<f64>| b.len() == 2)
            .ok_or_else(|| VerifyError::Unusable("metadata train.betas is not [b1, b2]".into()))?;
        let adamw = AdamWConfig {
            lr: self.meta_f64("train.lr")?,
            beta1: betas[0],
            beta2: betas[1],
            eps: self.meta_f64("train.eps")?,
            weight_decay: self.meta_f64("train.weight_decay")?,
        };
        if let Some(s) = self
            .meta
            .get("lr_schedule")
            .filter(|s| s.as_str() != "constant")
        {
            return Err(VerifyError::Unusable(format!(
                "lr_schedule {s} is not supported (constant only)"
            )));
        }
        let steps = self.meta_f64("train.steps")? as usize;
        let spec = self.meta.get("train.frozen").cloned().unwrap_or_default();
        let settings = TrainSettings {
            adamw,
            max_grad_norm: self.meta_f64("train.max_grad_norm")?,
            frozen: frozen_parts(model, &spec)?,
        };
        Ok((settings, steps))
    }
}

/// The parts the fixture's `train.frozen` metadata freezes (`prefix.*` patterns); a pattern
/// that freezes only part of a [`Part`] is unusable (we freeze whole parts).
fn frozen_parts(model: &Mistral3, spec: &str) -> Result<Vec<Part>, VerifyError> {
    let patterns: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let matches = |name: &str| {
        patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *p,
        })
    };
    let mut frozen = Vec::new();
    for part in [Part::Vision, Part::Projector, Part::Text] {
        let names: Vec<&str> = model
            .params
            .layout
            .slots()
            .filter(|(g, _)| model.params.layout.groups[*g].part == part)
            .map(|(_, s)| s.name.as_str())
            .collect();
        let hit = names.iter().filter(|n| matches(n)).count();
        if hit == names.len() && hit > 0 {
            frozen.push(part);
        } else if hit > 0 {
            return Err(VerifyError::Unusable(format!(
                "train.frozen = {spec} freezes part of the {part:?} parameters; only whole parts \
                 (vision tower, projector, language model) can be frozen"
            )));
        }
    }
    Ok(frozen)
}
