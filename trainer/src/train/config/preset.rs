//! Built-in model presets: HF `config.json` contents the trainer can start from without a model
//! directory.
//!
//! `tiny` is the default of `cannon train`: a Mistral3 small enough to learn the synthetic
//! shapes set from random weights on a 2-core CPU within minutes. Its vocabulary, `[IMG]` id and
//! vision patch size follow the tokenizer and the image processor it is used with, so it is
//! made from them rather than fixed.

use crate::model::{ConfigError, Mistral3Config};

/// The sizes of a preset that are not fixed by the tokenizer and the images.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PresetSizes {
    pub text_hidden: usize,
    pub text_intermediate: usize,
    pub text_layers: usize,
    pub text_heads: usize,
    pub text_kv_heads: usize,
    pub vision_hidden: usize,
    pub vision_intermediate: usize,
    pub vision_layers: usize,
    pub vision_heads: usize,
    /// RoPE base of the language model.
    pub rope_theta: f64,
}

/// The `tiny` preset's sizes.
pub const TINY: PresetSizes = PresetSizes {
    text_hidden: 64,
    text_intermediate: 128,
    text_layers: 2,
    text_heads: 4,
    text_kv_heads: 2,
    vision_hidden: 64,
    vision_intermediate: 128,
    vision_layers: 2,
    vision_heads: 4,
    rope_theta: 10_000.0,
};

/// The vocabulary of a preset run: the shared tokenizer's first 1280 ids (a model small enough
/// to learn the synthetic set in minutes).
pub const PRESET_VOCAB: u32 = 1280;
/// The longest image edge of a preset run (the synthetic set's images are 112 px).
pub const PRESET_LONGEST_EDGE: u32 = 112;

/// Names of the built-in presets.
pub const PRESETS: &[&str] = &["tiny"];

/// The sizes of a preset by name.
pub fn sizes(name: &str) -> Option<PresetSizes> {
    match name {
        "tiny" => Some(TINY),
        _ => None,
    }
}

/// A Mistral3 config of the given sizes for a tokenizer of `vocab` ids whose `[IMG]` is
/// `image_token`, and images cut into `patch` pixel patches.
pub fn config(
    s: PresetSizes,
    vocab: usize,
    image_token: u32,
    patch: usize,
) -> Result<Mistral3Config, ConfigError> {
    Mistral3Config::from_json(&config_json(s, vocab, image_token, patch).to_string())
}

/// The `config.json` contents of [`config`] (what an exported or saved model carries).
pub fn config_json(
    s: PresetSizes,
    vocab: usize,
    image_token: u32,
    patch: usize,
) -> serde_json::Value {
    serde_json::json!({
        "model_type": "mistral3",
        "image_token_index": image_token,
        "spatial_merge_size": 2,
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": false,
        "vision_feature_layer": -1,
        "text_config": {
            "model_type": "mistral",
            "vocab_size": vocab,
            "hidden_size": s.text_hidden,
            "intermediate_size": s.text_intermediate,
            "num_hidden_layers": s.text_layers,
            "num_attention_heads": s.text_heads,
            "num_key_value_heads": s.text_kv_heads,
            "head_dim": s.text_hidden / s.text_heads,
            "max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "rope_theta": s.rope_theta,
            "sliding_window": null,
            "hidden_act": "silu"
        },
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": s.vision_hidden,
            "intermediate_size": s.vision_intermediate,
            "num_hidden_layers": s.vision_layers,
            "num_attention_heads": s.vision_heads,
            "head_dim": s.vision_hidden / s.vision_heads,
            "num_channels": 3,
            "patch_size": patch,
            "image_size": 1024,
            "rope_theta": 10000.0,
            "hidden_act": "silu"
        }
    })
}
