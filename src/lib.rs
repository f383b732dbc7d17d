//! # ringccl
//!
//! Collective communications for data-parallel training, in Rust: all-reduce,
//! broadcast and barrier across processes and machines, the way `torch.distributed`
//! provides them to PyTorch, and [`ddp::DistributedDataParallel`] on top, torch's DDP
//! for a trainer that owns its own autograd.
//!
//! ## Training with DDP
//!
//! Every rank runs the same loop on its own share of the data; DDP averages the
//! gradients across ranks, bucket by bucket, while backward goes on.
//!
//! ```
//! use ringccl::ddp::{DdpConfig, DistributedDataParallel, DistributedSampler};
//!
//! # fn main() -> Result<(), ringccl::Error> {
//! // Under `ringrun`, `InitOptions::from_env()?` reads RANK, WORLD_SIZE and MASTER_ADDR;
//! // this example is a group of one rank.
//! let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
//!
//! // Fit y = w·x + b to y = 2x + 1.
//! let xs: Vec<f32> = (0..256).map(|i| i as f32 / 256.0).collect();
//! let (mut w, mut b) = ([0.0f32], [0.0f32]);
//! let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 1), ("b", 1)], DdpConfig::default())?;
//! ddp.broadcast_parameters(&mut [&mut w[..], &mut b[..]])?; // every rank starts from rank 0's
//!
//! let sampler = DistributedSampler::new(xs.len(), pg.world_size(), pg.rank())?;
//! for batch in sampler.batches(32)?.take(300) {
//!     // Forward and backward of the mean squared error on this rank's samples.
//!     let n = batch.indices.len() as f32;
//!     let (mut dw, mut db) = (0.0, 0.0);
//!     for &i in &batch.indices {
//!         let error = w[0] * xs[i] + b[0] - (2.0 * xs[i] + 1.0);
//!         dw += 2.0 * error * xs[i] / n;
//!         db += 2.0 * error / n;
//!     }
//!     ddp.mark_grad_ready(1, &[db])?; // as backward produces each gradient
//!     ddp.mark_grad_ready(0, &[dw])?; // a full bucket's all-reduce starts at once
//!     ddp.finish()?; // every bucket averaged over the ranks
//!     w[0] -= 0.3 * ddp.grad(0)?[0];
//!     b[0] -= 0.3 * ddp.grad(1)?[0];
//! }
//! assert!((w[0] - 2.0).abs() < 0.01 && (b[0] - 1.0).abs() < 0.01);
//! # Ok(())
//! # }
//! ```
//!
//! ## A tour
//!
//! - **Process groups**: [`init_process_group`] joins a group and returns its
//!   [`ProcessGroup`]; [`InitOptions::from_env`] reads what `ringrun` (or torchrun) sets.
//!   Backends are picked by name at run time: `"gloo"`, ringccl's own CPU backend (shared
//!   memory when every rank is on one host, TCP otherwise), and `"nccl"`, NVIDIA NCCL,
//!   loaded at run time (cargo feature `nccl`, on by default; without CUDA, init says
//!   what is missing).
//! - **Collectives**: [`ProcessGroup`]'s all-reduce, broadcast, barrier, reduce,
//!   all-gather, reduce-scatter, all-to-all and send/recv, with async forms that return
//!   a [`Work`]. Every call has a deadline; a failure is an [`Error`] that names the rank
//!   and the operation.
//! - **[`ddp`]**: [`ddp::DistributedDataParallel`] and its [`ddp::DdpConfig`],
//!   [`ddp::DistributedSampler`], [`ddp::Checkpoint`], and torch's single-process
//!   [`ddp::DataParallel`].
//! - **[`local_groups`]**: every rank of a group in one process, one thread each (under
//!   `"nccl"`, one GPU each), with the same guarantees: deadlines, aborts, mismatch
//!   detection, bit-identical results.
//! - **GPUs**: `CudaSlice` buffers go to NCCL through the `*_device` methods, and
//!   [`DeviceDdp`] is DDP with its buckets in GPU memory.
//! - **[`flight`] and [`timeline`]**: the flight recorder of each group's last calls
//!   (behind `ringrun diagnose`), and a Chrome trace per rank.
//! - **[`logging`]**: `RINGCCL_DEBUG`, and the `tracing` events the library emits.
//! - **[`core`]**: the building blocks under the facade, for implementing or testing
//!   backends.
//!
//! ```
//! # fn main() -> Result<(), ringccl::Error> {
//! let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
//! let mut grads = vec![1.0f32; 1024];
//! pg.all_reduce(&mut grads, ringccl::ReduceOp::Sum)?; // summed over every rank
//! pg.broadcast(&mut grads, 0)?; // rank 0's values everywhere
//! pg.barrier()?;
//! # Ok(())
//! # }
//! ```

#![deny(unsafe_code)]

mod async_ops;
mod collectives;
mod ddp_comm;
#[cfg(feature = "nccl")]
mod device;
mod error;
mod fusion;
mod fusion_pool;
mod init;
mod local_groups;
pub mod logging;
mod observers;
mod options;
mod origin;
mod process_group;
mod sequencer;
mod shared_buffers;
mod subgroup;
mod trace;
mod work;
mod worker;

pub use error::{Error, Result};
pub use init::{init_process_group, init_process_group_with_store, BACKENDS};
pub use local_groups::{local_groups, local_groups_with, run_local_ranks, LocalRankFailure};
pub use options::{InitOptions, TransportKind, DEFAULT_DEAD_PEER_TIMEOUT, DEFAULT_TIMEOUT};
pub use process_group::ProcessGroup;
/// The collective runtime's error, as the [`Backend`] trait and the DDP layer's
/// [`ddp::Communicator`] report it; [`Error`] converts from it.
pub use ringccl_collectives::Error as RuntimeError;
pub use ringccl_collectives::{
    half, AllReduceAlgo, Backend, BufferMut, BufferRef, Cause, CollectiveKind, DType, Element,
    HostConfig, OpDesc, ReduceOp,
};
/// The flight recorder: each group's last calls ([`ProcessGroup::flight_recorder`]), the
/// JSON dumps it writes to `RINGCCL_FLIGHT_DIR` ([`flight::FlightDump`]) and the progress
/// beacon ([`flight::beacon::Beacon`]), which `ringrun diagnose` (package `ringccl-tools`)
/// reads across ranks. See docs/debugging.md.
pub use ringccl_observe::flight;
pub use ringccl_rendezvous::store::Store;
pub use ringccl_rendezvous::{AuthToken, SetupError, StoreListener};
pub use ringccl_transports::shm::SharedBuffer;
pub use ringccl_transports::PeerGone;
pub use work::Work;

/// The timeline: each rank's Chrome trace (`RINGCCL_TRACE=DIR` or
/// [`InitOptions::trace_dir`]), with one span per collective, DDP's buckets and the
/// spans a trainer marks ([`ProcessGroup::trace_span`]). See the user guide's
/// "Timeline" section.
pub use ringccl_observe::timeline;

/// Data-parallel training, after PyTorch's `DistributedDataParallel`: gradients are
/// grouped into buckets, and each bucket is averaged across ranks as soon as it is
/// complete, while the backward pass goes on. DDP does not own autograd: the trainer
/// tells it when each gradient is ready. See docs/ddp.md for the guide.
///
/// - [`DistributedDataParallel`](ddp::DistributedDataParallel): buckets, ordered async
///   all-reduce, `no_sync` accumulation, unused parameters, the one-time bucket rebuild,
///   communication hooks; configured by [`DdpConfig`](ddp::DdpConfig). Its errors, and
///   which of them make it refuse further use, are [`DdpError`](ddp::DdpError)'s.
/// - [`DistributedSampler`](ddp::DistributedSampler): each rank's share of a dataset,
///   torch's semantics, and [`Batches`](ddp::Batches) of it that resume mid-epoch.
/// - [`Checkpoint`](ddp::Checkpoint): training snapshots written atomically.
/// - [`DataParallel`](ddp::DataParallel): torch's single-process `DataParallel`, one
///   thread per replica.
/// - [`Reducer`](ddp::Reducer) and [`plan_buckets`](ddp::plan_buckets): DDP's
///   bookkeeping without the gradients, shared with [`DeviceDdp`].
///
/// [`ProcessGroup`] implements [`Communicator`](ddp::Communicator), what DDP needs from
/// a group.
///
/// ```
/// use ringccl::ddp::{DdpConfig, DistributedDataParallel, DistributedSampler};
/// # fn main() -> Result<(), ringccl::Error> {
/// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let sampler = DistributedSampler::new(1000, pg.world_size(), pg.rank())?;
/// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 4), ("b", 1)], DdpConfig::default())?;
/// for batch in sampler.batches(32)?.take(3) {
///     let _ = batch.indices; // forward and backward on this rank's samples, then:
///     ddp.mark_grad_ready(1, &[0.5])?;
///     ddp.mark_grad_ready(0, &[1.0; 4])?;
///     ddp.finish()?;
///     assert_eq!(ddp.grad(1)?, [0.5]); // the average over every rank
/// }
/// # Ok(())
/// # }
/// ```
pub mod ddp {
    #[doc(inline)]
    pub use ringccl_ddp::*;
}

#[cfg(feature = "nccl")]
pub use ringccl_ddp::{DeviceCommHook, DeviceDdp, DeviceGrad, DeviceNoSync};
#[cfg(feature = "nccl")]
pub use ringccl_nccl::{
    cuda_device_count, cudarc, DeviceElement, DeviceError, NcclBackend, NcclConfig, StreamOrder,
};

/// The building blocks under the facade, for implementing or testing backends.
pub mod core {
    pub use ringccl_collectives::memory_barrier::OffersMemoryBarrier;
    pub use ringccl_collectives::peer_memory::OffersPeerMemory;
    pub use ringccl_collectives::{
        fusion, schedule, wire, Deadline, Engine, GroupRunner, HostBackend, HostEngine,
        HostTransport, Readiness, Request, Transport,
    };
    pub use ringccl_rendezvous::{connect_mesh, connect_mesh_through, store, Mesh, MeshConfig};
    pub use ringccl_transports::{ShmTransport, TcpTransport};
}

/// The user guide's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/user-guide.md")]
struct UserGuide;
