//! What a run's samples are made with, decided in one place for `cannon train`, its dry run,
//! `cannon eval` and `cannon data show`: the tokenizer (cut to the model's vocabulary), the
//! model's config, the image processor's settings and the system prompt.
//!
//! A preset has the project's defaults (the shared tokenizer cut to 1280 ids, 112-pixel
//! images). An HF model folder has its own: its `tekken.json` (whose `image` section must agree
//! with the model's vision config), its `vocab_size`, its `vision_config.image_size`, and with
//! `data.system = "model"` its `SYSTEM_PROMPT.txt`. Nothing of the preset leaks into a folder's
//! run: a tokenizer whose ids do not fit the model, or a vocabulary smaller than a pretrained
//! model's, is an error unless `data.vocab_size` asks for it (then it is a warning).

use super::error::TrainError;
use super::resolve::{
    check_ids_fit, dir_config, model_config, ModelSource, ResolvedRun, TokenizerFrom,
};
use crate::model::Mistral3Config;
use crate::train::config::preset::{PRESET_LONGEST_EDGE, PRESET_VOCAB};
use crate::train::config::ConfigError;
use crate::train::data::dataset::SampleSettings;
use crate::train::data::image::ImageConfig;
use crate::train::data::truncate::LabelPolicy;
use crate::train::data::Tekken;

/// The tokenizer, model config, image settings and system prompt of a run's samples.
#[derive(Debug)]
pub struct SampleSetup {
    pub tok: Tekken,
    pub mcfg: Mistral3Config,
    /// The model's `config.json` contents.
    pub model_json: serde_json::Value,
    pub image: ImageConfig,
    /// The system prompt for samples that bring none ([`ResolvedRun::system`]).
    pub system: Option<String>,
    pub labels: LabelPolicy,
    /// Deliberate departures from the model's own setup, for the run to print loudly.
    pub warnings: Vec<String>,
}

impl SampleSetup {
    /// Reads the tokenizer and the model's config of `plan` and decides the rest.
    pub fn new(plan: &ResolvedRun) -> Result<Self, TrainError> {
        let d = &plan.cfg.data;
        let mut warnings = Vec::new();
        let (tok, mcfg, model_json, longest_edge, system) = match &plan.model {
            ModelSource::Preset(..) => {
                let tok = Tekken::from_file(&plan.tokenizer, d.vocab_size.or(Some(PRESET_VOCAB)))?;
                let (mcfg, json) = model_config(&plan.model, &tok)?;
                let edge = d.longest_edge.unwrap_or(PRESET_LONGEST_EDGE);
                (tok, mcfg, json, edge, plan.system.clone())
            }
            ModelSource::Dir(dir) => {
                let path = dir.join("config.json");
                let (mcfg, json) = dir_config(dir)?;
                let model_vocab = mcfg.text_config.vocab_size as u32;
                let tok = match d.vocab_size {
                    Some(v) => Tekken::from_file(&plan.tokenizer, Some(v))?,
                    None => Tekken::for_model(&plan.tokenizer, model_vocab)?,
                };
                check_ids_fit(&tok, &mcfg)?;
                let have = tok.vocab_size();
                if plan.cfg.model.weights.is_some() && have < model_vocab {
                    let what = format!(
                        "the tokenizer {} has {have} ids and the pretrained model {model_vocab}: \
                         text is encoded without the merges of the ids above {have}, so into \
                         other tokens than the model learnt",
                        plan.tokenizer.display()
                    );
                    if d.vocab_size.is_none() {
                        return Err(ConfigError::Invalid {
                            key: "data.tokenizer",
                            value: plan.tokenizer.display().to_string(),
                            reason: format!(
                                "{what}; give the model's own tokenizer, or set \
                                 data.vocab_size = {have} to train with this one deliberately"
                            ),
                        }
                        .into());
                    }
                    warnings.push(format!("data.vocab_size = {have}: {what}"));
                }
                match plan.tokenizer_from {
                    TokenizerFrom::Shared => warnings.push(format!(
                        "{} holds no tekken.json: the project's tokenizer {} is used, cut to \
                         the model's {model_vocab} ids (set data.tokenizer to the model's own)",
                        dir.display(),
                        plan.tokenizer.display()
                    )),
                    TokenizerFrom::Config | TokenizerFrom::ModelFolder => {
                        check_image_section(&tok, &plan.tokenizer, &mcfg, &path)?
                    }
                }
                let edge = d
                    .longest_edge
                    .unwrap_or(mcfg.vision_config.image_size as u32);
                (tok, mcfg, json, edge, plan.system.clone())
            }
        };
        let image = ImageConfig {
            longest_edge,
            patch_size: mcfg.vision_config.patch_size as u32,
            merge_size: mcfg.spatial_merge_size as u32,
            max_pixels: d.image_max_pixels,
            min_pixels: d.image_min_pixels,
            ..ImageConfig::default()
        };
        Ok(SampleSetup {
            tok,
            mcfg,
            model_json,
            image,
            system,
            labels: d.labels(),
            warnings,
        })
    }

    /// The settings a dataset is read with.
    pub fn settings(&self, max_len: usize) -> SampleSettings<'_> {
        SampleSettings {
            max_len,
            system_prompt: self.system.as_deref(),
            image: &self.image,
            labels: self.labels,
        }
    }
}

/// The tokenizer's `image` section against the model's vision config: the patch size, the
/// spatial merge and the largest image must agree (a tokenizer made for another model
/// would count other image tokens than the model makes).
fn check_image_section(
    tok: &Tekken,
    tok_path: &std::path::Path,
    mcfg: &Mistral3Config,
    cfg_path: &std::path::Path,
) -> Result<(), TrainError> {
    let Some(img) = tok.image_config() else {
        return Ok(());
    };
    let v = &mcfg.vision_config;
    for (what, theirs, ours) in [
        (
            "image_patch_size / vision_config.patch_size",
            img.image_patch_size as usize,
            v.patch_size,
        ),
        (
            "spatial_merge_size / spatial_merge_size",
            img.spatial_merge_size as usize,
            mcfg.spatial_merge_size,
        ),
        (
            "max_image_size / vision_config.image_size",
            img.max_image_size as usize,
            v.image_size,
        ),
    ] {
        if theirs != ours {
            return Err(TrainError::Input(format!(
                "the tokenizer {} and the model {} disagree on the images ({what}): {theirs} \
                 in the tokenizer, {ours} in the model",
                tok_path.display(),
                cfg_path.display()
            )));
        }
    }
    Ok(())
}
