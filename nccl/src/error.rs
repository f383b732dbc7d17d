//! The device layer's errors: NCCL cannot run here, a CUDA or NCCL call failed, a call
//! outran its deadline on the GPU.

use std::time::Duration;

use ringccl_collectives::OpDesc;
use ringccl_rendezvous::SetupError;

/// What can go wrong under the `"nccl"` backend.
///
/// Calls through the [`Backend`](ringccl_collectives::Backend) trait return the runtime's
/// error; a device failure travels inside it as
/// [`Engine`](ringccl_collectives::Error::Engine) and comes back out with
/// `DeviceError::from`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// NCCL cannot run in this build or on this machine.
    #[error("backend \"nccl\" is not available: {reason}")]
    Unavailable {
        /// Why, and what to do about it.
        reason: String,
    },

    /// A device-side collective did not finish before its deadline. NCCL has no
    /// deadline of its own, so the communicator was aborted to get control back.
    #[error(
        "rank {rank}: {op} did not finish on the GPU within {timeout:?}; the NCCL communicator \
         was aborted. A peer may be dead, stuck, slower than the timeout allows, or in a \
         different collective (NCCL does not check; run the same code under \"gloo\" to find \
         a mismatch). NCCL_DEBUG=WARN shows NCCL's own view{detail}"
    )]
    Timeout {
        /// The rank that gave up.
        rank: usize,
        /// The collective.
        op: OpDesc,
        /// The deadline that passed.
        timeout: Duration,
        /// NCCL's last error message, if it had one (starts with "; ").
        detail: String,
    },

    /// A CUDA or NCCL call failed.
    #[error("rank {rank}: {call} failed during {op}: {reason}")]
    Call {
        /// The rank.
        rank: usize,
        /// The operation in progress (a collective, or a start-up step).
        op: String,
        /// The library call that failed.
        call: String,
        /// The library's error code and message, and what to do about it.
        reason: String,
    },

    /// Start-up failed before NCCL was involved (the store, the handshakes).
    #[error(transparent)]
    Setup(#[from] SetupError),

    /// The group runner refused or lost the call (an argument, a lost peer, a broken
    /// group).
    #[error(transparent)]
    Runtime(ringccl_collectives::Error),
}

impl From<ringccl_collectives::Error> for DeviceError {
    /// Unwraps a device failure that travelled through the runtime.
    fn from(e: ringccl_collectives::Error) -> DeviceError {
        match e {
            ringccl_collectives::Error::Engine {
                source,
                breaks_group,
            } => match source.downcast::<DeviceError>() {
                Ok(device) => *device,
                Err(source) => DeviceError::Runtime(ringccl_collectives::Error::Engine {
                    source,
                    breaks_group,
                }),
            },
            other => DeviceError::Runtime(other),
        }
    }
}

impl From<DeviceError> for ringccl_collectives::Error {
    /// Wraps a device failure so that it can travel through the runtime.
    fn from(e: DeviceError) -> ringccl_collectives::Error {
        match e {
            DeviceError::Runtime(e) => e,
            other => ringccl_collectives::Error::Engine {
                breaks_group: matches!(
                    other,
                    DeviceError::Timeout { .. } | DeviceError::Call { .. }
                ),
                source: Box::new(other),
            },
        }
    }
}
