//! What joining an NCCL communicator needs to know, besides the mesh.

use std::sync::Arc;

use ringccl_collectives::hooks::{CallHooks, NoHooks};
use ringccl_rendezvous::MeshConfig;

/// The settings of [`NcclBackend::connect`](crate::NcclBackend::connect): how to reach
/// the other ranks, and which GPU to run on.
#[derive(Debug)]
#[non_exhaustive]
pub struct NcclConfig {
    /// The rendezvous and its deadline (which bounds start-up and, by default, each call).
    pub mesh: MeshConfig,
    /// The CUDA device to use (as numbered after `CUDA_VISIBLE_DEVICES`); `None` picks
    /// `(local_rank or rank) % device_count`.
    pub device: Option<usize>,
    /// This process's rank on its node, if known.
    pub local_rank: Option<usize>,
    /// Whoever watches the group (its flight recorder, its timeline); nobody by default.
    pub hooks: Arc<dyn CallHooks>,
}

impl NcclConfig {
    /// Joins through `mesh`, on the default device.
    pub fn new(mesh: MeshConfig) -> NcclConfig {
        NcclConfig {
            mesh,
            device: None,
            local_rank: None,
            hooks: Arc::new(NoHooks),
        }
    }
}
