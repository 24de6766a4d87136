//! Times the digests a run's `run_identity.json` takes of its input files (the run's own path,
//! `RunIdentity::new`: the files over the thread pool, each read and hashed in overlapped
//! pieces) beside one plain sequential read of the same files into a buffer, interleaved three
//! times (read first, digest first, read first), and the SHA-256 rate of bytes already in
//! memory. Speed is measured here, never asserted in tests.
//!
//! With `--cold` the page cache is dropped before every timing (`sync`, then 3 to
//! /proc/sys/vm/drop_caches: root only; otherwise it says so and the times are warm).
//!
//! ```sh
//! head -c 3500000000 /dev/urandom > /tmp/w.bin
//! cargo run --release -p cannon-trainer --example digest_rate -- [--cold] /tmp/w.bin [MORE...]
//! ```

use cannon_trainer::train::digest::READ_PIECE;
use cannon_trainer::train::identity::RunIdentity;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut cold = false;
    let mut files = Vec::new();
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--cold" => cold = true,
            _ => files.push(PathBuf::from(a)),
        }
    }
    if files.is_empty() {
        eprintln!("usage: digest_rate [--cold] FILE...");
        std::process::exit(2);
    }
    let bytes: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()))
        .sum::<Result<_, _>>()?;
    let gb = bytes as f64 / 1e9;
    println!(
        "{} file(s), {gb:.3} GB; {} threads; page cache {}",
        files.len(),
        rayon::current_num_threads(),
        if cold {
            "dropped before each timing"
        } else {
            "as it is (warm after the first)"
        }
    );
    println!(
        "sha256 of bytes in memory: {:.2} GB/s (one thread)",
        memory_rate()
    );

    let roles: Vec<(String, PathBuf)> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (format!("weights/{i}"), f.clone()))
        .collect();
    let read = || -> std::io::Result<f64> {
        if cold {
            drop_caches();
        }
        let t = Instant::now();
        let mut buf = vec![0u8; READ_PIECE];
        for f in &files {
            let mut r = std::fs::File::open(f)?;
            while r.read(&mut buf)? > 0 {}
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let digest = || -> Result<f64, Box<dyn std::error::Error>> {
        if cold {
            drop_caches();
        }
        let t = Instant::now();
        std::hint::black_box(RunIdentity::new(&roles)?);
        Ok(t.elapsed().as_secs_f64())
    };
    let mut ratios = Vec::new();
    for round in 1..=3 {
        // The order alternates: a timing that suffers from coming second (a virtual disk whose
        // rate alternates from one cold pass to the next, say) does not always hit the digest.
        let (read_s, digest_s, order) = if round % 2 == 1 {
            let r = read()?;
            (r, digest()?, "read first")
        } else {
            let d = digest()?;
            (read()?, d, "digest first")
        };
        ratios.push(digest_s / read_s);
        println!(
            "round {round} ({order}): read {read_s:.2} s ({:.2} GB/s), digest {digest_s:.2} s \
             ({:.2} GB/s): digest / read = {:.2}",
            gb / read_s,
            gb / digest_s,
            digest_s / read_s
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!("median digest / read = {:.2}", ratios[1]);
    Ok(())
}

/// SHA-256 throughput over 512 MiB already in memory, GB/s.
fn memory_rate() -> f64 {
    let data = vec![0x5au8; 512 << 20];
    let t = Instant::now();
    let d = Sha256::digest(&data);
    std::hint::black_box(d);
    data.len() as f64 / 1e9 / t.elapsed().as_secs_f64()
}

/// Writes back dirty pages and drops the page cache, or says why it could not.
fn drop_caches() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    if let Err(e) = std::fs::write("/proc/sys/vm/drop_caches", "3") {
        eprintln!("could not drop the page cache ({e}): this timing is warm");
    }
}
