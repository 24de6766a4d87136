//! `cannon data ...`: make, inspect and check datasets.

use crate::data::dataset::DataSet;
use crate::data::loader::DataConfig;
use crate::data::{synth, Tekken};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct DataArgs {
    #[command(subcommand)]
    pub command: DataCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Tokenize: one JSON string per line on stdin, one JSON array of ids per line on stdout.
    Encode {
        #[arg(long)]
        tokenizer: PathBuf,
        /// Truncate the vocabulary (mistral-common `Tekkenizer(vocab_size=)`).
        #[arg(long)]
        vocab_size: Option<u32>,
        #[arg(long)]
        bos: bool,
        #[arg(long)]
        eos: bool,
    },
    /// Read a JSONL dataset and report samples, tokens, images, dropped and bad lines.
    Check {
        #[arg(long)]
        dataset: PathBuf,
        #[arg(long)]
        tokenizer: PathBuf,
        #[arg(long)]
        vocab_size: Option<u32>,
        #[arg(long, default_value_t = 2048)]
        max_len: usize,
        /// Image longest edge after resizing.
        #[arg(long, default_value_t = 1540)]
        longest_edge: u32,
        /// System prompt for samples that bring none.
        #[arg(long)]
        system: Option<String>,
    },
    /// Generate the synthetic shapes dataset (train.jsonl, heldout.jsonl, images/).
    Synth {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1000)]
        samples: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

/// Exit codes: 0 success, 1 a check found bad lines or drops, 2 unusable input.
pub fn run(args: DataArgs) -> ExitCode {
    match args.command {
        DataCommand::Encode {
            tokenizer,
            vocab_size,
            bos,
            eos,
        } => encode(&tokenizer, vocab_size, bos, eos),
        DataCommand::Check {
            dataset,
            tokenizer,
            vocab_size,
            max_len,
            longest_edge,
            system,
        } => {
            let mut cfg = DataConfig {
                dataset: Some(dataset),
                vocab_size,
                max_len,
                system_prompt: system,
                ..DataConfig::default()
            };
            cfg.image.longest_edge = longest_edge;
            check(&cfg, &tokenizer)
        }
        DataCommand::Synth { out, samples, seed } => match synth::write(&out, samples, seed) {
            Ok(o) => {
                println!(
                    "wrote {} ({} samples) and {} ({} samples)",
                    o.train.display(),
                    o.train_samples,
                    o.heldout.display(),
                    o.heldout_samples
                );
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        },
    }
}

fn fail(e: impl std::fmt::Display) -> ExitCode {
    eprintln!("cannon data: {e}");
    ExitCode::from(2)
}

fn encode(path: &PathBuf, vocab_size: Option<u32>, bos: bool, eos: bool) -> ExitCode {
    let tok = match Tekken::from_file(path, vocab_size) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let stdin = std::io::stdin().lock();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for (i, line) in stdin.lines().enumerate() {
        let line = match line {
            Ok(l) => l,
            Err(e) => return fail(format!("stdin: {e}")),
        };
        if line.trim().is_empty() {
            continue;
        }
        let text: String = match serde_json::from_str(&line) {
            Ok(t) => t,
            Err(e) => return fail(format!("stdin line {}: not a JSON string: {e}", i + 1)),
        };
        let ids = tok.encode(&text, bos, eos);
        let r = serde_json::to_writer(&mut out, &ids)
            .map_err(std::io::Error::from)
            .and_then(|_| out.write_all(b"\n"));
        if let Err(e) = r {
            return fail(format!("stdout: {e}"));
        }
    }
    match out.flush() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format!("stdout: {e}")),
    }
}

fn check(cfg: &DataConfig, tokenizer: &PathBuf) -> ExitCode {
    let tok = match Tekken::from_file(tokenizer, cfg.vocab_size) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    let Some(path) = cfg.dataset.as_ref() else {
        return fail("no dataset");
    };
    let ds = match DataSet::read(path, &tok, &cfg.sample_settings()) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    for e in &ds.bad {
        eprintln!("bad line: {e}");
    }
    for line in &ds.dropped {
        eprintln!(
            "dropped: {}:{line}: truncation to {} tokens cut an image block",
            path.display(),
            cfg.max_len
        );
    }
    let s = &ds.stats;
    println!("dataset            {}", path.display());
    println!("lines              {}", s.lines);
    println!("samples            {}", s.samples);
    println!("tokens             {}", s.tokens);
    println!("trained tokens     {}", s.label_tokens);
    println!("images             {}", s.images);
    println!("truncated (kept)   {}", s.truncated);
    println!("dropped-truncated  {}", s.dropped_truncated);
    println!("bad lines          {}", s.bad_lines);
    if s.bad_lines > 0 || s.dropped_truncated > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
