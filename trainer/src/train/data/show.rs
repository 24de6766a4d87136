//! A sample as a person reads it (what `cannon data show` and the start of `cannon train`
//! print): the text with its special tokens spelled out, each image's token block as its grid
//! (`[IMG] x 4 x 3` = 4 tokens wide, 3 high), and the trained tokens (labels that are not
//! IGNORE_INDEX) between `«` and `»`. And the JSON form of `--json`, mistral-common's
//! `input_ids` and image sizes plus the labels.

use super::dataset::Prepared;
use super::image::ImageTokens;
use super::{Result, Tekken};
use cannon_kernels::cross_entropy::IGNORE_INDEX;

/// Opens a trained span.
pub const TRAINED_OPEN: &str = "«";
/// Closes a trained span.
pub const TRAINED_CLOSE: &str = "»";

/// The readable text of `input_ids` with `labels` (see the module docs).
pub fn render(tok: &Tekken, t: ImageTokens, input_ids: &[u32], labels: &[i32]) -> Result<String> {
    let trained = |i: usize| labels.get(i).is_some_and(|&l| l != IGNORE_INDEX);
    let is_image = |id: u32| id == t.img || id == t.img_break || id == t.img_end;
    let mut out = String::new();
    let mut in_span = false;
    let mut i = 0;
    while i < input_ids.len() {
        if trained(i) != in_span {
            in_span = !in_span;
            out.push_str(if in_span { TRAINED_OPEN } else { TRAINED_CLOSE });
        }
        let id = input_ids[i];
        // The run of ids up to the next change of kind (image block, other special, text)
        // or of trained-ness, decoded as one: a character may span several text tokens.
        let mut j = i + 1;
        if is_image(id) {
            let (mut cols, mut rows, mut in_row) = (0, 0, 0);
            let mut k = i;
            while k < input_ids.len() && is_image(input_ids[k]) && trained(k) == in_span {
                let x = input_ids[k];
                k += 1;
                if x == t.img {
                    in_row += 1;
                } else {
                    cols = cols.max(in_row);
                    in_row = 0;
                    rows += 1;
                    if x == t.img_end {
                        break;
                    }
                }
            }
            if in_row > 0 {
                // A block cut before its end (only a truncated sample can show one).
                cols = cols.max(in_row);
                rows += 1;
            }
            out.push_str(&format!("[IMG] x {cols} x {rows}"));
            j = k;
        } else if id < tok.num_special_tokens() {
            out.push_str(tok.special_str(id).unwrap_or("<?>"));
        } else {
            while j < input_ids.len()
                && input_ids[j] >= tok.num_special_tokens()
                && trained(j) == in_span
            {
                j += 1;
            }
            let bytes = tok.decode_bytes(&input_ids[i..j], false)?;
            out.push_str(&String::from_utf8_lossy(&bytes));
        }
        i = j;
    }
    if in_span {
        out.push_str(TRAINED_CLOSE);
    }
    Ok(out)
}

/// A one-line summary of a sample: tokens, trained tokens and each image's grid and size.
pub fn summary(p: &Prepared, t: ImageTokens) -> String {
    let trained = p.labels.iter().filter(|&&l| l != IGNORE_INDEX).count();
    let images: Vec<String> = p
        .image_sizes
        .iter()
        .map(|[h, w]| format!("{w}x{h} px"))
        .collect();
    let blocks = p.input_ids.iter().filter(|&&x| x == t.img_end).count();
    let mut s = format!("{} tokens, {trained} trained", p.input_ids.len());
    if !images.is_empty() {
        s.push_str(&format!(
            ", {} image{} ({}), {blocks} image block{}",
            images.len(),
            if images.len() == 1 { "" } else { "s" },
            images.join(", "),
            if blocks == 1 { "" } else { "s" }
        ));
    }
    s
}

/// The `--json` object of a sample: `input_ids`, `labels` and `image_sizes` (each image's
/// resized `[height, width]`, what mistral-common's image grids are).
pub fn to_json(p: &Prepared) -> serde_json::Value {
    serde_json::json!({
        "input_ids": p.input_ids,
        "labels": p.labels,
        "image_sizes": p.image_sizes,
    })
}
