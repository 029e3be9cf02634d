//! `engram convert --model HF_FOLDER --out FILE.gguf --format q8_0`: a
//! Hugging Face folder of a supported architecture to a GGUF file that Engram and llama.cpp
//! both load (the work is `engram_fixture::convert_hf`; this module parses
//! flags and reports). Progress goes to stderr, the written path to stdout.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Result};
use engram_fixture::GgufFormat;

/// Flags of `engram convert`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The Hugging Face folder (config.json, tokenizer.json, model.safetensors or shards).
    #[arg(long)]
    model: PathBuf,
    /// The GGUF file to write (atomically: a temporary file renamed into place).
    #[arg(long)]
    out: PathBuf,
    /// Weight format: f32, f16, bf16, q8_0, q4_0, q4_k_m or iq3_xxs (norms stay f32; iq3_xxs
    /// searches its grid exhaustively, so it is the slowest to write).
    #[arg(long, default_value = "f16")]
    format: String,
}

/// Runs the conversion.
pub fn run(a: Args) -> Result<()> {
    let Some(format) = GgufFormat::from_name(&a.format) else {
        let names: Vec<_> = GgufFormat::ALL.iter().map(|f| f.name()).collect();
        bail!("unknown format \"{}\" (expected one of: {})", a.format, names.join(", "));
    };
    let t = Instant::now();
    let done = engram_fixture::convert_hf(&a.model, &a.out, format, &mut |m| eprintln!("{m}"))?;
    eprintln!(
        "wrote {} ({:.2} MiB, {} tensors, {}) in {:.1} s",
        done.path.display(),
        done.num_bytes as f64 / (1 << 20) as f64,
        done.num_tensors,
        format.name(),
        t.elapsed().as_secs_f64()
    );
    println!("{}", done.path.display());
    Ok(())
}
