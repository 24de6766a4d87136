//! Which tokens a CP rank holds, and the attention blocks of a ring step (see the module docs
//! of [`crate::parallel::cp`] for the chunking).

use super::error::CpError;
use cannon_kernels::attention::BlockPair;
use std::ops::Range;

/// One rank's share of a batch of `tokens` tokens (host data, made per batch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpLayout {
    /// T: real tokens of the batch.
    pub tokens: usize,
    /// C: tokens per chunk (`2 r` chunks make the padded sequence).
    pub chunk: usize,
    /// u, r: Ulysses degree and ring size.
    pub u: usize,
    pub r: usize,
    /// This rank's Ulysses and ring ranks.
    pub ui: usize,
    pub ri: usize,
    /// `[Tl]` global index of each local token (`>= tokens`: padding).
    pub local: Vec<usize>,
    /// Sequence ends of the padded sequence: the batch's, then `Tp` when there is padding.
    pub seq_ends: Vec<usize>,
}

impl CpLayout {
    pub fn new(
        tokens: usize,
        cu_seqlens: &[usize],
        u: usize,
        r: usize,
        ui: usize,
        ri: usize,
    ) -> Result<Self, CpError> {
        if u == 0 || r == 0 || ui >= u || ri >= r {
            return Err(CpError::Input(format!(
                "CP rank ({ui}, {ri}) outside a layout of {u} Ulysses x {r} ring ranks"
            )));
        }
        if cu_seqlens.last().copied().unwrap_or(0) != tokens
            || cu_seqlens.windows(2).any(|w| w[1] < w[0])
        {
            return Err(CpError::Input(format!(
                "sequence ends {:?}.. do not end at the {tokens} tokens",
                &cu_seqlens[..cu_seqlens.len().min(8)]
            )));
        }
        // C a multiple of u, so that a ring rank's 2C tokens split evenly over its Ulysses
        // group; never 0, so that every rank has a token (the padding, if nothing else).
        let chunk = u * tokens.div_ceil(2 * r * u).max(1);
        let padded = 2 * r * chunk;
        let mut seq_ends = cu_seqlens.to_vec();
        if padded > tokens {
            seq_ends.push(padded);
        }
        let tl = 2 * chunk / u;
        let mine: Vec<usize> = Self::ring_chunks(chunk, r, ri)
            .into_iter()
            .flatten()
            .collect();
        let local = mine[ui * tl..(ui + 1) * tl].to_vec();
        Ok(CpLayout {
            tokens,
            chunk,
            u,
            r,
            ui,
            ri,
            local,
            seq_ends,
        })
    }

    /// The two chunks of ring rank `ri`: `ri` and `2r - 1 - ri`, as global token ranges.
    fn ring_chunks(chunk: usize, r: usize, ri: usize) -> [Range<usize>; 2] {
        let c = |k: usize| k * chunk..(k + 1) * chunk;
        [c(ri), c(2 * r - 1 - ri)]
    }

    /// Tp: the padded token count.
    pub fn padded(&self) -> usize {
        2 * self.r * self.chunk
    }

    /// Tl: tokens of this rank.
    pub fn local_tokens(&self) -> usize {
        self.local.len()
    }

    /// `(local row, global index)` of this rank's real tokens.
    pub fn real(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.local
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, g)| g < self.tokens)
    }

    /// `[Tl]` per-token host data of this rank (`pad` for padding).
    pub fn shard<T: Copy>(&self, all: &[T], pad: T) -> Vec<T> {
        self.local
            .iter()
            .map(|&g| all.get(g).copied().unwrap_or(pad))
            .collect()
    }

    /// Sequence ends of the `2C` tokens of this ring rank (its two chunks one after the
    /// other), for attention when there is no ring (`r = 1`: the whole padded sequence).
    pub fn ring_local_ends(&self) -> Vec<usize> {
        debug_assert_eq!(self.r, 1);
        self.seq_ends.clone()
    }

    /// The attention blocks between this ring rank's queries (its chunks, rows `[0, 2C)`)
    /// and the keys of ring rank `owner` (rows `[0, 2C)` of its K/V): per sequence, the part
    /// of a query chunk against the part of a key chunk, causal on the diagonal, full when
    /// the key chunk comes first, none when it comes after.
    pub fn ring_pairs(&self, owner: usize) -> Vec<BlockPair> {
        let c = self.chunk;
        let qs = Self::ring_chunks(c, self.r, self.ri);
        let ks = Self::ring_chunks(c, self.r, owner);
        let mut pairs = Vec::new();
        for (qi, q) in qs.iter().enumerate() {
            for (ki, k) in ks.iter().enumerate() {
                if k.start > q.start {
                    continue;
                }
                let causal = k.start == q.start;
                // Sequences meeting both chunks (the key chunk is the earlier or the same).
                let first = self.seq_ends.partition_point(|&e| e <= k.start);
                let mut start = if first == 0 {
                    0
                } else {
                    self.seq_ends[first - 1]
                };
                for &end in &self.seq_ends[first..] {
                    if start >= q.end {
                        break;
                    }
                    let qr = start.max(q.start)..end.min(q.end);
                    let kr = start.max(k.start)..end.min(k.end);
                    if !qr.is_empty() && !kr.is_empty() {
                        let (qo, ko) = (qi * c, ki * c);
                        pairs.push(BlockPair {
                            q: qo + qr.start - q.start..qo + qr.end - q.start,
                            k: ko + kr.start - k.start..ko + kr.end - k.start,
                            causal,
                        });
                    }
                    start = end;
                }
            }
        }
        pairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token on exactly one rank, padding only past T, chunk pairs head-tail.
    #[test]
    fn shards_cover_every_token_once() {
        for (t, u, r) in [
            (24usize, 2usize, 1usize),
            (23, 4, 1),
            (7, 1, 4),
            (31, 2, 2),
            (1, 2, 2),
        ] {
            let mut seen = vec![0; 2 * r * u * t.div_ceil(2 * r * u).max(1)];
            for ri in 0..r {
                for ui in 0..u {
                    let l = CpLayout::new(t, &[t], u, r, ui, ri).unwrap();
                    assert_eq!(l.local_tokens() * u * r, l.padded());
                    for &g in &l.local {
                        seen[g] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&n| n == 1), "{t} {u} {r}: {seen:?}");
        }
        let l = CpLayout::new(16, &[16], 1, 2, 0, 1).unwrap();
        assert_eq!(l.local, vec![4, 5, 6, 7, 8, 9, 10, 11]);
        let l = CpLayout::new(16, &[16], 1, 2, 0, 0).unwrap();
        assert_eq!(l.local, vec![0, 1, 2, 3, 12, 13, 14, 15]);
    }

    /// The ring blocks of every step cover each (query, visible key) pair exactly once.
    #[test]
    fn ring_pairs_cover_the_causal_mask_once() {
        let (t, r) = (29, 3);
        let ends = [5, 5, 17, 29];
        let layouts: Vec<_> = (0..r)
            .map(|ri| CpLayout::new(t, &ends, 1, r, 0, ri).unwrap())
            .collect();
        let tp = layouts[0].padded();
        let seq_of = |g: usize| layouts[0].seq_ends.partition_point(|&e| e <= g);
        let mut seen = vec![vec![0u8; tp]; tp];
        for me in &layouts {
            for owner in 0..r {
                for p in me.ring_pairs(owner) {
                    for i in p.q.clone() {
                        for j in p.k.clone() {
                            if p.causal && j - p.k.start > i - p.q.start {
                                continue;
                            }
                            seen[me.local[i]][layouts[owner].local[j]] += 1;
                        }
                    }
                }
            }
        }
        for (qg, row) in seen.iter().enumerate() {
            for (kg, &n) in row.iter().enumerate() {
                let want = u8::from(kg <= qg && seq_of(kg) == seq_of(qg));
                assert_eq!(n, want, "query {qg} key {kg}");
            }
        }
    }
}

/// Head counts on the attention side of the exchange ([`CpLayout::shapes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpShapes {
    /// 2C: tokens of the ring rank.
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    /// How often each kv head is repeated before the exchange (u / Hkv when Hkv < u).
    pub rep: usize,
}

impl CpLayout {
    /// The attention side of the exchange for `q_heads` query and `kv_heads` key-value heads.
    pub fn shapes(&self, q_heads: usize, kv_heads: usize) -> CpShapes {
        let u = self.u;
        let rep = if kv_heads.is_multiple_of(u) {
            1
        } else {
            u / kv_heads
        };
        CpShapes {
            tokens: self.local_tokens() * u,
            q_heads: q_heads / u,
            kv_heads: kv_heads * rep / u,
            rep,
        }
    }
}
