//! The policy seam hands the scheduler a view, not only a linear cache: a policy that attaches
//! a document's KV (read-only spans of a sequence prefilled once, elsewhere) before a request's
//! own tokens makes the scheduler generate exactly what a cold run over document + prompt
//! generates — batched beside a plain sequence, which is unchanged — and the document's
//! blocks are never written.

use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use crate::common;
use common::Collect;
use engram_context::{Checkout, SessionStore};
use engram_engine::{run_engine, Command, ContextPolicy, LoneSequence, Metrics, Retired, SamplingParams, SchedulerConfig};
use engram_engine::{AdmitRequest, PolicyLayer};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

/// The default policy, except that owner `reader` gets `doc` attached before its prompt.
struct AttachDoc {
    inner: SessionStore,
    pool: KvPool,
    doc: SeqKv,
}

impl PolicyLayer for AttachDoc {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        let mut c = self.inner.admit(req)?;
        if req.owner.as_str() == "reader" {
            c.spans = self.doc.spans(0..self.doc.len());
            c.kv = SeqKv::new(&self.pool);
            c.reused = 0;
        }
        Ok(c)
    }
    fn retire(&mut self, r: Retired) {
        self.inner.retire(r)
    }
}

#[test]
fn a_policy_that_attaches_a_document_generates_what_a_cold_run_over_both_does() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let layout = KvLayout::of(&model.config);
    let pool = KvPool::new(layout, KvFormat::F32, 64 << 20);
    let ids = |t: &str, special: bool| model.tokenizer.encode(t, special).unwrap().ids;
    let doc_ids = ids("Document: the KV cache keeps every turn's keys and values in blocks of 32 tokens, shared between sessions. ", true);
    let prompt = ids("Question: what is shared? Answer:", false);
    let plain = ids("def parse_args(argv):", true);
    let params = SamplingParams { max_tokens: 12, ignore_eos: true, ..Default::default() };

    // The document, prefilled once on its own.
    let mut doc = SeqKv::new(&pool);
    doc.reserve(doc_ids.len()).unwrap();
    model.forward(&mut [SeqStep::new(&doc_ids, 0, &mut doc, Logits::None)]).unwrap();
    let doc_rows: Vec<_> = (0..model.config.num_layers).map(|l| doc.read_rows(l, 0..doc_ids.len())).collect();

    // Cold: document + prompt in one sequence; and the plain prompt.
    let both: Vec<u32> = doc_ids.iter().chain(&prompt).copied().collect();
    let want_reader = LoneSequence::new(&model, &pool).generate(&both, &params, &mut |_| true).unwrap().text;
    let want_plain = LoneSequence::new(&model, &pool).generate(&plain, &params, &mut |_| true).unwrap().text;

    let policy = AttachDoc { inner: SessionStore::new(pool.clone(), model.fingerprint), pool: pool.clone(), doc: doc.fork(doc.len()) };
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    let engine = {
        let (model, pending, pool) = (model.clone(), pending.clone(), pool.clone());
        let config = SchedulerConfig { prefill_chunk: 4, ..SchedulerConfig::default() };
        std::thread::spawn(move || run_engine(&model, pool, config, Box::new(policy), Arc::new(Metrics::default()), pending, rx))
    };
    let sinks = [Collect::default(), Collect::default()];
    for (owner, tokens, sink) in [("reader", &prompt, &sinks[0]), ("plain", &plain, &sinks[1])] {
        pending.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tx.send(Command::Submit(common::job(owner, tokens, &params), Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    engine.join().unwrap();
    let (reader, plain) = (sinks[0].outcome(), sinks[1].outcome());
    assert!(reader.1.is_some() && plain.1.is_some(), "both jobs finished");
    assert_eq!(reader.0, want_reader, "document attached as spans vs a cold run over document + prompt");
    assert_eq!(plain.0, want_plain, "the plain sequence batched beside it");
    for (l, rows) in doc_rows.iter().enumerate() {
        assert!(doc.read_rows(l, 0..doc_ids.len()) == *rows, "layer {l} of the attached document changed");
    }
}
