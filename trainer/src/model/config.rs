//! The HF `config.json` of a mistral3 model (Mistral3Config = Pixtral vision config + Mistral
//! text config), as serde structs in the style of candle's model configs.
//!
//! Fields missing from the file take transformers' class defaults (`MistralConfig`,
//! `PixtralVisionConfig`, `Mistral3Config`). Both RoPE spellings are accepted: 4.x files write
//! `rope_theta` inside the text/vision config, 5.x files write
//! `rope_parameters: {rope_theta, rope_type}`. [`Mistral3Config::validate`] turns everything
//! this implementation cannot run (another model type, a non-SiLU text MLP, RoPE scaling,
//! inconsistent head counts) into a [`ConfigError`] that names the field; an activation name
//! it does not compute at all (see [`HiddenAct`]) already fails to parse, naming the field.

use serde::{Deserialize, Deserializer};
use std::path::Path;

mod limits;
pub use limits::*;

/// A config.json is a few KB; a file past this is not one, and is not read into memory.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid mistral3 config.json: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("config: {field} = {value}: {reason}")]
    Unsupported {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("config: inconsistent sizes: {0}")]
    Inconsistent(String),
    #[error("config: {field} = {value} is past {limit}, the largest this trainer accepts")]
    TooLarge {
        field: &'static str,
        value: u64,
        limit: u64,
    },
    #[error("{path}: {len} bytes is not a config.json (at most {limit} bytes are read)")]
    FileTooLarge { path: String, len: u64, limit: u64 },
}

/// `rope_parameters` of a 5.x config (`{"rope_theta": .., "rope_type": ..}`).
#[derive(Clone, Debug, Deserialize)]
pub struct RopeParameters {
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_type: Option<String>,
}

/// The language model (`MistralConfig`).
#[derive(Clone, Debug, Deserialize)]
pub struct TextConfig {
    #[serde(default = "d::mistral")]
    pub model_type: String,
    #[serde(default = "d::t_vocab")]
    pub vocab_size: usize,
    #[serde(default = "d::t_hidden")]
    pub hidden_size: usize,
    #[serde(default = "d::t_inter")]
    pub intermediate_size: usize,
    #[serde(default = "d::t_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "d::t_heads")]
    pub num_attention_heads: usize,
    #[serde(default = "d::t_kv_heads")]
    pub num_key_value_heads: usize,
    /// `None` (absent or null) means `hidden_size / num_attention_heads`, as transformers does.
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "d::silu", deserialize_with = "act::text")]
    pub hidden_act: HiddenAct,
    #[serde(default = "d::t_eps")]
    pub rms_norm_eps: f64,
    /// 4.x spelling.
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// 5.x spelling.
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// 4.x RoPE scaling; only `null` is supported.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// transformers' MistralConfig default is 4096; null means full causal attention.
    #[serde(default = "d::t_window")]
    pub sliding_window: Option<usize>,
    #[serde(default = "d::t_max_pos")]
    pub max_position_embeddings: usize,
}

/// The vision tower (`PixtralVisionConfig`).
#[derive(Clone, Debug, Deserialize)]
pub struct VisionConfig {
    #[serde(default = "d::pixtral")]
    pub model_type: String,
    #[serde(default = "d::v_hidden")]
    pub hidden_size: usize,
    #[serde(default = "d::v_inter")]
    pub intermediate_size: usize,
    #[serde(default = "d::v_layers")]
    pub num_hidden_layers: usize,
    #[serde(default = "d::v_heads")]
    pub num_attention_heads: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "d::v_channels")]
    pub num_channels: usize,
    #[serde(default = "d::v_image")]
    pub image_size: usize,
    #[serde(default = "d::v_patch")]
    pub patch_size: usize,
    /// The MLP gate's activation. Pixtral's class default is `gelu`; the Mistral3-24B
    /// checkpoints say `silu`.
    #[serde(default = "d::gelu", deserialize_with = "act::vision")]
    pub hidden_act: HiddenAct,
    #[serde(default)]
    pub rope_theta: Option<f64>,
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
}

/// The whole model (`Mistral3Config`).
#[derive(Clone, Debug, Deserialize)]
pub struct Mistral3Config {
    pub model_type: String,
    pub text_config: TextConfig,
    pub vision_config: VisionConfig,
    #[serde(default = "d::image_token", alias = "image_token_id")]
    pub image_token_index: u32,
    #[serde(default = "d::merge")]
    pub spatial_merge_size: usize,
    #[serde(default = "d::gelu", deserialize_with = "act::projector")]
    pub projector_hidden_act: HiddenAct,
    #[serde(default)]
    pub multimodal_projector_bias: bool,
    /// An integer layer index (a list of layers is not supported).
    #[serde(default = "d::feature_layer")]
    pub vision_feature_layer: serde_json::Value,
}

/// transformers' class defaults for fields a config may omit.
mod d {
    pub fn mistral() -> String {
        "mistral".into()
    }
    pub fn pixtral() -> String {
        "pixtral".into()
    }
    use super::HiddenAct;
    pub fn silu() -> HiddenAct {
        HiddenAct::Silu
    }
    pub fn gelu() -> HiddenAct {
        HiddenAct::Gelu
    }
    pub fn t_vocab() -> usize {
        32000
    }
    pub fn t_hidden() -> usize {
        4096
    }
    pub fn t_inter() -> usize {
        14336
    }
    pub fn t_layers() -> usize {
        32
    }
    pub fn t_heads() -> usize {
        32
    }
    pub fn t_kv_heads() -> usize {
        8
    }
    pub fn t_eps() -> f64 {
        1e-6
    }
    pub fn t_window() -> Option<usize> {
        Some(4096)
    }
    pub fn t_max_pos() -> usize {
        4096 * 32
    }
    pub fn v_hidden() -> usize {
        1024
    }
    pub fn v_inter() -> usize {
        4096
    }
    pub fn v_layers() -> usize {
        24
    }
    pub fn v_heads() -> usize {
        16
    }
    pub fn v_channels() -> usize {
        3
    }
    pub fn v_image() -> usize {
        1024
    }
    pub fn v_patch() -> usize {
        16
    }
    pub fn image_token() -> u32 {
        10
    }
    pub fn merge() -> usize {
        2
    }
    pub fn feature_layer() -> serde_json::Value {
        serde_json::Value::from(-1)
    }
}

/// An activation named by `hidden_act` (the gated MLPs, `down(act(gate(x)) * up(x))`) or
/// `projector_hidden_act`, in transformers' spelling (its `ACT2FN` keys).
///
/// Only the activations this implementation computes are variants. Any other name, including
/// the tanh approximations of GELU (`gelu_pytorch_tanh`, `gelu_new`, `gelu_fast`), which are
/// different functions, fails when the config is read, with an error naming the field and the
/// value: running the model with a substitute would silently train a different model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
pub enum HiddenAct {
    /// `x * sigmoid(x)`: `"silu"`, or `"swish"`, which transformers maps to the same `nn.SiLU`.
    #[serde(rename = "silu", alias = "swish")]
    Silu,
    /// Exact (erf) GELU: `"gelu"`.
    #[serde(rename = "gelu")]
    Gelu,
}

impl HiddenAct {
    /// transformers' spelling.
    pub fn name(self) -> &'static str {
        match self {
            HiddenAct::Silu => "silu",
            HiddenAct::Gelu => "gelu",
        }
    }
}

impl std::fmt::Display for HiddenAct {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Per-field readers of [`HiddenAct`]: serde's own error for an unknown variant names the
/// value but not the field (serde_json reports only a line and column), so each field adds
/// its dotted name.
mod act {
    use super::{Deserialize, Deserializer, HiddenAct};
    use serde::de::{Error, IntoDeserializer};

    fn read<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<HiddenAct, D::Error> {
        let name = String::deserialize(d)?;
        HiddenAct::deserialize(name.as_str().into_deserializer()).map_err(
            |e: serde::de::value::Error| {
                D::Error::custom(format!(
                    "{field} = {name:?}: {e} (the activations this implementation computes)"
                ))
            },
        )
    }

    pub fn text<'de, D: Deserializer<'de>>(d: D) -> Result<HiddenAct, D::Error> {
        read(d, "text_config.hidden_act")
    }

    pub fn vision<'de, D: Deserializer<'de>>(d: D) -> Result<HiddenAct, D::Error> {
        read(d, "vision_config.hidden_act")
    }

    pub fn projector<'de, D: Deserializer<'de>>(d: D) -> Result<HiddenAct, D::Error> {
        read(d, "projector_hidden_act")
    }
}

impl TextConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// RoPE base from whichever spelling the file used (default 10000, MistralConfig's).
    pub fn rope_theta(&self) -> f64 {
        rope_theta(self.rope_theta, &self.rope_parameters)
    }
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    pub fn rope_theta(&self) -> f64 {
        rope_theta(self.rope_theta, &self.rope_parameters)
    }
}

fn rope_theta(flat: Option<f64>, params: &Option<RopeParameters>) -> f64 {
    params
        .as_ref()
        .and_then(|p| p.rope_theta)
        .or(flat)
        .unwrap_or(10000.0)
}

/// Pixtral's RMSNorm epsilon (ln_pre, attention_norm, ffn_norm) is hard-coded in transformers.
pub const VISION_RMS_EPS: f64 = 1e-5;

impl Mistral3Config {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let shown = path.display().to_string();
        let io = |source| ConfigError::Io {
            path: shown.clone(),
            source,
        };
        let len = std::fs::metadata(path).map_err(io)?.len();
        if len > MAX_CONFIG_BYTES {
            return Err(ConfigError::FileTooLarge {
                path: shown,
                len,
                limit: MAX_CONFIG_BYTES,
            });
        }
        let text = std::fs::read_to_string(path).map_err(io)?;
        let cfg: Self = serde_json::from_str(&text).map_err(|source| ConfigError::Json {
            path: shown,
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses and validates a config held in memory.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let cfg: Self = serde_json::from_str(text).map_err(|source| ConfigError::Json {
            path: "<string>".into(),
            source,
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Number of Pixtral layers whose output the projector reads (`vision_feature_layer`
    /// counts hidden states, index 0 being the ln_pre output).
    pub fn vision_layers_used(&self) -> usize {
        let n = self.vision_config.num_hidden_layers as i64;
        let k = self.vision_feature_layer.as_i64().unwrap_or(-1);
        (if k < 0 { n + 1 + k } else { k }) as usize
    }

    /// Rejects what this implementation does not compute, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let unsupported = |field, value: String, reason| {
            Err(ConfigError::Unsupported {
                field,
                value,
                reason,
            })
        };
        // Bounds first: every size product below and in the model is then free of overflow.
        self.check_limits()?;
        let (t, v) = (&self.text_config, &self.vision_config);
        if self.model_type != "mistral3" {
            return unsupported(
                "model_type",
                self.model_type.clone(),
                "only mistral3 is supported",
            );
        }
        if t.model_type != "mistral" {
            return unsupported(
                "text_config.model_type",
                t.model_type.clone(),
                "the language model must be mistral",
            );
        }
        if v.model_type != "pixtral" {
            return unsupported(
                "vision_config.model_type",
                v.model_type.clone(),
                "the vision tower must be pixtral",
            );
        }
        // The Pixtral MLP computes every HiddenAct; the other two are fixed in the model.
        if t.hidden_act != HiddenAct::Silu {
            return unsupported(
                "text_config.hidden_act",
                t.hidden_act.to_string(),
                "the Mistral MLP is implemented as SwiGLU (silu) only",
            );
        }
        if self.projector_hidden_act != HiddenAct::Gelu {
            return unsupported(
                "projector_hidden_act",
                self.projector_hidden_act.to_string(),
                "the projector supports the exact (erf) gelu only",
            );
        }
        if self.multimodal_projector_bias {
            return unsupported(
                "multimodal_projector_bias",
                "true".into(),
                "projector biases are not implemented",
            );
        }
        if t.rope_scaling.as_ref().is_some_and(|s| !s.is_null()) {
            return unsupported(
                "text_config.rope_scaling",
                t.rope_scaling
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                "only unscaled RoPE is implemented",
            );
        }
        for (field, p, ok) in [
            (
                "text_config.rope_parameters.rope_type",
                &t.rope_parameters,
                "default",
            ),
            (
                "vision_config.rope_parameters.rope_type",
                &v.rope_parameters,
                "axial",
            ),
        ] {
            if let Some(kind) = p.as_ref().and_then(|p| p.rope_type.as_deref()) {
                if kind != ok && kind != "default" {
                    return unsupported(field, kind.into(), "only plain RoPE is implemented");
                }
            }
        }
        let layer = &self.vision_feature_layer;
        let n = v.num_hidden_layers as i64;
        match layer.as_i64() {
            Some(k) if (-n - 1..=n).contains(&k) => {}
            _ => {
                return unsupported(
                    "vision_feature_layer",
                    layer.to_string(),
                    "must be one integer layer index within the vision tower",
                )
            }
        }
        self.check_sizes()
    }

    fn check_sizes(&self) -> Result<(), ConfigError> {
        let (t, v) = (&self.text_config, &self.vision_config);
        let bad = |s: String| Err(ConfigError::Inconsistent(s));
        let positive = [
            ("text_config.vocab_size", t.vocab_size),
            ("text_config.hidden_size", t.hidden_size),
            ("text_config.intermediate_size", t.intermediate_size),
            ("text_config.num_attention_heads", t.num_attention_heads),
            ("text_config.num_key_value_heads", t.num_key_value_heads),
            ("text_config.head_dim", t.head_dim()),
            ("vision_config.hidden_size", v.hidden_size),
            ("vision_config.intermediate_size", v.intermediate_size),
            ("vision_config.num_attention_heads", v.num_attention_heads),
            ("vision_config.head_dim", v.head_dim()),
            ("vision_config.num_channels", v.num_channels),
            ("vision_config.patch_size", v.patch_size),
            ("spatial_merge_size", self.spatial_merge_size),
        ];
        for (name, value) in positive {
            if value == 0 {
                return bad(format!("{name} must be positive"));
            }
        }
        if t.num_attention_heads % t.num_key_value_heads != 0 {
            return bad(format!(
                "text num_attention_heads ({}) is not a multiple of num_key_value_heads ({})",
                t.num_attention_heads, t.num_key_value_heads
            ));
        }
        if t.head_dim() % 2 != 0 {
            return bad(format!(
                "text head_dim ({}) must be even for RoPE",
                t.head_dim()
            ));
        }
        if v.head_dim() % 4 != 0 {
            return bad(format!(
                "vision head_dim ({}) must be a multiple of 4 for the 2-D RoPE",
                v.head_dim()
            ));
        }
        if v.head_dim() * v.num_attention_heads != v.hidden_size {
            return bad(format!(
                "vision head_dim ({}) x heads ({}) != hidden_size ({})",
                v.head_dim(),
                v.num_attention_heads,
                v.hidden_size
            ));
        }
        if self.image_token_index as usize >= t.vocab_size {
            return bad(format!(
                "image_token_index {} is outside the vocabulary ({})",
                self.image_token_index, t.vocab_size
            ));
        }
        let positive_reals = [t.rms_norm_eps, t.rope_theta(), v.rope_theta()];
        if positive_reals.iter().any(|x| !x.is_finite() || *x <= 0.0) {
            return bad("rms_norm_eps and rope_theta must be positive".into());
        }
        Ok(())
    }
}

/// A small mistral3 config (no file needed): 2 vision layers, 2 text layers, vocab 64.
#[cfg(test)]
pub(crate) fn tiny_config() -> Mistral3Config {
    Mistral3Config::from_json(
        r#"{
        "model_type": "mistral3", "image_token_index": 10, "spatial_merge_size": 2,
        "projector_hidden_act": "gelu", "multimodal_projector_bias": false,
        "vision_feature_layer": -1,
        "text_config": {
            "model_type": "mistral", "vocab_size": 64, "hidden_size": 16,
            "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 4, "max_position_embeddings": 128,
            "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": null
        },
        "vision_config": {
            "model_type": "pixtral", "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 4,
            "num_channels": 3, "patch_size": 2, "image_size": 16, "rope_theta": 10000.0
        }
    }"#,
    )
    .unwrap()
}

#[cfg(test)]
mod tests;
