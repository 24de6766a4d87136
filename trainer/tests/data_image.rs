//! Pixtral image processor against transformers' PixtralImageProcessor outputs: as Magistral's
//! processor calls it (shared/images/pixtral_processor.merge2.le{224,1540}.*: sides in
//! multiples of 28 px, a transparent and a palette image among them) and on its own
//! (pixtral_processor.reference.safetensors, multiples of 14); the image token block, and the
//! errors for unreadable files.

mod common;
use common::shared_path;

use cannon_trainer::train::data::image::{
    header_size, image_block, load_and_process, load_rgb, process, regularize, ImageConfig,
    ImageTokens,
};
use cannon_trainer::train::data::DataError;
use safetensors::SafeTensors;

/// The settings `pixtral_processor.reference.safetensors` was made with: the image processor on
/// its own, sides rounded to the patch (14), not to the merged patch.
fn reference_config() -> ImageConfig {
    ImageConfig {
        longest_edge: 224,
        patch_size: 14,
        round_to_merged_patch: false,
        ..ImageConfig::default()
    }
}

fn f32s(t: &safetensors::tensor::TensorView<'_>) -> Vec<f32> {
    t.data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Compares every image of a reference file with `cfg`'s processing of the same PNG.
/// Sizes must be exact; pixel values within a mean absolute error of 0.02 (about 1.4 grey
/// levels after CLIP std) and no pixel off by more than one grey level: the resize is PIL's
/// integer bicubic, so the residual is the reference backend's own rounding (printed).
fn check_against_reference(file: &str, cfg: &ImageConfig, want_files: usize) {
    let raw = std::fs::read(shared_path(&format!("images/{file}"))).unwrap();
    let st = SafeTensors::deserialize(&raw).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&raw).unwrap();
    let meta = meta.metadata().as_ref().unwrap();
    let files: Vec<String> = serde_json::from_str(&meta["files"]).unwrap();
    assert_eq!(meta["longest_edge"], cfg.longest_edge.to_string(), "{file}");
    assert_eq!(meta["patch_size"], cfg.patch_size.to_string(), "{file}");
    let merge = meta.get("spatial_merge_size").map_or("1", String::as_str);
    let rounding = if cfg.round_to_merged_patch {
        cfg.merge_size
    } else {
        1
    };
    assert_eq!(merge, rounding.to_string(), "{file}");
    assert_eq!(files.len(), want_files, "{file}");
    for (i, f) in files.iter().enumerate() {
        let got = load_and_process(&shared_path(&format!("images/{f}")), cfg).unwrap();
        let size = st.tensor(&format!("img{i}.image_size")).unwrap();
        let size: Vec<i64> = size
            .data()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(
            [got.height as i64, got.width as i64],
            [size[0], size[1]],
            "{file}: {f}"
        );
        let want = f32s(&st.tensor(&format!("img{i}.pixel_values")).unwrap());
        assert_eq!(got.pixels.len(), want.len(), "{file}: {f}");
        let n = want.len() as f64;
        let mae = got
            .pixels
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs() as f64)
            .sum::<f64>()
            / n;
        let max = got
            .pixels
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!(
            "{file}: {f}: {}x{} mean abs error {mae:.3e}, max {max:.3e}",
            got.height, got.width
        );
        assert!(mae < 0.02, "{file}: {f}: mean abs error {mae}");
        let one_level = 1.0 / (255.0 * cfg.std.iter().cloned().fold(f32::MAX, f32::min));
        assert!(max <= one_level * 1.001, "{file}: {f}: max error {max}");
    }
}

#[test]
fn image_processor_matches_transformers_reference() {
    check_against_reference(
        "pixtral_processor.reference.safetensors",
        &reference_config(),
        3,
    );
}

/// Magistral's processor (`PixtralProcessor`: patch 14 x spatial merge 2), the default: at a
/// small longest edge (every image scaled down) and at Mistral3's 1540 (none is), over an
/// RGBA image and a palette image with a transparent index (both composited over white).
#[test]
fn merged_patch_images_match_magistral_processor_reference() {
    for (file, longest_edge) in [
        ("pixtral_processor.merge2.le224.reference.safetensors", 224),
        (
            "pixtral_processor.merge2.le1540.reference.safetensors",
            1540,
        ),
    ] {
        let cfg = ImageConfig {
            longest_edge,
            ..ImageConfig::default()
        };
        assert!(cfg.round_to_merged_patch, "the default is Magistral's");
        check_against_reference(file, &cfg, 5);
    }
}

/// Any image of at least one pixel gives at least one token: sides round up to 28 (the issue's
/// examples, mistral-common's and the processor's grids).
#[test]
fn tiny_and_odd_images_round_up_to_the_merged_patch() {
    let cfg = ImageConfig::default();
    for ((w, h), (ow, oh)) in [
        ((640, 480), (644, 504)),
        ((100, 60), (112, 84)),
        ((29, 29), (56, 56)),
        ((13, 9), (28, 28)),
        ((1, 1), (28, 28)),
        ((1, 5000), (28, 1540)),
    ] {
        assert_eq!(cfg.output_size(h, w), (oh, ow), "{w}x{h}");
        let t = ImageTokens {
            img: 10,
            img_break: 12,
            img_end: 13,
        };
        assert!(!image_block(oh, ow, &cfg, t).is_empty(), "{w}x{h}");
    }
    let dir = std::env::temp_dir().join(format!("cannon-data-tiny-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    image::RgbImage::from_pixel(1, 1, image::Rgb([200, 10, 10]))
        .save(dir.join("one.png"))
        .unwrap();
    let one = load_and_process(&dir.join("one.png"), &cfg).unwrap();
    assert_eq!((one.height, one.width), (28, 28));
    // One pixel stretched: every output pixel is that colour.
    let red = (200.0 / 255.0 - cfg.mean[0]) / cfg.std[0];
    assert!(one.pixels[..28 * 28]
        .iter()
        .all(|&v| (v - red).abs() < 1e-5));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn image_output_sizes_follow_the_hf_rule() {
    let cfg = ImageConfig {
        round_to_merged_patch: false,
        ..ImageConfig::default()
    };
    // mistral3-facts.md §2.3 worked example: 626x418 -> 630x420 with P = 14.
    assert_eq!(cfg.output_size(418, 626), (420, 630));
    let merged = ImageConfig::default();
    assert_eq!(merged.output_size(418, 626), (420, 644));
    // Over the longest edge: scaled, then rounded up.
    assert_eq!(cfg.output_size(3080, 1000), (1540, 504));
    // A scaled side is rounded as Python's round() (mistral-common), halves to even: 3080 x
    // 1001 scales by 2 to 500.5 -> 500 (floor would agree here), 3080 x 1003 to 501.5 -> 502
    // (floor: 501); both then round up to 504 at P = 14.
    let small = ImageConfig {
        longest_edge: 1540,
        patch_size: 1,
        merge_size: 1,
        ..ImageConfig::default()
    };
    assert_eq!(small.output_size(3080, 1001), (1540, 500));
    assert_eq!(small.output_size(3080, 1003), (1540, 502));
}

#[test]
fn image_block_layout_and_counts() {
    let t = ImageTokens {
        img: 10,
        img_break: 12,
        img_end: 13,
    };
    let cfg = ImageConfig::default();
    // §2.3: 630x420 -> rows 15, cols 22 -> 330 [IMG], 345 tokens.
    let b = image_block(420, 630, &cfg, t);
    assert_eq!(b.len(), 345);
    assert_eq!(b.iter().filter(|&&x| x == 10).count(), 330);
    assert_eq!(b.iter().filter(|&&x| x == 12).count(), 14);
    assert_eq!(b.last(), Some(&13));
    assert_eq!(&b[..23], &[[10u32; 22].as_slice(), &[12]].concat()[..]);
    assert_eq!(
        image_block(56, 84, &cfg, t),
        vec![10, 10, 10, 12, 10, 10, 10, 13]
    );
    assert!(image_block(14, 140, &cfg, t).is_empty());
}

#[test]
fn gray_images_become_rgb_and_transparency_goes_over_white() {
    let dir = std::env::temp_dir().join(format!("cannon-data-image-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gray = image::GrayImage::from_fn(30, 20, |x, y| image::Luma([(x * 7 + y * 3) as u8]));
    let rgba = image::RgbaImage::from_fn(30, 20, |x, y| {
        let g = (x * 7 + y * 3) as u8;
        image::Rgba([g, g, g, (x * 8) as u8])
    });
    gray.save(dir.join("g.png")).unwrap();
    rgba.save(dir.join("a.png")).unwrap();
    let cfg = reference_config();
    let g = load_and_process(&dir.join("g.png"), &cfg).unwrap();
    let a = load_and_process(&dir.join("a.png"), &cfg).unwrap();
    assert_eq!((g.height, g.width), (28, 42));
    assert_eq!((a.height, a.width), (28, 42));
    // Transparency is composited over white (transformers' convert_to_rgb): each channel is
    // g * alpha/255 + 255 * (1 - alpha/255), within the integer rounding (1 grey level).
    let over = load_rgb(&dir.join("a.png")).unwrap();
    for (x, y, p) in over.enumerate_pixels() {
        let (g, alpha) = (f64::from((x * 7 + y * 3) as u8), f64::from(x * 8) / 255.0);
        let want = g * alpha + 255.0 * (1.0 - alpha);
        for c in p.0 {
            assert!(
                (f64::from(c) - want).abs() <= 1.0,
                "({x},{y}): {c} vs {want}"
            );
        }
    }
    assert_eq!(
        over.get_pixel(0, 5).0,
        [255, 255, 255],
        "fully transparent is white"
    );
    assert_eq!(process(&over, &cfg), a);
    let rgb = load_rgb(&dir.join("g.png")).unwrap();
    assert_eq!(rgb.get_pixel(3, 2).0, [27, 27, 27]);
    assert_eq!(process(&rgb, &cfg), g);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn corrupt_and_missing_images_are_errors_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("cannon-data-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = std::fs::read(shared_path("images/shapes_320x200.png")).unwrap();
    let cut = dir.join("truncated.png");
    std::fs::write(&cut, &png[..png.len() / 2]).unwrap();
    let junk = dir.join("junk.jpg");
    std::fs::write(&junk, b"not an image at all").unwrap();
    let cfg = ImageConfig::default();
    for p in [&cut, &junk] {
        let e = load_and_process(p, &cfg).unwrap_err();
        assert!(matches!(e, DataError::Image { .. }), "{e:?}");
        assert!(e.to_string().contains(p.to_str().unwrap()), "{e}");
        assert!(
            e.skippable_at_load(),
            "a bad file costs its sample, not the run"
        );
    }
    let missing = dir.join("missing.png");
    let e = load_and_process(&missing, &cfg).unwrap_err();
    assert!(e.to_string().contains("missing.png"), "{e}");
    assert!(
        matches!(e, DataError::Io { .. }) && !e.skippable_at_load(),
        "{e:?}"
    );
    // The header alone: the cut file's is whole; junk and a missing file fail, named.
    assert_eq!(header_size(&cut).unwrap(), (320, 200));
    let e = header_size(&junk).unwrap_err();
    assert!(matches!(e, DataError::Image { .. }), "{e:?}");
    assert!(e.to_string().contains("junk.jpg"), "{e}");
    let e = header_size(&missing).unwrap_err();
    assert!(matches!(e, DataError::Io { .. }), "{e:?}");
    assert!(e.to_string().contains("missing.png"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The PNG CRC-32 (ISO 3309), to write a well-formed header for a hostile size.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// A PNG whose (valid, CRC-checked) header declares 100000 x 100000 pixels: 40 GB of RGBA if
/// believed. Both the header check and the decoder refuse it, naming the file, at once.
#[test]
fn an_image_declaring_a_huge_size_is_refused_before_decoding() {
    let dir = std::env::temp_dir().join(format!("cannon-data-bomb-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut png = std::fs::read(shared_path("images/shapes_320x200.png")).unwrap();
    // Signature (8), IHDR length (4), "IHDR" (4), width, height (4 + 4), 5 more bytes, CRC.
    assert_eq!(&png[12..16], b"IHDR");
    png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    let bomb = dir.join("bomb.png");
    std::fs::write(&bomb, &png).unwrap();
    for e in [
        header_size(&bomb).unwrap_err(),
        load_rgb(&bomb).unwrap_err(),
    ] {
        assert!(matches!(e, DataError::Image { .. }), "{e:?}");
        assert!(e.to_string().contains("bomb.png"), "{e}");
    }
    // The same bytes with the true size pass: the size alone made the error.
    png[16..20].copy_from_slice(&320u32.to_be_bytes());
    png[20..24].copy_from_slice(&200u32.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(&bomb, &png).unwrap();
    assert_eq!(header_size(&bomb).unwrap(), (320, 200));
    assert_eq!(load_rgb(&bomb).unwrap().dimensions(), (320, 200));
    std::fs::remove_dir_all(&dir).ok();
}

/// LLaMA-Factory's pixel limits: 640x427 with max 262144 -> sqrt factor, sides truncated
/// (mistral3-facts.md §2.3: 626x418), then the processor rounds to 644x420 (multiples of 28).
#[test]
fn pixel_limits_shrink_and_grow_like_llama_factory() {
    let cfg = ImageConfig {
        max_pixels: Some(262_144),
        min_pixels: Some(1024),
        ..ImageConfig::default()
    };
    let big = image::RgbImage::from_fn(640, 427, |x, y| image::Rgb([x as u8, y as u8, 0]));
    let r = regularize(big, &cfg);
    assert_eq!((r.width(), r.height()), (626, 418));
    // Nearest sampling copies input pixels: output x=0 samples floor(0.5 * 640/626) = 0,
    // the last column samples floor(625.5 * 640/626) = 639.
    assert_eq!(r.get_pixel(0, 0).0, [0, 0, 0]);
    assert_eq!(r.get_pixel(625, 0).0, [(639 % 256) as u8, 0, 0]);
    assert_eq!(cfg.output_size(r.height(), r.width()), (420, 644));
    let tiny = image::RgbImage::new(20, 10);
    let r = regularize(tiny, &cfg);
    // sqrt(1024 / 200) = 2.2627: 45 x 22 (truncated).
    assert_eq!((r.width(), r.height()), (45, 22));
    let same = image::RgbImage::new(100, 100);
    assert_eq!(regularize(same.clone(), &cfg), same);
}
