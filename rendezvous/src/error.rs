//! What can go wrong while the ranks find each other: the store, the handshakes, the
//! deadline of start-up.

use std::io;

use ringccl_transports::shm::ShmUnavailable;
use ringccl_transports::PeerGone;

/// Hands the start-up variants (the store and the handshakes, with their fields and
/// messages) to another macro: `setup_error_variants!(callback! <enum with its own
/// variants>)` expands `callback! { <the enum with the start-up variants added> }`.
/// [`SetupError`] and the `ringccl` facade's flat `Error` are both declared through it,
/// so each message is written once.
#[doc(hidden)]
#[macro_export]
macro_rules! setup_error_variants {
    ($($callback:ident)::+ ! $(#[$meta:meta])* $vis:vis enum $name:ident { $($own:tt)* }) => {
        $($callback)::+! {
            $(#[$meta])*
            $vis enum $name {
                $($own)*

        /// Rank 0 could not open the rendezvous store.
        #[error("rank 0: cannot host the rendezvous store on {addr}: {reason}")]
        StoreBind {
            /// The address it tried to bind.
            addr: String,
            /// What to do about it.
            reason: String,
            /// The system error.
            #[source]
            source: ::std::io::Error,
        },

        /// The rendezvous store did not answer before the deadline.
        #[error(
            "rank {rank}: could not reach the rendezvous store at {addr} within {timeout:?} (last error: {last_error}); \
             check that rank 0 is running and that MASTER_ADDR/MASTER_PORT point at it and are reachable from this host"
        )]
        StoreUnreachable {
            /// The rank that waited.
            rank: usize,
            /// The store's address.
            addr: String,
            /// How long it waited.
            timeout: ::std::time::Duration,
            /// The last connection error seen.
            last_error: String,
        },

        /// Rendezvous did not complete before the deadline.
        #[error("rank {rank}: rendezvous timed out after {timeout:?} waiting for {waiting_for}; is that rank running, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?")]
        RendezvousTimeout {
            /// The rank that waited.
            rank: usize,
            /// Whom or what it waited for.
            waiting_for: String,
            /// How long it waited.
            timeout: ::std::time::Duration,
        },

        /// Two processes claimed the same rank. Both get this error or, on the process
        /// that claimed first, `RendezvousAborted` quoting it.
        #[error(
            "rank {rank} was started twice (by {first} and {second}): every process of a job needs its own RANK; \
             check the launcher's configuration (two launchers sharing MASTER_ADDR/MASTER_PORT, or a process left over from an earlier run?)"
        )]
        DuplicateRank {
            /// The rank claimed twice.
            rank: usize,
            /// The process that claimed it first (`host:pid`).
            first: String,
            /// The process that claimed it second (`host:pid`).
            second: String,
        },

        /// Another process abandoned start-up (a duplicate rank, a rank out of file
        /// descriptors, ...) and published why in the rendezvous store.
        #[error("rank {rank}: rendezvous abandoned: {reason}")]
        RendezvousAborted {
            /// The rank that learned of it.
            rank: usize,
            /// Why, as published by the process that gave up.
            reason: String,
        },

        /// This process and the rendezvous store belong to different attempts of a
        /// restarted job (`TORCHELASTIC_RESTART_COUNT`).
        #[error(
            "rank {rank}: this process is attempt {ours} of a restarted job, but the rendezvous store at {addr} serves attempt {theirs}: \
             the process of the older attempt is left over from before a restart; stop it (every rank of one attempt shares TORCHELASTIC_RESTART_COUNT)"
        )]
        AttemptMismatch {
            /// The rank that noticed.
            rank: usize,
            /// This process's attempt.
            ours: u32,
            /// The store's attempt.
            theirs: u32,
            /// The store's address.
            addr: String,
        },

        /// This rank's world size differs from the one rank 0 started the job with. Every
        /// rank hears of it at once (through the store), not at its deadline.
        #[error(
            "rank {rank}: WORLD_SIZE is {ours} here, but rank 0 started the job at {addr} with WORLD_SIZE {theirs}: \
             every rank of a job needs the same WORLD_SIZE; check the launcher's configuration"
        )]
        WorldSizeMismatch {
            /// The rank that noticed.
            rank: usize,
            /// This rank's world size.
            ours: usize,
            /// Rank 0's world size.
            theirs: usize,
            /// The store's address.
            addr: String,
        },

        /// The process ran out of file descriptors (`EMFILE`, or the system's `ENFILE`).
        #[error("rank {rank}: out of file descriptors while {during}: {detail}")]
        DescriptorsExhausted {
            /// The rank that ran out.
            rank: usize,
            /// What it was doing.
            during: String,
            /// Which limit was reached (RLIMIT_NOFILE and its values) and how to raise it.
            detail: String,
        },

        /// `RINGCCL_SOCKET_IFNAME` (`InitOptions::socket_ifname`) names no interface of
        /// this host with an address its peers could reach. Raised at once, before the
        /// rank connects to anything.
        #[error(
            "rank {rank}: RINGCCL_SOCKET_IFNAME={spec:?} matches no usable network interface; this host has {found}. \
             Name one of these (NCCL's syntax: `eth` for names starting with eth, `ib0,eth1` for a list, `^lo,docker` for all but \
             these, `=eth0` for exact names), or unset it to listen on the interface that reaches the rendezvous store"
        )]
        NoMatchingInterface {
            /// The rank that found no interface.
            rank: usize,
            /// The setting, as given.
            spec: String,
            /// This host's interfaces and their addresses, e.g. `lo (127.0.0.1), eth0 (10.0.0.2)`.
            found: String,
        },

        /// A connection failed its handshake (wrong protocol, version, job or world size).
        #[error("rank {rank}: handshake with {peer} failed: {reason}")]
        Handshake {
            /// The rank that saw it.
            rank: usize,
            /// The other side (a rank or an address).
            peer: String,
            /// What was wrong.
            reason: String,
        },
            }
        }
    };
}

/// Emits its input unchanged: the callback that makes [`setup_error_variants!`] declare
/// an enum directly.
#[doc(hidden)]
#[macro_export]
macro_rules! emit_item {
    ($($item:tt)*) => {
        $($item)*
    };
}

setup_error_variants! {
    emit_item!
    /// A start-up failure. Every message names the rank that saw it and what to check.
    #[derive(Debug, thiserror::Error)]
    #[non_exhaustive]
    pub enum SetupError {
        /// A setting is out of range or inconsistent.
        #[error("invalid argument: {0}")]
        InvalidArgument(String),

        /// Shared memory was required but cannot be set up.
        #[error(transparent)]
        SharedMemory(#[from] ShmUnavailable),

        /// A peer's process went away during a start-up step after the mesh
        /// (shared-memory set-up): named within moments, not at the deadline.
        #[error(transparent)]
        PeerGone(#[from] PeerGone),

        /// A local I/O operation failed.
        #[error("rank {rank}: {context}: {source}")]
        Io {
            /// The rank.
            rank: usize,
            /// What was being done.
            context: String,
            /// The system error.
            #[source]
            source: io::Error,
        },
    }
}
