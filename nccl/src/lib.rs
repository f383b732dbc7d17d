//! ringccl's `"nccl"` backend: NVIDIA NCCL through cudarc, loaded at run time. It sits
//! beside the CPU engine, not inside a transport: NCCL moves its own bytes, and this
//! crate only shares the group runner (`ringccl-collectives`), the rendezvous
//! (`ringccl-rendezvous`) and the liveness probe of the TCP connections
//! (`ringccl-transports`).
//!
//! Builds everywhere; on a machine without libcuda, libnccl or a GPU,
//! [`NcclBackend::probe`] and [`NcclBackend::connect`] return an error that says what is
//! missing and how to provide it.
//!
//! - [`NcclConfig`]: what joining needs (the mesh's settings, the device).
//! - [`DeviceError`]: the device layer's errors.
//! - `probe`: can NCCL run here (libraries, devices, version)?
//! - `startup`: rendezvous, the unique id, joining the communicator.
//! - `engine`: the communicator running host-buffer calls for the group runner; teardown.
//! - `poller`: one call's enqueue and its deadline- and liveness-bounded wait.
//! - `in_flight`: stream-ordered calls the caller does not wait for, watched against
//!   their deadlines (a state machine, tested in memory).
//! - `staging`: device memory host buffers pass through.
//! - `backend`: `NcclBackend`, and collectives on device buffers.
//! - [`StreamOrder`]: what a device call waits for on the GPU, and what waits for it.
//! - `ffi`: every raw NCCL call (the only unsafe code here).

#![deny(unsafe_code)]

mod backend;
mod config;
mod engine;
mod error;
mod ffi;
mod in_flight;
mod libraries;
mod poller;
mod probe;
mod staging;
mod startup;
mod stream_order;

pub use backend::{DeviceElement, NcclBackend};
pub use config::NcclConfig;
pub use engine::{NcclEngine, TEARDOWN_LIMIT};
pub use error::DeviceError;
pub use probe::cuda_device_count;
pub use stream_order::StreamOrder;

/// Re-export of `cudarc` (the CUDA driver and NCCL binding), whose `CudaSlice<T>` the
/// device-buffer methods take.
pub use cudarc;
