//! Query prediction (PerCache §4.2): likely next questions from the knowledge abstracts and
//! from the user's own query history, by prompt templates, `stride` queries per prediction.
//!
//! ```text
//!  knowledge-based:  topic t (documents that arrived last come first, then by documents
//!                    covering it) × general/detailed templates ("When is the {t}?", …), names
//!                    ("What did {n} write about?") and dates ("What is happening on {d}?")
//!  history-based:    a recent query that names topic t, with t replaced by another topic t'
//!                    (mirrors the user's own wording, PerCache's history prompt)
//!  predict():        history-based first once the user asked something, the rest of the stride
//!                    knowledge-based; never a query issued before (case-insensitive)
//! ```
//! NOTE: PerCache asks the LLM to write the questions from these same two prompts (its
//! appendix B.3); `llm_predict.rs` does that with an instruction-tuned model
//! (`IdleConfig::predictor`), and these templates are its fallback and the predictor for a
//! model that writes no questions (pycode-7m writes Python): the same inputs (abstracts,
//! history, stride), questions in the same two styles (general, detailed).
//!
//! Invariant: the questions are a pure function of the random seed, the abstracts and the queries
//! observed, in order (`tests/it/idle.rs::prediction_is_deterministic`); no question is issued
//! twice; each call returns at most `stride` questions.

use std::collections::{BTreeSet, VecDeque};

use engram_engine::Rng;

use super::abstracts::{find_words, AbstractStore};

/// Default questions per prediction (PerCache's stride).
pub const DEFAULT_STRIDE: usize = 5;

/// General questions about a topic (PerCache's first style).
const GENERAL: &[&str] = &["When is the {t}?", "What is the {t} about?", "Where is the {t}?"];
/// Detailed questions about a topic (PerCache's second style).
const DETAILED: &[&str] =
    &["Who is leading the {t}?", "What should I prepare for the {t}?", "Who is attending the {t}?", "Has the {t} changed?"];
/// About a person named in the documents.
const NAMED: &[&str] = &["What did {n} write about?"];
/// About a date named in the documents.
const DATED: &[&str] = &["What is happening on {d}?"];

/// How prediction runs.
#[derive(Clone, Copy, Debug)]
pub struct PredictConfig {
    /// Questions per prediction.
    pub stride: usize,
    /// Seeds the template order.
    pub seed: u64,
    /// Recent queries kept for history-based prediction.
    pub history: usize,
}

impl Default for PredictConfig {
    fn default() -> Self {
        PredictConfig { stride: DEFAULT_STRIDE, seed: 17, history: 10 }
    }
}

/// Where a predicted question came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Knowledge,
    History,
}

/// Which predictor wrote a question: the model ([`super::llm_predict`]) or the templates here.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum By {
    Llm,
    Template,
}

/// A predicted question.
#[derive(Clone, Debug, PartialEq)]
pub struct Predicted {
    pub query: String,
    pub source: Source,
    pub by: By,
}

/// The predictor. See the module doc.
pub struct Predictor {
    cfg: PredictConfig,
    rng: Rng,
    history: VecDeque<String>,
    issued: BTreeSet<String>,
    /// Topics of documents that arrived after the first prediction, asked about first.
    fresh: Vec<String>,
    /// Template order per round (seeded), fixed at the first prediction.
    order: Vec<String>,
    observed: usize,
}

impl Predictor {
    /// A predictor with no history.
    pub fn new(cfg: PredictConfig) -> Predictor {
        let mut rng = Rng::new(cfg.seed);
        let mut order: Vec<String> = GENERAL.iter().chain(DETAILED).map(|s| s.to_string()).collect();
        // Seeded shuffle of the detailed templates (general ones first: they are the likelier).
        for i in (GENERAL.len() + 1..order.len()).rev() {
            let j = GENERAL.len() + (rng.next_u64() % (i - GENERAL.len() + 1) as u64) as usize;
            order.swap(i, j);
        }
        Predictor {
            cfg: PredictConfig { stride: cfg.stride.max(1), ..cfg },
            rng,
            history: VecDeque::new(),
            issued: BTreeSet::new(),
            fresh: Vec::new(),
            order,
            observed: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &PredictConfig {
        &self.cfg
    }

    /// Records a real query (history-based prediction mirrors it; it is never predicted again).
    pub fn observe(&mut self, query: &str) {
        self.issued.insert(query.trim().to_lowercase());
        self.history.push_back(query.trim().to_string());
        while self.history.len() > self.cfg.history {
            self.history.pop_front();
        }
        self.observed += 1;
    }

    /// Claims `query` for a prediction made elsewhere (the LLM's): `true` if no question
    /// equal to it (case-insensitive) was issued or asked before, and then it never will be.
    pub fn claim(&mut self, query: &str) -> bool {
        self.issued.insert(query.trim().to_lowercase())
    }

    /// The recent real queries kept for history-based prediction, oldest first.
    pub fn recent(&self) -> Vec<String> {
        self.history.iter().cloned().collect()
    }

    /// Real queries observed so far.
    pub fn observed(&self) -> usize {
        self.observed
    }

    /// Marks topics of newly arrived documents: the next predictions ask about them first.
    pub fn note_fresh(&mut self, topics: &[String]) {
        for t in topics {
            if !self.fresh.contains(t) {
                self.fresh.push(t.clone());
            }
        }
    }

    /// Up to `stride` new questions (see the module doc); empty when every template is used.
    pub fn predict(&mut self, abstracts: &AbstractStore) -> Vec<Predicted> {
        let stride = self.cfg.stride;
        let mut out = Vec::new();
        if !self.history.is_empty() {
            out.extend(self.from_history(abstracts, stride));
        }
        let n = stride - out.len();
        out.extend(self.from_knowledge(abstracts, n));
        out
    }

    fn take(&mut self, q: String) -> Option<String> {
        self.issued.insert(q.to_lowercase()).then_some(q)
    }

    /// Knowledge-based: fresh topics first, then every topic, template by template.
    pub fn from_knowledge(&mut self, abstracts: &AbstractStore, n: usize) -> Vec<Predicted> {
        let mut topics: Vec<String> = self.fresh.clone();
        topics.extend(abstracts.topics().into_iter().map(|t| t.phrase).filter(|p| !self.fresh.contains(p)));
        let mut cands: Vec<String> = Vec::new();
        for tpl in &self.order {
            cands.extend(topics.iter().map(|t| tpl.replace("{t}", t)));
        }
        for tpl in NAMED {
            cands.extend(abstracts.names().iter().map(|x| tpl.replace("{n}", x)));
        }
        for tpl in DATED {
            cands.extend(abstracts.dates().iter().map(|x| tpl.replace("{d}", x)));
        }
        let mut out = Vec::new();
        for c in cands {
            if out.len() >= n {
                break;
            }
            if let Some(q) = self.take(c) {
                out.push(Predicted { query: q, source: Source::Knowledge, by: By::Template });
            }
        }
        // A fresh topic stays fresh until its general questions are out.
        let issued = &self.issued;
        self.fresh.retain(|t| GENERAL.iter().any(|g| !issued.contains(&g.replace("{t}", t).to_lowercase())));
        out
    }

    /// History-based: the latest queries naming a topic, that topic swapped for others
    /// (fresh ones first, then the rest in a seeded rotation).
    pub fn from_history(&mut self, abstracts: &AbstractStore, n: usize) -> Vec<Predicted> {
        let mut topics: Vec<String> = abstracts.topics().into_iter().map(|t| t.phrase).collect();
        if topics.len() > 1 {
            let k = (self.rng.next_u64() % topics.len() as u64) as usize;
            topics.rotate_left(k);
        }
        for f in self.fresh.iter().rev() {
            if let Some(i) = topics.iter().position(|t| t == f) {
                let t = topics.remove(i);
                topics.insert(0, t);
            }
        }
        let recent: Vec<String> = self.history.iter().rev().cloned().collect();
        let mut out = Vec::new();
        for q in recent {
            // The longest topic the query names.
            let Some((at, own)) = topics.iter().filter_map(|t| find_words(&q, t).map(|at| (at, t.clone()))).max_by_key(|(_, t)| t.len())
            else {
                continue;
            };
            for t in &topics {
                if out.len() >= n {
                    return out;
                }
                if *t == own {
                    continue;
                }
                let cand = format!("{}{}{}", &q[..at], t, &q[at + own.len()..]);
                if let Some(c) = self.take(cand) {
                    out.push(Predicted { query: c, source: Source::History, by: By::Template });
                }
            }
        }
        out
    }
}
