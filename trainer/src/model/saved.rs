//! What a decoder layer keeps from its forward for its backward, and where: the memory
//! features `train.recompute` and `train.offload_activations` of the language model's layers
//! (the vision tower's layers always keep everything on the device).
//!
//! A layer's forward makes its input `x` and the thirteen tensors of
//! [`BlockActs`]. What it keeps ([`Recompute`]):
//!
//! ```text
//! none        x + all 13                                    (nothing recomputed)
//! selective   x + q, k, v, att, lse, mid, gate, up          ln1 + rstd1, ln2 + rstd2, h made
//!                                                           again: two RMSNorms and the SwiGLU
//!                                                           product, no GEMM, no attention
//! full        x                                             the whole layer forward again
//! ```
//!
//! Selective keeps the products of the expensive ops (every GEMM output, the attention output
//! and its log-sum-exp) and recomputes the elementwise ones from them: per layer it saves
//! `a·T·(2·D + I) + 8·T` bytes (`a` the activation storage bytes) for three memory-bound
//! passes over `[T,D]`/`[T,I]`. Full saves everything but `x` for one more layer forward.
//! Recompute calls the forward's own kernels on the same inputs in the same order
//! ([`block_forward`], [`norm_store`], [`gated_store`]), so the gradients are bit-identical
//! to keeping everything.
//!
//! Offload ([`SavedSlot::Host`]): after layer `l`'s forward, what it keeps (its input included) is
//! queued for the host pool ([`super::offload`]); the device copies are freed after layer
//! `l+1`'s forward (when the copy has surely finished: on an NPU it overlapped that layer).
//! The last layer is not offloaded (its backward comes first). In the backward, layer `l-1`'s
//! tensors are reloaded when layer `l`'s backward starts, so their copy overlaps it; at most
//! two layers' worth is back on the device at a time. The figures of each case are in
//! [`super::memory`].

use super::block::{
    block_forward, gated_store, norm_store, BlockActs, BlockCtx, BlockRefs, BlockWeights,
    FwdScratch,
};
use super::precision::ActElem;
use super::ModelError;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{CachingAllocator, Element, Stream};
use cannon_runtime::{HostPool, HostTensor};
use std::sync::Arc;

type Result<T> = std::result::Result<T, KernelError>;

/// `train.recompute`: what a decoder layer keeps for its backward (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recompute {
    #[default]
    None,
    Selective,
    Full,
}

/// The memory features of a run: `train.recompute`, `train.offload_activations` (both read
/// by the decoder's passes) and `train.offload_optimizer` (read by the optimizers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryFeatures {
    pub recompute: Recompute,
    /// Saved decoder activations go to the exec's host pool between forward and backward.
    pub offload_activations: bool,
    /// The f32 master weights and AdamW moments live in the exec's host pool, copied to the
    /// device per group for the passes and the update (`super::optim`).
    pub offload_optimizer: bool,
}

impl MemoryFeatures {
    /// Whether anything goes to a host pool (the exec needs one).
    pub fn needs_host_pool(&self) -> bool {
        self.offload_activations || self.offload_optimizer
    }
}

/// One saved tensor: on the device, offloaded to the host, or not kept (recomputed).
#[derive(Debug)]
pub enum SavedSlot<T: Element> {
    Device(Tensor<T>),
    // Boxed: a host tensor (with its copy event under `npu`) is several times a device one.
    Host(Box<HostTensor<T>>),
    Dropped,
}

impl<T: Element> SavedSlot<T> {
    fn offload(&mut self, pool: &HostPool, st: &Stream) -> Result<()> {
        if let SavedSlot::Device(_) = self {
            if let SavedSlot::Device(t) = std::mem::replace(self, SavedSlot::Dropped) {
                let shape = t.shape().to_vec();
                *self = SavedSlot::Host(Box::new(pool.offload(st, t.into_buffer(), &shape)?));
            }
        }
        Ok(())
    }

    fn settle(&mut self) -> Result<()> {
        match self {
            SavedSlot::Host(h) => Ok(h.settle()?),
            _ => Ok(()),
        }
    }

    fn reload(
        &self,
        pool: &HostPool,
        alloc: &Arc<CachingAllocator>,
        st: &Stream,
    ) -> Result<Option<Tensor<T>>> {
        match self {
            SavedSlot::Host(h) => {
                let buf = pool.reload(alloc, st, h)?;
                Ok(Some(Tensor::from_buffer(buf, h.shape())?))
            }
            _ => Ok(None),
        }
    }

    fn is_dropped(&self) -> bool {
        matches!(self, SavedSlot::Dropped)
    }
}

/// What one decoder layer keeps: its input and the [`BlockActs`] tensors, each a [`SavedSlot`].
#[derive(Debug)]
pub struct LayerSaved<A: Element> {
    /// `[T,D]` the layer's input.
    pub x: SavedSlot<f32>,
    pub rstd1: SavedSlot<f32>,
    pub ln1: SavedSlot<A>,
    pub q: SavedSlot<A>,
    pub k: SavedSlot<A>,
    pub v: SavedSlot<A>,
    pub att: SavedSlot<A>,
    pub lse: SavedSlot<f32>,
    pub mid: SavedSlot<f32>,
    pub rstd2: SavedSlot<f32>,
    pub ln2: SavedSlot<A>,
    pub gate: SavedSlot<f32>,
    pub up: SavedSlot<f32>,
    pub h: SavedSlot<A>,
    /// Under context parallelism: the attention output in the head-sharded layout (kept,
    /// offloaded or dropped with `att`); None without CP.
    pub att_cp: Option<SavedSlot<A>>,
}

/// The device tensors of one layer's backward that are not in its [`LayerSaved`]'s device
/// slots: reloaded from the host or recomputed. Freed when the layer's backward is done.
#[derive(Debug)]
pub struct Restored<A: Element> {
    x: Option<Tensor<f32>>,
    rstd1: Option<Tensor<f32>>,
    ln1: Option<Tensor<A>>,
    q: Option<Tensor<A>>,
    k: Option<Tensor<A>>,
    v: Option<Tensor<A>>,
    att: Option<Tensor<A>>,
    lse: Option<Tensor<f32>>,
    mid: Option<Tensor<f32>>,
    rstd2: Option<Tensor<f32>>,
    ln2: Option<Tensor<A>>,
    gate: Option<Tensor<f32>>,
    up: Option<Tensor<f32>>,
    h: Option<Tensor<A>>,
    att_cp: Option<Tensor<A>>,
}

fn dev<T: Element>(t: Tensor<T>) -> SavedSlot<T> {
    SavedSlot::Device(t)
}

fn pick<'a, T: Element>(
    name: &'static str,
    slot: &'a SavedSlot<T>,
    held: &'a Option<Tensor<T>>,
) -> Result<&'a Tensor<T>> {
    match (held, slot) {
        (Some(t), _) | (None, SavedSlot::Device(t)) => Ok(t),
        _ => Err(KernelError::InvalidArgument {
            op: "decoder backward",
            detail: format!("the saved tensor {name} was neither reloaded nor recomputed"),
        }),
    }
}

impl<A: ActElem> LayerSaved<A> {
    /// What the layer with input `x` and activations `a` keeps under `r`; the rest is freed.
    pub fn keep(x: Tensor<f32>, a: BlockActs<A>, r: Recompute) -> Self {
        let all = LayerSaved {
            x: dev(x),
            rstd1: dev(a.rstd1),
            ln1: dev(a.ln1),
            q: dev(a.q),
            k: dev(a.k),
            v: dev(a.v),
            att: dev(a.att),
            lse: dev(a.lse),
            mid: dev(a.mid),
            rstd2: dev(a.rstd2),
            ln2: dev(a.ln2),
            gate: dev(a.gate),
            up: dev(a.up),
            h: dev(a.h),
            att_cp: a.att_cp.map(dev),
        };
        match r {
            Recompute::None => all,
            Recompute::Selective => LayerSaved {
                rstd1: SavedSlot::Dropped,
                ln1: SavedSlot::Dropped,
                rstd2: SavedSlot::Dropped,
                ln2: SavedSlot::Dropped,
                h: SavedSlot::Dropped,
                ..all
            },
            Recompute::Full => LayerSaved {
                x: all.x,
                rstd1: SavedSlot::Dropped,
                ln1: SavedSlot::Dropped,
                q: SavedSlot::Dropped,
                k: SavedSlot::Dropped,
                v: SavedSlot::Dropped,
                att: SavedSlot::Dropped,
                lse: SavedSlot::Dropped,
                mid: SavedSlot::Dropped,
                rstd2: SavedSlot::Dropped,
                ln2: SavedSlot::Dropped,
                gate: SavedSlot::Dropped,
                up: SavedSlot::Dropped,
                h: SavedSlot::Dropped,
                att_cp: all.att_cp.map(|_| SavedSlot::Dropped),
            },
        }
    }

    /// Queues every device slot for the host (the device tensors live until [`Self::settle`]).
    pub fn offload(&mut self, pool: &HostPool, st: &Stream) -> Result<()> {
        self.x.offload(pool, st)?;
        self.rstd1.offload(pool, st)?;
        self.ln1.offload(pool, st)?;
        self.q.offload(pool, st)?;
        self.k.offload(pool, st)?;
        self.v.offload(pool, st)?;
        self.att.offload(pool, st)?;
        self.lse.offload(pool, st)?;
        self.mid.offload(pool, st)?;
        self.rstd2.offload(pool, st)?;
        self.ln2.offload(pool, st)?;
        self.gate.offload(pool, st)?;
        self.up.offload(pool, st)?;
        self.h.offload(pool, st)?;
        match self.att_cp.as_mut() {
            Some(s) => s.offload(pool, st),
            None => Ok(()),
        }
    }

    /// Waits for the copies of [`Self::offload`] and frees the device tensors.
    pub fn settle(&mut self) -> Result<()> {
        self.x.settle()?;
        self.rstd1.settle()?;
        self.ln1.settle()?;
        self.q.settle()?;
        self.k.settle()?;
        self.v.settle()?;
        self.att.settle()?;
        self.lse.settle()?;
        self.mid.settle()?;
        self.rstd2.settle()?;
        self.ln2.settle()?;
        self.gate.settle()?;
        self.up.settle()?;
        self.h.settle()?;
        match self.att_cp.as_mut() {
            Some(s) => s.settle(),
            None => Ok(()),
        }
    }

    /// Whether the layer's forward runs again in its backward (full recompute).
    pub fn q_dropped(&self) -> bool {
        self.q.is_dropped()
    }

    /// Whether the layer's norms run again in its backward (selective or full recompute).
    pub fn ln1_dropped(&self) -> bool {
        self.ln1.is_dropped()
    }

    /// Whether any slot is on the host (the layer's backward needs a reload first).
    pub fn offloaded(&self) -> bool {
        matches!(self.x, SavedSlot::Host(_))
    }

    /// Queues the reload of every host slot onto the device (`alloc`'s), in slot order.
    pub fn reload(&self, exec: &DeviceCtx) -> Result<Restored<A>> {
        let (st, alloc) = (exec.stream(), exec.allocator());
        let Some(pool) = exec.host_pool().filter(|_| self.offloaded()) else {
            return Ok(Restored::empty());
        };
        Ok(Restored {
            x: self.x.reload(pool, alloc, st)?,
            rstd1: self.rstd1.reload(pool, alloc, st)?,
            ln1: self.ln1.reload(pool, alloc, st)?,
            q: self.q.reload(pool, alloc, st)?,
            k: self.k.reload(pool, alloc, st)?,
            v: self.v.reload(pool, alloc, st)?,
            att: self.att.reload(pool, alloc, st)?,
            lse: self.lse.reload(pool, alloc, st)?,
            mid: self.mid.reload(pool, alloc, st)?,
            rstd2: self.rstd2.reload(pool, alloc, st)?,
            ln2: self.ln2.reload(pool, alloc, st)?,
            gate: self.gate.reload(pool, alloc, st)?,
            up: self.up.reload(pool, alloc, st)?,
            h: self.h.reload(pool, alloc, st)?,
            att_cp: match &self.att_cp {
                Some(s) => s.reload(pool, alloc, st)?,
                None => None,
            },
        })
    }

    /// The layer's input on the device.
    pub fn input<'a>(&'a self, held: &'a Restored<A>) -> Result<&'a Tensor<f32>> {
        pick("x", &self.x, &held.x)
    }

    /// Makes what the layer did not keep again, into `held`: the whole forward (`full`, the
    /// layer's output going to `out [T,D]`) or the norms and the SwiGLU product
    /// (`selective`), with the forward's kernels on the same inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn recompute(
        &self,
        exec: &DeviceCtx,
        held: &mut Restored<A>,
        c: &BlockCtx,
        w: &BlockWeights,
        s: &mut FwdScratch,
        out: Option<&mut Tensor<f32>>,
    ) -> std::result::Result<(), ModelError> {
        let st = exec.stream();
        let d = &c.dims;
        let t = c.pos.len();
        if self.q.is_dropped() {
            let out = out.ok_or_else(|| KernelError::InvalidArgument {
                op: "full recompute",
                detail: "no output tensor for the layer's forward".into(),
            })?;
            // Under CP the layer's attention tensors are head-sharded: the same shapes as
            // its forward's, and the same collectives in the same order on every rank.
            let mut acts = BlockActs::for_ctx(exec, c, t)?;
            let x = self.input(held)?;
            block_forward(st, c, w, &mut acts, s, &x.view(), &mut out.view_mut())?;
            held.rstd1 = Some(acts.rstd1);
            held.ln1 = Some(acts.ln1);
            held.q = Some(acts.q);
            held.k = Some(acts.k);
            held.v = Some(acts.v);
            held.att = Some(acts.att);
            held.lse = Some(acts.lse);
            held.mid = Some(acts.mid);
            held.rstd2 = Some(acts.rstd2);
            held.ln2 = Some(acts.ln2);
            held.gate = Some(acts.gate);
            held.up = Some(acts.up);
            held.h = Some(acts.h);
            held.att_cp = acts.att_cp;
            return Ok(());
        }
        if self.ln1.is_dropped() {
            let (mut rstd1, mut ln1) = (exec.empty(&[t])?, exec.empty(&[t, d.d])?);
            let x = self.input(held)?.view();
            norm_store(st, d, s, &x, &w.attn_norm, &mut rstd1, &mut ln1)?;
            let (mut rstd2, mut ln2) = (exec.empty(&[t])?, exec.empty(&[t, d.d])?);
            let mid = pick("mid", &self.mid, &held.mid)?.view();
            norm_store(st, d, s, &mid, &w.mlp_norm, &mut rstd2, &mut ln2)?;
            let mut h = exec.empty(&[t, d.inter])?;
            let gate = pick("gate", &self.gate, &held.gate)?;
            let up = pick("up", &self.up, &held.up)?;
            gated_store(st, d, s, gate, up, &mut h)?;
            held.rstd1 = Some(rstd1);
            held.ln1 = Some(ln1);
            held.rstd2 = Some(rstd2);
            held.ln2 = Some(ln2);
            held.h = Some(h);
        }
        Ok(())
    }

    /// The tensors the block backward reads, from the device slots and `held`.
    pub fn refs<'a>(&'a self, held: &'a Restored<A>) -> Result<BlockRefs<'a, A>> {
        Ok(BlockRefs {
            rstd1: pick("rstd1", &self.rstd1, &held.rstd1)?,
            ln1: pick("ln1", &self.ln1, &held.ln1)?,
            q: pick("q", &self.q, &held.q)?,
            k: pick("k", &self.k, &held.k)?,
            v: pick("v", &self.v, &held.v)?,
            att: pick("att", &self.att, &held.att)?,
            lse: pick("lse", &self.lse, &held.lse)?,
            mid: pick("mid", &self.mid, &held.mid)?,
            rstd2: pick("rstd2", &self.rstd2, &held.rstd2)?,
            ln2: pick("ln2", &self.ln2, &held.ln2)?,
            gate: pick("gate", &self.gate, &held.gate)?,
            up: pick("up", &self.up, &held.up)?,
            h: pick("h", &self.h, &held.h)?,
            att_cp: match &self.att_cp {
                Some(s) => Some(pick("att_cp", s, &held.att_cp)?),
                None => None,
            },
        })
    }
}

impl<A: Element> Restored<A> {
    /// Nothing held.
    pub fn empty() -> Self {
        Restored {
            x: None,
            rstd1: None,
            ln1: None,
            q: None,
            k: None,
            v: None,
            att: None,
            lse: None,
            mid: None,
            rstd2: None,
            ln2: None,
            gate: None,
            up: None,
            h: None,
            att_cp: None,
        }
    }
}
