//! An in-process [`Transport`]: ranks are endpoints of a mesh of bounded byte pipes, one
//! per ordered pair of ranks, with the semantics of non-blocking sockets. For tests and
//! benchmarks only: compiled for this crate's tests and with the `test-support` feature.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::doorbell::Doorbell;
use crate::memory_barrier::OffersMemoryBarrier;
use crate::peer_memory::OffersPeerMemory;
use crate::spin::{host_cores, Spin};
use crate::transport::{check_peer, endpoint_closed, Closer, Readiness, Transport};

/// Shape of the pipes of a [`MemoryTransport`] mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Bytes buffered per ordered pair of ranks: a write to a full pipe would block.
    /// Values below 1 count as 1.
    pub capacity: usize,
    /// Most bytes one `write_some` or `read_some` call moves. Values below 1 count as 1.
    pub max_io: usize,
}

impl Default for MemoryConfig {
    /// 1 MiB per pipe, no limit per call.
    fn default() -> MemoryConfig {
        MemoryConfig {
            capacity: 1 << 20,
            max_io: usize::MAX,
        }
    }
}

/// One rank's endpoint of an in-memory mesh: a [`Transport`] whose peers are the other
/// endpoints of the same [`MemoryTransport::mesh`], typically on other threads.
///
/// Each ordered pair of ranks has a byte pipe of [`MemoryConfig::capacity`] bytes with
/// the semantics of a non-blocking socket: `write_some` takes at most
/// `min(max_io, free space)` bytes and fails with [`io::ErrorKind::WouldBlock`] when the
/// pipe is full; `read_some` returns at most `max_io` bytes, fails with `WouldBlock` when
/// the pipe is empty, and returns `Ok(0)` once the writer's endpoint has been dropped and
/// everything it wrote has been read. Writing to a dropped endpoint fails with
/// [`io::ErrorKind::BrokenPipe`]. [`Transport::wait`] looks for its spin window
/// ([`set_spin`](Self::set_spin); none by default), then sleeps on a condition variable
/// until a pipe waited on is ready, its peer is gone, or the deadline passes; a writer
/// rings the condition variable only while someone sleeps on it. Dropping an endpoint
/// closes all its pipes; the others see it in
/// [`Transport::failed_peers`]. A peer that is out of range, or this rank itself, is an
/// [`io::ErrorKind::NotConnected`] error.
///
/// # Example
///
/// Rank 0 sends a message to rank 1 through a 4-byte pipe, 3 bytes at a time:
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// use std::io::{self, ErrorKind, IoSlice, IoSliceMut};
/// use std::time::{Duration, Instant};
/// use ringccl_collectives::{MemoryConfig, MemoryTransport, Readiness, Transport};
///
/// let mut ranks = MemoryTransport::mesh(2, MemoryConfig { capacity: 4, max_io: 3 });
/// let mut rank1 = ranks.pop().expect("two ranks");
/// let mut rank0 = ranks.pop().expect("two ranks");
/// let deadline = Instant::now() + Duration::from_secs(10);
/// let timed_out = || io::Error::new(ErrorKind::TimedOut, "peer too slow");
///
/// let writer = std::thread::spawn(move || -> io::Result<()> {
///     let mut message: &[u8] = b"hello, rank 1";
///     while !message.is_empty() {
///         match rank0.write_some(1, &[IoSlice::new(message)]) {
///             Ok(n) => message = &message[n..],
///             Err(e) if e.kind() == ErrorKind::WouldBlock => {
///                 if rank0.wait(Some(1), None, deadline)? == Readiness::TimedOut {
///                     return Err(timed_out());
///                 }
///             }
///             Err(e) => return Err(e),
///         }
///     }
///     Ok(()) // dropping rank0 closes its pipes: rank 1 then reads end-of-stream
/// });
///
/// let mut received = Vec::new();
/// let mut chunk = [0u8; 8];
/// loop {
///     match rank1.read_some(0, &mut [IoSliceMut::new(&mut chunk)]) {
///         Ok(0) => break,
///         Ok(n) => received.extend_from_slice(&chunk[..n]),
///         Err(e) if e.kind() == ErrorKind::WouldBlock => {
///             if rank1.wait(None, Some(0), deadline)? == Readiness::TimedOut {
///                 return Err(timed_out());
///             }
///         }
///         Err(e) => return Err(e),
///     }
/// }
/// writer.join().map_err(|_| io::Error::other("writer panicked"))??;
/// assert_eq!(received, b"hello, rank 1");
/// assert_eq!(rank1.failed_peers(), vec![0]);
/// # Ok(())
/// # }
/// ```
pub struct MemoryTransport {
    rank: usize,
    mesh: Arc<Mesh>,
    spin: Spin,
}

/// State shared by all endpoints of one mesh.
struct Mesh {
    world_size: usize,
    config: MemoryConfig,
    /// `pipes[from * world_size + to]` carries bytes from `from` to `to`.
    pipes: Vec<Mutex<Pipe>>,
    /// One per rank: rung whenever something that rank may wait for changes.
    doorbells: Vec<Doorbell>,
    /// One per rank: its endpoint was closed ([`Transport::closer`], or dropped).
    closed: Vec<AtomicBool>,
}

impl Mesh {
    /// Closes rank `rank`'s endpoint: its pipes end for its peers, and its own calls
    /// (one waiting now included) fail from now on.
    fn close(&self, rank: usize) {
        if let Some(flag) = self.closed.get(rank) {
            flag.store(true, Ordering::Release);
        }
        let n = self.world_size;
        for peer in (0..n).filter(|&p| p != rank) {
            if let Some(pipe) = self.pipes.get(rank * n + peer) {
                pipe.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .writer_gone = true;
            }
            if let Some(pipe) = self.pipes.get(peer * n + rank) {
                let mut pipe = pipe.lock().unwrap_or_else(PoisonError::into_inner);
                pipe.reader_gone = true;
                // Nobody will read these bytes: free them now.
                pipe.bytes = VecDeque::new();
            }
            if let Some(bell) = self.doorbells.get(peer) {
                bell.ring();
            }
        }
        if let Some(bell) = self.doorbells.get(rank) {
            bell.ring();
        }
    }

    fn is_closed(&self, rank: usize) -> bool {
        self.closed
            .get(rank)
            .is_some_and(|flag| flag.load(Ordering::Acquire))
    }
}

/// Closes one endpoint from any thread (see [`Transport::closer`]).
struct MemoryCloser {
    rank: usize,
    mesh: Arc<Mesh>,
}

impl Closer for MemoryCloser {
    fn close(&self) {
        self.mesh.close(self.rank);
    }
}

#[derive(Default)]
struct Pipe {
    bytes: VecDeque<u8>,
    writer_gone: bool,
    reader_gone: bool,
}

fn poisoned<T>(_: PoisonError<T>) -> io::Error {
    io::Error::other("memory transport: a thread panicked while holding a pipe lock")
}

fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
}

impl MemoryTransport {
    /// A fully connected mesh of `world_size` ranks: endpoint `r` of the returned vector
    /// is rank `r`. Each endpoint is `Send`, so ranks can run on their own threads.
    pub fn mesh(world_size: usize, config: MemoryConfig) -> Vec<MemoryTransport> {
        let config = MemoryConfig {
            capacity: config.capacity.max(1),
            max_io: config.max_io.max(1),
        };
        let mesh = Arc::new(Mesh {
            world_size,
            config,
            pipes: (0..world_size * world_size)
                .map(|_| Mutex::default())
                .collect(),
            doorbells: (0..world_size).map(|_| Doorbell::default()).collect(),
            closed: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
        });
        (0..world_size)
            .map(|rank| MemoryTransport {
                rank,
                mesh: Arc::clone(&mesh),
                spin: Spin::NONE,
            })
            .collect()
    }

    /// Lets [`Transport::wait`] look for up to `window` before it sleeps: spinning while
    /// the mesh's ranks have a core each, yielding the core between looks when they
    /// outnumber the cores (see [`Spin`]). A peer that answers within the window then
    /// costs no futex wake-up on either side. [`crate::spin::MAX_SPIN`] at most.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ringccl_collectives::{MemoryConfig, MemoryTransport};
    ///
    /// let mut ranks = MemoryTransport::mesh(2, MemoryConfig::default());
    /// for rank in &mut ranks {
    ///     rank.set_spin(Duration::from_micros(50));
    /// }
    /// assert_eq!(ranks[0].spin(), Duration::from_micros(50));
    /// ```
    pub fn set_spin(&mut self, window: Duration) {
        self.spin = Spin::new(window, self.mesh.world_size, host_cores());
    }

    /// The spin window in force (zero: waits sleep at once).
    ///
    /// ```
    /// use ringccl_collectives::{MemoryConfig, MemoryTransport};
    ///
    /// let ranks = MemoryTransport::mesh(2, MemoryConfig::default());
    /// assert!(ranks[1].spin().is_zero());
    /// ```
    pub fn spin(&self) -> Duration {
        self.spin.window
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> MemoryConfig {
        self.mesh.config
    }

    /// The pipe from `from` to `to`, where one of them is this rank and the other a peer.
    fn pipe(&self, from: usize, to: usize) -> io::Result<&Mutex<Pipe>> {
        let peer = if from == self.rank { to } else { from };
        check_peer(self.rank, peer, self.mesh.world_size)?;
        self.mesh
            .pipes
            .get(from * self.mesh.world_size + to)
            .ok_or_else(|| io::Error::other("memory transport: pipe index out of range"))
    }

    /// Fails once this endpoint was closed.
    fn open(&self) -> io::Result<()> {
        if self.mesh.is_closed(self.rank) {
            return Err(endpoint_closed(self.rank));
        }
        Ok(())
    }

    fn lock(pipe: &Mutex<Pipe>) -> io::Result<MutexGuard<'_, Pipe>> {
        pipe.lock().map_err(poisoned)
    }

    fn ring(&self, rank: usize) {
        if let Some(bell) = self.mesh.doorbells.get(rank) {
            bell.ring();
        }
    }

    /// Whether a `write_some` to `writable` or a `read_some` from `readable` would do
    /// something other than block.
    fn ready(&self, writable: Option<usize>, readable: Option<usize>) -> io::Result<bool> {
        if self.mesh.is_closed(self.rank) {
            return Ok(true);
        }
        if let Some(peer) = writable {
            let pipe = Self::lock(self.pipe(self.rank, peer)?)?;
            if pipe.reader_gone || pipe.bytes.len() < self.mesh.config.capacity {
                return Ok(true);
            }
        }
        if let Some(peer) = readable {
            let pipe = Self::lock(self.pipe(peer, self.rank)?)?;
            if pipe.writer_gone || !pipe.bytes.is_empty() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

impl Transport for MemoryTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.mesh.world_size
    }

    fn one_machine(&self) -> bool {
        true
    }

    fn write_some(&mut self, peer: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.open()?;
        let mut pipe = Self::lock(self.pipe(self.rank, peer)?)?;
        if pipe.reader_gone {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("rank {peer} closed its endpoint"),
            ));
        }
        let wanted: usize = bufs.iter().map(|b| b.len()).sum();
        if wanted == 0 {
            return Ok(0);
        }
        let room = self.mesh.config.capacity.saturating_sub(pipe.bytes.len());
        if room == 0 {
            return Err(would_block());
        }
        let mut budget = room.min(self.mesh.config.max_io);
        let mut taken = 0;
        for buf in bufs {
            let take = budget.min(buf.len());
            pipe.bytes.extend(&buf[..take]);
            taken += take;
            budget -= take;
            if budget == 0 {
                break;
            }
        }
        drop(pipe);
        self.ring(peer);
        Ok(taken)
    }

    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.open()?;
        let mut pipe = Self::lock(self.pipe(peer, self.rank)?)?;
        if pipe.bytes.is_empty() {
            return if pipe.writer_gone {
                Ok(0)
            } else {
                Err(would_block())
            };
        }
        let mut budget = pipe.bytes.len().min(self.mesh.config.max_io);
        let mut taken = 0;
        for buf in bufs.iter_mut() {
            let take = budget.min(buf.len());
            let dst = &mut buf[..take];
            let (front, back) = pipe.bytes.as_slices();
            let split = front.len().min(take);
            dst[..split].copy_from_slice(&front[..split]);
            dst[split..].copy_from_slice(&back[..take - split]);
            pipe.bytes.drain(..take);
            taken += take;
            budget -= take;
            if budget == 0 {
                break;
            }
        }
        drop(pipe);
        if taken > 0 {
            self.ring(peer);
        }
        Ok(taken)
    }

    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness> {
        let bell = self
            .mesh
            .doorbells
            .get(self.rank)
            .ok_or_else(|| io::Error::other("memory transport: rank out of range"))?;
        if self
            .spin
            .look(deadline, 64, || self.ready(writable, readable))?
        {
            return Ok(Readiness::Ready);
        }
        bell.sleep_until_rung(deadline, || self.ready(writable, readable))
    }

    fn closer(&self) -> Option<Arc<dyn Closer>> {
        Some(Arc::new(MemoryCloser {
            rank: self.rank,
            mesh: Arc::clone(&self.mesh),
        }))
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        (0..self.mesh.world_size)
            .filter(|&peer| peer != self.rank)
            .filter(|&peer| {
                self.pipe(peer, self.rank).is_ok_and(|pipe| {
                    pipe.lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .writer_gone
                })
            })
            .collect()
    }
}

/// Byte streams only: the tests of the calls in memory run over the transports that
/// offer them.
impl OffersMemoryBarrier for MemoryTransport {}

impl OffersPeerMemory for MemoryTransport {}

impl Drop for MemoryTransport {
    fn drop(&mut self) {
        self.mesh.close(self.rank);
    }
}

impl fmt::Debug for MemoryTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.mesh.world_size)
            .field("config", &self.mesh.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn config(capacity: usize, max_io: usize) -> MemoryConfig {
        MemoryConfig { capacity, max_io }
    }

    fn write(t: &mut MemoryTransport, peer: usize, bytes: &[u8]) -> io::Result<usize> {
        t.write_some(peer, &[IoSlice::new(bytes)])
    }

    fn read(t: &mut MemoryTransport, peer: usize, len: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let n = t.read_some(peer, &mut [IoSliceMut::new(&mut buf)])?;
        buf.truncate(n);
        Ok(buf)
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_millis(20)
    }

    #[test]
    fn writes_are_capped_by_capacity_and_max_io() {
        let mut ranks = MemoryTransport::mesh(2, config(5, 3));
        let (a, b) = ranks.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut b[0]);
        assert_eq!(write(a, 1, b"abcdefgh").unwrap(), 3);
        assert_eq!(
            write(a, 1, b"defgh").unwrap(),
            2,
            "only 2 bytes of room left"
        );
        let full = write(a, 1, b"x").unwrap_err();
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(
            read(b, 0, 100).unwrap(),
            b"abc",
            "reads are capped by max_io"
        );
        assert_eq!(read(b, 0, 1).unwrap(), b"d");
        assert_eq!(read(b, 0, 100).unwrap(), b"e");
        let empty = read(b, 0, 1).unwrap_err();
        assert_eq!(empty.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn vectored_io_spans_slices_and_the_ring_wraps() {
        let mut ranks = MemoryTransport::mesh(2, config(6, 100));
        let (a, b) = ranks.split_at_mut(1);
        let (a, b) = (&mut a[0], &mut b[0]);
        for round in 0..5u8 {
            let bytes = [round, round + 1, round + 2, round + 3];
            let iov = [IoSlice::new(&bytes[..1]), IoSlice::new(&bytes[1..])];
            assert_eq!(a.write_some(1, &iov).unwrap(), 4);
            let (mut x, mut y) = ([0u8; 3], [0u8; 3]);
            let mut iov = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
            assert_eq!(b.read_some(0, &mut iov).unwrap(), 4);
            assert_eq!((x, y[0]), ([round, round + 1, round + 2], round + 3));
        }
        assert_eq!(a.write_some(1, &[]).unwrap(), 0);
    }

    #[test]
    fn bad_peers_are_errors_not_panics() {
        let mut ranks = MemoryTransport::mesh(2, config(0, 0));
        let t = &mut ranks[0];
        assert_eq!(t.config(), config(1, 1));
        for peer in [0, 2, usize::MAX] {
            let kind = write(t, peer, b"x").unwrap_err().kind();
            assert_eq!(kind, io::ErrorKind::NotConnected);
            assert!(read(t, peer, 1).is_err());
            assert!(t.wait(Some(peer), None, soon()).is_err());
            assert!(t.wait(None, Some(peer), soon()).is_err());
        }
    }

    #[test]
    fn a_dropped_endpoint_is_end_of_stream_after_its_data() {
        let mut ranks = MemoryTransport::mesh(3, MemoryConfig::default());
        let gone = ranks.remove(1);
        let mut a = ranks.remove(0);
        let mut gone = gone;
        write(&mut gone, 0, b"last words").unwrap();
        write(&mut a, 1, b"unread").unwrap();
        drop(gone);
        assert_eq!(a.failed_peers(), vec![1]);
        assert_eq!(a.wait(None, Some(1), soon()).unwrap(), Readiness::Ready);
        assert_eq!(read(&mut a, 1, 100).unwrap(), b"last words");
        assert_eq!(read(&mut a, 1, 100).unwrap(), b"");
        let kind = write(&mut a, 1, b"x").unwrap_err().kind();
        assert_eq!(kind, io::ErrorKind::BrokenPipe);
        assert_eq!(a.wait(Some(1), None, soon()).unwrap(), Readiness::Ready);
        assert!(ranks[0].failed_peers().contains(&1));
    }

    #[test]
    fn wait_times_out_when_nothing_moves() {
        let mut ranks = MemoryTransport::mesh(2, config(1, 1));
        let t = &mut ranks[0];
        let start = Instant::now();
        assert_eq!(t.wait(None, Some(1), soon()).unwrap(), Readiness::TimedOut);
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_eq!(t.wait(Some(1), None, soon()).unwrap(), Readiness::Ready);
        write(t, 1, b"x").unwrap();
        assert_eq!(t.wait(Some(1), None, soon()).unwrap(), Readiness::TimedOut);
    }

    #[test]
    fn wait_wakes_when_the_peer_writes() {
        let mut ranks = MemoryTransport::mesh(2, config(1, 1));
        let mut b = ranks.pop().unwrap();
        let mut a = ranks.pop().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(10));
                write(&mut a, 1, b"x").unwrap();
                // Blocks until b has read the first byte.
                assert_eq!(a.wait(Some(1), None, deadline).unwrap(), Readiness::Ready);
                write(&mut a, 1, b"y").unwrap();
            });
            let mut got = Vec::new();
            while got.len() < 2 {
                assert_eq!(b.wait(None, Some(0), deadline).unwrap(), Readiness::Ready);
                got.extend(read(&mut b, 0, 1).unwrap());
            }
            assert_eq!(got, b"xy");
        });
        assert!(Instant::now() < deadline);
    }

    /// A 1-byte ping-pong: every wait must be woken by the peer's write, whether it
    /// sleeps at once, spins first or yields first.
    #[test]
    fn a_ping_pong_loses_no_wake_up_with_or_without_a_spin_window() {
        for window in [Duration::ZERO, Duration::from_micros(20)] {
            for yields in [false, true] {
                let mut ranks = MemoryTransport::mesh(2, config(1, 1));
                for rank in &mut ranks {
                    rank.spin = Spin { window, yields };
                }
                let mut b = ranks.pop().unwrap();
                let mut a = ranks.pop().unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                let rounds = 2000;
                let echo = std::thread::spawn(move || -> io::Result<()> {
                    for _ in 0..rounds {
                        let byte = loop {
                            match read(&mut b, 0, 1) {
                                Ok(byte) => break byte,
                                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                    assert_eq!(b.wait(None, Some(0), deadline)?, Readiness::Ready);
                                }
                                Err(e) => return Err(e),
                            }
                        };
                        while write(&mut b, 0, &byte)? == 0 {}
                    }
                    Ok(())
                });
                for round in 0..rounds {
                    let byte = [round as u8];
                    loop {
                        match write(&mut a, 1, &byte) {
                            Ok(1) => break,
                            Ok(_) => unreachable!("one byte"),
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                assert_eq!(
                                    a.wait(Some(1), None, deadline).unwrap(),
                                    Readiness::Ready
                                );
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    let back = loop {
                        match read(&mut a, 1, 1) {
                            Ok(back) => break back,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                let ready = a.wait(None, Some(1), deadline).unwrap();
                                assert_eq!(
                                    ready,
                                    Readiness::Ready,
                                    "window {window:?}, round {round}"
                                );
                            }
                            Err(e) => panic!("{e}"),
                        }
                    };
                    assert_eq!(back, byte);
                }
                echo.join().unwrap().unwrap();
            }
        }
    }
}
