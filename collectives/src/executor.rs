//! Runs one rank's [`Schedule`] over a [`Transport`]: the only place where schedules,
//! frames, kernels and I/O meet.
//!
//! One thread drives both directions with non-blocking calls: it writes the next ready
//! send, reads the next receive (straight into the caller's buffer for a store, into a
//! scratch chunk for a reduction), reduces finished chunks, and sleeps in
//! [`Transport::wait`] only when neither direction can move. No busy-spinning, no extra
//! copies of the payload beyond the one the kernel makes.

use std::io::{self, IoSlice, IoSliceMut};
use std::ops::Range;
use std::time::{Duration, Instant};

use crate::kernels;
use crate::schedule::{RecvAction, Schedule};
use crate::transport::{Readiness, Transport};
use crate::wire::{Algorithm, FrameHeader, FRAME_HEADER_LEN};
use crate::{DType, Error, OpDesc, ReduceOp};

/// Everything the executor needs to know about the call besides the schedule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Call {
    pub(crate) rank: usize,
    pub(crate) world_size: usize,
    pub(crate) op: OpDesc,
    pub(crate) algorithm: Algorithm,
    pub(crate) elem_size: usize,
    /// Element type and operator, for schedules that reduce.
    pub(crate) reduce: Option<(DType, ReduceOp)>,
    pub(crate) deadline: Instant,
    pub(crate) timeout: Duration,
}

#[derive(Default)]
struct Cursor {
    index: usize,
    done: usize,
    header: [u8; FRAME_HEADER_LEN],
}

fn is_would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// Runs `schedule` for `call` on `buf` (the caller's bytes). Sends read from `send_from`
/// when given (all-to-all, point-to-point sends), else from `buf`.
pub(crate) fn execute<T: Transport + ?Sized>(
    transport: &mut T,
    schedule: &Schedule,
    call: &Call,
    buf: &mut [u8],
    send_from: Option<&[u8]>,
    scratch: &mut Vec<u64>,
) -> Result<(), Error> {
    let es = call.elem_size;
    let bytes = |r: &Range<usize>| r.start * es..r.end * es;
    let scratch_words = (schedule.max_reduce_len() * es).div_ceil(8);
    if scratch.len() < scratch_words {
        scratch.resize(scratch_words, 0);
    }
    let scratch: &mut [u8] = bytemuck::cast_slice_mut(scratch.as_mut_slice());
    let mut send = Cursor::default();
    let mut recv = Cursor::default();
    loop {
        let mut progressed = false;

        while let Some(step) = schedule.sends.get(send.index) {
            if step.after_recv.is_some_and(|dep| dep >= recv.index) {
                break;
            }
            let payload = match send_from {
                Some(source) => &source[bytes(&step.range)],
                None => &buf[bytes(&step.range)],
            };
            if send.done == 0 {
                send.header = FrameHeader {
                    op: call.op,
                    algorithm: call.algorithm,
                    payload_len: payload.len() as u32,
                }
                .encode();
            }
            let total = FRAME_HEADER_LEN + payload.len();
            let written = if send.done < FRAME_HEADER_LEN {
                let iov = [
                    IoSlice::new(&send.header[send.done..]),
                    IoSlice::new(payload),
                ];
                transport.write_some(step.peer, &iov)
            } else {
                let iov = [IoSlice::new(&payload[send.done - FRAME_HEADER_LEN..])];
                transport.write_some(step.peer, &iov)
            };
            match written {
                Ok(n) => {
                    progressed |= n > 0;
                    send.done += n;
                    if send.done == total {
                        send.index += 1;
                        send.done = 0;
                    } else if n == 0 {
                        break;
                    }
                }
                Err(e) if is_would_block(&e) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(peer_lost(call, step.peer, &e.to_string())),
            }
        }

        while let Some(step) = schedule.recvs.get(recv.index) {
            let range = bytes(&step.range);
            let len = range.len();
            let total = FRAME_HEADER_LEN + len;
            // May the data be written into the caller's buffer yet?
            let may_apply = step.after_send.is_none_or(|dep| dep < send.index);
            if recv.done < total {
                let dest: &mut [u8] = match step.action {
                    RecvAction::Store if !may_apply => break,
                    RecvAction::Store => &mut buf[range.clone()],
                    RecvAction::Reduce { .. } => &mut scratch[..len],
                };
                let before = recv.done;
                let read = if before < FRAME_HEADER_LEN {
                    let mut iov = [
                        IoSliceMut::new(&mut recv.header[before..]),
                        IoSliceMut::new(dest),
                    ];
                    transport.read_some(step.peer, &mut iov)
                } else {
                    let mut iov = [IoSliceMut::new(&mut dest[before - FRAME_HEADER_LEN..])];
                    transport.read_some(step.peer, &mut iov)
                };
                match read {
                    Ok(0) => {
                        return Err(peer_lost(
                            call,
                            step.peer,
                            "connection closed by peer (process exited or was killed?)",
                        ))
                    }
                    Ok(n) => {
                        progressed = true;
                        recv.done += n;
                    }
                    Err(e) if is_would_block(&e) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(peer_lost(call, step.peer, &e.to_string())),
                }
                if before < FRAME_HEADER_LEN && recv.done >= FRAME_HEADER_LEN {
                    check_header(call, step.peer, &recv.header, len)?;
                }
                if recv.done < total {
                    continue;
                }
            }
            if !may_apply {
                // Received into scratch; our own send of this range has not left yet.
                break;
            }
            if let (
                RecvAction::Reduce {
                    last,
                    incoming_first,
                },
                Some((dtype, op)),
            ) = (step.action, call.reduce)
            {
                let order = if incoming_first {
                    kernels::Order::IncomingFirst
                } else {
                    kernels::Order::LocalFirst
                };
                let fail = |e: kernels::KernelError| {
                    Error::InvalidArgument(format!("rank {}: {}: {}", call.rank, call.op, e.0))
                };
                kernels::reduce_bytes(dtype, op, &mut buf[range.clone()], &scratch[..len], order)
                    .map_err(fail)?;
                if last && op == ReduceOp::Avg {
                    kernels::finalize_avg(dtype, &mut buf[range], call.world_size).map_err(fail)?;
                }
            }
            recv.index += 1;
            recv.done = 0;
            progressed = true;
        }

        if send.index == schedule.sends.len() && recv.index == schedule.recvs.len() {
            return Ok(());
        }
        if progressed {
            continue;
        }
        let writable = schedule
            .sends
            .get(send.index)
            .filter(|s| s.after_recv.is_none_or(|dep| dep < recv.index))
            .map(|s| s.peer);
        let readable = schedule
            .recvs
            .get(recv.index)
            .filter(|r| {
                let may_apply = r.after_send.is_none_or(|dep| dep < send.index);
                let stalled = match r.action {
                    RecvAction::Store => !may_apply,
                    RecvAction::Reduce { .. } => {
                        recv.done == FRAME_HEADER_LEN + r.range.len() * es && !may_apply
                    }
                };
                !stalled
            })
            .map(|r| r.peer);
        let Some(blocking_peer) = readable.or(writable) else {
            return Err(Error::InvalidArgument(format!(
                "rank {}: {}: schedule cannot make progress (a send waits for a receive that does not exist)",
                call.rank, call.op
            )));
        };
        match transport.wait(writable, readable, call.deadline) {
            Ok(Readiness::Ready) => {}
            Ok(Readiness::TimedOut) => {
                return Err(timed_out(call, schedule, blocking_peer, &send, &recv));
            }
            Err(e) => {
                return Err(Error::Io {
                    rank: call.rank,
                    context: format!("waiting for rank {blocking_peer} in {}", call.op),
                    source: e,
                })
            }
        }
    }
}

fn check_header(
    call: &Call,
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
    if header.op != call.op {
        return Err(Error::CollectiveMismatch {
            rank: call.rank,
            mine: call.op,
            peer,
            theirs: header.op,
        });
    }
    if header.algorithm != call.algorithm {
        return Err(Error::Protocol {
            rank: call.rank,
            peer,
            op: call.op,
            reason: format!(
                "peer runs the {} algorithm, this rank {}: configure the algorithm (RINGCCL_ALGO, InitOptions) identically on every rank",
                header.algorithm.name(),
                call.algorithm.name()
            ),
        });
    }
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

fn peer_lost(call: &Call, peer: usize, reason: &str) -> Error {
    Error::PeerLost {
        rank: peer,
        observer: call.rank,
        op: call.op,
        reason: reason.to_string(),
        gone: Vec::new(),
    }
}

fn timed_out(call: &Call, schedule: &Schedule, peer: usize, send: &Cursor, recv: &Cursor) -> Error {
    let frame = |r: &Range<usize>| (FRAME_HEADER_LEN + r.len() * call.elem_size) as u64;
    let mut moved = 0;
    let mut expected = 0;
    for (i, s) in schedule
        .sends
        .iter()
        .enumerate()
        .filter(|(_, s)| s.peer == peer)
    {
        expected += frame(&s.range);
        moved += match i.cmp(&send.index) {
            std::cmp::Ordering::Less => frame(&s.range),
            std::cmp::Ordering::Equal => send.done as u64,
            std::cmp::Ordering::Greater => 0,
        };
    }
    for (i, r) in schedule
        .recvs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.peer == peer)
    {
        expected += frame(&r.range);
        moved += match i.cmp(&recv.index) {
            std::cmp::Ordering::Less => frame(&r.range),
            std::cmp::Ordering::Equal => recv.done as u64,
            std::cmp::Ordering::Greater => 0,
        };
    }
    Error::Timeout {
        rank: call.rank,
        peer,
        op: call.op,
        moved,
        expected,
        timeout: call.timeout,
        gone: Vec::new(),
    }
}
