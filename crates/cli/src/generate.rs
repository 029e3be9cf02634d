//! `engram generate`: one prompt in, the generated text out on stdout
//! (streamed), statistics on stderr. The exact path is one job on the CLI's engine
//! (`engine_run.rs`: the engine's own step, as `engram serve` runs it); `--sparse` runs one
//! request through the same step on a sparse cache of its own (`generate_sparse.rs`).

use anyhow::Result;
use engram_engine::{Job, OwnerKey};
use engram_tokenizer::ChatMessage;

use crate::common::{kv_pool, load_model, stdout_sink, ModelArgs, SamplingArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Opt-in sparse attention for decoding (DynaKV and baselines): dynakv, static, local, quest, streaming,
    /// oracle, tokens. Default: exact attention. Uses f16 KV in RAM, whatever --kv-format says.
    #[arg(long)]
    sparse: Option<String>,
    /// Tokens retrieved per layer, KV head and step with --sparse (besides 4 sinks and the 64
    /// most recent).
    #[arg(long)]
    sparse_budget: Option<usize>,
    /// With --sparse: past --sparse-ram-mib of KV, keep the older KV in a file in this
    /// directory (removed at exit); RAM keeps the index, sinks, recent window and a cluster cache.
    #[arg(long)]
    sparse_offload: Option<std::path::PathBuf>,
    /// KV a sequence keeps in RAM before --sparse-offload moves the older KV to disk (MiB).
    #[arg(long, default_value_t = 256)]
    sparse_ram_mib: usize,
    /// The cluster cache of --sparse-offload (MiB).
    #[arg(long, default_value_t = 64)]
    sparse_cache_mib: usize,
    /// How --sparse-offload reads its file: thread (a reader thread), inline, uring (io_uring;
    /// falls back to thread with a warning where the kernel refuses it).
    #[arg(long, default_value = "thread")]
    sparse_reader: String,
    /// Turn off the layer-ahead prefetch of --sparse-offload.
    #[arg(long)]
    sparse_no_prefetch: bool,
    /// With --sparse: a folder holding the conversation's sparse state. When it holds a sound
    /// state of this model and configuration whose tokens the prompt extends, the cache is
    /// resumed from it (only the new tokens prefilled); the state is saved there at the end.
    #[arg(long)]
    sparse_state: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> Result<()> {
    let model = std::sync::Arc::new(load_model(&a.model)?);
    let pool = kv_pool(&model, &a.model)?;
    let tok = &model.tokenizer;
    // The prompt's text as the engine matches it, whether special tokens are added cold, and
    // its tokens.
    let (text, add_special) = if a.chat {
        let tpl = tok.chat_template().ok_or_else(|| anyhow::anyhow!("the model has no chat template; drop --chat"))?;
        let text =
            tpl.render(&[ChatMessage::new("user", a.prompt.clone())], true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))?;
        (text, false)
    } else {
        (a.prompt.clone(), true)
    };
    let ids = tok.encode(&text, add_special)?.ids;
    if let Some(method) = &a.sparse {
        let cfg = crate::generate_sparse::config(method, a.sparse_budget.unwrap_or(2048), ids.len())?;
        let backend = engram_sparse::Backend::parse(&a.sparse_reader).map_err(|e| anyhow::anyhow!("--sparse-reader: {e}"))?;
        let off = a.sparse_offload.map(|dir| engram_sparse::OffloadConfig {
            ram_budget: a.sparse_ram_mib << 20,
            cache_bytes: a.sparse_cache_mib << 20,
            backend,
            prefetch: !a.sparse_no_prefetch,
            ..engram_sparse::OffloadConfig::new(dir, model.fingerprint.0)
        });
        return crate::generate_sparse::generate(&model, &pool, &ids, &a.sampling.params(), cfg, off, a.sparse_state.as_deref());
    }
    anyhow::ensure!(a.sparse_state.is_none(), "--sparse-state needs --sparse METHOD");
    anyhow::ensure!(a.sparse_budget.is_none(), "--sparse-budget needs --sparse METHOD");
    anyhow::ensure!(a.sparse_offload.is_none(), "--sparse-offload needs --sparse METHOD");
    let engine = crate::engine_run::CliEngine::start(model.clone(), pool, None);
    let job = Job { text: Some(text), add_special, ..Job::from_tokens(OwnerKey::from("default"), ids, a.sampling.params()) };
    let r = engine.run(job, &mut stdout_sink)?;
    // A reader that went away (`| head`) already cancelled the job; nothing to end then.
    let _ = std::io::Write::write_all(&mut std::io::stdout(), b"\n");
    eprintln!(
        "prompt {} tokens, prefill {:.1} tok/s, ttft {:.0} ms; generated {} tokens, decode {:.1} tok/s; finish: {}",
        r.prompt_tokens,
        r.prefill_tok_s(),
        r.ttft_ms,
        r.generated,
        r.decode_tok_s,
        r.finish.as_str()
    );
    Ok(())
}
