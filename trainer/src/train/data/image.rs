//! The Pixtral image processor (HF `PixtralImageProcessor`, as MindSpeed-MM / LLaMA-Factory call
//! it) and the image token block of an image.
//!
//! decode -> RGB (transparency composited over white, gray replicated) -> resize so the longest
//! edge <= longest_edge (aspect kept; Python's `round`, as mistral-common), each side rounded UP
//! to a multiple of `patch_size x merge_size` (28 px for Mistral3: what `PixtralProcessor` hands
//! its image processor, and what mistral-common's image encoder does) -> bicubic -> x/255 ->
//! (x - mean)/std -> channels first. So any image of at least one pixel makes at least one
//! `[IMG]` token.
//!
//! The resize is PIL's `Image.resize(BICUBIC)` reproduced in integer arithmetic: separable
//! convolution (horizontal pass then vertical), cubic kernel a = -0.5 widened by the scale when
//! shrinking (antialias), 22-bit fixed-point weights, rounding to u8 after each pass.
//! torchvision's antialiased bicubic on uint8 (transformers' default backend) is a port of the
//! same algorithm, so both references agree with this to within a grey level.

use super::error::{DataError, Result};
use serde::Deserialize;
use std::path::Path;

/// CLIP normalisation, as in the Mistral3 preprocessor config (digits kept as published).
#[allow(clippy::excessive_precision)]
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
#[allow(clippy::excessive_precision)]
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];

/// Settings of the image processor and of the image token block.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ImageConfig {
    /// Longest edge after resizing (HF `size.longest_edge`; 1540 for Mistral3).
    pub longest_edge: u32,
    /// Vision patch size (14 for Mistral3).
    pub patch_size: u32,
    /// Patch merger factor (2): one `[IMG]` token per merge x merge patches.
    pub merge_size: u32,
    /// Round sides up to patch_size x merge_size (`PixtralProcessor.__call__`, mistral-common;
    /// the default) instead of patch_size (the image processor called on its own, whose
    /// multiple-of-14 images lose their odd patch row and column in the merger).
    pub round_to_merged_patch: bool,
    /// LLaMA-Factory `image_max_pixels` (MindSpeed-MM's Magistral recipe: 262144): larger
    /// images are first shrunk to about this many pixels with nearest-neighbour sampling.
    pub max_pixels: Option<u64>,
    /// LLaMA-Factory `image_min_pixels`: smaller images are first enlarged likewise.
    pub min_pixels: Option<u64>,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Default for ImageConfig {
    fn default() -> Self {
        ImageConfig {
            longest_edge: 1540,
            patch_size: 14,
            merge_size: 2,
            round_to_merged_patch: true,
            max_pixels: None,
            min_pixels: None,
            mean: CLIP_MEAN,
            std: CLIP_STD,
        }
    }
}

impl ImageConfig {
    /// Side length the resized sides are multiples of.
    pub fn rounding(&self) -> u32 {
        if self.round_to_merged_patch {
            self.patch_size * self.merge_size
        } else {
            self.patch_size
        }
    }

    /// (height, width) after resizing an image of `h` x `w` (mistral-common
    /// `ImageEncoder._image_to_num_tokens`, which transformers' `get_resize_output_image_size`
    /// follows but for flooring the scaled sides where mistral-common rounds: the two differ
    /// only when a side scaled down to the longest edge lands within half a pixel above a
    /// multiple of the rounding; the token stream follows mistral-common).
    pub fn output_size(&self, h: u32, w: u32) -> (u32, u32) {
        let (mut h, mut w) = (h.max(1), w.max(1));
        let le = self.longest_edge as f64;
        let ratio = (h as f64 / le).max(w as f64 / le);
        if ratio > 1.0 {
            // Python's round(): halves to even.
            h = ((h as f64 / ratio).round_ties_even() as u32).max(1);
            w = ((w as f64 / ratio).round_ties_even() as u32).max(1);
        }
        let p = self.rounding().max(1);
        (h.div_ceil(p) * p, w.div_ceil(p) * p)
    }

    /// (rows, cols) of `[IMG]` tokens of a resized image: one per merged patch, floor.
    pub fn token_grid(&self, h: u32, w: u32) -> (u32, u32) {
        let m = (self.patch_size * self.merge_size).max(1);
        (h / m, w / m)
    }
}

/// A processed image: `pixels` is [3, height, width] f32, channels first.
#[derive(Debug, Clone, PartialEq)]
pub struct PixtralImage {
    pub height: u32,
    pub width: u32,
    pub pixels: Vec<f32>,
}

/// Decodes a PNG/JPEG file to 8-bit RGB (transparency composited over white). A truncated or
/// corrupt file is an error naming it.
pub fn load_rgb(path: &Path) -> Result<image::RgbImage> {
    let err = |source| DataError::Image {
        path: path.to_path_buf(),
        source,
    };
    let img = open_reader(path)?.decode().map_err(err)?;
    Ok(if let Some(rgba) = img.as_rgba8() {
        over_white(rgba)
    } else if img.color().has_alpha() {
        over_white(&img.to_rgba8())
    } else {
        img.to_rgb8()
    })
}

/// An RGBA image composited over opaque white, as transformers' `convert_to_rgb` does
/// (`Image.alpha_composite` onto a white RGBA background, then RGB) and mistral-common too:
/// dropping the alpha channel instead would show whatever colour the transparent pixels
/// happen to store. The arithmetic is PIL's (7-bit coefficients, division by 255 by shifts),
/// which for an opaque white background reduces to the expression below.
fn over_white(rgba: &image::RgbaImage) -> image::RgbImage {
    const BITS: u32 = 7;
    image::RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let c1 = u32::from(a) << BITS;
        let c2 = (255 << BITS) - c1;
        let mix = |v: u8| {
            let t = u32::from(v) * c1 + 255 * c2 + (0x80 << BITS);
            ((((t >> 8) + t) >> 8) >> BITS) as u8
        };
        image::Rgb([mix(r), mix(g), mix(b)])
    })
}

/// LLaMA-Factory `_preprocess_image`: scales by sqrt(limit / (w*h)) (sides truncated) with PIL
/// NEAREST when the pixel count is above `max_pixels` or below `min_pixels`.
pub fn regularize(img: image::RgbImage, cfg: &ImageConfig) -> image::RgbImage {
    let mut img = img;
    for (w, h) in regularize_steps(img.width(), img.height(), cfg)
        .into_iter()
        .flatten()
    {
        img = resize_nearest(&img, w, h);
    }
    img
}

/// The (width, height) of each resize [`regularize`] makes of a `w` x `h` image, in order
/// (None: that limit leaves it alone), from the sizes alone: what the header-only read and
/// the decoding agree on.
fn regularize_steps(w: u32, h: u32, cfg: &ImageConfig) -> [Option<(u32, u32)>; 2] {
    let (mut w, mut h) = (w, h);
    let mut steps = [None; 2];
    for (step, (limit, too_far)) in steps.iter_mut().zip([
        (cfg.max_pixels, (|n, l| n > l) as fn(u64, u64) -> bool),
        (cfg.min_pixels, |n, l| n < l),
    ]) {
        let Some(limit) = limit else { continue };
        let n = w as u64 * h as u64;
        if n == 0 || !too_far(n, limit) {
            continue;
        }
        let f = (limit as f64 / n as f64).sqrt();
        (w, h) = (
            ((w as f64 * f) as u32).max(1),
            ((h as f64 * f) as u32).max(1),
        );
        *step = Some((w, h));
    }
    steps
}

/// (height, width) of the processed image of a `width` x `height` file: [`regularize`], then
/// [`ImageConfig::output_size`]. What a sample's image size and token block follow from.
pub fn processed_size(width: u32, height: u32, cfg: &ImageConfig) -> (u32, u32) {
    let (w, h) = regularize_steps(width, height, cfg)
        .into_iter()
        .flatten()
        .last()
        .unwrap_or((width, height));
    cfg.output_size(h, w)
}

/// (width, height) of an image file from its header, without decoding the pixels (the bytes
/// read are the header's). A file that cannot be opened is [`DataError::Io`]; one that is
/// not an image of a known format, or whose header is cut or corrupt, is [`DataError::Image`].
/// A file cut after its header passes: decoding it ([`load_rgb`]) finds that.
pub fn header_size(path: &Path) -> Result<(u32, u32)> {
    let err = |source| DataError::Image {
        path: path.to_path_buf(),
        source,
    };
    let (w, h) = open_reader(path)?.into_dimensions().map_err(err)?;
    // The dimensions come from the file: the decoder checks them too, but a dataset is
    // checked by headers only, so a bomb is named here, before any sample is built from it.
    image_limits().check_dimensions(w, h).map_err(err)?;
    Ok((w, h))
}

/// The largest image side decoded (32768 px: past any camera; Pixtral resizes to 1540 px) and
/// the most the decoder may allocate (512 MiB, 8192 x 8192 RGBA once with headroom): a file
/// declaring 10^5 x 10^5 pixels is an error naming it, not an allocation abort.
pub const MAX_IMAGE_SIDE: u32 = 1 << 15;
fn image_limits() -> image::Limits {
    let mut l = image::Limits::no_limits();
    l.max_image_width = Some(MAX_IMAGE_SIDE);
    l.max_image_height = Some(MAX_IMAGE_SIDE);
    l.max_alloc = Some(512 << 20);
    l
}

fn open_reader(path: &Path) -> Result<image::ImageReader<std::io::BufReader<std::fs::File>>> {
    let mut reader = image::ImageReader::open(path)
        .map_err(|e| DataError::io(path, e))?
        .with_guessed_format()
        .map_err(|e| DataError::io(path, e))?;
    reader.limits(image_limits());
    Ok(reader)
}

/// PIL `resize(NEAREST)`: output pixel x samples input floor((x + 0.5) * in / out).
pub fn resize_nearest(img: &image::RgbImage, ow: u32, oh: u32) -> image::RgbImage {
    let (w, h) = (img.width(), img.height());
    let (sx, sy) = (w as f64 / ow as f64, h as f64 / oh as f64);
    image::RgbImage::from_fn(ow, oh, |x, y| {
        let ix = (((x as f64 + 0.5) * sx) as u32).min(w - 1);
        let iy = (((y as f64 + 0.5) * sy) as u32).min(h - 1);
        *img.get_pixel(ix, iy)
    })
}

/// Decodes an image file and applies [`regularize`]: the image the processor resizes.
pub fn load_regularized(path: &Path, cfg: &ImageConfig) -> Result<image::RgbImage> {
    Ok(regularize(load_rgb(path)?, cfg))
}

/// Runs the processor on a decoded image (after [`regularize`], if limits are set).
pub fn process(img: &image::RgbImage, cfg: &ImageConfig) -> PixtralImage {
    let (h, w) = cfg.output_size(img.height(), img.width());
    let resized = resize_bicubic(img.as_raw(), img.width(), img.height(), w, h);
    let plane = (h * w) as usize;
    let mut pixels = vec![0f32; 3 * plane];
    for c in 0..3 {
        // Same order of operations as the reference: rescale, then normalise.
        let (mean, std) = (cfg.mean[c], cfg.std[c]);
        for (i, px) in pixels[c * plane..(c + 1) * plane].iter_mut().enumerate() {
            let v = resized[3 * i + c] as f32 * (1.0 / 255.0);
            *px = (v - mean) / std;
        }
    }
    PixtralImage {
        height: h,
        width: w,
        pixels,
    }
}

/// Loads and processes an image file.
pub fn load_and_process(path: &Path, cfg: &ImageConfig) -> Result<PixtralImage> {
    Ok(process(&load_regularized(path, cfg)?, cfg))
}

const PRECISION_BITS: u32 = 32 - 8 - 2;

fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// PIL `precompute_coeffs`: for each output index, the first input index and fixed-point weights.
fn coeffs(in_size: u32, out_size: u32) -> (Vec<usize>, Vec<Vec<i32>>) {
    let scale = in_size as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = 2.0 * filterscale;
    let mut starts = Vec::with_capacity(out_size as usize);
    let mut weights = Vec::with_capacity(out_size as usize);
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let mut k: Vec<f64> = (xmin..xmax.max(xmin))
            .map(|x| bicubic((x as f64 - center + 0.5) / filterscale))
            .collect();
        let ww: f64 = k.iter().sum();
        if ww != 0.0 {
            k.iter_mut().for_each(|v| *v /= ww);
        }
        let one = (1u32 << PRECISION_BITS) as f64;
        // PIL rounds half away from zero when converting weights to fixed point.
        let ki = k
            .iter()
            .map(|&v| {
                if v < 0.0 {
                    (-0.5 + v * one) as i32
                } else {
                    (0.5 + v * one) as i32
                }
            })
            .collect();
        starts.push(xmin);
        weights.push(ki);
    }
    (starts, weights)
}

#[inline]
fn clip8(acc: i64) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resizes packed RGB8 `src` [h, w, 3] to [oh, ow, 3] (PIL bicubic, see the module doc).
pub fn resize_bicubic(src: &[u8], w: u32, h: u32, ow: u32, oh: u32) -> Vec<u8> {
    let half = 1i64 << (PRECISION_BITS - 1);
    // Horizontal pass: [h, w, 3] -> [h, ow, 3] (PIL skips a pass whose size is unchanged).
    let horiz = if ow != w {
        let (starts, weights) = coeffs(w, ow);
        let mut out = vec![0u8; (h * ow * 3) as usize];
        for y in 0..h as usize {
            let row = &src[y * w as usize * 3..(y + 1) * w as usize * 3];
            for x in 0..ow as usize {
                for c in 0..3 {
                    let mut acc = half;
                    for (j, &k) in weights[x].iter().enumerate() {
                        acc += row[(starts[x] + j) * 3 + c] as i64 * k as i64;
                    }
                    out[(y * ow as usize + x) * 3 + c] = clip8(acc);
                }
            }
        }
        out
    } else {
        src.to_vec()
    };
    if oh == h {
        return horiz;
    }
    // Vertical pass: [h, ow, 3] -> [oh, ow, 3].
    let (starts, weights) = coeffs(h, oh);
    let stride = ow as usize * 3;
    let mut out = vec![0u8; oh as usize * stride];
    for y in 0..oh as usize {
        for i in 0..stride {
            let mut acc = half;
            for (j, &k) in weights[y].iter().enumerate() {
                acc += horiz[(starts[y] + j) * stride + i] as i64 * k as i64;
            }
            out[y * stride + i] = clip8(acc);
        }
    }
    out
}

/// Special token ids of the image block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageTokens {
    pub img: u32,
    pub img_break: u32,
    pub img_end: u32,
}

/// The token block of a resized `h` x `w` image: per row `cols` x `[IMG]` then `[IMG_BREAK]`, the
/// last `[IMG_BREAK]` replaced by `[IMG_END]`. Empty when the image is smaller than one token.
pub fn image_block(h: u32, w: u32, cfg: &ImageConfig, t: ImageTokens) -> Vec<u32> {
    let (rows, cols) = cfg.token_grid(h, w);
    if rows == 0 || cols == 0 {
        return Vec::new();
    }
    let mut v = Vec::with_capacity((rows * (cols + 1)) as usize);
    for _ in 0..rows {
        v.extend(std::iter::repeat_n(t.img, cols as usize));
        v.push(t.img_break);
    }
    if let Some(last) = v.last_mut() {
        *last = t.img_end;
    }
    v
}
