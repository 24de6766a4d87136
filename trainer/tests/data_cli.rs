//! `cannon data encode|check|synth` through the binary: the stdin/stdout contract of encode
//! against the mistral-common reference ids (one output line per input line, blank ones
//! included), check's counts and exit codes (empty datasets, zero lengths, JSON arrays and
//! dataset_info names, images that do not decode), and synth's refusal to overwrite and its temporary names.

mod common;
use common::shared_path;

use cannon_trainer::train::data::synth;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_cannon");
/// `../shared/tokenizers/<file>` as a command-line argument.
fn tok(file: &str) -> String {
    shared_path(&format!("tokenizers/{file}"))
        .display()
        .to_string()
}

fn run(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut c = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    let o = c.wait_with_output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (o.status.code().unwrap(), s(o.stdout), s(o.stderr))
}

/// Every reference text, one JSON string per line in, one id array per line out, in order;
/// for both the full vocabulary and `--vocab-size 8192`.
#[test]
fn encode_reads_json_lines_and_matches_the_reference() {
    for (file, vs) in [
        ("tekken_240911.reference.json", None),
        ("tekken_240911.v8192.reference.json", Some("8192")),
    ] {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tok(file)).unwrap()).unwrap();
        let cases: Vec<&serde_json::Value> = v["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c.get("bos").is_none())
            .collect();
        let input: String = cases
            .iter()
            .map(|c| serde_json::to_string(&c["text"]).unwrap() + "\n")
            .collect();
        let tokenizer = tok("tekken_240911.json");
        let mut args = vec!["data", "encode", "--tokenizer", &tokenizer];
        if let Some(n) = vs {
            args.extend(["--vocab-size", n]);
        }
        let (code, out, err) = run(&args, &input);
        assert_eq!(code, 0, "{err}");
        let got: Vec<serde_json::Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(got.len(), cases.len());
        for (g, c) in got.iter().zip(&cases) {
            assert_eq!(g, &c["ids"], "{file}: {}", c["text"]);
        }
    }
    let tokenizer = tok("tekken_240911.json");
    let (code, out, _) = run(
        &[
            "data",
            "encode",
            "--tokenizer",
            &tokenizer,
            "--bos",
            "--eos",
        ],
        "\"Hello, world!\"\n",
    );
    assert_eq!(code, 0);
    assert_eq!(out.trim(), "[1,22177,1044,4304,1033,2]");
    let (code, _, err) = run(&["data", "encode", "--tokenizer", &tokenizer], "not json\n");
    assert_eq!(code, 2);
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn synth_then_check_reports_counts() {
    let d = std::env::temp_dir().join(format!("cannon-cli-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    let ds = d.to_str().unwrap();
    let (code, out, err) = run(
        &[
            "data",
            "synth",
            "--out",
            ds,
            "--samples",
            "20",
            "--seed",
            "4",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("18 samples") && out.contains("2 samples"),
        "{out}"
    );
    let train = d.join("train.jsonl");
    let tokenizer = tok("tekken_240911.json");
    let args = [
        "data",
        "check",
        "--dataset",
        train.to_str().unwrap(),
        "--tokenizer",
        &tokenizer,
    ];
    let (code, out, err) = run(&args, "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("samples            18"), "{out}");
    assert!(out.contains("bad records        0"), "{out}");
    assert!(out.contains("layout             JSONL"), "{out}");
    // An image cut after its header: reading (by headers, as a run reads) passes; --decode
    // decodes every image, names the file and its line, counts it and exits 1.
    let third: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&train)
            .unwrap()
            .lines()
            .nth(2)
            .unwrap(),
    )
    .unwrap();
    let rel = third["images"][0].as_str().unwrap();
    let img = d.join(rel);
    let png = std::fs::read(&img).unwrap();
    std::fs::write(&img, &png[..png.len() / 2]).unwrap();
    let (code, out, err) = run(&args, "");
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("undecodable"), "{out}");
    let mut decoding = args.to_vec();
    decoding.push("--decode");
    let (code, out, err) = run(&decoding, "");
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("undecodable        1"), "{out}");
    assert!(err.contains("train.jsonl:3:") && err.contains(rel), "{err}");
    std::fs::write(&img, png).unwrap();
    let (code, out, err) = run(&decoding, "");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("undecodable        0"), "{out}");
    // A bad line appended: reported on stderr with its number, counted, exit code 1.
    let mut text = std::fs::read_to_string(&train).unwrap();
    text.push_str("{oops\n");
    std::fs::write(&train, text).unwrap();
    let (code, out, err) = run(&args, "");
    assert_eq!(code, 1);
    assert!(out.contains("bad records        1"), "{out}");
    assert!(err.contains("train.jsonl:19"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-cli-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Blank input lines answer `null`, so output line N is always input line N's ids.
#[test]
fn encode_keeps_one_output_line_per_input_line() {
    let tokenizer = tok("tekken_240911.json");
    let input = "\"Hello, world!\"\n\n   \n\"Hello, world!\"\n";
    let (code, out, err) = run(&["data", "encode", "--tokenizer", &tokenizer], input);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    // Ids from mistral-common (the reference file's "Hello, world!" case, as above).
    assert_eq!(
        lines,
        [
            "[22177,1044,4304,1033]",
            "null",
            "null",
            "[22177,1044,4304,1033]"
        ]
    );
    // A bad line still stops with its number, after the blank ones were counted.
    let (code, _, err) = run(
        &["data", "encode", "--tokenizer", &tokenizer],
        "\n\nnot json\n",
    );
    assert_eq!(code, 2);
    assert!(err.contains("line 3"), "{err}");
}

/// Zero lengths are usage errors (exit 2) found by the argument parser: the dataset named
/// does not even exist, and the message is about the flag, not the file.
#[test]
fn zero_lengths_are_usage_errors() {
    let tokenizer = tok("tekken_240911.json");
    for (flag, name) in [("--max-len", "max-len"), ("--longest-edge", "longest-edge")] {
        let args = [
            "data",
            "check",
            "--dataset",
            "/nonexistent/set.jsonl",
            "--tokenizer",
            &tokenizer,
            flag,
            "0",
        ];
        let (code, out, err) = run(&args, "");
        assert_eq!(code, 2, "{flag}: {out}{err}");
        assert!(err.contains(name) && !err.contains("nonexistent"), "{err}");
        assert!(out.is_empty(), "{out}");
    }
    let (code, _, err) = run(
        &["data", "synth", "--out", "/nonexistent", "--samples", "0"],
        "",
    );
    assert_eq!(code, 2);
    assert!(err.contains("samples"), "{err}");
}

/// A file with no record (empty, or blank lines only, or `[]`) is unusable input: exit 2 with
/// a message saying so, not a passed check.
#[test]
fn an_empty_dataset_fails_check() {
    let d = scratch("empty");
    let tokenizer = tok("tekken_240911.json");
    for (name, body) in [
        ("a.jsonl", ""),
        ("b.jsonl", "\n  \n\n"),
        ("c.json", " [ ] "),
    ] {
        let f = d.join(name);
        std::fs::write(&f, body).unwrap();
        let args = [
            "data",
            "check",
            "--dataset",
            f.to_str().unwrap(),
            "--tokenizer",
            &tokenizer,
        ];
        let (code, out, err) = run(&args, "");
        assert_eq!(code, 2, "{name}: {out}");
        assert!(err.contains("no records"), "{err}");
        assert!(out.contains("records            0"), "{out}");
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A JSON array picked by name from a dataset_info.json (LLaMA-Factory's mllm_demo entry),
/// images under dataset_dir, checked through the binary.
#[test]
fn check_reads_a_named_json_array() {
    let d = scratch("named");
    std::fs::create_dir_all(d.join("pics")).unwrap();
    image::RgbImage::from_pixel(56, 56, image::Rgb([200, 30, 30]))
        .save(d.join("pics/1.png"))
        .unwrap();
    let sample = |q: &str| {
        serde_json::json!({
            "messages": [
                {"role": "user", "content": format!("<image>{q}")},
                {"role": "assistant", "content": "red"},
                {"role": "user", "content": "Sure?"},
                {"role": "assistant", "content": "yes"},
            ],
            "images": ["pics/1.png"],
        })
    };
    let arr = serde_json::to_string_pretty(&[sample("Colour?"), sample("What?")]).unwrap();
    std::fs::create_dir_all(d.join("sets")).unwrap();
    std::fs::write(d.join("sets/demo.json"), arr).unwrap();
    let info = serde_json::json!({"demo": {
        "file_name": "sets/demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content",
                 "user_tag": "user", "assistant_tag": "assistant"},
    }});
    std::fs::write(d.join("dataset_info.json"), info.to_string()).unwrap();
    let tokenizer = tok("tekken_240911.json");
    let dir = d.to_str().unwrap();
    let mut args = vec!["data", "check", "--dataset", "demo", "--dataset-dir", dir];
    args.extend(["--tokenizer", &tokenizer]);
    let (code, out, err) = run(&args, "");
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("layout             JSON array"), "{out}");
    assert!(out.contains("samples            2"), "{out}");
    assert!(out.contains("images             2"), "{out}");
    // An unknown name lists the entries there are.
    args[3] = "nope";
    let (code, _, err) = run(&args, "");
    assert_eq!(code, 2);
    assert!(
        err.contains("nope") && err.contains("entries: demo"),
        "{err}"
    );
    std::fs::remove_dir_all(&d).ok();
}

fn synth(out: &Path, samples: &str, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["data", "synth", "--out", out.to_str().unwrap()];
    args.extend(["--samples", samples, "--seed", "1"]);
    args.extend(extra);
    run(&args, "")
}

/// An existing dataset is never replaced silently: without --force the command fails (exit 2)
/// naming the folder and leaves every byte as it was; with --force it is replaced.
#[test]
fn synth_refuses_to_overwrite_without_force() {
    let d = scratch("overwrite");
    let (code, _, err) = synth(&d, "12", &[]);
    assert_eq!(code, 0, "{err}");
    let before = std::fs::read(d.join("train.jsonl")).unwrap();
    let (code, _, err) = synth(&d, "30", &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--force") && err.contains("train.jsonl"),
        "{err}"
    );
    assert_eq!(std::fs::read(d.join("train.jsonl")).unwrap(), before);
    let (code, out, err) = synth(&d, "30", &["--force"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("27 samples"), "{out}");
    assert_ne!(std::fs::read(d.join("train.jsonl")).unwrap(), before);
    // The old images went with the old dataset; no temporary name is left.
    let images = std::fs::read_dir(d.join("images")).unwrap().count();
    assert_eq!(
        images,
        std::fs::read_to_string(d.join("train.jsonl"))
            .unwrap()
            .matches(".png")
            .count()
            + std::fs::read_to_string(d.join("heldout.jsonl"))
                .unwrap()
                .matches(".png")
                .count()
    );
    let names: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains("partial")), "{names:?}");
    std::fs::remove_dir_all(&d).ok();
}

/// A run killed half-way leaves nothing under the final names (only temporary ones), and the
/// next run clears those and writes a complete dataset.
#[test]
fn killed_synth_leaves_no_partial_dataset() {
    let d = scratch("killed");
    let mut child = Command::new(BIN)
        .args([
            "data",
            "synth",
            "--out",
            d.to_str().unwrap(),
            "--samples",
            "10000000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let partial = d.join(".train.jsonl.partial");
    let t0 = std::time::Instant::now();
    // Wait until some samples are written (the file grows past its first buffer).
    while std::fs::metadata(&partial).map_or(0, |m| m.len()) == 0 {
        assert!(t0.elapsed().as_secs() < 60, "synth wrote nothing in 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(synth::existing(&d).is_empty(), "{:?}", synth::existing(&d));
    assert!(d.join(".images.partial").is_dir());
    let (code, out, err) = synth(&d, "5", &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("4 samples"), "{out}");
    assert!(!partial.exists() && !d.join(".images.partial").exists());
    std::fs::remove_dir_all(&d).ok();
}
