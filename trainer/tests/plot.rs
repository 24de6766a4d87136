//! `cannon compare`'s step-time table through the binary, on small metrics files written
//! here, whose figures are worked by hand below.

use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

fn run(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(BIN).args(args).output().unwrap();
    let s = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (o.status.code().unwrap(), s(o.stdout), s(o.stderr))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cannon-plot-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(path: &Path, lines: &[&str]) -> String {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
    path.to_str().unwrap().to_string()
}

/// The table's cells of `label` (the two columns), from compare's output.
fn row<'a>(out: &'a str, label: &str) -> Vec<&'a str> {
    let table = &out[out.find("step times in the window").expect("no table")..];
    let line = table
        .lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no `{label}` row in:\n{out}"));
    line[label.len()..].split_whitespace().collect()
}

/// A: steps 1..=5 timed 100, 110, 120, 130, 1000 ms, 2 samples a step, peaks 99/120 MiB at
/// the warm-up step 1 and at most 40/80 after it, and two eval records (not steps).
/// B: logged every 2nd step (2, 4, 6), 200 ms each, 4 samples a step, with worst-rank peaks.
///
/// Whole run, A: mean (100+110+120+130+1000)/5 = 292.0; median 120.0; p95 nearest rank
/// ceil(0.95*5) = 5th = 1000.0; samples/s (10-2) samples / (110+120+130+1000) ms = 5.88;
/// wall 1460 ms = 1.5 s; peaks 99.0 / 120.0.
/// `--from 2`, A: mean (110+120+130+1000)/4 = 340.0; median (120+130)/2 = 125.0; p95
/// ceil(0.95*4) = 4th = 1000.0; samples/s from step 1's counter: the same 5.88; peaks 40.0 /
/// 80.0; wall time unchanged (the whole run).
/// B: mean = median = p95 = 200.0; samples/s (12-4) / (2 logged steps of 200 ms x 4 steps) =
/// 8 / 0.8 s = 10.00; wall 0.6 s over steps 2..=6 with 3 logged; peaks the worst rank's 70.0
/// and 90.0 (rank 0's 60/81 at step 6 are not taken).
#[test]
fn compare_reports_the_seed_step_time_table() {
    let d = scratch("table");
    let a = write(
        &d.join("a.jsonl"),
        &[
            r#"{"step":1,"loss":2.0,"step_ms":100,"samples":2,"max_allocated_mib":99,"max_reserved_mib":120}"#,
            r#"{"step":2,"loss":2.0,"step_ms":110,"samples":4,"max_allocated_mib":30,"max_reserved_mib":64}"#,
            r#"{"step":2,"eval_loss":2.1,"eval_tokens":10}"#,
            r#"{"step":3,"loss":2.0,"step_ms":120,"samples":6,"max_allocated_mib":20,"max_reserved_mib":64}"#,
            r#"{"step":4,"loss":2.0,"step_ms":130,"samples":8,"max_allocated_mib":40,"max_reserved_mib":80}"#,
            r#"{"step":4,"eval_loss":2.0,"eval_tokens":10}"#,
            r#"{"step":5,"loss":2.0,"step_ms":1000,"samples":10,"max_allocated_mib":35,"max_reserved_mib":72}"#,
        ],
    );
    let b = write(
        &d.join("b.jsonl"),
        &[
            r#"{"step":2,"loss":2.0,"step_ms":200,"samples":4,"max_allocated_mib":50,"max_allocated_mib_worst_rank":70,"max_reserved_mib":60,"max_reserved_mib_worst_rank":90}"#,
            r#"{"step":4,"loss":2.0,"step_ms":200,"samples":8,"max_allocated_mib":50,"max_allocated_mib_worst_rank":55,"max_reserved_mib":60,"max_reserved_mib_worst_rank":65}"#,
            r#"{"step":6,"loss":2.0,"step_ms":200,"samples":12,"max_allocated_mib":60,"max_reserved_mib":81}"#,
        ],
    );
    let (code, out, err) = run(&["compare", &a, &b]);
    assert_eq!(code, 0, "{out}{err}");
    // compare's own lines are unchanged and come first.
    assert!(out.contains("steps compared     2 (2..=4)"), "{out}");
    assert!(out.find("PASS") > out.find("peak reserved MiB"), "{out}");
    assert!(out.contains("step times in the window ..="), "{out}");
    assert_eq!(
        row(&out, "steps counted"),
        ["1..=5", "(5", "steps)", "2..=6", "(3", "steps)"]
    );
    assert_eq!(row(&out, "mean step_ms"), ["292.0", "200.0"]);
    assert_eq!(row(&out, "median step_ms"), ["120.0", "200.0"]);
    assert_eq!(row(&out, "p95 step_ms"), ["1000.0", "200.0"]);
    assert_eq!(row(&out, "samples/s"), ["5.88", "10.00"]);
    assert_eq!(
        row(&out, "wall time s"),
        ["1.5", "(steps", "1..=5)", "0.6", "(steps", "2..=6,", "3", "logged)"]
    );
    assert_eq!(
        row(&out, "peak allocated MiB"),
        ["99.0", "70.0", "(worst", "rank)"]
    );
    assert_eq!(
        row(&out, "peak reserved MiB"),
        ["120.0", "90.0", "(worst", "rank)"]
    );

    let (code, out, err) = run(&["compare", &a, &b, "--from", "2"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("step times in the window 2..="), "{out}");
    assert_eq!(row(&out, "steps counted")[..3], ["2..=5", "(4", "steps)"]);
    assert_eq!(row(&out, "mean step_ms")[0], "340.0");
    assert_eq!(row(&out, "median step_ms")[0], "125.0");
    assert_eq!(row(&out, "p95 step_ms")[0], "1000.0");
    assert_eq!(row(&out, "samples/s")[0], "5.88");
    assert_eq!(row(&out, "wall time s")[0], "1.5");
    assert_eq!(row(&out, "peak allocated MiB")[0], "40.0");
    assert_eq!(row(&out, "peak reserved MiB")[0], "80.0");
    std::fs::remove_dir_all(&d).ok();
}
