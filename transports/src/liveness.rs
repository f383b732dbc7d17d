//! Is a peer's process still there? One probe of a connection, used by every transport
//! and backend that keeps TCP connections as a liveness channel.

use std::os::fd::AsRawFd;

/// Whether the peer of the connected socket has closed its side or the connection has
/// failed (reset, keepalive or user timeout, unreachable). Never blocks; bytes waiting
/// to be read do not count.
#[allow(unsafe_code)] // one poll(2) call on a valid descriptor, see SAFETY below
pub fn connection_lost(socket: &impl AsRawFd) -> bool {
    let mut entry = libc::pollfd {
        fd: socket.as_raw_fd(),
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid, initialised `pollfd`; a zero timeout never blocks.
    let rc = unsafe { libc::poll(&mut entry, 1, 0) };
    rc > 0 && entry.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_closed_peer_is_seen_and_a_live_one_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (theirs, _) = listener.accept().unwrap();
        assert!(!connection_lost(&ours));
        std::io::Write::write_all(&mut &theirs, b"x").unwrap();
        assert!(!connection_lost(&ours), "pending bytes are not a loss");
        drop(theirs);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !connection_lost(&ours) {
            assert!(std::time::Instant::now() < deadline, "close not seen");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
