//! The same-host shared-memory transport.
//!
//! Every rank owns an *inbox*: a segment of `/dev/shm` holding one futex "doorbell" word
//! and, for every other rank, a single-producer/single-consumer byte ring that rank writes
//! into. A writer copies into the ring, publishes the new head, then rings the reader's
//! bell; a reader copies out, publishes the new tail, then rings the writer's bell (space
//! was freed); the bell costs a `FUTEX_WAKE` syscall only while that rank sleeps
//! (`ring.rs` has the protocol and why no wake-up is lost). `wait` first spins on the
//! rings for a short window (`RINGCCL_SPIN_US`, 50 µs by default; yielding its core
//! between looks when the host's ranks outnumber its cores), then sleeps on the rank's own bell in slices. Between
//! slices, and at most every `LIVENESS_EVERY`, it checks the peers' TCP connections,
//! which stay open as the liveness channel: a process that dies closes them, and its
//! peers report it instead of waiting for the deadline.
//!
//! # Segments: unnamed, reserved, owner-only
//!
//! An inbox is an *unnamed* file in `/dev/shm` (`O_TMPFILE | O_EXCL`, mode `0600`,
//! every byte reserved with `posix_fallocate`). Its owner publishes a ticket — pid,
//! descriptor, device, inode, size — through the rendezvous store; peers open
//! `/proc/<pid>/fd/<fd>` and map the file only after checking that it is a regular file
//! with exactly that device and inode, owned by the user they run as, with no group or
//! other permission bits, no name, that size, and every byte allocated. Once every rank
//! has mapped every inbox, the owner closes its descriptor: from then on the memory is
//! reachable only through the ranks' mappings, and the kernel frees it when the last one
//! goes (`shm/inbox.rs` has the details).
//!
//! Why this design rather than (a) random names created with `O_CREAT | O_EXCL |
//! O_NOFOLLOW` or (b) `memfd_create` passed with `SCM_RIGHTS`:
//!
//! - **Nothing is ever left behind.** A named segment outlives a process SIGKILLed
//!   between creating it and unlinking it (a) and then needs a sweep at the next start;
//!   an unnamed one is freed by the kernel with its last descriptor or mapping.
//! - **Nothing to find, guess, plant or follow.** No name ever appears in `/dev/shm`, so
//!   a stranger listing it sees nothing, cannot pre-create a file or a symlink where a
//!   rank will look, and there is no path lookup in `/dev/shm` to trick; the peer's path
//!   is built from two integers under `/proc`, and what it reaches is checked before use.
//! - **The container's limit still applies.** The file lives in `/dev/shm`, so it counts
//!   against `docker run --shm-size` like before, and reserving it at creation turns a
//!   full `/dev/shm` into a set-up error naming the bytes needed and free — never a
//!   SIGBUS in the middle of a collective. A memfd (b) would live outside that limit and
//!   needs a Unix socket per pair beside the TCP mesh, for the same protection.
//!
//! # What is protected, and what is not
//!
//! - **Another user** (not root) can neither read nor write a job's rings: the segment's
//!   mode is `0600`, and `/proc/<pid>/fd` of another user's process cannot be opened.
//!   Nor can he make a rank map a file of his: peers refuse a file not owned by their
//!   own user. With `RINGCCL_AUTH_TOKEN` set he cannot publish a forged ticket either,
//!   since the store refuses him; without it, a forged ticket still only names files that
//!   fail the checks above.
//! - **The same user, and root, are trusted.** A process of the same user can open the
//!   segment through `/proc/<pid>/fd` while set-up runs, and can read the ranks' memory
//!   with `ptrace` or `/proc/<pid>/mem` at any time (unless Yama forbids it): no
//!   shared-memory design keeps out someone who can read the process. In a container
//!   where every process runs as root, every process there is trusted. Run untrusted
//!   code as another user, or force `RINGCCL_TRANSPORT=tcp` with a token — which guards
//!   the connections, not memory.
//! - **Requirements.** Every rank must run as one user, in one PID namespace (it is part
//!   of the host identity, so `auto` falls back to TCP otherwise), and must be dumpable
//!   (no `prctl(PR_SET_DUMPABLE, 0)`, no set-uid launcher). `auto` falls back to TCP,
//!   with a logged warning saying why, when any of this or the space is missing; a forced
//!   `RINGCCL_TRANSPORT=shm` fails with that reason instead.

mod in_process;
mod inbox;
mod mapping;
mod ring;
mod setup;
mod shared_buffer;
mod space;
#[cfg(test)]
mod test_store;
#[cfg(test)]
mod tests;

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::memory_barrier::{
    Arrivals, Awaited, MemoryBarrier, OffersMemoryBarrier, SharedTicket,
};
use ringccl_collectives::peer_memory::OffersPeerMemory;
use ringccl_collectives::wire::FRAME_HEADER_LEN;
use ringccl_collectives::{check_peer, Closer, Readiness, Transport};

use crate::poll::{ready_now, wait_any};
pub use crate::setup_errors::ShmUnavailable;
use crate::spin::{host_cores, Spin};
use crate::TcpTransport;
pub use in_process::InProcessTransport;
use mapping::read_process;
pub use ring::DEFAULT_RING_BYTES;
use ring::{in_poll_for, Ring, Rings};
pub use setup::{set_up, SharedRings};
pub use shared_buffer::{copy_elements, SharedBuffer};
use shared_buffer::{ticket_for, PeerBuffers};

/// Longest sleep between two looks at the peers' liveness.
const LIVENESS_SLICE: Duration = Duration::from_millis(50);
/// Shortest time between two looks at the peers' liveness (a `poll` per peer): a wait
/// that sleeps often does not pay for one each time.
const LIVENESS_EVERY: Duration = Duration::from_millis(2);
pub use crate::spin::{DEFAULT_SPIN, MAX_SPIN};
/// Spinning checks the clock once per this many looks at the rings.
const LOOKS_PER_CLOCK: u32 = 32;

/// Ranks connected through shared memory where they share a host, and through the TCP
/// mesh otherwise; the TCP connections to the local peers stay open as their liveness
/// channel (and carry the byte that wakes a rank sleeping in `poll`).
pub struct ShmTransport {
    tcp: TcpTransport,
    rings: Rings,
    gone: Vec<bool>,
    /// How long `wait` spins before it sleeps (zero: it sleeps at once).
    spin: Spin,
    /// When `wait` last looked at the peers' liveness.
    last_look: Instant,
    /// Every pair of the group's ranks shares memory: barriers run in it.
    memory_barrier: bool,
    /// `processes[r]`: rank `r`'s process, whose memory this rank may read (see
    /// [`SharedRings`]); all `None` when the ranks do not read each other's memory.
    processes: Vec<Option<u32>>,
    /// The peers' shared buffers mapped here.
    peer_buffers: PeerBuffers,
}

impl ShmTransport {
    /// Moves the local peers onto the rings [`set_up`] mapped, the others staying on
    /// `tcp`'s connections, which remain the local peers' liveness channel. Waits spin for [`DEFAULT_SPIN`] before they sleep (see
    /// [`ShmTransport::with_spin`]).
    pub fn new(rings: SharedRings, tcp: TcpTransport) -> ShmTransport {
        let n = tcp.world_size();
        let SharedRings {
            rings,
            map,
            with_every_rank,
            processes,
        } = rings;
        let tcp = tcp.with_hosts(&map);
        ShmTransport {
            spin: Spin::new(DEFAULT_SPIN, tcp.ranks_on_this_machine(), host_cores()),
            tcp,
            rings,
            gone: vec![false; n],
            last_look: Instant::now(),
            memory_barrier: with_every_rank,
            processes,
            peer_buffers: PeerBuffers::default(),
        }
    }

    /// Sets how long a wait spins on the rings before it sleeps on the futex (at most
    /// [`MAX_SPIN`]). Spinning answers a peer a few microseconds sooner at the cost of
    /// a busy core for that long; when the ranks on this host outnumber its cores, the
    /// wait yields its core between looks instead of spinning (see `spin.rs`).
    ///
    /// ```no_run
    /// # fn f(t: ringccl_transports::ShmTransport) {
    /// let t = t.with_spin(std::time::Duration::from_micros(20));
    /// assert!(t.spin() <= std::time::Duration::from_micros(20));
    /// # }
    /// ```
    pub fn with_spin(mut self, window: Duration) -> ShmTransport {
        self.tcp = self.tcp.with_spin(window);
        self.spin = Spin::new(window, self.tcp.ranks_on_this_machine(), host_cores());
        self
    }

    /// How this rank reaches `peer`: `"self"`, `"shm"` (the two share memory) or
    /// `"tcp"` (another host, or a pair whose shared memory could not be set up).
    ///
    /// ```
    /// # fn f(t: ringccl_transports::ShmTransport) {
    /// assert_eq!(t.peer_transport(ringccl_collectives::Transport::rank(&t)), "self");
    /// # }
    /// ```
    pub fn peer_transport(&self, peer: usize) -> &'static str {
        if peer == self.tcp.rank() {
            "self"
        } else if self.rings.has(peer) {
            "shm"
        } else {
            "tcp"
        }
    }

    /// How long a wait spins (or yields) before it sleeps, as [`ShmTransport::with_spin`]
    /// set it.
    ///
    /// ```no_run
    /// # fn f(t: ringccl_transports::ShmTransport) {
    /// assert!(t.spin() <= ringccl_transports::shm::MAX_SPIN);
    /// # }
    /// ```
    pub fn spin(&self) -> Duration {
        self.spin.window
    }

    /// Whether one of `peers` has gone away, looking at their connections at most every
    /// [`LIVENESS_EVERY`] (a peer once seen gone stays gone).
    fn any_gone(&mut self, peers: [Option<usize>; 2], now: Instant) -> bool {
        if now.duration_since(self.last_look) >= LIVENESS_EVERY {
            self.last_look = now;
            for peer in peers.into_iter().flatten() {
                if !self.gone[peer] && self.tcp.peer_gone(peer) {
                    self.gone[peer] = true;
                }
            }
        }
        peers.into_iter().flatten().any(|peer| self.gone[peer])
    }

    /// The first rank that has not arrived at barrier `seq` and whose connection is gone,
    /// looking at the connections at most every [`LIVENESS_EVERY`]. A rank that arrived
    /// and then left (its last barrier before it exits) is not one.
    fn first_gone_missing(&mut self, seq: u64, now: Instant) -> Option<usize> {
        let me = self.rank();
        if now.duration_since(self.last_look) >= LIVENESS_EVERY {
            self.last_look = now;
            for peer in (0..self.gone.len()).filter(|&p| p != me) {
                if !self.gone[peer] && !self.rings.arrived(peer, seq) && self.tcp.peer_gone(peer) {
                    self.gone[peer] = true;
                }
            }
        }
        (0..self.gone.len()).find(|&p| self.gone[p] && !self.rings.arrived(p, seq))
    }

    fn check_peer(&self, peer: usize) -> io::Result<()> {
        check_peer(self.tcp.rank(), peer, self.rings.inboxes.len())
    }

    /// The wait on the rings that `wait` and the barrier in memory share: looks with
    /// `ready` through the spin window, then sleeps on this rank's bell in slices of at
    /// most [`LIVENESS_SLICE`], asking `gone` (with the time) between them whether a
    /// peer it waits for has gone, until `ready` holds, `gone` names one, or `slice`
    /// (counted from the first look at the clock after the spin) or `deadline` passes.
    fn spin_then_sleep<G>(
        &mut self,
        (deadline, slice): (Instant, Duration),
        ready: impl Fn(&Rings) -> bool,
        mut gone: impl FnMut(&mut ShmTransport, Instant) -> Option<G>,
    ) -> io::Result<Waited<G>> {
        let me = self.rank();
        let rings = &self.rings;
        if self
            .spin
            .look(deadline, LOOKS_PER_CLOCK, || Ok(ready(rings)))?
        {
            return Ok(Waited::Ready);
        }
        let mut until = None;
        loop {
            let seen = self.rings.bell(me).map_or(0, |b| b.load(Ordering::Acquire));
            if ready(&self.rings) {
                return Ok(Waited::Ready);
            }
            let now = Instant::now();
            let until = *until.get_or_insert_with(|| {
                now.checked_add(slice)
                    .map_or(deadline, |end| end.min(deadline))
            });
            if let Some(which) = gone(self, now) {
                return Ok(Waited::Gone(which));
            }
            if now >= until {
                return Ok(Waited::TimedOut);
            }
            let slice = (until - now).min(LIVENESS_SLICE);
            let rings = &self.rings;
            if rings.sleep(me, seen, slice, || ready(rings)) {
                return Ok(Waited::Ready);
            }
        }
    }

    /// Finishes waking the peer a ring change was for: a byte, if it sleeps in `poll`.
    fn wake(&self, peer: usize, ring: Ring) {
        if ring == Ring::ByteNeeded {
            self.tcp.send_wake_up(peer);
        }
    }

    /// Waits for a local peer and a peer on another host at once: `local` (writable
    /// and/or readable as `shm` says, each `(writable, readable)`) and `remote` (as `tcp`
    /// says). Spins on both, then sleeps in `poll(2)` on the remote peer's connection and
    /// the local peer's, over which the local peer sends a byte when it sees this rank
    /// waiting for it (see `ring.rs`).
    fn wait_mixed(
        &mut self,
        (local, shm): (usize, (Option<usize>, Option<usize>)),
        (remote, tcp): (usize, (Option<usize>, Option<usize>)),
        deadline: Instant,
    ) -> io::Result<Readiness> {
        let me = self.rank();
        let interests = [
            self.tcp
                .interest(remote, tcp.1.is_some(), tcp.0.is_some())?,
            self.tcp.interest(local, true, false)?,
        ];
        let rings = &self.rings;
        let remote_ready = &interests[..1];
        let looked = self.spin.look(deadline, LOOKS_PER_CLOCK, || {
            Ok(ready(rings, me, shm.0, shm.1) || ready_now(remote_ready)?)
        })?;
        if looked {
            return Ok(Readiness::Ready);
        }
        let peer_of_flag = in_poll_for(local);
        loop {
            let now = Instant::now();
            if self.any_gone([Some(remote), Some(local)], now) {
                return Ok(Readiness::Ready); // the next read or write reports it
            }
            if now >= deadline {
                return Ok(Readiness::TimedOut);
            }
            let until = deadline.min(now + LIVENESS_SLICE);
            let rings = &self.rings;
            self.tcp.drain_wake_ups(local);
            let found = rings.raise_flag(me, peer_of_flag, || ready(rings, me, shm.0, shm.1));
            let woken = if found {
                Ok(true)
            } else {
                wait_any(&interests, until)
            };
            rings.lower_flag(me);
            self.tcp.drain_wake_ups(local);
            if woken? && (found || ready(rings, me, shm.0, shm.1) || ready_now(remote_ready)?) {
                return Ok(Readiness::Ready);
            }
        }
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
        if !self.rings.has(peer) {
            return self.tcp.write_some(peer, bufs);
        }
        let (written, ring) = self.rings.write(self.rank(), peer, bufs);
        self.wake(peer, ring);
        match written {
            0 if bufs.iter().any(|b| !b.is_empty()) => Err(io::ErrorKind::WouldBlock.into()),
            written => Ok(written),
        }
    }

    fn read_some(&mut self, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.check_peer(peer)?;
        if !self.rings.has(peer) {
            return self.tcp.read_some(peer, bufs);
        }
        let (read, ring) = self.rings.read(self.rank(), peer, bufs);
        self.wake(peer, ring);
        match read {
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

    fn hosts(&self) -> Option<&[usize]> {
        self.tcp.hosts()
    }

    fn one_machine(&self) -> bool {
        self.tcp.one_machine()
    }

    fn peer_host(&self, peer: usize) -> Option<String> {
        self.tcp.peer_host(peer)
    }

    fn wait(
        &mut self,
        writable: Option<usize>,
        readable: Option<usize>,
        deadline: Instant,
    ) -> io::Result<Readiness> {
        let local = |peer: Option<usize>| peer.filter(|&p| self.rings.has(p));
        let remote = |peer: Option<usize>| peer.filter(|&p| !self.rings.has(p));
        let shm = (local(writable), local(readable));
        let tcp = (remote(writable), remote(readable));
        match (shm.1.or(shm.0), tcp.1.or(tcp.0)) {
            (_, None) => {}
            (None, Some(_)) => return self.tcp.wait(writable, readable, deadline),
            (Some(local), Some(remote)) => {
                return self.wait_mixed((local, shm), (remote, tcp), deadline)
            }
        }
        let me = self.rank();
        let waited = self.spin_then_sleep(
            (deadline, Duration::MAX),
            |rings| ready(rings, me, writable, readable),
            |transport, now| {
                let peers = [readable, writable];
                transport.any_gone(peers, now).then_some(())
            },
        )?;
        Ok(match waited {
            // A gone peer: the next read or write reports it.
            Waited::Ready | Waited::Gone(()) => Readiness::Ready,
            Waited::TimedOut => Readiness::TimedOut,
        })
    }
}

/// The barrier runs in the rings' memory when every pair of the group's ranks shares it.
impl OffersMemoryBarrier for ShmTransport {
    fn memory_barrier(&mut self) -> Option<&mut dyn MemoryBarrier> {
        if self.memory_barrier {
            Some(self)
        } else {
            None
        }
    }
}

/// Ranks in separate processes: no buffers read across ranks.
impl OffersPeerMemory for ShmTransport {}

impl MemoryBarrier for ShmTransport {
    fn arrive(&mut self, seq: u64, slot: usize, header: &[u8; FRAME_HEADER_LEN], data: &[u8]) {
        let tcp = &self.tcp;
        self.rings
            .arrive(self.tcp.rank(), seq, (slot, header, data), |peer| {
                tcp.send_wake_up(peer)
            });
    }

    fn advance(&mut self, seq: u64) {
        let tcp = &self.tcp;
        self.rings
            .advance(self.tcp.rank(), seq, |peer| tcp.send_wake_up(peer));
    }

    fn reads_peer_memory(&self) -> bool {
        let me = self.rank();
        self.processes
            .iter()
            .enumerate()
            .all(|(rank, process)| rank == me || process.is_some())
    }

    fn read_peer(&self, peer: usize, address: u64, out: &mut [u8]) -> io::Result<()> {
        match self.processes.get(peer).copied().flatten() {
            Some(pid) => read_process(pid, address, out),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("this rank does not read rank {peer}'s memory"),
            )),
        }
    }

    fn shared_ticket(&self, address: u64, len: usize) -> Option<SharedTicket> {
        ticket_for(address, len)
    }

    fn shared_bytes(
        &mut self,
        peer: usize,
        ticket: &SharedTicket,
        range: (u64, usize),
    ) -> io::Result<&[u8]> {
        self.peer_buffers.bytes(peer, ticket, range)
    }

    fn shared_bytes_mut(
        &mut self,
        peer: usize,
        ticket: &SharedTicket,
        range: (u64, usize),
    ) -> io::Result<&mut [u8]> {
        self.peer_buffers.bytes_mut(peer, ticket, range)
    }

    fn read_slot(
        &self,
        peer: usize,
        slot: usize,
        header: &mut [u8; FRAME_HEADER_LEN],
        data: &mut [u8],
    ) -> bool {
        self.rings.read_slot(peer, slot, header, data)
    }

    fn first_missing(&self, awaited: Awaited) -> Option<usize> {
        missing(&self.rings, self.rank(), awaited)
    }

    fn wait_all_arrived(
        &mut self,
        awaited: Awaited,
        deadline: Instant,
        slice: Duration,
    ) -> io::Result<Arrivals> {
        let me = self.rank();
        let seq = awaited.number();
        let waited = self.spin_then_sleep(
            (deadline, slice),
            |rings| missing(rings, me, awaited).is_none(),
            |transport, now| transport.first_gone_missing(seq, now),
        )?;
        Ok(match waited {
            Waited::Ready => Arrivals::All,
            Waited::Gone(peer) => Arrivals::Gone(peer),
            Waited::TimedOut => match missing(&self.rings, me, awaited) {
                Some(peer) => Arrivals::Missing(peer),
                None => Arrivals::All,
            },
        })
    }

    fn peek(&self, peer: usize, buf: &mut [u8]) -> usize {
        self.rings.peek(self.rank(), peer, buf)
    }
}

/// The first rank other than `me` that has not done what `awaited` says.
fn missing(rings: &Rings, me: usize, awaited: Awaited) -> Option<usize> {
    match awaited {
        Awaited::Arrival(seq) => rings.first_missing(me, seq),
        Awaited::Posted(seq, slot) => rings.first_unposted(me, seq, slot),
    }
}

/// How [`ShmTransport::spin_then_sleep`] ended.
enum Waited<G> {
    Ready,
    /// A peer waited for has gone (what `gone` said of it).
    Gone(G),
    TimedOut,
}

/// Whether what rank `me` waits for is there: bytes to read from `readable`, room to
/// write to `writable`.
fn ready(rings: &Rings, me: usize, writable: Option<usize>, readable: Option<usize>) -> bool {
    readable.is_some_and(|p| rings.used(p, me) > 0)
        || writable.is_some_and(|p| rings.used(me, p) < rings.ring_bytes)
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
