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
//! With `--context dual` the chat runs on the dual-stream policy as `engram serve --context
//! dual` does (the same flags): the system prompt and the facts are the user's persistent
//! stream, computed once and shared by every thread; each thread is a ring of whole turns
//! within `--ring-tokens`, its oldest turns evicted; a turn sends only its new message
//! (`engram_dual::turn_tokens`), the facts as segments (`engram_dual::segment_tokens`).
//!
//! Invariant: a thread's prompt is the system prompt, then the live facts in order, then that
//! thread's turns — whatever other threads hold (in dual-stream contexts: the turns its ring
//! still keeps).

use std::collections::HashMap;
use std::io::BufRead;
use std::sync::Arc;

use anyhow::Result;
use engram_dual::{DualControl, FactLimits, FactSegment, FactStore};
use engram_engine::{Job, OwnerKey, PolicyControl};
use engram_model::Model;
use engram_stack::StackConfig;
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
    context: crate::context_args::ContextArgs,
    #[command(flatten)]
    long_context: crate::long_context::LongContextArgs,
}

const HELP: &str = "commands: /fact TEXT, /forget ID, /facts, /thread NAME";

pub fn run(a: Args) -> Result<()> {
    a.long_context.check_context(&a.context.context)?;
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
    let owner_key = OwnerKey::user("default", &a.user);
    let owner = owner_key.to_string();
    let system: Vec<ChatMessage> =
        Some(&a.system).filter(|s| !s.is_empty()).map(|s| ChatMessage::new("system", s.clone())).into_iter().collect();
    let dual = a.context.is_dual();
    let stack = StackConfig {
        context: a.context.mode()?,
        encoder: if dual { relevance_encoder()? } else { None },
        summarizer: a.context.summarizer_model()?,
        masked_turns: a.context.masked_turns()?,
        render_summary: Some(summary_renderer(model.clone())),
        long_context: a.long_context.config(&crate::common::data_dir(&a.model.data_dir))?,
        ..StackConfig::default()
    };
    let engine = crate::engine_run::CliEngine::start_with(model.clone(), pool, stack);
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
        let job = if dual {
            // Only the new message is sent; the anchors and facts reach the policy first.
            let messages: Vec<ChatMessage> = system.iter().chain(history.iter()).cloned().collect();
            let t = engram_dual::turn_tokens(tok, tpl, &messages)?;
            let facts = facts
                .live(&owner)
                .into_iter()
                .map(|f| {
                    let tokens = engram_dual::segment_tokens(tok, &format!("{}{}", engram_dual::FACT_PREFIX, f.text))?;
                    Ok(FactSegment { id: f.id, text: f.text, tokens })
                })
                .collect::<Result<Vec<_>>>()?;
            engine.control(PolicyControl::new(DualControl::Turn {
                user: owner_key.clone(),
                anchors: t.anchors,
                facts: Some(facts),
                state: None,
            }));
            Job { session: Some(current.clone()), ..Job::from_tokens(owner_key.clone(), t.turn, params.clone()) }
        } else {
            let mut messages = system.clone();
            for f in facts.live(&owner) {
                messages.push(ChatMessage::new("system", format!("{}{}", engram_dual::FACT_PREFIX, f.text)));
            }
            messages.extend(history.iter().cloned());
            let text = tpl.render(&messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))?;
            let ids = tok.encode(&text, false)?.ids;
            Job { session: Some(current.clone()), text: Some(text), ..Job::from_tokens(owner_key.clone(), ids, params.clone()) }
        };
        let r = engine.run(job, &mut stdout_sink)?;
        println!();
        let prompt = if dual {
            // The prompt is the new turn alone: the stream and the ring's turns are kept KV.
            format!("{} new prompt tokens over the kept stream and turns", r.prompt_tokens)
        } else {
            format!("{} of {} prompt tokens from cache", r.cached_tokens, r.prompt_tokens)
        };
        eprintln!("[ttft {:.0} ms, {prompt}, {} tokens at {:.1} tok/s]", r.ttft_ms, r.generated, r.decode_tok_s);
        history.push(ChatMessage::new("assistant", r.text));
    }
    Ok(())
}

/// The sentence encoder that ranks dual-stream turns for relevance masks: the one
/// `$ENGRAM_EMBEDDER` names, else the installed one, if any (said on stderr either way).
fn relevance_encoder() -> Result<Option<Arc<dyn engram_embed::TextEncoder>>> {
    match engram_embed::Encoder::discover()? {
        Some(e) => {
            eprintln!("relevance masks: {}", e.describe());
            Ok(Some(Arc::new(e)))
        }
        None => {
            eprintln!(
                "relevance masks: off (no sentence encoder installed, or ${}=none; every kept turn is attended)",
                engram_embed::discover::ENV_VAR
            );
            Ok(None)
        }
    }
}

/// A summary's text as the chat model's persistent-stream segment (as `engram serve` renders it).
fn summary_renderer(model: Arc<Model>) -> engram_dual::RenderSegment {
    Arc::new(move |text: &str| {
        engram_dual::segment_tokens(&model.tokenizer, &format!("{}{text}", engram_dual::SUMMARY_PREFIX)).map_err(|e| e.to_string())
    })
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
