//! ringccl's errors, raised in Python as torch's `DistBackendError` (a `RuntimeError`),
//! carrying ringccl's message: rank, peer, operation, and what to do.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyType;

/// torch's `DistBackendError`, or `RuntimeError` where this torch has none.
fn backend_error_class(py: Python<'_>) -> Bound<'_, PyType> {
    py.import("torch.distributed")
        .and_then(|m| m.getattr("DistBackendError"))
        .and_then(|c| c.cast_into::<PyType>().map_err(PyErr::from))
        .unwrap_or_else(|_| py.get_type::<PyRuntimeError>())
}

/// `message` as the exception torch's own backends raise when a collective fails.
pub(crate) fn backend_error(py: Python<'_>, message: String) -> PyErr {
    PyErr::from_type(backend_error_class(py), message)
}

/// A ringccl error as a Python exception: bad arguments as `ValueError`, every other
/// failure as `DistBackendError`.
pub(crate) fn to_py(py: Python<'_>, error: ringccl::Error) -> PyErr {
    match error {
        ringccl::Error::InvalidArgument(_) => PyValueError::new_err(error.to_string()),
        other => backend_error(py, other.to_string()),
    }
}
