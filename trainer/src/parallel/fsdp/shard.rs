//! How every layer group's flat buffer is cut over the ranks.
//!
//! A group of `len` elements is padded to `padded = world * shard` with
//! `shard = ceil(len / world)`: rank r owns elements `r*shard .. (r+1)*shard` of the padded
//! buffer, so every shard has the same length (the even all-gather and reduce-scatter need no
//! counts) and nothing is dropped; the last ranks' shards end in zeros (or are all padding
//! when `len < world`). Padding stays zero through training: its gradient is zero (the model
//! never reads or writes past `len`), so AdamW's moments and update there are zero too.
//!
//! ```text
//! len 10, world 4: shard 3, padded 12
//! rank 0: [0, 3)   rank 1: [3, 6)   rank 2: [6, 9)   rank 3: [9, 10) + 2 padding
//! ```

use super::FsdpError;
use crate::model::ParamLayout;
use std::ops::Range;

/// One group's cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupShard {
    /// Elements of the group.
    pub len: usize,
    /// Elements of every rank's shard.
    pub shard: usize,
}

impl GroupShard {
    pub fn new(len: usize, world: usize) -> Self {
        GroupShard {
            len,
            shard: len.div_ceil(world.max(1)),
        }
    }

    /// The length of the gathered (padded) buffer for `world` ranks.
    pub fn padded(&self, world: usize) -> usize {
        self.shard * world
    }

    /// Rank `rank`'s element range in the padded buffer.
    pub fn range(&self, rank: usize) -> Range<usize> {
        rank * self.shard..(rank + 1) * self.shard
    }

    /// The part of rank `rank`'s range that holds real elements (the rest is padding).
    pub fn valid(&self, rank: usize) -> Range<usize> {
        let r = self.range(rank);
        r.start.min(self.len)..r.end.min(self.len)
    }
}

/// The cut of every group of a model over `world` ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    pub world: usize,
    pub groups: Vec<GroupShard>,
}

impl ShardLayout {
    pub fn new(layout: &ParamLayout, world: usize) -> Self {
        ShardLayout {
            world,
            groups: layout
                .groups
                .iter()
                .map(|g| GroupShard::new(g.len, world))
                .collect(),
        }
    }

    /// Rank `rank`'s shard of host group `g` (`full`: the group's `len` values), padded with
    /// zeros to the shard length.
    pub fn cut(&self, g: usize, rank: usize, full: &[f32]) -> Result<Vec<f32>, FsdpError> {
        let s = *self.groups.get(g).ok_or_else(|| {
            FsdpError::Invalid(format!("group {g} of a model of {}", self.groups.len()))
        })?;
        if full.len() != s.len || rank >= self.world {
            return Err(FsdpError::Invalid(format!(
                "group {g}: {} values for a group of {} (rank {rank} of {})",
                full.len(),
                s.len,
                self.world
            )));
        }
        let mut out = vec![0.0; s.shard];
        let v = s.valid(rank);
        out[..v.len()].copy_from_slice(&full[v]);
        Ok(out)
    }

    /// The largest group's shard length (a staging slot holds any shard), 0 for no groups.
    pub fn largest_shard(&self) -> usize {
        self.groups.iter().map(|g| g.shard).max().unwrap_or(0)
    }

    /// Elements of every shard of this rank (all groups), padding included.
    pub fn shard_elements(&self) -> usize {
        self.groups.iter().map(|g| g.shard).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_element_once_and_pad_the_tail() {
        for (len, world) in [(10, 4), (12, 4), (3, 4), (1, 1), (7, 2), (0, 3)] {
            let s = GroupShard::new(len, world);
            assert_eq!(s.padded(world) % world, 0);
            assert!(s.padded(world) >= len && s.padded(world) < len + world.max(1));
            let mut seen = vec![0; len];
            for r in 0..world {
                assert_eq!(s.range(r).len(), s.shard);
                for i in s.valid(r) {
                    seen[i] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "len {len} world {world}");
        }
        let s = GroupShard::new(10, 4);
        assert_eq!((s.shard, s.valid(3)), (3, 9..10));
        assert_eq!(s.valid(3).len() + 2, s.shard);
    }
}
