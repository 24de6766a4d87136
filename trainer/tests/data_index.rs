//! Start-up on large sets: images checked by their headers at reading (the sizes the full
//! decode gives), a file cut after its header skipped and counted when its batch is made, and
//! the index cache (the same dataset from the cache, keys that follow the inputs, damaged
//! files rewritten, one writer among racing ranks).

mod common;
use common::shared_path;

use cannon_trainer::train::data::dataset::{DataSet, SampleSettings};
use cannon_trainer::train::data::image::{
    header_size, load_and_process, processed_size, ImageConfig,
};
use cannon_trainer::train::data::index::{index_file, index_key, IndexUse};
use cannon_trainer::train::data::info::DatasetSpec;
use cannon_trainer::train::data::shuffle::{Position, Shuffler};
use cannon_trainer::train::data::truncate::LabelPolicy;
use cannon_trainer::train::data::{synth, Batch, DataConfig, DataError, Loader, Tekken};
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
        labels: Default::default(),
    }
}

/// Two datasets are the same: samples, stats, layout, dropped lines and bad-record messages.
fn assert_same(a: &DataSet, b: &DataSet) {
    assert_eq!(a.samples, b.samples);
    assert_eq!(a.stats, b.stats);
    assert_eq!(a.layout, b.layout);
    assert_eq!(a.dropped, b.dropped);
    let msgs = |d: &DataSet| d.bad.iter().map(|e| e.to_string()).collect::<Vec<_>>();
    assert_eq!(msgs(a), msgs(b));
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

/// A dataset with every kind of outcome: kept samples with one and two images, a bad JSON
/// line, a missing image, a placeholder mismatch, a sample dropped by truncation.
fn mixed_set(d: &Path) -> PathBuf {
    let o = synth::write(d, 20, 9).unwrap();
    let mut text = std::fs::read_to_string(&o.train).unwrap();
    let long = "word ".repeat(200);
    text += "{\"messages\": [\n";
    text += &serde_json::json!({"messages": [{"role": "user", "content": "<image>?"},
        {"role": "assistant", "content": "a"}], "images": ["images/none.png"]})
    .to_string();
    text += "\n";
    text += &serde_json::json!({"messages": [{"role": "user", "content": "<image><image>?"},
        {"role": "assistant", "content": "a"}], "images": ["images/000000_0.png"]})
    .to_string();
    text += "\n";
    text +=
        &serde_json::json!({"messages": [{"role": "user", "content": format!("{long}<image>?")},
        {"role": "assistant", "content": "a"}], "images": ["images/000000_0.png"]})
        .to_string();
    text += "\n";
    let f = d.join("mixed.jsonl");
    std::fs::write(&f, text).unwrap();
    f
}

/// The first open reads the set and writes its index; the second reads the index and gives
/// the same dataset (samples, stats, bad-record messages, dropped lines); so does a loader.
#[test]
fn a_second_open_reads_the_cache_and_gives_the_same_dataset() {
    let d = tmp("hit");
    let f = mixed_set(&d);
    let cache = d.join("cache");
    let img = ImageConfig::default();
    let s = settings(&img, 128);
    let spec = DatasetSpec::file(&f);
    let plain = DataSet::open(&spec, tok(), &s).unwrap();
    assert!(plain.stats.bad_lines == 3 && plain.stats.dropped_truncated == 1);
    assert!(plain.stats.samples >= 18);
    let (first, used) = DataSet::open_cached(&spec, tok(), &s, &cache).unwrap();
    let file = index_file(&cache, &spec, tok(), &s).unwrap();
    assert_eq!(
        used,
        IndexUse::Written {
            path: file.clone(),
            replaced: None
        }
    );
    assert!(file.is_file());
    assert_same(&first, &plain);
    let (second, used) = DataSet::open_cached(&spec, tok(), &s, &cache).unwrap();
    assert_eq!(used, IndexUse::Hit(file.clone()));
    assert_same(&second, &plain);
    assert_eq!(second.path, plain.path);
    // A loader through the cache: the same batches as one without it.
    let cfg = |cache_dir: Option<PathBuf>| DataConfig {
        dataset: Some(f.clone()),
        batch_size: 2,
        max_len: 128,
        cache_dir,
        ..DataConfig::default()
    };
    let mut with = Loader::open(&cfg(Some(cache.clone())), tok(), Position::default()).unwrap();
    let mut without = Loader::open(&cfg(None), tok(), Position::default()).unwrap();
    assert_eq!(with.index(), Some(&IndexUse::Hit(file)));
    assert_eq!(without.index(), None);
    for _ in 0..4 {
        assert_eq!(with.next_batch().unwrap(), without.next_batch().unwrap());
    }
    std::fs::remove_dir_all(&d).ok();
}

/// The key follows every input that shapes samples: max_len, the system prompt, the image
/// settings, the tokenizer (its bytes, its vocabulary size) and the dataset file (a rewrite).
#[test]
fn the_key_changes_with_settings_tokenizer_and_dataset() {
    let d = tmp("key");
    let f = mixed_set(&d);
    let spec = DatasetSpec::file(&f);
    let img = ImageConfig::default();
    let key = |t: &Tekken, s: &SampleSettings| index_key(&spec, t, s).unwrap();
    let base = key(tok(), &settings(&img, 128));
    assert_eq!(base, key(tok(), &settings(&img, 128)), "the key is stable");
    assert_ne!(base, key(tok(), &settings(&img, 256)), "max_len");
    let sys = SampleSettings {
        system_prompt: Some("Be brief."),
        ..settings(&img, 128)
    };
    assert_ne!(base, key(tok(), &sys), "system prompt");
    for labels in [
        LabelPolicy {
            train_on_prompt: true,
            mask_history: false,
        },
        LabelPolicy {
            train_on_prompt: false,
            mask_history: true,
        },
    ] {
        let other = SampleSettings {
            labels,
            ..settings(&img, 128)
        };
        assert_ne!(base, key(tok(), &other), "{labels:?}");
    }
    let small = ImageConfig {
        longest_edge: 56,
        ..ImageConfig::default()
    };
    assert_ne!(base, key(tok(), &settings(&small, 128)), "longest edge");
    let limited = ImageConfig {
        max_pixels: Some(4096),
        ..ImageConfig::default()
    };
    assert_ne!(base, key(tok(), &settings(&limited, 128)), "max_pixels");
    // Mean and std change pixels only.
    let tinted = ImageConfig {
        mean: [0.5; 3],
        ..ImageConfig::default()
    };
    assert_eq!(base, key(tok(), &settings(&tinted, 128)), "mean");
    // The tokenizer: a truncated vocabulary, then other bytes of the same vocabulary.
    let v = Tekken::from_file(common::tekken(), Some(8192)).unwrap();
    assert_ne!(base, key(&v, &settings(&img, 128)), "vocab_size");
    let mut raw = std::fs::read(common::tekken()).unwrap();
    raw.push(b'\n');
    let copy = d.join("tekken.json");
    std::fs::write(&copy, &raw).unwrap();
    let t2 = Tekken::from_file(&copy, None).unwrap();
    assert_eq!(t2.vocab_size(), tok().vocab_size());
    assert_ne!(base, key(&t2, &settings(&img, 128)), "tokenizer bytes");
    // The dataset rewritten (one more line).
    let mut text = std::fs::read_to_string(&f).unwrap();
    text += "\n";
    std::fs::write(&f, text).unwrap();
    assert_ne!(base, key(tok(), &settings(&img, 128)), "dataset file");
    std::fs::remove_dir_all(&d).ok();
}

/// A cache file that is damaged (a flipped byte), cut short or not an index at all is not
/// trusted: the set is read again, the same dataset comes back, and the file is rewritten
/// (the next open reads it).
#[test]
fn a_damaged_cache_file_is_rewritten() {
    let d = tmp("damaged");
    let f = mixed_set(&d);
    let cache = d.join("cache");
    let img = ImageConfig::default();
    let s = settings(&img, 128);
    let spec = DatasetSpec::file(&f);
    let (plain, _) = DataSet::open_cached(&spec, tok(), &s, &cache).unwrap();
    let file = index_file(&cache, &spec, tok(), &s).unwrap();
    let good = std::fs::read(&file).unwrap();
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x40;
    let damages: [(&str, Vec<u8>); 4] = [
        ("flipped", flipped),
        ("cut", good[..good.len() - 7].to_vec()),
        ("junk", b"not an index".to_vec()),
        ("empty", Vec::new()),
    ];
    for (what, bytes) in damages {
        std::fs::write(&file, &bytes).unwrap();
        let (ds, used) = DataSet::open_cached(&spec, tok(), &s, &cache).unwrap();
        match &used {
            IndexUse::Written {
                path,
                replaced: Some(_),
            } => assert_eq!(path, &file),
            other => panic!("{what}: {other:?}"),
        }
        assert_same(&ds, &plain);
        assert_eq!(std::fs::read(&file).unwrap(), good, "{what}: rewritten");
        let (_, used) = DataSet::open_cached(&spec, tok(), &s, &cache).unwrap();
        assert_eq!(used, IndexUse::Hit(file.clone()), "{what}");
    }
    std::fs::remove_dir_all(&d).ok();
}

/// Ranks of a node starting together: one reads the set and writes the index, the others
/// wait for it and read it; all get the same dataset, and no temporary file is left.
#[test]
fn racing_ranks_write_the_index_once() {
    let d = tmp("race");
    let f = mixed_set(&d);
    let cache = d.join("cache");
    let img = ImageConfig::default();
    let spec = DatasetSpec::file(&f);
    let ranks = 4;
    let barrier = std::sync::Barrier::new(ranks);
    let results: Vec<(DataSet, IndexUse)> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..ranks)
            .map(|_| {
                sc.spawn(|| {
                    barrier.wait();
                    DataSet::open_cached(&spec, tok(), &settings(&img, 128), &cache).unwrap()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let written = results
        .iter()
        .filter(|(_, u)| matches!(u, IndexUse::Written { .. }))
        .count();
    let hits = results
        .iter()
        .filter(|(_, u)| matches!(u, IndexUse::Hit(_)))
        .count();
    assert_eq!((written, hits), (1, ranks - 1));
    for (ds, _) in &results[1..] {
        assert_same(ds, &results[0].0);
    }
    let names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains(".tmp.")), "{names:?}");
    assert_eq!(names.iter().filter(|n| n.ends_with(".idx")).count(), 1);
    std::fs::remove_dir_all(&d).ok();
}
