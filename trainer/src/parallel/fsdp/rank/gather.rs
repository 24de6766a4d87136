//! A group's full weights gathered from the ranks' shards, one group at a time: the final
//! model's export and the comparisons of trained weights stream through them, so a rank's
//! device holds its shards plus one group.

use super::FsdpRank;
use crate::model::offload::Stored;
use crate::model::Params;
use crate::parallel::fsdp::FsdpError;
use cannon_kernels::Tensor;

impl FsdpRank {
    /// Group `g`'s full f32 weights on this rank's device (`[len]`): all-gathered from the
    /// shards, the padding dropped. Collective: every rank calls it for the same group.
    pub fn gather_group(&self, g: usize) -> Result<Tensor<f32>, FsdpError> {
        let st = self.exec.stream();
        let (Some(shard), Some(&cut)) = (self.params.get(g), self.cut.groups.get(g)) else {
            return Err(FsdpError::Invalid(format!(
                "group {g} of a model of {}",
                self.params.len()
            )));
        };
        let mut full = self.exec.empty::<f32>(&[cut.padded(self.cut.world)])?;
        // A shard in the host pool goes through a device copy (the collective reads
        // device memory).
        let copy = match (shard, self.exec.host_pool()) {
            (Stored::Host(h), Some(pool)) => {
                let t = pool.reload(self.exec.allocator(), st, h)?;
                pool.wait(st, &pool.mark()?)?;
                Some(t)
            }
            _ => None,
        };
        let view = match (&copy, shard) {
            (Some(t), _) => t.view(),
            (None, Stored::Device(t)) => t.view(),
            (None, Stored::Host(_)) => {
                return Err(FsdpError::Invalid(format!(
                    "group {g}'s shard is in a host pool the rank's exec does not have"
                )))
            }
        };
        self.comm.all_gather(&view, &mut full.view_mut(), st)?;
        drop(copy);
        let mut group = self.exec.empty::<f32>(&[cut.len])?;
        group
            .view_mut()
            .memcpy_dtod(st, &full.view().slice(0..cut.len)?)?;
        Ok(group)
    }

    /// The full f32 parameters on this rank's device, every group at once: for small models
    /// and tests (a run's final model streams one group at a time, [`Self::gather_group`]).
    /// Collective: every rank calls it.
    pub fn gather_full_params(&self) -> Result<Params, FsdpError> {
        let data = (0..self.params.len())
            .map(|g| self.gather_group(g))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Params::new(self.layout.clone(), data))
    }

    /// Writes the model's weights as an HF directory (`config.json` + `model.safetensors`)
    /// into `out`, one group at a time: each group is gathered (every rank), written by the
    /// rank given an `out` and dropped, so a rank's device holds its shards plus one group
    /// and the writer's host one group. Collective: every rank calls it, one with `out`.
    pub fn write_hf(
        &self,
        out: Option<(&std::path::Path, &serde_json::Value)>,
    ) -> Result<(), FsdpError> {
        // A meta rank's values do not exist: its file gets the header and size alone.
        let meta = self.exec.device().is_meta();
        let mut writer = match out {
            Some((dir, json)) => Some(
                crate::model::hf_write::HfWriter::create(dir, &self.layout, json)
                    .map(|w| if meta { w.without_data() } else { w })
                    .map_err(crate::model::ModelError::from)?,
            ),
            None => None,
        };
        let st = self.exec.stream();
        for g in 0..self.params.len() {
            let group = self.gather_group(g)?;
            if let Some(w) = writer.as_mut() {
                let host = group.to_host(st)?;
                w.write_group(&host)
                    .map_err(crate::model::ModelError::from)?;
            }
        }
        if let Some(w) = writer {
            w.finish().map_err(crate::model::ModelError::from)?;
        }
        Ok(())
    }
}
