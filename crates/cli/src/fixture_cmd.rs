//! `engram fixture <shape> --out <dir>`.

use std::path::PathBuf;

use anyhow::{bail, Result};
use engram_fixture::{GgufFormat, Shape};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// tiny, llama-1b, qwen2-0.5b, tiny-qwen2, tiny-qwen3, tiny-phi3, tiny-gemma3, tiny-gemma2,
    /// tiny-qwen3-moe, tiny-mixtral or tiny-gpt-oss.
    shape: String,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// GGUF formats, comma-separated: f32, f16, bf16, q8_0, q4_0, q4_k_m, mxfp4_moe (mixtures only), iq3_xxs.
    #[arg(long, default_value = "f16,q8_0,q4_0")]
    formats: String,
    #[arg(long, default_value_t = engram_fixture::DEFAULT_SEED)]
    seed: u64,
}

pub fn run(a: Args) -> Result<()> {
    let Some(shape) = Shape::from_name(&a.shape) else {
        let names: Vec<_> = Shape::ALL.iter().map(|s| s.name()).collect();
        bail!("unknown shape \"{}\" (expected one of: {})", a.shape, names.join(", "));
    };
    let mut formats = Vec::new();
    for f in a.formats.split(',').filter(|s| !s.is_empty()) {
        match GgufFormat::from_name(f.trim()) {
            Some(g) => formats.push(g),
            None => {
                let names: Vec<_> = GgufFormat::ALL.iter().map(|g| g.name()).collect();
                bail!("unknown GGUF format \"{f}\" (expected one of: {})", names.join(", "))
            }
        }
    }
    let t = std::time::Instant::now();
    let files = engram_fixture::generate(shape, a.seed, &a.out, &formats, &mut |m| eprintln!("{m}"))?;
    eprintln!("done in {:.1} s", t.elapsed().as_secs_f64());
    println!("{}", files.hf_dir.display());
    for (_, p) in &files.ggufs {
        println!("{}", p.display());
    }
    Ok(())
}
