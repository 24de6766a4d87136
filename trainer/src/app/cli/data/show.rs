//! `cannon data show`: what records become, as text or as JSON lines.

use super::{fail, SampleArgs};
use crate::train::data::dataset::pick_records;
use crate::train::data::show::{render, summary, to_json};
use crate::train::data::template::SpecialIds;
use std::io::Write;
use std::process::ExitCode;

/// Shows record `index` (1-based), or every record when None.
pub fn run(args: &SampleArgs, index: Option<usize>, json: bool) -> ExitCode {
    let samples = match args.resolve() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    for w in &samples.warnings {
        eprintln!("WARNING: {w}");
    }
    let ids = match SpecialIds::from_tekken(&samples.tok) {
        Ok(i) => i,
        Err(e) => return fail(e),
    };
    let want = |i: usize| index.is_none_or(|n| n == i);
    let picked = match pick_records(&samples.spec, &samples.tok, &samples.settings(), &want) {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    if let (Some(n), true) = (index, picked.is_empty()) {
        return fail(format!(
            "{}: there is no record {n}",
            samples.spec.file.display()
        ));
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed = 0;
    for r in &picked {
        let written = match (&r.sample, json) {
            (Ok(p), true) => writeln!(out, "{}", to_json(p)),
            (Err(e), true) => {
                failed += 1;
                writeln!(out, "{}", serde_json::json!({ "error": e.to_string() }))
            }
            (Ok(p), false) => match render(&samples.tok, ids.image, &p.input_ids, &p.labels) {
                Ok(text) => writeln!(
                    out,
                    "record {} (line {}): {}\n{text}\n",
                    r.index,
                    r.line,
                    summary(p, ids.image)
                ),
                Err(e) => return fail(e),
            },
            (Err(e), false) => {
                failed += 1;
                writeln!(
                    out,
                    "record {} (line {}): no sample: {e}\n",
                    r.index, r.line
                )
            }
        };
        if let Err(e) = written {
            return fail(format!("stdout: {e}"));
        }
    }
    if let Err(e) = out.flush() {
        return fail(format!("stdout: {e}"));
    }
    if failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
