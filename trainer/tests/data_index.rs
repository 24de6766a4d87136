//! Start-up on large sets: images checked by their headers at reading (the sizes the full
//! decode gives), a file cut after its header skipped and counted when its batch is made.

mod common;
use common::shared_path;

use cannon_trainer::data::dataset::{DataSet, SampleSettings};
use cannon_trainer::data::image::{header_size, load_and_process, processed_size, ImageConfig};
use cannon_trainer::data::shuffle::{Position, Shuffler};
use cannon_trainer::data::{synth, Batch, DataConfig, DataError, Loader, Tekken};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn tok() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(common::tekken(), None).unwrap())
}

fn tmp(name: &str) -> PathBuf {
    common::scratch("index", name)
}

fn settings(cfg: &ImageConfig, max_len: usize) -> SampleSettings<'_> {
    SampleSettings {
        max_len,
        system_prompt: None,
        image: cfg,
    }
}

/// The size the header gives, through the pixel limits and the resize, is the size of the
/// decoded and processed image: for the synthetic set's images and the shared fixtures
/// (gray, alpha, tall, tiny), under the default settings, a small longest edge, both pixel
/// limits and rounding to merged patches. So reading by headers keeps every sample's tokens.
#[test]
fn header_sizes_are_the_decoded_sizes() {
    let d = tmp("headers");
    synth::write(&d, 30, 7).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(d.join("images"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in [
        "shapes_320x200.png",
        "small_40x30.png",
        "tall_90x260.png",
        "transparent_70x45.png",
        "palette_33x61.png",
    ] {
        files.push(shared_path(&format!("images/{f}")));
    }
    let configs = [
        ImageConfig::default(),
        ImageConfig {
            longest_edge: 56,
            ..ImageConfig::default()
        },
        ImageConfig {
            max_pixels: Some(2000),
            ..ImageConfig::default()
        },
        ImageConfig {
            min_pixels: Some(40_000),
            round_to_merged_patch: true,
            ..ImageConfig::default()
        },
    ];
    // Every sample of the set read by headers has the sizes (so the image blocks) the
    // decoded images give, as when reading decoded every image.
    let train = d.join("train.jsonl");
    let ds = DataSet::read(&train, tok(), &settings(&configs[1], 2048)).unwrap();
    assert_eq!(ds.stats.samples, 27);
    for p in &ds.samples {
        let sample = p.load(&configs[1]).unwrap();
        let decoded: Vec<[u32; 2]> = sample.images.iter().map(|i| [i.height, i.width]).collect();
        assert_eq!(decoded, p.image_sizes, "line {}", p.line);
    }
    for cfg in &configs {
        for f in &files {
            let (w, h) = header_size(f).unwrap();
            let img = load_and_process(f, cfg).unwrap();
            assert_eq!(
                processed_size(w, h, cfg),
                (img.height, img.width),
                "{} {cfg:?}",
                f.display()
            );
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

/// `images/<name>` of a synthetic set, cut to half its bytes (its header stays whole).
fn cut(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
    bytes
}

fn loader_cfg(train: &Path, batch_size: usize, pack: bool) -> DataConfig {
    DataConfig {
        dataset: Some(train.to_path_buf()),
        batch_size,
        max_len: 128,
        pack,
        seed: 3,
        ..DataConfig::default()
    }
}

/// The samples' ids in a batch, row by row (padding left out).
fn rows_of(b: &Batch) -> Vec<Vec<u32>> {
    let pad = tok().pad_id();
    (0..b.rows)
        .map(|r| {
            let row = &b.input_ids[r * b.seq..(r + 1) * b.seq];
            row.iter().copied().filter(|&t| t != pad).collect()
        })
        .collect()
}

/// The rows a batch of `cfg` holds when made from `stream` without sample `skip`: one sample
/// per row, or samples packed in stream order while they fit in max_len.
fn expected_rows(ds: &DataSet, stream: Shuffler, skip: usize, cfg: &DataConfig) -> Vec<Vec<u32>> {
    let mut it = stream.filter(|&i| i != skip).peekable();
    (0..cfg.batch_size)
        .map(|_| {
            let mut row: Vec<u32> = Vec::new();
            while let Some(&i) = it.peek() {
                let ids = &ds.samples[i].input_ids;
                if !row.is_empty() && (!cfg.pack || row.len() + ids.len() > cfg.max_len) {
                    break;
                }
                row.extend_from_slice(ids);
                it.next();
            }
            row
        })
        .collect()
}

/// A PNG cut after its header passes reading (the sample is kept, its size from the header)
/// and, when its batch is made, is skipped: the batch takes the next sample of the stream, the
/// loader counts it once, and later epochs pass over it. Two loaders make the same batches, a
/// loader resumed before the bad sample meets it at the same place, and before it the batches
/// are those of the intact set.
#[test]
fn a_truncated_image_passes_reading_and_is_skipped_at_load() {
    let d = tmp("truncated");
    let o = synth::write(&d, 30, 4).unwrap();
    for pack in [false, true] {
        let cfg = loader_cfg(&o.train, 3, pack);
        let mut intact = Loader::open(&cfg, tok(), Position::default()).unwrap();
        let n = intact.dataset().samples.len();
        // The first sample of the third batch goes bad.
        let _ = intact.next_batch().unwrap();
        let _ = intact.next_batch().unwrap();
        let pos = intact.position();
        let bad = Shuffler::new(n, cfg.seed, pos).next().unwrap();
        let bad_image = intact.dataset().samples[bad].images[0].clone();
        let expect_head: Vec<Batch> = {
            let mut l = Loader::open(&cfg, tok(), Position::default()).unwrap();
            (0..2).map(|_| l.next_batch().unwrap()).collect()
        };
        let bytes = cut(&bad_image);

        let mut a = Loader::open(&cfg, tok(), Position::default()).unwrap();
        assert_eq!(a.dataset().samples.len(), n, "the cut file passes reading");
        assert_eq!(a.dataset().samples[bad].images[0], bad_image);
        let head: Vec<Batch> = (0..2).map(|_| a.next_batch().unwrap()).collect();
        assert_eq!(head, expect_head, "before the bad sample nothing changes");
        assert_eq!(a.skipped_samples(), 0);
        let third = a.next_batch().unwrap();
        assert_eq!(a.skipped_samples(), 1, "pack = {pack}");
        // The batch the stream makes without the bad sample.
        let stream = Shuffler::new(n, cfg.seed, pos);
        let want = expected_rows(a.dataset(), stream, bad, &cfg);
        assert_eq!(rows_of(&third), want, "pack = {pack}");
        if !pack {
            // The bad sample and the next three.
            assert_eq!(a.position().index, pos.index + 4);
        }
        third.check().unwrap();

        // Another loader meets it at the same place; one resumed before it too.
        let mut b = Loader::open(&cfg, tok(), Position::default()).unwrap();
        let mut c = Loader::open(&cfg, tok(), pos).unwrap();
        let _ = (b.next_batch().unwrap(), b.next_batch().unwrap());
        assert_eq!(b.next_batch().unwrap(), third);
        assert_eq!(c.next_batch().unwrap(), third);
        // Over the following epochs it is passed over without being counted again.
        for _ in 0..25 {
            let x = a.next_batch().unwrap();
            assert_eq!(b.next_batch().unwrap(), x);
        }
        assert!(a.position().epoch >= 2, "the test crosses epochs");
        assert_eq!(a.skipped_samples(), 1);
        std::fs::write(&bad_image, bytes).unwrap();
    }
    std::fs::remove_dir_all(&d).ok();
}

/// When every image is cut the loader says so instead of looping.
#[test]
fn a_set_of_only_undecodable_images_is_an_error() {
    let d = tmp("allcut");
    let o = synth::write(&d, 12, 2).unwrap();
    for e in std::fs::read_dir(d.join("images")).unwrap() {
        cut(&e.unwrap().path());
    }
    let mut l = Loader::open(&loader_cfg(&o.train, 2, false), tok(), Position::default()).unwrap();
    // And keeps saying so.
    for _ in 0..2 {
        match l.next_batch() {
            Err(DataError::Config(m)) => assert!(m.contains("every sample was skipped"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
    std::fs::remove_dir_all(&d).ok();
}
