//! `engram`: the command-line entry point. Each subcommand lives in its own
//! module, the benchmarks (`engram bench …`) in `engram-bench`; this file only
//! parses arguments and dispatches.

mod api_keys;
mod cache_cmd;
mod chat;
mod context_args;
mod convert_cmd;
mod engine_run;
mod fixture_cmd;
mod generate;
mod generate_sparse;
mod long_context;
mod rag_cmd;
mod remote_cmd;
mod scenario_cmd;
mod serve;

use clap::{Parser, Subcommand};
// NOTE: the options and model loading shared with the benchmarks live in `engram-cli-common`;
// named `common` here as before, so the subcommands import `crate::common::…`.
use engram_cli_common as common;
// The default chat model and the data-directory lock live in `engram-cli-common` too, where the
// Python package reaches them; named here as before.
use engram_cli_common::{chat_model, data_lock};

/// Engram: an on-device LLM runtime that never prefills the same context twice.
#[derive(Parser)]
#[command(name = "engram", version, about)]
struct Cli {
    /// Log filter (`tracing` EnvFilter syntax, e.g. `info` or `engram_engine=debug`; default
    /// `$ENGRAM_LOG`, else `$RUST_LOG`, else `warn`). At `debug`, the request path's spans
    /// (admit, step, forward, retire, persist, restore; `sample` at `trace`) print their
    /// time when they close.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of a prompt; prints only the generated text on stdout.
    Generate(generate::Args),
    /// Interactive chat with streaming output and per-turn timings.
    Chat(chat::Args),
    /// OpenAI- and Anthropic-compatible HTTP server with continuous batching.
    Serve(serve::Args),
    /// Write a deterministic random-weight model (HF folder + GGUF files).
    Fixture(fixture_cmd::Args),
    /// Convert a Hugging Face folder (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, Phi-3, Gemma 2/3, GPT-OSS) to a GGUF file (f32, f16, bf16, q8_0, q4_0, q4_k_m, iq3_xxs).
    Convert(convert_cmd::Args),
    /// Persisted KV cache entries: ls, inspect, rm, pin, unpin, gc.
    Cache(cache_cmd::Args),
    /// Multi-agent scenarios (YAML phases, each agent's cache its working memory): run, validate.
    Scenario(scenario_cmd::Args),
    /// Personal RAG (PerCache: QA bank, chunk KV tree): ingest documents, query them, ls, rm, stats.
    Rag(rag_cmd::Args),
    /// The remote KV tier (Redis): the ACL rule of a per-tenant user.
    Remote(remote_cmd::Args),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: engram_bench::BenchCommand,
    },
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.log.as_deref());
    // A kernel path forced by ENGRAM_SIMD that this CPU lacks is an error up front, not a panic later.
    if let Err(e) = engram_kernels::internal::Isa::forced() {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    let result = match cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Fixture(a) => fixture_cmd::run(a),
        Command::Convert(a) => convert_cmd::run(a),
        Command::Cache(a) => cache_cmd::run(a),
        Command::Scenario(a) => scenario_cmd::run(a),
        Command::Rag(a) => rag_cmd::run(a),
        Command::Remote(a) => remote_cmd::run(a),
        Command::Bench { which } => engram_bench::run(which),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// Logs to stderr, filtered by `--log`, else `$ENGRAM_LOG`, else `$RUST_LOG`, else `warn`; a
/// filter that does not parse is an error naming it (exit status 2), never silently dropped.
fn init_logging(flag: Option<&str>) {
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::EnvFilter;
    let (source, text) = match flag {
        Some(f) => ("--log", f.to_string()),
        None => match std::env::var("ENGRAM_LOG").or_else(|_| std::env::var("RUST_LOG")) {
            Ok(v) => ("ENGRAM_LOG / RUST_LOG", v),
            Err(_) => ("the default", "warn".to_string()),
        },
    };
    let filter = EnvFilter::try_new(&text).unwrap_or_else(|e| {
        eprintln!("error: {source}: log filter {text:?} does not parse: {e}");
        std::process::exit(2);
    });
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .init();
}
