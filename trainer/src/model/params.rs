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
//! Tensor names are transformers 5.x names; shapes are HF's `[out, in]`.

use super::config::Mistral3Config;
use std::ops::Range;

/// Declares a typed view over one flat group: one field per tensor, in buffer order, with the
/// tensor's HF name suffix. `split`/`split_mut` carve a group's buffer into the fields.
macro_rules! flat_group {
    ($(#[$m:meta])* $name:ident { $($field:ident : $hf:literal),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug)]
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

        impl<'a> $name<&'a [f32]> {
            /// Views `buf` (laid out by `g`) as the named tensors.
            pub fn split(buf: &'a [f32], g: &GroupLayout) -> Self {
                let mut slots = g.slots.iter();
                $(let $field = &buf[slots.next().map(Slot::range).unwrap_or(0..0)];)*
                $name { $($field),* }
            }
        }

        impl<'a> $name<&'a mut [f32]> {
            /// Mutable view of `buf` (laid out by `g`) as the named tensors.
            pub fn split_mut(buf: &'a mut [f32], g: &GroupLayout) -> Self {
                let mut rest = buf;
                let mut slots = g.slots.iter();
                $(
                    let n = slots.next().map(Slot::len).unwrap_or(0);
                    let (head, tail) = std::mem::take(&mut rest).split_at_mut(n);
                    rest = tail;
                    let $field = head;
                )*
                let _ = rest;
                $name { $($field),* }
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
pub struct Slot {
    /// Full transformers 5.x parameter name.
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

impl Slot {
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
    pub slots: Vec<Slot>,
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
                let slot = Slot {
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

    pub fn slots(&self) -> impl Iterator<Item = (usize, &Slot)> {
        self.groups
            .iter()
            .enumerate()
            .flat_map(|(g, l)| l.slots.iter().map(move |s| (g, s)))
    }

    pub fn num_params(&self) -> usize {
        self.groups.iter().map(|g| g.len).sum()
    }
}

/// One flat f32 buffer per group, laid out by a [`ParamLayout`].
#[derive(Clone, Debug)]
pub struct Params {
    pub layout: ParamLayout,
    pub data: Vec<Vec<f32>>,
}

impl Params {
    pub fn zeros(layout: ParamLayout) -> Self {
        let data = layout.groups.iter().map(|g| vec![0.0; g.len]).collect();
        Params { layout, data }
    }

    pub fn vision_embed(&self) -> VisionEmbed<&[f32]> {
        let g = ParamLayout::VISION_EMBED;
        VisionEmbed::split(&self.data[g], &self.layout.groups[g])
    }

    pub fn vision_layer(&self, i: usize) -> VisionLayer<&[f32]> {
        let g = self.layout.vision_layer(i);
        VisionLayer::split(&self.data[g], &self.layout.groups[g])
    }

    pub fn projector(&self) -> Projector<&[f32]> {
        let g = self.layout.projector();
        Projector::split(&self.data[g], &self.layout.groups[g])
    }

    pub fn text_embed(&self) -> TextEmbed<&[f32]> {
        let g = self.layout.text_embed();
        TextEmbed::split(&self.data[g], &self.layout.groups[g])
    }

    pub fn text_layer(&self, i: usize) -> TextLayer<&[f32]> {
        let g = self.layout.text_layer(i);
        TextLayer::split(&self.data[g], &self.layout.groups[g])
    }

    pub fn text_head(&self) -> TextHead<&[f32]> {
        let g = self.layout.text_head();
        TextHead::split(&self.data[g], &self.layout.groups[g])
    }

    /// A tensor by its 5.x name.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        let (g, s) = self.layout.find(name)?;
        Some(&self.data[g][self.layout.groups[g].slots[s].range()])
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut [f32]> {
        let (g, s) = self.layout.find(name)?;
        let range = self.layout.groups[g].slots[s].range();
        Some(&mut self.data[g][range])
    }
}

/// Gradient buffers shaped like [`Params`], allocated only for the groups that train: a frozen
/// group has no buffer, so no backward step can write (or compute) its gradient.
#[derive(Clone, Debug)]
pub struct Grads {
    pub data: Vec<Option<Vec<f32>>>,
}

impl Grads {
    /// Zeroed buffers for the groups whose part is in `trainable`.
    pub fn new(layout: &ParamLayout, trainable: &[Part]) -> Self {
        let data = layout
            .groups
            .iter()
            .map(|g| trainable.contains(&g.part).then(|| vec![0.0; g.len]))
            .collect();
        Grads { data }
    }

    pub fn zero(&mut self) {
        for g in self.data.iter_mut().flatten() {
            g.fill(0.0);
        }
    }

    pub fn group_mut(&mut self, g: usize) -> Option<&mut [f32]> {
        self.data.get_mut(g)?.as_deref_mut()
    }

    /// A gradient tensor by its 5.x name (None if unknown or frozen).
    pub fn get<'a>(&'a self, layout: &ParamLayout, name: &str) -> Option<&'a [f32]> {
        let (g, s) = layout.find(name)?;
        let buf = self.data[g].as_deref()?;
        Some(&buf[layout.groups[g].slots[s].range()])
    }
}
