//! What the server serves, for discovery (`/v1/models`, Ollama's `/api/tags`, `/api/show`,
//! `/api/ps`): the LLM and, when one is configured, the text encoder `/v1/embeddings`
//! serves, each with its kind and context length.
//!
//! Invariant: every id listed here is one its route accepts as `model` (the LLM's on the
//! generation routes, [`api::check_model`]; the encoder's on the embedding routes,
//! `embeddings::check_model`), so a client that lists models and asks for one is never
//! answered 404.

use crate::{api, AppState};

/// What a served model does.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    /// Generates text (the chat and completion routes).
    Llm,
    /// Turns text into vectors (the embedding routes).
    Embedding,
}

impl Kind {
    /// The name responses use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Kind::Llm => "llm",
            Kind::Embedding => "embedding",
        }
    }
}

/// One served model.
pub(crate) struct Served {
    pub id: String,
    pub kind: Kind,
    /// The most tokens one request may hold (the LLM's positions; the encoder's truncation
    /// limit); `None` where the encoder does not say.
    pub context_length: Option<usize>,
    /// Floats per vector (embedding models only).
    pub dimensions: Option<usize>,
}

/// Every model the server serves: the LLM first, then the encoder when configured.
pub(crate) fn served(s: &AppState) -> Vec<Served> {
    let mut out = vec![Served {
        id: s.config.model_id.clone(),
        kind: Kind::Llm,
        context_length: Some(s.model.config.max_positions),
        dimensions: None,
    }];
    if let Some(enc) = &s.config.embedder {
        out.push(Served { id: enc.id().to_string(), kind: Kind::Embedding, context_length: enc.max_tokens(), dimensions: Some(enc.dim()) });
    }
    out
}

/// The served model `name` is, by its id or one of its aliases; `None` if neither serves it.
pub(crate) fn find(s: &AppState, name: &str) -> Option<Served> {
    let llm = api::model_ids(s).iter().any(|id| id == name);
    let enc = s.config.embedder.as_ref().is_some_and(|e| crate::embeddings::names(e.as_ref(), name));
    served(s).into_iter().find(|m| match m.kind {
        Kind::Llm => llm,
        Kind::Embedding => enc && !llm,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use engram_embed::TextEncoder;

    #[test]
    fn both_encoders_state_their_limit() {
        let dir = tempfile::tempdir().unwrap();
        engram_embed::fixture::write_tiny(dir.path()).unwrap();
        let enc = engram_embed::Encoder::load(dir.path()).unwrap();
        assert_eq!(TextEncoder::max_tokens(&enc), Some(enc.max_tokens()));

        let files = engram_fixture::generate(
            engram_fixture::Shape::Tiny,
            engram_fixture::DEFAULT_SEED,
            dir.path(),
            &[engram_fixture::GgufFormat::Q8_0],
            &mut |_| {},
        )
        .unwrap();
        let model = Arc::new(engram_model::Model::load(files.gguf(engram_fixture::GgufFormat::Q8_0).unwrap()).unwrap());
        let pooled = engram_engine::PooledEncoder::new(model, "tiny");
        assert_eq!(pooled.max_tokens(), Some(engram_engine::pooled::MAX_TEXT_TOKENS));
    }
}
