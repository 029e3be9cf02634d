//! `engram chat`: an interactive conversation. Each turn re-renders the chat
//! template over the whole history and reuses the cached token prefix, so
//! only the new message is prefilled.

use std::io::BufRead;

use anyhow::Result;
use engram_engine::Generator;
use engram_tokenizer::ChatMessage;

use crate::common::{kv_pool, load_model, stdout_sink, ModelArgs, SamplingArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    let pool = kv_pool(&model, &a.model)?;
    let tok = &model.tokenizer;
    let tpl = tok.chat_template().ok_or_else(|| anyhow::anyhow!("the model has no chat template; use `engram generate`"))?;
    let mut history: Vec<ChatMessage> = a.system.iter().map(|s| ChatMessage { role: "system".into(), content: s.clone() }).collect();
    let mut gen = Generator::new(&model, &pool);
    let params = a.sampling.params();
    eprintln!("type a message and press enter; an empty line or Ctrl-D ends the chat");
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        history.push(ChatMessage { role: "user".into(), content: line.trim_end_matches(['\n', '\r']).to_string() });
        let text = tpl.render(&history, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))?;
        let ids = tok.encode(&text, false)?.ids;
        let out = gen.generate(&ids, &params, &mut stdout_sink)?;
        println!();
        let t = &out.timings;
        eprintln!(
            "[ttft {:.0} ms, {} of {} prompt tokens from cache, {} tokens at {:.1} tok/s]",
            t.ttft_ms,
            t.cached_tokens,
            t.prompt_tokens,
            t.decode_tokens,
            t.decode_tok_s()
        );
        history.push(ChatMessage { role: "assistant".into(), content: out.text });
    }
    Ok(())
}
