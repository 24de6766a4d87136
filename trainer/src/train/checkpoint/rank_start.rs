//! A checkpoint as a sharded rank's start: the path of a checkpoint directory (or of a folder
//! of them: its latest) is a [`SavedRun`], an opened [`Checkpoint`] its [`SavedShards`].

use super::error::CheckpointError;
use super::load::Checkpoint;
use crate::model::ParamLayout;
use crate::parallel::fsdp::{FsdpError, Kind, SavedRun, SavedShards};
use std::ops::Range;
use std::path::PathBuf;

/// A checkpoint's errors as a rank reports them.
fn bad(e: CheckpointError) -> FsdpError {
    FsdpError::Invalid(e.to_string())
}

impl SavedRun for PathBuf {
    fn open(
        &self,
        layout: &ParamLayout,
        trains: &dyn Fn(usize) -> bool,
        values: bool,
    ) -> Result<Box<dyn SavedShards>, FsdpError> {
        let ckpt = Checkpoint::open(self).map_err(bad)?;
        ckpt.manifest().check_layout(layout).map_err(bad)?;
        // A rank that trains nothing (an evaluation) reads the weights alone, whatever
        // the checkpoint trained; a training rank must train what it trained.
        let training = (0..layout.groups.len()).any(trains);
        for (g, entry) in ckpt.manifest().groups.iter().enumerate() {
            if !training {
                break;
            }
            let now = trains(g);
            if entry.trained != now {
                return Err(FsdpError::Invalid(format!(
                    "{}: group {} {} in the checkpoint but {} now (the freeze list \
                     changed?)",
                    ckpt.dir().display(),
                    entry.name,
                    if entry.trained {
                        "trained"
                    } else {
                        "was frozen"
                    },
                    if now { "trains" } else { "is frozen" },
                )));
            }
        }
        let ckpt = if values { ckpt } else { ckpt.without_data() };
        Ok(Box::new(ckpt))
    }
}

impl SavedShards for Checkpoint {
    fn adam_step(&self) -> u64 {
        self.manifest().optimizer.step
    }

    fn read_into(
        &mut self,
        kind: Kind,
        g: usize,
        range: Range<usize>,
        dst: &mut [f32],
    ) -> Result<(), FsdpError> {
        Checkpoint::read_into(self, kind, g, range, dst).map_err(bad)
    }
}
