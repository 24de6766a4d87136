//! Truncation to `max_len` (LLaMA-Factory's `infer_seqlen` per turn), the labels of the turns
//! (LLaMA-Factory's `train_on_prompt` and `mask_history`), and the check that drops samples
//! whose image token blocks were cut.

use super::image::ImageTokens;
use super::template::Turn;
use cannon_kernels::cross_entropy::IGNORE_INDEX;

/// LLaMA-Factory `infer_seqlen`: how much of a (source, target) pair fits in `cutoff`.
/// A short target is kept whole; else a short source is; else both shrink proportionally.
pub fn infer_seqlen(source: usize, target: usize, cutoff: usize) -> (usize, usize) {
    let max_target = if target * 2 < cutoff {
        cutoff
    } else if source * 2 < cutoff {
        cutoff - source
    } else {
        // Python: int(cutoff_len * (target_len / (source_len + target_len)))
        (cutoff as f64 * (target as f64 / (source + target) as f64)) as usize
    };
    let new_target = max_target.min(target);
    let new_source = cutoff.saturating_sub(new_target).min(source);
    (new_source, new_target)
}

/// Which tokens are trained, as LLaMA-Factory's data arguments of the same names define them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct LabelPolicy {
    /// Train the prompts too (every source token is its own label, image tokens included).
    pub train_on_prompt: bool,
    /// Train the last answer only; truncation then spends the budget from the last turn back,
    /// so that what is cut is the history.
    pub mask_history: bool,
}

/// Input ids and labels of a sample, plus whether truncation changed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembled {
    pub input_ids: Vec<u32>,
    pub labels: Vec<i32>,
    pub truncated: bool,
}

/// Concatenates the turns (source labels IGNORE_INDEX, target labels = ids, unless `policy`
/// says otherwise). A sample that fits in `max_len` is never modified; a longer one is cut turn
/// by turn as LLaMA-Factory does (each part keeps its head; first turn first, or last turn
/// first under `mask_history`), which can cut an image block: see [`validate_input_ids`].
pub fn assemble(turns: &[Turn], max_len: usize, policy: LabelPolicy) -> Assembled {
    let total: usize = turns.iter().map(|t| t.source.len() + t.target.len()).sum();
    let fits = total <= max_len;
    let n = turns.len();
    // How much of each turn is kept, the budget spent in LLaMA-Factory's order.
    let mut kept = vec![(0, 0); n];
    let mut used = 0;
    let order: Box<dyn Iterator<Item = usize>> = if policy.mask_history {
        Box::new((0..n).rev())
    } else {
        Box::new(0..n)
    };
    for i in order {
        let t = &turns[i];
        kept[i] = if fits {
            (t.source.len(), t.target.len())
        } else {
            if used >= max_len {
                break;
            }
            infer_seqlen(t.source.len(), t.target.len(), max_len - used)
        };
        used += kept[i].0 + kept[i].1;
    }
    let mut input_ids = Vec::with_capacity(used);
    let mut labels = Vec::with_capacity(used);
    for (i, (t, &(s, g))) in turns.iter().zip(&kept).enumerate() {
        input_ids.extend_from_slice(&t.source[..s]);
        if policy.train_on_prompt {
            labels.extend(t.source[..s].iter().map(|&x| x as i32));
        } else {
            labels.extend(std::iter::repeat_n(IGNORE_INDEX, s));
        }
        input_ids.extend_from_slice(&t.target[..g]);
        if policy.mask_history && i + 1 != n {
            labels.extend(std::iter::repeat_n(IGNORE_INDEX, g));
        } else {
            labels.extend(t.target[..g].iter().map(|&x| x as i32));
        }
    }
    Assembled {
        input_ids,
        labels,
        truncated: !fits,
    }
}

/// True when the ids hold every image's block whole: the `[IMG]` count equals the sum of
/// rows x cols over the images (`grids`, from their sizes, patch and merge size) and there is
/// one `[IMG_END]` per image.
pub fn validate_input_ids(input_ids: &[u32], grids: &[(u32, u32)], t: ImageTokens) -> bool {
    let want_img: usize = grids.iter().map(|&(r, c)| (r * c) as usize).sum();
    let want_break: usize = grids
        .iter()
        .map(|&(r, _)| r.saturating_sub(1) as usize)
        .sum();
    let (mut img, mut brk, mut end) = (0usize, 0usize, 0usize);
    for &id in input_ids {
        if id == t.img {
            img += 1;
        } else if id == t.img_break {
            brk += 1;
        } else if id == t.img_end {
            end += 1;
        }
    }
    img == want_img && end == grids.len() && brk == want_break
}
