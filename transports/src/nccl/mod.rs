//! The `"nccl"` backend: NVIDIA NCCL through cudarc, loaded at run time.
//!
//! Builds everywhere; on a machine without libcuda, libnccl or a GPU,
//! [`NcclBackend::probe`] and [`NcclBackend::connect`] return an error that says what is
//! missing and how to provide it. All raw NCCL calls live in `ffi`.

mod backend;
mod ffi;
mod libraries;

pub use backend::{cuda_device_count, DeviceElement, NcclBackend};
