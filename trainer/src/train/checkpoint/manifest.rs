//! The checkpoint's `manifest.json`: everything that is not a tensor, and the map of which
//! rank file holds which elements of which flat parameter group.
//!
//! ```text
//! step-000000123/
//!   manifest.json                      this file, written last: its presence marks the save complete
//!   config.json                        the model's HF config (what `cannon export` writes out)
//!   rank-00000-of-00002.safetensors    rank 0: param/<group>, exp_avg/<group>, exp_avg_sq/<group>
//!   rank-00001-of-00002.safetensors    rank 1: the same groups' next elements
//! ```
//!
//! Every flat group (one per layer, see [`crate::model::params`]) is split into one contiguous
//! element range per rank. A rank stores its range in a buffer of `stored` elements; the
//! elements past the range are padding (FSDP pads uneven groups so every rank's shard has one
//! size) and are never read back. With one rank, each group is one range with no padding.

use super::error::{CheckpointError, Result};
use crate::model::optim::AdamWConfig;
use crate::model::{ParamLayout, Part};
use crate::train::data::Position;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::path::Path;

/// `format` of every manifest.
pub const FORMAT: &str = "cannon-checkpoint";
/// The version this build writes and reads. Bump it when a field changes meaning.
pub const VERSION: u32 = 1;
pub const MANIFEST_FILE: &str = "manifest.json";
/// A manifest is a few hundred KB even for the 24B model on many ranks (one range per group
/// per rank); a file past this is not one and is not read into memory.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;
/// Ranks a checkpoint may name. Far past any job this trainer runs; a manifest's world size
/// sizes lists before they are compared, so it is bounded first.
pub const MAX_WORLD: usize = 1 << 16;
pub const CONFIG_FILE: &str = "config.json";

/// One rank's part of a flat group: elements `start..end` of the (unpadded) group, stored in a
/// buffer of `stored >= end - start` elements whose tail is padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardRange {
    pub start: usize,
    pub end: usize,
    pub stored: usize,
}

impl ShardRange {
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    pub fn range(&self) -> Range<usize> {
        self.start..self.end
    }

    /// Padding elements after the data.
    pub fn padding(&self) -> usize {
        self.stored - self.len()
    }
}

/// The padded even split (ZeRO-3 / FSDP flat parameters): every rank stores
/// `ceil(len / world)` elements; rank r holds elements `r * shard .. min((r + 1) * shard, len)`,
/// so only the last ranks carry padding, and a rank past the end holds none of the data.
pub fn padded_shards(len: usize, world: usize) -> Vec<ShardRange> {
    let world = world.max(1);
    let shard = len.div_ceil(world);
    (0..world)
        .map(|r| {
            let start = (r * shard).min(len);
            let end = ((r + 1) * shard).min(len);
            ShardRange {
                start,
                end,
                stored: shard,
            }
        })
        .collect()
}

/// One tensor of a group (HF name, shape, element offset in the group).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SlotEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
}

/// One flat parameter group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupEntry {
    /// `vision.embed`, `vision.layers.3`, `projector`, `text.embed`, `text.layers.7`,
    /// `text.head`: also the suffix of its tensors in the rank files.
    pub name: String,
    /// `vision`, `projector` or `text` (the unit of freezing).
    pub part: String,
    /// Elements, without padding.
    pub len: usize,
    /// Whether it trained (has AdamW moments in the rank files).
    pub trained: bool,
    pub slots: Vec<SlotEntry>,
    /// One per rank, in rank order.
    pub shards: Vec<ShardRange>,
}

/// The AdamW state that is not a tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerState {
    /// `adamw` (torch.optim.AdamW semantics).
    pub name: String,
    /// Updates applied (the bias correction's t).
    pub step: u64,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl OptimizerState {
    pub fn adamw(cfg: &AdamWConfig, step: u64) -> Self {
        OptimizerState {
            name: "adamw".into(),
            step,
            lr: cfg.lr,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        }
    }

    pub fn config(&self) -> AdamWConfig {
        AdamWConfig {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
        }
    }
}

/// Where the data stream stands and what it has used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataState {
    /// The loader's next sample (what `Loader::open` resumes from).
    pub position: Position,
    /// Samples the steps so far trained on.
    pub consumed_samples: u64,
    /// Their non-padding tokens.
    pub consumed_tokens: u64,
    /// Samples dropped so far (image tokens cut by truncation).
    pub dropped_samples: u64,
}

/// A rank file: its name in the checkpoint directory and its size (a truncated file is found
/// before any tensor is read).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileEntry {
    pub rank: usize,
    pub file: String,
    pub bytes: u64,
}

/// `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// Optimizer steps completed (the run resumes at step `step + 1`).
    pub step: u64,
    pub world_size: usize,
    /// The run's effective configuration, as the trainer printed it.
    pub config: serde_json::Value,
    pub groups: Vec<GroupEntry>,
    pub optimizer: OptimizerState,
    /// The LR scheduler's state in the trainer's own form (its step, kind, warmup, ...).
    pub scheduler: serde_json::Value,
    /// Each rank's random generator (`SplitMix64::state`), in rank order.
    pub rng: Vec<u64>,
    pub data: DataState,
    pub files: Vec<FileEntry>,
}

/// The name of group `g` of `layout`.
pub fn group_name(layout: &ParamLayout, g: usize) -> String {
    let lv = layout.vision_layers;
    if g == ParamLayout::VISION_EMBED {
        "vision.embed".into()
    } else if g <= lv {
        format!("vision.layers.{}", g - 1)
    } else if g == layout.projector() {
        "projector".into()
    } else if g == layout.text_embed() {
        "text.embed".into()
    } else if g < layout.text_head() {
        format!("text.layers.{}", g - layout.text_layer(0))
    } else {
        "text.head".into()
    }
}

pub fn part_name(p: Part) -> &'static str {
    match p {
        Part::Vision => "vision",
        Part::Projector => "projector",
        Part::Text => "text",
    }
}

/// The rank file's name.
pub fn rank_file(rank: usize, world: usize) -> String {
    format!("rank-{rank:05}-of-{world:05}.safetensors")
}

/// Tensor names inside a rank file.
pub fn param_tensor(group: &str) -> String {
    format!("param/{group}")
}
pub fn exp_avg_tensor(group: &str) -> String {
    format!("exp_avg/{group}")
}
pub fn exp_avg_sq_tensor(group: &str) -> String {
    format!("exp_avg_sq/{group}")
}

/// The manifest's group entries for `layout` sharded by `shards[g]` (one range per rank),
/// `trained[g]` saying which groups carry AdamW moments.
pub fn group_entries(
    layout: &ParamLayout,
    shards: &[Vec<ShardRange>],
    trained: &[bool],
) -> Result<Vec<GroupEntry>> {
    let n = layout.groups.len();
    if shards.len() != n || trained.len() != n {
        return Err(CheckpointError::Argument(format!(
            "{} shard lists and {} trained flags for {n} groups",
            shards.len(),
            trained.len()
        )));
    }
    layout
        .groups
        .iter()
        .enumerate()
        .map(|(g, gl)| {
            let name = group_name(layout, g);
            check_cover(&name, gl.len, &shards[g])?;
            Ok(GroupEntry {
                name,
                part: part_name(gl.part).into(),
                len: gl.len,
                trained: trained[g],
                slots: gl
                    .slots
                    .iter()
                    .map(|s| SlotEntry {
                        name: s.name.clone(),
                        shape: s.shape.clone(),
                        offset: s.offset,
                    })
                    .collect(),
                shards: shards[g].clone(),
            })
        })
        .collect()
}

/// The ranges must tile `0..len` in rank order, each within its stored size.
fn check_cover(name: &str, len: usize, shards: &[ShardRange]) -> Result<()> {
    let mut at = 0;
    for (r, s) in shards.iter().enumerate() {
        if s.start != at || s.end < s.start || s.stored < s.len() {
            return Err(CheckpointError::Argument(format!(
                "group {name}: rank {r}'s range {}..{} (stored {}) does not continue at {at}",
                s.start, s.end, s.stored
            )));
        }
        at = s.end;
    }
    if at != len || shards.is_empty() {
        return Err(CheckpointError::Argument(format!(
            "group {name}: the ranks' ranges cover 0..{at} of {len} elements"
        )));
    }
    Ok(())
}

impl Manifest {
    /// Reads and checks `dir/manifest.json`: format, version, and that the group ranges and
    /// files agree with the world size.
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join(MANIFEST_FILE);
        let bad = |reason: String| CheckpointError::Manifest {
            path: path.clone(),
            reason,
        };
        let len = std::fs::metadata(&path)
            .map_err(super::error::io(&path))?
            .len();
        if len > MAX_MANIFEST_BYTES {
            return Err(bad(format!(
                "{len} bytes, past the {MAX_MANIFEST_BYTES} a manifest may have"
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(super::error::io(&path))?;
        // Look at the version before the strict parse, so a newer format says so.
        let raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if raw.get("format").and_then(|f| f.as_str()) != Some(FORMAT) {
            return Err(bad(format!("\"format\" is not \"{FORMAT}\"")));
        }
        match raw.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == VERSION as u64 => {}
            Some(v) => {
                return Err(CheckpointError::Version {
                    path,
                    found: v as u32,
                    supported: VERSION,
                })
            }
            None => return Err(bad("no \"version\"".into())),
        }
        let m: Manifest = serde_json::from_value(raw).map_err(|e| bad(e.to_string()))?;
        m.check().map_err(|e| bad(e.to_string()))?;
        Ok(m)
    }

    /// Internal consistency: one range list per rank tiling each group, one file and one RNG
    /// state per rank.
    pub fn check(&self) -> Result<()> {
        let w = self.world_size;
        if w == 0 || w > MAX_WORLD {
            return Err(CheckpointError::Argument(format!(
                "world_size {w} is not within 1..={MAX_WORLD}"
            )));
        }
        for g in &self.groups {
            if g.shards.len() != w {
                return Err(CheckpointError::Argument(format!(
                    "group {} has {} shards for world size {w}",
                    g.name,
                    g.shards.len()
                )));
            }
            check_cover(&g.name, g.len, &g.shards)?;
        }
        let in_order = self.files.iter().enumerate().all(|(r, f)| f.rank == r);
        if self.files.len() != w || !in_order {
            let ranks: Vec<usize> = self.files.iter().map(|f| f.rank).take(16).collect();
            return Err(CheckpointError::Argument(format!(
                "{} files for world size {w}, for ranks {ranks:?}{} (must be 0..{w} in order)",
                self.files.len(),
                if self.files.len() > 16 { " .." } else { "" }
            )));
        }
        for f in &self.files {
            if f.file.contains('/') || f.file.contains("..") {
                return Err(CheckpointError::Argument(format!(
                    "file name {} leaves the directory",
                    f.file
                )));
            }
        }
        if self.rng.len() != w {
            return Err(CheckpointError::Argument(format!(
                "{} RNG states for world size {w}",
                self.rng.len()
            )));
        }
        Ok(())
    }

    pub fn group(&self, name: &str) -> Option<(usize, &GroupEntry)> {
        self.groups.iter().enumerate().find(|(_, g)| g.name == name)
    }

    /// That this checkpoint's groups are `layout`'s: same names, tensors and lengths, in order.
    pub fn check_layout(&self, layout: &ParamLayout) -> Result<()> {
        if self.groups.len() != layout.groups.len() {
            return Err(CheckpointError::Mismatch(format!(
                "the checkpoint has {} parameter groups, the model {}",
                self.groups.len(),
                layout.groups.len()
            )));
        }
        for (g, (entry, gl)) in self.groups.iter().zip(&layout.groups).enumerate() {
            let name = group_name(layout, g);
            if entry.name != name || entry.len != gl.len {
                return Err(CheckpointError::Mismatch(format!(
                    "group {g} is {} of {} elements in the checkpoint, {name} of {} in the model",
                    entry.name, entry.len, gl.len
                )));
            }
            for (se, s) in entry.slots.iter().zip(&gl.slots) {
                if se.name != s.name || se.shape != s.shape || se.offset != s.offset {
                    return Err(CheckpointError::Mismatch(format!(
                        "group {name}: the checkpoint has {} {:?} at {}, the model {} {:?} at {}",
                        se.name, se.shape, se.offset, s.name, s.shape, s.offset
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_shards_tile_the_group_and_pad_only_the_tail() {
        let s = padded_shards(10, 4);
        assert_eq!(
            s.iter()
                .map(|s| (s.start, s.end, s.stored))
                .collect::<Vec<_>>(),
            vec![(0, 3, 3), (3, 6, 3), (6, 9, 3), (9, 10, 3)]
        );
        assert_eq!(s[3].padding(), 2);
        // More ranks than elements: the last ranks hold only padding.
        let s = padded_shards(2, 4);
        assert_eq!(
            s[2],
            ShardRange {
                start: 2,
                end: 2,
                stored: 1
            }
        );
        assert!(check_cover("g", 2, &s).is_ok());
        assert_eq!(
            padded_shards(7, 1),
            vec![ShardRange {
                start: 0,
                end: 7,
                stored: 7
            }]
        );
        assert!(check_cover("g", 8, &padded_shards(7, 2)).is_err());
    }

    /// A manifest naming 10^12 ranks is refused by its world size before any list of that
    /// length is made (before, the rank list 0..world was collected first and aborted).
    #[test]
    fn a_huge_world_size_is_refused_without_allocating() {
        let dir = std::env::temp_dir().join(format!("cannon-manifest-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = serde_json::json!({
            "format": FORMAT, "version": VERSION, "step": 1, "world_size": 1_000_000_000_000u64,
            "config": {}, "groups": [],
            "optimizer": {"name": "adamw", "step": 1, "lr": 1e-3, "beta1": 0.9, "beta2": 0.95,
                          "eps": 1e-8, "weight_decay": 0.0},
            "scheduler": {}, "rng": [], "files": [],
            "data": {"position": {"epoch": 0, "index": 0}, "consumed_samples": 0,
                     "consumed_tokens": 0, "dropped_samples": 0}
        });
        std::fs::write(dir.join(MANIFEST_FILE), m.to_string()).unwrap();
        let err = Manifest::read(&dir).unwrap_err().to_string();
        assert!(
            err.contains("world_size 1000000000000 is not within"),
            "{err}"
        );
        // Within the limit but with no files: the file list's length is named.
        let mut small = m.clone();
        small["world_size"] = 3.into();
        std::fs::write(dir.join(MANIFEST_FILE), small.to_string()).unwrap();
        let err = Manifest::read(&dir).unwrap_err().to_string();
        assert!(err.contains("0 files for world size 3"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
