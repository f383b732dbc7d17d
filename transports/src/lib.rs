//! ringccl's byte movers: the rendezvous store and the TCP mesh transport that the
//! `"gloo"` backend runs its schedules over.
//!
//! Transports know nothing about collectives; they connect ranks and move bytes. Most
//! users want the `ringccl` crate, which re-exports what matters from here.

#![deny(unsafe_code)]

mod auth;
mod deadline_io;
#[cfg(feature = "nccl")]
mod nccl;
mod options;
mod peer_hello;
mod poll;
mod rendezvous;
mod shm;
pub mod store;
mod tcp;

pub use auth::AuthToken;
#[cfg(feature = "nccl")]
pub use nccl::{cuda_device_count, DeviceElement, NcclBackend};
pub use options::{
    first_slurm_host, InitOptions, TransportKind, DEFAULT_DEAD_PEER_TIMEOUT, DEFAULT_TIMEOUT,
};
pub use rendezvous::connect_mesh;
pub use shm::{ShmTransport, DEFAULT_RING_BYTES};
pub use store::StoreListener;
pub use tcp::TcpTransport;

/// Re-export of `cudarc` (the CUDA driver and NCCL binding), whose `CudaSlice<T>` the
/// device-buffer methods take.
#[cfg(feature = "nccl")]
pub use cudarc;
