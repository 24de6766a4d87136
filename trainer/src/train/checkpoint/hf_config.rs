//! A transformers `config.json` for a [`Mistral3Config`], for runs whose model did not come
//! from a config file (a built-in preset): what a checkpoint stores and `cannon export` writes.
//!
//! Every field the model computes with is written, RoPE in both spellings (`rope_theta` for
//! transformers 4.x, `rope_parameters` for 5.x; 5.x prefers the latter, and they agree), and
//! `architectures` names `Mistral3ForConditionalGeneration` so `AutoModel*` picks the class.

use crate::model::Mistral3Config;
use serde_json::{json, Value};

/// The class transformers instantiates for a mistral3 checkpoint.
pub const ARCHITECTURE: &str = "Mistral3ForConditionalGeneration";

/// `config.json` for `cfg`.
pub fn hf_config_json(cfg: &Mistral3Config) -> Value {
    let (t, v) = (&cfg.text_config, &cfg.vision_config);
    let rope_type = |p: &Option<crate::model::config::RopeParameters>, dflt: &str| {
        p.as_ref()
            .and_then(|p| p.rope_type.clone())
            .unwrap_or_else(|| dflt.to_string())
    };
    json!({
        "architectures": [ARCHITECTURE],
        "model_type": cfg.model_type,
        "image_token_index": cfg.image_token_index,
        "spatial_merge_size": cfg.spatial_merge_size,
        "projector_hidden_act": cfg.projector_hidden_act.name(),
        "multimodal_projector_bias": cfg.multimodal_projector_bias,
        "vision_feature_layer": cfg.vision_feature_layer,
        "tie_word_embeddings": false,
        "text_config": {
            "model_type": t.model_type,
            "vocab_size": t.vocab_size,
            "hidden_size": t.hidden_size,
            "intermediate_size": t.intermediate_size,
            "num_hidden_layers": t.num_hidden_layers,
            "num_attention_heads": t.num_attention_heads,
            "num_key_value_heads": t.num_key_value_heads,
            "head_dim": t.head_dim(),
            "hidden_act": t.hidden_act.name(),
            "rms_norm_eps": t.rms_norm_eps,
            "rope_theta": t.rope_theta(),
            "rope_parameters": {
                "rope_theta": t.rope_theta(),
                "rope_type": rope_type(&t.rope_parameters, "default"),
            },
            "sliding_window": t.sliding_window,
            "max_position_embeddings": t.max_position_embeddings,
            "attention_dropout": 0.0,
            "tie_word_embeddings": false,
        },
        "vision_config": {
            "model_type": v.model_type,
            "hidden_size": v.hidden_size,
            "intermediate_size": v.intermediate_size,
            "num_hidden_layers": v.num_hidden_layers,
            "num_attention_heads": v.num_attention_heads,
            "head_dim": v.head_dim(),
            "num_channels": v.num_channels,
            "image_size": v.image_size,
            "patch_size": v.patch_size,
            "hidden_act": v.hidden_act.name(),
            "rope_theta": v.rope_theta(),
            "rope_parameters": {
                "rope_theta": v.rope_theta(),
                "rope_type": rope_type(&v.rope_parameters, "default"),
            },
            "attention_dropout": 0.0,
        },
    })
}

/// `config` (a checkpoint's model config) as an export writes it: the class named, the
/// dtype the tensors are stored in (transformers 5.x loads in the config's `dtype` by
/// default, so a stale `bfloat16` over f32 tensors would silently round them), and the
/// embedding and lm_head untied.
pub fn export_config(config: &Value, dtype: &str) -> Value {
    let mut c = config.clone();
    if let Some(obj) = c.as_object_mut() {
        obj.entry("architectures")
            .or_insert_with(|| json!([ARCHITECTURE]));
        obj.remove("torch_dtype");
        obj.insert("dtype".into(), json!(dtype));
        // The model's lm_head is its own tensor: a config that leaves tying to the class
        // default (true in transformers 5) would make transformers tie it to the embedding.
        obj.insert("tie_word_embeddings".into(), json!(false));
        if let Some(text) = obj.get_mut("text_config").and_then(|t| t.as_object_mut()) {
            text.insert("tie_word_embeddings".into(), json!(false));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const TINY: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/reference/mistral3-tiny/config.json"
    );

    /// The written config reads back to the same model, field by field, and carries every
    /// key of the reference checkpoint's config.json that the model computes with.
    #[test]
    fn written_config_reads_back_to_the_same_model() {
        let path = std::path::Path::new(TINY);
        if !path.is_file() {
            panic!(
                "missing ../shared/reference/mistral3-tiny/config.json (looked at {}): the \
                 shared fixtures live beside the project (see README)",
                path.display()
            );
        }
        let cfg = Mistral3Config::from_file(path).unwrap();
        let json = hf_config_json(&cfg);
        let back = Mistral3Config::from_json(&json.to_string()).unwrap();
        let (t, b) = (&cfg.text_config, &back.text_config);
        assert_eq!(
            (
                t.vocab_size,
                t.hidden_size,
                t.intermediate_size,
                t.num_hidden_layers
            ),
            (
                b.vocab_size,
                b.hidden_size,
                b.intermediate_size,
                b.num_hidden_layers
            )
        );
        assert_eq!(
            (
                t.num_attention_heads,
                t.num_key_value_heads,
                t.head_dim(),
                t.sliding_window
            ),
            (
                b.num_attention_heads,
                b.num_key_value_heads,
                b.head_dim(),
                b.sliding_window
            )
        );
        assert_eq!(
            (t.rms_norm_eps, t.rope_theta()),
            (b.rms_norm_eps, b.rope_theta())
        );
        let (v, w) = (&cfg.vision_config, &back.vision_config);
        assert_eq!(
            (
                v.hidden_size,
                v.intermediate_size,
                v.num_hidden_layers,
                v.num_attention_heads
            ),
            (
                w.hidden_size,
                w.intermediate_size,
                w.num_hidden_layers,
                w.num_attention_heads
            )
        );
        assert_eq!(
            (
                v.head_dim(),
                v.patch_size,
                v.image_size,
                v.hidden_act,
                v.rope_theta()
            ),
            (
                w.head_dim(),
                w.patch_size,
                w.image_size,
                w.hidden_act,
                w.rope_theta()
            )
        );
        assert_eq!(cfg.image_token_index, back.image_token_index);
        assert_eq!(cfg.vision_layers_used(), back.vision_layers_used());

        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for (section, keys) in [
            (
                None,
                vec![
                    "model_type",
                    "image_token_index",
                    "spatial_merge_size",
                    "projector_hidden_act",
                ],
            ),
            (
                Some("text_config"),
                vec![
                    "vocab_size",
                    "hidden_size",
                    "head_dim",
                    "rope_parameters",
                    "sliding_window",
                ],
            ),
            (
                Some("vision_config"),
                vec!["hidden_size", "patch_size", "hidden_act", "rope_parameters"],
            ),
        ] {
            let (r, j) = match section {
                Some(s) => (&reference[s], &json[s]),
                None => (&reference, &json),
            };
            for k in keys {
                assert_eq!(r[k], j[k], "{section:?}.{k}");
            }
        }
    }

    #[test]
    fn export_config_names_the_class_the_dtype_and_no_tying() {
        let c = export_config(
            &json!({"model_type": "mistral3", "torch_dtype": "bfloat16", "dtype": "bfloat16",
                    "text_config": {"model_type": "mistral"}}),
            "float32",
        );
        assert_eq!(c["tie_word_embeddings"], false);
        assert_eq!(c["text_config"]["tie_word_embeddings"], false);
        assert_eq!(c["architectures"][0], ARCHITECTURE);
        assert_eq!(c["dtype"], "float32");
        assert!(c.get("torch_dtype").is_none());
    }
}
