//! `engram chat`: an interactive conversation. Each turn re-renders the chat
//! template over the whole history and reuses the cached token prefix, so
//! only the new message is prefilled.
//!
//! Dual-stream commands: `/fact TEXT` appends a fact about the user, `/forget ID`
//! tombstones one, `/facts` lists them (tombstones shown), `/thread NAME` switches to another
//! conversation (each thread its own history and cache, so switching back reuses it). Facts
//! are the persistent stream of every thread: system messages (`Fact about the user: ...`,
//! as `engram serve --context dual` renders them) after the system prompt. They are kept by
//! `engram_dual::FactStore` in `<data dir>/kv/facts`, under the owner a server without API
//! keys gives the same `--user`, so they survive a restart and a local server sees them.
//!
//! The turns run through the engine and the policy stack (`engine_run.rs`), each thread a
//! named session of the chat's user: a turn reuses the thread's cached KV exactly (its stats
//! line says how many prompt tokens came from the cache). With `--long-context-after TOKENS` a
//! thread whose history passes the threshold goes sparse (DynaKV over KV offloaded to
//! `<data dir>/long`) and keeps its sparse cache between turns.
//!
//! Invariant: a thread's prompt is the system prompt, then the live facts in order, then that
//! thread's turns — whatever other threads hold.

use std::collections::HashMap;
use std::io::BufRead;

use anyhow::Result;
use engram_dual::{FactLimits, FactStore};
use engram_engine::{Job, OwnerKey};
use engram_tokenizer::ChatMessage;

use crate::common::{kv_pool, load_model, stdout_sink, ModelArgs, SamplingArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// The system prompt; an empty string sends none (the model's chat template may then add
    /// its own). The default is a plain one: small instruct models answer plain questions
    /// better with it (SmolLM2-135M-Instruct, greedy, answers the capital of France only with a
    /// system prompt, in Engram and in llama.cpp alike).
    #[arg(long, default_value = "You are a helpful assistant.")]
    system: String,
    /// Whose facts `/fact` keeps (the OpenAI `user` of `engram serve --context dual`).
    #[arg(long, default_value = "default")]
    user: String,
    #[command(flatten)]
    long_context: crate::long_context::LongContextArgs,
}

const HELP: &str = "commands: /fact TEXT, /forget ID, /facts, /thread NAME";

pub fn run(a: Args) -> Result<()> {
    let _lock = crate::data_lock::lock_data_dir(&crate::common::data_dir(&a.model.data_dir), "chat")?;
    let mut model_args = a.model.clone();
    if model_args.model.is_none() {
        model_args.model = Some(crate::chat_model::default_chat_model(&crate::common::data_dir(&a.model.data_dir))?);
    }
    let model = std::sync::Arc::new(load_model(&model_args)?);
    let pool = kv_pool(&model, &model_args)?;
    let tok = &model.tokenizer;
    let tpl = tok.chat_template().ok_or_else(|| anyhow::anyhow!("the model has no chat template; use `engram generate`"))?;
    if !valid_name(&a.user) {
        anyhow::bail!("--user {:?}: letters, digits, '_', '-', '.', ':' only, at most 128", a.user);
    }
    let facts = FactStore::open(&crate::cache_cmd::store_dir(&a.model.data_dir).join("facts"), FactLimits::default());
    let owner = format!("default\u{1f}user:{}", a.user);
    let system: Vec<ChatMessage> =
        Some(&a.system).filter(|s| !s.is_empty()).map(|s| ChatMessage::new("system", s.clone())).into_iter().collect();
    let long = a.long_context.config(&crate::common::data_dir(&a.model.data_dir))?;
    let engine = crate::engine_run::CliEngine::start(model.clone(), pool, long);
    let mut threads: HashMap<String, Vec<ChatMessage>> = HashMap::new();
    let mut current = "default".to_string();
    let params = a.sampling.params();
    eprintln!("type a message and press enter; an empty line or Ctrl-D ends the chat; {HELP}");
    let stdin = std::io::stdin();
    loop {
        eprint!("[{current}]> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if let Some(command) = line.strip_prefix('/') {
            if let Err(e) = run_command(command, &facts, &owner, &mut current, &threads) {
                eprintln!("error: {e}");
            }
            continue;
        }
        let history = threads.entry(current.clone()).or_default();
        history.push(ChatMessage::new("user", line));
        let mut messages = system.clone();
        for f in facts.live(&owner) {
            messages.push(ChatMessage::new("system", format!("{}{}", engram_server::FACT_PREFIX, f.text)));
        }
        messages.extend(history.iter().cloned());
        let text = tpl.render(&messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))?;
        let ids = tok.encode(&text, false)?.ids;
        let job = Job {
            session: Some(current.clone()),
            text: Some(text),
            ..Job::from_tokens(OwnerKey::from(owner.as_str()), ids, params.clone())
        };
        let r = engine.run(job, &mut stdout_sink)?;
        println!();
        eprintln!(
            "[ttft {:.0} ms, {} of {} prompt tokens from cache, {} tokens at {:.1} tok/s]",
            r.ttft_ms, r.cached_tokens, r.prompt_tokens, r.generated, r.decode_tok_s
        );
        history.push(ChatMessage::new("assistant", r.text));
    }
    Ok(())
}

/// Runs one `/command`; an error is printed and the chat goes on.
fn run_command<T>(command: &str, facts: &FactStore, owner: &str, current: &mut String, threads: &HashMap<String, T>) -> Result<()> {
    let (name, rest) = command.split_once(' ').map_or((command, ""), |(n, r)| (n, r.trim()));
    match name {
        "fact" => {
            let f = facts.append(owner, rest, None, |_| {})?;
            println!("fact {} added", f.id);
        }
        "forget" => {
            let id: u64 = rest.parse().map_err(|_| anyhow::anyhow!("/forget wants a fact id (a number), got {rest:?}"))?;
            facts.tombstone(owner, id, |_| {})?;
            println!("fact {id} tombstoned");
        }
        "facts" => {
            let all = facts.list(owner).unwrap_or_default();
            if all.is_empty() {
                println!("no facts");
            }
            for f in all {
                match (f.tombstoned, f.replaced_by) {
                    (false, _) => println!("{:>4}  {}", f.id, f.text),
                    (true, Some(by)) => println!("{:>4}  [tombstoned, replaced by {by}] {}", f.id, f.text),
                    (true, None) => println!("{:>4}  [tombstoned] {}", f.id, f.text),
                }
            }
        }
        "thread" => {
            if !valid_name(rest) {
                anyhow::bail!("/thread wants a name of letters, digits, '_', '-', '.', ':' (at most 128), got {rest:?}");
            }
            *current = rest.to_string();
            let known = if threads.contains_key(rest) { "back to" } else { "new" };
            println!("{known} thread {rest}");
        }
        _ => anyhow::bail!("unknown command /{name}; {HELP}"),
    }
    Ok(())
}

/// A user or thread name as the server accepts it (`api::check_id`).
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
        && !s.contains("..")
        && s != "."
}
