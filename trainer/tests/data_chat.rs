//! Magistral's data as mistral-common makes it: `cannon data show --json` against the token ids
//! mistral-common's `InstructTokenizerV13.encode_instruct` gives for the conversations of
//! `../shared/reference/chat` (images, system prompts, several turns, thinking), the labels of
//! those ids, a model folder's tokenizer, vocabulary and system prompt, and the tekken file
//! versions.

mod common;
use common::{scratch, shared_path, tiny_vlm_config_json};

use cannon_trainer::train::config::TrainConfig;
use cannon_trainer::train::data::template::{encode_turns, Message, Role, SpecialIds};
use cannon_trainer::train::data::truncate::{assemble, LabelPolicy};
use cannon_trainer::train::data::{DataError, Tekken};
use cannon_trainer::train::samples::SampleSetup;
use cannon_trainer::train::ResolvedRun;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");
const IGNORE: i64 = -100;

fn chat(rel: &str) -> PathBuf {
    shared_path(&format!("reference/chat/{rel}"))
}

fn reference() -> Vec<Value> {
    let raw = std::fs::read_to_string(chat("reference.json")).unwrap();
    let r: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(r["tokenizer"], "tekken_v13.json");
    r["records"].as_array().unwrap().clone()
}

/// Runs `cannon data show ... --json`; its JSON lines and exit code.
fn show_json(args: &[&str]) -> (Vec<Value>, Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["data", "show", "--json"])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (
        lines,
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn ids(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

/// The labels mistral-common's ids call for: every answer, from after its `[/INST]` up to and
/// with its `</s>`, trained (its thinking included); everything else not.
fn answer_labels(input: &[i64]) -> Vec<i64> {
    const INST_END: i64 = 4;
    const EOS: i64 = 2;
    let mut in_answer = false;
    input
        .iter()
        .map(|&t| {
            let l = if in_answer { t } else { IGNORE };
            if t == INST_END {
                in_answer = true;
            } else if t == EOS {
                in_answer = false;
            }
            l
        })
        .collect()
}

/// The acceptance: every record's ids and image sizes equal mistral-common's, exactly;
/// the labels train the answers and their EOS only.
#[test]
fn data_show_json_reproduces_mistral_common() {
    let dataset = chat("dataset.jsonl");
    let tokenizer = chat("tekken_v13.json");
    let (got, code, err) = show_json(&[
        "--dataset",
        dataset.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--all",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let want = reference();
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let input = ids(&g["input_ids"]);
        assert_eq!(input, ids(&w["input_ids"]), "record {}", i + 1);
        assert_eq!(g["image_sizes"], w["image_grids"], "record {}", i + 1);
        assert_eq!(ids(&g["labels"]), answer_labels(&input), "record {}", i + 1);
    }
    // One record alone is the same object.
    let (one, code, _) = show_json(&[
        "--dataset",
        dataset.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--index",
        "4",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(one, vec![got[3].clone()]);
}

/// The readable form: special tokens spelled out, image grids, trained spans marked.
#[test]
fn data_show_prints_the_text_grids_and_trained_spans() {
    let out = Command::new(BIN)
        .args(["data", "show", "--dataset"])
        .arg(chat("dataset.jsonl"))
        .arg("--tokenizer")
        .arg(chat("tekken_v13.json"))
        .args(["--index", "1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    // 100x60 -> 112x84 px: 4 tokens wide, 3 high.
    assert!(
        text.contains("<s>[INST][IMG] x 4 x 3What colour is the circle?[/INST]«Red.</s>»"),
        "{text}"
    );
    assert!(text.contains("1 image (112x84 px)"), "{text}");
    // A record that is not there is an error naming it.
    let out = Command::new(BIN)
        .args(["data", "show", "--dataset"])
        .arg(chat("dataset.jsonl"))
        .arg("--tokenizer")
        .arg(chat("tekken_v13.json"))
        .args(["--index", "9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no record 9"));
}

/// A Magistral-like model folder: config.json, tekken.json and SYSTEM_PROMPT.txt.
fn model_folder(name: &str, vocab: u32, prompt: Option<&str>) -> PathBuf {
    let d = scratch("data-chat", name);
    let cfg =
        tiny_vlm_config_json(10, vocab, 1).replace("\"image_size\": 112", "\"image_size\": 1540");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    std::fs::copy(chat("tekken_v13.json"), d.join("tekken.json")).unwrap();
    if let Some(p) = prompt {
        std::fs::write(d.join("SYSTEM_PROMPT.txt"), p).unwrap();
    }
    d
}

fn resolve(sets: &[String]) -> Result<SampleSetup, String> {
    let cfg = TrainConfig::load(None, sets).map_err(|e| e.to_string())?;
    let plan = ResolvedRun::resolve(cfg, None).map_err(|e| e.to_string())?;
    SampleSetup::new(&plan).map_err(|e| e.to_string())
}

fn dir_set(d: &Path) -> String {
    format!("model.config={:?}", d.display().to_string())
}

/// `data.system = "model"` reads the folder's SYSTEM_PROMPT.txt, its `[THINK]...[/THINK]` span
/// as the think tokens (as Magistral's model card loads it); the tokenizer is the folder's.
#[test]
fn model_folder_gives_the_tokenizer_and_the_system_prompt() {
    let prompt = "First draft your thinking.\n[THINK]Your thoughts.[/THINK]Here, a response.";
    let d = model_folder("prompt", 131072, Some(prompt));
    let (got, code, err) = show_json(&[
        "--dataset",
        chat("dataset.jsonl").to_str().unwrap(),
        "--model",
        d.to_str().unwrap(),
        "--system",
        "model",
        "--index",
        "3",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let tok = Tekken::from_file(chat("tekken_v13.json"), None).unwrap();
    let enc = |s: &str| tok.encode(s, false, false).into_iter().map(i64::from);
    let mut want = vec![1, 17];
    want.extend(enc("First draft your thinking.\n"));
    want.push(34);
    want.extend(enc("Your thoughts."));
    want.push(35);
    want.extend(enc("Here, a response."));
    want.push(18);
    // Record 3 has no system message of its own: the rest is mistral-common's ids after BOS.
    want.extend(ids(&reference()[2]["input_ids"]).into_iter().skip(1));
    assert_eq!(ids(&got[0]["input_ids"]), want);

    // Without the file: an error naming it.
    let bare = model_folder("bare", 131072, None);
    let e = resolve(&[dir_set(&bare), "data.system=\"model\"".into()]).unwrap_err();
    assert!(
        e.contains("SYSTEM_PROMPT.txt") && e.contains("data.system"),
        "{e}"
    );
    // A literal prompt stays a literal.
    let s = resolve(&[dir_set(&bare), "data.system=\"Be brief.\"".into()]).unwrap();
    assert_eq!(s.system.as_deref(), Some("Be brief."));
    // The preset has no folder to read it from.
    let e = TrainConfig::load(None, &["data.system=\"model\"".into()])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.system"), "{e}");
}

/// The silent 1,280-id run: a folder's run takes the model's vocabulary and the
/// folder's tokenizer, and the images the model's 1540 px; a tokenizer whose image section
/// disagrees with the model is an error naming both; a pretrained model with a smaller
/// vocabulary is an error unless asked for (then a warning).
#[test]
fn a_model_folder_run_takes_its_vocabulary_and_images_from_the_model() {
    let d = model_folder("vocab", 32768, None);
    let s = resolve(&[dir_set(&d)]).unwrap();
    assert_eq!(s.tok.vocab_size(), 32768);
    assert_eq!(s.mcfg.text_config.vocab_size, 32768);
    assert_eq!(
        (s.image.longest_edge, s.image.patch_size, s.image.merge_size),
        (1540, 14, 2)
    );
    assert!(s.image.round_to_merged_patch);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    // The tokenizer with more ids than the model: cut to the model's.
    assert!(
        Tekken::from_file(chat("tekken_v13.json"), None)
            .unwrap()
            .vocab_size()
            > 32768
    );

    // The seed's pixel limits are config keys.
    let s = resolve(&[
        dir_set(&d),
        "data.image_max_pixels=262144".into(),
        "data.image_min_pixels=1024".into(),
    ])
    .unwrap();
    assert_eq!(
        (s.image.max_pixels, s.image.min_pixels),
        (Some(262144), Some(1024))
    );

    // A model of another patch size than the tokenizer's image section.
    let other = model_folder("patch", 32768, None);
    let cfg = std::fs::read_to_string(other.join("config.json"))
        .unwrap()
        .replace("\"patch_size\": 14", "\"patch_size\": 16");
    std::fs::write(other.join("config.json"), cfg).unwrap();
    let e = resolve(&[dir_set(&other)]).unwrap_err();
    assert!(
        e.contains("16")
            && e.contains("14")
            && e.contains("tekken.json")
            && e.contains("config.json"),
        "{e}"
    );

    // A pretrained model of 200000 ids with a 131072-id tokenizer: an error...
    let big = model_folder("big", 200_000, None);
    let weights = format!("model.weights={:?}", big.display().to_string());
    let e = resolve(&[dir_set(&big), weights.clone()]).unwrap_err();
    assert!(e.contains("131072") && e.contains("200000"), "{e}");
    // ...unless data.vocab_size says so: then a warning. From random weights it is neither.
    let s = resolve(&[dir_set(&big), weights, "data.vocab_size=131072".into()]).unwrap();
    assert!(
        s.warnings.iter().any(|w| w.contains("131072")),
        "{:?}",
        s.warnings
    );
    let s = resolve(&[dir_set(&big)]).unwrap();
    assert!(s.warnings.is_empty());

    // The preset keeps its own defaults.
    let s = resolve(&[]).unwrap();
    assert_eq!(s.tok.vocab_size(), 1280);
    assert_eq!(s.image.longest_edge, 112);
}

fn tekken_variant(name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(chat("tekken_v13.json")).unwrap()).unwrap();
    edit(&mut v);
    let d = scratch("data-chat-tekken", name);
    let p = d.join("tekken.json");
    std::fs::write(&p, serde_json::to_vec(&v).unwrap()).unwrap();
    p
}

/// v13: explicit special tokens (with `<SPECIAL_n>` fillers), [THINK], the image section;
/// what mistral-common refuses is refused with the file named.
#[test]
fn tekken_files_of_v3_to_v13_load_and_bad_ones_are_named() {
    let t = Tekken::from_file(chat("tekken_v13.json"), None).unwrap();
    assert_eq!(t.version(), Some("v13"));
    assert_eq!(
        (t.special_id("[THINK]"), t.special_id("[/THINK]")),
        (Some(34), Some(35))
    );
    assert_eq!(t.special_str(20), Some("<SPECIAL_20>"));
    let img = t.image_config().unwrap();
    assert_eq!(
        (
            img.image_patch_size,
            img.spatial_merge_size,
            img.max_image_size
        ),
        (14, 2, 1540)
    );
    // The v3 file of the project: the 20 default special tokens, no [THINK].
    let v3 = Tekken::from_file(common::tekken(), Some(1280)).unwrap();
    assert_eq!(v3.special_id("[TOOL_CONTENT]"), Some(19));
    assert_eq!(v3.special_id("[THINK]"), None);
    // A v11 file may call its image section `multimodal`; a v13 file may not.
    let v11 = tekken_variant("v11", |v| {
        v["config"]["version"] = "v11".into();
        let img = v.as_object_mut().unwrap().remove("image").unwrap();
        v["multimodal"] = img;
    });
    assert!(Tekken::from_file(&v11, None)
        .unwrap()
        .image_config()
        .is_some());
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let bad: [(&str, Edit, &str); 3] = [
        (
            "nospecial",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("special_tokens");
            }),
            "special_tokens",
        ),
        (
            "future",
            Box::new(|v| v["config"]["version"] = "v99".into()),
            "v99",
        ),
        (
            "multimodal13",
            Box::new(|v| {
                let img = v.as_object_mut().unwrap().remove("image").unwrap();
                v["multimodal"] = img;
            }),
            "multimodal",
        ),
    ];
    for (name, edit, want) in bad {
        let p = tekken_variant(name, edit);
        let e = Tekken::from_file(&p, None).unwrap_err();
        assert!(matches!(e, DataError::Tokenizer { .. }), "{name}: {e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains(want) && msg.contains("tekken.json"),
            "{name}: {msg}"
        );
    }
}

/// `reasoning_content` is the same answer as an opening `<think>...</think>`; a tokenizer
/// without the think tokens keeps the thinking as text rather than dropping it.
#[test]
fn reasoning_content_is_thinking_too() {
    let t13 = Tekken::from_file(chat("tekken_v13.json"), None).unwrap();
    let v3 = Tekken::from_file(common::tekken(), None).unwrap();
    let user = Message::new(Role::User, "Why?");
    let inline = Message::new(Role::Assistant, "<think>Because.</think>So. ");
    let apart = Message {
        reasoning: Some("Because.".into()),
        ..Message::new(Role::Assistant, "So. ")
    };
    for tok in [&t13, &v3] {
        let ids = SpecialIds::from_tekken(tok).unwrap();
        let a = encode_turns(tok, &ids, &[user.clone(), inline.clone()], None, &[]);
        let b = encode_turns(tok, &ids, &[user.clone(), apart.clone()], None, &[]);
        assert_eq!(a, b);
    }
    let ids = SpecialIds::from_tekken(&t13).unwrap();
    let a = encode_turns(&t13, &ids, &[user.clone(), apart.clone()], None, &[]);
    let mut want = vec![34];
    want.extend(t13.encode("Because.", false, false));
    want.push(35);
    // Content chunks keep their trailing space (mistral-common strips plain answers only).
    want.extend(t13.encode("So. ", false, false));
    want.push(2);
    assert_eq!(a[0].target, want);
}

/// LLaMA-Factory's `train_on_prompt` and `mask_history` on a two-turn conversation.
#[test]
fn train_on_prompt_and_mask_history_choose_the_trained_tokens() {
    let tok = Tekken::from_file(chat("tekken_v13.json"), None).unwrap();
    let ids = SpecialIds::from_tekken(&tok).unwrap();
    let msgs = [
        Message::new(Role::User, "One?"),
        Message::new(Role::Assistant, "Yes, one."),
        Message::new(Role::User, "Two?"),
        Message::new(Role::Assistant, "Yes, two."),
    ];
    let turns = encode_turns(&tok, &ids, &msgs, None, &[]);
    let all: Vec<i32> = turns
        .iter()
        .flat_map(|t| t.source.iter().chain(&t.target))
        .map(|&x| x as i32)
        .collect();
    let policy = |train_on_prompt, mask_history| LabelPolicy {
        train_on_prompt,
        mask_history,
    };
    let plain = assemble(&turns, 1024, policy(false, false));
    let prompt = assemble(&turns, 1024, policy(true, false));
    assert_eq!(prompt.labels, all, "every token trained");
    assert_eq!(prompt.input_ids, plain.input_ids);
    let last = assemble(&turns, 1024, policy(false, true));
    let n0 = turns[0].source.len() + turns[0].target.len();
    assert!(
        last.labels[..n0].iter().all(|&l| l == -100),
        "history masked"
    );
    assert_eq!(
        last.labels[n0..],
        plain.labels[n0..],
        "the last answer trained"
    );
    // Truncated, the budget goes to the last turn first under mask_history: it stays whole.
    let n1 = turns[1].source.len() + turns[1].target.len();
    let cut = assemble(&turns, n1 + 2, policy(false, true));
    assert!(cut.truncated);
    let tail = &cut.input_ids[cut.input_ids.len() - n1..];
    assert_eq!(tail, [&turns[1].source[..], &turns[1].target[..]].concat());
    let cut = assemble(&turns, n1 + 2, policy(false, false));
    assert_eq!(
        &cut.input_ids[..n0.min(n1 + 2)],
        &all.iter().map(|&x| x as u32).collect::<Vec<_>>()[..n0.min(n1 + 2)]
    );
}

/// A run from a model folder carries the folder's tokenizer and system prompt on: the final
/// model, the checkpoint and its export hold them, so a fine-tuned Magistral is a folder the
/// next run (or a server) reads them from.
#[test]
fn a_fine_tuned_folder_keeps_the_tokenizer_and_the_system_prompt() {
    let prompt = "Be brief.[THINK]Short thoughts.[/THINK]Short answer.";
    let model = model_folder("tuned-src", 131072, Some(prompt));
    let run = scratch("data-chat", "tuned-run");
    let dataset = chat("dataset.jsonl");
    let quoted = |p: &Path| format!("{:?}", p.display().to_string());
    let out = Command::new(BIN)
        .arg("train")
        .args(["--set", &format!("model.config={}", quoted(&model))])
        .args(["--set", &format!("data.dataset={}", quoted(&dataset))])
        .args(["--set", "data.system=\"model\""])
        .args(["--set", "train.steps=1", "--set", "train.micro_batch=2"])
        .args(["--set", "checkpoint.every=1"])
        .args(["--set", &format!("log.dir={}", quoted(&run))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // The first sample is printed, with the folder's system prompt in it.
    assert!(
        err.contains("first sample") && err.contains("[SYSTEM_PROMPT]Be brief.[THINK]"),
        "{err}"
    );
    let export = run.join("export");
    let out = Command::new(BIN)
        .args(["export", "--checkpoint"])
        .arg(run.join("checkpoints"))
        .arg("--out")
        .arg(&export)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tekken = std::fs::read(model.join("tekken.json")).unwrap();
    for dir in [run.join("final"), export.clone()] {
        assert_eq!(
            std::fs::read(dir.join("tekken.json")).unwrap(),
            tekken,
            "{}",
            dir.display()
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("SYSTEM_PROMPT.txt")).unwrap(),
            prompt,
            "{}",
            dir.display()
        );
    }
    // The export reads its samples as the original folder does.
    let show = |m: &Path| {
        show_json(&[
            "--dataset",
            dataset.to_str().unwrap(),
            "--model",
            m.to_str().unwrap(),
            "--system",
            "model",
            "--all",
        ])
    };
    let (a, code, e) = show(&model);
    assert_eq!(code, Some(0), "{e}");
    assert_eq!(show(&export).0, a);
}
