//! What the context crate's integration tests share: the `tiny` fixture model, made once per
//! test binary.

use std::sync::OnceLock;

use engram_fixture::{GgufFormat, Shape};
use engram_model::Model;

/// The `tiny` fixture (default seed), loaded from its HF folder.
pub fn model() -> &'static Model {
    static M: OnceLock<(tempfile::TempDir, Model)> = OnceLock::new();
    &M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let f = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
        let m = Model::load(&f.hf_dir).unwrap();
        (dir, m)
    })
    .1
}
