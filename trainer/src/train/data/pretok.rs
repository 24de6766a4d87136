//! The tekken pre-tokenizer (the split of text into pieces before byte-level BPE), hand-written.
//!
//! fancy-regex runs the tekken pattern on its backtracking VM (the `\s+(?!\S)` look-ahead forces
//! it), which is the bottleneck of encoding. [`Pretokenizer`] walks the text once and evaluates
//! each alternative of [`TEKKEN_PATTERN`] with exactly the backtracking order of a leftmost-first
//! regex engine. The character classes come from regex-syntax, the parser fancy-regex uses, so
//! both see the same Unicode tables. `tests/data_tekken.rs` checks piece-for-piece equality with
//! fancy-regex on random Unicode text.
//!
//! The pattern, alternative by alternative (U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
//! W = [\p{Ll}\p{Lm}\p{Lo}\p{M}], P = [^\r\n\p{L}\p{N}], Q = [^\s\p{L}\p{N}]):
//!   A: P? U* W+   B: P? U+ W*   C: \p{N}   D: ` `? Q+ [\r\n/]*
//!   E: \s* [\r\n]+   F: \s+ (?!\S)   G: \s+

use regex_syntax::hir::{Class, HirKind};

/// The split pattern of every tekken.json published so far.
pub const TEKKEN_PATTERN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

// One bit per class a character can belong to.
const L: u8 = 1; // \p{L}
const N: u8 = 2; // \p{N}
const U: u8 = 4; // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
const W: u8 = 8; // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
const S: u8 = 16; // \s
const CRLF: u8 = 32; // \r or \n
const SPACE: u8 = 64; // ' '
const SLASH: u8 = 128; // '/'

/// Classifies characters for the tekken pattern and splits text into pieces.
#[derive(Debug, Clone)]
pub struct Pretokenizer {
    ascii: [u8; 128],
    /// Disjoint, sorted (first, last, flags) intervals for non-ASCII characters.
    intervals: Vec<(u32, u32, u8)>,
}

fn class_ranges(expr: &str) -> Result<Vec<(u32, u32)>, String> {
    let hir = regex_syntax::Parser::new()
        .parse(expr)
        .map_err(|e| e.to_string())?;
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => Ok(c
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect()),
        other => Err(format!("{expr} is not a Unicode class: {other:?}")),
    }
}

impl Pretokenizer {
    /// Builds the class tables (about a millisecond).
    pub fn new() -> Result<Self, String> {
        let classes = [
            (L, class_ranges(r"\p{L}")?),
            (N, class_ranges(r"\p{N}")?),
            (U, class_ranges(r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]")?),
            (W, class_ranges(r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]")?),
            (S, class_ranges(r"\s")?),
            (
                CRLF,
                vec![(b'\n' as u32, b'\n' as u32), (b'\r' as u32, b'\r' as u32)],
            ),
            (SPACE, vec![(b' ' as u32, b' ' as u32)]),
            (SLASH, vec![(b'/' as u32, b'/' as u32)]),
        ];
        // Every range boundary starts a new interval; flags are constant inside one.
        let mut cuts: Vec<u32> = vec![0, 0x11_0000];
        for (_, ranges) in &classes {
            for &(a, b) in ranges {
                cuts.push(a);
                cuts.push(b + 1);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let flags_of = |c: u32| {
            let mut f = 0u8;
            for (bit, ranges) in &classes {
                let i = ranges.partition_point(|&(_, b)| b < c);
                if i < ranges.len() && ranges[i].0 <= c {
                    f |= bit;
                }
            }
            f
        };
        let mut intervals: Vec<(u32, u32, u8)> = Vec::new();
        for w in cuts.windows(2) {
            let f = flags_of(w[0]);
            match intervals.last_mut() {
                Some(last) if last.2 == f && last.1 + 1 == w[0] => last.1 = w[1] - 1,
                _ => intervals.push((w[0], w[1] - 1, f)),
            }
        }
        let mut ascii = [0u8; 128];
        for (c, slot) in ascii.iter_mut().enumerate() {
            *slot = flags_of(c as u32);
        }
        Ok(Pretokenizer { ascii, intervals })
    }

    #[inline]
    fn flags(&self, c: char) -> u8 {
        let c = c as u32;
        if c < 128 {
            return self.ascii[c as usize];
        }
        let i = self.intervals.partition_point(|&(_, b, _)| b < c);
        self.intervals.get(i).map_or(0, |iv| iv.2)
    }

    /// Calls `f` with each piece of `text`, in order, as fancy-regex's `find_iter` would yield.
    pub fn for_each_piece<'t>(&self, text: &'t str, mut f: impl FnMut(&'t str)) {
        // [n+1] byte offsets (the last is text.len()) and [n] class flags of the characters.
        // usize, not u32: a text past 4 GiB would otherwise cut its pieces at wrapped offsets.
        let mut offs: Vec<usize> = Vec::with_capacity(text.len() + 1);
        let mut cls: Vec<u8> = Vec::with_capacity(text.len());
        for (o, c) in text.char_indices() {
            offs.push(o);
            cls.push(self.flags(c));
        }
        offs.push(text.len());
        let n = cls.len();
        let mut i = 0;
        while i < n {
            match next_end(&cls, i) {
                Some(e) => {
                    f(&text[offs[i]..offs[e]]);
                    i = e;
                }
                // No alternative matches here: a regex search skips the character.
                None => i += 1,
            }
        }
    }

    /// The pieces of `text` (allocates; [`Self::for_each_piece`] does not).
    pub fn pieces<'t>(&self, text: &'t str) -> Vec<&'t str> {
        let mut v = Vec::new();
        self.for_each_piece(text, |p| v.push(p));
        v
    }
}

/// Index one past the last character of the run of `bit` characters starting at `i`.
#[inline]
fn run_end(cls: &[u8], mut i: usize, bit: u8) -> usize {
    while i < cls.len() && cls[i] & bit != 0 {
        i += 1;
    }
    i
}

#[inline]
fn is_p(f: u8) -> bool {
    f & (CRLF | L | N) == 0
}

#[inline]
fn is_q(f: u8) -> bool {
    f & (S | L | N) == 0
}

/// End (exclusive, in characters) of the match starting at `i`, trying the alternatives in order.
fn next_end(cls: &[u8], i: usize) -> Option<usize> {
    let n = cls.len();
    let f0 = cls[i];
    // The optional one-character prefix of A and B is tried taken first, then not.
    let prefixes: &[usize] = if is_p(f0) { &[1, 0] } else { &[0] };
    // A: P? U* W+ — U* gives back characters until W+ can start.
    for &pre in prefixes {
        let s = i + pre;
        let k = run_end(cls, s, U) - s;
        for m in (0..=k).rev() {
            let p = s + m;
            if p < n && cls[p] & W != 0 {
                return Some(run_end(cls, p, W));
            }
        }
    }
    // B: P? U+ W*
    for &pre in prefixes {
        let s = i + pre;
        let e = run_end(cls, s, U);
        if e > s {
            return Some(run_end(cls, e, W));
        }
    }
    // C: \p{N}
    if f0 & N != 0 {
        return Some(i + 1);
    }
    // D: ` `? Q+ [\r\n/]*
    let spaces: &[usize] = if f0 & SPACE != 0 { &[1, 0] } else { &[0] };
    for &pre in spaces {
        let s = i + pre;
        let mut e = s;
        while e < n && is_q(cls[e]) {
            e += 1;
        }
        if e > s {
            return Some(run_end(cls, e, CRLF | SLASH));
        }
    }
    let ws = run_end(cls, i, S) - i;
    // E: \s* [\r\n]+ — \s* gives back until a line break can start.
    for m in (0..=ws).rev() {
        let p = i + m;
        if p < n && cls[p] & CRLF != 0 {
            return Some(run_end(cls, p, CRLF));
        }
    }
    // F: \s+ (?!\S) — end where no non-space follows.
    for m in (1..=ws).rev() {
        let p = i + m;
        if p == n || cls[p] & S != 0 {
            return Some(p);
        }
    }
    // G: \s+
    (ws > 0).then_some(i + ws)
}
