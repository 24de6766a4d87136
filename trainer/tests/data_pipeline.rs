//! The sample pipeline: template and labels, bad lines, truncation filter, padding, packing,
//! resumable shuffling and the synthetic dataset.

mod common;
use common::shared_path;

use cannon_kernels::cross_entropy::IGNORE_INDEX as IGNORE;
use cannon_trainer::model::batch::BatchError;
use cannon_trainer::train::data::batch::{pad_batch, RowBuilder, Sample};
use cannon_trainer::train::data::dataset::{DataSet, SampleSettings};
use cannon_trainer::train::data::image::{image_block, ImageConfig, PixtralImage};
use cannon_trainer::train::data::shuffle::{epoch_order, Position, Shuffler};
use cannon_trainer::train::data::template::{check_roles, encode_turns, Message, Role, SpecialIds};
use cannon_trainer::train::data::truncate::{
    assemble, infer_seqlen, validate_input_ids, LabelPolicy,
};
use cannon_trainer::train::data::{synth, Batch, DataConfig, DataError, Loader, Tekken};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn tok() -> &'static Tekken {
    static T: OnceLock<Tekken> = OnceLock::new();
    T.get_or_init(|| Tekken::from_file(shared_path("tokenizers/tekken_240911.json"), None).unwrap())
}

fn ids() -> SpecialIds {
    SpecialIds::from_tekken(tok()).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    common::scratch("pipeline", name)
}

fn msg(role: Role, content: &str) -> Message {
    Message::new(role, content)
}

fn settings(cfg: &ImageConfig, max_len: usize) -> SampleSettings<'_> {
    SampleSettings {
        max_len,
        system_prompt: None,
        image: cfg,
        labels: Default::default(),
    }
}

/// The layout of mistral3-facts.md §3.5/§4.1, built token by token from the tokenizer's own
/// encodings of the message texts and its special ids (documented as 1, 2, 3, 4, 17, 18).
#[test]
fn template_layout_and_labels() {
    let (t, s) = (tok(), ids());
    assert_eq!(
        (s.bos, s.eos, s.inst, s.inst_end, s.system, s.system_end),
        (1, 2, 3, 4, 17, 18)
    );
    let conv = [
        msg(Role::System, "Be brief."),
        msg(Role::User, "<image>What colour?"),
        msg(Role::Assistant, "red"),
        msg(Role::User, "And now?"),
        msg(Role::Assistant, "blue"),
    ];
    let block = vec![10, 10, 12, 10, 10, 13];
    let turns = encode_turns(
        t,
        &s,
        &conv,
        Some("ignored default"),
        std::slice::from_ref(&block),
    );
    let e = |x: &str| t.encode(x, false, false);
    let src0 = [
        vec![1, 17],
        e("Be brief."),
        vec![18, 3],
        block,
        e("What colour?"),
        vec![4],
    ]
    .concat();
    let tgt0 = [e("red"), vec![2]].concat();
    let src1 = [vec![3], e("And now?"), vec![4]].concat();
    let tgt1 = [e("blue"), vec![2]].concat();
    assert_eq!(turns.len(), 2);
    assert_eq!((&turns[0].source, &turns[0].target), (&src0, &tgt0));
    assert_eq!((&turns[1].source, &turns[1].target), (&src1, &tgt1));
    let a = assemble(&turns, 4096, LabelPolicy::default());
    assert!(!a.truncated);
    assert_eq!(
        a.input_ids,
        [src0.clone(), tgt0.clone(), src1.clone(), tgt1.clone()].concat()
    );
    let want_labels: Vec<i32> = [
        vec![IGNORE; src0.len()],
        tgt0.iter().map(|&x| x as i32).collect(),
        vec![IGNORE; src1.len()],
        tgt1.iter().map(|&x| x as i32).collect(),
    ]
    .concat();
    assert_eq!(a.labels, want_labels);
    // The decoded text shows the template with control tokens spelled out.
    let text = String::from_utf8(t.decode_bytes(&a.input_ids, true).unwrap()).unwrap();
    assert_eq!(
        text,
        "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST][IMG][IMG][IMG_BREAK][IMG][IMG][IMG_END]\
         What colour?[/INST]red</s>[INST]And now?[/INST]blue</s>"
    );
    // Without a system message the configured default is used; with none, no system block.
    let plain = [msg(Role::User, "hi"), msg(Role::Assistant, "yo")];
    let t1 = encode_turns(t, &s, &plain, Some("sys"), &[]);
    assert_eq!(
        t1[0].source,
        [vec![1, 17], e("sys"), vec![18, 3], e("hi"), vec![4]].concat()
    );
    let t2 = encode_turns(t, &s, &plain, None, &[]);
    assert_eq!(t2[0].source, [vec![1, 3], e("hi"), vec![4]].concat());
}

/// The config embeds in the trainer's TOML: every key optional, unknown keys rejected.
#[test]
fn data_config_defaults_and_overrides() {
    let c: DataConfig =
        serde_json::from_str(r#"{"max_len": 512, "pack": true, "image": {"longest_edge": 224}}"#)
            .unwrap();
    assert_eq!(
        (c.max_len, c.pack, c.batch_size, c.seed),
        (512, true, 1, 42)
    );
    assert_eq!(
        (c.image.longest_edge, c.image.patch_size, c.image.merge_size),
        (224, 14, 2)
    );
    assert_eq!(c.system_prompt, None);
    assert!(serde_json::from_str::<DataConfig>(r#"{"max_lenn": 1}"#).is_err());
    assert_eq!(
        serde_json::from_str::<DataConfig>("{}").unwrap(),
        DataConfig::default()
    );
}

/// Text-only conversations against mistral-common's InstructTokenizerV7 (the [SYSTEM_PROMPT]
/// layout; tests/fixtures/data/make_chat_reference.py): identical ids, multi-turn included
/// (a system message after the first turn, answers with trailing spaces). The labels train
/// exactly every answer: the tokens after each `[/INST]` (id 4) up to and including its `</s>`
/// (id 2), read off the reference ids; everything else is IGNORE_INDEX.
#[test]
fn template_matches_mistral_common_v7() {
    let raw = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/data/chat_reference.json"
    ))
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 7);
    for c in cases {
        let messages: Vec<Message> = serde_json::from_value(c["messages"].clone()).unwrap();
        let want: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
        check_roles(&messages).unwrap();
        let turns = encode_turns(tok(), &ids(), &messages, None, &[]);
        let a = assemble(&turns, 1 << 20, LabelPolicy::default());
        assert_eq!(a.input_ids, want, "{messages:?}");
        let mut in_answer = false;
        let want_labels: Vec<i32> = want
            .iter()
            .map(|&id| {
                let l = if in_answer { id as i32 } else { IGNORE };
                in_answer = match id {
                    4 => true,
                    2 => false,
                    _ => in_answer,
                };
                l
            })
            .collect();
        assert_eq!(a.labels, want_labels, "{messages:?}");
        let answers = messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        assert_eq!(turns.len(), answers);
    }
}

#[test]
fn infer_seqlen_never_exceeds_the_cutoff_and_keeps_what_fits() {
    for src in 0..40 {
        for tgt in 0..40 {
            for cutoff in 1..60 {
                let (s, g) = infer_seqlen(src, tgt, cutoff);
                assert!(
                    s <= src && g <= tgt && s + g <= cutoff,
                    "{src} {tgt} {cutoff}"
                );
                if src + tgt <= cutoff && 2 * tgt < cutoff {
                    assert_eq!((s, g), (src, tgt));
                }
                // What is cut is cut only because the cutoff is reached.
                if (s, g) != (src, tgt) {
                    assert_eq!(s + g, cutoff.min(src + tgt), "{src} {tgt} {cutoff}");
                }
            }
        }
    }
}

fn write_png(path: &Path, w: u32, h: u32) {
    image::RgbImage::from_fn(w, h, |x, y| image::Rgb([(x * 3) as u8, (y * 5) as u8, 128]))
        .save(path)
        .unwrap();
}

fn line(user: &str, answer: &str, images: &[&str]) -> String {
    serde_json::json!({
        "messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}],
        "images": images,
    })
    .to_string()
}

/// Bad inputs named in the issue: each is reported with its line number, skipped and counted,
/// and the lines after it are still read. Images are checked by their headers: a file that is
/// not an image is a bad line, one cut after its header is kept (its sample is skipped when
/// a batch loads it, see `data_index.rs`).
#[test]
fn bad_lines_are_reported_skipped_and_counted() {
    let d = tmp("badlines");
    std::fs::create_dir_all(d.join("img")).unwrap();
    write_png(&d.join("img/ok.png"), 56, 84);
    let png = std::fs::read(d.join("img/ok.png")).unwrap();
    std::fs::write(d.join("img/cut.png"), &png[..png.len() / 2]).unwrap();
    std::fs::write(d.join("img/junk.png"), b"not an image at all").unwrap();
    let abs = d.join("img/ok.png");
    let lines = [
        line("<image>What?", "ok", &["img/ok.png"]),                             // 1 ok
        "{\"messages\": [".to_string(),                                          // 2 JSON
        line("<image>What?", "ok", &["img/missing.png"]),                        // 3 missing
        r#"{"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"b"}]}"#
            .to_string(),                                                        // 4 roles
        line("<image><image>Two?", "no", &["img/ok.png"]),                       // 5 count
        line("<image>What?", "ok", &["img/junk.png"]),                           // 6 not an image
        String::new(),                                                           // 7 blank
        line("no image", "fine", &[]),                                           // 8 ok
        r#"{"messages":[{"role":"user","content":"q"}]}"#.to_string(),           // 9 no answer
        line("<image>abs", "ok", &[abs.to_str().unwrap()]),                      // 10 ok (absolute)
        r#"{"messages":[{"role":"user","content":"q"},{"role":"assistant","content":"a"}],"images":["img/ok.png"]}"#
            .to_string(),                                                        // 11 count
    ];
    let f = d.join("set.jsonl");
    let mut bytes = lines.join("\n").into_bytes();
    bytes.extend_from_slice(b"\n{\"messages\": \"\xff\xfe\"}\n"); // 12 not UTF-8
    bytes.extend_from_slice(line("after", "all", &[]).as_bytes()); // 13 ok
    bytes.push(b'\n');
    bytes.extend_from_slice(line("<image>Cut?", "ok", &["img/cut.png"]).as_bytes()); // 14 kept
    std::fs::write(&f, bytes).unwrap();
    let cfg = ImageConfig::default();
    let ds = DataSet::read(&f, tok(), &settings(&cfg, 2048)).unwrap();
    assert_eq!(ds.stats.lines, 13);
    assert_eq!(ds.stats.samples, 5);
    assert_eq!(ds.stats.bad_lines, 8);
    assert_eq!(ds.stats.images, 3);
    assert_eq!(
        ds.samples.iter().map(|s| s.line).collect::<Vec<_>>(),
        [1, 8, 10, 13, 14]
    );
    // The cut file's header gave its size: 56x84 -> 56x84 (multiples of 14).
    assert_eq!(ds.samples[4].image_sizes, [[84, 56]]);
    let msgs: Vec<String> = ds.bad.iter().map(|e| e.to_string()).collect();
    let f_s = f.display().to_string();
    let expect = [
        (2, "invalid JSON"),
        (3, "missing.png"),
        (4, "expected User"),
        (5, "2 <image> placeholder(s) but 1 image(s)"),
        (6, "junk.png"),
        (9, "does not end with an assistant answer"),
        (11, "0 <image> placeholder(s) but 1 image(s)"),
        (12, "not UTF-8"),
    ];
    assert_eq!(msgs.len(), expect.len());
    for ((line, what), m) in expect.iter().zip(&msgs) {
        assert!(m.contains(&format!("{f_s}:{line}")), "{m}");
        assert!(m.contains(what), "{m} lacks {what}");
    }
    assert!(matches!(ds.bad[3], DataError::PlaceholderMismatch { .. }));
    assert!(DataSet::read(&d.join("nope.jsonl"), tok(), &settings(&cfg, 2048)).is_err());
    std::fs::remove_dir_all(&d).ok();
}

/// 56x84 at patch 14, merge 2: rows 3, cols 2 -> 9 image tokens (6 [IMG]).
#[test]
fn truncation_drops_cut_image_blocks_and_keeps_whole_samples() {
    let d = tmp("trunc");
    write_png(&d.join("a.png"), 56, 84);
    let long_q = "word ".repeat(40);
    let lines = [
        line(&format!("<image>{long_q}"), "yes", &["a.png"]), // image first: text gets cut
        line(&format!("{long_q}<image>?"), "yes", &["a.png"]), // image late: block gets cut
        line("<image>short", "yes", &["a.png"]),              // fits: untouched
        // Text then one image at its end: the image goes first (mistral-common), text is cut.
        line(&format!("{long_q}<image>"), "yes", &["a.png"]),
    ];
    let f = d.join("t.jsonl");
    std::fs::write(&f, lines.join("\n")).unwrap();
    let cfg = ImageConfig::default();
    let full = DataSet::read(&f, tok(), &settings(&cfg, 100_000)).unwrap();
    assert_eq!(full.stats.samples, 4);
    let n0 = full.samples[0].input_ids.len();
    assert!(n0 > 40 && full.samples[2].input_ids.len() < 30);
    let ds = DataSet::read(&f, tok(), &settings(&cfg, 30)).unwrap();
    assert_eq!(ds.stats.dropped_truncated, 1);
    assert_eq!(ds.dropped, [2]);
    assert_eq!(ds.stats.truncated, 2);
    assert_eq!(ds.stats.bad_lines, 0);
    assert_eq!(ds.samples.len(), 3);
    let moved = &ds.samples[2].input_ids;
    assert_eq!(
        &moved[2..11],
        image_block(84, 56, &cfg, ids().image),
        "<s>[INST] then the image"
    );
    assert!(ds.samples[0].input_ids.len() <= 30);
    assert_eq!(ds.samples[0].input_ids.len(), ds.samples[0].labels.len());
    // The complete sample is bit-identical to the one read without a limit.
    assert_eq!(ds.samples[1], full.samples[2]);
    // validate_input_ids on the whole block and on a cut one.
    let s = ids();
    let blk = image_block(84, 56, &cfg, s.image);
    assert_eq!(blk.len(), 9);
    let grid = [cfg.token_grid(84, 56)];
    assert!(validate_input_ids(&blk, &grid, s.image));
    assert!(!validate_input_ids(&blk[..8], &grid, s.image));
    assert!(!validate_input_ids(&blk, &[grid[0], grid[0]], s.image));
    std::fs::remove_dir_all(&d).ok();
}

fn fake(len: usize, n_img: usize, tag: u32) -> Sample {
    Sample {
        input_ids: (0..len as u32).map(|i| 1000 + tag * 100 + i).collect(),
        labels: (0..len as i32)
            .map(|i| if i < 2 { IGNORE } else { i })
            .collect(),
        images: (0..n_img)
            .map(|k| PixtralImage {
                height: 28,
                width: 28 * (k as u32 + 1),
                pixels: vec![tag as f32; 3 * 28 * 28 * (k + 1)],
            })
            .collect(),
    }
}

#[test]
fn padded_batches_round_up_and_pad_as_a_sequence_of_their_own() {
    let b = pad_batch(&[fake(5, 1, 1), fake(10, 0, 2), fake(3, 2, 3)], 11, 8).unwrap();
    assert_eq!((b.rows, b.seq), (3, 16));
    for v in [b.input_ids.len(), b.labels.len(), b.position_ids.len()] {
        assert_eq!(v, 48);
    }
    assert_eq!(&b.input_ids[..6], &[1100, 1101, 1102, 1103, 1104, 11]);
    assert_eq!(b.input_ids.iter().filter(|&&t| t != 11).count(), 18);
    assert!(b.labels[5..16].iter().all(|&l| l == IGNORE));
    // Row 1: the sample's 0..10, then the padding's own 0..6.
    assert_eq!(
        &b.position_ids[16..32],
        &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    );
    assert_eq!(b.cu_seqlens, [5, 16, 26, 32, 35, 48]);
    assert_eq!(b.samples_per_row, [1, 1, 1]);
    assert_eq!(b.images.sizes, [(28, 28), (28, 28), (28, 56)]);
    assert_eq!(b.images.pixel_values[b.images.range(2)][0], 3.0);
    // cu_seqlens say what the positions say: the model accepts the batch as it is.
    b.check().unwrap();
    assert_eq!(b.sequence_ends().as_ref(), b.cu_seqlens.as_slice());
}

#[test]
fn packed_rows_restart_positions_and_carry_cu_seqlens() {
    let mut r = RowBuilder::new(16, 11);
    r.push_row(&[fake(5, 1, 1), fake(7, 2, 2)]).unwrap();
    r.push_row(&[fake(16, 0, 3)]).unwrap();
    // A row that overflows is an error and leaves the batch as it was.
    let err = r.push_row(&[fake(9, 0, 4), fake(8, 0, 5)]).unwrap_err();
    assert_eq!(err, BatchError::RowOverflow { used: 17, seq: 16 });
    let b = r.finish();
    assert_eq!(b.rows, 2);
    assert_eq!(b.input_ids.len(), 32);
    assert_eq!(b.labels.len(), 32);
    assert_eq!(b.position_ids.len(), 32);
    assert_eq!(
        &b.position_ids[..16],
        &[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    );
    assert_eq!(b.cu_seqlens, [5, 12, 16, 32]);
    assert_eq!(b.samples_per_row, [2, 1]);
    assert_eq!(&b.input_ids[12..16], &[11; 4]);
    assert!(b.labels[12..16].iter().all(|&l| l == IGNORE));
    assert_eq!(&b.labels[5..7], &[IGNORE, IGNORE]);
    assert_eq!(b.images.sizes, [(28, 28), (28, 28), (28, 56)]);
    assert_eq!(b.images.pixel_values[b.images.range(1)][0], 2.0);
    b.check().unwrap();
    assert_eq!(b.sequence_ends().as_ref(), b.cu_seqlens.as_slice());
    // No target crosses a sample boundary or reaches into the padding.
    let t = b.targets();
    assert_eq!(t[4], IGNORE);
    assert_eq!(t[11], IGNORE);
    assert_eq!(t[3], b.labels[4]);
}

#[test]
fn a_sample_whose_ids_and_labels_disagree_is_an_error() {
    let mut s = fake(5, 0, 1);
    s.labels.pop();
    assert!(matches!(
        pad_batch(&[s], 11, 8),
        Err(BatchError::Tokens { .. })
    ));
    let mut s = fake(5, 1, 1);
    s.images[0].pixels.pop();
    assert!(matches!(
        RowBuilder::new(8, 11).push_row(&[s]),
        Err(BatchError::Image { .. })
    ));
    // A bad image after good ones in the same row leaves the earlier rows' images as they
    // were: none of the failed row's images stays behind.
    let mut r = RowBuilder::new(16, 11);
    r.push_row(&[fake(5, 1, 1)]).unwrap();
    let mut bad = fake(4, 2, 3);
    bad.images[1].pixels.pop();
    let err = r.push_row(&[fake(3, 2, 2), bad]).unwrap_err();
    assert!(matches!(err, BatchError::Image { index: 4, .. }), "{err:?}");
    let b = r.finish();
    assert_eq!(b.rows, 1);
    assert_eq!(b.images.sizes, [(28, 28)]);
    assert_eq!(b.images.pixel_values, vec![1.0; 3 * 28 * 28]);
    b.check().unwrap();
}

#[test]
fn shuffle_is_a_seeded_permutation_per_epoch() {
    let a = epoch_order(50, 7, 0);
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    assert_eq!(a, epoch_order(50, 7, 0));
    assert_ne!(a, epoch_order(50, 7, 1));
    assert_ne!(a, epoch_order(50, 8, 0));
    let mut s = Shuffler::new(3, 1, Position::default());
    let first: Vec<usize> = s.by_ref().take(3).collect();
    assert_eq!(s.position(), Position { epoch: 1, index: 0 });
    assert_eq!(first, epoch_order(3, 1, 0));
}

fn synth_set(name: &str, n: usize, seed: u64) -> (PathBuf, synth::SynthOutput) {
    let d = tmp(name);
    let o = synth::write(&d, n, seed).unwrap();
    (d, o)
}

/// Rows of at most 128 tokens over `train`.
fn loader_cfg(train: &Path, batch_size: usize, pack: bool, seed: u64) -> DataConfig {
    DataConfig {
        dataset: Some(train.to_path_buf()),
        batch_size,
        max_len: 128,
        pack,
        seed,
        ..DataConfig::default()
    }
}

fn batches(l: &mut Loader, n: usize) -> Vec<Batch> {
    (0..n).map(|_| l.next_batch().unwrap()).collect()
}

/// Stop at some position, resume from it in a fresh loader: the continuation is identical,
/// for padded and packed batches, across an epoch boundary.
#[test]
fn loader_resumes_exactly_from_a_position() {
    let (d, o) = synth_set("resume", 30, 3);
    for pack in [false, true] {
        let cfg = loader_cfg(&o.train, 2, pack, 9);
        let mut a = Loader::open(&cfg, tok(), Position::default()).unwrap();
        assert_eq!(a.stats().samples, 27);
        let _head = batches(&mut a, 5);
        let pos = a.position();
        let tail = batches(&mut a, 15);
        assert!(
            a.position().epoch >= 1,
            "the test crosses an epoch boundary"
        );
        let mut b = Loader::open(&cfg, tok(), pos).unwrap();
        assert_eq!(b.position(), pos);
        assert_eq!(batches(&mut b, 15), tail, "pack = {pack}");
        // Position survives a round trip through a checkpoint's JSON.
        let json = serde_json::to_string(&pos).unwrap();
        assert_eq!(serde_json::from_str::<Position>(&json).unwrap(), pos);
        for b in &tail {
            b.check().unwrap();
            if pack {
                assert_eq!(b.input_ids.len(), 2 * 128);
                assert!(b.samples_per_row.iter().all(|&n| n >= 2));
            } else {
                assert_eq!(b.samples_per_row, [1, 1]);
            }
            assert!(!b.images.is_empty());
        }
    }
    std::fs::remove_dir_all(&d).ok();
}

/// A batch whose image files are gone (the dataset read them, so this is the machine's
/// problem, not the data's) is an error naming the first missing image in row order (the
/// samples are made in parallel), and the stream stays where it was: once the files are back,
/// the same batch comes. (Images that are there but do not decode are skipped instead: see
/// `data_index.rs`.)
#[test]
fn a_batch_with_missing_images_names_the_first_and_keeps_the_position() {
    let (d, o) = synth_set("bad_image", 30, 4);
    for pack in [false, true] {
        let cfg = loader_cfg(&o.train, 3, pack, 2);
        let mut l = Loader::open(&cfg, tok(), Position::default()).unwrap();
        let _ = batches(&mut l, 2);
        let pos = l.position();
        let expected = Loader::open(&cfg, tok(), pos)
            .unwrap()
            .next_batch()
            .unwrap();
        let first = Shuffler::new(l.dataset().samples.len(), cfg.seed, pos)
            .next()
            .unwrap();
        let first_image = l.dataset().samples[first].images[0].clone();
        let images = d.join("images");
        let away = d.join("images.away");
        std::fs::rename(&images, &away).unwrap();
        match l.next_batch() {
            Err(DataError::Io { path, .. }) => assert_eq!(path, first_image, "pack = {pack}"),
            other => panic!("pack = {pack}: {other:?}"),
        }
        assert_eq!(l.position(), pos);
        assert_eq!(l.skipped_samples(), 0, "a missing file is not skipped");
        std::fs::rename(&away, &images).unwrap();
        assert_eq!(l.next_batch().unwrap(), expected, "pack = {pack}");
    }
    std::fs::remove_dir_all(&d).ok();
}

/// Same seed, same bytes; every line reads cleanly; answers are one short word.
#[test]
fn synth_is_deterministic_and_clean() {
    let (d1, o1) = synth_set("synth1", 40, 5);
    let (d2, o2) = synth_set("synth2", 40, 5);
    let (d3, o3) = synth_set("synth3", 40, 6);
    let read = |p: &Path| std::fs::read(p).unwrap();
    assert_eq!(read(&o1.train), read(&o2.train));
    assert_eq!(read(&o1.heldout), read(&o2.heldout));
    assert_ne!(read(&o1.train), read(&o3.train));
    assert_eq!(
        read(&d1.join("images/000007_0.png")),
        read(&d2.join("images/000007_0.png"))
    );
    assert_eq!((o1.train_samples, o1.heldout_samples), (36, 4));
    let cfg = ImageConfig::default();
    for f in [&o1.train, &o1.heldout] {
        let ds = DataSet::read(f, tok(), &settings(&cfg, 2048)).unwrap();
        assert_eq!(ds.stats.bad_lines, 0);
        assert_eq!(ds.stats.dropped_truncated, 0);
        assert_eq!(ds.stats.samples, ds.stats.lines);
    }
    let text = std::fs::read_to_string(&o1.train).unwrap();
    let mut two_images = 0;
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let answer = v["messages"][1]["content"].as_str().unwrap();
        assert!(!answer.contains(' ') && !answer.is_empty() && answer.len() <= 8);
        two_images += (v["images"].as_array().unwrap().len() == 2) as usize;
    }
    assert!(two_images > 0);
    for d in [d1, d2, d3] {
        std::fs::remove_dir_all(&d).ok();
    }
}

/// The answers are what the pixels show: "What colour is the X?" names a colour drawn in the
/// image (the renderer's palette colours are exact, the background is grey).
#[test]
fn synth_colour_answers_are_in_the_image() {
    let (d, o) = synth_set("synthcol", 60, 11);
    let text = std::fs::read_to_string(&o.train).unwrap();
    let mut checked = 0;
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let q = v["messages"][0]["content"].as_str().unwrap();
        if !q.contains("What colour") {
            continue;
        }
        let answer = v["messages"][1]["content"].as_str().unwrap();
        let rgb = synth::COLOURS.iter().find(|c| c.0 == answer).unwrap().1;
        let img = image::open(d.join(v["images"][0].as_str().unwrap()))
            .unwrap()
            .to_rgb8();
        assert!(img.pixels().any(|p| p.0 == rgb), "{q} {answer}");
        checked += 1;
    }
    assert!(checked > 0);
    std::fs::remove_dir_all(&d).ok();
}
