//! Blocking reads and writes on a `TcpStream` that give up at a deadline.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

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
