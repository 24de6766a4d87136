//! `cannon data encode|check|synth` through the binary: the stdin/stdout contract of encode
//! against the mistral-common reference ids, and check's counts and exit codes.

use std::io::Write;
use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_cannon");
const TOK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/tokenizers");

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
            serde_json::from_str(&std::fs::read_to_string(format!("{TOK}/{file}")).unwrap())
                .unwrap();
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
        let tokenizer = format!("{TOK}/tekken_240911.json");
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
    let tokenizer = format!("{TOK}/tekken_240911.json");
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
    let tokenizer = format!("{TOK}/tekken_240911.json");
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
    assert!(out.contains("bad lines          0"), "{out}");
    // A bad line appended: reported on stderr with its number, counted, exit code 1.
    let mut text = std::fs::read_to_string(&train).unwrap();
    text.push_str("{oops\n");
    std::fs::write(&train, text).unwrap();
    let (code, out, err) = run(&args, "");
    assert_eq!(code, 1);
    assert!(out.contains("bad lines          1"), "{out}");
    assert!(err.contains("train.jsonl:19"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}
