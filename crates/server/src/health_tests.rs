//! `/health` reflects a dead engine thread. The engine is a stand-in that
//! panics at once (`EngineHandle::spawn`), behind the real health handler.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use engram_fixture::{GgufFormat, Shape};
use engram_model::Model;

use crate::{agent_registry, health, EngineHandle, Metrics, ServerConfig, Shared};

fn health_of(engine: EngineHandle) -> (StatusCode, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(files.gguf(GgufFormat::Q8_0).unwrap()).unwrap());
    let metrics = engine.metrics.clone();
    let state = Arc::new(Shared {
        model,
        config: ServerConfig::new("tiny"),
        engine,
        metrics,
        agents: agent_registry::Agents::in_memory(),
        rag: None,
        facts: None,
        grammars: Default::default(),
    });
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let r = rt.block_on(health(State(state)));
    let status = r.status();
    let body = rt.block_on(axum::body::to_bytes(r.into_body(), 1 << 16)).unwrap();
    (status, serde_json::from_slice(&body).unwrap())
}

#[test]
fn health_reports_a_dead_engine() {
    let (engine, thread) = EngineHandle::spawn(4, 4, Arc::new(Metrics::default()), |_, _rx| panic!("injected engine fault"));
    assert!(thread.join().is_err());
    let (status, body) = health_of(engine);
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "engine_down");
    assert_eq!(body["model"], "tiny");
}

#[test]
fn health_is_ok_while_the_engine_runs() {
    let (engine, thread) = EngineHandle::spawn(4, 4, Arc::new(Metrics::default()), |_, rx| while rx.recv().is_ok() {});
    let (status, body) = health_of(engine);
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "ok");
    thread.join().unwrap();
}
