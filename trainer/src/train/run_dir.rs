//! One run per run folder: `cannon train` into a `log.dir` that already holds a run (its
//! metrics, checkpoints, config or identity record, final model) would truncate that run's
//! metrics and replace its checkpoints of the same steps, and a later resume would pick up
//! the wrong run's state. Such a folder is refused unless the new run continues the old one
//! (`checkpoint.resume`), or `--force` moves the old run aside, to `<dir>.old-<n>`: nothing
//! is ever deleted. An absent or empty folder, or one holding only other files, is used.

use super::checkpoint::CheckpointDir;
use super::config::Resume;
use super::error::io;
use super::resolve::ResolvedRun;
use super::TrainError;
use std::path::{Path, PathBuf};

/// What [`claim`] decided about the run folder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// No run there: a fresh start.
    Fresh,
    /// A run there, and this one continues it (`checkpoint.resume`).
    Continue,
    /// The run there was moved aside, `(from, to)` for each folder moved.
    MovedAside(Vec<(PathBuf, PathBuf)>),
}

/// The files and folders in `plan`'s run folder (and its checkpoint folder and metrics file,
/// wherever they are) that a run leaves: empty when no run is there.
pub fn run_traces(plan: &ResolvedRun) -> Result<Vec<PathBuf>, TrainError> {
    let out = &plan.out_dir;
    let mut found: Vec<PathBuf> = [
        plan.jsonl.clone(),
        out.join("config.toml"),
        out.join("run_identity.json"),
        out.join("final"),
        out.join("tensorboard"),
    ]
    .into_iter()
    .filter(|p| p.exists())
    .collect();
    let jsonl_dir = plan.jsonl.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(id) = jsonl_dir.map(|d| d.join("run_identity.json")) {
        if id.exists() && !found.contains(&id) {
            found.push(id);
        }
    }
    let ckpts = CheckpointDir::new(&plan.checkpoint_dir);
    if !ckpts.complete()?.is_empty() || !ckpts.unfinished()?.is_empty() {
        found.push(plan.checkpoint_dir.clone());
    }
    Ok(found)
}

/// Whether `inner` is `outer` or inside it (both made absolute where they exist).
fn within(inner: &Path, outer: &Path) -> bool {
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    abs(inner).starts_with(abs(outer))
}

/// Whether the run resumes the run already in its own folders: `checkpoint.resume = true`,
/// or a checkpoint path inside its run or checkpoint folder.
fn continues_own_run(plan: &ResolvedRun) -> bool {
    match &plan.cfg.checkpoint.resume {
        Resume::Latest(on) => *on,
        Resume::Path(p) => within(p, &plan.out_dir) || within(p, &plan.checkpoint_dir),
    }
}

/// `<path>.old-<n>` for the smallest n >= 1 not taken.
pub fn aside_name(path: &Path) -> PathBuf {
    (1u64..)
        .map(|n| {
            let mut s = path.as_os_str().to_owned();
            s.push(format!(".old-{n}"));
            PathBuf::from(s)
        })
        .find(|p| !p.exists() && p.symlink_metadata().is_err())
        .expect("some n is free")
}

/// What [`claim`] would do, doing nothing: `MovedAside` lists the moves it would make.
pub fn claim_would(plan: &ResolvedRun, force: bool) -> Result<Claim, TrainError> {
    let traces = run_traces(plan)?;
    if traces.is_empty() {
        return Ok(Claim::Fresh);
    }
    if continues_own_run(plan) {
        return Ok(Claim::Continue);
    }
    let out = &plan.out_dir;
    if !force {
        let what: Vec<String> = traces
            .iter()
            .map(|p| {
                p.strip_prefix(out)
                    .map(|r| r.display().to_string())
                    .unwrap_or_else(|_| p.display().to_string())
            })
            .collect();
        return Err(TrainError::RunFolderTaken {
            dir: out.clone(),
            found: what.join(", "),
        });
    }
    // The run folder moves whole; a checkpoint folder or metrics file kept elsewhere moves
    // beside itself, so that no trace of the old run is left where the new one writes.
    let mut targets: Vec<PathBuf> = Vec::new();
    if out.exists() {
        targets.push(out.clone());
    }
    for p in [&plan.checkpoint_dir, &plan.jsonl] {
        if traces.contains(p) && !within(p, out) {
            targets.push(p.clone());
        }
    }
    Ok(Claim::MovedAside(
        targets
            .into_iter()
            .map(|from| {
                let to = aside_name(&from);
                (from, to)
            })
            .collect(),
    ))
}

/// Decides whether this run may use `plan`'s folders (see the module docs); with `force`,
/// moves another run there aside first. Writes nothing otherwise.
pub fn claim(plan: &ResolvedRun, force: bool) -> Result<Claim, TrainError> {
    let decided = claim_would(plan, force)?;
    if let Claim::MovedAside(moves) = &decided {
        for (from, to) in moves {
            crate::durable::rename_synced(from, to).map_err(|e| TrainError::Io {
                path: e.path,
                source: e.source,
            })?;
        }
        // The run writes its folder again from nothing.
        std::fs::create_dir_all(&plan.out_dir).map_err(io(&plan.out_dir))?;
    }
    Ok(decided)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::config::TrainConfig;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cannon-rundir-{}-{name}", std::process::id()));
        std::fs::remove_dir_all(&d).ok();
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn plan(dir: &Path, sets: &[String]) -> ResolvedRun {
        let mut all = vec![format!("log.dir={:?}", dir.display().to_string())];
        all.extend(sets.iter().cloned());
        let cfg = TrainConfig::load(None, &all).unwrap();
        ResolvedRun::resolve(cfg, None).unwrap()
    }

    /// A folder as a finished run leaves it: metrics, config, a complete checkpoint.
    fn fake_run(dir: &Path) {
        std::fs::create_dir_all(dir.join("checkpoints/step-000003")).unwrap();
        std::fs::write(dir.join("checkpoints/step-000003/manifest.json"), "{}").unwrap();
        std::fs::write(dir.join("metrics.jsonl"), "{\"step\":1}\n").unwrap();
        std::fs::write(dir.join("config.toml"), "# old run\n").unwrap();
    }

    #[test]
    fn an_absent_empty_or_unrelated_folder_is_a_fresh_start() {
        let root = scratch("fresh");
        assert_eq!(
            claim(&plan(&root.join("absent"), &[]), false).unwrap(),
            Claim::Fresh
        );
        std::fs::create_dir(root.join("empty")).unwrap();
        assert_eq!(
            claim(&plan(&root.join("empty"), &[]), false).unwrap(),
            Claim::Fresh
        );
        std::fs::create_dir(root.join("notes")).unwrap();
        std::fs::write(root.join("notes/README"), "mine").unwrap();
        assert_eq!(
            claim(&plan(&root.join("notes"), &[]), false).unwrap(),
            Claim::Fresh
        );
    }

    #[test]
    fn a_folder_holding_a_run_is_refused_naming_it_and_the_ways_on() {
        let root = scratch("taken");
        let dir = root.join("run");
        fake_run(&dir);
        let err = claim(&plan(&dir, &[]), false).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, TrainError::RunFolderTaken { .. }), "{err:?}");
        for want in [
            dir.display().to_string(),
            "metrics.jsonl".into(),
            "checkpoints".into(),
            "checkpoint.resume=true".into(),
            "--force".into(),
        ] {
            assert!(msg.contains(&want), "{want:?} not in {msg}");
        }
        // Nothing was touched.
        assert_eq!(
            std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap(),
            "{\"step\":1}\n"
        );
        // A checkpoint folder alone (an unfinished save) is a run too.
        let other = root.join("ckpt-only");
        std::fs::create_dir_all(other.join("checkpoints/step-000001.tmp")).unwrap();
        assert!(claim(&plan(&other, &[]), false).is_err());
    }

    #[test]
    fn resuming_continues_the_run_there() {
        let root = scratch("resume");
        let dir = root.join("run");
        fake_run(&dir);
        let on = plan(&dir, &["checkpoint.resume=true".into()]);
        assert_eq!(claim(&on, false).unwrap(), Claim::Continue);
        let own = dir.join("checkpoints/step-000003");
        let own = format!("checkpoint.resume={:?}", own.display().to_string());
        assert_eq!(claim(&plan(&dir, &[own]), false).unwrap(), Claim::Continue);
        // Resuming from another run's checkpoint into this folder would mix two runs.
        let elsewhere = root.join("other/step-000001");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let from = format!("checkpoint.resume={:?}", elsewhere.display().to_string());
        assert!(claim(&plan(&dir, &[from]), false).is_err());
    }

    #[test]
    fn force_moves_the_old_run_aside_and_deletes_nothing() {
        let root = scratch("force");
        let dir = root.join("run");
        fake_run(&dir);
        // A checkpoint folder of the run kept outside its run folder moves too.
        let ckpts = root.join("ckpts");
        std::fs::create_dir_all(ckpts.join("step-000002")).unwrap();
        std::fs::write(ckpts.join("step-000002/manifest.json"), "{}").unwrap();
        let p = plan(
            &dir,
            &[format!("checkpoint.dir={:?}", ckpts.display().to_string())],
        );
        let Claim::MovedAside(moved) = claim(&p, true).unwrap() else {
            panic!("not moved");
        };
        let first = root.join("run.old-1");
        assert_eq!(
            moved,
            vec![
                (dir.clone(), first.clone()),
                (ckpts.clone(), root.join("ckpts.old-1"))
            ]
        );
        assert_eq!(
            std::fs::read_to_string(first.join("metrics.jsonl")).unwrap(),
            "{\"step\":1}\n"
        );
        assert!(root.join("ckpts.old-1/step-000002/manifest.json").is_file());
        assert!(dir.is_dir() && run_traces(&p).unwrap().is_empty());
        // A second forced run takes the next free name.
        fake_run(&dir);
        let Claim::MovedAside(moved) = claim(&plan(&dir, &[]), true).unwrap() else {
            panic!("not moved");
        };
        assert_eq!(moved, vec![(dir.clone(), root.join("run.old-2"))]);
        assert!(first.join("config.toml").is_file());
    }
}
