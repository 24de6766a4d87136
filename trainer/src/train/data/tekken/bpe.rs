//! The byte-pair merge of one piece.

use super::Tekken;

impl Tekken {
    /// tiktoken's `byte_pair_encode` for one piece; `parts` is scratch space reused across calls.
    pub(super) fn bpe(&self, piece: &[u8], parts: &mut Vec<(usize, u32)>, out: &mut Vec<u32>) {
        let ns = self.num_special;
        if piece.is_empty() {
            return;
        }
        if let Some(&r) = self.ranks.get(piece) {
            out.push(r + ns);
            return;
        }
        let rank_of =
            |a: usize, b: usize| self.ranks.get(&piece[a..b]).copied().unwrap_or(u32::MAX);
        // parts[i] = (start byte of part i, rank of merging part i with part i+1)
        parts.clear();
        let mut min = (u32::MAX, usize::MAX);
        for i in 0..piece.len() - 1 {
            let r = rank_of(i, i + 2);
            if r < min.0 {
                min = (r, i);
            }
            parts.push((i, r));
        }
        parts.push((piece.len() - 1, u32::MAX));
        parts.push((piece.len(), u32::MAX));
        let get = |parts: &[(usize, u32)], i: usize| {
            if i + 3 < parts.len() {
                rank_of(parts[i].0, parts[i + 3].0)
            } else {
                u32::MAX
            }
        };
        while min.0 != u32::MAX {
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = get(parts, i - 1);
            }
            parts[i].1 = get(parts, i);
            parts.remove(i + 1);
            min = (u32::MAX, usize::MAX);
            for (j, &(_, r)) in parts[..parts.len() - 1].iter().enumerate() {
                if r < min.0 {
                    min = (r, j);
                }
            }
        }
        for w in parts.windows(2) {
            // Single bytes are always ranks (checked at load), so every part has a rank.
            out.push(rank_of(w[0].0, w[1].0) + ns);
        }
    }
}
