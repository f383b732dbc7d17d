//! The backend-neutral core of [ringccl](https://docs.rs/ringccl): element types and
//! reduction operators, reduction kernels, collective schedules as pure data, the frame
//! header, the [`Backend`] trait, the [`GroupRunner`] every backend shares, and the
//! [`HostEngine`], which runs the schedules over any [`Transport`].
//!
//! Most users want the `ringccl` crate, which re-exports what matters from here.

#![deny(unsafe_code)]

mod algorithm;
mod backend;
mod buffer;
mod call_desc;
pub mod control;
mod deadline;
mod doorbell;
mod dtype;
mod error;
mod executor;
pub mod fusion;
mod group;
pub mod hooks;
mod host_engine;
mod kernels;
pub mod memory_barrier;
#[cfg(any(test, feature = "test-support"))]
mod memory_transport;
mod one_copy;
mod op;
mod op_desc;
pub mod peer_memory;
mod progress;
pub mod schedule;
mod schedule_cache;
pub mod seqlock;
mod sequence;
#[cfg(test)]
mod sim;
pub mod spin;
mod transport;
pub mod wire;

pub use algorithm::{
    barrier_algorithm, AllReduceAlgo, ACROSS_HOSTS_SMALL_MAX_BYTES, GATHER_RELEASE_MAX_RANKS,
};
pub use backend::{validate_blocks, validate_reduce, validate_root, Backend};
pub use buffer::{BufferMut, BufferRef};
pub use call_desc::CallDesc;
pub use deadline::Deadline;
pub use dtype::{DType, Element};
pub use error::{
    aborted_note, blame_note, debug_as_report, exchanged_note, gone_note, Cause, Error, Result,
};
pub use group::{
    validate_peer, BackendEngine, Engine, GroupRunner, Request, ABORT_NOTICE_GRACE,
    PEER_FAILURE_GRACE,
};
pub use host_engine::{
    HostBackend, HostConfig, HostEngine, HostTransport, DEFAULT_MID_ALL_REDUCE_MAX_BYTES,
    DEFAULT_PEER_MEMORY_MIN_BYTES, DEFAULT_SHARED_BUFFER_MIN_BYTES,
    DEFAULT_SMALL_ALL_REDUCE_MAX_BYTES,
};
#[cfg(any(test, feature = "test-support"))]
pub use memory_transport::{MemoryConfig, MemoryTransport};
pub use op::ReduceOp;
pub use op_desc::{CollectiveKind, OpDesc};
pub use sequence::Sequence;
pub use transport::{check_peer, endpoint_closed, spans_hosts, Closer, Readiness, Transport};

/// Re-export of the `half` crate, whose `f16` and `bf16` are [`Element`] types.
pub use half;
