//! Sleeping until a socket is ready: `poll(2)`, for the TCP transport and the
//! rendezvous (accepting connections, the store server).

// libc::poll is an FFI call.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// What to wait for on one descriptor.
#[derive(Clone, Copy, Debug)]
pub struct Interest {
    /// The descriptor.
    pub fd: RawFd,
    /// Wake when it is readable (or closed).
    pub read: bool,
    /// Wake when it is writable.
    pub write: bool,
}

impl Interest {
    /// Readability of `fd`.
    pub fn readable(fd: &impl AsRawFd) -> Interest {
        Interest {
            fd: fd.as_raw_fd(),
            read: true,
            write: false,
        }
    }
}

/// Sleeps until one of `interests` (at most two) is ready (or in error), or until
/// `deadline`. Returns `false` when the deadline passed with nothing ready.
pub fn wait_any(interests: &[Interest], deadline: Instant) -> io::Result<bool> {
    poll_any(interests, Some(deadline))
}

/// Whether one of `interests` (at most two) is ready (or in error) now, without
/// sleeping: one `poll(2)` with a zero timeout.
pub fn ready_now(interests: &[Interest]) -> io::Result<bool> {
    poll_any(interests, None)
}

/// [`wait_any`] until `deadline`, or [`ready_now`] without one.
fn poll_any(interests: &[Interest], deadline: Option<Instant>) -> io::Result<bool> {
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
        let timeout_ms = match deadline {
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return Ok(false);
                }
                millis_rounded_up(deadline - now)
            }
            None => 0,
        };
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
        if rc == 0 && deadline.is_none() {
            return Ok(false);
        }
        // rc == 0 (timer expired, possibly early by rounding) or EINTR: re-check the deadline.
    }
}

fn millis_rounded_up(d: Duration) -> libc::c_int {
    let ms = d.as_micros().div_ceil(1000);
    ms.min(libc::c_int::MAX as u128) as libc::c_int
}

/// What [`wait_many`] found on one descriptor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    /// Readable, closed or failed: a read will not block.
    pub read: bool,
    /// Writable (or failed): a write will not block.
    pub write: bool,
}

/// Sleeps until one of `interests` (any number) is ready (or in error), or until
/// `deadline`; returns what each one is ready for (all `false` when the deadline passed).
pub fn wait_many(interests: &[Interest], deadline: Instant) -> io::Result<Vec<Ready>> {
    let mut fds: Vec<libc::pollfd> = interests
        .iter()
        .map(|interest| libc::pollfd {
            fd: interest.fd,
            events: if interest.read { libc::POLLIN } else { 0 }
                | if interest.write { libc::POLLOUT } else { 0 },
            revents: 0,
        })
        .collect();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(vec![Ready::default(); fds.len()]);
        }
        let timeout_ms = millis_rounded_up(deadline - now);
        // SAFETY: `fds` is a valid, initialised vector of `pollfd` whose length is passed;
        // poll only writes the `revents` fields of its entries.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if rc > 0 {
            let failed = libc::POLLERR | libc::POLLHUP | libc::POLLNVAL;
            return Ok(fds
                .iter()
                .map(|fd| Ready {
                    read: fd.revents & (libc::POLLIN | libc::POLLRDHUP | failed) != 0,
                    write: fd.revents & (libc::POLLOUT | failed) != 0,
                })
                .collect());
        }
        if rc < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeouts_round_up_and_saturate() {
        assert_eq!(millis_rounded_up(Duration::ZERO), 0);
        assert_eq!(millis_rounded_up(Duration::from_micros(1)), 1);
        assert_eq!(millis_rounded_up(Duration::from_millis(1500)), 1500);
        assert_eq!(millis_rounded_up(Duration::MAX), libc::c_int::MAX);
    }
}
