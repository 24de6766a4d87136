//! Where a pass gets each layer group's parameters and puts each group's gradient: the two
//! hooks that let the same forward and backward run on a model that holds all its groups
//! ([`Params`], [`Grads`]) and on one rank of a sharded model (`crate::parallel::fsdp`), which gathers
//! a group just before it is used and reduce-scatters its gradient just after.
//!
//! The model asks for groups in a fixed order, the [`GroupOrder`]:
//!
//! ```text
//! forward    [vision embed, vision layer 0 .. used-1, projector]  (if the batch has images)
//!            text embed, text layer 0 .. Lt-1, text head
//! backward   text head, text layer Lt-1 .. 0    (down to the lowest one that trains, or all
//!                                               when something below needs a gradient)
//!            text embed                          (gradient only: its backward reads no weight)
//!            projector, vision layer used-1 .. 0, vision embed   (when anything there needs it)
//! ```
//!
//! Each group is one step: fetch its weights ([`ParamSource::fetch`]), compute, let the
//! weights go (drop), hand its gradient back ([`GradSink::release`]). One step at a time is
//! what lets a sharded source hold at most the current group and the prefetched next one.
//!
//! The model's own [`Params`] are a view of each group while they are on the device. With
//! the optimizer offload they are in the exec's host pool ([`Params::offload`]) and the
//! [`Streamer`] copies each group to the device at its fetch, issuing the next group's copy
//! of the pass's plan (told by [`ParamSource::begin`]) before returning, as the sharded
//! source issues the next gather: the device holds the current group and the next one. On an
//! NPU the copies run on the host pool's copy stream from pinned memory
//! ([`cannon_runtime::HostPool::reload`]) and the compute stream waits for a group's copy
//! only when it is fetched, so the next group's copy overlaps the current group's compute.

use super::config::Mistral3Config;
use super::grads::{Grads, GroupGrad};
use super::offload::Stored;
use super::params::{ParamLayout, Params, Part};
pub use super::streamer::Streamer;
use super::ModelError;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{BufferView, BufferViewMut};

/// A group's full f32 buffer at its point of use.
#[derive(Debug)]
pub enum GroupWeights<'a> {
    /// The group as the model holds it (one rank: a view, no copy).
    Resident(BufferView<'a, f32>),
    /// A full buffer gathered (or copied in from the host pool) for this use, padded past
    /// `len` to a multiple of the world size; freed when dropped.
    Gathered { buf: Tensor<f32>, len: usize },
}

impl GroupWeights<'_> {
    /// The group's `len` elements.
    pub fn view(&self) -> Result<BufferView<'_, f32>, KernelError> {
        match self {
            GroupWeights::Resident(v) => Ok(*v),
            GroupWeights::Gathered { buf, len } => Ok(buf.view().slice(0..*len)?),
        }
    }
}

/// Gives the pass each group's parameters at the point of use.
pub trait ParamSource {
    fn layout(&self) -> &ParamLayout;

    /// Group `g`'s full buffer. A sharded source gathers it (or takes the gather it issued
    /// as a prefetch) and issues the gather of the next group of the plan before returning,
    /// so that on an asynchronous backend it overlaps the compute of `g`.
    fn fetch(&self, g: usize) -> Result<GroupWeights<'_>, ModelError>;

    /// The pass about to run fetches the groups `order` in that order (its [`GroupOrder`]'s
    /// forward, or the fetching steps of its backward): a source that copies groups in may
    /// issue each next copy ahead. A sharded source knows its plan already.
    fn begin(&self, _order: &[usize]) -> Result<(), ModelError> {
        Ok(())
    }
}

/// Takes the gradients the pass computes, one group at a time.
pub trait GradSink {
    /// Whether group `g` trains (has a gradient).
    fn trains(&self, g: usize) -> bool;

    /// Group `g`'s full gradient (`[len]`, accumulated into), or None when it does not train.
    /// A sharded sink allocates it zeroed on the first call of a step.
    fn grad(&mut self, g: usize) -> Result<Option<BufferViewMut<'_, f32>>, ModelError>;

    /// The pass is done with group `g`'s gradient: a sharded sink reduce-scatters it into
    /// this rank's shard and frees it; resident gradients stay as they are.
    fn release(&mut self, g: usize) -> Result<(), ModelError>;
}

impl ParamSource for Params {
    fn layout(&self) -> &ParamLayout {
        &self.layout
    }

    fn fetch(&self, g: usize) -> Result<GroupWeights<'_>, ModelError> {
        Resident::new(&self.layout, &self.data, self.streamer.as_ref()).group(g)
    }

    fn begin(&self, order: &[usize]) -> Result<(), ModelError> {
        Resident::new(&self.layout, &self.data, self.streamer.as_ref()).begin(order)
    }
}

/// Whole groups held by their owner, lent to a pass: a device group as a view (no copy), a
/// group in the host pool copied in by `streamer` (the next one ahead). [`Params`] lends
/// itself this way, and so does an FSDP rank of a world of one, whose shards are the groups.
#[derive(Clone, Copy, Debug)]
pub struct Resident<'a> {
    layout: &'a ParamLayout,
    data: &'a [Stored],
    streamer: Option<&'a Streamer>,
}

impl<'a> Resident<'a> {
    pub fn new(
        layout: &'a ParamLayout,
        data: &'a [Stored],
        streamer: Option<&'a Streamer>,
    ) -> Self {
        Resident {
            layout,
            data,
            streamer,
        }
    }
}

impl<'a> Resident<'a> {
    /// Group `g` for the pass (borrowing the owner's data, not this handle).
    pub fn group(self, g: usize) -> Result<GroupWeights<'a>, ModelError> {
        let t = self
            .data
            .get(g)
            .ok_or_else(|| ModelError::no_group(g, self.data.len()))?;
        match t {
            Stored::Device(t) => Ok(GroupWeights::Resident(t.view())),
            Stored::Host(_) => {
                let s = self.streamer.ok_or_else(|| {
                    ModelError::Input(format!(
                        "group {g} is in a host pool but the parameters were not offloaded \
                         through Params::offload (no device to copy it to)"
                    ))
                })?;
                let buf = s.fetch(self.data, g)?;
                Ok(GroupWeights::Gathered {
                    buf,
                    len: self.layout.groups[g].len,
                })
            }
        }
    }
}

impl ParamSource for Resident<'_> {
    fn layout(&self) -> &ParamLayout {
        self.layout
    }

    fn fetch(&self, g: usize) -> Result<GroupWeights<'_>, ModelError> {
        self.group(g)
    }

    fn begin(&self, order: &[usize]) -> Result<(), ModelError> {
        match self.streamer {
            Some(s) => s.begin(order),
            None => Ok(()),
        }
    }
}

impl GradSink for Grads {
    fn trains(&self, g: usize) -> bool {
        self.has(g)
    }

    fn grad(&mut self, g: usize) -> Result<Option<BufferViewMut<'_, f32>>, ModelError> {
        Ok(self.group_mut(g))
    }

    fn release(&mut self, _g: usize) -> Result<(), ModelError> {
        Ok(())
    }
}

/// Group `g`'s gradient in `sink` with the ranges of its typed view `at` (None if frozen).
pub fn group_grad<'a, S>(
    sink: &'a mut dyn GradSink,
    g: usize,
    at: S,
) -> Result<Option<GroupGrad<'a, S>>, ModelError> {
    Ok(sink.grad(g)?.map(|buf| GroupGrad { buf, at }))
}

/// One step of the backward: a group whose weights are fetched and/or whose gradient is
/// released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardStep {
    pub group: usize,
    /// The step reads the group's weights.
    pub fetch: bool,
    /// The group trains: the step releases its gradient.
    pub release: bool,
}

/// The order in which a pass visits the groups (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupOrder {
    /// Groups the forward fetches, in order.
    pub forward: Vec<usize>,
    /// Steps of the backward, in order.
    pub backward: Vec<BackwardStep>,
}

/// What decides a pass's plan besides the config.
#[derive(Clone, Copy)]
pub struct PlanInputs<'a> {
    /// Whether group `g` trains.
    pub trains: &'a dyn Fn(usize) -> bool,
    /// Whether the batch has images (for data parallel ranks: whether any rank's has).
    pub images: bool,
    /// Whether the pixel gradient is asked for.
    pub dpixels: bool,
}

impl GroupOrder {
    /// The plan [`super::ModelPass::forward`] and [`super::ModelPass::backward`] follow (a test checks
    /// that they do, call for call).
    pub fn new(cfg: &Mistral3Config, layout: &ParamLayout, x: PlanInputs<'_>) -> Self {
        let trains = x.trains;
        let part_trains = |part: Part| {
            (0..layout.groups.len()).any(|g| layout.groups[g].part == part && trains(g))
        };
        let used = cfg.vision_layers_used();
        let mut forward = Vec::new();
        if x.images {
            forward.push(ParamLayout::VISION_EMBED);
            forward.extend((0..used).map(|i| layout.vision_layer(i)));
            forward.push(layout.projector());
        }
        forward.push(layout.text_embed());
        forward.extend((0..layout.text_layers).map(|i| layout.text_layer(i)));
        forward.push(layout.text_head());

        let step = |group: usize, fetch: bool| BackwardStep {
            group,
            fetch,
            release: trains(group),
        };
        let vision_needed = part_trains(Part::Vision) || x.dpixels;
        let image_needed = x.images && (part_trains(Part::Projector) || vision_needed);
        let want_dx0 = trains(layout.text_embed()) || image_needed;
        let mut backward = Vec::new();
        if want_dx0 || (0..layout.groups.len()).any(trains) {
            backward.push(step(layout.text_head(), true));
            for l in (0..layout.text_layers).rev() {
                let below_trains = (0..=l).any(|k| trains(layout.text_layer(k)));
                if !below_trains && !want_dx0 {
                    break;
                }
                backward.push(step(layout.text_layer(l), true));
            }
        }
        if want_dx0 {
            backward.push(step(layout.text_embed(), false));
        }
        if want_dx0 && image_needed {
            backward.push(step(layout.projector(), true));
            if vision_needed {
                backward.extend((0..used).rev().map(|i| step(layout.vision_layer(i), true)));
                let e = ParamLayout::VISION_EMBED;
                if trains(e) || x.dpixels {
                    backward.push(step(e, true));
                }
            }
        }
        GroupOrder { forward, backward }
    }
}
