//! The benchmarks of the `engram` command, `engram bench <name> …`: one module per subcommand,
//! each printing a table or JSON lines. The binary parses `bench`'s subcommands into
//! [`BenchCommand`] and hands it to [`run`].
//!
//! **Invariant:** [`run`] is called by the `engram` binary. `cache` and `dual-persist` re-run
//! the current executable as `engram bench <name> …` to measure in a fresh process, so the
//! executable must dispatch `bench` to this crate.
//!
//! Shared by several benchmarks: `shared.rs` (bandwidth probe, page-cache eviction),
//! `timed_sink.rs` (event times on the engine thread), `fidelity/` (the scoring harness
//! `cache`, `blend` and `sparse` reuse).

mod attention;
mod background;
mod blend;
mod cache;
mod context;
mod dialogue;
mod dual_disk;
mod dual_persist;
mod engine_thread;
mod facts;
mod facts_stall;
mod fidelity;
mod grammar;
mod kernels;
mod membw;
mod rag;
mod relevance;
mod remote;
mod save_stall;
mod scenario;
mod serve;
mod shared;
mod sparse;
mod speculation;
mod speed;
mod step;
mod timed_sink;

// NOTE: the command line's shared options (`--model`, threads, KV format, the data
// directory) live in `engram-cli-common`; named `common` here, as in the CLI.
use engram_cli_common as common;

/// `engram bench`'s subcommands, one per benchmark; the doc line of each is its help text.
#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode tokens/s (512-token prompt, 128 decoded tokens).
    Speed(speed::Args),
    /// Memory read bandwidth with 1..N threads (stream read and real GEMVs), the bound on decode.
    Membw(membw::Args),
    /// Every matmul kernel variant per weight format: ns per row-token at several tokens per
    /// call, and the one a loaded model runs.
    Kernels(kernels::Args),
    /// Attention alone over a ring-like KV cache at two depths, side by side (ms per step, GB/s).
    Attention(attention::Args),
    /// Time to first token: cold vs hot vs warm (restored from disk), shared prefixes, KV formats.
    Cache(cache::Args),
    /// What each approximation (q8/q4 KV, bf16 attention, eviction, chunk reuse) costs vs the exact path.
    Fidelity(fidelity::Args),
    /// Aggregate decode tokens/s with 1, 2, 4, 8 concurrent sessions through the server's scheduler.
    Serve(serve::Args),
    /// What one model step costs by the rows it computes (N sessions' tokens, or N drafts of one), against a one-row step.
    Step(step::Args),
    /// Relevance ranking (ROC AUC, precision/recall) of a sentence encoder or the LLM's pooled hidden states.
    Relevance(relevance::Args),
    /// Constrained decoding's cost: decode tokens/s under a JSON schema vs free, and the token mask alone per token, at 1 and 8 sequences.
    Grammar(grammar::Args),
    /// Decode speed with speculative decoding (prompt lookup) vs without, on code-editing prompts.
    Speculation(speculation::Args),
    /// Dual-stream contexts vs the full history: KV bytes and decode speed over a long conversation, threads.
    Context(context::Args),
    /// Long multi-topic conversations: answers about early turns with the full history vs the dual-stream ring unmasked, masked (masked turns in RAM and on disk) and evicted.
    Dialogue(dialogue::Args),
    /// A user's persistent stream shared by 8 threads (a copy each, forks in RAM, one mapped file): RSS, restore vs prefill.
    DualPersist(dual_persist::Args),
    /// A user's facts in the dual-stream contexts: a turn after a fact, the summary's swap and its stall.
    Facts(facts::Args),
    /// A multi-agent scenario end to end: agents' caches as working memory vs re-prefilling every prompt.
    Scenario(scenario::Args),
    /// Personal RAG: naive vs chunk KV tree vs QA bank vs both, on a seeded synthetic corpus.
    Rag(rag::Args),
    /// RAG chunk KV moved to new positions with CacheBlend recomputation: KL, top-1 and prefill time vs the full prefill.
    Blend(blend::Args),
    /// Sparse attention over clustered KV (DynaKV) vs exact and the baselines: quality and decode speed.
    Sparse(sparse::Args),
    /// A long session continued on another replica: restored from the remote tier (Redis) vs
    /// local disk vs recomputed, TTFT and bytes; restore throughput vs redis-benchmark.
    Remote(remote::Args),
    /// How long the engine waits on the disk store while a long session is saved (lock held vs staged save).
    SaveStall(save_stall::Args),
    /// Requests' inter-token latency and throughput beside low-priority background work, per --background-share.
    Background(background::Args),
}

/// Runs the benchmark `cmd` names; its results go to stdout, progress to stderr.
pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Speed(a) => speed::run(a),
        BenchCommand::Background(a) => background::run(a),
        BenchCommand::Cache(a) => cache::run(a),
        BenchCommand::Membw(a) => membw::run(a),
        BenchCommand::Kernels(a) => kernels::run(a),
        BenchCommand::Attention(a) => attention::run(a),
        BenchCommand::Serve(a) => serve::run(a),
        BenchCommand::Step(a) => step::run(a),
        BenchCommand::Relevance(a) => relevance::run(a),
        BenchCommand::Fidelity(a) => fidelity::run(a),
        BenchCommand::Speculation(a) => speculation::run(a),
        BenchCommand::Grammar(a) => grammar::run(a),
        BenchCommand::Context(a) => context::run(a),
        BenchCommand::Dialogue(a) => dialogue::run(a),
        BenchCommand::DualPersist(a) => dual_persist::run(a),
        BenchCommand::Facts(a) => facts::run(a),
        BenchCommand::Scenario(a) => scenario::run(a),
        BenchCommand::Rag(a) => rag::run(a),
        BenchCommand::Blend(a) => blend::run(a),
        BenchCommand::Sparse(a) => sparse::run(a),
        BenchCommand::SaveStall(a) => save_stall::run(a),
        BenchCommand::Remote(a) => remote::run(a),
    }
}
