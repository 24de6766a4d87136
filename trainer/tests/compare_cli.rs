//! `cannon compare A.jsonl B.jsonl` through the binary: the normalised loss difference and the
//! step times over the common steps of a window, the exit codes (0 within the threshold, 1
//! above, 2 unusable input) and the messages that name a bad file and line.
//!
//! The expected figures are worked by hand from the numbers written here (all of them exact in
//! binary or printed to six significant digits), not recomputed with the code under test.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (o.status.code().unwrap(), s(o.stdout), s(o.stderr))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-compare-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, lines: &[&str]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p.to_str().unwrap().to_string()
}

/// Run A (with a header, an eval record and a step B lacks) against reference B:
/// steps 1..=4 are common; |a-b| = 0, 0.25, 0.25, 0 and b = 2 each, so the difference is
/// 0.5 / 8 = 0.0625 over all four steps and 0.25 / 4 = 0.0625 over `--from 3 --to 4`
/// (0 over `--from 4`). Step times: A 100, 110, 120, 130 -> 115; B 200 each -> ratio 0.575.
#[test]
fn compare_reports_the_difference_and_step_times() {
    let d = scratch("ok");
    let a = write(
        &d,
        "a.jsonl",
        &[
            r#"{"kind":"config","lr":0.001}"#,
            r#"{"step":1,"loss":2.0,"step_ms":100,"grad_norm":1.5}"#,
            r#"{"step":2,"loss":2.25,"step_ms":110}"#,
            "",
            r#"{"step":3,"loss":1.75,"step_ms":120}"#,
            r#"{"step":4,"loss":2.0,"step_ms":130}"#,
            r#"{"step":5,"loss":9.0,"step_ms":999}"#,
            r#"{"kind":"eval","step":4,"loss":7.0,"accuracy":{"colour":0.9}}"#,
        ],
    );
    let b = write(
        &d,
        "b.jsonl",
        &[
            r#"{"step":1,"loss":2.0,"step_ms":200}"#,
            r#"{"step":2,"loss":2.0,"step_ms":200}"#,
            r#"{"step":3,"loss":2.0,"step_ms":200}"#,
            r#"{"step":4,"loss":2.0,"step_ms":200}"#,
        ],
    );
    let (code, out, err) = run(&["compare", &a, &b, "--threshold", "0.07"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("steps compared     4 (1..=4)"), "{out}");
    assert!(out.contains("loss diff          6.250000e-2"), "{out}");
    assert!(out.contains("mean step_ms A     115.0"), "{out}");
    assert!(out.contains("mean step_ms B     200.0"), "{out}");
    assert!(out.contains("step time A/B      0.575"), "{out}");
    assert!(out.contains("PASS"), "{out}");
    // The default threshold (2 %) is exceeded: exit 1.
    let (code, out, _) = run(&["compare", &a, &b]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL"), "{out}");
    // A window.
    let (code, out, _) = run(&["compare", &a, &b, "--from", "3", "--to", "4"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("steps compared     2 (3..=4)"), "{out}");
    assert!(out.contains("loss diff          6.250000e-2"), "{out}");
    let (code, out, _) = run(&["compare", &a, &b, "--from", "4"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("loss diff          0.000000e0"), "{out}");
    // A file compared with itself, step 5 included.
    let (code, out, _) = run(&["compare", &a, &a, "--threshold", "0"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("steps compared     5 (1..=5)"), "{out}");
    std::fs::remove_dir_all(&d).ok();
}

/// A resumed run re-logs steps: the last record of a step counts. A non-finite loss (`null`)
/// fails whatever the threshold. Missing step times are reported as such.
#[test]
fn compare_takes_the_last_record_and_fails_on_nan() {
    let d = scratch("nan");
    let a = write(
        &d,
        "a.jsonl",
        &[
            r#"{"step":1,"loss":5.0}"#,
            r#"{"step":2,"loss":5.0}"#,
            r#"{"step":1,"loss":1.0}"#,
            r#"{"step":2,"loss":1.0}"#,
        ],
    );
    let b = write(
        &d,
        "b.jsonl",
        &[r#"{"step":1,"loss":1.0}"#, r#"{"step":2,"loss":1.0}"#],
    );
    let (code, out, _) = run(&["compare", &a, &b, "--threshold", "0"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("mean step_ms A     n/a"), "{out}");
    let n = write(
        &d,
        "n.jsonl",
        &[r#"{"step":1,"loss":null}"#, r#"{"step":2,"loss":1.0}"#],
    );
    let (code, out, _) = run(&["compare", &n, &b, "--threshold", "1000"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("NaN"), "{out}");
    std::fs::remove_dir_all(&d).ok();
}

/// Unusable input is exit 2 with a message naming the file (and line).
#[test]
fn compare_rejects_unusable_input() {
    let d = scratch("bad");
    let b = write(&d, "b.jsonl", &[r#"{"step":1,"loss":1.0}"#]);
    let missing = d.join("missing.jsonl");
    let (code, _, err) = run(&["compare", missing.to_str().unwrap(), &b]);
    assert_eq!(code, 2);
    assert!(err.contains("missing.jsonl"), "{err}");

    let bad = write(&d, "bad.jsonl", &[r#"{"step":1,"loss":1.0}"#, "{oops"]);
    let (code, _, err) = run(&["compare", &b, &bad]);
    assert_eq!(code, 2);
    assert!(
        err.contains("bad.jsonl:2") && err.contains("invalid JSON"),
        "{err}"
    );

    let bad = write(&d, "step.jsonl", &[r#"{"step":-1,"loss":1.0}"#]);
    let (code, _, err) = run(&["compare", &bad, &b]);
    assert_eq!(code, 2);
    assert!(
        err.contains("step.jsonl:1") && err.contains("`step`"),
        "{err}"
    );

    let bad = write(&d, "loss.jsonl", &[r#"{"step":1,"loss":"low"}"#]);
    let (code, _, err) = run(&["compare", &bad, &b]);
    assert_eq!(code, 2);
    assert!(
        err.contains("loss.jsonl:1") && err.contains("`loss`"),
        "{err}"
    );

    let none = write(&d, "none.jsonl", &[r#"{"kind":"eval","accuracy":1.0}"#]);
    let (code, _, err) = run(&["compare", &none, &b]);
    assert_eq!(code, 2);
    assert!(
        err.contains("none.jsonl") && err.contains("no step records"),
        "{err}"
    );

    let later = write(&d, "later.jsonl", &[r#"{"step":7,"loss":1.0}"#]);
    let (code, _, err) = run(&["compare", &later, &b]);
    assert_eq!(code, 2);
    assert!(err.contains("no step is in both runs"), "{err}");
    assert!(
        err.contains("steps 7..=7") && err.contains("steps 1..=1"),
        "{err}"
    );

    let (code, _, err) = run(&["compare", &b, &b, "--from", "1", "--to", "0"]);
    assert_eq!(code, 2);
    assert!(err.contains("--from 1 is after --to 0"), "{err}");

    let (code, _, err) = run(&["compare", &b, &b, "--threshold=-1"]);
    assert_eq!(code, 2);
    assert!(err.contains("threshold"), "{err}");
    std::fs::remove_dir_all(&d).ok();
}
