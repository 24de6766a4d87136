//! `cannon plot` and `cannon compare --plot` through the binary, on small metrics files
//! written here: the SVG is well-formed and holds one line per run per metric (counted by the
//! palette colour each series is drawn in), the PNG decodes to the asked size with pixels in
//! each run's colour, the errors exit 2 naming the file or metric; and `compare`'s step-time
//! table, whose figures are worked by hand below.

mod svg_check;
use std::path::{Path, PathBuf};
use std::process::Command;
use svg_check::assert_well_formed;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// The first three colours of the chart palette (Tableau's), as the SVG writes them.
const BLUE: &str = "#1F77B4";
const ORANGE: &str = "#FF7F0E";
const GREEN: &str = "#2CA02C";
const RGB: [[u8; 3]; 3] = [[0x1f, 0x77, 0xb4], [0xff, 0x7f, 0x0e], [0x2c, 0xa0, 0x2c]];

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

/// Two runs in run folders: steps 1..=5 with a resumed re-log of step 3 (the last record
/// wins), a skipped step 4 whose loss is `null` (run alpha) or absurd (run beta), and
/// validation records every 2 steps.
fn two_runs(d: &Path) -> (String, String) {
    let a = write(
        &d.join("run-alpha/metrics.jsonl"),
        &[
            r#"{"step":1,"loss":3.0,"lr":0.001,"step_ms":100,"grad_norm":2.0}"#,
            r#"{"step":2,"loss":2.5,"lr":0.001,"step_ms":100,"grad_norm":1.5}"#,
            r#"{"step":3,"loss":9.0,"lr":0.001,"step_ms":100,"grad_norm":1.0}"#,
            r#"{"step":2,"eval_loss":2.8,"eval_tokens":64}"#,
            r#"{"step":3,"loss":2.0,"lr":0.001,"step_ms":100,"grad_norm":1.0}"#,
            r#"{"step":4,"loss":null,"lr":0.001,"step_ms":100,"grad_norm":null,"skipped":true}"#,
            r#"{"step":4,"eval_loss":2.4,"eval_tokens":64}"#,
            r#"{"step":5,"loss":1.5,"lr":0.0005,"step_ms":100,"grad_norm":0.5}"#,
            r#"{"eval":{"accuracy":0.5}}"#,
        ],
    );
    let b = write(
        &d.join("run-beta/metrics.jsonl"),
        &[
            r#"{"step":1,"loss":3.1,"lr":0.001,"step_ms":120}"#,
            r#"{"step":2,"loss":2.6,"lr":0.001,"step_ms":120}"#,
            r#"{"step":2,"eval_loss":2.9,"eval_tokens":64}"#,
            r#"{"step":3,"loss":2.2,"lr":0.001,"step_ms":120}"#,
            r#"{"step":4,"loss":1e30,"lr":0.001,"step_ms":120,"skipped":true}"#,
            r#"{"step":4,"eval_loss":2.5,"eval_tokens":64}"#,
            r#"{"step":5,"loss":1.7,"lr":0.0005,"step_ms":120}"#,
        ],
    );
    (
        Path::new(&a)
            .parent()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string(),
        b,
    )
}

/// The SVG's solid (opacity 1) and faint polylines stroked in `colour`, as their point lists.
fn polylines(svg: &str, colour: &str) -> (Vec<String>, Vec<String>) {
    let (mut solid, mut faint) = (Vec::new(), Vec::new());
    for tag in svg.split('<').filter(|t| t.starts_with("polyline ")) {
        if !tag.contains(&format!("stroke=\"{colour}\"")) {
            continue;
        }
        let points = tag
            .split("points=\"")
            .nth(1)
            .and_then(|p| p.split('"').next())
            .unwrap()
            .trim()
            .to_string();
        if tag.contains("opacity=\"1\"") {
            solid.push(points);
        } else {
            faint.push(points);
        }
    }
    (solid, faint)
}

/// The trimmed contents of the SVG's `<text>` elements (plotters writes them on their own
/// lines).
fn texts(svg: &str) -> Vec<&str> {
    svg.split("<text ")
        .skip(1)
        .filter_map(|t| Some(t[t.find('>')? + 1..t.find("</text>")?].trim()))
        .collect()
}

#[test]
fn plot_draws_one_line_per_run_and_metric_in_svg() {
    let d = scratch("svg");
    let (a, b) = two_runs(&d);
    let out = d.join("runs.svg");
    let o = out.to_str().unwrap();
    let (code, stdout, err) = run(&["plot", &a, &b, "--metric", "loss,eval_loss,lr", "-o", o]);
    assert_eq!(code, 0, "{stdout}{err}");
    assert!(stdout.contains("3 panels, 6 lines"), "{stdout}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_well_formed(&svg);
    // Legends: the run folders' names.
    let labels = texts(&svg);
    assert!(
        labels.contains(&"run-alpha") && labels.contains(&"run-beta"),
        "{labels:?}"
    );
    let (alpha, faint) = polylines(&svg, BLUE);
    assert_eq!(alpha.len(), 3, "one alpha line per panel");
    assert!(faint.is_empty());
    assert_eq!(
        polylines(&svg, ORANGE).0.len(),
        3,
        "one beta line per panel"
    );
    // Panels top to bottom: loss (steps 1, 2, 3, 5: step 4 was skipped), eval_loss (2, 4),
    // lr (1..=5: a skipped step's learning rate is real).
    let points = |p: &String| p.split_whitespace().count();
    assert_eq!(alpha.iter().map(points).collect::<Vec<_>>(), [4, 2, 5]);
    assert_eq!(
        polylines(&svg, ORANGE)
            .0
            .iter()
            .map(points)
            .collect::<Vec<_>>(),
        [4, 2, 5]
    );

    // Smoothed: a faint raw line under each solid loss line; the sparse eval_loss is not
    // smoothed.
    let args = [
        "plot",
        &a,
        &b,
        "--metric",
        "loss,eval_loss",
        "--smooth",
        "3",
        "-o",
        o,
    ];
    let (code, _, err) = run(&args);
    assert_eq!(code, 0, "{err}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_well_formed(&svg);
    for colour in [BLUE, ORANGE] {
        let (solid, faint) = polylines(&svg, colour);
        assert_eq!((solid.len(), faint.len()), (2, 1), "{colour}");
        assert_eq!(points(&solid[0]), points(&faint[0]));
    }

    // A window: only steps 3..=5 of the loss (3 and 5; 4 skipped).
    let (code, _, err) = run(&["plot", &a, "--from", "3", "--to", "5", "-o", o]);
    assert_eq!(code, 0, "{err}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        polylines(&svg, BLUE)
            .0
            .iter()
            .map(points)
            .collect::<Vec<_>>(),
        [2]
    );
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn plot_writes_a_png_of_the_asked_size_without_system_fonts() {
    let d = scratch("png");
    let (a, b) = two_runs(&d);
    let out = d.join("runs.png");
    let (code, stdout, err) = run(&[
        "plot",
        &a,
        &b,
        "--metric",
        "loss,step_ms",
        "--size",
        "640x480",
        "-o",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}{err}");
    let img = image::open(&out).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (640, 480));
    let count = |rgb: [u8; 3]| img.pixels().filter(|p| p.0 == rgb).count();
    for (i, rgb) in RGB[..2].iter().enumerate() {
        assert!(count(*rgb) > 100, "series {i}: {} pixels", count(*rgb));
    }
    assert_eq!(count(RGB[2]), 0, "no third series");
    // Text and axes: dark pixels (the labels are drawn from the embedded font).
    let dark = img.pixels().filter(|p| p.0.iter().all(|c| *c < 80)).count();
    assert!(dark > 500, "{dark} dark pixels");
    std::fs::remove_dir_all(&d).ok();
}

#[test]
fn compare_plot_draws_both_losses_and_their_difference() {
    let d = scratch("compare");
    let (a, b) = two_runs(&d);
    for ext in ["svg", "png"] {
        let out = d.join(format!("cmp.{ext}"));
        let (code, stdout, err) = run(&[
            "compare",
            &a,
            &b,
            "--threshold",
            "1",
            "--plot",
            out.to_str().unwrap(),
        ]);
        // The loss difference is NaN (alpha's step 4 is null): FAIL, exit 1, plot written.
        assert_eq!(code, 1, "{stdout}{err}");
        assert!(stdout.contains("plot "), "{stdout}");
        if ext == "svg" {
            let svg = std::fs::read_to_string(&out).unwrap();
            assert_well_formed(&svg);
            let n = |c| polylines(&svg, c).0.len();
            assert_eq!([n(BLUE), n(ORANGE), n(GREEN)], [1, 1, 1]);
            // The difference over steps 1, 2, 3, 5 (step 4 skipped in both).
            let diff = &polylines(&svg, GREEN).0[0];
            assert_eq!(diff.split_whitespace().count(), 4);
            assert!(
                texts(&svg).contains(&"run-alpha - run-beta"),
                "difference legend"
            );
        } else {
            let img = image::open(&out).unwrap().to_rgb8();
            for rgb in RGB {
                assert!(img.pixels().filter(|p| p.0 == rgb).count() > 50, "{rgb:?}");
            }
        }
    }
    std::fs::remove_dir_all(&d).ok();
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

#[test]
fn plot_rejects_unusable_input_with_exit_2() {
    let d = scratch("bad");
    let (a, _) = two_runs(&d);
    let o = d.join("x.svg");
    let o = o.to_str().unwrap();

    let missing = d.join("missing.jsonl");
    let (code, _, err) = run(&["plot", missing.to_str().unwrap(), "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing.jsonl"), "{err}");

    let empty_dir = d.join("no-run");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let (code, _, err) = run(&["plot", empty_dir.to_str().unwrap(), "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no-run/metrics.jsonl"), "{err}");

    let none = write(&d.join("none.jsonl"), &[r#"{"kind":"config","lr":1}"#]);
    let (code, _, err) = run(&["plot", &a, &none, "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("none.jsonl") && err.contains("no step or eval records"),
        "{err}"
    );

    let bad = write(&d.join("bad.jsonl"), &[r#"{"step":1,"loss":1.0}"#, "{oops"]);
    let (code, _, err) = run(&["plot", &bad, "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("bad.jsonl:2") && err.contains("invalid JSON"),
        "{err}"
    );

    let (code, _, err) = run(&["plot", &a, "--metric", "loss,nope", "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown metric `nope`"), "{err}");
    assert!(
        err.contains("loss") && err.contains("eval_loss") && err.contains("step_ms"),
        "{err}"
    );

    let (code, _, err) = run(&["plot", &a, "-o", d.join("x.pdf").to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("x.pdf") && err.contains("unsupported"),
        "{err}"
    );
    let (code, _, err) = run(&["compare", &a, &a, "--plot", "x.jpeg"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("x.jpeg") && err.contains("unsupported"),
        "{err}"
    );

    let (code, _, err) = run(&["plot", &a, "--from", "3", "--to", "2", "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--from 3 is after --to 2"), "{err}");

    let (code, _, err) = run(&["plot", &a, "--metric", "eval_loss", "--from", "5", "-o", o]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no run has a finite `eval_loss` in steps 5..="),
        "{err}"
    );
    assert!(!Path::new(o).exists(), "nothing written on error");
    std::fs::remove_dir_all(&d).ok();
}
