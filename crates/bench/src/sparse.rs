//! `engram bench sparse`: sparse attention over clustered KV (DynaKV, crate
//! `engram-sparse`) against exact attention and the baselines, in one harness.
//!
//! - Quality ([`quality`]), on the long-context model (`models/pycode-long`) and held-out text
//!   (`python3 models/pycode-long/recipe/heldout_text.py --out /tmp/heldout`): for each
//!   window of `L` tokens the first `L - scored` are prefilled (exact, once), the index built,
//!   the last `scored` decoded one at a time; per method and token budget: mean KL, top-1,
//!   perplexity against the exact path (`fidelity::measure::Scores`), attention mass recalled
//!   and attention-output relative error per layer (`engram_sparse::Probe`, f64).
//! - Task quality ([`task`], with `--task-model`): the policy as served (DynaKV over
//!   offloaded KV with its sinks, recent window and budget) against exact attention and a
//!   sliding window of the same RAM: held-out loss over the last tokens of long held-out
//!   windows, and a retrieval probe (a function defined early, asked for late).
//! - Speed ([`speed`]), on a random-weight fixture (`engram fixture --shape llama-1b`): decode
//!   tokens/s at each history, exact and DynaKV side by side on the same cache, KV bytes, RSS.
//!
//! - Offload ([`offload`], with `--offload-dir`): the speed runs' cache copied and offloaded to
//!   a file, decoding the same tokens cold from disk: tok/s, disk bytes per token, mean read,
//!   cluster-cache hit rate (cluster-aligned vs LRU at equal size), KV bytes in RAM, RSS, and
//!   split I/O delayed vs eager.
//! - Prefill to disk ([`prefill`], with `--offload-prefill after|bounded`): peak KV RAM and
//!   RSS of a history offloaded after it is all in RAM, against one streamed to the file as it
//!   is written (bounded prefill).
//! - Layout ([`layout`], with `--layout-history`): the offload file's layout without a model
//!   — append vs dual-head regions, index vs co-retrieval order, delayed vs eager splits —
//!   over hundreds of decode steps with flushes: reads, mean read, split bytes, bytes moved.
//!
//! Reproduce: `engram bench sparse --quality-model models/pycode-long --text /tmp/heldout/*.txt
//! --speed-model /tmp/fix/llama-1b-q4_0.gguf --threads 2 [--json]`.

mod layout;
mod offload;
mod prefill;
mod quality;
mod speed;
mod task;

use std::path::PathBuf;

use anyhow::Result;
use engram_sparse::Method;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The long-context model for quality (a Hugging Face folder or GGUF); omit to skip quality.
    #[arg(long)]
    quality_model: Option<PathBuf>,
    /// Held-out text files for quality (see the module doc).
    #[arg(long, num_args = 1..)]
    text: Vec<PathBuf>,
    /// Window lengths for quality (history + scored tokens).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192,16384")]
    lengths: Vec<usize>,
    /// Tokens decoded and scored at the end of each window.
    #[arg(long, default_value_t = 64)]
    scored: usize,
    /// Methods: dynakv, dynakv-eager, oracle, tokens, static, local, quest, streaming (or all).
    #[arg(long, value_delimiter = ',', default_value = "all")]
    methods: Vec<String>,
    /// Token budgets for quality (retrieved tokens per layer, KV head and step).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    budgets: Vec<usize>,
    /// Attention sinks and recent window (tokens always attended).
    #[arg(long, default_value_t = 4)]
    sinks: usize,
    #[arg(long, default_value_t = 64)]
    recent: usize,
    /// The long-context model for the task-level runs (`task.rs`): held-out loss and the
    /// retrieval probe, exact vs DynaKV vs a sliding window of the same RAM; omit to skip.
    #[arg(long)]
    task_model: Option<PathBuf>,
    /// Window lengths for the task runs (history + scored tokens).
    #[arg(long, value_delimiter = ',', default_value = "8192")]
    task_lengths: Vec<usize>,
    /// Tokens decoded and scored for the held-out loss at the end of each task window.
    #[arg(long, default_value_t = 1024)]
    task_scored: usize,
    /// Retrieval probes per task window (at most).
    #[arg(long, default_value_t = 16)]
    task_probes: usize,
    /// The speed model (e.g. the llama-1b q4_0 fixture); omit to skip speed.
    #[arg(long)]
    speed_model: Option<PathBuf>,
    /// Histories for speed (tokens in the cache before decoding).
    #[arg(long, value_delimiter = ',', default_value = "1024,4096,8192,16384,32768")]
    histories: Vec<usize>,
    /// Tokens decoded (timed) per history and path.
    #[arg(long, default_value_t = 16)]
    decode: usize,
    /// Token budget for the speed runs.
    #[arg(long, default_value_t = 2048)]
    budget: usize,
    /// Instead of the speed runs: each history written into a DynaKV cache offloaded to
    /// `--offload-dir` `after` the whole history is in RAM (then indexed and offloaded), or
    /// `bounded` (streamed to the file as it is written, RAM within `--ram-mib`): peak KV in
    /// RAM, peak RSS, time (`prefill.rs`). One mode per process (peak RSS is the process's).
    #[arg(long)]
    offload_prefill: Option<String>,
    /// Speed runs time DynaKV steps only (no exact steps between them): exact attention at
    /// 128K takes tens of seconds a token here, and DynaKV's own cost is what is profiled.
    #[arg(long)]
    no_exact: bool,
    /// Speed runs alternate DynaKV steps choosing clusters the way first written (every
    /// cluster sorted and walked) with the default ones, instead of exact steps: the same
    /// clusters chosen, on the same cache, timed step by step (`speed.rs`).
    #[arg(long)]
    ab_select: bool,
    /// Offload the speed runs' KV to a file in this directory (offloaded rows beside the
    /// in-RAM ones); omit to stay in RAM.
    #[arg(long)]
    offload_dir: Option<PathBuf>,
    /// Offloaded variants: cluster (cluster-aligned cache, reader thread, layer-ahead
    /// prefetch), noprefetch, lru, lru-noprefetch, inline (pread on the attention thread),
    /// uring (io_uring), cache2x (twice --cache-mib), eager (split on every flag), index
    /// (file in index order, not co-retrieval), static / local (those updates offloaded);
    /// NAME:BUDGET runs a variant at another token budget (equal-recall comparisons).
    #[arg(long, value_delimiter = ',', default_value = "cluster,noprefetch,lru,inline,uring,eager")]
    offload_variants: Vec<String>,
    /// KV bytes a sequence keeps in RAM before offloading (MiB).
    #[arg(long, default_value_t = 0)]
    ram_mib: usize,
    /// Cluster cache size (MiB), equal for every policy.
    #[arg(long, default_value_t = 64)]
    cache_mib: usize,
    /// The offload file layout bench (`layout.rs`, no model): history of its synthetic keys
    /// (0: skip), decode steps, tokens per flush, and LAYERS,HEADS,DIM.
    #[arg(long, default_value_t = 0)]
    layout_history: usize,
    #[arg(long, default_value_t = 512)]
    layout_steps: usize,
    #[arg(long, default_value_t = 32)]
    layout_flush: usize,
    #[arg(long, value_delimiter = ',', default_value = "2,8,64")]
    layout_shape: Vec<usize>,
    /// Gaps (rows) the layout bench's reads may read through; values besides the default (8)
    /// add append and dual-head rows with that gap.
    #[arg(long, value_delimiter = ',', default_value = "8")]
    layout_gaps: Vec<usize>,
    /// Worker threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// One JSON object per line instead of tables.
    #[arg(long)]
    json: bool,
}

/// The methods `names` name (`all`: every one).
fn parse_methods(names: &[String]) -> Result<Vec<Method>> {
    let mut out = Vec::new();
    for n in names.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if n == "all" {
            out.extend(Method::all());
        } else {
            out.push(Method::parse(n).map_err(anyhow::Error::msg)?);
        }
    }
    anyhow::ensure!(!out.is_empty(), "no methods (--methods)");
    Ok(out)
}

pub fn run(a: Args) -> Result<()> {
    anyhow::ensure!(
        a.quality_model.is_some() || a.task_model.is_some() || a.speed_model.is_some() || a.layout_history > 0,
        "nothing to measure: give --quality-model, --task-model, --speed-model and/or --layout-history"
    );
    engram_kernels::set_num_threads(a.threads.max(1));
    let methods = parse_methods(&a.methods)?;
    if let Some(m) = &a.quality_model {
        quality::run(&a, m, &methods)?;
    }
    if let Some(m) = &a.task_model {
        task::run(&a, m)?;
    }
    if let Some(m) = &a.speed_model {
        speed::run(&a, m)?;
    }
    if a.layout_history > 0 {
        let rows = layout::run(&a)?;
        if !a.json {
            layout::print_table(&rows, &a);
        }
    }
    if !a.json {
        println!(
            "{} threads; machine load (1-min average) {}",
            engram_kernels::num_threads(),
            std::fs::read_to_string("/proc/loadavg").map_or("?".into(), |s| s.split_whitespace().next().unwrap_or("?").to_string())
        );
    }
    Ok(())
}

/// `a`'s fields with `b`'s added.
fn with(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}
