//! Host copies of a rank's shards and optimizer state (what a sharded checkpoint holds), and
//! their recut for another world size.

use super::shard::GroupShard;
use super::FsdpError;
use crate::model::ParamLayout;

/// A host copy of one group's shard state.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupState {
    /// `[shard]` master weights (padding included).
    pub params: Vec<f32>,
    /// `[shard]` AdamW moments, for trained groups.
    pub m: Option<Vec<f32>>,
    pub v: Option<Vec<f32>>,
}

/// A host copy of one rank's shards and optimizer state.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardState {
    pub rank: usize,
    pub world: usize,
    /// AdamW steps taken.
    pub step: u64,
    pub groups: Vec<GroupState>,
}

impl ShardState {
    /// The states of every rank of one world (in rank order) cut again for `world` ranks:
    /// each group's shards are joined (padding dropped) and cut as `ShardLayout` cuts for
    /// the new world. Values are moved, never computed, so a recut back to the old world
    /// gives the old states bit for bit.
    pub fn reshard(
        states: &[ShardState],
        layout: &ParamLayout,
        world: usize,
    ) -> Result<Vec<ShardState>, FsdpError> {
        let old = states.len();
        if old == 0 || world == 0 {
            return Err(FsdpError::Invalid(format!(
                "cannot reshard {old} rank state(s) to {world} ranks"
            )));
        }
        let step = states[0].step;
        for (r, s) in states.iter().enumerate() {
            if s.rank != r || s.world != old || s.step != step {
                return Err(FsdpError::Invalid(format!(
                    "state {r} is rank {} of {} at step {}; expected rank {r} of {old} at step \
                     {step}",
                    s.rank, s.world, s.step
                )));
            }
            if s.groups.len() != layout.groups.len() {
                return Err(FsdpError::Invalid(format!(
                    "rank {r}'s state has {} groups, the model {}",
                    s.groups.len(),
                    layout.groups.len()
                )));
            }
        }
        let mut out: Vec<ShardState> = (0..world)
            .map(|rank| ShardState {
                rank,
                world,
                step,
                groups: Vec::with_capacity(layout.groups.len()),
            })
            .collect();
        for (g, gl) in layout.groups.iter().enumerate() {
            let (from, to) = (GroupShard::new(gl.len, old), GroupShard::new(gl.len, world));
            // A group's shards joined over the old ranks (None: no rank has that part).
            let join = |what: &str,
                        pick: &dyn Fn(&GroupState) -> Option<&Vec<f32>>|
             -> Result<Option<Vec<f32>>, FsdpError> {
                let parts: Vec<Option<&Vec<f32>>> =
                    states.iter().map(|s| pick(&s.groups[g])).collect();
                if parts.iter().all(Option::is_none) {
                    return Ok(None);
                }
                let mut full = Vec::with_capacity(gl.len);
                for (r, part) in parts.into_iter().enumerate() {
                    let shard = part.ok_or_else(|| {
                        FsdpError::Invalid(format!(
                            "rank {r}, group {g}: no {what}, other ranks have"
                        ))
                    })?;
                    if shard.len() != from.shard {
                        return Err(FsdpError::Invalid(format!(
                            "rank {r}, group {g}: {what} shard of {} values, expected {}",
                            shard.len(),
                            from.shard
                        )));
                    }
                    full.extend_from_slice(&shard[..from.valid(r).len()]);
                }
                Ok(Some(full))
            };
            let params = join("parameter", &|s| Some(&s.params))?.unwrap_or_default();
            let m = join("first moment", &|s| s.m.as_ref())?;
            let v = join("second moment", &|s| s.v.as_ref())?;
            let cut = |full: &[f32], rank: usize| {
                let mut shard = vec![0.0; to.shard];
                let valid = to.valid(rank);
                shard[..valid.len()].copy_from_slice(&full[valid]);
                shard
            };
            for (rank, s) in out.iter_mut().enumerate() {
                s.groups.push(GroupState {
                    params: cut(&params, rank),
                    m: m.as_ref().map(|m| cut(m, rank)),
                    v: v.as_ref().map(|v| cut(v, rank)),
                });
            }
        }
        Ok(out)
    }
}
