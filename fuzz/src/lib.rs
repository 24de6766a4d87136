//! What each fuzz target does with its input: the parsers cannon runs on files and frames it
//! did not write. A target passes when the parser returns (Ok or an error) without a panic,
//! an abort, a leak or an allocation past the fuzzer's cap. The same functions replay the saved
//! findings and seeds on stable (`trainer/tests/fuzz_regressions.rs` includes this file), so a
//! finding stays fixed without the nightly toolchain.
//!
//! Parsers that take a path get the input written to a per-process scratch folder: the file
//! is what users hand cannon, so the file is what is fuzzed.

use cannon_runtime::comm::rendezvous::{JobToken, StoreLimits, StoreOptions, TcpStore};
use cannon_trainer::app::cli::runlog::RunLog;
use cannon_trainer::model::st::StReader;
use cannon_trainer::model::{Mistral3Config, ParamLayout};
use cannon_trainer::train::checkpoint::Manifest;
use cannon_trainer::train::config::TrainConfig;
use cannon_trainer::train::data::dataset::{DataSet, SampleSettings};
use cannon_trainer::train::data::image::{self, ImageConfig};
use cannon_trainer::train::data::truncate::LabelPolicy;
use cannon_trainer::train::data::{DatasetSpec, Tekken};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

/// What a target runs on one input.
pub type Harness = fn(&[u8]);

/// Every target by name, for the replay test and the runner script.
pub const TARGETS: &[(&str, Harness)] = &[
    ("safetensors", safetensors),
    ("config_json", config_json),
    ("tekken_json", tekken_json),
    ("dataset_record", dataset_record),
    ("dataset_info", dataset_info),
    ("train_toml", train_toml),
    ("image", image_file),
    ("manifest", manifest),
    ("compare_jsonl", compare_jsonl),
    ("store_frames", store_frames),
];

/// A scratch folder of this process (libFuzzer runs one input at a time per process).
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let d = base.join(format!("cannon-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch folder");
        d
    })
}

fn put(name: &str, data: &[u8]) -> PathBuf {
    let p = scratch().join(name);
    std::fs::write(&p, data).expect("scratch write");
    p
}

/// The real tokenizer (mistral-common's tekken.json), for the targets that tokenize records.
fn tekken() -> &'static Tekken {
    static TOK: OnceLock<Tekken> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = std::env::var_os("CANNON_FUZZ_TEKKEN")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../shared/tokenizers/tekken_240911.json")
            });
        Tekken::from_file(&path, None)
            .expect("the fuzz targets read ../shared/tokenizers/tekken_240911.json")
    })
}

/// A safetensors file (model weights and checkpoint shards share the reader): open it, then
/// read every tensor widened to f32.
pub fn safetensors(data: &[u8]) {
    let p = put("t.safetensors", data);
    let Ok(r) = StReader::open(&p) else { return };
    let names: Vec<String> = r.names().map(String::from).collect();
    for n in names {
        let Some(e) = r.entry(&n) else { continue };
        let numel: usize = e.shape.iter().product();
        let mut dst = vec![0f32; numel];
        let _ = r.read_widened(&n, 0..numel, &mut dst);
    }
}

/// A model's config.json, and the parameter layout of one that validates.
pub fn config_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Mistral3Config::from_json(text) else {
        return;
    };
    let layout = ParamLayout::new(&cfg);
    assert_eq!(
        cfg.param_count(),
        Some(layout.groups.iter().map(|g| g.len as u64).sum()),
        "param_count disagrees with the layout"
    );
}

/// A tekken.json; one that loads encodes and decodes a fixed text.
pub fn tekken_json(data: &[u8]) {
    let Ok(tok) = Tekken::from_slice(data, None, Path::new("fuzz/tekken.json")) else {
        return;
    };
    let ids = tok.encode("Hello, wörld! 1234 [IMG] \u{1F600}", true, true);
    let _ = tok.decode(&ids);
}

/// A dataset file (JSONL or one JSON array; both schemas), tokenized with the real tokenizer
/// and image headers checked (paths that name nothing are bad records).
pub fn dataset_record(data: &[u8]) {
    let p = put("data.jsonl", data);
    let img = ImageConfig::default();
    let s = SampleSettings {
        max_len: 256,
        system_prompt: None,
        image: &img,
        labels: LabelPolicy::default(),
    };
    let _ = DataSet::read(&p, tekken(), &s);
}

/// A dataset_info.json resolved for one dataset name.
pub fn dataset_info(data: &[u8]) {
    let dir = scratch().join("info");
    std::fs::create_dir_all(&dir).expect("scratch folder");
    std::fs::write(dir.join("dataset_info.json"), data).expect("scratch write");
    let _ = DatasetSpec::resolve(Path::new("demo"), Some(&dir));
}

/// A run config: the TOML file before the first NUL byte, then one `--set` override per line.
pub fn train_toml(data: &[u8]) {
    let (toml, sets) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let p = put("run.toml", toml);
    let sets: Vec<String> = String::from_utf8_lossy(sets)
        .lines()
        .map(String::from)
        .collect();
    let _ = TrainConfig::load(Some(&p), &sets);
}

/// An image file: its header, then the whole Pixtral processor.
pub fn image_file(data: &[u8]) {
    let p = put("img.bin", data);
    let _ = image::header_size(&p);
    let _ = image::load_and_process(&p, &ImageConfig::default());
}

/// A checkpoint's manifest.json.
pub fn manifest(data: &[u8]) {
    let dir = scratch().join("ckpt");
    std::fs::create_dir_all(&dir).expect("scratch folder");
    std::fs::write(dir.join("manifest.json"), data).expect("scratch write");
    if let Ok(m) = Manifest::read(&dir) {
        let _ = m.check();
    }
}

/// The metrics JSONL `cannon compare` and `cannon plot` read.
pub fn compare_jsonl(data: &[u8]) {
    let p = put("metrics.jsonl", data);
    let Ok(log) = RunLog::read(&p) else { return };
    for f in log.fields().to_vec() {
        let _ = log.series(&f, 0, u64::MAX);
    }
}

/// Rank 0 of a two-rank job with a job token, serving the store on loopback for the process.
fn store() -> &'static (TcpStore, SocketAddr) {
    static STORE: OnceLock<(TcpStore, SocketAddr)> = OnceLock::new();
    STORE.get_or_init(|| {
        let opts = StoreOptions {
            token: Some(JobToken::new("fuzz-job-token-0123456789abcdef", "fuzz").unwrap()),
            bind: None,
            limits: StoreLimits {
                handshake: Duration::from_secs(2),
                frame: Duration::from_secs(2),
                ..StoreLimits::default()
            },
        };
        let s = TcpStore::connect_with("127.0.0.1", 0, 0, 2, Duration::from_secs(10), &opts)
            .expect("the fuzz store starts");
        let addr = s.listen_addr().expect("rank 0 serves");
        (s, addr)
    })
}

/// A stranger's bytes sent to the store after its greeting (the stranger has no token, so
/// everything it can reach is the handshake): whatever they are, the connection ends and
/// rank 0's own client still sets and gets through the same server.
pub fn store_frames(data: &[u8]) {
    let (store, addr) = store();
    let mut s = TcpStream::connect(addr).expect("connect to the fuzz store");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut greeting = [0u8; 41];
    if s.read_exact(&mut greeting).is_ok() {
        let _ = s.write_all(data);
        let _ = s.shutdown(Shutdown::Write);
        let mut reply = Vec::new();
        let _ = (&mut s).take(1 << 20).read_to_end(&mut reply);
    }
    store
        .set("fuzz/alive", data.get(..8).unwrap_or(data))
        .expect("the store goes on");
    let got = store
        .get("fuzz/alive", Duration::from_secs(5))
        .expect("the store answers");
    assert_eq!(got, data.get(..8).unwrap_or(data));
}
