//! The ways a transport's set-up fails on its own account, which every
//! [`SetupStore`](crate::SetupStore) error type must be able to carry.

/// Shared memory was required (`RINGCCL_TRANSPORT=shm`) but cannot be set up.
#[derive(Debug, thiserror::Error)]
#[error("rank {rank}: shared-memory transport: {reason}; or use RINGCCL_TRANSPORT=tcp")]
pub struct ShmUnavailable {
    /// The rank that reports it.
    pub rank: usize,
    /// Why (another host, an inbox that could not be created, reserved or mapped).
    pub reason: String,
}

/// A peer's process went away (killed, crashed, exited) during a start-up step that
/// follows the mesh, so start-up cannot finish.
#[derive(Debug, thiserror::Error)]
#[error(
    "rank {rank}: rank {peer} went away during {step} ({how}); start-up cannot finish without it: \
     look at rank {peer}'s own output and exit status (killed? out of memory? crashed?), then restart every rank"
)]
pub struct PeerGone {
    /// The rank that noticed.
    pub rank: usize,
    /// The rank that went away.
    pub peer: usize,
    /// The start-up step, e.g. `"shared-memory set-up"`.
    pub step: &'static str,
    /// How it was noticed, and which other ranks had gone too.
    pub how: String,
}
