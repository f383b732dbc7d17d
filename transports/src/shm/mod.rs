//! The same-host shared-memory transport.
//!
//! Every rank owns an *inbox*: a file under `/dev/shm` holding one futex "doorbell" word
//! and, for every other rank, a single-producer/single-consumer byte ring that rank writes
//! into. A writer copies into the ring, publishes the new head, then rings the reader's
//! bell; a reader copies out, publishes the new tail, then rings the writer's bell (space
//! was freed). `wait` sleeps on the rank's own bell — no spinning — in slices that also
//! check the peers' TCP connections, which stay open as the liveness channel: a process
//! that dies closes them, and its peers report it instead of waiting for the deadline.
//!
//! The inbox files are unlinked as soon as every rank has mapped every inbox, so nothing
//! is left in `/dev/shm` once the group is up, even if a process is killed later.

mod mapping;
mod ring;
mod setup;

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::{Closer, Readiness, Transport};

use crate::TcpTransport;
use mapping::futex_wait;
use ring::Rings;
pub use ring::DEFAULT_RING_BYTES;
pub use setup::{set_up, SharedRings, ShmUnavailable};

/// How often a sleeping rank looks at its peers' liveness.
const LIVENESS_SLICE: Duration = Duration::from_millis(50);

/// Ranks connected through shared memory (all on one host), with the TCP mesh kept as
/// the liveness channel.
pub struct ShmTransport {
    tcp: TcpTransport,
    rings: Rings,
    gone: Vec<bool>,
}

impl ShmTransport {
    /// Moves the ranks onto the rings [`set_up`] mapped, keeping `tcp`'s connections as
    /// the liveness channel.
    pub fn new(rings: SharedRings, tcp: TcpTransport) -> ShmTransport {
        let n = tcp.world_size();
        ShmTransport {
            tcp,
            rings: rings.0,
            gone: vec![false; n],
        }
    }

    fn check_peer(&self, peer: usize) -> io::Result<()> {
        if peer >= self.rings.inboxes.len() || peer == self.tcp.rank() {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("no ring to rank {peer}"),
            ));
        }
        Ok(())
    }
}

impl Transport for ShmTransport {
    fn rank(&self) -> usize {
        self.tcp.rank()
    }

    fn world_size(&self) -> usize {
        self.tcp.world_size()
    }

    fn write_some(&mut self, peer: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        if self.gone[peer] {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the peer's process is gone",
            ));
        }
        match self.rings.write(self.rank(), peer, bufs) {
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            written => Ok(written),
        }
    }

    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        match self.rings.read(self.rank(), peer, bufs) {
            // The peer's process is gone and its ring is drained: end of stream.
            0 if self.gone[peer] => Ok(0),
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            read => Ok(read),
        }
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        self.tcp.failed_peers()
    }

    /// Closing the liveness connections is enough: a waiter looks at them every
    /// `LIVENESS_SLICE`, sees them gone and fails, and so do the peers'.
    fn closer(&self) -> Option<Arc<dyn Closer>> {
        self.tcp.closer()
    }

    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness> {
        let me = self.rank();
        loop {
            let seen = self.rings.bell(me).load(Ordering::Acquire);
            let can_read = readable.is_some_and(|p| self.rings.used(p, me) > 0);
            let can_write =
                writable.is_some_and(|p| self.rings.used(me, p) < self.rings.ring_bytes);
            if can_read || can_write {
                return Ok(Readiness::Ready);
            }
            for peer in [readable, writable].into_iter().flatten() {
                if !self.gone[peer] && self.tcp.peer_gone(peer) {
                    self.gone[peer] = true;
                }
                if self.gone[peer] {
                    return Ok(Readiness::Ready); // the next read or write reports it
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Readiness::TimedOut);
            }
            futex_wait(
                self.rings.bell(me),
                seen,
                (deadline - now).min(LIVENESS_SLICE),
            );
        }
    }
}

impl fmt::Debug for ShmTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmTransport")
            .field("rank", &self.tcp.rank())
            .field("world_size", &self.tcp.world_size())
            .field("ring_bytes", &self.rings.ring_bytes)
            .finish_non_exhaustive()
    }
}
