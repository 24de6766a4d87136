//! `cannon plan` against real steps: for several parallel layouts and features that run
//! today, the planned per-rank peak (`plan::plan` from the same settings as `--set` keys) is
//! compared with the `max_allocated` each rank's own caching allocator measured over a full
//! training step (forward, backward, clip, AdamW) after a warm-up step. The bar is the
//! issue's 5 %; the byte-exact part of the plan (what is held across steps: parameter,
//! gradient and moment shards) must match exactly, and so must the whole peak of the
//! context-parallel cases (their exchange buffers are planned allocation by allocation).
//!
//! The model is small (a few MB) so that every run takes well under a second in --release,
//! but it has every part (vision tower, projector, 3 text layers, a 1024-token vocabulary,
//! GQA), so gathered groups, full gradients and the logits all weigh in the peak.

use cannon_trainer::app::bench::{bench_batch, random_host};
use cannon_trainer::app::plan::{self, measure, Plan, PlanSettings};
use cannon_trainer::model::optim::AdamWConfig;
use cannon_trainer::model::{ActElem, LossMode, MemoryFeatures, Mistral3Config, Part, Recompute};
use cannon_trainer::parallel::cp::{CpAlgo, CpSettings};
use cannon_trainer::parallel::fsdp::{rank_share, run_cpu_ranks, FsdpRank, FsdpSettings};
use std::path::PathBuf;
use std::time::Duration;

/// Host allocations counted per thread (each rank's), as the `cannon` binary counts them.
#[global_allocator]
static HOST: cannon_runtime::host_count::CountingAlloc = cannon_runtime::host_count::CountingAlloc;

/// A meta rank's save, export and resume against the plan's phases: device bytes to the
/// byte; host bytes (read pieces, host copies, the written group, counted per thread)
/// within 128 KiB + 1 % of the plan's either way (the small allocations around them are not
/// planned: JSON, paths, and the parsed headers of the files a resume keeps open, a few KB
/// for each of up to 8 rank files here). The start-up from a random init reads no
/// file: it holds the plan's bytes less the read piece the plan keeps for a load.
fn check_phases(name: &str, p: &Plan, r: usize, m: &measure::MetaRank) {
    let peaks = plan::run_peaks(p, 0, true);
    assert_eq!(
        m.phases.len(),
        6,
        "{name} meta rank {r}: phases {:?}",
        m.phases
    );
    for ph in &m.phases {
        let pl = peaks
            .phases
            .iter()
            .find(|x| measure::same_phase(x.name, ph.name))
            .unwrap_or_else(|| panic!("{name}: no planned phase {}", ph.name));
        let want = pl.host + if r == 0 { pl.host_rank0 } else { 0 };
        eprintln!(
            "{name} meta rank {r}: {} device {} B, planned {} B; host {} B, planned {want} B",
            ph.name, ph.device, pl.device, ph.host
        );
        let slack = (128 << 10) + want / 100;
        assert_eq!(
            ph.device, pl.device,
            "{name} meta rank {r}: {} device",
            ph.name
        );
        // A random init reads no file: it holds less than a load by the read piece.
        let floor = match ph.name {
            "start-up (init)" => want / 2,
            _ => want,
        };
        assert!(
            ph.host <= want + slack && ph.host + slack >= floor,
            "{name} meta rank {r}: {} host {} B, planned {want} B",
            ph.name,
            ph.host
        );
    }
}

const CONFIG: &str = r#"{
  "model_type": "mistral3", "image_token_index": 10, "spatial_merge_size": 2,
  "projector_hidden_act": "gelu", "multimodal_projector_bias": false,
  "vision_feature_layer": -1,
  "text_config": {
    "model_type": "mistral", "vocab_size": 1024, "hidden_size": 64, "intermediate_size": 160,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0,
    "sliding_window": null, "hidden_act": "silu", "tie_word_embeddings": false
  },
  "vision_config": {
    "model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "head_dim": 16, "num_channels": 3,
    "patch_size": 4, "image_size": 64, "rope_theta": 10000.0, "hidden_act": "silu"
  }
}"#;

/// A config directory of its own for each test (tests run in parallel threads).
fn config_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("cannon-plan-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    dir
}

/// One run's layout, as `--set` keys would give it.
struct Case {
    name: &'static str,
    nproc: usize,
    rows: usize,
    seq: usize,
    img: usize,
    accum: usize,
    bf16: bool,
    chunk: usize,
    /// Everything trains (the default for an HF config freezes vision and projector).
    all_train: bool,
    /// `train.recompute` and `train.offload_activations`.
    memory: MemoryFeatures,
    /// `parallel.cp_size` (1: none) and `parallel.cp_algo`.
    cp: CpSettings,
}

/// No recompute, no offload, no context parallelism.
const PLAIN: (MemoryFeatures, CpSettings) = (
    MemoryFeatures {
        recompute: Recompute::None,
        offload_activations: false,
        offload_optimizer: false,
    },
    CpSettings {
        size: 1,
        algo: CpAlgo::Ulysses,
        ulysses_size: 1,
    },
);

impl Case {
    fn sets(&self) -> Vec<String> {
        let mut s = vec![
            format!("parallel.nproc={}", self.nproc),
            format!("train.micro_batch={}", self.rows),
            format!("train.grad_accum={}", self.accum),
            format!("data.max_len={}", self.seq),
            format!("data.longest_edge={}", self.img),
            format!("train.dtype={}", if self.bf16 { "bf16" } else { "f32" }),
            format!("train.loss_chunk={}", self.chunk),
        ];
        if self.all_train {
            s.push("model.freeze=[]".into());
        }
        let recompute = match self.memory.recompute {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        };
        s.push(format!("train.recompute={recompute}"));
        s.push(format!(
            "train.offload_activations={}",
            self.memory.offload_activations
        ));
        s.push(format!(
            "train.offload_optimizer={}",
            self.memory.offload_optimizer
        ));
        if self.cp.size > 1 {
            s.push(format!("parallel.cp_size={}", self.cp.size));
            s.push(format!("parallel.cp_algo={}", self.cp.algo));
            if self.cp.algo == CpAlgo::Hybrid {
                s.push(format!("parallel.ulysses_size={}", self.cp.ulysses_size));
            }
        }
        s
    }

    fn plan(&self) -> (Plan, PlanSettings) {
        let dir = config_dir(self.name);
        let s = PlanSettings::load(&dir, &self.sets(), 1).unwrap();
        (plan::plan(&s).unwrap(), s)
    }

    fn frozen(&self) -> Vec<Part> {
        if self.all_train {
            vec![]
        } else {
            vec![Part::Vision, Part::Projector]
        }
    }

    fn loss(&self) -> LossMode {
        match self.chunk {
            0 => LossMode::Full,
            c => LossMode::Chunked(c),
        }
    }

    /// (start_allocated, max_allocated) of each rank over its second step.
    fn measure(&self, cfg: &Mistral3Config) -> Vec<(usize, usize)> {
        match self.bf16 {
            false => self.measure_as::<f32>(cfg),
            true => self.measure_as::<half::bf16>(cfg),
        }
    }

    fn measure_as<A: ActElem>(&self, cfg: &Mistral3Config) -> Vec<(usize, usize)> {
        let micro: Vec<_> = (0..self.accum)
            .map(|i| bench_batch(cfg, self.rows, self.seq, self.img, i as u64).unwrap())
            .collect();
        let adamw = AdamWConfig {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let host = random_host(cfg, 3);
        let settings = FsdpSettings {
            adamw,
            max_grad_norm: 1.0,
            frozen: self.frozen(),
            loss_mode: self.loss(),
            memory: self.memory,
        };
        run_cpu_ranks(self.nproc, Duration::from_secs(120), |comm, exec| {
            let rank = FsdpRank::new(
                comm,
                exec,
                cfg.clone(),
                cannon_trainer::parallel::fsdp::ShardSource::Full(&host),
                settings.clone(),
            )?;
            let mut rank = rank.with_cp(self.cp)?;
            // A CP group takes one data-parallel share of the rows.
            let (replica, replicas) = rank.data_parallel();
            let mine = rank_share(cfg, &micro, replica, replicas)?;
            let mut out = (0, 0);
            for _ in 0..2 {
                let st = rank.step::<A>(&mine, 1e-4)?;
                out = (st.memory.start_allocated, st.memory.max_allocated);
            }
            Ok(out)
        })
        .unwrap()
    }

    /// Plans, runs, and compares every rank; returns the worst relative difference.
    fn check(&self) -> f64 {
        let (plan, s) = self.plan();
        let measured = self.measure(&s.model);
        assert_eq!(measured.len(), self.nproc, "{}", self.name);
        let mut worst: f64 = 0.0;
        for (r, &(start, max)) in measured.iter().enumerate() {
            let rp = plan
                .rank(r)
                .unwrap_or_else(|| panic!("{}: no plan for rank {r}", self.name));
            assert_eq!(
                start,
                rp.resident(),
                "{} rank {r}: bytes held across steps (params + grads + moments)",
                self.name
            );
            let rel = (rp.peak() as f64 - max as f64) / max as f64;
            eprintln!(
                "{} rank {r}: measured max_allocated {max} B, planned {} B ({:+.3} %), peak \
                 phase {}",
                self.name,
                rp.peak(),
                100.0 * rel,
                rp.peak_phase().name
            );
            assert!(
                rel.abs() <= 0.05,
                "{} rank {r}: planned {} vs measured {max} ({:+.2} %): {rp:#?}",
                self.name,
                rp.peak(),
                100.0 * rel
            );
            worst = worst.max(rel.abs());
        }
        self.check_meta(&s);
        worst
    }

    /// The same layout on meta ranks (`cannon plan --measure`) against the NPU plan, whose
    /// attention statistics the meta device sizes as an NPU does: start-up to the byte, the
    /// step's peak under the same bar as the CPU ranks'.
    fn check_meta(&self, s: &PlanSettings) {
        let mut s = s.clone();
        s.device = cannon_runtime::Device::Npu(0);
        s.longest_edge = measure::image_side(&s) as u32;
        let p = plan::plan(&s).unwrap();
        let meta = measure::measure(&s, 2).unwrap();
        assert_eq!(meta.len(), self.nproc, "{}", self.name);
        for (r, m) in meta.iter().enumerate() {
            let rp = p
                .rank(r)
                .unwrap_or_else(|| panic!("{}: no plan for rank {r}", self.name));
            assert_eq!(
                m.start_up,
                rp.resident(),
                "{} meta rank {r}: start-up",
                self.name
            );
            assert_eq!(m.step_start, rp.resident(), "{} meta rank {r}", self.name);
            let rel = (rp.peak() as f64 - m.step_peak as f64) / m.step_peak as f64;
            eprintln!(
                "{} meta rank {r}: max_allocated {} B, NPU plan {} B ({:+.3} %)",
                self.name,
                m.step_peak,
                rp.peak(),
                100.0 * rel
            );
            assert!(
                rel.abs() <= 0.05,
                "{} meta rank {r}: {:+.2} %",
                self.name,
                100.0 * rel
            );
            check_phases(self.name, &p, r, m);
        }
    }
}

#[test]
fn one_rank_f32_full_loss() {
    Case {
        name: "1 rank f32 full loss",
        nproc: 1,
        rows: 2,
        seq: 96,
        img: 32,
        accum: 1,
        bf16: false,
        chunk: 0,
        all_train: false,
        memory: PLAIN.0,
        cp: PLAIN.1,
    }
    .check();
}

#[test]
fn fsdp_two_ranks_bf16_chunked_loss() {
    Case {
        name: "fsdp 2 bf16 chunked",
        nproc: 2,
        rows: 2,
        seq: 128,
        img: 32,
        accum: 1,
        bf16: true,
        chunk: 48,
        all_train: false,
        memory: PLAIN.0,
        cp: PLAIN.1,
    }
    .check();
}

#[test]
fn fsdp_four_ranks_f32_everything_trains_with_accumulation() {
    Case {
        name: "fsdp 4 f32 all parts, grad_accum 2",
        nproc: 4,
        rows: 4,
        seq: 80,
        img: 24,
        accum: 2,
        bf16: false,
        chunk: 0,
        all_train: true,
        memory: PLAIN.0,
        cp: PLAIN.1,
    }
    .check();
}

#[test]
fn fsdp_three_ranks_uneven_rows_bf16() {
    // 4 rows over 3 ranks: rank 0 takes two, the others one (the plan has two columns).
    let c = Case {
        name: "fsdp 3 uneven bf16",
        nproc: 3,
        rows: 4,
        seq: 64,
        img: 16,
        accum: 1,
        bf16: true,
        chunk: 0,
        all_train: false,
        memory: PLAIN.0,
        cp: PLAIN.1,
    };
    let (plan, _) = c.plan();
    assert_eq!(plan.ranks.len(), 2, "{plan:#?}");
    assert_eq!((plan.ranks[0].rows, plan.ranks[1].rows), (2, 1));
    c.check();
}

/// The real memory features: recompute and activation offload under FSDP.
#[test]
fn fsdp_two_ranks_recompute_full_and_offload() {
    Case {
        name: "fsdp 2 f32 recompute full + offload",
        nproc: 2,
        rows: 2,
        seq: 128,
        img: 32,
        accum: 1,
        bf16: false,
        chunk: 0,
        all_train: false,
        memory: MemoryFeatures {
            recompute: Recompute::Full,
            offload_activations: true,
            offload_optimizer: false,
        },
        cp: PLAIN.1,
    }
    .check();
}

/// The optimizer offload: the moments on the host, one group's through the device.
#[test]
fn optimizer_offload_one_rank_and_fsdp_two_ranks() {
    for (name, nproc) in [
        ("1 rank offload optimizer", 1),
        ("fsdp 2 offload optimizer", 2),
    ] {
        Case {
            name,
            nproc,
            rows: 2,
            seq: 96,
            img: 32,
            accum: 1,
            bf16: true,
            chunk: 0,
            all_train: true,
            memory: MemoryFeatures {
                recompute: Recompute::None,
                offload_activations: false,
                offload_optimizer: true,
            },
            cp: PLAIN.1,
        }
        .check();
    }
}

/// Selective recompute with the chunked loss on one rank, in bf16.
#[test]
fn one_rank_bf16_selective_recompute_chunked_loss() {
    Case {
        name: "1 rank bf16 selective + chunked",
        nproc: 1,
        rows: 2,
        seq: 96,
        img: 32,
        accum: 1,
        bf16: true,
        chunk: 32,
        all_train: true,
        memory: MemoryFeatures {
            recompute: Recompute::Selective,
            offload_activations: false,
            offload_optimizer: false,
        },
        cp: PLAIN.1,
    }
    .check();
}

/// Context parallelism (each algorithm over 2 ranks of one FSDP group) with the chunked
/// loss, and the full recompute re-running the ring's exchange in its backward.
///
/// With the full recompute the peak is a decoder layer's backward, where the exchange
/// buffers of the ring backward sit on top of everything else. They were planned 40960 B
/// (1.1 %) short: the plan had the K/V blocks and the travelling dK/dV, but not what
/// `cp::attn::backward` holds around `ring::backward` all along (d out and the head-sharded
/// dq, dk, dv, `2·qa + 2·ka`), the f32 dq accumulator, nor the third dK/dV-sized buffer a
/// `send_recv` receives into while the one it sends is still alive. The terms now follow
/// the allocations step by step (`model::memory::StepFeatures`).
#[test]
fn cp_two_ranks_chunked_loss_and_recompute() {
    for (name, algo, recompute) in [
        ("cp 2 ulysses f32 chunked", CpAlgo::Ulysses, Recompute::None),
        ("cp 2 ring f32 chunked", CpAlgo::Ring, Recompute::None),
        (
            "cp 2 ring f32 chunked + recompute full",
            CpAlgo::Ring,
            Recompute::Full,
        ),
    ] {
        let cp = CpSettings {
            size: 2,
            algo,
            ulysses_size: 1,
        };
        let worst = Case {
            seq: 128,
            ..cp_case(name, 2, cp, false, recompute)
        }
        .check();
        assert_eq!(worst, 0.0, "{name}: planned to the byte");
    }
}

/// The planned features move the terms their formulas say (`model::memory`'s docs), against
/// the plan without them on the same settings.
#[test]
fn planned_features_follow_their_formulas() {
    let dir = config_dir("features");
    let base = [
        "parallel.nproc=4",
        "train.micro_batch=4",
        "data.max_len=256",
        "data.longest_edge=32",
    ];
    let with = |extra: &[&str]| {
        let sets: Vec<String> = base.iter().chain(extra).map(|s| s.to_string()).collect();
        let s = PlanSettings::load(&dir, &sets, 1).unwrap();
        plan::plan(&s).unwrap().ranks[0].clone()
    };
    let none = with(&[]);
    let cfg = Mistral3Config::from_file(&dir.join("config.json")).unwrap();
    let (t, d, v) = (256, 64, 1024);
    let round = cannon_runtime::alloc::round_size;
    // Full recompute keeps only each layer's output.
    let full = with(&["train.recompute=full"]);
    assert_eq!(full.step.saved.text_layer, round(4 * t * d));
    assert!(full.peak() < none.peak());
    let sel = with(&["train.recompute=selective"]);
    assert!(full.step.saved.text_layer < sel.step.saved.text_layer);
    assert!(sel.step.saved.text_layer < none.step.saved.text_layer);
    // Offload: text layers 0 and 1 of three go to the host (input and what they keep), the
    // last stays; the vision tower keeps everything on the device.
    let off = with(&["train.offload_activations=true"]);
    assert_eq!(off.host_activations, 2 * none.step.saved.text_layer);
    assert!(off.peak() < none.peak());
    // Chunked loss: one chunk of logits instead of the full logits (which the training
    // forward overwrites with their gradient).
    let chunk = with(&["train.loss_chunk=64"]);
    assert_eq!(none.step.saved.head, round(4 * t * v));
    assert_eq!(chunk.step.saved.head, 0);
    assert!(chunk.peak() < none.peak());
    // Context parallel splits the text tokens, not the vision tower's patches; a rank of a
    // CP group holds a quarter of its group's row.
    let cp = with(&["parallel.cp_size=4", "train.micro_batch=1"]);
    assert_eq!((cp.tokens, cp.patches), (t / 4, none.patches));
    for algo in ["ring", "ulysses"] {
        let a = with(&[
            "parallel.cp_size=4",
            "train.micro_batch=1",
            &format!("parallel.cp_algo={algo}"),
        ]);
        assert!(a.peak() < none.peak(), "{algo}");
        assert!(a.comm_max() > 0);
    }
    // Offloading the optimizer (f32 run): the master weights, m and v go to the host,
    // gradients stay; an FSDP rank keeps one staging buffer of its largest shard (two slots
    // of it on an NPU, where the next shard's copy runs ahead of its gather).
    let opt = with(&["train.offload_optimizer=true"]);
    assert_eq!((opt.moments, opt.grads), (0, none.grads));
    assert_eq!(opt.host_optimizer, none.params + 2 * none.grads);
    let cut = cannon_trainer::parallel::fsdp::ShardLayout::new(
        &cannon_trainer::model::ParamLayout::new(&cfg),
        4,
    );
    let largest = cut.groups.iter().map(|g| g.shard).max().unwrap();
    assert_eq!(opt.params, round(4 * largest));
    assert!(opt.peak() < none.peak());
    let sets: Vec<String> = base
        .iter()
        .chain(&["train.offload_optimizer=true"])
        .map(|s| s.to_string())
        .collect();
    let mut npu = PlanSettings::load(&dir, &sets, 1).unwrap();
    npu.device = cannon_runtime::Device::Npu(0);
    assert_eq!(
        plan::plan(&npu).unwrap().ranks[0].params,
        round(2 * 4 * largest)
    );
    assert_eq!(cfg.text_config.hidden_size, d);
}

/// Bad input is an error naming what is wrong, exit code 2; a plan that does not fit exits
/// 1, one that fits 0, and `--json` writes the plan.
#[test]
fn cli_errors_name_the_input_and_the_exit_code_says_whether_it_fits() {
    const BIN: &str = env!("CARGO_BIN_EXE_cannon");
    let dir = config_dir("cli");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(BIN)
            .arg("plan")
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).to_string()
            + &String::from_utf8_lossy(&out.stdout);
        (out.status.code(), text)
    };
    let d = dir.to_str().unwrap();
    let bad: [(&[&str], &str); 7] = [
        (
            &["--config", "/nonexistent/model", "--device-memory", "64"],
            "/nonexistent/model",
        ),
        (
            &["--config", d, "--device-memory", "0"],
            "--device-memory 0",
        ),
        (
            &["--config", d, "--device-memory", "-3"],
            "--device-memory -3",
        ),
        (
            &[
                "--config",
                d,
                "--device-memory",
                "64",
                "--set",
                "train.bogus=1",
            ],
            "train.bogus",
        ),
        (
            &[
                "--config",
                d,
                "--device-memory",
                "64",
                "--set",
                "train.recompute=most",
            ],
            "train.recompute",
        ),
        (
            &[
                "--config",
                d,
                "--device-memory",
                "64",
                "--set",
                "parallel.ep_size=2",
            ],
            "dense",
        ),
        (
            &[
                "--config",
                d,
                "--device-memory",
                "64",
                "--set",
                "parallel.cp_size=3",
                "--set",
                "parallel.nproc=4",
            ],
            "parallel.cp_size",
        ),
    ];
    for (args, names) in bad {
        let (code, text) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {text}");
        assert!(text.contains(names), "{args:?}: {text}");
    }
    let json = dir.join("plan.json");
    let j = json.to_str().unwrap();
    let (code, text) = run(&[
        "--config",
        d,
        "--device-memory",
        "1",
        "--table",
        "--json",
        j,
    ]);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("fits") && text.contains("| recompute full |"),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["fits"], true);
    assert!(v["ranks"][0]["peak"].as_u64().unwrap() > 0);
    assert!(v["feature_table"].as_array().unwrap().len() > 5);
    let (code, text) = run(&["--config", d, "--device-memory", "0.001"]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("does NOT fit"), "{text}");
}

/// One CP case: `nproc` ranks in replicas of `cp` (dp = nproc / cp, one row each).
fn cp_case(
    name: &'static str,
    nproc: usize,
    cp: CpSettings,
    bf16: bool,
    recompute: Recompute,
) -> Case {
    Case {
        name,
        nproc,
        rows: nproc / cp.size,
        seq: 256,
        img: 32,
        accum: 1,
        bf16,
        chunk: 32,
        all_train: false,
        memory: MemoryFeatures {
            recompute,
            offload_activations: false,
            offload_optimizer: false,
        },
        cp,
    }
}

fn cp(size: usize, algo: CpAlgo, ulysses_size: usize) -> CpSettings {
    CpSettings {
        size,
        algo,
        ulysses_size,
    }
}

/// CP over 4 ranks: Ulysses (2 kv heads over 4 ranks: each kv head is repeated, so a layer
/// keeps k and v of 4 heads and exchanges them), Ring, and hybrid 2 x 2. With the full
/// recompute the peak is a decoder layer's backward, where the exchange buffers count;
/// without it, FSDP's head group (the same in every layout) still tops it at this size.
#[test]
fn cp_four_ranks_and_hybrid() {
    use CpAlgo::*;
    let full = Recompute::Full;
    for (c, text_peak) in [
        (
            cp_case(
                "cp 4 ulysses f32",
                4,
                cp(4, Ulysses, 1),
                false,
                Recompute::None,
            ),
            false,
        ),
        (
            cp_case(
                "cp 4 ulysses bf16 + recompute full",
                4,
                cp(4, Ulysses, 1),
                true,
                full,
            ),
            true,
        ),
        (
            cp_case(
                "cp 4 ring f32 + recompute full",
                4,
                cp(4, Ring, 1),
                false,
                full,
            ),
            true,
        ),
        (
            cp_case("cp 4 ring bf16", 4, cp(4, Ring, 1), true, Recompute::None),
            false,
        ),
        (
            cp_case(
                "hybrid 2x2 f32 + recompute full",
                4,
                cp(4, Hybrid, 2),
                false,
                full,
            ),
            true,
        ),
        (
            cp_case(
                "hybrid 2x2 bf16 + selective",
                4,
                cp(4, Hybrid, 2),
                true,
                Recompute::Selective,
            ),
            false,
        ),
    ] {
        assert_eq!(c.check(), 0.0, "{}: planned to the byte", c.name);
        if text_peak {
            let (plan, _) = c.plan();
            assert_eq!(
                plan.ranks[0].peak_phase().name,
                "text backward",
                "{}",
                c.name
            );
        }
    }
}

/// CP groups as data-parallel replicas of FSDP: dp 2 x cp 2 with each algorithm, and dp 2 x
/// hybrid 2 x 2 on 8 ranks.
#[test]
fn cp_with_data_parallel() {
    use CpAlgo::*;
    let full = Recompute::Full;
    for c in [
        cp_case(
            "dp 2 x ulysses 2 f32 + recompute full",
            4,
            cp(2, Ulysses, 1),
            false,
            full,
        ),
        cp_case(
            "dp 2 x ring 2 bf16 + recompute full",
            4,
            cp(2, Ring, 1),
            true,
            full,
        ),
        cp_case(
            "dp 2 x ring 2 f32",
            4,
            cp(2, Ring, 1),
            false,
            Recompute::None,
        ),
        cp_case(
            "dp 2 x hybrid 2x2 f32 + recompute full",
            8,
            cp(4, Hybrid, 2),
            false,
            full,
        ),
    ] {
        assert_eq!(c.check(), 0.0, "{}: planned to the byte", c.name);
    }
}

/// The phases around the step, to the byte: what a rank holds right after start-up (its
/// shards drawn from a random init, nothing of the whole model) and its device peak while it
/// writes the final model group by group are the plan's `start-up` and `export` device
/// figures, for 1, 2 and 4 ranks, with and without the optimizer offload.
#[test]
fn start_up_and_export_device_bytes_are_planned_exactly() {
    use cannon_trainer::model::init::Init;
    use cannon_trainer::parallel::fsdp::ShardSource;
    for offload in [false, true] {
        for nproc in [1usize, 2, 4] {
            let name = format!("phases-{nproc}-{offload}");
            let dir = config_dir(&name);
            let sets = vec![
                format!("parallel.nproc={nproc}"),
                "train.micro_batch=4".into(),
                "data.max_len=64".into(),
                "data.longest_edge=16".into(),
                "train.dtype=f32".into(),
                format!("train.offload_optimizer={offload}"),
            ];
            let mut s = PlanSettings::load(&dir, &sets, 1).unwrap();
            s.device = cannon_runtime::Device::Cpu;
            let p = plan::plan(&s).unwrap();
            let peaks = plan::run_peaks(&p, 0, false);
            let phase = |n: &str| {
                peaks
                    .phases
                    .iter()
                    .find(|f| f.name.starts_with(n))
                    .unwrap()
                    .device
            };
            let settings = FsdpSettings {
                adamw: AdamWConfig {
                    lr: 1e-4,
                    beta1: 0.9,
                    beta2: 0.95,
                    eps: 1e-8,
                    weight_decay: 0.0,
                },
                max_grad_norm: 1.0,
                frozen: s.frozen.clone(),
                loss_mode: LossMode::Full,
                memory: MemoryFeatures {
                    offload_optimizer: offload,
                    ..MemoryFeatures::default()
                },
            };
            let cfg = s.model.clone();
            let out_dir = std::env::temp_dir().join(format!(
                "cannon-plan-test-{}-{name}-out",
                std::process::id()
            ));
            let json = serde_json::json!({});
            let measured = run_cpu_ranks(nproc, Duration::from_secs(60), |comm, exec| {
                let r = comm.rank();
                let source = ShardSource::Random {
                    seed: 3,
                    init: Init::FanIn,
                };
                let rank = FsdpRank::new(comm, exec, cfg.clone(), source, settings.clone())?;
                let alloc = rank.exec().allocator().clone();
                let start = alloc.stats().allocated;
                alloc.reset_peak();
                rank.write_hf((r == 0).then_some((out_dir.as_path(), &json)))?;
                Ok((start, alloc.stats().peak_allocated))
            })
            .unwrap();
            for (r, &(start, export)) in measured.iter().enumerate() {
                assert_eq!(start, phase("start-up"), "{name} rank {r}: start-up");
                // The plan takes the largest group for every rank: the measured peak is the
                // plan's exactly on the rank whose largest group it is, never above it.
                assert!(
                    export <= phase("export"),
                    "{name} rank {r}: export {export} above the plan {}",
                    phase("export")
                );
            }
            let best = measured.iter().map(|m| m.1).max().unwrap();
            assert_eq!(best, phase("export"), "{name}: export peak");
            std::fs::remove_dir_all(&out_dir).ok();
        }
    }
}
