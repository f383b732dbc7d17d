//! # ringccl-ddp
//!
//! Data-parallel training on top of ringccl, after PyTorch's `DistributedDataParallel`:
//! gradients are grouped into buckets and each bucket is averaged across ranks as soon
//! as it is complete, while the backward pass goes on. The crate does not own autograd:
//! the trainer tells it when each gradient is ready.
//!
//! - [`DistributedDataParallel`]: the reducer (buckets, ordered async all-reduce,
//!   `no_sync` accumulation, unused parameters, one-time bucket rebuild, comm hooks).
//! - [`DataParallel`]: PyTorch's single-process `DataParallel` (one thread per replica,
//!   gradients reduced to the master), to compare with DDP over threads or processes.
//! - [`DistributedSampler`]: each rank's share of a dataset, torch's semantics, and
//!   [`Batches`] of it that know their epoch and step and resume mid-epoch.
//! - [`Checkpoint`]: training snapshots written atomically, for restarts that resume.
//! - [`plan_buckets`]: the pure bucket planner.
//! - [`Reducer`]: DDP's bookkeeping without the gradients (what to start when), shared by
//!   host buckets here and device buckets (`ringccl::DeviceDdp`).
//!
//! Use it through `ringccl::ddp`, which implements [`Communicator`] for
//! `ringccl::ProcessGroup`.

#![deny(unsafe_code)]

mod batches;
mod bucket_comm;
mod checkpoint;
mod communicator;
mod config;
mod data_parallel;
mod ddp;
mod element;
mod error;
mod hooks;
mod plan;
mod reducer;
mod sampler;

pub use batches::{Batch, BatchPosition, Batches};
pub use checkpoint::Checkpoint;
pub use communicator::{BucketLabel, Communicator, GradBuf, Pending, Ready, ToCommunicator, Wait};
pub use config::{DdpConfig, ParamSpec};
pub use data_parallel::{DataParallel, DpTimings, Grads, Replica};
pub use ddp::{check_same_config, check_same_params, DistributedDataParallel, NoSync};
pub use element::GradElement;
pub use error::DdpError;
pub use hooks::{AllReduceHook, Bf16CompressHook, CommHook, Fp16CompressHook};
pub use plan::plan_buckets;
pub use reducer::{BucketPlan, FinishPlan, OldLayout, Reducer};
pub use sampler::DistributedSampler;
