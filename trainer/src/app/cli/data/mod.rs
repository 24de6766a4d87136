//! `cannon data ...`: make, inspect and check datasets.

mod samples;
mod show;

pub use samples::{SampleArgs, Samples};

use crate::train::data::dataset::DataSet;
use crate::train::data::records::Layout;
use crate::train::data::{synth, Tekken};
use clap::builder::RangedU64ValueParser;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// A count that must be at least 1: 0 is a usage error (exit 2) before anything is read.
fn positive<T>() -> RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::fmt::Display + Send + Sync + 'static,
{
    RangedU64ValueParser::<T>::new().range(1..)
}

#[derive(clap::Args, Debug)]
pub struct DataArgs {
    #[command(subcommand)]
    pub command: DataCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum DataCommand {
    /// Tokenize: one JSON string per line on stdin, one JSON array of ids per line on stdout.
    ///
    /// Output line N always answers input line N: a blank input line gives `null`.
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
    /// Read a dataset (JSONL or a JSON array) and report samples, tokens, images, dropped and
    /// bad records.
    ///
    /// Images are checked by their headers, as a run reads them; --decode decodes every one
    /// in full, which also finds files cut after their header.
    ///
    /// Exit codes: 0 every record is a kept sample; 1 some records are bad or were dropped by
    /// truncation, or (--decode) some images do not decode; 2 unusable input (missing file, unreadable tokenizer, an array that is not
    /// JSON, or a dataset with no record at all).
    Check {
        #[command(flatten)]
        samples: SampleArgs,
        /// Decode every image in full (a run decodes them only when their sample is used, and
        /// skips a sample whose image does not decode).
        #[arg(long)]
        decode: bool,
    },
    /// Print what records become: the text with its special tokens, each image's token grid
    /// (`[IMG] x 4 x 3`: 4 wide, 3 high) and size, the trained tokens between « and ».
    ///
    /// --json writes one JSON object per record and line instead: `input_ids`, `labels`
    /// (-100: not trained) and `image_sizes` (each image's resized [height, width]); a record
    /// that makes no sample is `{"error": ...}` there. Exit codes: 0 every record shown makes
    /// a sample; 1 some do not; 2 unusable input.
    Show {
        #[command(flatten)]
        samples: SampleArgs,
        /// The record to show, 1-based (default: the first).
        #[arg(long, value_parser = positive::<usize>(), conflicts_with = "all")]
        index: Option<usize>,
        /// Show every record.
        #[arg(long)]
        all: bool,
        /// One JSON object per record.
        #[arg(long)]
        json: bool,
    },
    /// Generate the synthetic shapes dataset (train.jsonl, heldout.jsonl, images/).
    ///
    /// Files are written under temporary names and renamed when complete, so an interrupted
    /// run leaves no partial dataset under the final names.
    Synth {
        #[arg(long)]
        out: PathBuf,
        #[arg(long, default_value_t = 1000, value_parser = positive::<usize>())]
        samples: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Replace a dataset already in OUT (refused otherwise).
        #[arg(long)]
        force: bool,
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
        DataCommand::Check { samples, decode } => match samples.resolve() {
            Ok(s) => check(&s, decode),
            Err(e) => fail(e),
        },
        DataCommand::Show {
            samples,
            index,
            all,
            json,
        } => show::run(
            &samples,
            if all { None } else { Some(index.unwrap_or(1)) },
            json,
        ),
        DataCommand::Synth {
            out,
            samples,
            seed,
            force,
        } => synth_cmd(&out, samples, seed, force),
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
        // A blank line answers `null` (not `[]`, the ids of "") so line N out stays line N in.
        let ids = if line.trim().is_empty() {
            None
        } else {
            match serde_json::from_str::<String>(&line) {
                Ok(text) => Some(tok.encode(&text, bos, eos)),
                Err(e) => return fail(format!("stdin line {}: not a JSON string: {e}", i + 1)),
            }
        };
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

fn synth_cmd(out: &Path, samples: usize, seed: u64, force: bool) -> ExitCode {
    let found = synth::existing(out);
    if !force && !found.is_empty() {
        let names: Vec<String> = found.iter().map(|p| p.display().to_string()).collect();
        return fail(format!(
            "{} already holds a dataset ({}): refusing to overwrite it; pass --force to replace it",
            out.display(),
            names.join(", ")
        ));
    }
    // Drawn only on a terminal (indicatif hides itself when stderr is not one).
    let bar = indicatif::ProgressBar::new(samples as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{elapsed_precise}] {wide_bar} {pos}/{len} samples ({per_sec}, ETA {eta})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message("synth");
    let r = synth::write_with(out, samples, seed, force, &mut |done| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    match r {
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
    }
}

fn check(samples: &Samples, decode: bool) -> ExitCode {
    for w in &samples.warnings {
        eprintln!("WARNING: {w}");
    }
    let spec = &samples.spec;
    let ds = match DataSet::open(spec, &samples.tok, &samples.settings()) {
        Ok(d) => d,
        Err(e) => return fail(e),
    };
    let path = &ds.path;
    for e in &ds.bad {
        eprintln!("bad record: {e}");
    }
    for line in &ds.dropped {
        eprintln!(
            "dropped: {}:{line}: truncation to {} tokens cut an image block",
            path.display(),
            samples.max_len
        );
    }
    let undecodable = if decode { ds.undecodable() } else { Vec::new() };
    for (line, e) in &undecodable {
        eprintln!("undecodable: {}:{line}: {e}", path.display());
    }
    let s = &ds.stats;
    let layout = match ds.layout {
        Layout::Jsonl => "JSONL",
        Layout::JsonArray => "JSON array",
    };
    match &spec.name {
        Some(name) => println!("dataset            {name} ({})", path.display()),
        None => println!("dataset            {}", path.display()),
    }
    println!("layout             {layout}");
    println!("images from        {}", spec.media_dir.display());
    println!("records            {}", s.lines);
    println!("samples            {}", s.samples);
    println!("tokens             {}", s.tokens);
    println!("trained tokens     {}", s.label_tokens);
    println!("images             {}", s.images);
    println!("truncated (kept)   {}", s.truncated);
    println!("dropped-truncated  {}", s.dropped_truncated);
    println!("bad records        {}", s.bad_lines);
    if decode {
        println!("undecodable        {}", undecodable.len());
    }
    if s.lines == 0 {
        // Nothing to check is not a passed check: like a missing file, the input is unusable.
        eprintln!(
            "cannon data: {}: the dataset has no records",
            path.display()
        );
        ExitCode::from(2)
    } else if s.bad_lines > 0 || s.dropped_truncated > 0 || !undecodable.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
