//! The byte-pair merge of one piece: tiktoken's `byte_pair_encode` (merge the adjacent pair of
//! lowest rank, the leftmost of equal ranks, until no pair is a token), in O(n log n).
//!
//! tiktoken rescans every part after each merge, which is quadratic: a 160 000-letter run (one
//! piece) took seconds. Here the parts are a linked list over the piece's bytes and the
//! candidate merges a min-heap of (rank, start byte). A merge changes the pair of only the
//! merged part and its left neighbour; their new pairs are pushed, and the entries they
//! replace are left in the heap and skipped when popped (stale: the part is gone, or its pair's
//! rank is no longer the entry's).
//!
//! Why the order is tiktoken's: every live pair has an entry, so the heap's minimum is the
//! lowest rank and, among equal ranks, the smallest start byte, which is the leftmost part.
//! Why the stale test is exact: a part's pair only ever grows to the right (its end moves to a
//! later part boundary), so a pair of the same rank at the same start (same token, same
//! bytes) is the same pair, and a part never gets back a rank it had.

use super::Tekken;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A pair that is no token.
const NONE: u32 = u32::MAX;

/// The merge's working space, reused from piece to piece of one text.
#[derive(Default)]
pub(super) struct Scratch {
    /// `next[p]`: the start of the part after the part starting at byte `p` (the piece's
    /// length after the last part).
    next: Vec<usize>,
    /// `prev[p]`: the start of the part before the one at `p` (unused for the first part).
    prev: Vec<usize>,
    /// `rank[p]`: the rank of the part at `p` merged with the next part ([`NONE`]: no token,
    /// or no next part); `dead[p]` once that part was merged into the one before it.
    rank: Vec<u32>,
    dead: Vec<bool>,
    /// `token[p]`: the rank of the part at `p` itself (a part is always a token).
    token: Vec<u32>,
    heap: BinaryHeap<Reverse<(u32, usize)>>,
}

impl Tekken {
    /// The rank of `bytes`, [`NONE`] when they are no token.
    #[inline]
    fn rank(&self, bytes: &[u8]) -> u32 {
        self.ranks.get(bytes).copied().unwrap_or(NONE)
    }

    /// Appends the ids of one piece to `out`.
    pub(super) fn bpe(&self, piece: &[u8], s: &mut Scratch, out: &mut Vec<u32>) {
        let ns = self.num_special;
        let n = piece.len();
        if n == 0 {
            return;
        }
        if let Some(&r) = self.ranks.get(piece) {
            out.push(r + ns);
            return;
        }
        s.next.clear();
        s.next.extend(1..=n);
        s.prev.clear();
        s.prev.extend((0..n).map(|i| i.wrapping_sub(1)));
        s.dead.clear();
        s.dead.resize(n, false);
        s.rank.clear();
        s.heap.clear();
        // Byte `b` is rank `b` (checked at load).
        s.token.clear();
        s.token.extend(piece.iter().map(|&b| b as u32));
        for i in 0..n - 1 {
            let r = self.rank(&piece[i..i + 2]);
            s.rank.push(r);
            if r != NONE {
                s.heap.push(Reverse((r, i)));
            }
        }
        s.rank.push(NONE);
        while let Some(Reverse((r, a))) = s.heap.pop() {
            if s.dead[a] || s.rank[a] != r {
                continue;
            }
            // Merge the part at `a` with the next one, `b`.
            let b = s.next[a];
            let c = s.next[b];
            s.dead[b] = true;
            s.next[a] = c;
            s.token[a] = r;
            if c < n {
                s.prev[c] = a;
                s.rank[a] = self.rank(&piece[a..s.next[c]]);
            } else {
                s.rank[a] = NONE;
            }
            if s.rank[a] != NONE {
                s.heap.push(Reverse((s.rank[a], a)));
            }
            // The part before `a` now pairs with the merged part.
            if a > 0 {
                let p = s.prev[a];
                s.rank[p] = self.rank(&piece[p..c]);
                if s.rank[p] != NONE {
                    s.heap.push(Reverse((s.rank[p], p)));
                }
            }
        }
        let mut a = 0;
        while a < n {
            out.push(s.token[a] + ns);
            a = s.next[a];
        }
    }
}
