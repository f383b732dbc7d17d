//! What the executor needs from a transport: non-blocking byte movement to peers and a
//! way to sleep until one of them is ready. This is the bottom of the engine: it imports
//! nothing of the protocols that run above it.
//!
//! # Capabilities
//!
//! Some transports can do more than move bytes: the shared-memory transport offers a
//! barrier in memory every rank maps ([`crate::memory_barrier`]), the in-process one
//! lets ranks read each other's buffers ([`crate::peer_memory`]). Each such capability is
//! declared beside the protocol that uses it, as two traits: the capability itself (what
//! the transport implements, e.g. `MemoryBarrier`) and how a transport offers it
//! (`OffersMemoryBarrier`, `OffersPeerMemory`), whose default method offers none. The
//! protocol modules depend on this one, never the reverse; the host engine asks for
//! [`HostTransport`](crate::HostTransport), a transport with both offers, and every
//! transport it runs over implements them (an empty `impl` for one without the
//! capability).
//!
//! What every rank's transport knows about where the ranks run ([`Transport::hosts`],
//! [`Transport::one_machine`]) stays here: it is a fact about the connections, which the
//! schedules and the transports both read (and [`spans_hosts`] is its one definition).

use std::collections::BTreeSet;
use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::Arc;
use std::time::Instant;

/// Whether a [`Transport::wait`] returned because a peer became ready or because the
/// deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// At least one of the peers waited on can make progress (or has failed).
    Ready,
    /// The deadline passed first.
    TimedOut,
}

/// Moves bytes between this rank and its peers; knows nothing about collectives.
///
/// Connections are reliable, ordered byte streams, one per peer. All methods are
/// non-blocking except [`Transport::wait`], which sleeps (never spins) until a peer is
/// ready or the deadline passes.
///
/// What a transport may offer beyond byte movement is asked through traits declared
/// beside the protocols that use it, which this one does not know:
/// [`OffersMemoryBarrier`](crate::memory_barrier::OffersMemoryBarrier) and
/// [`OffersPeerMemory`](crate::peer_memory::OffersPeerMemory), whose defaults offer
/// nothing. The host engine runs over a [`HostTransport`](crate::HostTransport), a
/// transport that implements both. The crate's own tests run over `MemoryTransport`, an
/// in-process implementation (ranks on threads) with the same semantics as the
/// socket-based ones, available with the `test-support` feature.
pub trait Transport: Send + fmt::Debug {
    /// This rank.
    fn rank(&self) -> usize;

    /// Number of ranks, this one included.
    fn world_size(&self) -> usize;

    /// Writes a prefix of `bufs` to `peer`, returning how many bytes were taken.
    /// Fails with [`io::ErrorKind::WouldBlock`] when nothing can be written now.
    fn write_some(&mut self, peer: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize>;

    /// Reads into a prefix of `bufs` from `peer`, returning how many bytes arrived.
    /// `Ok(0)` means the peer closed the connection. Fails with
    /// [`io::ErrorKind::WouldBlock`] when nothing has arrived.
    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize>;

    /// Sleeps until `writable` can take bytes or `readable` has bytes (or either has
    /// failed), or until `deadline`.
    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness>;

    /// Peers whose connection to this rank has been closed or has failed, for the
    /// diagnosis of an error (never blocks). Transports without such knowledge say none.
    fn failed_peers(&mut self) -> Vec<usize> {
        Vec::new()
    }

    /// A handle that closes this transport's connections from any thread, waking a
    /// [`Transport::wait`] in progress; after it, reads and writes fail. Used to abort a
    /// group. Transports that cannot be closed from outside say `None`.
    fn closer(&self) -> Option<Arc<dyn Closer>> {
        None
    }

    /// Where `peer` runs, for messages (its host's name and address, as far as the
    /// transport knows); `None` when it knows nothing useful.
    fn peer_host(&self, _peer: usize) -> Option<String> {
        None
    }

    /// The host of every rank (`hosts[r]`: a label, equal for ranks of one host), when
    /// the group spans several hosts with several ranks on at least one ([`spans_hosts`]):
    /// what the hierarchical all-reduce needs. `None` otherwise (the default).
    fn hosts(&self) -> Option<&[usize]> {
        None
    }

    /// Whether every rank of the group runs on this machine. Every rank of a group must
    /// answer alike (it picks the barrier algorithm); `false` (the default) is always
    /// safe.
    fn one_machine(&self) -> bool {
        false
    }
}

/// Fails with [`io::ErrorKind::NotConnected`] unless `peer` is another rank of a group of
/// `world_size`: what every transport answers for a peer it has no connection to.
///
/// ```
/// use ringccl_collectives::check_peer;
/// assert!(check_peer(0, 1, 2).is_ok());
/// assert_eq!(check_peer(0, 0, 2).unwrap_err().kind(), std::io::ErrorKind::NotConnected);
/// assert!(check_peer(0, 2, 2).is_err());
/// ```
pub fn check_peer(rank: usize, peer: usize, world_size: usize) -> io::Result<()> {
    if peer >= world_size || peer == rank {
        return Err(io::Error::new(
            io::ErrorKind::NotConnected,
            format!("rank {rank} has no connection to rank {peer} (world size {world_size})"),
        ));
    }
    Ok(())
}

/// The error of every call on an endpoint that was closed, because its group was
/// aborted ([`io::ErrorKind::ConnectionAborted`]).
///
/// ```
/// let e = ringccl_collectives::endpoint_closed(3);
/// assert_eq!(e.kind(), std::io::ErrorKind::ConnectionAborted);
/// assert!(e.to_string().contains("rank 3"));
/// ```
pub fn endpoint_closed(rank: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!("rank {rank}'s connections were closed (the group was aborted)"),
    )
}

/// Closes a transport's connections from any thread (see [`Transport::closer`]).
/// Idempotent.
pub trait Closer: Send + Sync {
    /// Closes every connection and wakes every waiter.
    fn close(&self);
}

/// Whether ranks on the hosts `host_of` gives (`host_of[r]`: a label, equal for ranks of
/// one host) sit on several hosts with several ranks on at least one: when a transport
/// answers [`Transport::hosts`], and where the hierarchical schedules differ from the
/// flat ones.
///
/// ```
/// use ringccl_collectives::spans_hosts;
/// assert!(spans_hosts(&[0, 0, 1]));
/// assert!(!spans_hosts(&[0, 1, 2]) && !spans_hosts(&[4, 4]) && !spans_hosts(&[]));
/// ```
pub fn spans_hosts(host_of: &[usize]) -> bool {
    let hosts = host_of.iter().collect::<BTreeSet<_>>().len();
    hosts > 1 && hosts < host_of.len()
}
