//! The collective runtime's errors: what can go wrong once a group is running.
//!
//! Start-up has its own error (`ringccl_rendezvous::SetupError`), so does the NCCL
//! engine (`ringccl_nccl::Error`, which reaches callers of the [`crate::Backend`] trait
//! as [`Error::Engine`]); the `ringccl` facade's `Error` wraps all three.

/// Declares an error enum that holds every variant of the runtime's [`Error`], with its
/// fields and message, after the caller's own variants. The runtime's `Error` and the
/// `ringccl` facade's flat `Error` are both declared through it, so each message is
/// written once.
#[doc(hidden)]
#[macro_export]
macro_rules! runtime_error_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($own:tt)* }) => {
        $(#[$meta])*
        $vis enum $name {
            $($own)*

    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The operator does not apply to the element type.
    #[error("reduce op {op} is not supported for {dtype}: {reason}")]
    UnsupportedOp {
        /// The operator.
        op: $crate::ReduceOp,
        /// The element type.
        dtype: $crate::DType,
        /// Why, and what to use instead.
        reason: &'static str,
    },

    /// A collective did not finish before its deadline.
    #[error(
        "rank {rank}: timed out after {timeout:?} in {op} waiting for rank {peer}{}; rank \
         {peer} may be stuck, dead, slower than the timeout allows, or in a different \
         collective{}",
        $crate::exchanged_note(*moved, *expected),
        $crate::gone_note(gone)
    )]
    Timeout {
        /// The rank that gave up.
        rank: usize,
        /// The peer it was waiting for.
        peer: usize,
        /// The collective.
        op: $crate::OpDesc,
        /// Bytes exchanged with that peer in this collective before the deadline.
        moved: u64,
        /// Bytes that would have been exchanged with that peer in this collective.
        expected: u64,
        /// The deadline that passed.
        timeout: ::std::time::Duration,
        /// Other ranks whose connections to this rank had closed or failed when the
        /// deadline passed: the likely root cause when `peer` was only blocked behind them.
        gone: Vec<usize>,
    },

    /// A peer's connection failed (process killed, connection reset, host unreachable).
    #[error("rank {observer} lost rank {rank} during {op}: {reason}{}; the group is now broken, create a new one (e.g. restart under `ringrun --max-restarts`)", $crate::gone_note(gone))]
    PeerLost {
        /// The rank that was lost.
        rank: usize,
        /// The rank that noticed.
        observer: usize,
        /// The collective in progress.
        op: $crate::OpDesc,
        /// What the connection reported.
        reason: String,
        /// Other ranks whose connections to this rank had closed or failed too.
        gone: Vec<usize>,
    },

    /// Two ranks are in different collectives.
    #[error("rank {rank} is in {mine} but rank {peer} is in {theirs}: every rank must issue the same collectives, with the same arguments, in the same order")]
    CollectiveMismatch {
        /// The rank that noticed.
        rank: usize,
        /// The collective it is in.
        mine: $crate::OpDesc,
        /// The peer that disagrees.
        peer: usize,
        /// The collective the peer is in.
        theirs: $crate::OpDesc,
    },

    /// Two ranks' calls wait on each other, so neither can finish: a point-to-point
    /// message against a collective, two receives that each wait for the other's later
    /// send, or two sends that filled the connection both ways.
    #[error("rank {rank} is in {mine} while rank {peer} is in {theirs}, waiting for rank {rank}: the two calls wait on each other ({why}); order the calls so that every send meets its recv and every rank reaches each collective")]
    Deadlock {
        /// The rank that noticed.
        rank: usize,
        /// Its call (boxed: errors stay small).
        mine: Box<$crate::control::CallDesc>,
        /// The peer it waits on.
        peer: usize,
        /// The peer's call.
        theirs: Box<$crate::control::CallDesc>,
        /// What each call waits for.
        why: String,
    },

    /// A peer sent bytes that break the protocol.
    #[error("rank {rank}: protocol error from rank {peer} during {op}: {reason}")]
    Protocol {
        /// The rank that noticed.
        rank: usize,
        /// The peer that sent the bytes.
        peer: usize,
        /// The collective in progress.
        op: $crate::OpDesc,
        /// What was wrong.
        reason: String,
    },

    /// Another rank aborted the group (a mismatch, a timeout, a lost peer, a device error,
    /// a panic, or the program dropping the group mid-operation) and told this one why.
    #[error("rank {by} aborted the group: {reason} (seen by rank {rank}); the group is now broken, create a new one (e.g. restart under `ringrun --max-restarts`)")]
    GroupAborted {
        /// The rank that saw the notice.
        rank: usize,
        /// The rank that aborted.
        by: usize,
        /// Its reason, as it gave it.
        reason: String,
    },

    /// An earlier error left the group's connections unusable.
    #[error("rank {rank}: the process group is broken by an earlier error ({cause}); create a new process group")]
    GroupBroken {
        /// The rank.
        rank: usize,
        /// The first error.
        cause: String,
    },

    /// An engine below the runtime failed (for example a CUDA or NCCL call, or NCCL's
    /// own deadline). `source` is the engine's error type (`ringccl_nccl::Error` under
    /// NCCL); the `ringccl` facade turns it back into its own variants.
    #[error("{source}")]
    Engine {
        /// The engine's error.
        source: Box<dyn ::std::error::Error + Send + Sync>,
        /// Whether the failure leaves the group unusable.
        breaks_group: bool,
    },

    /// A local I/O operation failed.
    #[error("rank {rank}: {context}: {source}")]
    Io {
        /// The rank.
        rank: usize,
        /// What was being done.
        context: String,
        /// The system error.
        #[source]
        source: ::std::io::Error,
    },
        }

        impl $name {
            /// Whether this is one of the runtime's variants that leave the group's
            /// connections in an unknown state.
            fn runtime_variant_breaks_group(&self) -> bool {
                matches!(
                    self,
                    $name::Timeout { .. }
                        | $name::PeerLost { .. }
                        | $name::GroupAborted { .. }
                        | $name::CollectiveMismatch { .. }
                        | $name::Deadlock { .. }
                        | $name::Protocol { .. }
                        | $name::Io { .. }
                        | $name::Engine {
                            breaks_group: true,
                            ..
                        }
                )
            }
        }
    };
}

runtime_error_enum! {
    /// What can go wrong in a running group: misuse, a lost or slow peer, a mismatch.
    ///
    /// Every message says which rank saw the problem, which peer and which operation were
    /// involved where that applies, and what to do about it. After an error raised while
    /// data was moving (`Timeout`, `PeerLost`, `CollectiveMismatch`, `Protocol`) the group's
    /// connections are in an unknown state: the group reports [`Error::GroupBroken`] from
    /// then on, and the way forward is a new process group (see the user guide).
    #[derive(Debug, thiserror::Error)]
    #[non_exhaustive]
    pub enum Error {}
}

impl Error {
    /// Whether this error leaves the group's connections in an unknown state.
    pub fn breaks_group(&self) -> bool {
        self.runtime_variant_breaks_group()
    }
}

/// `" (1400 of 5592 bytes exchanged with it)"`, or nothing for a call that exchanges no
/// payload with that peer (a barrier, the same-call check).
#[doc(hidden)]
pub fn exchanged_note(moved: u64, expected: u64) -> String {
    if expected == 0 {
        return String::new();
    }
    format!(" ({moved} of {expected} bytes exchanged with it)")
}

/// `"; connections to rank 3, rank 5 had also closed or failed"`, or nothing.
#[doc(hidden)]
pub fn gone_note(gone: &[usize]) -> String {
    if gone.is_empty() {
        return String::new();
    }
    let ranks: Vec<String> = gone.iter().map(|r| format!("rank {r}")).collect();
    format!(
        "; connections to {} had also closed or failed (the likely root cause)",
        ranks.join(", ")
    )
}

/// ringccl's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, OpDesc, ReduceOp};
    use std::time::Duration;

    fn timeout(moved: u64, expected: u64) -> String {
        Error::Timeout {
            rank: 0,
            peer: 1,
            op: OpDesc::all_reduce(4, DType::F32, 1024, ReduceOp::Sum),
            moved,
            expected,
            timeout: Duration::from_secs(2),
            gone: Vec::new(),
        }
        .to_string()
    }

    #[test]
    fn a_timeout_counts_bytes_only_for_calls_that_exchange_some() {
        let text = timeout(1400, 5592);
        assert!(
            text.contains(
                "waiting for rank 1 (1400 of 5592 bytes exchanged with it); rank 1 may be"
            ),
            "{text}"
        );
        // A barrier moves no payload: no "0 of 0 bytes".
        let text = timeout(0, 0);
        assert!(text.contains("waiting for rank 1; rank 1 may be"), "{text}");
        assert!(!text.contains("bytes"), "{text}");
    }
}
