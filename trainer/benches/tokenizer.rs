//! Tekken encode throughput on English text (the design docs of this project, ~50 KB), and the
//! pre-tokenizer alone against fancy-regex running the same pattern.
//! Run: `cargo bench -p cannon-trainer --bench tokenizer`.

use cannon_trainer::train::data::pretok::{Pretokenizer, TEKKEN_PATTERN};
use cannon_trainer::train::data::Tekken;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared");

fn english() -> String {
    ["DESIGN.md", "docs/mistral3-facts.md", "docs/anchors.md"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(format!("{SHARED}/{f}")).ok())
        .collect::<Vec<_>>()
        .join("\n")
}

fn bench(c: &mut Criterion) {
    let tok = Tekken::from_file(format!("{SHARED}/tokenizers/tekken_240911.json"), None)
        .expect("tekken_240911.json");
    let text = english();
    let mut g = c.benchmark_group("tekken");
    g.throughput(Throughput::Bytes(text.len() as u64));
    g.bench_function("encode", |b| {
        b.iter(|| black_box(tok.encode(black_box(&text), false, false)))
    });
    let pre = Pretokenizer::new().expect("pretokenizer");
    g.bench_function("split_handwritten", |b| {
        b.iter(|| {
            let mut n = 0usize;
            pre.for_each_piece(black_box(&text), |p| n += p.len());
            n
        })
    });
    let re = fancy_regex::Regex::new(TEKKEN_PATTERN).expect("pattern");
    g.bench_function("split_fancy_regex", |b| {
        b.iter(|| {
            re.find_iter(black_box(&text))
                .filter_map(|m| m.ok())
                .count()
        })
    });
    g.finish();
    c.bench_function("tekken/load", |b| {
        b.iter(|| Tekken::from_file(format!("{SHARED}/tokenizers/tekken_240911.json"), None))
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(3));
    targets = bench
}
criterion_main!(benches);
