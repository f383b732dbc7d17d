//! Runs one rank's [`Schedule`] over a [`Transport`]: the only place where schedules,
//! frames, kernels and I/O meet.
//!
//! The rules of progress (when a send may move, where received bytes go, when they may be
//! applied, what to wait for) live in [`Progress`]; this is the driver that does what it
//! says. One thread drives both directions with non-blocking calls: it writes the next
//! ready send straight from the caller's buffer (header and payload in one vectored
//! write), reads the next receive (straight into the caller's buffer for a store, into a
//! scratch chunk for a reduction; a store of at most 4 KiB is read whole, header and
//! payload in one read, into a staging area first), checks each frame header, reduces
//! finished chunks, and
//! sleeps in [`Transport::wait`] only when nothing moved. No busy-spinning, no extra
//! copies of the payload beyond the one the kernel makes.

use std::io::{self, IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

use crate::control::RETRY_EVERY;
use crate::hooks::ProgressSink;
use crate::kernels;
use crate::progress::{Destination, Progress};
use crate::schedule::{RecvAction, Schedule};
use crate::transport::{Readiness, Transport};
use crate::wire::{same_call, Algorithm, FrameHeader, FRAME_HEADER_LEN};
use crate::{DType, Error, OpDesc, ReduceOp};

/// Everything the executor needs to know about the call besides the schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call<'a> {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) op: OpDesc,
    pub(crate) algorithm: Algorithm,
    pub(crate) elem_size: usize,
    /// Element type and operator, for schedules that reduce.
    pub(crate) reduce: Option<(DType, ReduceOp)>,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
    /// Where to count the bytes moved per peer and say whom this rank waits for.
    pub(crate) report: ProgressSink<'a>,
}

fn is_would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// Runs `schedule` for `call` on `buf` (the caller's bytes). Sends read from `send_from`
/// when given (all-to-all, point-to-point sends), else from `buf`.
pub(crate) fn execute<T: Transport + ?Sized>(
    transport: &mut T,
    schedule: &Schedule,
    call: &Call<'_>,
    buf: &mut [u8],
    send_from: Option<&[u8]>,
    scratch: &mut Vec<u64>,
) -> Result<(), Error> {
    // Reduction operands first, then the staging area of small stored frames: a stored
    // frame is read whole, header and payload in one read (one system call over TCP),
    // and copied into the caller's buffer once its header has been checked and its last
    // byte has arrived.
    let reduce_bytes = (schedule.max_reduce_len() * call.elem_size).next_multiple_of(8);
    let scratch_words = (reduce_bytes + STAGED_MAX) / 8;
    if scratch.len() < scratch_words {
        scratch.resize(scratch_words, 0);
    }
    let scratch: &mut [u8] = bytemuck::cast_slice_mut(scratch.as_mut_slice());
    let (scratch, staged) = scratch.split_at_mut(reduce_bytes);
    let mut progress = Progress::new(schedule, call.elem_size);
    let mut outgoing = [0u8; FRAME_HEADER_LEN];
    let mut incoming = [0u8; FRAME_HEADER_LEN];
    // Bytes sent and received so far, for what this rank tells a peer that asks.
    let mut moved = 0u64;
    loop {
        let mut progressed = false;

        while let Some(send) = progress.next_send() {
            let source: &[u8] = send_from.unwrap_or(&*buf);
            let payload = &source[send.payload.clone()];
            if send.done == 0 {
                outgoing = FrameHeader {
                    op: call.op,
                    algorithm: call.algorithm,
                    payload_len: payload.len() as u32,
                }
                .encode();
            }
            let written = if send.done < FRAME_HEADER_LEN {
                let iov = [IoSlice::new(&outgoing[send.done..]), IoSlice::new(payload)];
                transport.write_some(send.peer, &iov)
            } else {
                let iov = [IoSlice::new(&payload[send.done - FRAME_HEADER_LEN..])];
                transport.write_some(send.peer, &iov)
            };
            match written {
                Ok(0) => break,
                Ok(n) => {
                    progressed = true;
                    moved += n as u64;
                    progress.sent(n);
                    call.report.sent(send.peer, n);
                }
                Err(e) if is_would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(peer_lost(call, &*transport, send.peer, &e.to_string())),
            }
        }

        loop {
            if let Some(recv) = progress.next_recv() {
                let len = recv.payload.len();
                let staging = recv.into == Destination::Buffer && len <= STAGED_MAX;
                let dest: &mut [u8] = match recv.into {
                    Destination::Buffer if staging => &mut staged[..len],
                    Destination::Buffer => &mut buf[recv.payload.clone()],
                    Destination::Scratch => &mut scratch[..len],
                };
                let read =
                    if recv.done < FRAME_HEADER_LEN && recv.into == Destination::Buffer && !staging
                    {
                        // The caller's buffer is written only once the header shows the frame
                        // belongs to this call: a mismatched frame never lands in it.
                        let mut iov = [IoSliceMut::new(&mut incoming[recv.done..])];
                        transport.read_some(recv.peer, &mut iov)
                    } else if recv.done < FRAME_HEADER_LEN {
                        let mut iov = [
                            IoSliceMut::new(&mut incoming[recv.done..]),
                            IoSliceMut::new(dest),
                        ];
                        transport.read_some(recv.peer, &mut iov)
                    } else {
                        let mut iov = [IoSliceMut::new(&mut dest[recv.done - FRAME_HEADER_LEN..])];
                        transport.read_some(recv.peer, &mut iov)
                    };
                match read {
                    Ok(0) => {
                        return Err(peer_lost(
                            call,
                            &*transport,
                            recv.peer,
                            "connection closed by peer (process exited or was killed?)",
                        ))
                    }
                    Ok(n) => {
                        progressed = true;
                        moved += n as u64;
                        progress.received(n);
                        call.report.received(recv.peer, n);
                    }
                    Err(e) if is_would_block(&e) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(peer_lost(call, &*transport, recv.peer, &e.to_string())),
                }
                if progress.header_unchecked() {
                    check_header(call, recv.peer, &incoming, len)?;
                    progress.header_checked();
                }
                let arrived = matches!(read, Ok(n) if recv.done + n == recv.frame_len());
                if staging && arrived {
                    buf[recv.payload.clone()].copy_from_slice(&staged[..len]);
                }
                continue;
            }
            let Some(apply) = progress.may_apply() else {
                break;
            };
            if let (
                RecvAction::Reduce {
                    last,
                    incoming_first,
                },
                Some((dtype, op)),
            ) = (apply.action, call.reduce)
            {
                let range = apply.payload;
                let order = if incoming_first {
                    kernels::Order::IncomingFirst
                } else {
                    kernels::Order::LocalFirst
                };
                let fail = |e: kernels::KernelError| {
                    Error::InvalidArgument(format!("rank {}: {}: {}", call.rank, call.op, e.0))
                };
                let operand = &scratch[..range.len()];
                kernels::reduce_bytes(dtype, op, &mut buf[range.clone()], operand, order)
                    .map_err(fail)?;
                if last && op == ReduceOp::Avg {
                    kernels::finalize_avg(dtype, &mut buf[range], call.world_size).map_err(fail)?;
                }
            }
            progress.applied();
            progressed = true;
        }

        if progress.is_done() {
            return Ok(());
        }
        if progressed {
            continue;
        }
        let Ok(blocked) = progress.blocked_on() else {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {}: schedule cannot make progress (a send waits for a receive that does not exist)",
                call.rank, call.op
            )));
        };
        call.report.blocked_on(blocked.blamed(), moved);
        // Try again at least every RETRY_EVERY, so what a peer that asks is told stays
        // fresh (control::deadlock::stalled_on).
        let until = Instant::now()
            .checked_add(RETRY_EVERY)
            .map_or(call.deadline, |retry| retry.min(call.deadline));
        match transport.wait(blocked.writable, blocked.readable, until) {
            Ok(Readiness::Ready) => {}
            Ok(Readiness::TimedOut) if until < call.deadline => {}
            Ok(Readiness::TimedOut) => return Err(timed_out(call, &progress, blocked.blamed())),
            Err(e) => {
                return Err(Error::Io {
                    rank: call.rank,
                    context: format!("waiting for rank {} in {}", blocked.blamed(), call.op),
                    source: e,
                })
            }
        }
    }
}

/// The largest stored frame payload read whole through the executor's staging buffer.
const STAGED_MAX: usize = 4096;

fn check_header(
    call: &Call<'_>,
    peer: usize,
    raw: &[u8; FRAME_HEADER_LEN],
    expected_len: usize,
) -> Result<(), Error> {
    let header = FrameHeader::decode(raw).map_err(|e| Error::Protocol {
        rank: call.rank,
        peer,
        op: call.op,
        reason: e.to_string(),
    })?;
    same_call(
        call.rank,
        peer,
        (call.op, call.algorithm),
        (header.op, header.algorithm),
    )?;
    if header.payload_len as usize != expected_len {
        return Err(Error::Protocol {
            rank: call.rank,
            peer,
            op: call.op,
            reason: format!(
                "expected a {expected_len}-byte chunk, peer sent {} bytes: ranks disagree on chunking (use the same ringccl version and settings everywhere)",
                header.payload_len
            ),
        });
    }
    Ok(())
}

/// `peer` is lost for `reason`, which says where it ran when the transport knows.
fn peer_lost<T: Transport + ?Sized>(
    call: &Call<'_>,
    transport: &T,
    peer: usize,
    reason: &str,
) -> Error {
    let reason = match transport.peer_host(peer) {
        Some(host) => format!("{reason}; rank {peer} ran on {host}"),
        None => reason.to_string(),
    };
    Error::PeerLost {
        rank: peer,
        observer: call.rank,
        op: call.op,
        reason,
        gone: Vec::new(),
    }
}

fn timed_out(call: &Call<'_>, progress: &Progress<'_>, peer: usize) -> Error {
    let exchanged = progress.exchanged_with(peer);
    Error::Timeout {
        rank: call.rank,
        peer,
        op: call.op,
        moved: exchanged.moved,
        expected: exchanged.expected,
        timeout: call.timeout,
        gone: Vec::new(),
        cause: None,
    }
}

#[cfg(test)]
mod tests;
