//! Ollama's model listing: `GET /api/tags` (what is served), `POST /api/show` (one
//! model's details, `model_info` and `capabilities`), `GET /api/ps` (what is loaded: all
//! of it, always), `GET /api/version`. Each lists the LLM and, when configured, the text
//! encoder (`catalog.rs`).
//!
//! Invariant: nothing here names a file system path (a client has no business learning
//! them). `digest` is the LLM's fingerprint (the encoder's: a hash of its id), `size` the
//! LLM's weights' bytes (the encoder's is not known: `null`).

use std::time::SystemTime;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use engram_model::Model;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{untagged, OllamaError};
use crate::catalog::{self, Kind, Served};
use crate::error::ApiError;
use crate::{api, AppState};

/// `GET /api/tags`.
pub async fn tags(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, OllamaError> {
    api::tenant(&s, &headers)?;
    let models: Vec<Value> = catalog::served(&s).iter().map(|m| entry(&s, m)).collect();
    Ok(axum::Json(json!({"models": models})).into_response())
}

/// `GET /api/ps`: every served model is loaded and stays loaded (`expires_at` is as far
/// off as Ollama reports for `keep_alive: -1`); nothing is in GPU memory.
pub async fn ps(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, OllamaError> {
    api::tenant(&s, &headers)?;
    let never = Utc::now().checked_add_signed(chrono::TimeDelta::nanoseconds(i64::MAX)).unwrap_or(DateTime::<Utc>::MAX_UTC);
    let models: Vec<Value> = catalog::served(&s)
        .iter()
        .map(|m| {
            let mut e = entry(&s, m);
            e["expires_at"] = json!(never.to_rfc3339_opts(chrono::SecondsFormat::Secs, true));
            e["size_vram"] = json!(0);
            e["context_length"] = json!(m.context_length);
            e
        })
        .collect();
    Ok(axum::Json(json!({"models": models})).into_response())
}

/// `GET /api/version`: this server's version.
pub async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// Any other `/api/` route (`pull`, `push`, `create`, `copy`, `delete`, …): a 404 in
/// Ollama's shape saying what this server does instead.
pub async fn not_found(State(s): State<AppState>, req: axum::extract::Request) -> OllamaError {
    ApiError::not_found(format!(
        "no route for {} {}: this server serves the models it was started with ({}) and does not pull, push, create, copy or delete models",
        req.method(),
        req.uri().path(),
        catalog::served(&s).iter().map(|m| m.id.as_str()).collect::<Vec<_>>().join(", ")
    ))
    .into()
}

#[derive(Deserialize)]
struct ShowRequest {
    model: Option<String>,
    /// Older clients' spelling of `model`.
    name: Option<String>,
}

/// `POST /api/show`.
pub async fn show(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, OllamaError> {
    api::tenant(&s, &headers)?;
    let req: ShowRequest = super::parse(&body)?;
    let Some(name) = req.model.or(req.name) else {
        return Err(ApiError::bad_param("model", "model is required").into());
    };
    let Some(m) = catalog::find(&s, untagged(&name)) else {
        return Err(ApiError::unknown_model(format!(
            "model {name:?} not found; this server serves {}",
            catalog::served(&s).iter().map(|m| format!("{:?}", m.id)).collect::<Vec<_>>().join(", ")
        ))
        .into());
    };
    let d = details(&s, &m);
    let family = d["family"].as_str().unwrap_or("").to_string();
    let mut info = serde_json::Map::new();
    info.insert("general.architecture".into(), json!(family));
    info.insert(format!("{family}.context_length"), json!(m.context_length));
    let (template, capabilities) = match m.kind {
        Kind::Llm => {
            let c = &s.model.config;
            info.insert("general.parameter_count".into(), json!(num_parameters(&s.model)));
            info.insert(format!("{family}.embedding_length"), json!(c.hidden));
            info.insert(format!("{family}.block_count"), json!(c.num_layers));
            info.insert(format!("{family}.attention.head_count"), json!(c.num_heads));
            info.insert(format!("{family}.attention.head_count_kv"), json!(c.num_kv_heads));
            info.insert(format!("{family}.vocab_size"), json!(c.vocab));
            let template = s.model.tokenizer.chat_template().map(|t| t.source().to_string()).unwrap_or_default();
            (template, json!(["completion"]))
        }
        Kind::Embedding => {
            info.insert(format!("{family}.embedding_length"), json!(m.dimensions));
            (String::new(), json!(["embedding"]))
        }
    };
    let body = json!({
        "modelfile": "", "parameters": "", "template": template, "license": "",
        "details": d, "model_info": info, "capabilities": capabilities,
        "modified_at": modified_at(&s, &m),
    });
    Ok(axum::Json(body).into_response())
}

/// One model as `/api/tags` lists it.
fn entry(s: &AppState, m: &Served) -> Value {
    let llm = m.kind == Kind::Llm;
    json!({
        "name": m.id, "model": m.id,
        "modified_at": modified_at(s, m),
        "size": if llm { Some(s.model.weights.num_bytes()) } else { None },
        "digest": if llm { s.model.fingerprint.to_string() } else { blake3::hash(m.id.as_bytes()).to_hex()[..16].to_string() },
        "details": details(s, m),
        "kind": m.kind.as_str(),
    })
}

/// Whether the encoder is the LLM's own pooled hidden states (`engram_engine::PooledEncoder`).
fn pooled(s: &AppState, m: &Served) -> bool {
    m.id == format!("{}:{}", s.config.model_id, engram_engine::pooled::POOLED_SUFFIX)
}

/// Ollama's `details`: file format, architecture family, size and quantization.
fn details(s: &AppState, m: &Served) -> Value {
    if m.kind == Kind::Llm || pooled(s, m) {
        let family = s.model.config.arch.name();
        let format = if s.model.source.starts_with("gguf:") { "gguf" } else { "safetensors" };
        return json!({
            "parent_model": "", "format": format, "family": family, "families": [family],
            "parameter_size": parameter_size(num_parameters(&s.model)),
            "quantization_level": s.model.weights.main_dtype().name().to_uppercase(),
        });
    }
    // NOTE: the sentence encoders engram_embed loads are BERTs in safetensors.
    json!({"parent_model": "", "format": "safetensors", "family": "bert", "families": ["bert"],
           "parameter_size": "", "quantization_level": "F32"})
}

/// When the LLM's file last changed (the encoder's is not known: the time this process
/// first listed a model stands in, as for an LLM whose file cannot be read).
fn modified_at(s: &AppState, m: &Served) -> String {
    let file = (m.kind == Kind::Llm).then(|| s.model.source.split_once(':').map(|(_, p)| p.to_string())).flatten();
    let t = file.and_then(|p| std::fs::metadata(p).and_then(|md| md.modified()).ok()).unwrap_or_else(started);
    DateTime::<Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// When this process first listed a model.
fn started() -> SystemTime {
    static T: std::sync::OnceLock<SystemTime> = std::sync::OnceLock::new();
    *T.get_or_init(SystemTime::now)
}

/// The weights' parameter count: every matrix (a tied output once) and the norms.
fn num_parameters(m: &Model) -> usize {
    let w = &m.weights;
    let size = |x: &engram_model::Weight| x.rows * x.cols;
    let layers: usize = w.layers.iter().map(|l| l.matrices().into_iter().map(size).sum::<usize>()).sum();
    let output = if m.config.tied_embeddings { 0 } else { size(&w.output) };
    let norms = m.config.hidden * (2 * m.config.num_layers + 1);
    size(&w.embed) + layers + output + norms
}

/// Ollama's size label: `135M`, `1.2B`.
fn parameter_size(n: usize) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{}M", (n as f64 / 1e6).round()),
        n if n >= 1_000 => format!("{}K", (n as f64 / 1e3).round()),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::parameter_size;

    #[test]
    fn sizes_read_as_ollama_writes_them() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(1_235_814_400), "1.2B");
        assert_eq!(parameter_size(52_000), "52K");
    }
}
