//! Replays, on stable, every input under `fuzz/regressions/<target>/` (the fuzzers' findings,
//! each fixed) and `fuzz/corpus-seed/<target>/` (the small real fixtures the fuzzers start
//! from) through the same harness the fuzz targets run: a finding that comes back fails here.

#[allow(dead_code)]
#[path = "../../fuzz/src/lib.rs"]
mod harness;

use std::path::Path;

fn replay(kind: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind);
    let mut n = 0;
    for (name, run) in harness::TARGETS {
        let Ok(dir) = std::fs::read_dir(root.join(name)) else {
            continue;
        };
        let mut files: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files {
            let data = std::fs::read(&f).unwrap();
            eprintln!("{name}: {}", f.display());
            run(&data);
            n += 1;
        }
    }
    n
}

#[test]
fn fuzz_findings_stay_fixed() {
    replay("regressions");
}

#[test]
fn fuzz_seeds_parse_without_panic() {
    assert!(replay("corpus-seed") > 0, "the seed corpus is missing");
}
