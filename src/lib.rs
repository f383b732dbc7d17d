//! # ringccl
//!
//! Collective communications for data-parallel training, in Rust: all-reduce,
//! broadcast and barrier across processes and machines, the way `torch.distributed`
//! provides them to PyTorch.
//!
//! ```no_run
//! # fn main() -> Result<(), ringccl::Error> {
//! let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::from_env()?)?;
//! let mut params = vec![0.0f32; 1024];
//! let mut grads = vec![1.0f32; 1024];
//! pg.broadcast(&mut params, 0)?; // rank 0's values everywhere
//! pg.all_reduce(&mut grads, ringccl::ReduceOp::Sum)?;
//! pg.barrier()?;
//! # Ok(())
//! # }
//! ```
//!
//! Backends are picked at run time by name:
//! - `"gloo"`: ringccl's own CPU backend — over shared memory when every rank is on
//!   one host, over TCP otherwise: pipelined ring and recursive-doubling all-reduce,
//!   tree/chain broadcast, dissemination barrier, reduce, all-gather, reduce-scatter,
//!   all-to-all, send/recv, async and bucketed all-reduce.
//! - `"nccl"`: NVIDIA NCCL for GPUs, loaded at run time (cargo feature `nccl`, on by
//!   default). Host buffers are staged through GPU memory; `CudaSlice` buffers go to
//!   NCCL directly through the `*_device` methods, which also work under `"gloo"`
//!   (staged through host memory). Without CUDA, init returns an error saying what is
//!   missing. [`DeviceDdp`] is DDP on gradients in GPU memory (buckets on the device,
//!   reduced by NCCL while backward runs), with element-wise kernels compiled at run
//!   time by NVRTC.
//!
//! Ranks of one group can also live in one process, one per thread:
//! [`local_groups`] connects them in memory (under `"gloo"` with no rendezvous and no
//! sockets; under `"nccl"` one GPU each), with the same guarantees (deadlines, aborts,
//! mismatch detection, bit-identical results).

#![deny(unsafe_code)]

mod async_ops;
mod collectives;
mod ddp_comm;
#[cfg(feature = "nccl")]
mod device;
#[cfg(feature = "nccl")]
mod device_ddp;
mod error;
mod fusion;
mod init;
mod local_groups;
pub mod logging;
mod options;
mod process_group;
mod sequencer;
mod subgroup;
mod trace;
mod work;
mod worker;

pub use error::{Error, Result};
pub use init::{init_process_group, BACKENDS};
pub use local_groups::{local_groups, local_groups_with, run_local_ranks, LocalRankFailure};
pub use options::{InitOptions, TransportKind, DEFAULT_DEAD_PEER_TIMEOUT, DEFAULT_TIMEOUT};
pub use process_group::ProcessGroup;
/// The flight recorder: each group's last calls ([`ProcessGroup::flight_recorder`]), the
/// JSON dumps it writes to `RINGCCL_FLIGHT_DIR` ([`flight::FlightDump`]) and the progress
/// beacon ([`flight::beacon::Beacon`]), and the analysis across ranks behind `ringrun
/// diagnose` ([`flight::diagnose`]). See docs/debugging.md.
pub use ringccl_collectives::flight;
/// The collective runtime's error, as the [`Backend`] trait and the DDP layer's
/// [`ddp::Communicator`] report it; [`Error`] converts from it.
pub use ringccl_collectives::Error as RuntimeError;
pub use ringccl_collectives::{
    half, AllReduceAlgo, Backend, BufferMut, BufferRef, CollectiveKind, DType, Element, HostConfig,
    OpDesc, ReduceOp,
};
pub use ringccl_rendezvous::{AuthToken, SetupError, StoreListener};
pub use ringccl_transports::PeerGone;
pub use work::Work;

/// The timeline: each rank's Chrome trace (`RINGCCL_TRACE=DIR` or
/// [`InitOptions::trace_dir`]), with one span per collective, DDP's buckets and the
/// spans a trainer marks ([`ProcessGroup::trace_span`]). See the user guide's
/// "Timeline" section.
pub use ringccl_collectives::timeline;

/// Data-parallel training: [`ddp::DistributedDataParallel`] averages gradients in
/// buckets while backward runs; [`ddp::DistributedSampler`] splits a dataset between
/// ranks. `ProcessGroup` implements [`ddp::Communicator`]. See docs/ddp.md.
pub use ringccl_ddp as ddp;

#[cfg(feature = "nccl")]
pub use device_ddp::{DeviceCommHook, DeviceDdp, DeviceGrad, DeviceNoSync};
#[cfg(feature = "nccl")]
pub use ringccl_nccl::{
    cuda_device_count, cudarc, DeviceElement, DeviceError, NcclBackend, NcclConfig, StreamOrder,
};

/// The building blocks under the facade, for implementing or testing backends.
pub mod core {
    #[doc(hidden)]
    pub use ringccl_collectives::bucket;
    pub use ringccl_collectives::{
        fusion, schedule, wire, Deadline, Engine, GroupRunner, HostBackend, HostEngine, Readiness,
        Request, Transport,
    };
    pub use ringccl_rendezvous::{connect_mesh, store, Mesh, MeshConfig};
    pub use ringccl_transports::{ShmTransport, TcpTransport};
}

/// The user guide's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/user-guide.md")]
struct UserGuide;
