//! The parameter plan: every layer's parameters live in ONE flat f32 buffer (a "group"), with
//! each tensor at a named offset. FSDP shards, all-gathers and reduce-scatters whole groups;
//! the model code reads a group through a typed view whose fields are the layer's tensors.
//!
//! Groups in forward order (Lv vision layers, Lt text layers):
//!
//! ```text
//! 0            vision embed   model.vision_tower.{patch_conv, ln_pre}
//! 1 ..= Lv     vision layer i model.vision_tower.transformer.layers.{i}.*
//! Lv+1         projector      model.multi_modal_projector.*
//! Lv+2         text embed     model.language_model.embed_tokens
//! Lv+3 ..      text layer i   model.language_model.layers.{i}.*
//! last         text head      model.language_model.norm, lm_head
//! ```
//!
//! Tensor names are transformers 5.x names; shapes are HF's `[out, in]`. Every group is one
//! `[len]` f32 [`Tensor`] on the model's device (the master weights), and so is every
//! gradient group; the host holds only the layout. With the optimizer offload
//! ([`Params::offload`]) the master weights are in the exec's host pool instead
//! ([`Stored::Host`]) and a pass fetches a device copy of each group at its point of use
//! ([`super::source`]).

use super::config::Mistral3Config;
use super::offload::Stored;
use super::streamer::Streamer;
use super::ModelError;
use cannon_kernels::device_ctx::DeviceCtx;
use cannon_kernels::{KernelError, Tensor};
use cannon_runtime::{BufferView, Stream};
use std::ops::Range;

/// Declares a typed view over one flat group: one field per tensor, in buffer order, with the
/// tensor's HF name suffix. `ranges` gives each tensor's element range in the group, `split`
/// carves a group's buffer into read-only views (gradients are windowed one tensor at a time
/// through the ranges: a device buffer lends one mutable view at a time).
macro_rules! flat_group {
    ($(#[$m:meta])* $name:ident { $($field:ident : $hf:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug)]
        pub struct $name<T> {
            $(pub $field: T,)*
        }

        impl<T> $name<T> {
            /// HF name suffixes, in buffer order.
            pub const NAMES: &'static [&'static str] = &[$($hf),*];

            pub fn into_vec(self) -> Vec<T> {
                vec![$(self.$field),*]
            }
        }

        impl $name<Range<usize>> {
            /// Each tensor's element range in a group laid out by `g`.
            pub fn ranges(g: &GroupLayout) -> Self {
                let mut slots = g.slots.iter();
                $(let $field = slots.next().map(ParamSlot::range).unwrap_or(0..0);)*
                $name { $($field),* }
            }
        }

        impl<'a> $name<BufferView<'a, f32>> {
            /// Views `buf` (laid out by `g`) as the named tensors.
            pub fn split(buf: BufferView<'a, f32>, g: &GroupLayout) -> Result<Self, KernelError> {
                let r = $name::ranges(g);
                Ok($name { $($field: buf.slice(r.$field)?),* })
            }
        }
    };
}

flat_group!(
    /// Patch convolution `[Dv, C, p, p]` (no bias) and `ln_pre` `[Dv]`.
    VisionEmbed {
        patch_conv: "patch_conv.weight",
        ln_pre: "ln_pre.weight",
    }
);

flat_group!(
    /// One Pixtral layer: pre-norm attention (no GQA) and gated MLP.
    VisionLayer {
        attn_norm: "attention_norm.weight",
        q: "attention.q_proj.weight",
        k: "attention.k_proj.weight",
        v: "attention.v_proj.weight",
        o: "attention.o_proj.weight",
        ffn_norm: "ffn_norm.weight",
        gate: "feed_forward.gate_proj.weight",
        up: "feed_forward.up_proj.weight",
        down: "feed_forward.down_proj.weight",
    }
);

flat_group!(
    /// RMSNorm, the 2x2 patch merger `[Dv, 4 Dv]`, linear_1 `[D, Dv]`, linear_2 `[D, D]`.
    Projector {
        norm: "norm.weight",
        merge: "patch_merger.merging_layer.weight",
        linear_1: "linear_1.weight",
        linear_2: "linear_2.weight",
    }
);

flat_group!(
    /// Token embedding `[V, D]`.
    TextEmbed {
        embed: "embed_tokens.weight",
    }
);

flat_group!(
    /// One Mistral decoder layer: pre-norm GQA attention and SwiGLU MLP.
    TextLayer {
        attn_norm: "input_layernorm.weight",
        q: "self_attn.q_proj.weight",
        k: "self_attn.k_proj.weight",
        v: "self_attn.v_proj.weight",
        o: "self_attn.o_proj.weight",
        mlp_norm: "post_attention_layernorm.weight",
        gate: "mlp.gate_proj.weight",
        up: "mlp.up_proj.weight",
        down: "mlp.down_proj.weight",
    }
);

flat_group!(
    /// Final norm `[D]` and the (untied) lm_head `[V, D]`.
    TextHead {
        norm: "model.language_model.norm.weight",
        lm_head: "lm_head.weight",
    }
);

/// Which part of the model a group belongs to (the unit of freezing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Part {
    Vision,
    Projector,
    Text,
}

/// One tensor of a group.
#[derive(Clone, Debug)]
pub struct ParamSlot {
    /// Full transformers 5.x parameter name.
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl ParamSlot {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
}

/// The tensors of one flat buffer.
#[derive(Clone, Debug)]
pub struct GroupLayout {
    pub part: Part,
    pub slots: Vec<ParamSlot>,
    /// Elements in the buffer.
    pub len: usize,
}

impl GroupLayout {
    fn new(part: Part, prefix: &str, names: &[&str], shapes: Vec<Vec<usize>>) -> Self {
        let mut offset = 0;
        let slots = names
            .iter()
            .zip(shapes)
            .map(|(n, shape)| {
                let slot = ParamSlot {
                    name: format!("{prefix}{n}"),
                    shape,
                    offset,
                };
                offset += slot.len();
                slot
            })
            .collect();
        GroupLayout {
            part,
            slots,
            len: offset,
        }
    }
}

/// Every group of the model, in forward order (see the module docs).
#[derive(Clone, Debug)]
pub struct ParamLayout {
    pub groups: Vec<GroupLayout>,
    pub vision_layers: usize,
    pub text_layers: usize,
}

impl ParamLayout {
    pub fn new(cfg: &Mistral3Config) -> Self {
        let (t, v) = (&cfg.text_config, &cfg.vision_config);
        let (dv, iv, p, c) = (
            v.hidden_size,
            v.intermediate_size,
            v.patch_size,
            v.num_channels,
        );
        let (d, it, vocab) = (t.hidden_size, t.intermediate_size, t.vocab_size);
        let (hq, hkv, hd) = (t.num_attention_heads, t.num_key_value_heads, t.head_dim());
        let dv_attn = v.num_attention_heads * v.head_dim();
        let m2 = cfg.spatial_merge_size * cfg.spatial_merge_size;
        let mut groups = vec![GroupLayout::new(
            Part::Vision,
            "model.vision_tower.",
            VisionEmbed::<()>::NAMES,
            vec![vec![dv, c, p, p], vec![dv]],
        )];
        for i in 0..v.num_hidden_layers {
            groups.push(GroupLayout::new(
                Part::Vision,
                &format!("model.vision_tower.transformer.layers.{i}."),
                VisionLayer::<()>::NAMES,
                vec![
                    vec![dv],
                    vec![dv_attn, dv],
                    vec![dv_attn, dv],
                    vec![dv_attn, dv],
                    vec![dv, dv_attn],
                    vec![dv],
                    vec![iv, dv],
                    vec![iv, dv],
                    vec![dv, iv],
                ],
            ));
        }
        groups.push(GroupLayout::new(
            Part::Projector,
            "model.multi_modal_projector.",
            Projector::<()>::NAMES,
            vec![vec![dv], vec![dv, dv * m2], vec![d, dv], vec![d, d]],
        ));
        groups.push(GroupLayout::new(
            Part::Text,
            "model.language_model.",
            TextEmbed::<()>::NAMES,
            vec![vec![vocab, d]],
        ));
        for i in 0..t.num_hidden_layers {
            groups.push(GroupLayout::new(
                Part::Text,
                &format!("model.language_model.layers.{i}."),
                TextLayer::<()>::NAMES,
                vec![
                    vec![d],
                    vec![hq * hd, d],
                    vec![hkv * hd, d],
                    vec![hkv * hd, d],
                    vec![d, hq * hd],
                    vec![d],
                    vec![it, d],
                    vec![it, d],
                    vec![d, it],
                ],
            ));
        }
        groups.push(GroupLayout::new(
            Part::Text,
            "",
            TextHead::<()>::NAMES,
            vec![vec![d], vec![vocab, d]],
        ));
        ParamLayout {
            groups,
            vision_layers: v.num_hidden_layers,
            text_layers: t.num_hidden_layers,
        }
    }

    pub const VISION_EMBED: usize = 0;

    pub fn vision_layer(&self, i: usize) -> usize {
        1 + i
    }

    pub fn projector(&self) -> usize {
        1 + self.vision_layers
    }

    pub fn text_embed(&self) -> usize {
        2 + self.vision_layers
    }

    pub fn text_layer(&self, i: usize) -> usize {
        3 + self.vision_layers + i
    }

    pub fn text_head(&self) -> usize {
        3 + self.vision_layers + self.text_layers
    }

    /// `(group, slot)` of a 5.x parameter name.
    pub fn find(&self, name: &str) -> Option<(usize, usize)> {
        self.groups.iter().enumerate().find_map(|(g, layout)| {
            layout
                .slots
                .iter()
                .position(|s| s.name == name)
                .map(|s| (g, s))
        })
    }

    pub fn slots(&self) -> impl Iterator<Item = (usize, &ParamSlot)> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, l)| l.slots.iter().map(move |s| (g, s)))
    }

    pub fn num_params(&self) -> usize {
        self.groups.iter().map(|g| g.len).sum()
    }
}

/// One flat f32 tensor per group, laid out by a [`ParamLayout`], on the model's device (or,
/// after [`Params::offload`], in the exec's host pool).
#[derive(Debug)]
pub struct Params {
    pub layout: ParamLayout,
    /// `[len]` master weights of every group.
    pub data: Vec<Stored>,
    /// How groups in the host pool come to the device (set by [`Params::offload`]).
    pub(crate) streamer: Option<Streamer>,
}

fn unknown(name: &str) -> ModelError {
    ModelError::Input(format!("{name} is not a parameter of this model"))
}

fn offloaded(g: usize) -> KernelError {
    KernelError::InvalidArgument {
        op: "Params",
        detail: format!(
            "group {g} is in the host pool (train.offload_optimizer): a pass fetches it \
             (ParamSource::fetch)"
        ),
    }
}

impl Params {
    /// Device groups `data` laid out by `layout`.
    pub fn new(layout: ParamLayout, data: Vec<Tensor<f32>>) -> Self {
        Params {
            layout,
            data: data.into_iter().map(Stored::Device).collect(),
            streamer: None,
        }
    }

    /// Zeroed groups on `exec`'s device.
    pub fn zeros(exec: &DeviceCtx, layout: ParamLayout) -> Result<Self, ModelError> {
        let data = layout
            .groups
            .iter()
            .map(|g| exec.zeros(&[g.len]))
            .collect::<Result<_, _>>()?;
        Ok(Params::new(layout, data))
    }

    /// Uploads host groups (one `Vec` per group, each of the group's length).
    pub fn from_host(
        exec: &DeviceCtx,
        layout: ParamLayout,
        host: &[Vec<f32>],
    ) -> Result<Self, ModelError> {
        if host.len() != layout.groups.len() {
            return Err(ModelError::Input(format!(
                "{} host groups for a layout of {}",
                host.len(),
                layout.groups.len()
            )));
        }
        let data = layout
            .groups
            .iter()
            .zip(host)
            .map(|(g, h)| exec.upload(h, &[g.len]))
            .collect::<Result<_, _>>()?;
        Ok(Params::new(layout, data))
    }

    /// Moves every group into `exec`'s host pool (`train.offload_optimizer`): from then on a
    /// pass copies each group to `exec`'s device at its point of use, the next one ahead
    /// ([`super::source`]), and the optimizer streams each group through the device for its
    /// update. Groups already there stay.
    pub fn offload(&mut self, exec: &DeviceCtx) -> Result<(), ModelError> {
        let pool = exec.host_pool().ok_or_else(|| {
            ModelError::Input(
                "optimizer offload needs an exec with a host pool (DeviceCtx::with_host_pool)"
                    .into(),
            )
        })?;
        for t in &mut self.data {
            t.offload(pool, exec.stream())?;
        }
        self.streamer = Some(Streamer::new(exec.clone()));
        Ok(())
    }

    /// Whether any group is in a host pool.
    pub fn is_offloaded(&self) -> bool {
        self.data.iter().any(Stored::is_host)
    }

    /// A copy in the same places (same allocators).
    pub fn try_clone(&self, stream: &Stream) -> Result<Self, ModelError> {
        let data = self
            .data
            .iter()
            .map(|t| t.try_clone(stream))
            .collect::<Result<_, _>>()?;
        Ok(Params {
            layout: self.layout.clone(),
            data,
            streamer: self.streamer.as_ref().map(Streamer::fresh),
        })
    }

    /// Group `g` on the device (an error naming it when it is in the host pool).
    fn view(&self, g: usize) -> Result<BufferView<'_, f32>, KernelError> {
        self.data[g]
            .device_tensor()
            .map(Tensor::view)
            .ok_or_else(|| offloaded(g))
    }

    pub fn vision_embed(&self) -> Result<VisionEmbed<BufferView<'_, f32>>, KernelError> {
        let g = ParamLayout::VISION_EMBED;
        VisionEmbed::split(self.view(g)?, &self.layout.groups[g])
    }

    pub fn vision_layer(&self, i: usize) -> Result<VisionLayer<BufferView<'_, f32>>, KernelError> {
        let g = self.layout.vision_layer(i);
        VisionLayer::split(self.view(g)?, &self.layout.groups[g])
    }

    pub fn projector(&self) -> Result<Projector<BufferView<'_, f32>>, KernelError> {
        let g = self.layout.projector();
        Projector::split(self.view(g)?, &self.layout.groups[g])
    }

    pub fn text_embed(&self) -> Result<TextEmbed<BufferView<'_, f32>>, KernelError> {
        let g = self.layout.text_embed();
        TextEmbed::split(self.view(g)?, &self.layout.groups[g])
    }

    pub fn text_layer(&self, i: usize) -> Result<TextLayer<BufferView<'_, f32>>, KernelError> {
        let g = self.layout.text_layer(i);
        TextLayer::split(self.view(g)?, &self.layout.groups[g])
    }

    pub fn text_head(&self) -> Result<TextHead<BufferView<'_, f32>>, KernelError> {
        let g = self.layout.text_head();
        TextHead::split(self.view(g)?, &self.layout.groups[g])
    }

    /// A device tensor by its 5.x name (None if unknown, or in the host pool: see
    /// [`Params::read`]).
    pub fn get(&self, name: &str) -> Option<BufferView<'_, f32>> {
        let (g, s) = self.layout.find(name)?;
        self.data[g]
            .device_tensor()?
            .view()
            .slice(self.layout.groups[g].slots[s].range())
            .ok()
    }

    /// A host copy of a tensor, by its 5.x name (wherever its group is).
    pub fn read(&self, stream: &Stream, name: &str) -> Result<Vec<f32>, ModelError> {
        let (g, s) = self.layout.find(name).ok_or_else(|| unknown(name))?;
        let range = self.layout.groups[g].slots[s].range();
        match &self.data[g] {
            Stored::Device(t) => Ok(t.view().slice(range)?.clone_dtoh(stream)?),
            Stored::Host(h) => Ok(h.to_vec()?[range].to_vec()),
        }
    }

    /// Overwrites a tensor, by its 5.x name, with host values of its length.
    pub fn write(&mut self, stream: &Stream, name: &str, values: &[f32]) -> Result<(), ModelError> {
        let (g, s) = self.layout.find(name).ok_or_else(|| unknown(name))?;
        let range = self.layout.groups[g].slots[s].range();
        if values.len() != range.len() {
            return Err(ModelError::Input(format!(
                "{} values for {name}, which has {}",
                values.len(),
                range.len()
            )));
        }
        Ok(self.data[g].write_at(stream, range.start, values)?)
    }

    /// Host copies of every group.
    pub fn to_host(&self, stream: &Stream) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(self
            .data
            .iter()
            .map(|t| t.to_host(stream))
            .collect::<Result<_, _>>()?)
    }
}
