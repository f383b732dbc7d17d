//! The TCP mesh transport: one non-blocking connection per peer.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringccl_collectives::{Closer, Readiness, Transport};
use socket2::Socket;

use crate::liveness::connection_lost;
use crate::poll::{wait_any, Interest};

/// A connected full mesh of TCP connections between the ranks of one group, made from
/// the rendezvous' handshaken connections.
pub struct TcpTransport {
    rank: usize,
    world_size: usize,
    /// Shared with the [`Closer`], which may shut them down from another thread.
    peers: Vec<Option<Arc<Socket>>>,
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
        })
    }

    /// Whether `peer`'s connection has been closed or has failed (its process or host is
    /// gone). Never blocks.
    pub fn peer_gone(&self, peer: usize) -> bool {
        self.peer(peer).map_or(true, connection_lost)
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
        Ok(if wait_any(&interests[..used], deadline)? {
            Readiness::Ready
        } else {
            Readiness::TimedOut
        })
    }
}

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
}
