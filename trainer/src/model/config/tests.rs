//! Config parsing: both RoPE spellings, transformers' defaults, and the errors that name
//! the field.

use super::*;

const SHARED: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/reference/mistral3-tiny/config.json"
);

fn shared_json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(SHARED).unwrap()).unwrap()
}

fn parse(v: &serde_json::Value) -> Result<Mistral3Config, ConfigError> {
    Mistral3Config::from_json(&v.to_string())
}

#[test]
fn shared_fixture_config_reads_5x_rope_parameters() {
    let cfg = Mistral3Config::from_file(Path::new(SHARED)).unwrap();
    assert_eq!(cfg.text_config.rope_theta(), 1e6);
    assert_eq!(cfg.vision_config.rope_theta(), 1e4);
    assert_eq!(cfg.text_config.head_dim(), 16);
    assert_eq!(cfg.vision_config.hidden_act, HiddenAct::Silu);
    assert_eq!(cfg.vision_layers_used(), 2);
    assert_eq!(cfg.text_config.sliding_window, None);
}

#[test]
fn legacy_rope_theta_and_defaults() {
    let mut v = shared_json();
    let t = v["text_config"].as_object_mut().unwrap();
    t.remove("rope_parameters");
    t.remove("head_dim");
    t.remove("sliding_window");
    t.remove("rms_norm_eps");
    t.insert("rope_theta".into(), 5e5.into());
    let vis = v["vision_config"].as_object_mut().unwrap();
    vis.remove("rope_parameters");
    vis.remove("hidden_act");
    vis.insert("rope_theta".into(), 123.0.into());
    v.as_object_mut().unwrap().remove("image_token_index");
    v.as_object_mut()
        .unwrap()
        .insert("image_token_id".into(), 11.into());
    let cfg = parse(&v).unwrap();
    assert_eq!(cfg.text_config.rope_theta(), 5e5);
    assert_eq!(cfg.vision_config.rope_theta(), 123.0);
    // transformers' defaults: head_dim = hidden/heads, MistralConfig's window and eps,
    // Pixtral's gelu.
    assert_eq!(cfg.text_config.head_dim(), 48 / 4);
    assert_eq!(cfg.text_config.sliding_window, Some(4096));
    assert_eq!(cfg.text_config.rms_norm_eps, 1e-6);
    assert_eq!(cfg.vision_config.hidden_act, HiddenAct::Gelu);
    assert_eq!(cfg.image_token_index, 11);
}

fn expect_err(v: &serde_json::Value, needle: &str) {
    let err = parse(v).unwrap_err().to_string();
    assert!(
        err.contains(needle),
        "error {err:?} should mention {needle:?}"
    );
}

#[test]
fn unsupported_and_inconsistent_configs_are_named_errors() {
    let mut v = shared_json();
    v["model_type"] = "llava".into();
    expect_err(&v, "model_type");

    let mut v = shared_json();
    v["text_config"]["hidden_act"] = "gelu".into();
    expect_err(&v, "text_config.hidden_act");

    let mut v = shared_json();
    v["text_config"]["num_key_value_heads"] = 3.into();
    expect_err(&v, "num_key_value_heads");

    let mut v = shared_json();
    v["vision_config"]["head_dim"] = 12.into();
    expect_err(&v, "vision head_dim");

    let mut v = shared_json();
    v["text_config"]["rope_parameters"]["rope_type"] = "yarn".into();
    expect_err(&v, "rope_type");

    let mut v = shared_json();
    v["vision_feature_layer"] = serde_json::json!([-1, -2]);
    expect_err(&v, "vision_feature_layer");

    let mut v = shared_json();
    v["text_config"]["vocab_size"] = 8.into();
    expect_err(&v, "image_token_index");
}

/// An activation the model does not compute fails when the config is read, and the error
/// names the field and the value (serde alone would give only a line and column).
#[test]
fn unknown_activations_fail_at_load_naming_field_and_value() {
    for (path, value) in [
        (&["vision_config", "hidden_act"][..], "gelu_pytorch_tanh"),
        (&["text_config", "hidden_act"][..], "gelu_new"),
        (&["projector_hidden_act"][..], "relu"),
        (&["vision_config", "hidden_act"][..], "not_an_activation"),
    ] {
        let mut v = shared_json();
        let mut slot = &mut v;
        for key in path {
            slot = &mut slot[*key];
        }
        *slot = value.into();
        let err = parse(&v).unwrap_err();
        assert!(matches!(err, ConfigError::Json { .. }), "{err:?}");
        let msg = err.to_string();
        let field = path.join(".");
        assert!(msg.contains(&field), "{msg:?} should name {field}");
        assert!(msg.contains(value), "{msg:?} should name {value}");
    }
}

/// A known activation in a place the model fixes to another one is a named Unsupported error;
/// "swish" is transformers' other name for SiLU.
#[test]
fn activations_per_field() {
    let mut v = shared_json();
    v["projector_hidden_act"] = "silu".into();
    let err = parse(&v).unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Unsupported {
                field: "projector_hidden_act",
                ..
            }
        ),
        "{err:?}"
    );

    let mut v = shared_json();
    v["text_config"]["hidden_act"] = "swish".into();
    v["vision_config"]["hidden_act"] = "gelu".into();
    let cfg = parse(&v).unwrap();
    assert_eq!(cfg.text_config.hidden_act, HiddenAct::Silu);
    assert_eq!(cfg.vision_config.hidden_act, HiddenAct::Gelu);
    assert_eq!(cfg.projector_hidden_act, HiddenAct::Gelu);
}

/// Sizes past the limits are refused naming the field, before any product of them is formed
/// (a 10^12 hidden size squared wraps 64 bits; 10^9 layers would size a layout of 10^9 groups).
#[test]
fn sizes_past_the_limits_are_named_errors() {
    for (section, field, value) in [
        (
            "text_config",
            "hidden_size",
            serde_json::json!(1_000_000_000_000u64),
        ),
        (
            "text_config",
            "num_hidden_layers",
            serde_json::json!(1_000_000_000u64),
        ),
        ("text_config", "vocab_size", serde_json::json!(1u64 << 60)),
        ("text_config", "head_dim", serde_json::json!(1u64 << 40)),
        (
            "vision_config",
            "num_hidden_layers",
            serde_json::json!(u64::MAX),
        ),
        ("vision_config", "patch_size", serde_json::json!(1u64 << 33)),
    ] {
        let mut v = shared_json();
        v[section][field] = value.clone();
        let err = parse(&v).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{section}.{field} = {value}")) && err.contains("largest"),
            "{section}.{field}: {err}"
        );
    }
    let mut v = shared_json();
    v["spatial_merge_size"] = serde_json::json!(1u64 << 50);
    expect_err(&v, "spatial_merge_size");
}

/// Every size within its limit but the product past 2^42 parameters: the count is refused.
#[test]
fn a_parameter_count_past_the_limit_is_refused() {
    let mut v = shared_json();
    v["text_config"]["hidden_size"] = serde_json::json!(MAX_HIDDEN);
    v["text_config"]["intermediate_size"] = serde_json::json!(MAX_INTERMEDIATE);
    v["text_config"]["num_hidden_layers"] = serde_json::json!(MAX_LAYERS);
    v["text_config"]["head_dim"] = serde_json::json!(128);
    expect_err(&v, "the parameter count");
}

/// The checked count is the layout's own, on the tiny fixture and the real 24B config.
#[test]
fn param_count_equals_the_layout() {
    let big = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/bench/magistral-small-2509/config.json"
    );
    for path in [SHARED, big] {
        let cfg = Mistral3Config::from_file(Path::new(path)).unwrap();
        let layout = crate::model::ParamLayout::new(&cfg);
        assert_eq!(
            cfg.param_count(),
            Some(layout.num_params() as u64),
            "{path}"
        );
    }
}

#[test]
fn a_file_past_a_megabyte_is_not_read() {
    let dir = std::env::temp_dir().join(format!("cannon-config-big-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("config.json");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(MAX_CONFIG_BYTES + 1).unwrap();
    let err = Mistral3Config::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("is not a config.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
