//! The range and consistency checks of a [`TrainConfig`] ([`TrainConfig::validate`]), each
//! error naming its key: apart from the sections' declarations so that those read as the
//! file's layout and defaults.

use super::{preset, ConfigError, DeviceKind, ParallelSection, Resume, TrainConfig};

impl TrainConfig {
    /// Values out of range, inconsistent combinations and what is not wired yet, each error
    /// naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let m = &self.model;
        let d = &self.data;
        let t = &self.train;
        if m.config.trim().is_empty() {
            return invalid("model.config", "\"\"", "must name a preset or a directory");
        }
        if let Some(v) = d.vocab_size {
            if v == 0 {
                return invalid("data.vocab_size", v, "must be > 0");
            }
        }
        positive("data.max_len", d.max_len)?;
        if d.cache_dir
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return invalid("data.cache_dir", "\"\"", "must name a folder");
        }
        if let Some(e) = d.longest_edge {
            positive("data.longest_edge", e as usize)?;
        }
        for (key, v) in [
            ("data.image_max_pixels", d.image_max_pixels),
            ("data.image_min_pixels", d.image_min_pixels),
        ] {
            if v == Some(0) {
                return invalid(key, 0, "must be > 0");
            }
        }
        if let (Some(max), Some(min)) = (d.image_max_pixels, d.image_min_pixels) {
            if min > max {
                return invalid(
                    "data.image_min_pixels",
                    min,
                    format!("must be <= data.image_max_pixels ({max})"),
                );
            }
        }
        if d.system.as_deref() == Some("model") && preset::sizes(&m.config).is_some() {
            return invalid(
                "data.system",
                "\"model\"",
                "reads SYSTEM_PROMPT.txt from the model folder, and model.config is a preset",
            );
        }
        if d.synth_samples < 20 {
            return invalid(
                "data.synth_samples",
                d.synth_samples,
                "must be >= 20 (one in ten is held out)",
            );
        }
        positive("train.micro_batch", t.micro_batch)?;
        positive("train.grad_accum", t.grad_accum)?;
        positive("train.eval_batch", t.eval_batch)?;
        if let Some([a, b]) = t.profile_steps {
            if a == 0 || b < a {
                return invalid(
                    "train.profile_steps",
                    format!("[{a}, {b}]"),
                    "must be [first, last] steps with 1 <= first <= last",
                );
            }
        }
        if !(0.0..1.0).contains(&d.eval_split) {
            return invalid(
                "data.eval_split",
                d.eval_split,
                "must be a fraction in [0, 1)",
            );
        }
        if d.eval_split > 0.0 && d.eval_dataset.is_some() {
            return invalid(
                "data.eval_split",
                d.eval_split,
                "give either data.eval_split or data.eval_dataset, not both",
            );
        }
        if t.eval_every > 0
            && d.dataset.is_some()
            && d.eval_dataset.is_none()
            && d.eval_split == 0.0
        {
            return invalid(
                "train.eval_every",
                t.eval_every,
                "needs a held-out set: set data.eval_dataset or data.eval_split",
            );
        }
        match (t.steps, t.epochs) {
            (Some(_), Some(_)) => {
                return invalid(
                    "train.epochs",
                    t.epochs.unwrap_or_default(),
                    "give either train.steps or train.epochs, not both",
                )
            }
            (Some(0), _) => return invalid("train.steps", 0, "must be > 0"),
            (_, Some(e)) if !(e > 0.0 && e.is_finite()) => {
                return invalid("train.epochs", e, "must be > 0")
            }
            _ => {}
        }
        finite_positive("train.lr", t.lr)?;
        if !(t.min_lr >= 0.0 && t.min_lr.is_finite()) {
            return invalid("train.min_lr", t.min_lr, "must be >= 0");
        }
        if t.min_lr > t.lr {
            return invalid(
                "train.min_lr",
                t.min_lr,
                format!("must be <= train.lr ({})", t.lr),
            );
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return invalid("train.weight_decay", t.weight_decay, "must be >= 0");
        }
        for (i, b) in t.betas.iter().enumerate() {
            if !(0.0..1.0).contains(b) {
                return invalid(
                    "train.betas",
                    format!("{:?}", t.betas),
                    format!("beta{} = {b} must be in [0, 1)", i + 1),
                );
            }
        }
        finite_positive("train.eps", t.eps)?;
        if t.max_abs_weight.is_nan() || t.max_abs_weight <= 0.0 {
            return invalid("train.max_abs_weight", t.max_abs_weight, "must be > 0");
        }
        if !(t.max_grad_norm >= 0.0 && t.max_grad_norm.is_finite()) {
            return invalid(
                "train.max_grad_norm",
                t.max_grad_norm,
                "must be >= 0 (0: no clipping)",
            );
        }
        positive("parallel.nproc", self.parallel.nproc)?;
        if self.parallel.nproc > 1 && !self.parallel.fsdp {
            return invalid(
                "parallel.fsdp",
                false,
                "more than one rank without sharding is not implemented: set fsdp = true (or \
                 nproc = 1)",
            );
        }
        if self.parallel.device == DeviceKind::Npu {
            if !cfg!(feature = "npu") {
                return invalid(
                    "parallel.device",
                    "npu",
                    "this build has the CPU backend only: build with `--features npu`",
                );
            }
            if self.parallel.nproc > 1 {
                return invalid(
                    "parallel.nproc",
                    self.parallel.nproc,
                    "with parallel.device = npu every rank is its own process on its own NPU: \
                     start them with `cannon launch --nproc N -- train ...` and leave nproc = 1",
                );
            }
        }
        self.parallel.validate_cp()?;
        let c = &self.checkpoint;
        positive("checkpoint.keep_last", c.keep_last)?;
        if let Resume::Path(p) = &c.resume {
            if p.as_os_str().is_empty() {
                return invalid(
                    "checkpoint.resume",
                    "\"\"",
                    "must be a checkpoint directory",
                );
            }
        }
        positive("log.every", self.log.every)?;
        Ok(())
    }
}

impl ParallelSection {
    /// Checks of the CP and EP keys that need no model config (the head counts are checked
    /// with the model, `CpSettings::check`).
    fn validate_cp(&self) -> Result<(), ConfigError> {
        positive("parallel.cp_size", self.cp_size)?;
        positive("parallel.ep_size", self.ep_size)?;
        if self.ep_size > 1 {
            return invalid(
                "parallel.ep_size",
                self.ep_size,
                "expert parallelism does not apply: Magistral-Small-2509 (Mistral3) is a \
                 dense model with no experts; use 1",
            );
        }
        // On the NPU the launched processes are the ranks (nproc stays 1): the run checks
        // cp_size against the job's size when it starts.
        if self.device != DeviceKind::Npu && !self.nproc.is_multiple_of(self.cp_size) {
            return invalid(
                "parallel.cp_size",
                self.cp_size,
                format!(
                    "must divide parallel.nproc = {} (the ranks are dp x cp_size)",
                    self.nproc
                ),
            );
        }
        match (self.cp_algo, self.ulysses_size) {
            (crate::parallel::cp::CpAlgo::Hybrid, None) => invalid(
                "parallel.ulysses_size",
                "(unset)",
                "cp_algo = hybrid needs ulysses_size (Ulysses inside groups of that size, \
                 Ring across them)",
            ),
            (crate::parallel::cp::CpAlgo::Hybrid, Some(u))
                if u == 0 || !self.cp_size.is_multiple_of(u) =>
            {
                invalid(
                    "parallel.ulysses_size",
                    u,
                    format!("must divide parallel.cp_size = {}", self.cp_size),
                )
            }
            (
                algo @ (crate::parallel::cp::CpAlgo::Ulysses | crate::parallel::cp::CpAlgo::Ring),
                Some(u),
            ) => invalid(
                "parallel.ulysses_size",
                u,
                format!("only cp_algo = hybrid uses it (cp_algo is {algo})"),
            ),
            _ => Ok(()),
        }
    }
}

fn invalid<T>(
    key: &'static str,
    value: impl ToString,
    reason: impl Into<String>,
) -> Result<T, ConfigError> {
    Err(ConfigError::Invalid {
        key,
        value: value.to_string(),
        reason: reason.into(),
    })
}

fn positive(key: &'static str, v: usize) -> Result<(), ConfigError> {
    if v == 0 {
        return invalid(key, v, "must be > 0");
    }
    Ok(())
}

fn finite_positive(key: &'static str, v: f64) -> Result<(), ConfigError> {
    if !(v > 0.0 && v.is_finite()) {
        return invalid(key, v, "must be > 0");
    }
    Ok(())
}
