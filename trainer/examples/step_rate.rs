//! Forward + backward of one Mistral3 training batch, timed: the bench configuration of
//! `shared/bench` (random weights, B rows of S tokens, one IMG x IMG image per row, vision
//! tower and projector frozen, as `shared/bench/torch_train_step.py`).
//!
//! ```sh
//! cargo run -p cannon-trainer --release --example step_rate -- [CONFIG_DIR] [--batch 2]
//!     [--seq 1024] [--img 224] [--runs 5] [--dtype f32|bf16]
//! ```
//!
//! Prints one JSON line per dtype: median and minimum seconds of forward + backward, tokens/s,
//! and the step's `max_allocated` / `max_reserved` bytes from the model's allocator.
//! The machine's speed drifts from minute to minute: compare two builds by running them
//! interleaved, not one after the other.

use cannon_kernels::cross_entropy::IGNORE_INDEX;
use cannon_trainer::data::shuffle::SplitMix64;
use cannon_trainer::model::memory::{plan, StepShape};
use cannon_trainer::model::{
    Act, Batch, Exec, Images, Mistral3, Mistral3Config, ParamLayout, Params, Precision, StepMemory,
};
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    config: PathBuf,
    batch: usize,
    seq: usize,
    img: usize,
    runs: usize,
    dtypes: Vec<String>,
}

fn parse() -> Args {
    let mut a = Args {
        config: PathBuf::from("../shared/bench/mistral3-bench"),
        batch: 2,
        seq: 1024,
        img: 224,
        runs: 5,
        dtypes: vec!["f32".into(), "bf16".into()],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().expect("flag needs a value");
        match arg.as_str() {
            "--batch" => a.batch = val().parse().expect("--batch N"),
            "--seq" => a.seq = val().parse().expect("--seq N"),
            "--img" => a.img = val().parse().expect("--img N"),
            "--runs" => a.runs = val().parse().expect("--runs N"),
            "--dtype" => a.dtypes = vec![val()],
            _ => a.config = PathBuf::from(arg),
        }
    }
    a
}

/// Random weights: norms 1, everything else uniform in +-0.02 (the config's init range),
/// made on the host and uploaded.
fn random_params(exec: &Exec, cfg: &Mistral3Config, rng: &mut SplitMix64) -> Params {
    let layout = ParamLayout::new(cfg);
    let mut host: Vec<Vec<f32>> = layout.groups.iter().map(|g| vec![0.0; g.len]).collect();
    for (g, group) in layout.groups.iter().enumerate() {
        for slot in &group.slots {
            let norm = slot.name.contains("norm");
            for x in &mut host[g][slot.range()] {
                *x = if norm {
                    1.0
                } else {
                    ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04
                };
            }
        }
    }
    Params::from_host(exec, layout, &host).expect("upload the weights")
}

/// One row per image: BOS, the image's [IMG]/[IMG_BREAK]/[IMG_END] tokens, random text.
fn bench_batch(cfg: &Mistral3Config, a: &Args, rng: &mut SplitMix64) -> Batch {
    let v = cfg.vision_config.patch_size;
    let side = a.img / (v * cfg.spatial_merge_size);
    let mut img_toks = Vec::new();
    for _ in 0..side {
        img_toks.extend(std::iter::repeat_n(cfg.image_token_index, side));
        img_toks.push(12);
    }
    *img_toks.last_mut().expect("image has tokens") = 13;
    let vocab = cfg.text_config.vocab_size as u64;
    let (mut ids, mut labels) = (Vec::new(), Vec::new());
    for _ in 0..a.batch {
        let mut row = vec![1u32];
        row.extend(&img_toks);
        let prompt = row.len();
        while row.len() < a.seq {
            row.push(16 + rng.below(vocab - 16) as u32);
        }
        labels.extend(
            row.iter()
                .enumerate()
                .map(|(i, &t)| if i < prompt { IGNORE_INDEX } else { t as i32 }),
        );
        ids.extend(row);
    }
    let c = cfg.vision_config.num_channels;
    let n = a.batch * c * a.img * a.img;
    let pixel_values = (0..n)
        .map(|_| (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        .collect();
    Batch {
        input_ids: ids,
        labels,
        position_ids: Vec::new(),
        cu_seqlens: Vec::new(),
        rows: a.batch,
        seq: a.seq,
        images: Images {
            pixel_values,
            channels: c,
            sizes: vec![(a.img, a.img); a.batch],
        },
        samples_per_row: Vec::new(),
    }
}

fn time<A: Act>(model: &Mistral3, batch: &Batch, runs: usize) -> (Vec<f64>, f64, StepMemory) {
    let mut grads = model
        .grads(&[cannon_trainer::model::Part::Text])
        .expect("gradients");
    let mut times = Vec::new();
    let mut loss = 0.0;
    let mut mem = None;
    for i in 0..runs + 1 {
        grads.zero(model.exec.stream()).expect("zero");
        let t0 = Instant::now();
        let (l, m) = model
            .measure_step::<A>(batch, &mut grads, None)
            .expect("forward + backward");
        let dt = t0.elapsed().as_secs_f64();
        (loss, mem) = (l, Some(m));
        if i > 0 {
            times.push(dt); // the first run warms the caches and the allocator
        }
    }
    times.sort_by(f64::total_cmp);
    (times, loss, mem.expect("at least one run"))
}

fn main() {
    let a = parse();
    let cfg = Mistral3Config::from_file(&a.config.join("config.json")).expect("config");
    let mut rng = SplitMix64::new(0);
    let exec = Exec::cpu();
    let model = Mistral3 {
        params: random_params(&exec, &cfg, &mut rng),
        cfg: cfg.clone(),
        loss_mode: cannon_trainer::model::LossMode::Full,
        exec,
    };
    let batch = bench_batch(&cfg, &a, &mut rng);
    for dt in &a.dtypes {
        let (times, loss, mem) = match dt.as_str() {
            "f32" => time::<f32>(&model, &batch, a.runs),
            "bf16" => time::<half::bf16>(&model, &batch, a.runs),
            other => panic!("--dtype {other}: f32 or bf16"),
        };
        let med = times[times.len() / 2];
        // The memory plan's prediction of max_allocated (model::memory).
        let prec = match dt.as_str() {
            "f32" => Precision::F32,
            _ => Precision::Bf16,
        };
        let shape = StepShape::of(&cfg, &batch).expect("batch shape");
        let text = [cannon_trainer::model::Part::Text];
        let plan = plan(&cfg, &shape, prec, model.loss_mode, &text, false);
        println!(
            "{{\"dtype\": \"{dt}\", \"batch\": {}, \"seq\": {}, \"median_fwd_bwd_s\": {med:.4}, \
             \"min_fwd_bwd_s\": {:.4}, \"tokens_per_s\": {:.1}, \"loss\": {loss:.4}, \
             \"max_allocated\": {}, \"planned_max_allocated\": {}, \"max_reserved\": {}}}",
            a.batch,
            a.seq,
            times[0],
            (a.batch * a.seq) as f64 / med,
            mem.max_allocated,
            mem.start_allocated + plan.peak(),
            mem.max_reserved
        );
    }
}
