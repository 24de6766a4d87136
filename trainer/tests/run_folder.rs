//! One run per run folder: `cannon train` into a `log.dir` that holds another run is refused
//! (exit 2, naming the folder and the ways on) and leaves it untouched; `--force` moves the
//! old run aside and trains; resuming continues it. And a job of several processes on the
//! CPU is refused by `train` itself (launch refuses it earlier: `launch_cli`).

mod common;
use common::{scratch, small_default_train};
use std::path::Path;

const BIN: &str = env!("CARGO_BIN_EXE_cannon");

/// A folder as a finished run leaves it (its metrics and effective config).
fn fake_run(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("metrics.jsonl"), "{\"step\":1,\"loss\":9.0}\n").unwrap();
    std::fs::write(dir.join("config.toml"), "# the old run\n").unwrap();
}

fn step_records(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"loss\""))
        .count()
}

#[test]
fn a_folder_holding_a_run_is_refused_and_left_untouched() {
    let root = scratch("run-folder", "refused");
    let dir = root.join("run");
    fake_run(&dir);
    for dry in [false, true] {
        let mut cmd = small_default_train(BIN, &dir, &["train.steps=2"]);
        if dry {
            cmd.arg("--dry-run");
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "dry run {dry}: {err}");
        for want in [
            dir.display().to_string().as_str(),
            "already holds a run",
            "metrics.jsonl",
            "checkpoint.resume=true",
            "--force",
        ] {
            assert!(err.contains(want), "{want:?} missing: {err}");
        }
        assert_eq!(
            std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
            "{\"step\":1,\"loss\":9.0}\n"
        );
        assert!(!root.join("run.old-1").exists());
    }
}

#[test]
fn force_moves_the_old_run_aside_and_trains_afresh() {
    let root = scratch("run-folder", "force");
    let dir = root.join("run");
    fake_run(&dir);
    // A dry run says where the old run would go, and moves nothing.
    let out = small_default_train(BIN, &dir, &["train.steps=2"])
        .args(["--force", "--dry-run"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("would be moved aside to"), "{text}");
    assert!(!root.join("run.old-1").exists());

    let out = small_default_train(BIN, &dir, &["train.steps=2"])
        .arg("--force")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{err}");
    let aside = root.join("run.old-1");
    assert!(
        err.contains(&format!("moved aside to {}", aside.display())),
        "{err}"
    );
    // The old run whole, the new one on its own.
    assert_eq!(
        std::fs::read_to_string(aside.join("metrics.jsonl")).unwrap(),
        "{\"step\":1,\"loss\":9.0}\n"
    );
    assert_eq!(step_records(&dir), 2);

    // Resuming the new run is no conflict: it continues (no checkpoint yet here: step 0).
    let out = small_default_train(BIN, &dir, &["train.steps=2", "checkpoint.resume=true"])
        .arg("--dry-run")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!root.join("run.old-2").exists());
}

/// `WORLD_SIZE` > 1 off the NPU: each process would train the whole model alone into the same
/// folder. Refused before the run folder is touched.
#[test]
fn a_cpu_process_of_a_launched_job_is_refused() {
    let root = scratch("run-folder", "world");
    let dir = root.join("run");
    let out = small_default_train(BIN, &dir, &["train.steps=2"])
        .env("WORLD_SIZE", "2")
        .env("RANK", "0")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("WORLD_SIZE = 2") && err.contains("parallel.nproc=2"),
        "{err}"
    );
    assert!(!dir.exists(), "the run folder was made");
}
