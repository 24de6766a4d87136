//! A save stopped at each of its steps (as a killed process: nothing after the point runs),
//! a prune stopped half-way, and a full disk: afterwards the newest complete checkpoint is the
//! one found and loaded, bit for bit, and the next prune keeps it.

use super::*;
use crate::train::checkpoint::dir::{Fault, SaveStep};

/// The steps of a save, in order; from `Marked` on, the new checkpoint is complete.
const STEPS: [SaveStep; 7] = [
    SaveStep::RankTensor(3),
    SaveStep::FilesWritten,
    SaveStep::ManifestWritten,
    SaveStep::Marked,
    SaveStep::MovedAside,
    SaveStep::Renamed,
    SaveStep::Synced,
];

fn complete_from(step: SaveStep) -> bool {
    let marked = STEPS.iter().position(|s| *s == SaveStep::Marked).unwrap();
    STEPS.iter().position(|s| *s == step).unwrap() >= marked
}

/// The latest checkpoint under `root` is `step` and holds `want`.
fn assert_latest(dir: &CheckpointDir, step: u64, want: &Snapshot, what: &str) {
    let (found, _) = dir
        .latest()
        .unwrap()
        .unwrap_or_else(|| panic!("{what}: none"));
    assert_eq!(found, step, "{what}");
    let mut ckpt = Checkpoint::open(dir.root()).unwrap();
    assert_eq!(ckpt.step(), step, "{what}");
    assert_same(want, &Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap());
}

#[test]
fn a_crash_at_every_step_of_a_save_leaves_the_newest_complete_checkpoint_loadable() {
    for replace in [false, true] {
        for at in STEPS {
            // `MovedAside` happens only when the step already has a checkpoint.
            if at == SaveStep::MovedAside && !replace {
                continue;
            }
            let what = format!("crash at {at:?}, step saved twice: {replace}");
            let root = tmp_root(&format!("crash-{replace}-{at:?}"));
            let dir = CheckpointDir::new(&root);
            let first = random_state(10, 1);
            first.save(&dir, 0).unwrap();
            let earlier = random_state(11, 2);
            if replace {
                earlier.save(&dir, 0).unwrap();
            }
            let new = random_state(12, 2);
            let err = new
                .save(&dir.clone().with_fault(at, Fault::Crash), 1)
                .unwrap_err();
            assert!(matches!(err, CheckpointError::Injected(_)), "{what}: {err}");

            let (step, want) = match (complete_from(at), replace) {
                (true, _) => (2, &new),
                (false, true) => (2, &earlier),
                (false, false) => (1, &first),
            };
            assert_latest(&dir, step, want, &what);
            // The next prune puts the newest complete copy in place and keeps it.
            dir.prune(1).unwrap();
            assert!(dir.unfinished().unwrap().is_empty(), "{what}");
            assert_eq!(
                dir.complete().unwrap(),
                vec![(step, dir.path(step))],
                "{what}"
            );
            assert_latest(&dir, step, want, &format!("{what}, after the prune"));
            // And the run saves on over it.
            let next = random_state(13, 3);
            next.save(&dir, 1).unwrap();
            assert_latest(&dir, 3, &next, &format!("{what}, next save"));
            std::fs::remove_dir_all(&root).ok();
        }
    }
}

#[test]
fn a_crash_half_way_through_a_prune_keeps_the_newest_checkpoint() {
    let root = tmp_root("crash-prune");
    let dir = CheckpointDir::new(&root);
    random_state(20, 1).save(&dir, 0).unwrap();
    let second = random_state(21, 2);
    second.save(&dir, 0).unwrap();
    let third = random_state(22, 3);
    let crashing = dir.clone().with_fault(SaveStep::Pruning, Fault::Crash);
    assert!(third.save(&crashing, 2).is_err());
    // Step 1 lost its manifest: a leftover, not a checkpoint.
    assert_eq!(dir.unfinished().unwrap(), vec![dir.path(1)]);
    assert_latest(&dir, 3, &third, "after the crash");
    dir.prune(2).unwrap();
    let steps: Vec<u64> = dir.complete().unwrap().iter().map(|c| c.0).collect();
    assert_eq!(steps, vec![2, 3]);
    let mut ckpt = Checkpoint::open(&dir.path(2)).unwrap();
    assert_same(
        &second,
        &Snapshot::load(&mut ckpt, DeviceCtx::cpu()).unwrap(),
    );
}

/// A lone `step-N.old` (its replacement lost) is still the step's checkpoint: found, loaded,
/// and put back by the next prune rather than removed.
#[test]
fn an_old_copy_alone_is_put_back_not_pruned() {
    let root = tmp_root("old-alone");
    let dir = CheckpointDir::new(&root);
    let state = random_state(30, 4);
    state.save(&dir, 0).unwrap();
    std::fs::rename(dir.path(4), dir.old_path(4)).unwrap();
    // And an unfinished save of the same step beside it.
    std::fs::create_dir(dir.tmp_path(4)).unwrap();
    assert_eq!(dir.latest().unwrap(), Some((4, dir.old_path(4))));
    assert_latest(&dir, 4, &state, "the .old alone");
    dir.prune(1).unwrap();
    assert_eq!(dir.complete().unwrap(), vec![(4, dir.path(4))]);
    assert!(dir.unfinished().unwrap().is_empty());
    assert_latest(&dir, 4, &state, "put back");
}

#[test]
fn a_full_disk_keeps_the_previous_checkpoint_and_says_so() {
    for at in [
        SaveStep::RankTensor(2),
        SaveStep::FilesWritten,
        SaveStep::ManifestWritten,
    ] {
        let root = tmp_root(&format!("full-{at:?}"));
        let dir = CheckpointDir::new(&root);
        let first = random_state(40, 1);
        first.save(&dir, 0).unwrap();
        let err = random_state(41, 2)
            .save(&dir.clone().with_fault(at, Fault::NoSpace), 0)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, CheckpointError::NoSpace { step: 2, .. }),
            "{at:?}: {err:?}"
        );
        assert!(
            msg.contains("no space left on device while saving step 2")
                && msg.contains("not committed"),
            "{msg}"
        );
        // The partial save was removed: its space is back.
        assert!(!dir.tmp_path(2).exists(), "{at:?}");
        assert!(dir.unfinished().unwrap().is_empty(), "{at:?}");
        assert_latest(&dir, 1, &first, &format!("full disk at {at:?}"));
        std::fs::remove_dir_all(&root).ok();
    }
}
