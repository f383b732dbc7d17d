//! The shared-memory rings between ranks that are threads of one process: the rings of
//! [`ShmTransport`](super::ShmTransport), in anonymous memory (no `/dev/shm` file, no
//! set-up through a store), with liveness read from flags in the same memory instead of
//! TCP connections. The ranks may also read each other's buffers
//! ([`OffersPeerMemory`]).

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::memory_barrier::OffersMemoryBarrier;
use ringccl_collectives::peer_memory::{OffersPeerMemory, PeerAccess, PeerMemory};
use ringccl_collectives::spin::{host_cores, Spin};
use ringccl_collectives::{check_peer, endpoint_closed, Closer, Readiness, Transport};

use super::mapping::{futex_wake, Mapping};
use super::ring::{inbox_len, Rings};
use super::LOOKS_PER_CLOCK;

/// Longest sleep between two looks at the peers' flags (a close also wakes sleepers at
/// once; this only bounds a wake-up that raced with going to sleep).
const FLAG_SLICE: Duration = Duration::from_millis(50);

/// One rank of a mesh of ranks living in one process, connected by single-producer,
/// single-consumer byte rings in memory: the same rings, the same copy-once-each-way
/// protocol and the same futex doorbells as the shared-memory transport between
/// processes. [`InProcessTransport::mesh`] builds all the ranks at once; give each to
/// its own thread.
///
/// A rank's endpoint closes when it is dropped or its [`Transport::closer`] fires: its
/// peers then read the end of its streams once drained, see it in
/// [`Transport::failed_peers`], and are woken if they sleep.
///
/// ```
/// use std::io::{IoSlice, IoSliceMut};
/// use std::time::{Duration, Instant};
/// use ringccl_collectives::{Readiness, Transport};
/// use ringccl_transports::InProcessTransport;
///
/// let mut ranks = InProcessTransport::mesh(2, 4096)?;
/// let mut one = ranks.pop().expect("two ranks");
/// let mut zero = ranks.pop().expect("two ranks");
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let reader = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
///     let mut buf = [0u8; 5];
///     loop {
///         match one.read_some(0, &mut [IoSliceMut::new(&mut buf)]) {
///             Ok(n) => return Ok(buf[..n].to_vec()),
///             Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
///                 assert_eq!(one.wait(None, Some(0), deadline)?, Readiness::Ready);
///             }
///             Err(e) => return Err(e),
///         }
///     }
/// });
/// assert_eq!(zero.write_some(1, &[IoSlice::new(b"hello")])?, 5);
/// assert_eq!(reader.join().expect("reader")?, b"hello");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct InProcessTransport {
    rank: usize,
    rings: Rings,
    closed: Arc<Closed>,
    spin: Spin,
}

/// Which ranks of the mesh have closed their endpoint, and how to wake them all.
struct Closed {
    flags: Vec<AtomicBool>,
    /// Every rank's inbox, for ringing every bell on a close.
    inboxes: Vec<Arc<Mapping>>,
    /// The ranks' buffers, whose waits a close ends too.
    peer_memory: Arc<PeerMemory>,
}

impl Closed {
    fn is(&self, rank: usize) -> bool {
        self.flags
            .get(rank)
            .is_some_and(|f| f.load(Ordering::Acquire))
    }

    /// Closes `rank`'s endpoint and wakes every rank that sleeps, so that waits on it
    /// (and its own) return at once.
    fn close(&self, rank: usize) {
        if let Some(flag) = self.flags.get(rank) {
            flag.store(true, Ordering::Release);
        }
        self.peer_memory.close(rank);
        for inbox in &self.inboxes {
            let bell = inbox.atomic_u32(0);
            bell.fetch_add(1, Ordering::SeqCst);
            futex_wake(bell);
        }
    }
}

struct InProcessCloser {
    rank: usize,
    closed: Arc<Closed>,
}

impl Closer for InProcessCloser {
    fn close(&self) {
        self.closed.close(self.rank);
    }
}

impl InProcessTransport {
    /// `world_size` connected ranks, with a ring of `ring_bytes` bytes (at least 64) per
    /// ordered pair: endpoint `r` of the returned vector is rank `r`. Waits spin for
    /// [`DEFAULT_SPIN`](super::DEFAULT_SPIN) before they sleep (see
    /// [`set_spin`](Self::set_spin)). Fails only if the memory cannot be mapped.
    ///
    /// ```
    /// let ranks = ringccl_transports::InProcessTransport::mesh(3, 1 << 16)?;
    /// assert_eq!(ranks.len(), 3);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn mesh(world_size: usize, ring_bytes: usize) -> io::Result<Vec<InProcessTransport>> {
        let ring_bytes = ring_bytes.max(64);
        let len = inbox_len(world_size, ring_bytes);
        let inboxes = (0..world_size)
            .map(|_| Mapping::anonymous(len).map(Arc::new))
            .collect::<io::Result<Vec<_>>>()?;
        let closed = Arc::new(Closed {
            flags: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
            inboxes: inboxes.clone(),
            peer_memory: PeerMemory::new(world_size),
        });
        let spin = Spin::new(super::DEFAULT_SPIN, world_size, host_cores());
        Ok((0..world_size)
            .map(|rank| InProcessTransport {
                rank,
                rings: Rings {
                    ring_bytes,
                    inboxes: inboxes.iter().cloned().map(Some).collect(),
                    slots: (0..world_size).map(Some).collect(),
                    tails_seen: (0..world_size).map(|_| AtomicU64::new(0)).collect(),
                },
                closed: Arc::clone(&closed),
                spin,
            })
            .collect())
    }

    /// Sets how long a wait looks at the rings before it sleeps (at most
    /// [`MAX_SPIN`](super::MAX_SPIN)): spinning while the mesh's ranks have a core each,
    /// yielding the core between looks when they outnumber the cores.
    ///
    /// ```
    /// use std::time::Duration;
    /// let mut ranks = ringccl_transports::InProcessTransport::mesh(2, 4096)?;
    /// ranks[0].set_spin(Duration::ZERO);
    /// assert!(ranks[0].spin().is_zero());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_spin(&mut self, window: Duration) {
        self.spin = Spin::new(window, self.rings.inboxes.len(), host_cores());
    }

    /// The spin window in force.
    ///
    /// ```
    /// let ranks = ringccl_transports::InProcessTransport::mesh(2, 4096)?;
    /// assert_eq!(ranks[1].spin(), ringccl_transports::shm::DEFAULT_SPIN);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn spin(&self) -> Duration {
        self.spin.window
    }

    fn check_peer(&self, peer: usize) -> io::Result<()> {
        check_peer(self.rank, peer, self.rings.inboxes.len())
    }

    fn open(&self) -> io::Result<()> {
        if self.closed.is(self.rank) {
            return Err(endpoint_closed(self.rank));
        }
        Ok(())
    }

    /// Whether a read from `readable` or a write to `writable` would not block, or
    /// would fail because an endpoint closed.
    fn ready(&self, writable: Option<usize>, readable: Option<usize>) -> bool {
        let me = self.rank;
        let closed = |peer: Option<usize>| peer.is_some_and(|p| self.closed.is(p));
        self.closed.is(me)
            || closed(writable)
            || closed(readable)
            || readable.is_some_and(|p| self.rings.used(p, me) > 0)
            || writable.is_some_and(|p| self.rings.used(me, p) < self.rings.ring_bytes)
    }
}

impl Transport for InProcessTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.rings.inboxes.len()
    }

    fn write_some(&mut self, peer: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        self.open()?;
        if self.closed.is(peer) {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("rank {peer} closed its endpoint"),
            ));
        }
        // In one process nobody sleeps in poll(2): a bell is all a wake-up needs.
        let (written, _) = self.rings.write(self.rank, peer, bufs);
        match written {
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            written => Ok(written),
        }
    }

    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        self.open()?;
        // The flag first: a peer publishes its last bytes before it closes, so if it was
        // closed before this read, an empty ring really is the end of its stream.
        let peer_closed = self.closed.is(peer);
        let (read, _) = self.rings.read(self.rank, peer, bufs);
        match read {
            0 if peer_closed => Ok(0),
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            read => Ok(read),
        }
    }

    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness> {
        for peer in [writable, readable].into_iter().flatten() {
            self.check_peer(peer)?;
        }
        if self.spin.look(deadline, LOOKS_PER_CLOCK, || {
            Ok(self.ready(writable, readable))
        })? {
            return Ok(Readiness::Ready);
        }
        let me = self.rank;
        loop {
            let seen = self.rings.bell(me).map_or(0, |b| b.load(Ordering::Acquire));
            if self.ready(writable, readable) {
                return Ok(Readiness::Ready);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(Readiness::TimedOut);
            }
            let slice = (deadline - now).min(FLAG_SLICE);
            if self
                .rings
                .sleep(me, seen, slice, || self.ready(writable, readable))
            {
                return Ok(Readiness::Ready);
            }
        }
    }

    fn closer(&self) -> Option<Arc<dyn Closer>> {
        Some(Arc::new(InProcessCloser {
            rank: self.rank,
            closed: Arc::clone(&self.closed),
        }))
    }

    fn one_machine(&self) -> bool {
        true
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        (0..self.world_size())
            .filter(|&peer| peer != self.rank && self.closed.is(peer))
            .collect()
    }
}

/// The ranks are threads of this process: they may read each other's buffers.
impl OffersPeerMemory for InProcessTransport {
    fn peer_memory(&self) -> Option<PeerAccess<'_>> {
        Some(PeerAccess {
            memory: &self.closed.peer_memory,
            spin: self.spin,
        })
    }
}

/// No barrier in memory: barriers between the threads are messages over the rings.
impl OffersMemoryBarrier for InProcessTransport {}

impl Drop for InProcessTransport {
    fn drop(&mut self) {
        self.closed.close(self.rank);
    }
}

impl fmt::Debug for InProcessTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InProcessTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.rings.inboxes.len())
            .field("ring_bytes", &self.rings.ring_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    fn read(t: &mut InProcessTransport, peer: usize, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = t.read_some(peer, &mut [IoSliceMut::new(&mut buf)])?;
        buf.truncate(n);
        Ok(buf)
    }

    #[test]
    fn a_large_message_streams_through_a_small_ring_intact() {
        let mut ranks = InProcessTransport::mesh(2, 256).unwrap();
        let mut one = ranks.pop().unwrap();
        let mut zero = ranks.pop().unwrap();
        let message: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let expected = message.clone();
        let deadline = Instant::now() + Duration::from_secs(60);
        let writer = thread::spawn(move || -> io::Result<()> {
            let mut rest = &message[..];
            while !rest.is_empty() {
                match zero.write_some(1, &[IoSlice::new(rest)]) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        assert_eq!(zero.wait(Some(1), None, deadline)?, Readiness::Ready);
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(()) // dropping zero closes its end: rank 1 reads the end of stream
        });
        let mut got = Vec::new();
        loop {
            match read(&mut one, 0, 1000) {
                Ok(bytes) if bytes.is_empty() => break,
                Ok(bytes) => got.extend(bytes),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert_eq!(one.wait(None, Some(0), deadline).unwrap(), Readiness::Ready);
                }
                Err(e) => panic!("{e}"),
            }
        }
        writer.join().unwrap().unwrap();
        assert_eq!(got, expected);
        assert_eq!(one.failed_peers(), vec![0]);
    }

    /// A peer that writes its last bytes and closes at once: the reader always gets
    /// every byte before the end of the stream.
    #[test]
    fn the_last_bytes_before_a_close_are_never_lost() {
        for round in 0..2000u32 {
            let mut ranks = InProcessTransport::mesh(2, 4096).unwrap();
            let mut one = ranks.pop().unwrap();
            let mut zero = ranks.pop().unwrap();
            let writer = thread::spawn(move || {
                let sent = zero.write_some(1, &[IoSlice::new(&round.to_le_bytes())]);
                assert_eq!(sent.unwrap(), 4);
                drop(zero); // closes at once
            });
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut got = Vec::new();
            loop {
                match read(&mut one, 0, 8) {
                    Ok(bytes) if bytes.is_empty() => break,
                    Ok(bytes) => got.extend(bytes),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        one.wait(None, Some(0), deadline).unwrap();
                    }
                    Err(e) => panic!("round {round}: {e}"),
                }
            }
            writer.join().unwrap();
            assert_eq!(got, round.to_le_bytes(), "round {round}");
        }
    }

    #[test]
    fn a_close_wakes_a_sleeping_peer_at_once_and_fails_its_writes() {
        let mut ranks = InProcessTransport::mesh(3, 4096).unwrap();
        for rank in &mut ranks {
            rank.set_spin(Duration::ZERO);
        }
        let closer = ranks[2].closer().unwrap();
        let mut zero = ranks.remove(0);
        let started = Instant::now();
        let sleeper = thread::spawn(move || {
            let ready = zero.wait(None, Some(2), Instant::now() + Duration::from_secs(30));
            (
                ready.unwrap(),
                started.elapsed(),
                read(&mut zero, 2, 8).unwrap(),
            )
        });
        thread::sleep(Duration::from_millis(100));
        closer.close();
        let (ready, took, eof) = sleeper.join().unwrap();
        assert_eq!(ready, Readiness::Ready);
        assert!(took < Duration::from_secs(10), "woken after {took:?}");
        assert!(eof.is_empty(), "end of stream from a closed peer");
        let one = &mut ranks[0];
        let err = one.write_some(2, &[IoSlice::new(b"x")]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
        let own = ranks[1].read_some(0, &mut [IoSliceMut::new(&mut [0u8; 4])]);
        assert_eq!(own.unwrap_err().kind(), io::ErrorKind::ConnectionAborted);
    }

    #[test]
    fn a_wait_times_out_and_bad_peers_are_errors() {
        let mut ranks = InProcessTransport::mesh(2, 4096).unwrap();
        let zero = &mut ranks[0];
        let deadline = Instant::now() + Duration::from_millis(30);
        assert_eq!(
            zero.wait(None, Some(1), deadline).unwrap(),
            Readiness::TimedOut
        );
        assert!(Instant::now() >= deadline);
        for peer in [0, 2] {
            let err = zero.write_some(peer, &[IoSlice::new(b"x")]).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::NotConnected, "peer {peer}");
            let err = zero.wait(Some(peer), None, deadline).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::NotConnected, "peer {peer}");
        }
        assert_eq!(zero.write_some(1, &[]).unwrap(), 0);
    }
}
