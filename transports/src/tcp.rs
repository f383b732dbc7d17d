//! The TCP mesh transport: one non-blocking connection per peer.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::memory_barrier::OffersMemoryBarrier;
use ringccl_collectives::peer_memory::OffersPeerMemory;
use ringccl_collectives::{spans_hosts, Closer, Readiness, Transport};
use socket2::Socket;

use crate::liveness::connection_lost;
use crate::poll::{ready_now, wait_any, Interest};
use crate::spin::{host_cores, Spin, DEFAULT_SPIN};
use crate::HostMap;

/// While spinning, the clock is read once per this many looks at the sockets.
const LOOKS_PER_CLOCK: u32 = 8;

/// A connected full mesh of TCP connections between the ranks of one group, made from
/// the rendezvous' handshaken connections.
pub struct TcpTransport {
    rank: usize,
    world_size: usize,
    /// Shared with the [`Closer`], which may shut them down from another thread.
    peers: Vec<Option<Arc<Socket>>>,
    /// Each peer's address, read at the start (a connection that failed has none).
    addresses: Vec<Option<std::net::IpAddr>>,
    /// How long `wait` polls the sockets without sleeping before it sleeps in `poll(2)`
    /// (zero: it sleeps at once).
    spin: Spin,
    /// Where every rank runs, once known ([`TcpTransport::with_hosts`]).
    map: Option<HostMap>,
    /// Every rank's host, when the group spans hosts with several ranks on one.
    hosts: Option<Vec<usize>>,
    /// How many ranks run on this machine (all, until the map says otherwise).
    ranks_here: usize,
}

impl TcpTransport {
    /// Puts handshaken connections (`peers[p]` to rank `p`, `None` at `rank`) into data
    /// mode: no Nagle delay, non-blocking, and a dead peer host noticed within about
    /// `dead_peer` (keepalive probes on idle connections, a user timeout on
    /// unacknowledged data; a slow but alive peer still acknowledges, zero-window probes
    /// included).
    pub fn new(
        rank: usize,
        peers: Vec<Option<TcpStream>>,
        dead_peer: Duration,
    ) -> io::Result<TcpTransport> {
        let world_size = peers.len();
        let addresses = peers
            .iter()
            .map(|stream| Some(stream.as_ref()?.peer_addr().ok()?.ip()))
            .collect();
        let peers = peers
            .into_iter()
            .map(|stream| {
                stream
                    .map(|s| configure(s, dead_peer).map(Arc::new))
                    .transpose()
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(TcpTransport {
            rank,
            world_size,
            peers,
            addresses,
            spin: Spin::new(DEFAULT_SPIN, world_size, host_cores()),
            map: None,
            hosts: None,
            ranks_here: world_size,
        })
    }

    /// Tells the transport where every rank runs ([`discover_hosts`](crate::discover_hosts)):
    /// a group spanning hosts then gets the topology-aware collectives over TCP too
    /// ([`Transport::hosts`]), messages name a lost peer's host, and a wait yields its
    /// core only when the ranks on this machine outnumber its cores.
    ///
    /// ```no_run
    /// # fn f(t: ringccl_transports::TcpTransport, map: ringccl_transports::HostMap) {
    /// let t = t.with_hosts(&map);
    /// assert!(t.ranks_on_this_machine() <= map.hosts.len());
    /// # }
    /// ```
    pub fn with_hosts(mut self, map: &HostMap) -> TcpTransport {
        self.hosts = spans_hosts(&map.hosts).then(|| map.hosts.clone());
        self.ranks_here = map.ranks_on_machine_of(self.rank);
        self.map = Some(map.clone());
        self.spin = Spin::new(self.spin.window, self.ranks_here, host_cores());
        self
    }

    /// How many of the group's ranks run on this machine (all of them, until
    /// [`TcpTransport::with_hosts`] says otherwise).
    ///
    /// ```no_run
    /// # fn f(t: ringccl_transports::TcpTransport) {
    /// assert!(t.ranks_on_this_machine() >= 1);
    /// # }
    /// ```
    pub fn ranks_on_this_machine(&self) -> usize {
        self.ranks_here
    }

    /// Sets how long a wait busy-polls its sockets (a `poll(2)` with no timeout, over
    /// and over) before it sleeps in `poll(2)` (at most
    /// [`MAX_SPIN`](crate::shm::MAX_SPIN)). A wake-up from sleep costs a context switch
    /// per hop; busy-polling answers the peer that much sooner, at the cost of a busy
    /// core for the window. When the group's ranks outnumber this host's cores (all of
    /// them counted as local), the wait yields its core between polls instead.
    ///
    /// ```no_run
    /// # fn f(t: ringccl_transports::TcpTransport) {
    /// let t = t.with_spin(std::time::Duration::from_micros(20));
    /// assert!(t.spin() <= std::time::Duration::from_micros(20));
    /// # }
    /// ```
    pub fn with_spin(mut self, window: Duration) -> TcpTransport {
        self.spin = Spin::new(window, self.ranks_on_this_machine(), host_cores());
        self
    }

    /// How long a wait busy-polls before it sleeps, as [`TcpTransport::with_spin`] set
    /// it.
    ///
    /// ```no_run
    /// # fn f(t: ringccl_transports::TcpTransport) {
    /// assert!(t.spin() <= ringccl_transports::shm::MAX_SPIN);
    /// # }
    /// ```
    pub fn spin(&self) -> Duration {
        self.spin.window
    }

    /// Whether `peer`'s connection has been closed or has failed (its process or host is
    /// gone). Never blocks.
    pub fn peer_gone(&self, peer: usize) -> bool {
        self.peer(peer).map_or(true, connection_lost)
    }

    /// What to `poll(2)` for on the connection to `peer`.
    pub(crate) fn interest(&self, peer: usize, read: bool, write: bool) -> io::Result<Interest> {
        Ok(Interest {
            fd: self.peer(peer)?.as_raw_fd(),
            read,
            write,
        })
    }

    /// Sends `peer` one byte that only wakes it (a shared-memory peer sleeping in
    /// `poll(2)`; see `shm/ring.rs`). Never blocks: with the connection's buffer full,
    /// bytes that will wake it are already on their way.
    pub(crate) fn send_wake_up(&self, peer: usize) {
        if let Ok(socket) = self.peer(peer) {
            // A failed send means a lost peer, which its liveness check reports.
            let _ = socket.send_with_flags(&[1], libc::MSG_NOSIGNAL);
        }
    }

    /// Reads and drops the wake-up bytes `peer` has sent, without blocking.
    pub(crate) fn drain_wake_ups(&self, peer: usize) {
        let Ok(mut socket) = self.peer(peer) else {
            return;
        };
        let mut bytes = [0u8; 64];
        // Until the buffer is empty (WouldBlock), closed (0), or failed: the last two are
        // the liveness check's to report.
        while matches!(socket.read(&mut bytes), Ok(n) if n > 0) {}
    }

    fn peer(&self, peer: usize) -> io::Result<&Socket> {
        self.peers
            .get(peer)
            .and_then(Option::as_deref)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("rank {} has no connection to rank {peer}", self.rank),
                )
            })
    }
}

/// The longest keepalive idle time and probe interval Linux accepts (`MAX_TCP_KEEPIDLE`,
/// `MAX_TCP_KEEPINTVL`: 32767 s); larger values are refused with `EINVAL`.
const MAX_KEEPALIVE: Duration = Duration::from_secs(32767);

/// The longest `TCP_USER_TIMEOUT` Linux accepts: an `int` of milliseconds (about 24 days).
const MAX_USER_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

pub(crate) fn configure(stream: TcpStream, dead_peer: Duration) -> io::Result<Socket> {
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    let socket = Socket::from(stream);
    socket.set_tcp_nodelay(true)?;
    let second = Duration::from_secs(1);
    // Saturating and clamped: a huge `dead_peer` (even `Duration::MAX`) means "as
    // patient as the kernel allows", never an overflow or a refused option.
    let fifth = dead_peer / 5;
    socket.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(fifth.saturating_mul(2).clamp(second, MAX_KEEPALIVE))
            .with_interval(fifth.clamp(second, MAX_KEEPALIVE))
            .with_retries(3),
    )?;
    socket.set_tcp_user_timeout(Some(dead_peer.min(MAX_USER_TIMEOUT)))?;
    socket.set_nonblocking(true)?;
    Ok(socket)
}

impl Transport for TcpTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn write_some(&mut self, peer: usize, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // MSG_NOSIGNAL: a dead peer is an EPIPE error here, never a SIGPIPE that kills the
        // process.
        self.peer(peer)?
            .send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
    }

    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        let mut socket = self.peer(peer)?;
        socket.read_vectored(bufs)
    }

    fn peer_host(&self, peer: usize) -> Option<String> {
        let address = self
            .addresses
            .get(peer)
            .copied()
            .flatten()
            .map(|ip| ip.to_string());
        match &self.map {
            Some(map) => map.describe(peer, address),
            None => address,
        }
    }

    fn hosts(&self) -> Option<&[usize]> {
        self.hosts.as_deref()
    }

    /// All ranks on this machine, as the host map every rank shares says (or, without
    /// one, as [`TcpTransport::ranks_on_this_machine`] assumes).
    fn one_machine(&self) -> bool {
        self.ranks_on_this_machine() == self.world_size
    }

    fn failed_peers(&mut self) -> Vec<usize> {
        (0..self.world_size)
            .filter(|&p| p != self.rank && self.peer_gone(p))
            .collect()
    }

    fn closer(&self) -> Option<Arc<dyn Closer>> {
        Some(Arc::new(TcpCloser {
            sockets: self.peers.iter().flatten().cloned().collect(),
        }))
    }

    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness> {
        let mut interests = [Interest {
            fd: -1,
            read: false,
            write: false,
        }; 2];
        let mut used = 0;
        if let Some(peer) = readable {
            interests[used] = Interest {
                fd: self.peer(peer)?.as_raw_fd(),
                read: true,
                write: writable == Some(peer),
            };
            used += 1;
        }
        if let Some(peer) = writable.filter(|&p| readable != Some(p)) {
            interests[used] = Interest {
                fd: self.peer(peer)?.as_raw_fd(),
                read: false,
                write: true,
            };
            used += 1;
        }
        let interests = &interests[..used];
        // With no window, the one look is a wasted system call: sleep at once.
        if !self.spin.window.is_zero()
            && self
                .spin
                .look(deadline, LOOKS_PER_CLOCK, || ready_now(interests))?
        {
            return Ok(Readiness::Ready);
        }
        Ok(if wait_any(interests, deadline)? {
            Readiness::Ready
        } else {
            Readiness::TimedOut
        })
    }
}

/// Processes on hosts of their own, or sharing one through sockets: no memory shared with
/// every rank (barriers are messages), no buffers read across ranks.
impl OffersMemoryBarrier for TcpTransport {}

impl OffersPeerMemory for TcpTransport {}

/// Shuts down every connection of a [`TcpTransport`]: a `poll` in progress wakes, reads
/// see the end of the stream, writes fail, and the peers see the connections close.
struct TcpCloser {
    sockets: Vec<Arc<Socket>>,
}

impl Closer for TcpCloser {
    fn close(&self) {
        for socket in &self.sockets {
            // Already shut down or reset: nothing more to do.
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}

impl fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let peers: Vec<_> = self
            .peers
            .iter()
            .map(|p| p.as_ref().and_then(|s| s.peer_addr().ok()?.as_socket()))
            .collect();
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("peers", &peers)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_huge_dead_peer_timeout_is_clamped_to_what_the_kernel_accepts() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let socket = configure(stream, Duration::MAX).unwrap();
        assert_eq!(socket.tcp_user_timeout().unwrap(), Some(MAX_USER_TIMEOUT));
        assert_eq!(socket.tcp_keepalive_time().unwrap(), MAX_KEEPALIVE);
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let socket = configure(stream, Duration::from_secs(5)).unwrap();
        assert_eq!(socket.tcp_keepalive_time().unwrap(), Duration::from_secs(2));
    }

    #[test]
    fn a_spinning_wait_sees_data_that_arrives_during_and_after_its_window() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let theirs = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mine, _) = listener.accept().unwrap();
        let window = Duration::from_millis(5);
        let mut t = TcpTransport::new(0, vec![None, Some(mine)], Duration::from_secs(5))
            .unwrap()
            .with_spin(window);
        assert!(t.spin() == window || host_cores() < 2, "{:?}", t.spin());

        // Nothing comes: the wait spins, sleeps, and times out at its deadline.
        let started = Instant::now();
        let ready = t
            .wait(None, Some(1), started + Duration::from_millis(60))
            .unwrap();
        assert_eq!(ready, Readiness::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(60));

        // A byte sent within the spin window, then one sent after it (the wait asleep).
        for delay in [Duration::from_millis(1), Duration::from_millis(80)] {
            let mut sender = theirs.try_clone().unwrap();
            let writer = std::thread::spawn(move || {
                std::thread::sleep(delay);
                std::io::Write::write_all(&mut sender, b"x").unwrap();
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            assert_eq!(t.wait(None, Some(1), deadline).unwrap(), Readiness::Ready);
            writer.join().unwrap();
            let mut byte = [0u8; 1];
            let got = t.read_some(1, &mut [IoSliceMut::new(&mut byte)]).unwrap();
            assert_eq!((got, byte), (1, *b"x"), "after {delay:?}");
        }
    }
}
