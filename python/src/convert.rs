//! JSON values ↔ Python objects: responses are built as `serde_json` values (the shapes the
//! HTTP routes send) and handed to Python as dicts and lists; `response_format` and messages
//! come the other way.
//!
//! Invariant: `to_py(from_py(x)) == x` for any JSON-shaped `x` (dicts with str keys, lists,
//! tuples read as lists, str, int, float, bool, None); anything else is a `TypeError` naming its type.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::IntoPyObjectExt;
use serde_json::{Map, Number, Value};

/// `v` as Python objects: objects as dicts, arrays as lists.
pub fn to_py(py: Python<'_>, v: &Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Null => py.None(),
        Value::Bool(b) => b.into_py_any(py)?,
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.into_py_any(py)?,
            (None, Some(u)) => u.into_py_any(py)?,
            _ => n.as_f64().unwrap_or(f64::NAN).into_py_any(py)?,
        },
        Value::String(s) => s.into_py_any(py)?,
        Value::Array(a) => {
            let list = PyList::empty(py);
            for x in a {
                list.append(to_py(py, x)?)?;
            }
            list.into_py_any(py)?
        }
        Value::Object(o) => {
            let dict = PyDict::new(py);
            for (k, x) in o {
                dict.set_item(k, to_py(py, x)?)?;
            }
            dict.into_py_any(py)?
        }
    })
}

/// A JSON-shaped Python object as a value; `what` names it in errors.
pub fn from_py(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if obj.is_instance_of::<PyBool>() {
        return Ok(Value::Bool(obj.extract()?));
    }
    if obj.is_instance_of::<PyInt>() {
        return Ok(Value::Number(Number::from(obj.extract::<i64>()?)));
    }
    if obj.is_instance_of::<PyFloat>() {
        let f: f64 = obj.extract()?;
        return Number::from_f64(f).map(Value::Number).ok_or_else(|| PyTypeError::new_err(format!("{what}: {f} is not a JSON number")));
    }
    if obj.is_instance_of::<PyString>() {
        return Ok(Value::String(obj.extract()?));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut m = Map::new();
        for (k, x) in d.iter() {
            let key: String = k.extract().map_err(|_| PyTypeError::new_err(format!("{what}: dict keys must be str")))?;
            let v = from_py(&x, what)?;
            m.insert(key, v);
        }
        return Ok(Value::Object(m));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        let mut a = Vec::new();
        for x in obj.try_iter()? {
            a.push(from_py(&x?, what)?);
        }
        return Ok(Value::Array(a));
    }
    Err(PyTypeError::new_err(format!("{what}: {} is not JSON (dict, list, str, int, float, bool or None)", type_name(obj))))
}

/// The Python type name of `obj`, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "object".into())
}
