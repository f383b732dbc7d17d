//! What can go wrong in the DDP layer.

use ringccl_collectives::Error;

/// DDP's errors. Communication failures come through as [`DdpError::Comm`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DdpError {
    /// A collective failed (timeout, lost peer, ...). The DDP instance is unusable
    /// afterwards; so is its process group if the error says so.
    #[error(transparent)]
    Comm(#[from] Error),

    /// Ranks registered different parameters.
    #[error("rank {rank}: parameters differ across ranks: {difference}; every rank must register the same parameters (names, sizes, dtypes) in the same order")]
    ParamMismatch {
        /// The rank reporting.
        rank: usize,
        /// The first difference found.
        difference: String,
    },

    /// Ranks built DDP with settings that decide its collectives differently (bucket
    /// sizes, `find_unused_parameters`, `rebuild_buckets`).
    #[error("rank {rank}: DDP settings differ across ranks: {difference}; every rank must use the same bucket sizes, find_unused_parameters and rebuild_buckets, which decide the collectives each step runs")]
    ConfigMismatch {
        /// The rank reporting.
        rank: usize,
        /// The first difference found.
        difference: String,
    },

    /// `mark_grad_ready` was called twice for one parameter in one step.
    #[error("rank {rank}: the gradient of parameter #{index} {name:?} was marked ready twice in step {step}; mark each gradient once per backward pass (accumulate gradients yourself, or use no_sync for accumulation across passes)")]
    GradReadyTwice {
        /// The rank.
        rank: usize,
        /// Parameter index.
        index: usize,
        /// Parameter name.
        name: String,
        /// Step number (from 0).
        step: u64,
    },

    /// `finish` was called while some gradients were never marked ready.
    #[error("rank {rank}: step {step} finished with {} parameter(s) that received no gradient: {}; if these parameters are legitimately unused in some steps, set DdpConfig::find_unused_parameters(true); otherwise make sure every parameter's gradient is marked ready", missing.len(), format_missing(missing))]
    MissingGrads {
        /// The rank.
        rank: usize,
        /// Step number (from 0).
        step: u64,
        /// (index, name) of each parameter without a gradient.
        missing: Vec<(usize, String)>,
    },

    /// A gradient of the next step arrived before `finish` ended the current one.
    #[error("rank {rank}: a gradient of a new step (parameter #{index} {name:?}) was marked ready before step {step} was finished; call finish() after every backward pass")]
    StepNotFinished {
        /// The rank.
        rank: usize,
        /// Parameter index.
        index: usize,
        /// Parameter name.
        name: String,
        /// The unfinished step.
        step: u64,
    },

    /// A DataParallel replica failed: its pass panicked, or left a gradient unset.
    #[error("DataParallel replica {replica}: {reason}")]
    Replica {
        /// The replica (0 is the master).
        replica: usize,
        /// What happened.
        reason: String,
    },

    /// A checkpoint could not be written or read.
    #[error("checkpoint: {0}")]
    Checkpoint(String),

    /// A call's arguments do not match the registered parameters.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// An earlier error left this DDP instance in an unknown state.
    #[error("this DistributedDataParallel is unusable after an earlier error ({0}); create a new one (and, if that error broke it, a new process group)")]
    Broken(String),
}

fn format_missing(missing: &[(usize, String)]) -> String {
    const SHOWN: usize = 10;
    let mut text: Vec<String> = missing
        .iter()
        .take(SHOWN)
        .map(|(i, name)| format!("#{i} {name:?}"))
        .collect();
    if missing.len() > SHOWN {
        text.push(format!("and {} more", missing.len() - SHOWN));
    }
    text.join(", ")
}
