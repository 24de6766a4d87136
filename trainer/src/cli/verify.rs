//! `cannon verify`: parity of the Mistral3 model against an eager float64 reference fixture
//! (shared/reference/make_reference.py): forward outputs, every gradient, K AdamW steps, and
//! the multi-image independence property. One row per compared tensor, then
//! `verify: N passed, M failed`; exit 1 on any failure, 2 on unusable input.
//!
//! Measure: relative L2 `||a - r|| / max(||r||, 1e-10)` per tensor (DESIGN.md), with the
//! tolerances DESIGN.md fixes per dtype: f32 forward 1e-5, gradients and trained parameters
//! 1e-4; bf16 forward 0.015, gradients and trained parameters 0.04. Independence is exact.

use crate::model::optim::{clip_grad_norm, AdamW, AdamWConfig};
use crate::model::{Act, Batch, Images, LossMode, Mistral3, ModelError, Part, Precision};
use clap::{Args, ValueEnum};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Fixture directory: config.json, the model weights, reference.safetensors.
    #[arg(long)]
    pub reference: PathBuf,
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// AdamW steps to run (default: the fixture's `train.steps`; at most that many).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Chunked loss: at most this many rows of logits at a time (the logits are then never
    /// materialised, so `out.logits` is not compared).
    #[arg(long)]
    pub loss_chunk_size: Option<usize>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceArg {
    Cpu,
    Npu,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeArg {
    F32,
    Bf16,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{path}: {reason}")]
    Reference { path: PathBuf, reason: String },
    #[error("{0}")]
    Unusable(String),
}

/// The fixture's tensors (widened to f64, with their shapes) and metadata.
#[derive(Debug, Clone)]
pub struct Reference {
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
    pub meta: BTreeMap<String, String>,
}

impl Reference {
    pub fn load(path: &Path) -> Result<Self, VerifyError> {
        let bad = |reason: String| VerifyError::Reference {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let data = view.data();
            let values: Vec<f64> = match view.dtype() {
                Dtype::F64 => data
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    .collect(),
                Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as f64)
                    .collect(),
                Dtype::I64 => data
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f64)
                    .collect(),
                other => return Err(bad(format!("tensor {name}: unsupported dtype {other:?}"))),
            };
            tensors.insert(name, (view.shape().to_vec(), values));
        }
        Ok(Reference {
            tensors: tensors.into_iter().collect(),
            meta: meta.into_iter().collect(),
        })
    }

    fn get(&self, name: &str) -> Result<&(Vec<usize>, Vec<f64>), VerifyError> {
        self.tensors
            .get(name)
            .ok_or_else(|| VerifyError::Unusable(format!("reference lacks tensor {name}")))
    }

    fn meta_f64(&self, key: &str) -> Result<f64, VerifyError> {
        let v = self
            .meta
            .get(key)
            .ok_or_else(|| VerifyError::Unusable(format!("reference metadata lacks {key}")))?;
        v.parse()
            .map_err(|_| VerifyError::Unusable(format!("metadata {key} = {v} is not a number")))
    }

    /// The batch in `input.*`.
    pub fn batch(&self) -> Result<Batch, VerifyError> {
        let (ids_shape, ids) = self.get("input.input_ids")?;
        let (_, labels) = self.get("input.labels")?;
        let [rows, seq] = ids_shape[..] else {
            return Err(VerifyError::Unusable(format!(
                "input.input_ids has shape {ids_shape:?}, expected [B, S]"
            )));
        };
        let (pshape, pix) = self.get("input.pixel_values")?;
        let (_, sizes) = self.get("input.image_sizes")?;
        let sizes: Vec<(usize, usize)> = sizes
            .chunks_exact(2)
            .map(|s| (s[0] as usize, s[1] as usize))
            .collect();
        let images = match pshape[..] {
            [n, c, h, w] if n == sizes.len() && !sizes.is_empty() => {
                let pix: Vec<f32> = pix.iter().map(|&x| x as f32).collect();
                Images::from_padded(&pix, [n, c, h, w], &sizes)
                    .map_err(|e| VerifyError::Unusable(format!("input.pixel_values: {e}")))?
            }
            _ if sizes.is_empty() => Images::default(),
            _ => {
                return Err(VerifyError::Unusable(format!(
                    "input.pixel_values {pshape:?} does not match {} image sizes",
                    sizes.len()
                )))
            }
        };
        Ok(Batch {
            input_ids: ids.iter().map(|&x| x as u32).collect(),
            labels: labels.iter().map(|&x| x as i32).collect(),
            rows,
            seq,
            images,
            ..Batch::default()
        })
    }
}

/// One compared tensor.
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub shape: Vec<usize>,
    pub rel_l2: f64,
    pub max_abs: f64,
    pub tol: f64,
    pub pass: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub notes: Vec<String>,
}

impl Report {
    pub fn failed(&self) -> usize {
        self.rows.iter().filter(|r| !r.pass).count()
    }

    pub fn passed(&self) -> usize {
        self.rows.len() - self.failed()
    }

    fn compare(&mut self, name: &str, shape: &[usize], ours: &[f32], r: &[f64], tol: f64) {
        let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
        for (&a, &b) in ours.iter().zip(r) {
            let e = a as f64 - b;
            num += e * e;
            den += b * b;
            max_abs = max_abs.max(e.abs());
        }
        let mut rel_l2 = num.sqrt() / den.sqrt().max(1e-10);
        if ours.len() != r.len() || !rel_l2.is_finite() {
            rel_l2 = f64::INFINITY;
        }
        self.rows.push(Row {
            name: name.to_string(),
            shape: shape.to_vec(),
            rel_l2,
            max_abs,
            tol,
            pass: rel_l2 <= tol,
        });
    }

    /// An exact property: `violations` elements broke it, out of `shape`.
    fn exact(&mut self, name: &str, shape: &[usize], max_abs: f64) {
        self.rows.push(Row {
            name: name.to_string(),
            shape: shape.to_vec(),
            rel_l2: if max_abs == 0.0 { 0.0 } else { f64::INFINITY },
            max_abs,
            tol: 0.0,
            pass: max_abs == 0.0,
        });
    }

    pub fn print(&self) {
        println!(
            "{:<70} {:>16} {:>10} {:>10} {:>8}  result",
            "tensor", "shape", "rel_l2", "max_abs", "tol"
        );
        for r in &self.rows {
            let shape = format!("{:?}", r.shape);
            println!(
                "{:<70} {:>16} {:>10.3e} {:>10.3e} {:>8.1e}  {}",
                r.name,
                shape,
                r.rel_l2,
                r.max_abs,
                r.tol,
                if r.pass { "PASS" } else { "FAIL" }
            );
        }
        for n in &self.notes {
            println!("note: {n}");
        }
        println!("verify: {} passed, {} failed", self.passed(), self.failed());
    }
}

/// Tolerances per dtype (DESIGN.md "Numbers we hold ourselves to").
#[derive(Debug, Clone, Copy)]
pub struct Tolerances {
    pub forward: f64,
    pub grad: f64,
    pub trained: f64,
}

impl Tolerances {
    pub fn for_precision(p: Precision) -> Self {
        match p {
            Precision::F32 => Tolerances {
                forward: 1e-5,
                grad: 1e-4,
                trained: 1e-4,
            },
            Precision::Bf16 => Tolerances {
                forward: 0.015,
                grad: 0.04,
                trained: 0.04,
            },
        }
    }
}

/// Runs every comparison of `model` (f32 master weights) against `r` at precision `prec`
/// (see `model::ops` for what a bf16 run rounds), with `steps` AdamW steps (default: the
/// fixture's).
pub fn verify(
    model: &Mistral3,
    r: &Reference,
    prec: Precision,
    steps: Option<usize>,
) -> Result<Report, VerifyError> {
    match prec {
        Precision::F32 => verify_as::<f32>(model, r, steps),
        Precision::Bf16 => verify_as::<half::bf16>(model, r, steps),
    }
}

fn verify_as<A: Act>(
    model: &Mistral3,
    r: &Reference,
    steps: Option<usize>,
) -> Result<Report, VerifyError> {
    let tol = Tolerances::for_precision(A::PRECISION);
    let batch = r.batch()?;
    let compute = model;
    let mut report = Report::default();

    // Forward.
    let acts = compute.forward::<A>(&batch)?;
    if let Some(v) = &acts.vision {
        let (shape, want) = r.get("out.vision_last_hidden")?;
        report.compare(
            "out.vision_last_hidden",
            shape,
            v.output(),
            want,
            tol.forward,
        );
        let (shape, want) = r.get("out.image_features")?;
        report.compare(
            "out.image_features",
            shape,
            acts.image_features(),
            want,
            tol.forward,
        );
    }
    let (shape, want) = r.get("out.logits")?;
    match acts.logits() {
        Some(logits) => report.compare("out.logits", shape, logits, want, tol.forward),
        None => report
            .notes
            .push("chunked loss: logits never materialised, not compared".into()),
    }
    let (shape, want) = r.get("out.loss")?;
    report.compare("out.loss", shape, &[acts.loss() as f32], want, tol.forward);

    // Backward with everything trainable and the pixel gradient, as the fixture computed.
    let mut grads = compute.grads(&[Part::Vision, Part::Projector, Part::Text]);
    let mut dpix = vec![0.0; batch.images.pixel_values.len()];
    let want_pix = !batch.images.is_empty();
    compute.backward(&batch, &acts, &mut grads, want_pix.then_some(&mut dpix[..]))?;
    let layout = &model.params.layout;
    for (name, (shape, want)) in r.tensors.iter() {
        let Some(param) = name.strip_prefix("grad.") else {
            continue;
        };
        if param == "pixel_values" {
            let (dpix, _) = batch.images.to_padded(&dpix).map_err(ModelError::from)?;
            report.compare(name, shape, &dpix, want, tol.grad);
            continue;
        }
        let ours = grads.get(layout, param).ok_or_else(|| {
            VerifyError::Unusable(format!("reference gradient {name} names no parameter"))
        })?;
        report.compare(name, shape, ours, want, tol.grad);
    }

    independence::<A>(compute, &batch, &mut report)?;

    // K AdamW steps with the fixture's frozen parts.
    let (adamw, max_norm, fixture_steps) = adamw_config(r)?;
    let steps = steps.unwrap_or(fixture_steps);
    if steps > fixture_steps {
        return Err(VerifyError::Unusable(format!(
            "--steps {steps}: the fixture holds {fixture_steps} steps"
        )));
    }
    let spec = r.meta.get("train.frozen").cloned().unwrap_or_default();
    let frozen = frozen_parts(model, &spec)?;
    let (losses, norms, trained) =
        train_steps::<A>(model, &batch, &frozen, adamw, max_norm, steps)?;
    if steps > 0 {
        let as_f32 = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
        let first = |name: &str| -> Result<&[f64], VerifyError> {
            let (_, want) = r.get(name)?;
            want.get(..steps).ok_or_else(|| {
                VerifyError::Unusable(format!("{name} holds {} steps, not {steps}", want.len()))
            })
        };
        let want = first("train.loss")?;
        report.compare("train.loss", &[steps], &as_f32(&losses), want, tol.trained);
        let want = first("train.grad_norm")?;
        report.compare("train.grad_norm", &[steps], &as_f32(&norms), want, tol.grad);
    }
    if steps == fixture_steps {
        for (name, (shape, want)) in r.tensors.iter() {
            let Some(param) = name.strip_prefix("train.final.") else {
                continue;
            };
            let ours = trained.params.get(param).ok_or_else(|| {
                VerifyError::Unusable(format!("reference tensor {name} names no parameter"))
            })?;
            report.compare(name, shape, ours, want, tol.trained);
        }
    } else {
        report.notes.push(format!(
            "{steps} of the fixture's {fixture_steps} steps run: trained parameters not compared"
        ));
    }
    Ok(report)
}

/// Multi-image independence on the batch's images: perturbing image j leaves every other
/// image's vision output and image features bit-identical, and the gradient of image j's
/// features reaches no other image's pixels.
fn independence<A: Act>(
    model: &Mistral3,
    batch: &Batch,
    report: &mut Report,
) -> Result<(), VerifyError> {
    let img = &batch.images;
    if img.len() < 2 {
        report
            .notes
            .push("fewer than 2 images: independence not checked".into());
        return Ok(());
    }
    let cfg = &model.cfg;
    let run = |images: &Images| -> Result<_, VerifyError> {
        let v = crate::model::pixtral::forward::<A>(cfg, &model.params, images)?;
        let p = crate::model::projector::forward(cfg, &model.params, &v.grid, v.output())
            .map_err(ModelError::from)?;
        Ok((v, p))
    };
    let (v0, p0) = run(img)?;
    let dv = cfg.vision_config.hidden_size;
    let d = cfg.text_config.hidden_size;
    let patch_ends = v0.grid.cu_seqlens.clone();
    let feat_counts = crate::model::projector::tokens_per_image(&v0.grid, cfg.spatial_merge_size);
    let feat_ends: Vec<usize> = feat_counts
        .iter()
        .scan(0, |acc, &n| {
            *acc += n;
            Some(*acc)
        })
        .collect();
    let span = |ends: &[usize], i: usize| (if i == 0 { 0 } else { ends[i - 1] })..ends[i];
    let (mut out_diff, mut feat_diff, mut grad_leak) = (0.0f64, 0.0f64, 0.0f64);
    let max_diff = |a: &[f32], b: &[f32]| {
        a.iter()
            .zip(b)
            .map(|(x, y)| {
                if x.to_bits() == y.to_bits() {
                    0.0
                } else {
                    (x - y).abs() as f64 + 1e-30
                }
            })
            .fold(0.0, f64::max)
    };
    for j in 0..img.len() {
        let mut perturbed = img.clone();
        for x in &mut perturbed.pixel_values[img.range(j)] {
            *x = -*x + 0.5;
        }
        let (v1, p1) = run(&perturbed)?;
        for i in (0..img.len()).filter(|&i| i != j) {
            let s = span(&patch_ends, i);
            let (a, b) = (
                &v0.output()[s.start * dv..s.end * dv],
                &v1.output()[s.start * dv..s.end * dv],
            );
            out_diff = out_diff.max(max_diff(a, b));
            let s = span(&feat_ends, i);
            feat_diff = feat_diff.max(max_diff(
                &p0.out[s.start * d..s.end * d],
                &p1.out[s.start * d..s.end * d],
            ));
        }
        // d(sum of image j's features) / d(pixels of the other images) must be exactly 0.
        let mut dfeat = vec![0.0; p0.out.len()];
        let s = span(&feat_ends, j);
        dfeat[s.start * d..s.end * d].fill(1.0);
        let mut grads = model.grads(&[]);
        let mut dpix = vec![0.0; img.pixel_values.len()];
        model.backward_images(batch, &v0, &p0, &dfeat, &mut grads, Some(&mut dpix))?;
        for i in (0..img.len()).filter(|&i| i != j) {
            let other = &dpix[img.range(i)];
            grad_leak = grad_leak.max(other.iter().map(|x| x.abs() as f64).fold(0.0, f64::max));
        }
    }
    let shape = [img.len()];
    report.exact("independence.vision_last_hidden", &shape, out_diff);
    report.exact("independence.image_features", &shape, feat_diff);
    report.exact("independence.grad_pixel_values", &shape, grad_leak);
    Ok(())
}

/// `cannon verify`: exit 0 all pass, 1 a failed comparison, 2 unusable input.
pub fn run(args: VerifyArgs) -> ExitCode {
    if args.device == DeviceArg::Npu {
        if cfg!(feature = "npu") {
            eprintln!("cannon verify: the Mistral3 model has no NPU path yet; use --device cpu");
        } else {
            eprintln!(
                "cannon verify: --device npu needs a build with `--features npu` (this build \
                 has the CPU backend only)"
            );
        }
        return ExitCode::from(2);
    }
    let prec = match args.dtype {
        DtypeArg::F32 => Precision::F32,
        DtypeArg::Bf16 => Precision::Bf16,
    };
    let chunk = args.loss_chunk_size;
    let result = Mistral3::load(&args.reference)
        .map_err(VerifyError::from)
        .and_then(|mut model| {
            if let Some(rows) = chunk {
                if rows == 0 {
                    return Err(VerifyError::Unusable(
                        "--loss-chunk-size must be > 0".into(),
                    ));
                }
                model.loss_mode = LossMode::Chunked(rows);
            }
            let reference = Reference::load(&args.reference.join("reference.safetensors"))?;
            verify(&model, &reference, prec, args.steps)
        });
    match result {
        Ok(report) => {
            report.print();
            if report.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("cannon verify: {e}");
            ExitCode::from(2)
        }
    }
}

/// The parts the fixture's `train.frozen` metadata freezes (`prefix.*` patterns); a pattern
/// that freezes only part of a [`Part`] is unusable (we freeze whole parts).
fn frozen_parts(model: &Mistral3, spec: &str) -> Result<Vec<Part>, VerifyError> {
    let patterns: Vec<&str> = spec
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let matches = |name: &str| {
        patterns.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == *p,
        })
    };
    let mut frozen = Vec::new();
    for part in [Part::Vision, Part::Projector, Part::Text] {
        let names: Vec<&str> = model
            .params
            .layout
            .slots()
            .filter(|(g, _)| model.params.layout.groups[*g].part == part)
            .map(|(_, s)| s.name.as_str())
            .collect();
        let hit = names.iter().filter(|n| matches(n)).count();
        if hit == names.len() && hit > 0 {
            frozen.push(part);
        } else if hit > 0 {
            return Err(VerifyError::Unusable(format!(
                "train.frozen = {spec} freezes part of the {part:?} parameters; only whole parts \
                 (vision tower, projector, language model) can be frozen"
            )));
        }
    }
    Ok(frozen)
}

/// AdamW settings from the fixture metadata.
fn adamw_config(r: &Reference) -> Result<(AdamWConfig, f64, usize), VerifyError> {
    let betas: Vec<f64> = r
        .meta
        .get("train.betas")
        .and_then(|b| serde_json::from_str(b).ok())
        .filter(|b: &Vec<f64>| b.len() == 2)
        .ok_or_else(|| VerifyError::Unusable("metadata train.betas is not [b1, b2]".into()))?;
    let cfg = AdamWConfig {
        lr: r.meta_f64("train.lr")?,
        beta1: betas[0],
        beta2: betas[1],
        eps: r.meta_f64("train.eps")?,
        weight_decay: r.meta_f64("train.weight_decay")?,
    };
    if let Some(s) = r
        .meta
        .get("lr_schedule")
        .filter(|s| s.as_str() != "constant")
    {
        return Err(VerifyError::Unusable(format!(
            "lr_schedule {s} is not supported (constant only)"
        )));
    }
    let steps = r.meta_f64("train.steps")? as usize;
    Ok((cfg, r.meta_f64("train.max_grad_norm")?, steps))
}

/// K AdamW steps on the batch with the given parts frozen: (losses, grad norms, final model).
pub fn train_steps<A: Act>(
    model: &Mistral3,
    batch: &Batch,
    frozen: &[Part],
    adamw: AdamWConfig,
    max_norm: f64,
    steps: usize,
) -> Result<(Vec<f64>, Vec<f64>, Mistral3), VerifyError> {
    let trainable: Vec<Part> = [Part::Vision, Part::Projector, Part::Text]
        .into_iter()
        .filter(|p| !frozen.contains(p))
        .collect();
    let mut master = model.clone();
    let mut grads = master.grads(&trainable);
    let mut opt = AdamW::new(adamw, &grads);
    let (mut losses, mut norms) = (Vec::new(), Vec::new());
    for _ in 0..steps {
        let acts = master.forward::<A>(batch)?;
        grads.zero();
        master.backward(batch, &acts, &mut grads, None)?;
        let kernel = |e| VerifyError::Model(ModelError::Kernel(e));
        norms.push(clip_grad_norm(&mut grads, max_norm).map_err(kernel)?);
        losses.push(acts.loss());
        opt.update(&mut master.params, &grads, adamw.lr)
            .map_err(kernel)?;
    }
    Ok((losses, norms, master))
}
