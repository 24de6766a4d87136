//! Global-norm gradient clipping and AdamW over the flat groups, on the `cannon_kernels`
//! `grad_clip` and `adamw` device-level ops (torch semantics).
//!
//! Optimizer state (m, v) lives per group on the model's device, beside the group's gradient,
//! and only for groups that train (frozen groups have no gradient and so no state). The f32
//! parameters are the master weights: AdamW updates them in place. There is no separate
//! compute copy (even in bf16 the GEMMs round the f32 weights on the fly: `super::precision`),
//! so the master weights are also what every forward reads.
//!
//! With `train.offload_optimizer` ([`AdamW::offload`]) the master weights and the moments
//! live in the exec's host pool ([`super::offload::Stored::Host`]; pinned memory on an NPU),
//! as ZeRO-Offload and FSDP2's CPU offload policy keep them:
//!
//! ```text
//! forward, backward   each group copied to the device at its point of use, the next one
//!                     ahead, freed after use (Params::fetch, super::source); gradients
//!                     stay on the device, and so do the clip and the norm
//! update              per trained group: p, m, v copied to the device, the same AdamW
//!                     kernel, p, m, v copied back (adamw_group): bit for bit the device
//!                     update, with at most one group's state on the device
//! ```
//!
//! An FSDP rank (`crate::parallel::fsdp`) keeps its `[shard]` masters and moments there the same way
//! and copies a shard into a staging buffer before each all-gather.

use super::grads::Grads;
use super::offload::Stored;
use super::params::Params;
use super::ModelError;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{ops, KernelError, Tensor};
use cannon_runtime::HostPool;
use cannon_runtime::{BufferView, BufferViewMut, Stream};

/// AdamW hyper-parameters (torch.optim.AdamW names).
pub use cannon_kernels::adamw::AdamW as AdamWConfig;

/// `torch.nn.utils.clip_grad_norm_` over every gradient group: scales them all by
/// `max_norm / (total + 1e-6)` when that is below 1 and returns the total L2 norm before
/// clipping. `max_norm <= 0` (or infinite) only measures.
pub fn clip_grad_norm(
    stream: &Stream,
    grads: &mut Grads,
    max_norm: f64,
) -> Result<f64, KernelError> {
    if max_norm > 0.0 && max_norm.is_finite() {
        let mut views: Vec<BufferViewMut<'_, f32>> = grads
            .data
            .iter_mut()
            .flatten()
            .map(Tensor::view_mut)
            .collect();
        ops::clip_grad_norm(stream, &mut views, max_norm)
    } else {
        let views: Vec<BufferView<'_, f32>> =
            grads.data.iter().flatten().map(Tensor::view).collect();
        Ok(ops::grad_sum_squares(stream, &views)?.sqrt())
    }
}

/// AdamW state: step count and the moments of every trained group.
#[derive(Debug)]
pub struct AdamW {
    pub cfg: AdamWConfig,
    pub step: u64,
    pub m: Vec<Option<Stored>>,
    pub v: Vec<Option<Stored>>,
    /// The host pool the offloaded state is in (set by [`AdamW::offload`]).
    pool: Option<std::sync::Arc<HostPool>>,
}

impl AdamW {
    /// Zero moments on `exec`'s device for the groups `grads` holds.
    pub fn new(exec: &DeviceCtx, cfg: AdamWConfig, grads: &Grads) -> Result<Self, ModelError> {
        let zeros = |g: &Tensor<f32>| Ok(Stored::Device(exec.zeros(g.shape())?));
        Self::with_zero_moments(cfg, grads, zeros, None)
    }

    /// Zeroed moments for the trained groups of `grads`, each made by `zeros(gradient)`.
    fn with_zero_moments(
        cfg: AdamWConfig,
        grads: &Grads,
        zeros: impl Fn(&Tensor<f32>) -> Result<Stored, KernelError>,
        pool: Option<std::sync::Arc<HostPool>>,
    ) -> Result<Self, ModelError> {
        let moments = || -> Result<Vec<Option<Stored>>, KernelError> {
            grads
                .data
                .iter()
                .map(|g| g.as_ref().map(&zeros).transpose())
                .collect()
        };
        Ok(AdamW {
            cfg,
            step: 0,
            m: moments()?,
            v: moments()?,
            pool,
        })
    }

    /// [`AdamW::new`] with the moments made in `exec`'s host pool (the optimizer offload),
    /// never on the device; the parameters are offloaded separately ([`Params::offload`]).
    pub fn new_in_host_pool(
        exec: &DeviceCtx,
        cfg: AdamWConfig,
        grads: &Grads,
    ) -> Result<Self, ModelError> {
        let pool = exec.host_pool().ok_or_else(|| {
            ModelError::Input(
                "optimizer offload needs an exec with a host pool (DeviceCtx::with_host_pool)"
                    .into(),
            )
        })?;
        let zeros = |g: &Tensor<f32>| {
            let h = pool.from_values(&vec![0f32; g.numel()])?;
            Ok(Stored::Host(Box::new(h)))
        };
        Self::with_zero_moments(cfg, grads, zeros, Some(pool.clone()))
    }

    /// A state of `step` steps with the given moments (one entry per group, Some for the
    /// trained ones), on the device they are on.
    pub fn from_moments(
        cfg: AdamWConfig,
        step: u64,
        m: Vec<Option<Tensor<f32>>>,
        v: Vec<Option<Tensor<f32>>>,
    ) -> Self {
        let stored = |ts: Vec<Option<Tensor<f32>>>| -> Vec<Option<Stored>> {
            ts.into_iter().map(|t| t.map(Stored::Device)).collect()
        };
        AdamW {
            cfg,
            step,
            m: stored(m),
            v: stored(v),
            pool: None,
        }
    }

    /// One step of `torch.optim.AdamW` at learning rate `lr` on every trained group.
    pub fn update(
        &mut self,
        stream: &Stream,
        params: &mut Params,
        grads: &Grads,
        lr: f64,
    ) -> Result<(), KernelError> {
        self.step += 1;
        let hp = AdamWConfig { lr, ..self.cfg };
        let pool = self.pool.as_deref();
        for (((p, g), m), v) in params
            .data
            .iter_mut()
            .zip(&grads.data)
            .zip(&mut self.m)
            .zip(&mut self.v)
        {
            if let (Some(g), Some(m), Some(v)) = (g, m.as_mut(), v.as_mut()) {
                adamw_group(stream, pool, p, g, m, v, self.step, &hp)?;
            }
        }
        Ok(())
    }

    /// Moves the master weights `params` and the moments into `exec`'s host pool
    /// (`train.offload_optimizer`, see the module docs): from then on a pass fetches each
    /// group and [`AdamW::update`] streams each group's state through the device. What is
    /// there already stays (a resumed run calls it again).
    pub fn offload(&mut self, exec: &DeviceCtx, params: &mut Params) -> Result<(), ModelError> {
        let pool = exec.host_pool().ok_or_else(|| {
            ModelError::Input(
                "optimizer offload needs an exec with a host pool (DeviceCtx::with_host_pool)"
                    .into(),
            )
        })?;
        params.offload(exec)?;
        offload_all(pool, exec.stream(), &mut self.m)?;
        offload_all(pool, exec.stream(), &mut self.v)?;
        self.pool = Some(pool.clone());
        Ok(())
    }
}

/// Moves every tensor of `ts` into `pool` (those already there stay).
pub fn offload_all(
    pool: &HostPool,
    st: &Stream,
    ts: &mut [Option<Stored>],
) -> Result<(), KernelError> {
    for t in ts.iter_mut().flatten() {
        t.offload(pool, st)?;
    }
    Ok(())
}

/// A device tensor to compute on: the copy made for the update, or the stored tensor itself.
fn on_device<'a>(
    copy: &'a mut Option<Tensor<f32>>,
    stored: &'a mut Stored,
) -> Result<&'a mut Tensor<f32>, KernelError> {
    match copy {
        Some(t) => Ok(t),
        None => stored
            .device_tensor_mut()
            .ok_or_else(|| no_pool("a host tensor without its device copy")),
    }
}

fn no_pool(detail: &str) -> KernelError {
    KernelError::InvalidArgument {
        op: "adamw_group",
        detail: detail.into(),
    }
}

/// One AdamW step of one group: in place for what is on the device; the parameters `p` and
/// moments `m`, `v` held in the host pool `pool` (the optimizer offload) are copied to device
/// tensors (from the gradient's allocator) for the update and back, one group at a time, so
/// the device holds at most one group's optimizer state. The same kernel runs on the same
/// values either way, so the result is bit-identical.
#[allow(clippy::too_many_arguments)]
pub fn adamw_group(
    st: &Stream,
    pool: Option<&HostPool>,
    p: &mut Stored,
    g: &Tensor<f32>,
    m: &mut Stored,
    v: &mut Stored,
    step: u64,
    hp: &AdamWConfig,
) -> Result<(), KernelError> {
    let device = g.buffer().allocator().clone();
    let bring = |s: &Stored| -> Result<Option<Tensor<f32>>, KernelError> {
        match s {
            Stored::Device(_) => Ok(None),
            Stored::Host(h) => {
                let pool = pool.ok_or_else(|| no_pool("host optimizer state without a pool"))?;
                let buf = pool.reload(&device, st, h)?;
                Ok(Some(Tensor::from_buffer(buf, h.shape())?))
            }
        }
    };
    let (mut pd, mut md, mut vd) = (bring(p)?, bring(m)?, bring(v)?);
    let streamed = pd.is_some() || md.is_some() || vd.is_some();
    if let (true, Some(pool)) = (streamed, pool) {
        pool.wait(st, &pool.mark()?)?;
    }
    {
        let pv = &mut on_device(&mut pd, p)?.view_mut();
        let mv = &mut on_device(&mut md, m)?.view_mut();
        let vv = &mut on_device(&mut vd, v)?.view_mut();
        ops::adamw_step(st, pv, &g.view(), mv, vv, step, hp)?;
    }
    for (copy, stored) in [(pd, p), (md, m), (vd, v)] {
        if let (Some(t), Stored::Host(h), Some(pool)) = (copy, stored, pool) {
            pool.store_into(st, &t.view(), h)?;
        }
    }
    Ok(())
}
