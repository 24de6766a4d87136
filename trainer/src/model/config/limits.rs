//! The largest sizes a `config.json` may give. A config is a file users download: a size far
//! past any published model is a corrupt or hostile file, and without a bound its products
//! wrap (a 10^12 `hidden_size` squared overflows 64 bits) or size an allocation that aborts
//! the process. Each limit is far above the largest published model's value (Llama 3.1 405B:
//! hidden 16384, intermediate 53248, 126 layers; Magistral-Small-2509 is in
//! ../shared/bench/magistral-small-2509), so no real config meets one; within them every
//! product below fits 64 bits with room to spare.

use super::{ConfigError, Mistral3Config};

/// Model width (text and vision `hidden_size`).
pub const MAX_HIDDEN: usize = 1 << 17;
/// MLP width (`intermediate_size`).
pub const MAX_INTERMEDIATE: usize = 1 << 20;
/// Layers of either tower.
pub const MAX_LAYERS: usize = 1 << 12;
/// Attention heads (query or key/value) of either tower.
pub const MAX_HEADS: usize = 1 << 12;
/// Width of one head.
pub const MAX_HEAD_DIM: usize = 1 << 12;
/// Vocabulary (Tekken's is 131072).
pub const MAX_VOCAB: usize = 1 << 24;
/// Image side in pixels, and position counts: sizes tables of that many rows.
pub const MAX_IMAGE_SIZE: usize = 1 << 16;
pub const MAX_POSITIONS: usize = 1 << 30;
/// Pixtral's patch side, image channels and the projector's merge factor.
pub const MAX_PATCH: usize = 1 << 10;
pub const MAX_CHANNELS: usize = 64;
pub const MAX_MERGE: usize = 64;
/// Parameters of the whole model: 2^42 (4.4 T) is twice the largest model trained anywhere;
/// past it a config is no model this trainer could shard.
pub const MAX_PARAMS: u64 = 1 << 42;

impl Mistral3Config {
    /// Every size against its limit, then the parameter count computed with checked
    /// arithmetic: before any shape product is formed anywhere else.
    pub(super) fn check_limits(&self) -> Result<(), ConfigError> {
        let (t, v) = (&self.text_config, &self.vision_config);
        let sizes = [
            ("text_config.vocab_size", t.vocab_size, MAX_VOCAB),
            ("text_config.hidden_size", t.hidden_size, MAX_HIDDEN),
            (
                "text_config.intermediate_size",
                t.intermediate_size,
                MAX_INTERMEDIATE,
            ),
            (
                "text_config.num_hidden_layers",
                t.num_hidden_layers,
                MAX_LAYERS,
            ),
            (
                "text_config.num_attention_heads",
                t.num_attention_heads,
                MAX_HEADS,
            ),
            (
                "text_config.num_key_value_heads",
                t.num_key_value_heads,
                MAX_HEADS,
            ),
            (
                "text_config.head_dim",
                t.head_dim.unwrap_or(0),
                MAX_HEAD_DIM,
            ),
            (
                "text_config.max_position_embeddings",
                t.max_position_embeddings,
                MAX_POSITIONS,
            ),
            (
                "text_config.sliding_window",
                t.sliding_window.unwrap_or(0),
                MAX_POSITIONS,
            ),
            ("vision_config.hidden_size", v.hidden_size, MAX_HIDDEN),
            (
                "vision_config.intermediate_size",
                v.intermediate_size,
                MAX_INTERMEDIATE,
            ),
            (
                "vision_config.num_hidden_layers",
                v.num_hidden_layers,
                MAX_LAYERS,
            ),
            (
                "vision_config.num_attention_heads",
                v.num_attention_heads,
                MAX_HEADS,
            ),
            (
                "vision_config.head_dim",
                v.head_dim.unwrap_or(0),
                MAX_HEAD_DIM,
            ),
            ("vision_config.num_channels", v.num_channels, MAX_CHANNELS),
            ("vision_config.image_size", v.image_size, MAX_IMAGE_SIZE),
            ("vision_config.patch_size", v.patch_size, MAX_PATCH),
            ("spatial_merge_size", self.spatial_merge_size, MAX_MERGE),
        ];
        for (field, value, limit) in sizes {
            if value > limit {
                return Err(ConfigError::TooLarge {
                    field,
                    value: value as u64,
                    limit: limit as u64,
                });
            }
        }
        let params = self.param_count().ok_or(ConfigError::TooLarge {
            field: "the parameter count",
            value: u64::MAX,
            limit: MAX_PARAMS,
        })?;
        if params > MAX_PARAMS {
            return Err(ConfigError::TooLarge {
                field: "the parameter count",
                value: params,
                limit: MAX_PARAMS,
            });
        }
        Ok(())
    }

    /// The model's parameters as [`crate::model::ParamLayout`] lays them out, in checked
    /// arithmetic (`None` past u64).
    pub fn param_count(&self) -> Option<u64> {
        let (t, v) = (&self.text_config, &self.vision_config);
        let u = |x: usize| x as u64;
        let mul = |a: u64, b: u64| a.checked_mul(b);
        let (d, it, vocab) = (u(t.hidden_size), u(t.intermediate_size), u(t.vocab_size));
        let hd = u(t.head_dim());
        let (q, kv) = (
            mul(u(t.num_attention_heads), hd)?,
            mul(u(t.num_key_value_heads), hd)?,
        );
        let (dv, iv) = (u(v.hidden_size), u(v.intermediate_size));
        let dv_attn = mul(u(v.num_attention_heads), u(v.head_dim()))?;
        let m2 = mul(u(self.spatial_merge_size), u(self.spatial_merge_size))?;
        let p2 = mul(u(v.patch_size), u(v.patch_size))?;
        let sum = |xs: &[Option<u64>]| {
            xs.iter()
                .try_fold(0u64, |acc, x| x.and_then(|x| acc.checked_add(x)))
        };
        // Each line is one group of the layout (params.rs), tensor by tensor.
        let vision_embed = sum(&[mul(dv, mul(u(v.num_channels), p2)?), Some(dv)])?;
        let vision_layer = sum(&[
            Some(2 * dv),
            mul(4, mul(dv_attn, dv)?),
            mul(3, mul(iv, dv)?),
        ])?;
        let projector = sum(&[Some(dv), mul(dv, mul(dv, m2)?), mul(d, dv), mul(d, d)])?;
        let text_layer = sum(&[
            Some(2 * d),
            mul(2, mul(q, d)?),
            mul(2, mul(kv, d)?),
            mul(3, mul(it, d)?),
        ])?;
        let embeddings = mul(2, mul(vocab, d)?)?;
        sum(&[
            Some(vision_embed),
            mul(u(v.num_hidden_layers), vision_layer),
            Some(projector),
            mul(u(t.num_hidden_layers), text_layer),
            Some(embeddings),
            Some(d),
        ])
    }
}
