//! Reading a checkpoint: the manifest, the model config, and any element range of any group's
//! weights or moments, assembled from whichever rank files hold it. A run on another world
//! size reads its own shards this way (resharding), one range per group.

use super::dir::resolve;
use super::error::{io, CheckpointError, Result};
use super::manifest::{
    exp_avg_sq_tensor, exp_avg_tensor, param_tensor, Manifest, ShardRange, CONFIG_FILE,
};
use crate::model::st::StReader;
use crate::model::Mistral3Config;
use crate::parallel::fsdp::Kind;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The name in a rank file of group `group`'s `kind` tensor.
fn tensor_name(kind: Kind, group: &str) -> String {
    match kind {
        Kind::Param => param_tensor(group),
        Kind::ExpAvg => exp_avg_tensor(group),
        Kind::ExpAvgSq => exp_avg_sq_tensor(group),
    }
}

/// An opened complete checkpoint.
#[derive(Debug)]
pub struct Checkpoint {
    dir: PathBuf,
    manifest: Manifest,
    /// Rank files, opened when first read.
    files: Vec<Option<StReader>>,
    /// False: sizes only ([`Checkpoint::without_data`]).
    data: bool,
}

impl Checkpoint {
    /// Opens `path`: a checkpoint directory, or a folder of them (its latest). Checks the
    /// manifest and that every rank file is there with the size the manifest recorded.
    pub fn open(path: &Path) -> Result<Self> {
        let dir = resolve(path)?;
        let manifest = Manifest::read(&dir)?;
        for f in &manifest.files {
            let p = dir.join(&f.file);
            let len = std::fs::metadata(&p).map_err(io(&p))?.len();
            if len != f.bytes {
                return Err(CheckpointError::Shard {
                    path: p,
                    reason: format!(
                        "{len} bytes, the manifest recorded {} (truncated or replaced?)",
                        f.bytes
                    ),
                });
            }
        }
        let files = (0..manifest.world_size).map(|_| None).collect();
        Ok(Checkpoint {
            dir,
            manifest,
            files,
            data: true,
        })
    }

    /// The checkpoint read for sizes only, by a meta device's ranks: every read is checked
    /// as usual and reads nothing (`StReader::without_data`).
    pub fn without_data(mut self) -> Self {
        self.data = false;
        self.files = self
            .files
            .into_iter()
            .map(|f| f.map(StReader::without_data))
            .collect();
        self
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    pub fn step(&self) -> u64 {
        self.manifest.step
    }

    /// The model's HF config as saved (what `cannon export` writes out).
    pub fn model_config_json(&self) -> Result<serde_json::Value> {
        let path = self.dir.join(CONFIG_FILE);
        let text =
            crate::bounded::read_to_string_capped(&path, crate::model::config::MAX_CONFIG_BYTES)
                .map_err(io(&path))?;
        serde_json::from_str(&text).map_err(|e| CheckpointError::Manifest {
            path,
            reason: format!("config.json: {e}"),
        })
    }

    /// The model's config, parsed and validated.
    pub fn model_config(&self) -> Result<Mistral3Config> {
        let path = self.dir.join(CONFIG_FILE);
        Mistral3Config::from_file(&path).map_err(|e| CheckpointError::Model(e.into()))
    }

    /// Rank `rank`'s saved RNG state (None if the checkpoint had fewer ranks).
    pub fn rng(&self, rank: usize) -> Option<u64> {
        self.manifest.rng.get(rank).copied()
    }

    fn file(&mut self, rank: usize) -> Result<&mut StReader> {
        let slot = &mut self.files[rank];
        if slot.is_none() {
            let entry = &self.manifest.files[rank];
            let path = self.dir.join(&entry.file);
            let r = StReader::open(&path)?;
            let md = |k: &str| r.metadata().get(k).cloned().unwrap_or_default();
            let step = self.manifest.step.to_string();
            if md("step") != step || md("rank") != rank.to_string() {
                return Err(CheckpointError::Shard {
                    path,
                    reason: format!(
                        "holds step {} rank {}, the manifest step {step} rank {rank}",
                        md("step"),
                        md("rank")
                    ),
                });
            }
            *slot = Some(if self.data { r } else { r.without_data() });
        }
        Ok(slot.as_mut().expect("opened above"))
    }

    /// Elements `range` of group `g`'s `kind` tensor (unpadded group coordinates) into `dst`,
    /// read from the ranks whose shards overlap it.
    pub fn read_into(
        &mut self,
        kind: Kind,
        g: usize,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<()> {
        let Some(entry) = self.manifest.groups.get(g) else {
            return Err(CheckpointError::Argument(format!(
                "group {g} of a checkpoint with {} groups",
                self.manifest.groups.len()
            )));
        };
        if range.start > range.end || range.end > entry.len || dst.len() != range.len() {
            return Err(CheckpointError::Argument(format!(
                "elements {range:?} of group {} ({} elements) into {} slots",
                entry.name,
                entry.len,
                dst.len()
            )));
        }
        if kind != Kind::Param && !entry.trained {
            return Err(CheckpointError::Mismatch(format!(
                "group {} was frozen in the checkpoint: it has no AdamW moments",
                entry.name
            )));
        }
        let name = tensor_name(kind, &entry.name);
        let shards: Vec<ShardRange> = entry.shards.clone();
        for (rank, s) in shards.iter().enumerate() {
            let (a, b) = (range.start.max(s.start), range.end.min(s.end));
            if a >= b {
                continue;
            }
            let out = &mut dst[a - range.start..b - range.start];
            let f = self.file(rank)?;
            match f.entry(&name) {
                Some(e) if e.numel() == s.stored => {}
                found => {
                    return Err(CheckpointError::Shard {
                        path: f.path().to_path_buf(),
                        reason: format!(
                            "{name}: {}, the manifest says {} elements",
                            found.map_or("missing".to_string(), |e| format!("{:?}", e.shape)),
                            s.stored
                        ),
                    })
                }
            }
            f.read_f32_into(&name, a - s.start..b - s.start, out)?;
        }
        Ok(())
    }

    /// Elements `range` of group `g`'s `kind` tensor.
    pub fn read(&mut self, kind: Kind, g: usize, range: Range<usize>) -> Result<Vec<f32>> {
        let mut v = vec![0.0; range.len()];
        self.read_into(kind, g, range, &mut v)?;
        Ok(v)
    }

    /// The whole of group `g`'s `kind` tensor (consolidated over ranks).
    pub fn read_group(&mut self, kind: Kind, g: usize) -> Result<Vec<f32>> {
        let len = self.manifest.groups.get(g).map_or(0, |e| e.len);
        self.read(kind, g, 0..len)
    }

    /// One shard in any world size's layout: `target.stored` elements, the data of
    /// `target.start..target.end` then zero padding.
    pub fn read_shard(&mut self, kind: Kind, g: usize, target: ShardRange) -> Result<Vec<f32>> {
        if target.stored < target.len() {
            return Err(CheckpointError::Argument(format!(
                "shard {}..{} stored in {} elements",
                target.start, target.end, target.stored
            )));
        }
        let mut v = vec![0.0; target.stored];
        self.read_into(kind, g, target.range(), &mut v[..target.len()])?;
        Ok(v)
    }
}
