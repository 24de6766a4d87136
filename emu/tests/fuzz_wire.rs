//! Replays, on stable, the emulator wire's fuzz seeds and fixed findings
//! (`fuzz/corpus-seed/emu_frames/`, `fuzz/regressions/emu_frames/`) through
//! `hccl::parse_wire`, as the fuzz target does; and checks that a length a peer declares is
//! refused before it is allocated.

use std::path::Path;

fn inputs(kind: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz")
        .join(kind)
        .join("emu_frames");
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .into_iter()
        .map(|f| std::fs::read(f).unwrap())
        .collect()
}

#[test]
fn seeds_and_findings_replay() {
    let seeds = inputs("corpus-seed");
    assert!(!seeds.is_empty(), "the seed corpus is missing");
    // The whole seed: a HELLO, a rank table and two frames, every one read.
    assert!(seeds
        .iter()
        .any(|s| cannon_cann_emu::hccl::parse_wire(s) == 2));
    for input in seeds.iter().chain(&inputs("regressions")) {
        cannon_cann_emu::hccl::parse_wire(input);
    }
}

/// A rank table declaring 4 GiB (it was allocated whole) and a frame declaring 2^63 payload
/// bytes are refused at once; the harness returns without reading further.
#[test]
fn declared_lengths_are_not_allocated() {
    let seed = &inputs("corpus-seed")
        .into_iter()
        .find(|s| cannon_cann_emu::hccl::parse_wire(s) == 2)
        .unwrap();
    // HELLO: 23 bytes and its address; then the table's length.
    let hello = 23 + seed[22] as usize;
    let mut big_table = seed[..hello].to_vec();
    big_table.extend_from_slice(&u32::MAX.to_le_bytes());
    big_table.extend_from_slice(b"0 ");
    assert_eq!(cannon_cann_emu::hccl::parse_wire(&big_table), 0);
    let table = hello + 4 + u32::from_le_bytes(seed[hello..hello + 4].try_into().unwrap()) as usize;
    let mut big_frame = seed[..table + 56].to_vec();
    big_frame[table + 40..table + 48].copy_from_slice(&(1u64 << 63).to_le_bytes());
    assert_eq!(cannon_cann_emu::hccl::parse_wire(&big_frame), 0);
}
