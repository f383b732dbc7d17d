//! Blocking reads and writes on a `TcpStream` that give up at a deadline, and the
//! deadline itself.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Stands for "no deadline" when a timeout is too large to add to the clock.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The instant `timeout` from now. A timeout too large to represent (`Duration::MAX`, or
/// anything past the clock's range) means no deadline: about a century from now.
pub(crate) fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(FAR_FUTURE))
        .unwrap_or(now)
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(io::ErrorKind::TimedOut, "deadline passed"));
    }
    Ok(left)
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Fills `buf` from `stream`, or fails with `TimedOut` once `deadline` passes.
/// A closed connection is `UnexpectedEof`.
pub(crate) fn read_exact_by(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        done += read_some_by(stream, &mut buf[done..], deadline)?;
    }
    Ok(())
}

/// Reads at least one byte into `buf` from `stream` (which must not be empty), or fails
/// with `TimedOut` once `deadline` passes. A closed connection is `UnexpectedEof`.
pub(crate) fn read_some_by(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<usize> {
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        match (&*stream).read(buf) {
            Ok(0) if !buf.is_empty() => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed by the other side",
                ))
            }
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `buf` to `stream`, or fails with `TimedOut` once `deadline` passes.
pub(crate) fn write_all_by(stream: &TcpStream, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        stream.set_write_timeout(Some(remaining(deadline)?))?;
        match (&*stream).write(&buf[done..]) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "connection closed",
                ))
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_enormous_timeout_is_a_far_deadline_not_a_panic() {
        let far = deadline_after(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(365 * 24 * 3600));
        let near = deadline_after(Duration::from_secs(1));
        assert!(near <= Instant::now() + Duration::from_secs(1));
    }
}
