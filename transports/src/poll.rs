//! The one place this crate calls into the OS directly: `poll(2)`.

// libc::poll is an FFI call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// What to wait for on one descriptor.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Interest {
    pub(crate) fd: RawFd,
    pub(crate) read: bool,
    pub(crate) write: bool,
}

impl Interest {
    pub(crate) fn readable(fd: &impl AsRawFd) -> Interest {
        Interest {
            fd: fd.as_raw_fd(),
            read: true,
            write: false,
        }
    }
}

/// Sleeps until one of `interests` is ready (or in error), or until `deadline`.
/// Returns `false` when the deadline passed with nothing ready.
pub(crate) fn wait_any(interests: &[Interest], deadline: Instant) -> io::Result<bool> {
    let mut fds: [libc::pollfd; 2] = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; 2];
    let used = interests.len().min(fds.len());
    for (slot, interest) in fds.iter_mut().zip(interests) {
        slot.fd = interest.fd;
        if interest.read {
            slot.events |= libc::POLLIN;
        }
        if interest.write {
            slot.events |= libc::POLLOUT;
        }
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let timeout_ms = millis_rounded_up(deadline - now);
        // SAFETY: `fds` is a valid, initialised array of `pollfd` and `used` is at most its
        // length; poll only writes the `revents` fields of those entries.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), used as libc::nfds_t, timeout_ms) };
        if rc > 0 {
            return Ok(true);
        }
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        // rc == 0 (timer expired, possibly early by rounding) or EINTR: re-check the deadline.
    }
}

fn millis_rounded_up(d: Duration) -> libc::c_int {
    let ms = d.as_micros().div_ceil(1000);
    ms.min(libc::c_int::MAX as u128) as libc::c_int
}

/// Whether the peer of the connected socket `fd` has closed or reset it. Never blocks.
/// Bytes waiting to be read also count (a liveness-only connection carries none).
pub(crate) fn hung_up(fd: RawFd) -> bool {
    let mut entry = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid, initialised `pollfd`; a zero timeout never blocks.
    let rc = unsafe { libc::poll(&mut entry, 1, 0) };
    rc > 0 && entry.revents & (libc::POLLIN | libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// Whether the peer of the connected socket `fd` has closed its side or the connection
/// has failed (reset, keepalive timeout, unreachable). Never blocks; pending data does
/// not count.
pub(crate) fn closed_or_failed(fd: RawFd) -> bool {
    let mut entry = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid, initialised `pollfd`; a zero timeout never blocks.
    let rc = unsafe { libc::poll(&mut entry, 1, 0) };
    rc > 0 && entry.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}
