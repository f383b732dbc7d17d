//! The native half of the `ringccl` Python package: ringccl's process groups, driven
//! from the `torch.distributed` backend that `ringccl/_backend.py` defines.
//!
//! The contract with the Python half: it hands over contiguous CPU tensors as
//! `(address, bytes)` pairs with an element-type code, and keeps each tensor alive until
//! the call that uses it has finished (a synchronous call returns; an asynchronous one
//! calls its completion callback). Everything else is checked here.
//!
//! - `store`: start-up through torch's c10d store ([`ringccl::Store`] over a Python
//!   object), so torch's rendezvous is the only one.
//! - `group`: `Group`, one ringccl process group; every collective with the GIL
//!   released, synchronous on the calling thread or queued on the group's worker.
//! - `completion`: an asynchronous call's end, reported to the Python half's callback.
//! - `memory`: the one place raw tensor memory becomes Rust slices.
//! - `errors`: ringccl's errors as torch's `DistBackendError`.

#![deny(unsafe_code)]

mod completion;
mod errors;
mod group;
mod memory;
mod store;

use pyo3::prelude::*;

/// The `ringccl._ringccl` module.
#[pymodule]
fn _ringccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<group::Group>()?;
    m.add_function(wrap_pyfunction!(group::init_group, m)?)?;
    m.add_function(wrap_pyfunction!(group::dtype_codes, m)?)?;
    Ok(())
}
