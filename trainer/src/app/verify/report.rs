//! The table `cannon verify` prints: one row per compared tensor, notes, and the
//! `verify: N passed, M failed` summary line.

use super::measure::{distance, nan_max};
use crate::model::StepMemory;

/// One compared tensor.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub shape: Vec<usize>,
    /// Relative L2 distance; NaN when either side holds a NaN, infinite when the lengths
    /// differ or an exact property is broken.
    pub rel_l2: f64,
    /// Largest absolute difference; NaN when either side holds a NaN.
    pub max_abs: f64,
    pub tol: f64,
    pub pass: bool,
}

/// Every row of a run, the notes on what was not compared, and the allocator's figures over
/// the checked forward + backward.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
    pub memory: Option<StepMemory>,
}

impl Report {
    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| !r.pass).count()
    }

    pub fn passed(&self) -> usize {
        self.rows.len() - self.failed()
    }

    /// Compares `ours` with the reference `r` (see [`distance`]); the row passes when
    /// `rel_l2 <= tol`, which a NaN never is.
    pub fn compare(&mut self, name: &str, shape: &[usize], ours: &[f32], r: &[f64], tol: f64) {
        let d = distance(ours, r);
        self.rows.push(Row {
            name: name.to_string(),
            shape: shape.to_vec(),
            rel_l2: d.rel_l2,
            max_abs: d.max_abs,
            tol,
            pass: d.rel_l2 <= tol,
        });
    }

    /// An exact property, broken by `max_abs` (the largest difference found; 0 when it holds,
    /// NaN when a NaN was met).
    pub fn exact(&mut self, name: &str, shape: &[usize], max_abs: f64) {
        let rel_l2 = if max_abs == 0.0 {
            0.0
        } else {
            // NaN stays NaN; any other difference is an infinite relative error.
            nan_max(max_abs, f64::INFINITY)
        };
        self.rows.push(Row {
            name: name.to_string(),
            shape: shape.to_vec(),
            rel_l2,
            max_abs,
            tol: 0.0,
            pass: max_abs == 0.0,
        });
    }

    /// The printed table (Rust prints NaN as `NaN` and infinity as `inf` in every column).
    pub fn render(&self) -> String {
        let mut out = format!(
            "{:<70} {:>16} {:>10} {:>10} {:>8}  result\n",
            "tensor", "shape", "rel_l2", "max_abs", "tol"
        );
        for r in &self.rows {
            let shape = format!("{:?}", r.shape);
            out += &format!(
                "{:<70} {:>16} {:>10.3e} {:>10.3e} {:>8.1e}  {}\n",
                r.name,
                shape,
                r.rel_l2,
                r.max_abs,
                r.tol,
                if r.pass { "PASS" } else { "FAIL" }
            );
        }
        for n in &self.notes {
            out += &format!("note: {n}\n");
        }
        if let Some(m) = &self.memory {
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            out += &format!(
                "memory: max_allocated {} B ({:.2} MiB), max_reserved {} B ({:.2} MiB), {} B \
                 allocated before the step\n",
                m.max_allocated,
                mib(m.max_allocated),
                m.max_reserved,
                mib(m.max_reserved),
                m.start_allocated
            );
        }
        out += &format!(
            "verify: {} passed, {} failed\n",
            self.passed(),
            self.failed()
        );
        out
    }

    pub fn print(&self) {
        print!("{}", self.render());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_rows_print_nan_and_fail() {
        let mut report = Report::default();
        report.compare("w", &[3], &[1.0, f32::NAN, 3.0], &[1.0, 2.0, 3.0], 1e-4);
        report.compare("ok", &[2], &[1.0, 2.0], &[1.0, 2.0], 1e-4);
        report.exact("independence", &[2], f64::NAN);
        let (nan, ok, exact) = (&report.rows[0], &report.rows[1], &report.rows[2]);
        assert!(nan.rel_l2.is_nan() && nan.max_abs.is_nan(), "{nan:?}");
        assert!(!nan.pass);
        assert!(ok.pass && ok.rel_l2 == 0.0 && ok.max_abs == 0.0, "{ok:?}");
        assert!(exact.rel_l2.is_nan() && !exact.pass, "{exact:?}");
        let text = report.render();
        let line = text.lines().find(|l| l.starts_with("w ")).unwrap();
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cols, ["w", "[3]", "NaN", "NaN", "1.0e-4", "FAIL"], "{line}");
        assert_eq!(text.lines().last(), Some("verify: 1 passed, 2 failed"));
    }
}
