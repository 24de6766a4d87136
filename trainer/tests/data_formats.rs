//! Datasets as users have them: a JSON array (LLaMA-Factory's `mllm_demo.json`, MindSpeed-MM's
//! llava instruct file) reads like the same records as JSONL; ShareGPT `conversations` read like
//! `messages`; a LLaMA-Factory `dataset_info.json` picks a dataset by name and maps its
//! columns and tags; multi-turn samples train every answer. Fixture files are written here.

mod common;
use common::shared_path;

use cannon_kernels::cross_entropy::IGNORE_INDEX as IGNORE;
use cannon_trainer::train::data::dataset::{DataSet, Prepared, SampleSettings};
use cannon_trainer::train::data::image::{image_block, ImageConfig};
use cannon_trainer::train::data::info::DatasetSpec;
use cannon_trainer::train::data::records::Layout;
use cannon_trainer::train::data::shuffle::Position;
use cannon_trainer::train::data::template::SpecialIds;
use cannon_trainer::train::data::{DataConfig, DataError, Loader, Tekken};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn tok() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(shared_path("tokenizers/tekken_240911.json"), None).unwrap())
}

fn tmp(name: &str) -> PathBuf {
    common::scratch("formats", name)
}

fn png(path: &Path, w: u32, h: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 4) as u8, (y * 3) as u8, 90]))
        .save(path)
        .unwrap();
}

fn settings(cfg: &ImageConfig) -> SampleSettings<'_> {
    SampleSettings {
        max_len: 4096,
        system_prompt: None,
        image: cfg,
        labels: Default::default(),
    }
}

fn open(spec: &DatasetSpec) -> DataSet {
    DataSet::open(spec, tok(), &settings(&ImageConfig::default())).unwrap()
}

/// What a sample is without where it sits in its file: ids, labels, images, image sizes.
type Content<'a> = (&'a [u32], &'a [i32], &'a [PathBuf], &'a [[u32; 2]]);

fn content(p: &Prepared) -> Content<'_> {
    (&p.input_ids, &p.labels, &p.images, &p.image_sizes)
}

fn contents(ds: &DataSet) -> Vec<Content<'_>> {
    ds.samples.iter().map(content).collect()
}

/// Three records in the OpenAI `messages` spelling: multi-turn, a system message, images.
fn records() -> Vec<Value> {
    vec![
        json!({"messages": [
            {"role": "user", "content": "<image>Who are they?"},
            {"role": "assistant", "content": "Two players."},
            {"role": "user", "content": "What are they doing?"},
            {"role": "assistant", "content": "Celebrating."}],
            "images": ["pics/a.png"]}),
        json!({"messages": [
            {"role": "system", "content": "Answer in one word."},
            {"role": "user", "content": "Colour?<image>"},
            {"role": "assistant", "content": "red"}],
            "images": ["pics/b.png"]}),
        json!({"messages": [
            {"role": "user", "content": "No picture here."},
            {"role": "assistant", "content": "Fine."}]}),
    ]
}

fn images(dir: &Path) {
    png(&dir.join("pics/a.png"), 84, 56);
    png(&dir.join("pics/b.png"), 56, 56);
}

/// A pretty-printed JSON array (the layout LLaMA-Factory ships) gives the samples the same
/// records give as JSONL; each sample is placed on the line its element starts on (found here
/// by looking for the lines that open an element: `  {` in serde_json's pretty layout).
#[test]
fn a_json_array_reads_like_jsonl() {
    let d = tmp("array");
    images(&d);
    let recs = records();
    let pretty = serde_json::to_string_pretty(&recs).unwrap();
    std::fs::write(d.join("set.json"), &pretty).unwrap();
    let jsonl: String = recs.iter().map(|r| r.to_string() + "\n").collect();
    std::fs::write(d.join("set.jsonl"), jsonl).unwrap();
    let a = open(&DatasetSpec::file(&d.join("set.json")));
    let l = open(&DatasetSpec::file(&d.join("set.jsonl")));
    assert_eq!((a.layout, l.layout), (Layout::JsonArray, Layout::Jsonl));
    assert!(
        a.bad.is_empty() && l.bad.is_empty(),
        "{:?} {:?}",
        a.bad,
        l.bad
    );
    assert_eq!(a.stats, l.stats);
    assert_eq!(a.stats.samples, 3);
    assert_eq!(a.stats.images, 2);
    assert_eq!(contents(&a), contents(&l));
    let starts: Vec<usize> = pretty
        .lines()
        .enumerate()
        .filter(|(_, t)| *t == "  {")
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(a.samples.iter().map(|s| s.line).collect::<Vec<_>>(), starts);
    assert_eq!(
        l.samples.iter().map(|s| s.line).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    std::fs::remove_dir_all(&d).ok();
}

/// A bad element of an array is reported with its position and line and skipped; an array
/// that is not JSON as a whole is an error of the file that names it and the line.
#[test]
fn bad_array_elements_and_broken_arrays() {
    let d = tmp("badarray");
    images(&d);
    let text =
        "[\n  {\"messages\": \"oops\"},\n  7,\n".to_string() + &records()[2].to_string() + "\n]\n";
    let f = d.join("bad.json");
    std::fs::write(&f, text).unwrap();
    let ds = open(&DatasetSpec::file(&f));
    assert_eq!(
        (ds.stats.lines, ds.stats.samples, ds.stats.bad_lines),
        (3, 1, 2)
    );
    assert_eq!(ds.samples[0].line, 4);
    let msgs: Vec<String> = ds.bad.iter().map(|e| e.to_string()).collect();
    let name = f.display().to_string();
    assert!(
        msgs[0].contains(&format!("{name}:2: sample 1")),
        "{}",
        msgs[0]
    );
    assert!(msgs[0].contains("`messages` must be a list"), "{}", msgs[0]);
    assert!(
        msgs[1].contains(&format!("{name}:3: sample 2")),
        "{}",
        msgs[1]
    );
    assert!(msgs[1].contains("JSON object"), "{}", msgs[1]);
    // A missing comma: no element can be trusted, the file is an error naming line 3.
    let broken = d.join("broken.json");
    std::fs::write(&broken, "[\n  {\"a\": 1}\n  {\"b\": 2}\n]").unwrap();
    let e = DataSet::open(
        &DatasetSpec::file(&broken),
        tok(),
        &settings(&ImageConfig::default()),
    )
    .unwrap_err();
    assert!(matches!(e, DataError::Json { .. }), "{e}");
    let m = e.to_string();
    assert!(m.contains("broken.json") && m.contains("line 3"), "{m}");
    std::fs::remove_dir_all(&d).ok();
}

/// ShareGPT `conversations` (`from`: human/gpt/system, `value`) give the same samples as the
/// same conversations under `messages`.
#[test]
fn sharegpt_conversations_read_like_messages() {
    let d = tmp("sharegpt");
    images(&d);
    fn from(role: &str) -> &str {
        match role {
            "user" => "human",
            "assistant" => "gpt",
            other => other,
        }
    }
    let share: Vec<Value> = records()
        .iter()
        .map(|r| {
            let conv: Vec<Value> = r["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| json!({"from": from(m["role"].as_str().unwrap()), "value": m["content"]}))
                .collect();
            let mut o = json!({"conversations": conv});
            if let Some(i) = r.get("images") {
                o["images"] = i.clone();
            }
            o
        })
        .collect();
    std::fs::write(d.join("m.json"), Value::from(records()).to_string()).unwrap();
    std::fs::write(d.join("s.json"), Value::from(share).to_string()).unwrap();
    let m = open(&DatasetSpec::file(&d.join("m.json")));
    let s = open(&DatasetSpec::file(&d.join("s.json")));
    assert_eq!(s.stats, m.stats);
    assert_eq!(contents(&s), contents(&m));
    assert_eq!(s.stats.samples, 3);
    std::fs::remove_dir_all(&d).ok();
}

/// Multi-turn through the whole reader: every answer (+ EOS) is trained, every prompt, system
/// message and image block is IGNORE_INDEX. Expected ids are built from the tokenizer's own
/// encodings of the texts, its special ids and the image block of a 84x56 image.
#[test]
fn multi_turn_samples_train_every_answer() {
    let d = tmp("multiturn");
    images(&d);
    let f = d.join("mt.jsonl");
    let rec = json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "<image>Who?"},
        {"role": "assistant", "content": "Players.  "},
        {"role": "user", "content": "Doing?"},
        {"role": "assistant", "content": "Celebrating."},
        {"role": "system", "content": "Now in French."},
        {"role": "user", "content": "Again?"},
        {"role": "assistant", "content": "Ils fêtent."}],
        "images": ["pics/a.png"]});
    std::fs::write(&f, rec.to_string()).unwrap();
    let ds = open(&DatasetSpec::file(&f));
    assert!(ds.bad.is_empty(), "{:?}", ds.bad);
    let s = SpecialIds::from_tekken(tok()).unwrap();
    let e = |x: &str| tok().encode(x, false, false);
    let cfg = ImageConfig::default();
    // 84 wide, 56 high: already multiples of 14, under the longest edge.
    let block = image_block(56, 84, &cfg, s.image);
    let sys = |t: &str| [vec![s.system], e(t), vec![s.system_end]].concat();
    let inst = |t: Vec<u32>| [vec![s.inst], t, vec![s.inst_end]].concat();
    let answer = |t: &str| [e(t), vec![s.eos]].concat();
    let parts: [(Vec<u32>, bool); 6] = [
        (
            [
                vec![s.bos],
                sys("Be brief."),
                inst([block.clone(), e("Who?")].concat()),
            ]
            .concat(),
            false,
        ),
        // mistral-common drops an answer's trailing spaces.
        (answer("Players."), true),
        (inst(e("Doing?")), false),
        (answer("Celebrating."), true),
        ([sys("Now in French."), inst(e("Again?"))].concat(), false),
        (answer("Ils fêtent."), true),
    ];
    let ids: Vec<u32> = parts.iter().flat_map(|(p, _)| p.clone()).collect();
    let labels: Vec<i32> = parts
        .iter()
        .flat_map(|(p, train)| {
            p.iter()
                .map(move |&t| if *train { t as i32 } else { IGNORE })
        })
        .collect();
    assert_eq!(ds.samples[0].input_ids, ids);
    assert_eq!(ds.samples[0].labels, labels);
    assert_eq!(
        ds.stats.label_tokens,
        e("Players.").len() + e("Celebrating.").len() + e("Ils fêtent.").len() + 3
    );
    std::fs::remove_dir_all(&d).ok();
}

fn write_info(d: &Path, info: &Value) {
    std::fs::write(d.join("dataset_info.json"), info.to_string()).unwrap();
}

/// dataset_info.json entries: LLaMA-Factory's own `mllm_demo` entry, a ShareGPT file with
/// every column and tag renamed, and an alpaca file with history give the same samples as the
/// canonical records; images resolve against dataset_dir although the files sit in a
/// subfolder.
#[test]
fn dataset_info_picks_and_maps_datasets() {
    let d = tmp("info");
    images(&d);
    std::fs::create_dir_all(d.join("sets")).unwrap();
    let recs = records();
    std::fs::write(
        d.join("sets/mllm.json"),
        Value::from(recs.clone()).to_string(),
    )
    .unwrap();
    // The same conversations with every column and tag renamed.
    let tag = |role: &str| match role {
        "user" => "q",
        "assistant" => "a",
        _ => "s",
    };
    let custom: Vec<Value> = recs
        .iter()
        .map(|r| {
            let dialog: Vec<Value> = r["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| json!({"speaker": tag(m["role"].as_str().unwrap()), "text": m["content"]}))
                .collect();
            json!({"dialog": dialog, "pics": r.get("images").cloned().unwrap_or(json!([]))})
        })
        .collect();
    let custom_jsonl: String = custom.iter().map(|r| r.to_string() + "\n").collect();
    std::fs::write(d.join("sets/custom.jsonl"), custom_jsonl).unwrap();
    // Record 1 (two turns) in alpaca form: history + instruction/input + output; `photo` is
    // one path, not a list (LLaMA-Factory wraps it).
    let alpaca = json!([{
        "instruction": "What are they",
        "input": "doing?",
        "output": "Celebrating.",
        "history": [["<image>Who are they?", "Two players."]],
        "photo": "pics/a.png",
    }]);
    std::fs::write(d.join("sets/alpaca.json"), alpaca.to_string()).unwrap();
    let info = json!({
        "mllm_demo": {
            "file_name": "sets/mllm.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content",
                     "user_tag": "user", "assistant_tag": "assistant", "system_tag": "system"}
        },
        "custom": {
            "file_name": "sets/custom.jsonl",
            "formatting": "sharegpt",
            "columns": {"messages": "dialog", "images": "pics"},
            "tags": {"role_tag": "speaker", "content_tag": "text",
                     "user_tag": "q", "assistant_tag": "a", "system_tag": "s"}
        },
        "alp": {
            "file_name": "sets/alpaca.json",
            "columns": {"prompt": "instruction", "query": "input", "response": "output",
                        "history": "history", "images": "photo"}
        },
        "no_system_tag": {
            "file_name": "sets/mllm.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content",
                     "user_tag": "user", "assistant_tag": "assistant"}
        },
        "hub": {"hf_hub_url": "someone/some_set"},
        "no_messages": {"file_name": "sets/mllm.json", "formatting": "sharegpt",
                        "columns": {"images": "images"}},
    });
    write_info(&d, &info);
    let spec = |name: &str| DatasetSpec::resolve(Path::new(name), Some(&d));
    let m = spec("mllm_demo").unwrap();
    assert_eq!(m.name.as_deref(), Some("mllm_demo"));
    assert_eq!(
        (m.file.clone(), m.media_dir.clone()),
        (d.join("sets/mllm.json"), d.clone())
    );
    let mllm = open(&m);
    assert!(mllm.bad.is_empty(), "{:?}", mllm.bad);
    assert_eq!(mllm.stats.samples, 3);
    assert_eq!(mllm.samples[0].images, [d.join("pics/a.png")]);
    let custom = open(&spec("custom").unwrap());
    assert!(custom.bad.is_empty(), "{:?}", custom.bad);
    assert_eq!(contents(&custom), contents(&mllm));
    let alp = open(&spec("alp").unwrap());
    assert!(alp.bad.is_empty(), "{:?}", alp.bad);
    // "What are they\ndoing?" is record 0's second prompt only if joined with "\n"; build the
    // canonical twin of that and compare.
    let twin = json!([{"messages": [
        {"role": "user", "content": "<image>Who are they?"},
        {"role": "assistant", "content": "Two players."},
        {"role": "user", "content": "What are they\ndoing?"},
        {"role": "assistant", "content": "Celebrating."}],
        "images": ["pics/a.png"]}]);
    std::fs::write(d.join("twin.json"), twin.to_string()).unwrap();
    let twin = open(&DatasetSpec::file(&d.join("twin.json")));
    assert_eq!(contents(&alp), contents(&twin));
    // LLaMA-Factory semantics: tags without system_tag accept no system message.
    let nst = open(&spec("no_system_tag").unwrap());
    assert_eq!((nst.stats.samples, nst.stats.bad_lines), (2, 1));
    let m = nst.bad[0].to_string();
    assert!(
        m.contains("unknown role `system`") && m.contains("sample 2"),
        "{m}"
    );
    for (name, want) in [
        ("hub", "hf_hub_url"),
        ("no_messages", "no `messages` column"),
        (
            "nothing",
            "entries: alp, custom, hub, mllm_demo, no_messages, no_system_tag",
        ),
    ] {
        let e = spec(name).unwrap_err().to_string();
        assert!(e.contains(name) && e.contains(want), "{e}");
    }
    // A file named directly beside a dataset_dir: images relative to dataset_dir.
    let direct = spec("sets/mllm.json").unwrap();
    assert_eq!(
        (direct.name.clone(), direct.media_dir.clone()),
        (None, d.clone())
    );
    assert_eq!(contents(&open(&direct)), contents(&mllm));
    // The loader resolves the same way.
    let cfg = DataConfig {
        dataset: Some("custom".into()),
        dataset_dir: Some(d.clone()),
        max_len: 256,
        ..DataConfig::default()
    };
    let mut l = Loader::open(&cfg, tok(), Position::default()).unwrap();
    assert_eq!(l.stats().samples, 3);
    l.next_batch().unwrap().check().unwrap();
    std::fs::remove_dir_all(&d).ok();
}

/// Settings no sample can be made with are errors before the file is read.
#[test]
fn zero_lengths_are_config_errors() {
    let mut cfg = ImageConfig::default();
    let spec = DatasetSpec::file(Path::new("/nonexistent/set.jsonl"));
    let mut s = settings(&cfg);
    s.max_len = 0;
    let e = DataSet::open(&spec, tok(), &s).unwrap_err();
    assert!(
        matches!(&e, DataError::Config(m) if m.contains("max_len")),
        "{e}"
    );
    cfg.longest_edge = 0;
    let e = DataSet::open(&spec, tok(), &settings(&cfg)).unwrap_err();
    assert!(
        matches!(&e, DataError::Config(m) if m.contains("longest_edge")),
        "{e}"
    );
}
