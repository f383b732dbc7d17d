//! The data-parallel layer of ringccl: torch's `DistributedDataParallel` (gradients
//! averaged in buckets while backward runs), `DistributedSampler`, checkpoints and
//! `DataParallel`. Use it as `ringccl::ddp`, which documents it with the rest of the
//! library; `ringccl::ProcessGroup` implements [`Communicator`].
//!
//! ```
//! use ringccl::ddp::{DdpConfig, DistributedDataParallel};
//! # fn main() -> Result<(), ringccl::Error> {
//! let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
//! let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, [("w", 2)], DdpConfig::default())?;
//! ddp.mark_grad_ready(0, &[1.0, 2.0])?;
//! ddp.finish()?;
//! assert_eq!(ddp.grad(0)?, [1.0, 2.0]); // the average over the (one) rank
//! # Ok(())
//! # }
//! ```

// No unsafe code, but for the device module's kernels (`device::kernels`, which allows
// it for its kernel launches and the NVRTC probe, each block with its SAFETY comment).
#![deny(unsafe_code)]

mod batches;
mod bucket_comm;
mod checkpoint;
mod communicator;
mod config;
mod data_parallel;
mod ddp;
#[cfg(feature = "device")]
mod device;
mod element;
mod error;
mod hooks;
mod plan;
mod reducer;
mod sampler;
mod space;

pub use batches::{Batch, BatchPosition, Batches};
pub use checkpoint::Checkpoint;
pub use communicator::{BucketLabel, Communicator, GradBuf, Pending, Ready, ToCommunicator, Wait};
pub use config::{DdpConfig, ParamSpec};
pub use data_parallel::{DataParallel, DpTimings, Grads, Replica};
pub use ddp::{check_same_config, check_same_params, Ddp, DistributedDataParallel, NoSync};
#[cfg(feature = "device")]
pub use device::{
    DeviceBucket, DeviceBuf, DeviceBufMut, DeviceCommHook, DeviceCommunicator, DeviceDdp,
    DeviceGrad, DeviceNoSync, DeviceSpace,
};
pub use element::GradElement;
pub use error::DdpError;
pub use hooks::{AllReduceHook, Bf16CompressHook, Fp16CompressHook};
pub use plan::plan_buckets;
pub use reducer::{BucketPlan, FinishPlan, OldLayout, Reducer};
pub use sampler::DistributedSampler;
pub use space::{CommHook, GradSpace, HostSpace};
