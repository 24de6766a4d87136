//! Forward + backward of one Mistral3 training batch, timed, with the memory plan's peak beside
//! the allocator's, on the batch of `cannon bench step` (which times whole steps, clip and
//! AdamW included): random weights, B rows of S tokens, one IMG x IMG image per row, vision
//! tower and projector frozen, as `shared/bench/torch_train_step.py`.
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

use cannon_trainer::app::bench;
use cannon_trainer::model::memory::{plan, StepShape};
use cannon_trainer::model::{
    ActElem, Batch, DeviceCtx, Mistral3, Mistral3Config, Precision, StepMemory,
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

fn time<A: ActElem>(model: &Mistral3, batch: &Batch, runs: usize) -> (Vec<f64>, f64, StepMemory) {
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
    let model = bench::random_model(&cfg, DeviceCtx::cpu(), 0).expect("random weights");
    let batch = bench::bench_batch(&cfg, a.batch, a.seq, a.img, 0).expect("bench batch");
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
        let shape = StepShape::of(&cfg, &batch, model.exec.device()).expect("batch shape");
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
