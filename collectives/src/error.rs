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
        "rank {rank}: timed out after {timeout:?} in {op} waiting for rank {peer}{}{}{}",
        $crate::exchanged_note(*moved, *expected),
        $crate::blame_note(*peer, cause.as_deref()),
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
        /// deadline passed, with no abort notice to explain them: the likely root cause
        /// when `peer` was only blocked behind them. A rank that sent an abort notice
        /// before its connections closed only reacted, and is not listed.
        gone: Vec<usize>,
        /// The rank most likely at the root of the timeout, and what points at it, when
        /// something does: `peer` itself when it answered that it had not started this
        /// call, the rank `peer` was itself waiting for (followed as far as this rank
        /// knows), or the rank another rank's abort notice named. `None` when only the
        /// wait is known. [`likely_cause`](Self::likely_cause) gives the rank.
        cause: Option<Box<$crate::Cause>>,
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
        mine: Box<$crate::CallDesc>,
        /// The peer it waits on.
        peer: usize,
        /// The peer's call.
        theirs: Box<$crate::CallDesc>,
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
    #[error("rank {by} aborted the group: {reason} (seen by rank {rank}){}; the group is now broken, create a new one (e.g. restart under `ringrun --max-restarts`)", $crate::aborted_note(*rank, cause.as_deref(), reason))]
    GroupAborted {
        /// The rank that saw the notice.
        rank: usize,
        /// The rank that aborted.
        by: usize,
        /// Its reason, as it gave it.
        reason: String,
        /// The rank the aborting rank named as the likely cause (for a timeout, the rank
        /// it found everyone waiting for), when it named one; its reason says why.
        /// [`likely_cause`](Self::likely_cause) gives the rank.
        cause: Option<Box<$crate::Cause>>,
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
            /// The rank most likely at the root of this error, when one is known: the
            /// cause a timeout found (or heard of in an abort notice), the cause an abort
            /// notice named, or the peer that was lost. A rank that only aborted in
            /// reaction to another is never named.
            ///
            /// ```
            /// use ringccl_collectives::{Cause, Error};
            ///
            /// let err = Error::GroupAborted {
            ///     rank: 1,
            ///     by: 0,
            ///     reason: "rank 0: timed out waiting for rank 2".into(),
            ///     cause: Some(Box::new(Cause::rank(2))),
            /// };
            /// assert_eq!(err.likely_cause(), Some(2));
            /// ```
            pub fn likely_cause(&self) -> Option<usize> {
                match self {
                    $name::Timeout { cause, .. } | $name::GroupAborted { cause, .. } => {
                        cause.as_ref().map(|c| c.rank)
                    }
                    $name::PeerLost { rank, .. } => Some(*rank),
                    _ => None,
                }
            }

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

/// The rank most likely at the root of a failure, and what points at it: the `cause` of
/// [`Error::Timeout`] and [`Error::GroupAborted`] (boxed there: errors stay small).
///
/// ```
/// use ringccl_collectives::Cause;
///
/// let cause = Cause::rank(2).because("rank 0 was itself waiting for rank 2");
/// assert_eq!((cause.rank, cause.evidence.as_str()), (2, "rank 0 was itself waiting for rank 2"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cause {
    /// The rank.
    pub rank: usize,
    /// What points at it, in words (`"it had not started op #3 when asked"`); empty when
    /// nothing more than the rank is known.
    pub evidence: String,
}

impl Cause {
    /// Rank `rank`, with no evidence given.
    pub fn rank(rank: usize) -> Cause {
        Cause {
            rank,
            evidence: String::new(),
        }
    }

    /// The same cause, pointed at by `evidence`.
    pub fn because(self, evidence: impl Into<String>) -> Cause {
        Cause {
            evidence: evidence.into(),
            ..self
        }
    }
}

/// What a timeout says about who is to blame: `"; rank 2 is the likely cause (rank 0 was
/// itself waiting for rank 2): it may be stuck, …"` when a cause is known, else that
/// `peer` may be stuck.
#[doc(hidden)]
pub fn blame_note(peer: usize, cause: Option<&Cause>) -> String {
    const WHY: &str = "stuck, dead, slower than the timeout allows, or in a different collective";
    match cause {
        None => format!("; rank {peer} may be {WHY}"),
        Some(Cause { rank, evidence }) if evidence.is_empty() => {
            format!("; rank {rank} is the likely cause: it may be {WHY}")
        }
        Some(Cause { rank, evidence }) => {
            format!("; rank {rank} is the likely cause ({evidence}): it may be {WHY}")
        }
    }
}

/// The cause an abort notice named, unless its reason already says it: `"; rank 2 is the
/// likely cause"`, or for the rank named itself `"; the notice names this rank (rank 2)
/// as the likely cause"`.
#[doc(hidden)]
pub fn aborted_note(rank: usize, cause: Option<&Cause>, reason: &str) -> String {
    match cause.map(|c| c.rank) {
        None => String::new(),
        Some(cause) if cause == rank => {
            format!("; the notice names this rank (rank {cause}) as the likely cause")
        }
        Some(cause) if reason.contains(&format!("rank {cause} is the likely cause")) => {
            String::new()
        }
        Some(cause) => format!("; rank {cause} is the likely cause"),
    }
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

/// Writes `error` as its message followed by the causes its message does not already
/// quote, as `anyhow` prints an error: the `Debug` form of ringccl's errors, so that
/// `fn main() -> Result<(), ringccl::Error>` prints something a person can read.
#[doc(hidden)]
pub fn debug_as_report(
    error: &(dyn std::error::Error + 'static),
    f: &mut std::fmt::Formatter<'_>,
) -> std::fmt::Result {
    let message = error.to_string();
    f.write_str(&message)?;
    let mut quoted = message;
    let mut source = error.source();
    let mut first = true;
    while let Some(cause) = source {
        let text = cause.to_string();
        if !quoted.contains(&text) {
            if first {
                f.write_str("\n\nCaused by:")?;
                first = false;
            }
            write!(f, "\n    {text}")?;
            quoted.push_str(&text);
        }
        source = cause.source();
    }
    Ok(())
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
            cause: None,
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

    /// Errors stay small: results carry them by value.
    #[test]
    fn the_error_stays_small() {
        assert!(
            std::mem::size_of::<Error>() <= 120,
            "{}",
            std::mem::size_of::<Error>()
        );
    }

    #[test]
    fn a_timeout_names_its_likely_cause_and_the_evidence() {
        let err = Error::Timeout {
            rank: 1,
            peer: 0,
            op: OpDesc::all_reduce(3, DType::F32, 1024, ReduceOp::Sum),
            moved: 0,
            expected: 0,
            timeout: Duration::from_secs(8),
            gone: Vec::new(),
            cause: Some(Box::new(
                Cause::rank(2).because("rank 0 was itself waiting for rank 2"),
            )),
        };
        let text = err.to_string();
        assert!(
            text.contains(
                "waiting for rank 0; rank 2 is the likely cause (rank 0 was itself waiting for \
                 rank 2): it may be stuck"
            ),
            "{text}"
        );
        assert!(!text.contains("rank 0 may be"), "{text}");
        assert_eq!(err.likely_cause(), Some(2));
    }

    #[test]
    fn an_abort_names_its_cause_once() {
        let aborted = |rank, reason: &str, cause: Option<usize>| {
            Error::GroupAborted {
                rank,
                by: 0,
                reason: reason.into(),
                cause: cause.map(|r| Box::new(Cause::rank(r))),
            }
            .to_string()
        };
        let text = aborted(1, "rank 0: timed out in op #3", Some(2));
        assert!(
            text.contains("(seen by rank 1); rank 2 is the likely cause; the group"),
            "{text}"
        );
        let said = "rank 0: timed out; rank 2 is the likely cause (it had not started op #3)";
        let text = aborted(1, said, Some(2));
        assert_eq!(
            text.matches("rank 2 is the likely cause").count(),
            1,
            "{text}"
        );
        let text = aborted(2, said, Some(2));
        assert!(
            text.contains("the notice names this rank (rank 2) as the likely cause"),
            "{text}"
        );
        let text = aborted(1, "op #3: mismatch", None);
        assert!(!text.contains("likely cause"), "{text}");
    }
}
