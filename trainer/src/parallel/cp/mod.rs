//! Context parallelism for the language model: the tokens of a batch are cut over the ranks
//! of a CP group, every rank runs the decoder layers on its shard, and attention still sees
//! the whole sequence.
//!
//! ```text
//! every CP rank   vision tower + projector on the whole batch (no CP communication)
//!                 x0 = embed(ids) with the image features spliced in      [T, D]
//!                 global position ids and sequence ends (cu_seqlens)      host data
//! split           x0, positions, targets -> this rank's token shard       [Tl, D]
//! layers          norms, projections, RoPE, MLP on the shard; attention:
//!   ulysses       all-to-all: [Tl, H, Hd] (my tokens, all heads)
//!                          -> [u*Tl, H/u, Hd] (the group's tokens, my heads),
//!                 attention, all-to-all back; backward: the same for the gradients
//!   ring          K/V blocks go round the ring (send_recv), each step's partial result
//!                 merged with the log-sum-exp; backward sends dK/dV round after them
//!   hybrid        Ulysses inside groups of `ulysses_size`, Ring across the groups
//! loss            lm_head + cross-entropy on the shard's labels; sums of losses and of
//!                 target counts added over the group (the FSDP step does it over the world)
//! backward        the shard's dx0 scattered into a zero [T, D]: the embedding and image
//!                 feature gradients of this rank's tokens only, so the vision/projector and
//!                 embedding gradients of the CP ranks are partial sums that the gradient
//!                 reduction adds up
//! ```
//!
//! Token layout ([`CpLayout`]): with `r` ring ranks and Ulysses degree `u` (`cp = u * r`;
//! Ulysses is `r = 1`, Ring `u = 1`), the padded sequence of `Tp = 2 r C` tokens is cut into
//! `2 r` chunks of `C` tokens; ring rank `R` holds chunks `R` and `2r - 1 - R` (head-tail
//! chunking: under the causal mask the early chunks are cheap and the late ones dear, and
//! every ring rank gets one of each), and the `u` Ulysses ranks of ring rank `R` split those
//! `2C` tokens into `Tl = 2C / u` contiguous pieces. `C` is rounded up so that nothing is
//! dropped: the `Tp - T` padding tokens form one sequence of their own at the end, their
//! embeddings are zero, their targets ignored, and no real token attends to them.

pub(crate) mod attn;
mod error;
pub(crate) mod layout;
pub(crate) mod ring;

pub use error::CpError;
pub use layout::CpLayout;

use cannon_kernels::Tensor;
use cannon_runtime::comm::{Communicator, ReduceOp};
use cannon_runtime::{DeviceBuffer, Stream};
use serde::{Deserialize, Serialize};

/// How attention sees the whole sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CpAlgo {
    /// All-to-all between sequence and head sharding around attention.
    #[default]
    Ulysses,
    /// K/V blocks passed around a ring, partial results merged with the log-sum-exp.
    Ring,
    /// Ulysses inside groups of `ulysses_size`, Ring across them.
    Hybrid,
}

impl std::fmt::Display for CpAlgo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CpAlgo::Ulysses => "ulysses",
            CpAlgo::Ring => "ring",
            CpAlgo::Hybrid => "hybrid",
        })
    }
}

/// A CP layout: `size` ranks, the algorithm, and for hybrid the Ulysses degree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpSettings {
    pub size: usize,
    pub algo: CpAlgo,
    /// Ulysses degree of a hybrid layout (ignored otherwise).
    pub ulysses_size: usize,
}

impl Default for CpSettings {
    fn default() -> Self {
        CpSettings {
            size: 1,
            algo: CpAlgo::Ulysses,
            ulysses_size: 1,
        }
    }
}

impl CpSettings {
    /// `(u, r)`: the Ulysses degree and the ring size (`u * r = size`).
    pub fn degrees(&self) -> (usize, usize) {
        let n = self.size.max(1);
        match self.algo {
            CpAlgo::Ulysses => (n, 1),
            CpAlgo::Ring => (1, n),
            CpAlgo::Hybrid => {
                let u = self.ulysses_size.clamp(1, n);
                (u, n / u)
            }
        }
    }

    /// What the model's head counts allow (the text model's `heads` query heads and
    /// `kv_heads` key-value heads): the Ulysses degree must divide the query heads,
    /// and divide the key-value heads or be a multiple of them (each kv head is then repeated
    /// `u / Hkv` times before the exchange, so every rank gets one). Errors name the key.
    pub fn check(&self, heads: usize, kv_heads: usize) -> Result<(), CpError> {
        let bad = |m: String| Err(CpError::Input(m));
        if self.size == 0 {
            return bad("parallel.cp_size must be > 0".into());
        }
        if self.algo == CpAlgo::Hybrid
            && (self.ulysses_size == 0 || !self.size.is_multiple_of(self.ulysses_size))
        {
            return bad(format!(
                "parallel.ulysses_size = {} must divide parallel.cp_size = {} (hybrid runs \
                 Ulysses inside groups of ulysses_size and Ring across them)",
                self.ulysses_size, self.size
            ));
        }
        let (u, _) = self.degrees();
        let (hq, hkv) = (heads, kv_heads);
        let key = match self.algo {
            CpAlgo::Hybrid => "parallel.ulysses_size",
            _ => "parallel.cp_size",
        };
        if !hq.is_multiple_of(u) || !(hkv.is_multiple_of(u) || u.is_multiple_of(hkv)) {
            return bad(format!(
                "{key}: Ulysses over {u} ranks needs the attention heads divisible by {u} \
                 ({hq} query heads) and the key-value heads divisible by {u} or dividing it \
                 ({hkv} kv heads); choose another size, or cp_algo = ring"
            ));
        }
        Ok(())
    }
}

/// One rank's handles on its CP group: the Ulysses group (ranks that exchange heads) and the
/// ring (ranks that pass K/V blocks), each `None` when it has one rank.
#[derive(Debug)]
pub struct CpGroup {
    pub settings: CpSettings,
    /// This rank in the CP group (`ring_rank * u + ulysses_rank`).
    pub rank: usize,
    /// The whole CP group (loss aggregation of a pass outside FSDP).
    pub group: Communicator,
    pub ulysses: Option<Communicator>,
    pub ring: Option<Communicator>,
}

impl CpGroup {
    /// Splits `world` into data-parallel replicas of `settings.size` consecutive ranks
    /// (world rank `w` is CP rank `w % cp` of replica `w / cp`) and returns this rank's CP
    /// group with its replica index. Collective over `world`.
    pub fn split(
        world: &Communicator,
        settings: CpSettings,
        stream: &Stream,
    ) -> Result<(CpGroup, usize), CpError> {
        let cp = settings.size;
        if cp == 0 || !world.world_size().is_multiple_of(cp) {
            return Err(CpError::Input(format!(
                "parallel.cp_size = {cp} must divide the {} ranks (world = dp x cp)",
                world.world_size()
            )));
        }
        let (w, (u, _)) = (world.rank(), settings.degrees());
        let (replica, rank) = (w / cp, w % cp);
        let group = world.split(replica as u32, rank as u32, stream)?;
        let (ring_rank, uly_rank) = (rank / u, rank % u);
        let sub = |color: usize, key: usize, size: usize| -> Result<_, CpError> {
            // Every rank takes part in both splits (collective), keeping only real groups.
            let c = group.split(color as u32, key as u32, stream)?;
            Ok((size > 1).then_some(c))
        };
        let (_, r) = settings.degrees();
        let ulysses = sub(ring_rank, uly_rank, u)?;
        let ring = sub(uly_rank, ring_rank, r)?;
        Ok((
            CpGroup {
                settings,
                rank,
                group,
                ulysses,
                ring,
            },
            replica,
        ))
    }

    /// The CP groups of a world that is one CP group (test and single-replica helper).
    pub fn whole(
        world: Communicator,
        settings: CpSettings,
        stream: &Stream,
    ) -> Result<CpGroup, CpError> {
        let (g, _) = Self::split(&world, settings, stream)?;
        Ok(g)
    }

    pub fn size(&self) -> usize {
        self.settings.size
    }

    /// `(ulysses rank, ring rank)` of this rank.
    pub fn coords(&self) -> (usize, usize) {
        let (u, _) = self.settings.degrees();
        (self.rank % u, self.rank / u)
    }

    /// Calls issued so far on the CP communicators (the vision tower must add none).
    pub fn calls(&self) -> u64 {
        self.group.calls()
            + self.ulysses.as_ref().map_or(0, Communicator::calls)
            + self.ring.as_ref().map_or(0, Communicator::calls)
    }

    /// This rank's token layout of a batch of `tokens` tokens whose packed sequences end at
    /// `cu_seqlens`.
    pub fn layout(&self, tokens: usize, cu_seqlens: &[usize]) -> Result<CpLayout, CpError> {
        let (u, r) = self.settings.degrees();
        let (ui, ri) = self.coords();
        CpLayout::new(tokens, cu_seqlens, u, r, ui, ri)
    }

    /// Sums `x` over the CP group.
    pub fn sum(&self, x: &[f64], stream: &Stream) -> Result<Vec<f64>, CpError> {
        let mut buf = DeviceBuffer::clone_htod(stream, x)?;
        self.group
            .all_reduce_in_place(&mut buf.view_mut(), ReduceOp::Sum, stream)?;
        Ok(buf.clone_dtoh(stream)?)
    }

    /// Sums every gradient tensor over the CP group (the ranks' partial gradients of the
    /// same batch; FSDP's reduce-scatter over the world does this in a sharded run).
    pub fn all_reduce_grads<'a>(
        &self,
        grads: impl IntoIterator<Item = &'a mut Tensor<f32>>,
        stream: &Stream,
    ) -> Result<(), CpError> {
        for g in grads {
            self.group
                .all_reduce_in_place(&mut g.view_mut(), ReduceOp::Sum, stream)?;
        }
        Ok(())
    }
}
