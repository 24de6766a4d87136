//! A small vision-language dataset made here: PNG images of coloured shapes and questions about
//! them with exact one-word answers, deterministic from a seed. The trainer learns from
//! `train.jsonl` and measures answer accuracy on `heldout.jsonl`.

use super::shuffle::SplitMix64;
use super::template::{Message, Role};
use super::{DataError, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The generator's version: part of the default run's cache folder name, so a changed
/// generator never reuses a set an older one wrote. 2: shapes on the `[IMG]` token grid.
pub const VERSION: u32 = 2;

pub const COLOURS: [(&str, [u8; 3]); 6] = [
    ("red", [220, 30, 30]),
    ("green", [30, 170, 40]),
    ("blue", [30, 60, 220]),
    ("yellow", [235, 210, 20]),
    ("purple", [140, 40, 170]),
    ("orange", [245, 130, 20]),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Circle,
    Square,
    Triangle,
}

impl Shape {
    pub const ALL: [Shape; 3] = [Shape::Circle, Shape::Square, Shape::Triangle];
    pub fn name(self) -> &'static str {
        match self {
            Shape::Circle => "circle",
            Shape::Square => "square",
            Shape::Triangle => "triangle",
        }
    }
}

/// One drawn shape: kind, colour index, centre and half-size in pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub shape: Shape,
    pub colour: usize,
    pub cx: i32,
    pub cy: i32,
    pub r: i32,
}

/// Image sides (width, height): square and wide/tall ones, all within 56..=112 px.
const SIZES: [(u32, u32); 6] = [
    (56, 56),
    (84, 84),
    (112, 112),
    (112, 56),
    (56, 112),
    (112, 84),
];

/// Side of one scene cell in pixels: one `[IMG]` token of the vision tower (2 x 2 patches of
/// 14 px after the patch merge). Every shape sits in its own cell.
pub const CELL: u32 = 28;
/// Half-sizes of a shape (it spans `2r + 1` pixels): 19 to 23 px across, wider than one 14 px
/// patch (so its outline and not only its colour reaches the vision tower).
const R_MIN: u32 = 9;
const R_MAX: u32 = 11;
/// How far a shape's centre may move from its cell's centre, in pixels each way: as far as
/// keeps the largest shape inside its cell.
const JITTER: u32 = CELL / 2 - R_MAX - 1;

/// Draws 1..=3 shapes in distinct cells of the image's 28 px grid, at random cells, sizes and
/// small offsets. A shape never straddles two `[IMG]` tokens: the small model has to learn
/// what a shape is and where it is, not to reassemble one from fragments of several tokens.
fn scene(rng: &mut SplitMix64) -> (u32, u32, Vec<Placed>) {
    let (w, h) = SIZES[rng.below(SIZES.len() as u64) as usize];
    let n = rng.range(1, 3) as usize;
    let (cols, rows) = (w / CELL, h / CELL);
    // Which cells hold a shape, in reading order (row by row).
    let mut cells: Vec<u32> = (0..cols * rows).collect();
    while cells.len() > n {
        cells.remove(rng.below(cells.len() as u64) as usize);
    }
    let mut v = Vec::with_capacity(n);
    for k in cells {
        let jitter = |rng: &mut SplitMix64| rng.range(0, 2 * JITTER as u64) as i32 - JITTER as i32;
        let cx = ((k % cols) * CELL + CELL / 2) as i32 + jitter(rng);
        let cy = ((k / cols) * CELL + CELL / 2) as i32 + jitter(rng);
        v.push(Placed {
            shape: Shape::ALL[rng.below(3) as usize],
            colour: rng.below(COLOURS.len() as u64) as usize,
            cx,
            cy,
            r: rng.range(R_MIN as u64, R_MAX as u64) as i32,
        });
    }
    (w, h, v)
}

fn inside(p: &Placed, x: i32, y: i32) -> bool {
    let (dx, dy) = (x - p.cx, y - p.cy);
    match p.shape {
        Shape::Circle => dx * dx + dy * dy <= p.r * p.r,
        Shape::Square => dx.abs() <= p.r && dy.abs() <= p.r,
        // Apex up, base at cy + r: |dx| grows linearly from the apex to the base.
        Shape::Triangle => dy >= -p.r && dy <= p.r && 2 * dx.abs() <= dy + p.r,
    }
}

/// Renders a scene on a light grey background.
pub fn render(w: u32, h: u32, shapes: &[Placed]) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        let hit = shapes.iter().find(|p| inside(p, x as i32, y as i32));
        image::Rgb(hit.map_or([235, 235, 235], |p| COLOURS[p.colour].1))
    })
}

/// One generated sample before it is written.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthSample {
    pub question: String,
    pub answer: String,
    pub images: Vec<(u32, u32, Vec<Placed>)>,
}

fn count_of(shapes: &[Placed], s: Shape) -> usize {
    shapes.iter().filter(|p| p.shape == s).count()
}

/// Draws one sample: a question whose answer the images determine exactly.
pub fn sample(rng: &mut SplitMix64) -> SynthSample {
    // The kind is drawn once and scenes are redrawn until they fit it, so that every kind of
    // question is equally frequent.
    let kind = rng.below(4);
    loop {
        if kind == 3 {
            // Two images, exactly one of which holds the asked shape.
            let a = scene(rng);
            let b = scene(rng);
            let s = Shape::ALL[rng.below(3) as usize];
            let (ia, ib) = (count_of(&a.2, s) > 0, count_of(&b.2, s) > 0);
            if ia == ib {
                continue;
            }
            return SynthSample {
                question: format!("<image><image>Which image has a {}?", s.name()),
                answer: if ia { "first" } else { "second" }.into(),
                images: vec![a, b],
            };
        }
        let img = scene(rng);
        let shapes = &img.2;
        let (q, a) = match kind {
            0 => {
                let s = Shape::ALL[rng.below(3) as usize];
                let Some(p) = shapes.iter().find(|p| p.shape == s) else {
                    continue;
                };
                if count_of(shapes, s) != 1 {
                    continue;
                }
                (
                    format!("What colour is the {}?", s.name()),
                    COLOURS[p.colour].0.to_string(),
                )
            }
            1 => (
                "How many shapes are there?".to_string(),
                shapes.len().to_string(),
            ),
            _ => {
                let p = shapes[rng.below(shapes.len() as u64) as usize];
                if shapes.iter().filter(|q| q.colour == p.colour).count() != 1 {
                    continue;
                }
                (
                    format!("What shape is {}?", COLOURS[p.colour].0),
                    p.shape.name().to_string(),
                )
            }
        };
        return SynthSample {
            question: format!("<image>{q}"),
            answer: a,
            images: vec![img],
        };
    }
}

/// Paths of a written synthetic dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthOutput {
    pub train: PathBuf,
    pub heldout: PathBuf,
    pub train_samples: usize,
    pub heldout_samples: usize,
}

/// The names a finished dataset has under its folder.
pub const TRAIN: &str = "train.jsonl";
pub const HELDOUT: &str = "heldout.jsonl";
pub const IMAGES: &str = "images";

/// Temporary names: everything is written under these and renamed when complete, so a killed
/// run leaves nothing under the final names (and the next run clears these first).
fn tmp_name(name: &str) -> String {
    format!(".{name}.partial")
}

/// The final names already present under `out` (what writing would replace).
pub fn existing(out: &Path) -> Vec<PathBuf> {
    [TRAIN, HELDOUT, IMAGES]
        .iter()
        .map(|n| out.join(n))
        .filter(|p| p.exists())
        .collect()
}

/// Writes `samples` samples (one in ten, at least one, held out) under `out`:
/// `train.jsonl`, `heldout.jsonl` and `images/NNNNNN_k.png`. Refuses to replace an existing
/// dataset there ([`write_with`] with `force` does).
pub fn write(out: &Path, samples: usize, seed: u64) -> Result<SynthOutput> {
    write_with(out, samples, seed, false, &mut |_| {})
}

/// [`write()`], replacing an existing dataset when `force`, and calling `progress(done)` after
/// each sample. The files are written under temporary names (`.train.jsonl.partial`, ...) and
/// renamed when all are complete (images first, `train.jsonl` last).
pub fn write_with(
    out: &Path,
    samples: usize,
    seed: u64,
    force: bool,
    progress: &mut dyn FnMut(usize),
) -> Result<SynthOutput> {
    if samples == 0 {
        return Err(DataError::Config(
            "a synthetic dataset needs samples > 0".into(),
        ));
    }
    let found = existing(out);
    if !force && !found.is_empty() {
        return Err(DataError::Exists {
            path: found[0].clone(),
        });
    }
    let tmp = |n: &str| out.join(tmp_name(n));
    let (train_tmp, held_tmp, img_tmp) = (tmp(TRAIN), tmp(HELDOUT), tmp(IMAGES));
    // Leftovers of a killed run are ours to clear.
    remove(&img_tmp)?;
    std::fs::create_dir_all(&img_tmp).map_err(|e| DataError::io(&img_tmp, e))?;
    let heldout_n = if samples >= 2 {
        (samples / 10).max(1)
    } else {
        0
    };
    let open = |p: &Path| {
        std::fs::File::create(p)
            .map(std::io::BufWriter::new)
            .map_err(|e| DataError::io(p, e))
    };
    let (mut train, mut held) = (open(&train_tmp)?, open(&held_tmp)?);
    let mut rng = SplitMix64::new(seed);
    for i in 0..samples {
        let s = sample(&mut rng);
        let mut names = Vec::with_capacity(s.images.len());
        for (k, (w, h, shapes)) in s.images.iter().enumerate() {
            let file = format!("{i:06}_{k}.png");
            let p = img_tmp.join(&file);
            render(*w, *h, shapes)
                .save(&p)
                .map_err(|source| DataError::Image { path: p, source })?;
            names.push(format!("{IMAGES}/{file}"));
        }
        let line = serde_json::json!({
            "messages": [
                Message::new(Role::User, s.question),
                Message::new(Role::Assistant, s.answer),
            ],
            "images": names,
        });
        let (f, p) = if i < samples - heldout_n {
            (&mut train, &train_tmp)
        } else {
            (&mut held, &held_tmp)
        };
        writeln!(f, "{line}").map_err(|e| DataError::io(p, e))?;
        progress(i + 1);
    }
    for (f, p) in [(train, &train_tmp), (held, &held_tmp)] {
        let file = f
            .into_inner()
            .map_err(|e| DataError::io(p, e.into_error()))?;
        file.sync_all().map_err(|e| DataError::io(p, e))?;
    }
    let (train_path, held_path, img_path) = (out.join(TRAIN), out.join(HELDOUT), out.join(IMAGES));
    // A folder cannot be renamed over a non-empty one: the old images go first.
    remove(&img_path)?;
    rename(&img_tmp, &img_path)?;
    rename(&held_tmp, &held_path)?;
    rename(&train_tmp, &train_path)?;
    Ok(SynthOutput {
        train: train_path,
        heldout: held_path,
        train_samples: samples - heldout_n,
        heldout_samples: heldout_n,
    })
}

fn remove(p: &Path) -> Result<()> {
    let r = if p.is_dir() {
        std::fs::remove_dir_all(p)
    } else {
        std::fs::remove_file(p)
    };
    match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(DataError::io(p, e)),
        _ => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to).map_err(|e| DataError::io(to, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape lies inside its own 28 px cell (so inside one `[IMG]` token's pixels) with
    /// its whole outline in the image, at least 18 px across, and no two share a cell; the
    /// scenes use every cell count, shape, colour and image size.
    #[test]
    fn shapes_sit_in_distinct_cells() {
        let mut rng = SplitMix64::new(3);
        let (mut counts, mut shapes, mut colours) = ([0; 4], [0; 3], [0; 6]);
        let mut sizes = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let (w, h, v) = scene(&mut rng);
            assert!(w % CELL == 0 && h % CELL == 0, "{w}x{h}");
            sizes.insert((w, h));
            counts[v.len()] += 1;
            let mut cells = std::collections::BTreeSet::new();
            for p in &v {
                assert!((R_MIN as i32..=R_MAX as i32).contains(&p.r), "{p:?}");
                let cell = ((p.cx / CELL as i32), (p.cy / CELL as i32));
                let (x0, y0) = (cell.0 * CELL as i32, cell.1 * CELL as i32);
                assert!(p.cx - p.r >= x0 && p.cx + p.r < x0 + CELL as i32, "{p:?}");
                assert!(p.cy - p.r >= y0 && p.cy + p.r < y0 + CELL as i32, "{p:?}");
                assert!(cells.insert(cell), "two shapes in cell {cell:?}");
                shapes[Shape::ALL.iter().position(|s| *s == p.shape).unwrap()] += 1;
                colours[p.colour] += 1;
            }
        }
        assert_eq!(counts[0], 0);
        assert!(counts[1..].iter().all(|&c| c > 0), "{counts:?}");
        assert!(shapes.iter().all(|&c| c > 0) && colours.iter().all(|&c| c > 0));
        assert_eq!(sizes.len(), SIZES.len());
    }
}
