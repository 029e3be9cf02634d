//! `engram generate`: one prompt in, the generated text out on stdout
//! (streamed), statistics on stderr.

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
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
}

pub fn run(a: Args) -> Result<()> {
    let model = load_model(&a.model)?;
    let pool = kv_pool(&model, &a.model)?;
    let tok = &model.tokenizer;
    let ids = if a.chat {
        let tpl = tok.chat_template().ok_or_else(|| anyhow::anyhow!("the model has no chat template; drop --chat"))?;
        let text = tpl.render(
            &[ChatMessage { role: "user".into(), content: a.prompt.clone() }],
            true,
            tok.bos_token().unwrap_or(""),
            tok.eos_token().unwrap_or(""),
        )?;
        tok.encode(&text, false)?.ids
    } else {
        tok.encode(&a.prompt, true)?.ids
    };
    let mut gen = Generator::new(&model, &pool);
    let out = gen.generate(&ids, &a.sampling.params(), &mut stdout_sink)?;
    println!();
    let t = &out.timings;
    eprintln!(
        "prompt {} tokens, prefill {:.1} tok/s, ttft {:.0} ms; generated {} tokens, decode {:.1} tok/s; finish: {}",
        t.prompt_tokens,
        t.prefill_tok_s(),
        t.ttft_ms,
        t.decode_tokens,
        t.decode_tok_s(),
        out.finish.as_str()
    );
    Ok(())
}
