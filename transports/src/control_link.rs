//! The control thread: the I/O driver of a group's [`Sentinel`], over one TCP connection
//! per peer that it alone reads and writes.
//!
//! It always reads, so an abort notice or a peer's question is seen at once whatever the
//! collectives are doing. It wakes every [`TICK`] to let the sentinel ask the peer a
//! blocked op waits on what it is doing; when the group aborts (here, or by a peer's
//! notice) it tells every peer, then closes the data connections (waking the op in
//! progress) and its own, and ends.

use std::fmt;
use std::io::{self, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use ringccl_collectives::control::{ControlMessage, GroupControl, SentinelDriver};
use socket2::Socket;
use tracing::{debug, warn};

use crate::poll::{wait_many, Interest};
use crate::tcp::configure;

/// How long an abort waits for its notices to leave before it closes the connections
/// anyway (a peer whose control thread is gone does not read).
const NOTICE_FLUSH_LIMIT: Duration = Duration::from_millis(200);
/// How long dropping the group waits for the control thread to say goodbye.
const LEAVE_LIMIT: Duration = Duration::from_millis(200);

struct Shared {
    stop: AtomicBool,
    wake: Socket,
}

impl Shared {
    fn wake(&self) {
        // Non-blocking: a full pipe already holds a pending wake-up. MSG_NOSIGNAL: once
        // the thread has ended, this is an EPIPE error, never a SIGPIPE.
        let _ = self.wake.send_with_flags(&[1], libc::MSG_NOSIGNAL);
    }
}

/// The running control thread of one rank's group; dropping it says goodbye to the peers
/// (unless the group was aborted) and stops the thread.
pub struct ControlLink {
    rank: usize,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl ControlLink {
    /// Starts rank `rank`'s control thread over `connections` (the mesh's control
    /// connections, `None` at `rank`), configured like data connections (a dead peer
    /// host noticed within about `dead_peer`), driving `control`.
    pub fn start(
        rank: usize,
        connections: Vec<Option<TcpStream>>,
        dead_peer: Duration,
        control: Arc<GroupControl>,
    ) -> io::Result<ControlLink> {
        let world_size = connections.len();
        let peers = connections
            .into_iter()
            .map(|c| {
                c.map(|s| {
                    configure(s, dead_peer).map(|socket| Peer {
                        socket,
                        inbox: Vec::new(),
                        outbox: Vec::new(),
                        open: true,
                    })
                })
                .transpose()
            })
            .collect::<io::Result<Vec<_>>>()?;
        let (wake, woken) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        woken.set_nonblocking(true)?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            wake: Socket::from(wake),
        });
        let waker = Arc::clone(&shared);
        control.attach_link(Arc::new(move || waker.wake()));
        let driver = Driver {
            rank,
            shared: Arc::clone(&shared),
            woken,
            peers,
            sentinel: SentinelDriver::new(rank, world_size, control),
        };
        let thread = thread::Builder::new()
            .name(format!("ringccl-control-{rank}"))
            .spawn(move || driver.run())?;
        Ok(ControlLink {
            rank,
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlLink {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                warn!(rank = self.rank, "the control thread panicked");
            }
        }
    }
}

impl fmt::Debug for ControlLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlLink")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

struct Peer {
    socket: Socket,
    inbox: Vec<u8>,
    outbox: Vec<u8>,
    open: bool,
}

struct Driver {
    rank: usize,
    shared: Arc<Shared>,
    woken: UnixStream,
    peers: Vec<Option<Peer>>,
    sentinel: SentinelDriver,
}

impl Driver {
    fn run(mut self) {
        let mut announced_at: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let stopping = self.shared.stop.load(Ordering::Acquire);
            self.sentinel.turn(now, stopping);
            self.send_pending();
            if stopping {
                self.flush_for(LEAVE_LIMIT);
                return;
            }
            if self.sentinel.is_aborted() {
                let since = *announced_at.get_or_insert(now);
                let flushed = self
                    .peers
                    .iter()
                    .flatten()
                    .all(|p| !p.open || p.outbox.is_empty());
                if flushed || now.saturating_duration_since(since) >= NOTICE_FLUSH_LIMIT {
                    self.close_everything();
                    return;
                }
            }
            let until = if announced_at.is_some() {
                now + Duration::from_millis(5)
            } else {
                self.sentinel.next_tick()
            };
            self.wait_and_read(until);
        }
    }

    /// Encodes the sentinel's messages into the peers' outboxes and writes what it can.
    fn send_pending(&mut self) {
        while let Some((to, message)) = self.sentinel.poll_transmit() {
            if let Some(peer) = self.peers.get_mut(to).and_then(Option::as_mut) {
                if peer.open {
                    message.encode_into(&mut peer.outbox);
                }
            }
        }
        for (rank, peer) in self.peers.iter_mut().enumerate() {
            let Some(peer) = peer.as_mut().filter(|p| p.open && !p.outbox.is_empty()) else {
                continue;
            };
            match peer
                .socket
                .send_with_flags(&peer.outbox, libc::MSG_NOSIGNAL)
            {
                Ok(n) => {
                    peer.outbox.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(rank = self.rank, peer = rank, error = %e, "control connection failed");
                    peer.open = false;
                }
            }
        }
    }

    /// Keeps writing for up to `limit` (goodbyes on the way out).
    fn flush_for(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while Instant::now() < until
            && self
                .peers
                .iter()
                .flatten()
                .any(|p| p.open && !p.outbox.is_empty())
        {
            self.send_pending();
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// The group is aborted and the peers told: close the data connections (waking the
    /// op in progress, and telling peers that missed the notice) and this thread's own.
    fn close_everything(&mut self) {
        self.sentinel.control().close_connections();
        for peer in self.peers.iter_mut().flatten() {
            // Buffered notices still leave before the end of the stream.
            let _ = peer.socket.shutdown(Shutdown::Write);
            peer.open = false;
        }
    }

    /// Sleeps until a peer writes, the runner wakes this thread, or `until`; then reads
    /// and handles every message that arrived.
    fn wait_and_read(&mut self, until: Instant) {
        let mut interests = vec![Interest::readable(&self.woken)];
        let mut who = Vec::new();
        for (rank, peer) in self.peers.iter().enumerate() {
            if let Some(peer) = peer.as_ref().filter(|p| p.open) {
                interests.push(Interest {
                    fd: peer.socket.as_raw_fd(),
                    read: true,
                    write: !peer.outbox.is_empty(),
                });
                who.push(rank);
            }
        }
        let ready = match wait_many(&interests, until) {
            Ok(ready) => ready,
            Err(e) => {
                warn!(rank = self.rank, error = %e, "control thread: poll failed");
                thread::sleep(Duration::from_millis(10));
                return;
            }
        };
        if ready.first().is_some_and(|r| r.read) {
            let mut sink = [0u8; 64];
            while matches!((&self.woken).read(&mut sink), Ok(n) if n > 0) {}
        }
        for (slot, &rank) in ready.iter().skip(1).zip(&who) {
            if slot.read {
                self.read_from(rank);
            }
        }
    }

    fn read_from(&mut self, from: usize) {
        let Some(peer) = self.peers.get_mut(from).and_then(Option::as_mut) else {
            return;
        };
        let mut chunk = [0u8; 4096];
        loop {
            match (&peer.socket).read(&mut chunk) {
                Ok(0) => {
                    debug!(rank = self.rank, peer = from, "control connection closed");
                    peer.open = false;
                    break;
                }
                Ok(n) => peer.inbox.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    debug!(rank = self.rank, peer = from, error = %e, "control connection failed");
                    peer.open = false;
                    break;
                }
            }
        }
        let now = Instant::now();
        loop {
            let Some(peer) = self.peers.get_mut(from).and_then(Option::as_mut) else {
                return;
            };
            match ControlMessage::decode(&peer.inbox) {
                Ok(Some((message, used))) => {
                    peer.inbox.drain(..used);
                    self.sentinel.handle_message(now, from, message);
                }
                Ok(None) => return,
                Err(e) => {
                    warn!(rank = self.rank, peer = from, error = %e, "closing a control connection that broke the protocol");
                    let _ = peer.socket.shutdown(Shutdown::Both);
                    peer.open = false;
                    peer.inbox.clear();
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use ringccl_collectives::{DType, Deadline, Error, OpDesc, ReduceOp};

    use super::*;

    /// `n` ranks' control links over loopback connections, each with its control state.
    fn links(n: usize) -> Vec<(ControlLink, Arc<GroupControl>)> {
        let mut conns: Vec<Vec<Option<TcpStream>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for (a, b) in (0..n).flat_map(|a| (a + 1..n).map(move |b| (a, b))) {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let out = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (inc, _) = listener.accept().unwrap();
            conns[a][b] = Some(out);
            conns[b][a] = Some(inc);
        }
        conns
            .into_iter()
            .enumerate()
            .map(|(rank, c)| {
                let control = GroupControl::new(rank);
                let link =
                    ControlLink::start(rank, c, Duration::from_secs(5), Arc::clone(&control))
                        .unwrap();
                (link, control)
            })
            .collect()
    }

    fn all_reduce(seq: u64, dtype: DType) -> OpDesc {
        OpDesc::all_reduce(seq, dtype, 1024, ReduceOp::Sum)
    }

    #[test]
    fn fingerprints_agree_and_a_different_dtype_is_a_mismatch() {
        let group = links(3);
        let deadline = Deadline::after(Duration::from_secs(20));
        std::thread::scope(|s| {
            for (rank, (_, control)) in group.iter().enumerate() {
                s.spawn(move || {
                    for seq in 1..=50 {
                        let op = all_reduce(seq, DType::F32);
                        control.post_fingerprint(op);
                        control
                            .check_fingerprint(&op, (rank + 2) % 3, deadline)
                            .unwrap();
                    }
                });
            }
        });
        // Op #51: rank 1 reduces f64 where the others reduce f32, same count.
        let outcomes: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = group
                .iter()
                .enumerate()
                .map(|(rank, (_, control))| {
                    s.spawn(move || {
                        let dtype = if rank == 1 { DType::F64 } else { DType::F32 };
                        let op = all_reduce(51, dtype);
                        control.post_fingerprint(op);
                        control.check_fingerprint(&op, (rank + 2) % 3, deadline)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(outcomes[0].is_ok(), "rank 0's predecessor (2) agrees");
        for (rank, peer) in [(1, 0), (2, 1)] {
            match &outcomes[rank] {
                Err(Error::CollectiveMismatch {
                    rank: r,
                    peer: p,
                    mine,
                    theirs,
                }) => {
                    assert_eq!((*r, *p), (rank, peer));
                    assert_ne!(mine.dtype, theirs.dtype);
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_abort_reaches_every_link_and_closes_registered_connections() {
        struct Flag(std::sync::atomic::AtomicBool);
        impl ringccl_collectives::Closer for Flag {
            fn close(&self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let group = links(4);
        let flags: Vec<Arc<Flag>> = group
            .iter()
            .map(|(_, control)| {
                let flag = Arc::new(Flag(AtomicBool::new(false)));
                control.add_closer(Arc::clone(&flag) as Arc<dyn ringccl_collectives::Closer>);
                flag
            })
            .collect();
        let started = Instant::now();
        group[2]
            .1
            .abort(2, "op #17 all_reduce: testing".into(), None);
        for (rank, (_, control)) in group.iter().enumerate() {
            let record = control
                .wait_for_abort(Duration::from_secs(10))
                .unwrap_or_else(|| panic!("rank {rank} never heard of the abort"));
            assert_eq!(record.origin, 2);
            assert!(record.reason.contains("op #17"));
        }
        let heard = started.elapsed();
        let until = Instant::now() + Duration::from_secs(10);
        while !flags.iter().all(|f| f.0.load(Ordering::SeqCst)) {
            assert!(Instant::now() < until, "connections not closed everywhere");
            thread::sleep(Duration::from_millis(5));
        }
        eprintln!("abort heard by every rank after {heard:?}");
        assert!(heard < Duration::from_secs(2), "{heard:?}");
    }
}
