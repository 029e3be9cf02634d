//! Engram's failures as Python exceptions. The engine's and the model's errors keep the text the
//! `engram` command prints after `error:` (anyhow's chain joined with `: `); a request the engine
//! refuses as malformed is a `ValueError`, as arguments checked here are; everything else is an
//! [`EngramError`] (a `RuntimeError`).

use engram_engine::{JobError, JobErrorKind};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::{create_exception, PyErr};

create_exception!(
    engram,
    EngramError,
    PyRuntimeError,
    "A failure of the engine or the model (loading, the KV budget, a stopped engine), with the message the `engram` command prints."
);

/// An error chain as the CLI prints it (`error: {e:#}`), as an [`EngramError`].
pub fn from_anyhow(e: anyhow::Error) -> PyErr {
    EngramError::new_err(format!("{e:#}"))
}

/// A failed job: a malformed request is a `ValueError`, anything else an [`EngramError`].
pub fn from_job(e: JobError) -> PyErr {
    match e.kind {
        JobErrorKind::BadRequest => PyValueError::new_err(e.message),
        JobErrorKind::NotFound | JobErrorKind::Unavailable | JobErrorKind::Internal => EngramError::new_err(e.message),
    }
}

/// A server-library error (the agent registry's): 4xx but 404 as `ValueError`, the rest as an
/// [`EngramError`], with its message.
pub fn from_api(e: engram_server::ApiError) -> PyErr {
    let status = e.status.as_u16();
    if (400..500).contains(&status) && status != 404 {
        PyValueError::new_err(e.message)
    } else {
        EngramError::new_err(e.message)
    }
}

/// A `ValueError` with `message`.
pub fn value(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}
