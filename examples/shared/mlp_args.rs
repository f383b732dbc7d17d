//! The command-line options that `ddp_mlp` and `ddp_gpu` share (flattened into each
//! one's own), so that the same flags give both the same model, data and batches.

use clap::Args;

#[derive(Args, Debug, Clone)]
pub(crate) struct MlpArgs {
    /// Replicas in this process, without a launcher: ranks on threads over
    /// ringccl::local_groups (ddp_mlp --mode dp: DataParallel's replicas, default 1).
    /// Without it, the group that ringrun (or RANK/WORLD_SIZE/MASTER_*) describes.
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Samples per replica per step.
    #[arg(long, default_value_t = 16)]
    pub local_batch: usize,
    /// Seed for the data, the initial parameters and the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Input features.
    #[arg(long, default_value_t = 8)]
    pub input: usize,
    /// Hidden units per layer.
    #[arg(long, default_value_t = 32)]
    pub hidden: usize,
    /// Hidden layers.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Dataset size.
    #[arg(long, default_value_t = 1024)]
    pub dataset: usize,
    /// Learning rate.
    #[arg(long, default_value_t = 0.05)]
    pub lr: f32,
    /// on: mark each layer's gradients as backward produces them; off: all after
    /// backward (no overlap), for comparison.
    #[arg(long, default_value = "on")]
    pub overlap: String,
    /// DDP's bucket size in MiB (torch's bucket_cap_mb).
    #[arg(long, default_value_t = 25.0)]
    pub bucket_cap_mb: f64,
}

impl MlpArgs {
    /// The layer widths these options describe.
    pub(crate) fn widths(&self) -> Vec<usize> {
        super::mlp_model::layer_widths(self.input, self.hidden, self.layers)
    }

    /// DDP's bucket cap in bytes.
    pub(crate) fn bucket_cap_bytes(&self) -> usize {
        (self.bucket_cap_mb * 1048576.0) as usize
    }
}
