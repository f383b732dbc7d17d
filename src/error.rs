//! The facade's error: one enum for everything a `ringccl` call can report, built from
//! the layers' own errors (start-up: [`SetupError`], the collective runtime:
//! [`RuntimeError`], the device: `ringccl_nccl::DeviceError`) plus what only the facade
//! knows (backend names, environment variables). Each layer's variants keep their names
//! and fields here, so callers match one flat enum.

use std::time::Duration;

use ringccl_collectives::{Error as RuntimeError, OpDesc};
use ringccl_rendezvous::SetupError;

ringccl_rendezvous::setup_error_variants! {
    ringccl_collectives::runtime_error_enum!
    /// Everything that can go wrong in ringccl.
    ///
    /// Every message says which rank saw the problem, which peer and which operation were
    /// involved where that applies, and what to do about it. After an error raised while
    /// data was moving (`Timeout`, `PeerLost`, `CollectiveMismatch`, `Protocol`) the group's
    /// connections are in an unknown state: the group reports [`Error::GroupBroken`] from
    /// then on, and the way forward is a new process group (see the user guide).
    ///
    /// Its `Debug` form is the message (as `anyhow`'s), so that `main` returning
    /// `Result<(), ringccl::Error>` prints what went wrong readably; match on the variant
    /// for the fields.
    ///
    /// ```
    /// let err = ringccl::InitOptions::from_vars(|_| None).unwrap_err();
    /// assert_eq!(format!("{err:?}"), err.to_string());
    /// assert!(matches!(err, ringccl::Error::MissingEnv { var: "RANK", .. }));
    /// ```
    #[derive(thiserror::Error)]
    #[non_exhaustive]
    pub enum Error {
        /// The backend string names no backend.
        #[error("unknown backend {name:?}: valid backends are {} (case-insensitive)", valid.join(", "))]
        UnknownBackend {
            /// What the caller asked for.
            name: String,
            /// The names that would have worked.
            valid: &'static [&'static str],
        },

        /// The backend exists but cannot run in this build or on this machine.
        #[error("backend {backend:?} is not available: {reason}")]
        BackendUnavailable {
            /// The backend's name.
            backend: &'static str,
            /// Why, and what to do about it.
            reason: String,
        },

        /// A required environment variable is not set.
        #[error("environment variable {var} is not set: {hint}")]
        MissingEnv {
            /// The variable's name.
            var: &'static str,
            /// How to set it.
            hint: &'static str,
        },

        /// An environment variable is set to something unusable.
        #[error("environment variable {var}={value:?} is invalid: {reason}")]
        InvalidEnv {
            /// The variable's name.
            var: &'static str,
            /// Its value.
            value: String,
            /// What is wrong with it.
            reason: String,
        },

        /// A call's deadline passed while it was still queued on this rank behind an
        /// earlier call of the same group. This rank never started it while its peers may
        /// have, so the group was aborted.
        #[error(
            "rank {rank}: {op} (call #{call} on this group) timed out after {timeout:?} while \
             still queued behind {behind}; it never started on this rank while its peers may \
             have started it, so the group is now broken: create a new process group. The \
             earlier call is probably waiting for a peer that is dead, stuck or in a different \
             collective"
        )]
        QueueTimeout {
            /// The rank.
            rank: usize,
            /// The operation that timed out (`"barrier"`, `"all_reduce"`, …).
            op: &'static str,
            /// Its number among the calls issued on this group on this rank (from 1).
            call: u64,
            /// The deadline that passed.
            timeout: Duration,
            /// The earlier call it was waiting for, e.g. `all_reduce (call #4), which is
            /// still running`.
            behind: String,
        },

        /// Two threads issued calls on one group at the same time. The other ranks may
        /// have paired the calls differently, so the call was refused and the group aborted.
        #[error(
            "rank {rank}: {thread} issued {op} while {pending}, issued by {other_thread}, is \
             still pending on this process group. Calls from two threads at once can be \
             paired with the other ranks' calls in a different order and silently mix their \
             buffers, so this call was refused and the group is now broken: create a new \
             one. Give each thread its own process group (formed from one group by every rank \
             with ProcessGroup::new_group or split), or issue every call from one thread \
             (another thread may take over once the calls it issued have finished)"
        )]
        ConcurrentUse {
            /// The rank.
            rank: usize,
            /// The refused operation.
            op: &'static str,
            /// The thread that issued it, e.g. `thread "loader" (ThreadId(7))`.
            thread: String,
            /// The other thread's pending call, e.g. `all_reduce (call #12)`.
            pending: String,
            /// The thread that issued the pending call.
            other_thread: String,
        },

        /// A device-side collective (NCCL) did not finish before its deadline. NCCL has no
        /// deadline of its own, so the communicator was aborted to get control back.
        #[error(
            "rank {rank}: {op} did not finish on the GPU within {timeout:?}; the NCCL communicator \
             was aborted. A peer may be dead, stuck, slower than the timeout allows, or in a \
             different collective (NCCL does not check; run the same code under \"gloo\" to find \
             a mismatch). NCCL_DEBUG=WARN shows NCCL's own view{detail}"
        )]
        DeviceTimeout {
            /// The rank that gave up.
            rank: usize,
            /// The collective.
            op: OpDesc,
            /// The deadline that passed.
            timeout: Duration,
            /// NCCL's last error message, if it had one (starts with "; ").
            detail: String,
        },

        /// A peer's process went away during start-up after the ranks had connected
        /// (shared-memory set-up); `SetupError::PeerGone` under its own name. It names the
        /// rank that went away and the step.
        #[error(transparent)]
        PeerGone(ringccl_transports::PeerGone),

        /// A CUDA or NCCL call failed.
        #[error("rank {rank}: {call} failed during {op}: {reason}")]
        Device {
            /// The rank.
            rank: usize,
            /// The operation in progress (a collective, or a start-up step).
            op: String,
            /// The library call that failed.
            call: String,
            /// The library's error code and message, and what to do about it.
            reason: String,
        },

        /// The DDP layer refused a call (a parameter mismatch, a gradient marked twice,
        /// a step not finished, ...). Its communication failures come out as the
        /// variants above instead.
        #[error(transparent)]
        Ddp(Box<ringccl_ddp::DdpError>),
    }
}

impl Error {
    /// Whether this error leaves the group's connections in an unknown state.
    pub fn breaks_group(&self) -> bool {
        self.runtime_variant_breaks_group()
            || matches!(
                self,
                Error::DeviceTimeout { .. }
                    | Error::Device { .. }
                    | Error::QueueTimeout { .. }
                    | Error::ConcurrentUse { .. }
            )
    }
}

/// `match $value { $From::V { fields } => $To::V { fields }, …, <the remaining arms> }`
/// for variants that carry the same name and fields in both enums.
macro_rules! same_variants {
    ($value:expr, $from:ident => $to:ident, [$($variant:ident { $($field:ident),* }),* $(,)?], $($rest:tt)*) => {
        match $value {
            $($from::$variant { $($field),* } => $to::$variant { $($field),* },)*
            $($rest)*
        }
    };
}

/// The runtime's variants that the facade carries under the same name and fields; the
/// list both conversions between `Error` and `RuntimeError` expand.
macro_rules! runtime_variants {
    ($value:expr, $from:ident => $to:ident, $($rest:tt)*) => {
        same_variants!($value, $from => $to, [
            UnsupportedOp { op, dtype, reason },
            Timeout { rank, peer, op, moved, expected, timeout, gone, cause },
            PeerLost { rank, observer, op, reason, gone },
            CollectiveMismatch { rank, mine, peer, theirs },
            Deadlock { rank, mine, peer, theirs, why },
            Protocol { rank, peer, op, reason },
            GroupAborted { rank, by, reason, cause },
            GroupBroken { rank, cause },
            Io { rank, context, source },
        ], $($rest)*)
    };
}

impl From<SetupError> for Error {
    fn from(e: SetupError) -> Error {
        same_variants!(e, SetupError => Error, [
            StoreBind { addr, reason, source },
            StoreUnreachable { rank, addr, timeout, last_error },
            RendezvousTimeout { rank, waiting_for, timeout },
            Handshake { rank, peer, reason },
            DuplicateRank { rank, first, second },
            RendezvousAborted { rank, reason },
            AttemptMismatch { rank, ours, theirs, addr },
            WorldSizeMismatch { rank, ours, theirs, addr },
            DescriptorsExhausted { rank, during, detail },
            NoMatchingInterface { rank, spec, found },
            Io { rank, context, source },
        ],
            SetupError::InvalidArgument(reason) => Error::InvalidArgument(reason),
            // Forcing shared memory where it cannot work is a setting to change.
            SetupError::SharedMemory(unavailable) => Error::InvalidArgument(unavailable.to_string()),
            SetupError::PeerGone(gone) => Error::PeerGone(gone),
            other => Error::Engine {
                source: Box::new(other),
                breaks_group: false,
            },
        )
    }
}

impl From<RuntimeError> for Error {
    fn from(e: RuntimeError) -> Error {
        runtime_variants!(e, RuntimeError => Error,
            RuntimeError::InvalidArgument(reason) => Error::InvalidArgument(reason),
            RuntimeError::Engine { source, breaks_group } => from_engine(source, breaks_group),
            other => Error::Engine {
                source: Box::new(other),
                breaks_group: true,
            },
        )
    }
}

/// A failure from below the runtime: a device error comes back out as the facade's
/// device variants, a facade error that went through the runtime as itself; anything
/// else stays boxed.
fn from_engine(source: Box<dyn std::error::Error + Send + Sync>, breaks_group: bool) -> Error {
    let source = match source.downcast::<Error>() {
        Ok(facade) => return *facade,
        Err(other) => other,
    };
    #[cfg(feature = "nccl")]
    let source = match source.downcast::<ringccl_nccl::DeviceError>() {
        Ok(device) => return Error::from(*device),
        Err(other) => other,
    };
    Error::Engine {
        source,
        breaks_group,
    }
}

impl From<Error> for RuntimeError {
    /// For the runtime-facing interfaces (the DDP layer's `Communicator`): the runtime's
    /// own variants go back as themselves, the others travel boxed and come back out
    /// unchanged through `Error::from`.
    fn from(e: Error) -> RuntimeError {
        runtime_variants!(e, Error => RuntimeError,
            Error::InvalidArgument(reason) => RuntimeError::InvalidArgument(reason),
            Error::Engine { source, breaks_group } => RuntimeError::Engine { source, breaks_group },
            other => RuntimeError::Engine {
                breaks_group: other.breaks_group(),
                source: Box::new(other),
            },
        )
    }
}

#[cfg(feature = "nccl")]
impl From<ringccl_nccl::DeviceError> for Error {
    fn from(e: ringccl_nccl::DeviceError) -> Error {
        use ringccl_nccl::DeviceError;
        match e {
            DeviceError::Unavailable { reason } => Error::BackendUnavailable {
                backend: "nccl",
                reason,
            },
            DeviceError::Timeout {
                rank,
                op,
                timeout,
                detail,
            } => Error::DeviceTimeout {
                rank,
                op,
                timeout,
                detail,
            },
            DeviceError::Call {
                rank,
                op,
                call,
                reason,
            } => Error::Device {
                rank,
                op,
                call,
                reason,
            },
            DeviceError::Setup(e) => e.into(),
            DeviceError::Runtime(e) => e.into(),
            other => Error::Engine {
                source: Box::new(other),
                breaks_group: true,
            },
        }
    }
}

/// ringccl's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A trainer's one error type: a DDP error converts into [`Error`] with `?`, its
/// communication failures as the runtime's own variants.
impl From<ringccl_ddp::DdpError> for Error {
    fn from(e: ringccl_ddp::DdpError) -> Error {
        match e {
            ringccl_ddp::DdpError::Comm(runtime) => Error::from(runtime),
            ringccl_ddp::DdpError::Device {
                rank,
                what,
                call,
                reason,
            } => Error::Device {
                rank,
                op: format!("DeviceDdp: {what}"),
                call,
                reason,
            },
            other => Error::Ddp(Box::new(other)),
        }
    }
}

/// And back: a group call inside a closure that returns `DdpError` (DDP's backward
/// callbacks) converts with `?`; [`Error::from`] recovers the original.
impl From<Error> for ringccl_ddp::DdpError {
    fn from(e: Error) -> ringccl_ddp::DdpError {
        match e {
            Error::Ddp(ddp) => *ddp,
            other => ringccl_ddp::DdpError::Comm(RuntimeError::from(other)),
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        ringccl_collectives::debug_as_report(self, f)
    }
}
