//! The TCP mesh transport: one non-blocking connection per peer.

use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::os::fd::AsRawFd;
use std::time::Instant;

use ringccl_collectives::{Readiness, Transport};
use socket2::Socket;

use crate::poll::{wait_any, Interest};
use crate::store::{StoreClient, StoreServer};

/// A connected full mesh of TCP connections between the ranks of one group.
///
/// Made by [`connect_mesh`](crate::connect_mesh). It keeps the rendezvous store client (and,
/// on rank 0, the store server) alive for the life of the group.
pub struct TcpTransport {
    rank: usize,
    world_size: usize,
    peers: Vec<Option<Socket>>,
    pub(crate) job_id: u64,
    // Field order matters for drop: close the client before stopping the server.
    pub(crate) store: Option<StoreClient>,
    _server: Option<StoreServer>,
}

impl TcpTransport {
    pub(crate) fn new(
        rank: usize,
        world_size: usize,
        peers: Vec<Option<Socket>>,
        job_id: u64,
        store: Option<StoreClient>,
        server: Option<StoreServer>,
    ) -> TcpTransport {
        TcpTransport {
            rank,
            world_size,
            peers,
            job_id,
            store,
            _server: server,
        }
    }

    /// Start-up steps that read the store must end with this on every rank: ranks above 0
    /// tell rank 0 they are done with the store (one byte on their connection), and rank
    /// 0 returns only once all have, so the store it hosts outlives every reader.
    pub(crate) fn release_store(&mut self, deadline: Instant) -> io::Result<()> {
        let rank = self.rank;
        if rank != 0 {
            loop {
                match self.write_some(0, &[IoSlice::new(&[1u8])]) {
                    Ok(1) => return Ok(()),
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.wait(Some(0), None, deadline)? == Readiness::TimedOut {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "rank 0 did not take the done byte",
                    ));
                }
            }
        }
        for peer in 1..self.world_size {
            let mut byte = [0u8; 1];
            loop {
                match self.read_some(peer, &mut [IoSliceMut::new(&mut byte)]) {
                    Ok(1) => break,
                    Ok(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("rank {peer} left during start-up"),
                        ))
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.wait(None, Some(peer), deadline)? == Readiness::TimedOut {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("rank {peer} did not finish start-up"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether `peer`'s connection has been closed or reset (its process is gone).
    /// Never blocks. Meant for connections that carry no data (the shared-memory
    /// transport keeps them as a liveness channel).
    pub(crate) fn peer_gone(&self, peer: usize) -> bool {
        match self.peer(peer) {
            Ok(socket) => crate::poll::hung_up(socket.as_raw_fd()),
            Err(_) => true,
        }
    }

    fn peer(&self, peer: usize) -> io::Result<&Socket> {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("rank {} has no connection to rank {peer}", self.rank),
                )
            })
    }
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
            .filter(|&p| p != self.rank)
            .filter(|&p| match self.peer(p) {
                Ok(socket) => crate::poll::closed_or_failed(socket.as_raw_fd()),
                Err(_) => true,
            })
            .collect()
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
