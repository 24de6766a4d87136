//! Context parallelism in the memory plan: how the language model's attention is split
//! over the CP ranks, and the exchange buffers each text layer's attention adds to its
//! working tensors (see [`super::StepFeatures`] for the terms).

use super::dims::Dims;
use cannon_runtime::alloc::round_size;

/// How the language model's attention is split over `size` context-parallel ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextParallel {
    pub size: usize,
    pub algo: CpAlgo,
    /// Ulysses group size of the hybrid (ignored by the others).
    pub ulysses: usize,
}

impl Default for ContextParallel {
    fn default() -> Self {
        ContextParallel {
            size: 1,
            algo: CpAlgo::Ulysses,
            ulysses: 1,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CpAlgo {
    #[default]
    Ulysses,
    Ring,
    Hybrid,
}

impl ContextParallel {
    /// (ulysses degree, ring degree).
    pub(super) fn degrees(&self) -> (usize, usize) {
        let n = self.size.max(1);
        match self.algo {
            CpAlgo::Ulysses => (n, 1),
            CpAlgo::Ring => (1, n),
            CpAlgo::Hybrid => {
                let u = self.ulysses.clamp(1, n);
                (u, n / u)
            }
        }
    }

    /// Ulysses' replication of the kv heads: each one `rep` times (`u / Hkv` when there are
    /// fewer kv heads than Ulysses ranks).
    pub(super) fn kv_rep(&self, hkv: usize) -> usize {
        let (u, _) = self.degrees();
        if self.size <= 1 || hkv == 0 || hkv.is_multiple_of(u) {
            1
        } else {
            u / hkv
        }
    }

    /// Exchange buffers of one text layer's (forward, backward) for `t` local tokens (see
    /// [`StepFeatures`] for the terms).
    pub(super) fn buffers(&self, d: &Dims, hd: usize, t: usize, a: usize) -> (usize, usize) {
        if self.size <= 1 {
            return (0, 0);
        }
        let (u, r) = self.degrees();
        let dke = d.dkv * self.kv_rep(d.dkv / hd.max(1));
        let (q4, k4) = (round_size(4 * t * d.dq), round_size(4 * t * dke));
        let (qa, ka) = (round_size(a * t * d.dq), round_size(a * t * dke));
        let kv = round_size(a * t * d.dkv);
        let x = usize::from(u > 1);
        let rep_extra = if dke > d.dkv { ka } else { 0 };
        let ring_fwd = if r > 1 { q4 + 3 * ka } else { 0 };
        let fwd = [(1 + x) * q4, q4 + (2 + x) * k4, ring_fwd, (1 + x) * qa];
        // dq, dk, dv in the head-sharded layout (and d out until the attention is done).
        let held = qa + 2 * ka;
        let ring_bwd = if r > 1 {
            qa + held + q4 + 3 * k4 + 2 * ka
        } else {
            0
        };
        let bwd = [
            (1 + x) * qa,
            qa + held,
            ring_bwd,
            held + (1 + x) * qa,
            held + x * ka + kv + rep_extra,
        ];
        let max = |v: &[usize]| v.iter().copied().max().unwrap_or(0);
        (max(&fwd), max(&bwd))
    }
}
