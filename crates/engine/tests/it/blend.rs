//! Selective recomputation (`engram_engine::blend`) against the cold path on the tiny fixture:
//! a chunk prefilled on its own after the system prompt and moved behind another chunk; with
//! ratio 1 the question's logits equal a cold prefill's, with ratio 0 nothing changes (plain
//! moved reuse), tokens not named as moved are never touched, the probe layers of every moved
//! token end up as a cold prefill writes them, and a bad ratio is an error that changes nothing.

use crate::common::{parts, prefill};
use engram_engine::{blend, BlendReport};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

fn model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Model::load(&files.hf_dir).unwrap();
    (dir, m)
}

/// Logits of the last question token after `kv` (which `kv` then holds too).
fn ask(m: &Model, kv: &mut SeqKv, question: &[u32]) -> Vec<f32> {
    kv.reserve(question.len()).unwrap();
    let first = kv.len();
    m.forward(&mut [SeqStep::new(question, first, kv, Logits::Last)]).unwrap().remove(0)
}

fn rows(kv: &SeqKv, layers: usize) -> Vec<(Vec<f32>, Vec<f32>)> {
    (0..layers).map(|l| kv.read_rows(l, 0..kv.len())).collect()
}

/// (cold sequence of sys+A+B, the moved assembly, its tokens, the moved slots).
fn setup(m: &Model, pool: &KvPool) -> (SeqKv, SeqKv, Vec<u32>, std::ops::Range<usize>) {
    let [sys, a, b, _] = parts(m);
    let all: Vec<u32> = [sys.clone(), a.clone(), b.clone()].concat();
    let mut cold = SeqKv::new(pool);
    prefill(m, &mut cold, &all);
    // B alone after the system prompt, at positions sys.len() ..
    let mut sys_kv = SeqKv::new(pool);
    prefill(m, &mut sys_kv, &sys);
    let mut b_alone = sys_kv.fork(sys.len());
    prefill(m, &mut b_alone, &b);
    // sys + A (the exact prefix), then B moved behind A.
    let mut moved = sys_kv.fork(sys.len());
    prefill(m, &mut moved, &a);
    moved.extend_shifted(&b_alone, sys.len()..sys.len() + b.len(), &m.config.rope).unwrap();
    let slots = sys.len() + a.len()..all.len();
    (cold, moved, all, slots)
}

#[test]
fn ratio_one_equals_the_cold_prefill_and_ratio_zero_changes_nothing() {
    let (_d, m) = model();
    let question = parts(&m)[3].clone();
    for format in [KvFormat::F32, KvFormat::F16] {
        let pool = KvPool::new(KvLayout::of(&m.config), format, 64 << 20);
        let (mut cold, moved, tokens, slots) = setup(&m, &pool);
        let want = ask(&m, &mut cold, &question);

        let mut full = moved.fork(moved.len());
        let r = blend(&m, &mut full, &tokens, std::slice::from_ref(&slots), 1.0).unwrap();
        assert_eq!(r, BlendReport { moved_tokens: slots.len(), recomputed_tokens: slots.len(), probed_tokens: 0 });
        assert_eq!(ask(&m, &mut full, &question), want, "{format:?}: ratio 1 must be the full prefill");

        let mut none = moved.fork(moved.len());
        let before = rows(&none, m.config.num_layers);
        let r = blend(&m, &mut none, &tokens, std::slice::from_ref(&slots), 0.0).unwrap();
        assert_eq!(r.recomputed_tokens + r.probed_tokens, 0);
        assert_eq!(rows(&none, m.config.num_layers), before, "{format:?}: ratio 0 is plain moved reuse");
        // Moved reuse without recomputation is an approximation: the logits differ.
        assert_ne!(ask(&m, &mut none, &question), want);
    }
}

/// The embedded pycode-7m (more layers than the tiny fixture's two).
fn pycode() -> Model {
    Model::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf")).unwrap()
}

#[test]
fn partial_ratio_recomputes_only_moved_tokens_and_fixes_the_probe_layers() {
    let m = pycode();
    assert!(m.config.num_layers > engram_engine::blend::PROBE_LAYER + 1, "the fixture needs layers past the probe");
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let (cold, moved, tokens, slots) = setup(&m, &pool);
    let mut kv = moved.fork(moved.len());
    let before = rows(&kv, m.config.num_layers);
    let r = blend(&m, &mut kv, &tokens, std::slice::from_ref(&slots), 0.15).unwrap();
    assert_eq!(r.moved_tokens, slots.len());
    assert_eq!(r.probed_tokens, slots.len());
    assert_eq!(r.recomputed_tokens, (0.15 * slots.len() as f64).ceil() as usize);
    let after = rows(&kv, m.config.num_layers);
    let (want, w) = (rows(&cold, m.config.num_layers), m.config.kv_width());
    for layer in 0..m.config.num_layers {
        for slot in 0..tokens.len() {
            let row = |x: &(Vec<f32>, Vec<f32>)| (x.0[slot * w..(slot + 1) * w].to_vec(), x.1[slot * w..(slot + 1) * w].to_vec());
            if !slots.contains(&slot) {
                assert_eq!(row(&after[layer]), row(&before[layer]), "slot {slot} layer {layer} is not moved: untouched");
            } else if layer <= engram_engine::blend::PROBE_LAYER {
                let ((k, v), (ck, cv)) = (row(&after[layer]), row(&want[layer]));
                let diff = k.iter().chain(&v).zip(ck.iter().chain(&cv)).fold(0f32, |d, (x, y)| d.max((x - y).abs()));
                assert!(diff < 1e-4, "slot {slot} layer {layer}: probe rows {diff} from the cold prefill's");
            }
        }
    }
    // Some deeper-layer rows of moved tokens were recomputed, the rest kept as moved.
    let deep = engram_engine::blend::PROBE_LAYER + 1;
    let changed = slots.clone().filter(|&s| after[deep].0[s * w..(s + 1) * w] != before[deep].0[s * w..(s + 1) * w]).count();
    assert_eq!(changed, r.recomputed_tokens, "exactly the selected tokens get fresh deep rows");
}

#[test]
fn a_bad_ratio_or_range_is_refused_and_changes_nothing() {
    let (_d, m) = model();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F16, 64 << 20);
    let (_cold, moved, tokens, slots) = setup(&m, &pool);
    let mut kv = moved.fork(moved.len());
    let before = rows(&kv, m.config.num_layers);
    for ratio in [-0.1, 1.5, f32::NAN] {
        assert!(blend(&m, &mut kv, &tokens, std::slice::from_ref(&slots), ratio).is_err(), "ratio {ratio}");
    }
    assert!(blend(&m, &mut kv, &tokens, &[slots.start..tokens.len() + 1], 0.5).is_err());
    assert!(blend(&m, &mut kv, &tokens[1..], std::slice::from_ref(&slots), 0.5).is_err());
    assert_eq!(rows(&kv, m.config.num_layers), before);
}
