//! `engram`: the command-line entry point. Each subcommand lives in its own
//! module; this file only parses arguments and dispatches.

mod api_keys;
mod bench_attention;
mod bench_blend;
mod bench_cache;
mod bench_context;
mod bench_dual_disk;
mod bench_dual_persist;
mod bench_facts;
mod bench_facts_stall;
mod bench_membw;
mod bench_rag;
mod bench_relevance;
mod bench_save_stall;
mod bench_scenario;
mod bench_serve;
mod bench_sparse;
mod bench_speculation;
mod bench_speed;
mod cache_cmd;
mod chat;
mod chat_model;
mod common;
mod convert_cmd;
mod data_lock;
mod fidelity;
mod fixture_cmd;
mod generate;
mod generate_sparse;
mod rag_cmd;
mod scenario_cmd;
mod serve;
mod timed_sink;

use clap::{Parser, Subcommand};

/// Engram: an on-device LLM runtime that never prefills the same context twice.
#[derive(Parser)]
#[command(name = "engram", version, about)]
struct Cli {
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
    /// Convert a Llama-family Hugging Face folder to a GGUF file (f32, f16, bf16, q8_0, q4_0).
    Convert(convert_cmd::Args),
    /// Persisted KV cache entries: ls, inspect, rm, pin, unpin, gc.
    Cache(cache_cmd::Args),
    /// Multi-agent scenarios (YAML phases, each agent's cache its working memory): run, validate.
    Scenario(scenario_cmd::Args),
    /// Personal RAG (seed 003): ingest documents, query them, ls, rm, stats.
    Rag(rag_cmd::Args),
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        which: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Prefill and decode tokens/s (512-token prompt, 128 decoded tokens).
    Speed(bench_speed::Args),
    /// Memory read bandwidth with 1..N threads (stream read and real GEMVs), the bound on decode.
    Membw(bench_membw::Args),
    /// Attention alone over a ring-like KV cache at two depths, side by side (ms per step, GB/s).
    Attention(bench_attention::Args),
    /// Time to first token: cold vs hot vs warm (restored from disk), shared prefixes, KV formats.
    Cache(bench_cache::Args),
    /// What each approximation (q8/q4 KV, bf16 attention, eviction, chunk reuse) costs vs the exact path.
    Fidelity(fidelity::Args),
    /// Aggregate decode tokens/s with 1, 2, 4, 8 concurrent sessions through the server's scheduler.
    Serve(serve::BenchArgs),
    /// Relevance ranking (ROC AUC, precision/recall) of a sentence encoder or the LLM's pooled hidden states.
    Relevance(bench_relevance::Args),
    /// Decode speed with speculative decoding (prompt lookup) vs without, on code-editing prompts.
    Speculation(bench_speculation::Args),
    /// Dual-stream contexts vs the full history: KV bytes and decode speed over a long conversation, threads.
    Context(bench_context::Args),
    /// A user's persistent stream shared by 8 threads (a copy each, forks in RAM, one mapped file): RSS, restore vs prefill.
    DualPersist(bench_dual_persist::Args),
    /// A user's facts in the dual-stream contexts: a turn after a fact, the summary's swap and its stall.
    Facts(bench_facts::Args),
    /// A multi-agent scenario end to end: agents' caches as working memory vs re-prefilling every prompt.
    Scenario(bench_scenario::Args),
    /// Personal RAG: naive vs chunk KV tree vs QA bank vs both, on a seeded synthetic corpus.
    Rag(bench_rag::Args),
    /// RAG chunk KV moved to new positions with CacheBlend recomputation: KL, top-1 and prefill time vs the full prefill.
    Blend(bench_blend::Args),
    /// Sparse attention over clustered KV (DynaKV, seed 002) vs exact and the baselines: quality and decode speed.
    Sparse(bench_sparse::Args),
    /// How long the engine waits on the disk store while a long session is saved (lock held vs staged save).
    SaveStall(bench_save_stall::Args),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("ENGRAM_LOG").unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
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
        Command::Bench { which: BenchCommand::Speed(a) } => bench_speed::run(a),
        Command::Bench { which: BenchCommand::Cache(a) } => bench_cache::run(a),
        Command::Bench { which: BenchCommand::Membw(a) } => bench_membw::run(a),
        Command::Bench { which: BenchCommand::Attention(a) } => bench_attention::run(a),
        Command::Bench { which: BenchCommand::Serve(a) } => serve::bench(a),
        Command::Bench { which: BenchCommand::Relevance(a) } => bench_relevance::run(a),
        Command::Bench { which: BenchCommand::Fidelity(a) } => fidelity::run(a),
        Command::Bench { which: BenchCommand::Speculation(a) } => bench_speculation::run(a),
        Command::Bench { which: BenchCommand::Context(a) } => bench_context::run(a),
        Command::Bench { which: BenchCommand::DualPersist(a) } => bench_dual_persist::run(a),
        Command::Bench { which: BenchCommand::Facts(a) } => bench_facts::run(a),
        Command::Bench { which: BenchCommand::Scenario(a) } => bench_scenario::run(a),
        Command::Bench { which: BenchCommand::Rag(a) } => bench_rag::run(a),
        Command::Bench { which: BenchCommand::Blend(a) } => bench_blend::run(a),
        Command::Bench { which: BenchCommand::Sparse(a) } => bench_sparse::run(a),
        Command::Bench { which: BenchCommand::SaveStall(a) } => bench_save_stall::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
