//! The flags that serve long conversations sparse (`engram serve`, `engram chat`):
//! `--long-context-after TOKENS` turns the long-context layer on (DynaKV over KV offloaded to
//! `<data dir>/long`, `engram_sparse::LongContext`); off by default, and below the threshold
//! nothing changes.
//!
//! Invariant: without `--long-context-after` no sparse layer is built; with it, the offload
//! folder exists and holds no file of an earlier run (a live offload file belongs to one
//! running sequence, and a killed process leaves its files behind). `--context dual` with
//! `--long-context-after` is refused at start ([`LongContextArgs::check_context`]).

use std::path::Path;

use anyhow::{Context, Result};
use engram_sparse::{LongContextConfig, Method, SparseConfig};

/// `--long-context-*` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct LongContextArgs {
    /// Serve a conversation whose history and prompt pass TOKENS sparse: DynaKV over KV
    /// offloaded to disk (`<data dir>/long`), the sinks and recent window in RAM, the sparse
    /// cache kept between turns. Off by default (every sequence exact).
    #[arg(long, value_name = "TOKENS")]
    pub long_context_after: Option<usize>,
    /// KV (f16) a sparse sequence keeps in RAM before its older KV goes to its file, in MiB.
    #[arg(long, default_value_t = 64, value_name = "MIB", requires = "long_context_after")]
    pub long_context_ram_mib: usize,
    /// Tokens retrieved per layer, KV head and decoded token, besides the sinks and the recent
    /// window.
    #[arg(long, default_value_t = 2048, value_name = "TOKENS", requires = "long_context_after")]
    pub long_context_budget: usize,
}

impl LongContextArgs {
    /// Refuses `--long-context-after` beside `--context dual`: a dual-stream turn is a view of
    /// spans (the persistent stream) and a ring placed after them, which the sparse cache
    /// cannot hold, so no such conversation would ever go sparse (and none would be saved);
    /// the ring already bounds a thread's KV (`--ring-tokens`).
    pub fn check_context(&self, context: &str) -> Result<()> {
        if context == "dual" && self.long_context_after.is_some() {
            anyhow::bail!(
                "--long-context-after does not work with --context dual: a dual-stream thread's KV is its persistent \
                 stream's spans and a ring of turns (bounded by --ring-tokens), which DynaKV's sparse cache cannot hold; \
                 use --context sessions for long conversations served sparse, or drop --long-context-after"
            );
        }
        Ok(())
    }

    /// The layer's configuration (`None` without `--long-context-after`), its folder under
    /// `data_dir` created empty.
    pub fn config(&self, data_dir: &Path) -> Result<Option<LongContextConfig>> {
        let Some(after) = self.long_context_after else { return Ok(None) };
        anyhow::ensure!(self.long_context_budget > 0, "--long-context-budget must be at least 1 token");
        let dir = data_dir.join("long");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Some(LongContextConfig {
            sparse: SparseConfig { budget: self.long_context_budget, ..SparseConfig::new(Method::DYNAKV) },
            ram_budget: self.long_context_ram_mib << 20,
            ..LongContextConfig::new(after, dir)
        }))
    }
}
