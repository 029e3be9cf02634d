//! Saved sparse states (`SparseKv::save_state` / `resume_state`): a state saved mid-conversation
//! and resumed by a fresh cache decodes the next tokens with the logits the saved cache gives
//! bit for bit (offloaded after a bounded prefill, with flushes and splits; or all in RAM);
//! damaged, truncated, foreign, other-model, other-owner and other-configuration states are
//! errors naming the file and what failed, and leave no live file behind.

use std::path::Path;

use crate::common;
use common::{decode, model, prefill, tokens};

use engram_model::{Logits, Model, SeqStep};
use engram_sparse::{Method, OffloadConfig, SparseConfig, SparseKv, StateError, StateMeta};

fn offload_cfg(dir: &Path, model: &Model) -> OffloadConfig {
    OffloadConfig { ram_budget: 0, flush: 8, cache_bytes: 16 << 10, ..OffloadConfig::new(dir.to_path_buf(), model.fingerprint.0) }
}

fn meta(ids: &[u32]) -> StateMeta {
    StateMeta { fingerprint: "tiny-f16".into(), owner: "alice".into(), tokens: ids.to_vec() }
}

const CFG: SparseConfig = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 96, sinks: 4, recent: 16 };

/// A cache over `prompt` streamed to a file in `live`, then `turn` decoded one by one.
fn offloaded(model: &Model, live: &Path, prompt: &[u32], turn: &[u32]) -> SparseKv {
    let mut kv = SparseKv::new(&model.config, Some(CFG));
    kv.offload_streaming(offload_cfg(live, model)).unwrap();
    prefill(model, &mut kv, prompt);
    decode(model, &mut kv, turn);
    kv
}

fn files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn a_resumed_state_gives_the_saved_cache_s_next_logits_bitwise() {
    let (_d, model) = model();
    let ids = tokens(760);
    let (prompt, rest) = ids.split_at(560);
    let (turn, next) = rest.split_at(100);
    let live = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("conv");

    let mut kv = offloaded(&model, live.path(), prompt, turn);
    assert!(kv.is_offloaded());
    assert!(kv.index_stats().splits > 0, "the decoded turn split clusters: {:?}", kv.index_stats());
    let saved = kv.save_state(&dir, &meta(&ids[..660])).unwrap();
    assert!(saved > 0);
    // Saving again replaces the pair: one state file, one KV file.
    kv.save_state(&dir, &meta(&ids[..660])).unwrap();
    assert_eq!(files(&dir), 2, "{:?}", std::fs::read_dir(&dir).unwrap().collect::<Vec<_>>());
    // The saving cache keeps decoding (appending to the file the state links).
    let want = decode(&model, &mut kv, next);
    drop(kv);
    assert_eq!(files(live.path()), 0, "the live file goes with its cache");

    let (mut back, m) = SparseKv::resume_state(&dir, &model.config, CFG, &meta(&[]), Some(offload_cfg(live.path(), &model))).unwrap();
    assert_eq!(m, meta(&ids[..660]));
    assert_eq!(back.len(), 660);
    assert!(back.is_offloaded());
    assert!(back.ram_kv_bytes() < back.kv_bytes() / 2);
    let got = decode(&model, &mut back, next);
    assert_eq!(got, want, "resumed logits differ from the saved cache's");
    // A second resume of the same state answers the same (the first one's appends went to
    // its own file).
    let (mut again, _) = SparseKv::resume_state(&dir, &model.config, CFG, &meta(&[]), Some(offload_cfg(live.path(), &model))).unwrap();
    assert_eq!(decode(&model, &mut again, next), want);
    drop((back, again));
    assert_eq!(files(live.path()), 0);

    // A multi-token turn after the resume (the next prompt) too.
    let (mut back, _) = SparseKv::resume_state(&dir, &model.config, CFG, &meta(&[]), Some(offload_cfg(live.path(), &model))).unwrap();
    let mut kv = offloaded(&model, live.path(), prompt, turn);
    for kv in [&mut kv, &mut back] {
        kv.reserve(40);
        let slot = kv.len();
        model.forward(&mut [SeqStep::new(&next[..40], slot, kv, Logits::None)]).unwrap();
    }
    assert_eq!(decode(&model, &mut back, &next[40..]), decode(&model, &mut kv, &next[40..]));
}

#[test]
fn a_state_kept_in_ram_resumes_bitwise() {
    let (_d, model) = model();
    let ids = tokens(500);
    let (prompt, rest) = ids.split_at(400);
    let (turn, next) = rest.split_at(40);
    let state = tempfile::tempdir().unwrap();
    for method in [CFG.method, Method::Quest { page: 16 }, Method::Local { window: 32, k: 4 }, Method::Tokens] {
        let cfg = SparseConfig { method, ..CFG };
        let mut kv = SparseKv::new(&model.config, Some(cfg));
        prefill(&model, &mut kv, prompt);
        decode(&model, &mut kv, turn);
        let dir = state.path().join(method.name());
        kv.save_state(&dir, &meta(&ids[..440])).unwrap();
        let want = decode(&model, &mut kv, next);
        let (mut back, _) = SparseKv::resume_state(&dir, &model.config, cfg, &meta(&[]), None).unwrap();
        assert!(!back.is_offloaded());
        assert_eq!(decode(&model, &mut back, next), want, "{}: resumed logits differ", method.name());
    }
}

/// Resumes `dir` expecting an error whose text holds `what` (and names a file under `dir`);
/// nothing is left in `live`.
fn refused(model: &Model, dir: &Path, live: &Path, cfg: SparseConfig, expect: &StateMeta, what: &str) -> StateError {
    let e = match SparseKv::resume_state(dir, &model.config, cfg, expect, Some(offload_cfg(live, model))) {
        Ok(_) => panic!("{what}: resumed"),
        Err(e) => e,
    };
    let text = e.to_string();
    assert!(text.contains(what), "{what}: {text}");
    assert!(text.contains(&dir.display().to_string()), "the error names the file: {text}");
    assert_eq!(files(live), 0, "{what}: a live file was left behind");
    e
}

#[test]
fn bad_truncated_foreign_and_other_model_states_are_refused_with_the_reason() {
    let (_d, model) = model();
    let ids = tokens(660);
    let (prompt, turn) = ids.split_at(560);
    let live = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("conv");
    let kv = offloaded(&model, live.path(), prompt, turn);
    kv.save_state(&dir, &meta(&ids)).unwrap();
    drop(kv);
    let state_file = dir.join("state");
    let kv_file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_str().unwrap().starts_with("kv-"))
        .unwrap();
    let good_state = std::fs::read(&state_file).unwrap();
    let good_kv = std::fs::read(&kv_file).unwrap();
    let restore = || {
        std::fs::write(&state_file, &good_state).unwrap();
        std::fs::write(&kv_file, &good_kv).unwrap();
    };
    let m = meta(&[]);

    // Identity and configuration: sound files, another conversation's or model's.
    let e = refused(&model, &dir, live.path(), CFG, &StateMeta { fingerprint: "other-f16".into(), ..m.clone() }, "model fingerprint");
    assert!(matches!(e, StateError::Mismatch { .. }) && !e.is_corrupt());
    refused(&model, &dir, live.path(), CFG, &StateMeta { owner: "bob".into(), ..m.clone() }, "owner");
    refused(&model, &dir, live.path(), SparseConfig { budget: 64, ..CFG }, &m, "sparse configuration");
    let other = OffloadConfig { model_fingerprint: model.fingerprint.0 ^ 1, ..offload_cfg(live.path(), &model) };
    let e = SparseKv::resume_state(&dir, &model.config, CFG, &m, Some(other)).err().unwrap();
    assert!(e.to_string().contains("offload model fingerprint"), "{e}");
    let e = SparseKv::resume_state(&dir, &model.config, CFG, &m, None).err().unwrap();
    assert!(e.to_string().contains("needs an offload directory"), "{e}");

    // The state file: damaged, truncated, foreign, another version.
    let mut flipped = good_state.clone();
    let at = flipped.len() - 100;
    flipped[at] ^= 1;
    std::fs::write(&state_file, &flipped).unwrap();
    assert!(refused(&model, &dir, live.path(), CFG, &m, "checksum mismatch").is_corrupt());
    std::fs::write(&state_file, &good_state[..good_state.len() / 2]).unwrap();
    assert!(refused(&model, &dir, live.path(), CFG, &m, "truncated").is_corrupt());
    std::fs::write(&state_file, b"{\"not\": \"a state\"}\n").unwrap();
    assert!(refused(&model, &dir, live.path(), CFG, &m, "not a DynaKV state").is_corrupt());
    let v2 = String::from_utf8_lossy(&good_state[..64]).replacen(" v1 ", " v2 ", 1);
    let mut newer = v2.into_bytes();
    newer.extend_from_slice(&good_state[64..]);
    std::fs::write(&state_file, &newer).unwrap();
    refused(&model, &dir, live.path(), CFG, &m, "format version");
    restore();

    // The KV file: damaged rows, truncated, missing, a header of another shape.
    let mut bad = good_kv.clone();
    let at = bad.len() - 10;
    bad[at] ^= 0x40;
    std::fs::write(&kv_file, &bad).unwrap();
    assert!(refused(&model, &dir, live.path(), CFG, &m, "KV rows checksum mismatch").is_corrupt());
    std::fs::write(&kv_file, &good_kv[..good_kv.len() - 4096]).unwrap();
    assert!(refused(&model, &dir, live.path(), CFG, &m, "truncated").is_corrupt());
    std::fs::write(&kv_file, &good_kv[..100]).unwrap();
    assert!(refused(&model, &dir, live.path(), CFG, &m, "header").is_corrupt());
    std::fs::remove_file(&kv_file).unwrap();
    assert!(matches!(refused(&model, &dir, live.path(), CFG, &m, "no saved sparse state"), StateError::NotFound { .. }));
    restore();

    // An offload directory that is not there: an I/O error naming it, not a missing state.
    let gone = OffloadConfig { dir: live.path().join("gone"), ..offload_cfg(live.path(), &model) };
    let e = SparseKv::resume_state(&dir, &model.config, CFG, &m, Some(gone)).err().unwrap();
    assert!(matches!(e, StateError::Io { .. }) && e.to_string().contains("gone"), "{e}");

    // Sound again: resumes.
    SparseKv::resume_state(&dir, &model.config, CFG, &m, Some(offload_cfg(live.path(), &model))).unwrap();
    // No state at all.
    let e = SparseKv::resume_state(&state.path().join("none"), &model.config, CFG, &m, None).err().unwrap();
    assert!(matches!(e, StateError::NotFound { .. }), "{e}");
}

#[test]
fn a_cache_without_its_index_or_with_the_wrong_tokens_is_not_saved() {
    let (_d, model) = model();
    let ids = tokens(300);
    let state = tempfile::tempdir().unwrap();
    let mut kv = SparseKv::new(&model.config, Some(CFG));
    kv.reserve(ids.len());
    model.forward(&mut [SeqStep::new(&ids, 0, &mut kv, Logits::None)]).unwrap();
    let e = kv.save_state(state.path(), &meta(&ids)).unwrap_err();
    assert!(e.to_string().contains("not built"), "{e}");
    kv.build_index();
    let e = kv.save_state(state.path(), &meta(&ids[..10])).unwrap_err();
    assert!(e.to_string().contains("10 tokens named for 300"), "{e}");
    assert_eq!(files(state.path()), 0);
    let exact = SparseKv::new(&model.config, None);
    assert!(exact.save_state(state.path(), &meta(&[])).is_err());
}
