//! The content hash the data pipeline keys and checks files with (a tokenizer's bytes, the
//! index cache's payload).

/// A 64-bit hash of `data` for telling contents apart (a changed tokenizer, a damaged cache
/// file); not meant to resist anyone crafting collisions. Eight bytes per multiply, so a
/// 19 MB tokenizer costs a few milliseconds.
pub fn hash64(data: &[u8]) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (data.len() as u64).wrapping_mul(K) ^ 0x243f_6a88_85a3_08d3;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        // (h ^ w) * odd and the rotation are both bijective: a changed word always changes
        // the state at that point.
        h = (h ^ w).wrapping_mul(K).rotate_left(29);
    }
    let mut tail = [0u8; 8];
    tail[..words.remainder().len()].copy_from_slice(words.remainder());
    h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
    // SplitMix64's finaliser: every input bit reaches every output bit.
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}
