//! What can go wrong in the DDP layer.

use ringccl_collectives::Error;

/// DDP's errors, and what each one leaves behind.
///
/// An error either **poisons** the instance that returned it (a
/// [`DistributedDataParallel`](crate::DistributedDataParallel), or a `ringccl::DeviceDdp`)
/// or **leaves it usable**:
///
/// - An error found after the step's state changed, or in a collective, poisons the
///   instance: from then on every call that returns a `Result` (`grad` and `grads`
///   included) returns [`Broken`](DdpError::Broken), naming that first error. Build a new
///   instance (and a new process group if the first error broke the group).
/// - An error found before the call changed anything leaves the instance usable: fix the
///   argument and call again (for example, hand the gradient with the right length).
/// - Errors of `new` and of the checks it runs leave no instance behind.
///
/// Each variant below says which. Communication failures come through as
/// [`DdpError::Comm`]. The `Debug` form is the message, so that `main` returning
/// `Result<(), DdpError>` prints it readably.
///
/// ```
/// use ringccl::ddp::{DdpConfig, DdpError, DistributedDataParallel};
/// # fn main() -> Result<(), ringccl::Error> {
/// let pg = ringccl::init_process_group("gloo", ringccl::InitOptions::new(0, 1, "127.0.0.1:0"))?;
/// let params = [("w", 2), ("b", 1)];
/// let mut ddp = DistributedDataParallel::<f32>::with_params(&pg, params, DdpConfig::default())?;
/// // Refused before anything changed: usable.
/// let wrong = ddp.mark_grad_ready(0, &[1.0]).unwrap_err();
/// assert!(matches!(wrong, DdpError::InvalidArgument(_)));
/// ddp.mark_grad_ready(0, &[1.0, 2.0])?;
/// // Marked twice in one pass: the step is inconsistent, the instance is poisoned.
/// let twice = ddp.mark_grad_ready(0, &[1.0, 2.0]).unwrap_err();
/// assert!(matches!(twice, DdpError::GradReadyTwice { .. }));
/// assert!(matches!(ddp.finish(), Err(DdpError::Broken(_))));
/// assert!(matches!(ddp.grad(0), Err(DdpError::Broken(_))));
/// # Ok(())
/// # }
/// ```
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum DdpError {
    /// A collective failed (timeout, lost peer, ...): the runtime's error, unchanged.
    /// **Poisons the instance** (from `new`: no instance is created); the process group
    /// is unusable too when the error says the group was aborted.
    #[error(transparent)]
    Comm(Error),

    /// A CUDA call of device DDP failed (a kernel, a copy, an allocation, loading the
    /// run-time compiler). **Poisons the instance** (from `new`: no instance is
    /// created): its buckets are in an unknown state.
    #[error("rank {rank}: {call} failed during DeviceDdp: {what}: {reason}")]
    Device {
        /// The rank.
        rank: usize,
        /// What DDP was doing (copying a gradient into bucket 3, ...).
        what: String,
        /// The library call that failed.
        call: String,
        /// The library's error, and what to do about it.
        reason: String,
    },

    /// Ranks registered different parameters. Returned by `new` (and
    /// [`check_same_params`](crate::check_same_params)) on every rank: **no instance is
    /// created**; the process group stays usable.
    #[error("rank {rank}: parameters differ across ranks: {difference}; every rank must register the same parameters (names, sizes, dtypes) in the same order")]
    ParamMismatch {
        /// The rank reporting.
        rank: usize,
        /// The first difference found.
        difference: String,
    },

    /// Ranks built DDP with settings that decide its collectives differently (bucket
    /// sizes, `find_unused_parameters`, `rebuild_buckets`). Returned by `new` (and
    /// [`check_same_config`](crate::check_same_config)) on every rank: **no instance is
    /// created**; the process group stays usable.
    #[error("rank {rank}: DDP settings differ across ranks: {difference}; every rank must use the same bucket sizes, find_unused_parameters and rebuild_buckets, which decide the collectives each step runs")]
    ConfigMismatch {
        /// The rank reporting.
        rank: usize,
        /// The first difference found.
        difference: String,
    },

    /// `mark_grad_ready` was called twice for one parameter in one backward pass.
    /// **Poisons the instance**: the trainer and DDP disagree about the step (the first
    /// gradient is already in its bucket, perhaps on the wire).
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

    /// `finish` was called while some gradients were never marked ready (and
    /// `find_unused_parameters` is off). **Poisons the instance**: the step's buckets
    /// were not all reduced.
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
    /// **Poisons the instance**: the current step's buckets are on the wire and were
    /// never waited for.
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

    /// A [`DataParallel`](crate::DataParallel) replica failed: its pass panicked, or left
    /// a gradient unset. **Leaves the `DataParallel` usable**: the failed step changed no
    /// parameter and is not counted, and the next step recomputes every gradient (until
    /// then, [`DataParallel::grads`](crate::DataParallel::grads) holds no average).
    #[error("DataParallel replica {replica}: {reason}")]
    Replica {
        /// The replica (0 is the master).
        replica: usize,
        /// What happened.
        reason: String,
    },

    /// A [`Checkpoint`](crate::Checkpoint) could not be written or read. **Leaves
    /// everything usable**: no DDP state is involved.
    #[error("checkpoint: {0}")]
    Checkpoint(String),

    /// A call was refused before it changed anything: an index out of range, a gradient
    /// of the wrong length, `grad` before the step's `finish`, a method the configuration
    /// does not allow, or a call at the wrong point of the step. **Leaves the instance
    /// usable**: correct the call and make it again.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// A fault inside DDP: its bookkeeping disagrees with itself, or a peer sent data
    /// that cannot be right. **Poisons the instance.** Please report it.
    #[error("internal error in DDP: {0}")]
    Internal(String),

    /// The instance is poisoned: an earlier error (named here, the first one) left its
    /// step in an unknown state. Every later call that returns a `Result` returns this
    /// again; build a new instance.
    #[error("this DDP instance is unusable after an earlier error ({0}); create a new one (and, if that error broke the process group, a new process group)")]
    Broken(String),
}

/// A communication failure; one that a hook or a memory space reported as a DDP error
/// (boxed through the runtime's [`Error::Engine`]) comes back out as itself.
impl From<Error> for DdpError {
    fn from(e: Error) -> DdpError {
        match e {
            Error::Engine {
                source,
                breaks_group,
            } => match source.downcast::<DdpError>() {
                Ok(ddp) => *ddp,
                Err(source) => DdpError::Comm(Error::Engine {
                    source,
                    breaks_group,
                }),
            },
            other => DdpError::Comm(other),
        }
    }
}

impl DdpError {
    /// This error as the runtime's, for the interfaces that speak it (a hook's
    /// [`Pending`](crate::Pending)); [`DdpError::from`] recovers it.
    pub fn into_runtime(self) -> Error {
        match self {
            DdpError::Comm(e) => e,
            other => Error::Engine {
                source: Box::new(other),
                breaks_group: false,
            },
        }
    }
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

impl std::fmt::Debug for DdpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ringccl_collectives::debug_as_report(self, f)
    }
}
