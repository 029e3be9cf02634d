//! The harness against itself on the `tiny` fixture: rows that drop or change nothing equal the
//! exact path; attention mass falls with the budget; chunk reuse through moved keys equals the
//! same chunks computed where they end up; bad row names are clear errors.

use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{KeyMask, Logits, Model, SeqStep};

use super::measure::Scores;
use super::rows::{self, Row};

fn model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Model::load(&files.hf_dir).unwrap();
    (dir, model)
}

fn window(model: &Model, len: usize) -> Vec<u32> {
    let ids = model.tokenizer.encode(engram_tokenizer::FIXTURE_CORPUS, true).unwrap().ids;
    assert!(ids.len() >= len, "the fixture corpus has {} tokens", ids.len());
    ids[..len].to_vec()
}

fn one(s: &str) -> Row {
    let mut r = Row::parse(s).unwrap();
    assert_eq!(r.len(), 1);
    r.remove(0)
}

#[test]
fn rows_that_drop_nothing_equal_the_exact_path_and_keep_all_the_mass() {
    let (_dir, model) = model();
    let ids = window(&model, 200);
    let (context, scored) = ids.split_at(180);
    let rows = [one("f32"), one("window:1000"), one("chunks:1000"), one("turns:1000"), one("turns-nosink:1000")];
    let (exact_kv, exact, mass) = super::exact_path(&model, context, scored, &rows).unwrap();
    assert_eq!(mass.len(), 1, "one row drops keys");
    assert!((mass[0].0 / mass[0].1 as f64 - 1.0).abs() < 1e-9, "a budget past the context keeps every key: {mass:?}");
    for row in rows {
        let logits = row.run(&model, &exact_kv, context, scored).unwrap();
        let s = Scores::compare(&exact, &logits, model.config.vocab, &[]);
        // Turns computed on the ring's view (spans) are the exact path to float rounding.
        assert!(s.mean_kl() < 1e-9 && s.max_rel_err < 1e-4, "{}: KL {} err {}", row.name(), s.mean_kl(), s.max_rel_err);
    }
}

#[test]
fn a_smaller_budget_keeps_less_of_the_attention_mass() {
    let (_dir, model) = model();
    let ids = window(&model, 300);
    let (context, scored) = ids.split_at(284);
    let rows = [one("window:16"), one("window:64"), one("window:256")];
    let (exact_kv, exact, mass) = super::exact_path(&model, context, scored, &rows).unwrap();
    let means: Vec<f64> = mass.iter().map(|(s, n)| s / *n as f64).collect();
    assert!(means[0] < means[1] && means[1] < means[2] && means[2] <= 1.0 + 1e-9, "{means:?}");
    // The masked decode really drops keys: the tightest budget changes the output.
    let logits = rows[0].run(&model, &exact_kv, context, scored).unwrap();
    assert!(Scores::compare(&exact, &logits, model.config.vocab, &[]).mean_kl() > 1e-6);
}

#[test]
fn chunk_reuse_through_moved_keys_equals_the_chunks_computed_in_place() {
    let (_dir, model) = model();
    let ids = window(&model, 150);
    let (context, scored) = ids.split_at(140);
    let chunk = 48;
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1 << 30);
    // Each chunk at its final positions, seeing only itself (a key mask): no move involved.
    let mut kv = SeqKv::new(&pool);
    for (i, part) in context.chunks(chunk).enumerate() {
        let first = i * chunk;
        let mask = (first > 0).then(|| KeyMask::none(part.len(), first));
        kv.reserve(part.len()).unwrap();
        let step = SeqStep { tokens: part, first_pos: first, positions: None, key_mask: mask.as_ref(), kv: &mut kv, logits: Logits::None };
        model.forward(&mut [step]).unwrap();
    }
    let in_place = rows::score(&model, &mut kv, scored, &|_| None, &[]).unwrap().0;
    let moved = one(&format!("chunks:{chunk}")).run(&model, &SeqKv::new(&pool), context, scored).unwrap();
    let s = Scores::compare(&in_place, &moved, model.config.vocab, &[]);
    assert!(s.max_rel_err < 1e-4, "moved chunks vs computed in place: {}", s.max_rel_err);
    // And it is an approximation: the exact path differs.
    let (_, exact, _) = super::exact_path(&model, context, scored, &[]).unwrap();
    assert!(Scores::compare(&exact, &moved, model.config.vocab, &[]).mean_kl() > 1e-6);
}

#[test]
fn a_ring_smaller_than_the_context_forgets_whole_turns_and_costs_something() {
    let (_dir, model) = model();
    let ids = window(&model, 300);
    let (context, scored) = ids.split_at(284);
    let (_, exact, _) = super::exact_path(&model, context, scored, &[]).unwrap();
    let small =
        one("turns:64").run(&model, &SeqKv::new(&KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1)), context, scored).unwrap();
    assert!(Scores::compare(&exact, &small, model.config.vocab, &[]).mean_kl() > 1e-6, "forgetting turns changes the output");
}

#[test]
fn row_names_parse_and_bad_ones_say_what_is_expected() {
    assert_eq!(Row::parse("sim").unwrap().len(), 5);
    for name in
        ["f32", "f16", "q8", "q4", "q8+bf16", "window:1024", "chunks:512", "turns:1536", "turns-nosink:512", "kivi4", "q4-no-window"]
    {
        assert_eq!(one(name).name(), name);
    }
    for (bad, says) in [("q5", "unknown row"), ("window:4", "exceed"), ("window:x", "number"), ("chunks:0", "at least 1")] {
        let e = Row::parse(bad).unwrap_err().to_string();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
