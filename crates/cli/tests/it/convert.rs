//! `engram convert` end to end, through the binary: the tiny fixtures' HF
//! folders converted to GGUF hold the fixtures' own GGUF tensors bit for bit
//! and the same metadata; f32/f16 conversions give the HF folder's logits;
//! bad input fails with an error that names the problem and writes nothing.
//! And the embedded default model: written once into the data directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use engram_engine::LoneSequence;
use engram_fixture::{FixtureFiles, GgufFormat, Shape};
use engram_gguf::{GgufFile, Value};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const PROMPT: &str = "The persistent stream holds immutable system prompts — and a café's 日本語 menu.";

/// The fixture of `shape` (HF folder + F16/Q8_0/Q4_0 GGUF), generated once per shape.
fn fixture(shape: Shape) -> &'static FixtureFiles {
    static TINY: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    static QWEN2: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    static QWEN3: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    static PHI3: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    static GEMMA3: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    static GEMMA2: OnceLock<(tempfile::TempDir, FixtureFiles)> = OnceLock::new();
    let cell = match shape {
        Shape::Tiny => &TINY,
        Shape::TinyQwen2 => &QWEN2,
        Shape::TinyQwen3 => &QWEN3,
        Shape::TinyPhi3 => &PHI3,
        Shape::TinyGemma3 => &GEMMA3,
        Shape::TinyGemma2 => &GEMMA2,
        other => panic!("no fixture cell for {other:?}"),
    };
    &cell
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let files =
                engram_fixture::generate(shape, engram_fixture::DEFAULT_SEED, dir.path(), &GgufFormat::DEFAULT, &mut |_| {}).unwrap();
            (dir, files)
        })
        .1
}

fn engram(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_engram")).args(args).output().expect("run engram")
}

/// Runs `engram convert` on `hf` into `dir/<name>`; asserts success.
fn convert(hf: &Path, format: &str, dir: &Path) -> PathBuf {
    let out = dir.join(format!("converted-{format}.gguf"));
    let run = engram(&["convert", "--model", hf.to_str().unwrap(), "--out", out.to_str().unwrap(), "--format", format]);
    assert!(run.status.success(), "convert failed: {}", String::from_utf8_lossy(&run.stderr));
    assert_eq!(String::from_utf8_lossy(&run.stdout).trim(), out.to_str().unwrap(), "stdout names the file");
    out
}

fn logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1 << 28);
    LoneSequence::new(model, &pool).score(ids).unwrap()
}

/// max |a - b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Metadata keys where a converted fixture folder may differ from the
/// fixture's GGUF: the model's name, and the padding id (the fixture writes
/// EOS there, but its HF folder names no pad token, so conversion writes none).
const MAY_DIFFER: [&str; 2] = ["general.name", "tokenizer.ggml.padding_token_id"];

#[test]
fn converted_fixture_folders_hold_the_fixture_gguf_tensors_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for shape in [Shape::Tiny, Shape::TinyQwen2, Shape::TinyQwen3, Shape::TinyPhi3, Shape::TinyGemma3, Shape::TinyGemma2] {
        let files = fixture(shape);
        for format in GgufFormat::DEFAULT {
            let ours = GgufFile::open(&convert(&files.hf_dir, format.name(), dir.path())).unwrap();
            let theirs = GgufFile::open(files.gguf(format).unwrap()).unwrap();
            let (a, b) = (ours.header(), theirs.header());
            let names = |h: &engram_gguf::Gguf| h.tensors.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
            assert_eq!(names(a), names(b), "{shape:?} {format:?}: tensor order");
            for (x, y) in a.tensors.iter().zip(&b.tensors) {
                assert_eq!((&x.dims, x.ggml_type), (&y.dims, y.ggml_type), "{shape:?} {format:?}: {}", x.name);
                assert!(ours.tensor_data(x) == theirs.tensor_data(y), "{shape:?} {format:?}: {} bytes differ", x.name);
            }
            let meta = |h: &engram_gguf::Gguf| -> Vec<(String, Value)> {
                let mut m: Vec<_> = h.metadata.iter().filter(|(k, _)| !MAY_DIFFER.contains(&k.as_str())).cloned().collect();
                m.sort_by(|p, q| p.0.cmp(&q.0));
                m
            };
            assert!(meta(a) == meta(b), "{shape:?} {format:?}: metadata differs");
        }
    }
}

#[test]
fn converted_f32_and_f16_give_the_hf_folders_logits() {
    let dir = tempfile::tempdir().unwrap();
    let hf = Model::load(&fixture(Shape::Tiny).hf_dir).unwrap();
    let ids = hf.tokenizer.encode(PROMPT, true).unwrap().ids;
    let reference = logits(&hf, &ids);
    // f32: the same weights, q/k rows permuted and rotated as adjacent pairs;
    // only the order of the head_dim sums differs. f16: the fixtures' own bound.
    for (format, tol) in [("f32", 1e-5), ("f16", 5e-3), ("bf16", 3e-2)] {
        let m = Model::load(&convert(&fixture(Shape::Tiny).hf_dir, format, dir.path())).unwrap();
        assert_eq!(m.tokenizer.encode(PROMPT, true).unwrap().ids, ids, "{format}: tokenizer");
        assert_eq!(m.tokenizer.stop_ids(), hf.tokenizer.stop_ids(), "{format}: stop ids");
        let err = rel_err(&logits(&m, &ids), &reference);
        eprintln!("{format}: max relative logit error {err:.2e}");
        assert!(err < tol, "{format}: relative error {err} exceeds {tol}");
    }
}

#[test]
fn bad_input_fails_with_a_clear_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let hf = fixture(Shape::Tiny).hf_dir.clone();
    // A copy of the tiny folder with config.json edited.
    let edited = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| -> PathBuf {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in std::fs::read_dir(&hf).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, d.join(f.file_name().unwrap())).unwrap();
        }
        let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("config.json")).unwrap()).unwrap();
        edit(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
        d
    };
    let gpt_neox = edited("neox", &|c| c["model_type"] = "gpt_neox".into());
    let yarn = edited("yarn", &|c| c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0}));
    let wide = edited("wide", &|c| c["hidden_size"] = 96.into());
    let no_weights = edited("no-weights", &|_| {});
    std::fs::remove_file(no_weights.join("model.safetensors")).unwrap();
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let cases: [(Vec<String>, &str); 7] = [
        (vec![s(&dir.path().join("nowhere")), "f16".into()], "is not a folder"),
        (vec![s(dir.path()), "f16".into()], "config.json is missing"),
        (vec![s(&gpt_neox), "f16".into()], "model_type \"gpt_neox\" is not supported"),
        (vec![s(&yarn), "f16".into()], "rope scaling \"yarn\" is not supported"),
        (vec![s(&wide), "f16".into()], "has shape [2048, 64], config.json implies [2048, 96]"),
        (vec![s(&no_weights), "f16".into()], "no model.safetensors"),
        (vec![s(&hf), "q5_1".into()], "unknown format \"q5_1\""),
    ];
    for (args, want) in cases {
        let run = engram(&["convert", "--model", &args[0], "--out", out.to_str().unwrap(), "--format", &args[1]]);
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: expected \"{want}\" in: {err}");
        assert!(!out.exists(), "{args:?} left a file");
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

/// Without `--model`, `generate` writes the embedded pycode-7m GGUF into the
/// data directory once (the very bytes of `models/pycode-7m`), reuses it
/// after, and answers `def parse_args(` as `engram chat` would (the chat
/// template around it) with Python: a parameter list closed and a `:`.
#[test]
fn default_model_is_the_embedded_pycode_gguf_written_once() {
    let data = tempfile::tempdir().unwrap();
    let run = || {
        engram(&["generate", "--chat", "--prompt", "def parse_args(", "--max-tokens", "24", "--data-dir", data.path().to_str().unwrap()])
    };
    let first = run();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let file = data.path().join("models/pycode-7m-q8_0.gguf");
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf");
    assert!(std::fs::read(&file).unwrap() == std::fs::read(&committed).unwrap(), "the written file is the committed one");
    let written = std::fs::metadata(&file).unwrap().modified().unwrap();
    let second = run();
    assert!(second.status.success());
    assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), written, "reused, not rewritten");
    assert_eq!(first.stdout, second.stdout, "greedy output is deterministic");
    let text = String::from_utf8_lossy(&first.stdout);
    assert!(text.contains(')') && text.contains(':'), "not Python-looking: {text:?}");
    // A damaged copy is replaced.
    std::fs::write(&file, b"not a model").unwrap();
    assert!(run().status.success());
    assert!(std::fs::read(&file).unwrap() == std::fs::read(&committed).unwrap(), "a damaged copy is rewritten");
}
