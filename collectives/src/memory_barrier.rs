//! The barrier in shared memory: every rank publishes the number of the latest barrier it
//! has arrived at, in memory that every rank of the group maps, and waits until every
//! other rank's number has reached its own. One store and a wake-up check to arrive, one
//! load per rank to look; no frame, no forwarding, so the rank that arrives last releases
//! everyone at once. Where the ranks take turns on the cores, that saves the round trips
//! through ranks that are not running which the barriers of messages wait on.
//!
//! The same arrivals carry small all-reduces (up to [`SLOT_DATA`] bytes): each rank
//! writes its call's header and data into one of two slots beside its arrival word, and,
//! once every rank has arrived, reads every rank's slot and folds them in rank order, so
//! every rank computes the same expression and ends bit-identical. Barriers write their
//! header too. Every rank checks every peer's header against its own call before it
//! uses the slot: a peer in another call, or in another call in memory, is named
//! ([`Error::CollectiveMismatch`]) instead of being taken as arrived.
//!
//! A transport implements [`MemoryBarrier`] over the memory it shares, and offers it
//! ([`OffersMemoryBarrier::memory_barrier`]) only when it shares memory with every rank
//! of the group, which every rank of the group knows alike: either every rank runs this
//! barrier or none does. Both traits are declared here, beside the protocol, so that the
//! [`Transport`] contract stays byte movement and imports nothing from here.
//!
//! Errors stay what the barriers of messages give:
//! - a rank that does not arrive is named at the deadline ([`Error::Timeout`]), and the
//!   control plane's checks see this rank blocked on it meanwhile: a peer in another call
//!   numbered like this one is named as a mismatch by the sentinel;
//! - a rank whose connection is gone before it arrived is named ([`Error::PeerLost`]);
//! - once every rank has arrived, a frame of a collective numbered like this barrier or
//!   earlier, still waiting from a peer, comes from a call this rank never ran (a peer's
//!   broadcast from itself finishes without this rank, and the peer's next barrier then
//!   counts as an arrival): its header names that call ([`Error::CollectiveMismatch`]).
//!   The frame is looked at, not taken. The check runs after the arrivals, which the
//!   peer published after its frame, so its outcome does not depend on timing.
//!   Point-to-point frames are left for the receive they belong to.

use std::io;
use std::time::Instant;

use crate::control::RETRY_EVERY;
use crate::hooks::ProgressSink;
use crate::kernels::{self, Order};
use crate::transport::Transport;
use crate::wire::{same_call, Algorithm, FrameHeader, FRAME_HEADER_LEN};
use crate::{CollectiveKind, DType, Error, OpDesc, ReduceOp};

/// The most bytes an all-reduce in memory carries (one slot's data).
pub const SLOT_DATA: usize = 1024;

/// Bytes of a [`SharedTicket`].
pub const SHARED_TICKET_LEN: usize = 40;

/// What a rank posts so that its peers can map the shared buffer its call's buffer lies
/// in: written and read by the transport, opaque to the protocols.
pub type SharedTicket = [u8; SHARED_TICKET_LEN];

/// Arrivals a call may publish: a barrier or a small all-reduce publishes one, a call
/// that reads the peers' buffers (`one_copy.rs`) one per step.
const ARRIVALS_PER_CALL: u64 = 4;

/// The number a rank publishes on arriving at step `step` (below
/// [`ARRIVALS_PER_CALL`]) of the group's collective number `seq`: it only grows, from
/// call to call and from step to step.
pub(crate) fn arrival(seq: u64, step: u64) -> u64 {
    seq.saturating_mul(ARRIVALS_PER_CALL)
        .saturating_add(step.min(ARRIVALS_PER_CALL - 1))
}

/// What a wait at the barrier waits for from every other rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Awaited {
    /// Its arrival at this number ([`MemoryBarrier::advance`] or
    /// [`MemoryBarrier::arrive`]).
    Arrival(u64),
    /// Its call with this number posted in this slot ([`MemoryBarrier::arrive`]), which
    /// a transport may let a waiter see in one look at the slot.
    Posted(u64, usize),
}

impl Awaited {
    /// The arrival number waited for.
    pub fn number(self) -> u64 {
        match self {
            Awaited::Arrival(seq) | Awaited::Posted(seq, _) => seq,
        }
    }
}

/// Where a wait for the other ranks' arrival ended ([`MemoryBarrier::wait_all_arrived`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Every rank has arrived.
    All,
    /// The time given passed first; this rank is the first (in rank order) still missing.
    Missing(usize),
    /// This rank's connection is gone, and it had not arrived.
    Gone(usize),
}

/// A barrier in memory that every rank of the group shares with this one (see the module
/// documentation). Arrivals are numbered from the group's collective counter, the same on
/// every rank, and only grow.
pub trait MemoryBarrier {
    /// Writes `header` and `data` (at most [`SLOT_DATA`] bytes) into this rank's slot
    /// `slot` (0 or 1), publishes that this rank has arrived at `seq`, and wakes the
    /// ranks that sleep waiting for arrivals.
    fn arrive(&mut self, seq: u64, slot: usize, header: &[u8; FRAME_HEADER_LEN], data: &[u8]);

    /// Publishes that this rank has arrived at `seq`, leaving its slots as they are, and
    /// wakes the ranks that sleep waiting for arrivals.
    fn advance(&mut self, seq: u64);

    /// Whether [`MemoryBarrier::read_peer`] works with every rank of the group, as every
    /// rank learnt alike at set-up. `false` (the default): no rank reads another's buffers.
    fn reads_peer_memory(&self) -> bool {
        false
    }

    /// Copies `out.len()` bytes from `address` in `peer`'s memory into `out`: `peer`'s
    /// buffer, whose address it published in its slot. Only where
    /// [`MemoryBarrier::reads_peer_memory`]; the default refuses. A peer whose process is
    /// gone is [`io::ErrorKind::BrokenPipe`].
    fn read_peer(&self, peer: usize, address: u64, out: &mut [u8]) -> io::Result<()> {
        let _ = (peer, address, out);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this transport does not read its peers' memory",
        ))
    }

    /// Where this rank's buffer at `address` (`len` bytes) lies in a shared buffer its
    /// peers can map: the ticket it posts so that they can. `None` (the default) for
    /// any other memory.
    fn shared_ticket(&self, address: u64, len: usize) -> Option<SharedTicket> {
        let _ = (address, len);
        None
    }

    /// `len` bytes at `offset` into the shared buffer `peer` posted `ticket` for, mapped
    /// here (the first use maps it, after the same checks as an inbox). The caller reads
    /// them only while the protocol keeps `peer` from writing them. A peer whose
    /// process or buffer is gone is [`io::ErrorKind::BrokenPipe`].
    fn shared_bytes(
        &mut self,
        peer: usize,
        ticket: &SharedTicket,
        (offset, len): (u64, usize),
    ) -> io::Result<&[u8]> {
        let _ = (peer, ticket, offset, len);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this transport maps no shared buffers",
        ))
    }

    /// [`MemoryBarrier::shared_bytes`], to write: the caller writes them only while the
    /// protocol keeps `peer` from reading or writing them.
    fn shared_bytes_mut(
        &mut self,
        peer: usize,
        ticket: &SharedTicket,
        (offset, len): (u64, usize),
    ) -> io::Result<&mut [u8]> {
        let _ = (peer, ticket, offset, len);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this transport maps no shared buffers",
        ))
    }

    /// Copies `peer`'s slot `slot`: its header, and its first `data.len()` data bytes.
    /// `false` when this transport shares no memory with `peer`.
    fn read_slot(
        &self,
        peer: usize,
        slot: usize,
        header: &mut [u8; FRAME_HEADER_LEN],
        data: &mut [u8],
    ) -> bool;

    /// The first rank (in rank order) that has not done what `awaited` says, at a
    /// glance; `None` once every rank has.
    fn first_missing(&self, awaited: Awaited) -> Option<usize>;

    /// Waits until every rank has done what `awaited` says, a peer that has not is gone,
    /// or `slice` has passed (never beyond `deadline`). The slice is counted from the
    /// first reading of the clock, which a wait that ends while it spins need not take.
    fn wait_all_arrived(
        &mut self,
        awaited: Awaited,
        deadline: Instant,
        slice: std::time::Duration,
    ) -> io::Result<Arrivals>;

    /// Copies the first bytes waiting from `peer` into `buf` without taking them;
    /// returns how many (0 when none wait).
    fn peek(&self, peer: usize, buf: &mut [u8]) -> usize;
}

/// How a transport offers its [`MemoryBarrier`], a capability the host engine asks for
/// beside [`Transport`]. A transport with no memory shared with every rank
/// implements it empty: the default offers none, and barriers are then messages.
///
/// ```
/// use ringccl_collectives::memory_barrier::OffersMemoryBarrier;
///
/// /// A transport whose ranks share no memory.
/// struct Sockets;
/// impl OffersMemoryBarrier for Sockets {}
///
/// assert!(Sockets.memory_barrier().is_none());
/// ```
pub trait OffersMemoryBarrier {
    /// The barrier in memory shared with every rank of the group, when this transport
    /// has such memory: every rank of a group must answer alike. `None` (the default):
    /// barriers are messages.
    fn memory_barrier(&mut self) -> Option<&mut dyn MemoryBarrier> {
        None
    }
}

/// An all-reduce's part of a call in memory: the caller's buffer, its element type and
/// operator, and room to fold in.
pub(crate) struct Reduction<'a> {
    pub(crate) buf: &'a mut [u8],
    pub(crate) dtype: DType,
    pub(crate) op: ReduceOp,
    pub(crate) scratch: &'a mut Vec<u64>,
}

/// Runs `op` through `transport`'s memory barrier in slot `slot`, until `deadline` (its
/// timeout `timeout`, for messages): a barrier, or with `reduction` an all-reduce of at
/// most [`SLOT_DATA`] bytes. Waits in slices of at most [`RETRY_EVERY`], recording the
/// rank it waits for after each, as the executor does, so that a peer that asks is told
/// what this rank waits for.
pub(crate) fn run<T: Transport + OffersMemoryBarrier + ?Sized>(
    transport: &mut T,
    op: &OpDesc,
    (slot, mut reduction): (usize, Option<Reduction<'_>>),
    (deadline, timeout): (Instant, std::time::Duration),
    progress: ProgressSink<'_>,
) -> Result<(), Error> {
    let (rank, world_size) = (transport.rank(), transport.world_size());
    let data: &[u8] = reduction.as_ref().map_or(&[], |r| &*r.buf);
    if data.len() > SLOT_DATA {
        return Err(Error::InvalidArgument(format!(
            "rank {rank}: {op}: {} bytes do not fit a slot of {SLOT_DATA}",
            data.len()
        )));
    }
    let header = FrameHeader {
        op: *op,
        algorithm: Algorithm::SharedCounters,
        payload_len: data.len() as u32,
    }
    .encode();
    let number = arrival(op.seq, 0);
    let barrier = shared_barrier(transport, rank, op)?;
    barrier.arrive(number, slot, &header, data);
    await_all(
        transport,
        op,
        Awaited::Posted(number, slot),
        (deadline, timeout),
        progress,
    )?;
    let barrier = shared_barrier(transport, rank, op)?;
    // A frame left behind names the call it came from, which is more than the peer's
    // slot says (its next call in memory).
    frames_left_behind(barrier, (rank, world_size), op)?;
    match reduction.as_mut() {
        None => same_calls(barrier, (rank, world_size), op, slot, 0),
        Some(reduction) => fold(barrier, (rank, world_size), op, slot, reduction),
    }
}

/// `transport`'s barrier in memory, for call `op` of rank `rank`; an error when it shares
/// no memory with every rank.
pub(crate) fn shared_barrier<'t, T: OffersMemoryBarrier + ?Sized>(
    transport: &'t mut T,
    rank: usize,
    op: &OpDesc,
) -> Result<&'t mut dyn MemoryBarrier, Error> {
    transport.memory_barrier().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "rank {rank}: {op}: no memory shared with every rank for a call in memory"
        ))
    })
}

/// Waits until every rank has arrived at `number` in call `op`, until `deadline` (its
/// timeout `timeout`, for messages), in slices of at most [`RETRY_EVERY`], telling
/// `progress` whom it waits for after each. A rank missing at the deadline is named
/// ([`Error::Timeout`]), as is one whose connection is gone ([`Error::PeerLost`]).
pub(crate) fn await_all<T: Transport + OffersMemoryBarrier + ?Sized>(
    transport: &mut T,
    op: &OpDesc,
    awaited: Awaited,
    times: (Instant, std::time::Duration),
    progress: ProgressSink<'_>,
) -> Result<(), Error> {
    await_all_watching(transport, op, awaited, times, progress, |_| Ok(()))
}

/// [`await_all`], asking `watch` after every slice whether what the barrier shows
/// (frames a peer sent meanwhile) ends the wait with an error.
pub(crate) fn await_all_watching<T: Transport + OffersMemoryBarrier + ?Sized>(
    transport: &mut T,
    op: &OpDesc,
    awaited: Awaited,
    (deadline, timeout): (Instant, std::time::Duration),
    progress: ProgressSink<'_>,
    watch: impl Fn(&dyn MemoryBarrier) -> Result<(), Error>,
) -> Result<(), Error> {
    let rank = transport.rank();
    let io_error = |e: io::Error| Error::Io {
        rank,
        context: format!("waiting in {op}"),
        source: e,
    };
    let barrier = shared_barrier(transport, rank, op)?;
    if let Some(first) = barrier.first_missing(awaited) {
        progress.blocked_on(first, 0);
        loop {
            match barrier
                .wait_all_arrived(awaited, deadline, RETRY_EVERY)
                .map_err(io_error)?
            {
                Arrivals::All => break,
                Arrivals::Missing(peer) if Instant::now() >= deadline => {
                    return Err(Error::Timeout {
                        rank,
                        peer,
                        op: *op,
                        moved: 0,
                        expected: 0,
                        timeout,
                        gone: Vec::new(),
                        cause: None,
                    })
                }
                Arrivals::Missing(peer) => {
                    progress.blocked_on(peer, 0);
                    watch(&*barrier)?;
                }
                Arrivals::Gone(peer) => {
                    let reason = match transport.peer_host(peer) {
                        Some(host) => format!(
                            "its connection closed before it reached this call; rank {peer} ran on {host}"
                        ),
                        None => "its connection closed before it reached this call".into(),
                    };
                    return Err(Error::PeerLost {
                        rank: peer,
                        observer: rank,
                        op: *op,
                        reason,
                        gone: Vec::new(),
                    });
                }
            }
        }
    }
    Ok(())
}

/// Checks every peer's header in slot `slot` against this rank's call `op` (carrying
/// `len` bytes): a peer in another call is a mismatch.
fn same_calls(
    barrier: &dyn MemoryBarrier,
    (rank, world_size): (usize, usize),
    op: &OpDesc,
    slot: usize,
    len: usize,
) -> Result<(), Error> {
    let mut raw = [0u8; FRAME_HEADER_LEN];
    for peer in (0..world_size).filter(|&p| p != rank) {
        barrier.read_slot(peer, slot, &mut raw, &mut []);
        check_slot_header(rank, peer, (op, Algorithm::SharedCounters), &raw, len)?;
    }
    Ok(())
}

/// Checks `peer`'s slot header (`raw`) against this rank's call `op`, run by `algorithm`
/// and carrying `len` bytes: a peer in another call is a mismatch.
pub(crate) fn check_slot_header(
    rank: usize,
    peer: usize,
    (op, algorithm): (&OpDesc, Algorithm),
    raw: &[u8; FRAME_HEADER_LEN],
    len: usize,
) -> Result<(), Error> {
    let header = peer_header(rank, peer, op, raw)?;
    same_call(rank, peer, (*op, algorithm), (header.op, header.algorithm))?;
    if header.payload_len as usize != len {
        return Err(Error::Protocol {
            rank,
            peer,
            op: *op,
            reason: format!(
                "it published {} bytes for this call, this rank {len}",
                header.payload_len
            ),
        });
    }
    Ok(())
}

/// `peer`'s header, decoded; what does not decode is a protocol error in `op`.
fn peer_header(
    rank: usize,
    peer: usize,
    op: &OpDesc,
    raw: &[u8; FRAME_HEADER_LEN],
) -> Result<FrameHeader, Error> {
    FrameHeader::decode(raw).map_err(|e| Error::Protocol {
        rank,
        peer,
        op: *op,
        reason: e.to_string(),
    })
}

/// `peer`'s header describes this call in memory, or the mismatch names both calls.
fn same_as_this_call(
    rank: usize,
    peer: usize,
    op: &OpDesc,
    header: &FrameHeader,
) -> Result<(), Error> {
    same_call(
        rank,
        peer,
        (*op, Algorithm::SharedCounters),
        (header.op, header.algorithm),
    )
}

/// The all-reduce: every rank's slot folded in rank order into `reduction.buf`.
fn fold(
    barrier: &dyn MemoryBarrier,
    (rank, world_size): (usize, usize),
    op: &OpDesc,
    slot: usize,
    reduction: &mut Reduction<'_>,
) -> Result<(), Error> {
    let len = reduction.buf.len();
    let words = len.div_ceil(8);
    if reduction.scratch.len() < 2 * words {
        reduction.scratch.resize(2 * words, 0);
    }
    let scratch: &mut [u8] = bytemuck::cast_slice_mut(reduction.scratch.as_mut_slice());
    let (acc, operand) = scratch.split_at_mut(words * 8);
    let (acc, operand) = (&mut acc[..len], &mut operand[..len]);
    let mut raw = [0u8; FRAME_HEADER_LEN];
    let fail =
        |e: kernels::KernelError| Error::InvalidArgument(format!("rank {rank}: {op}: {}", e.0));
    for peer in 0..world_size {
        let source: &[u8] = if peer == rank {
            &*reduction.buf
        } else {
            barrier.read_slot(peer, slot, &mut raw, operand);
            check_slot_header(rank, peer, (op, Algorithm::SharedCounters), &raw, len)?;
            &*operand
        };
        if peer == 0 {
            acc.copy_from_slice(source);
        } else {
            kernels::reduce_bytes(
                reduction.dtype,
                reduction.op,
                acc,
                source,
                Order::LocalFirst,
            )
            .map_err(fail)?;
        }
    }
    if reduction.op == ReduceOp::Avg {
        kernels::finalize_avg(reduction.dtype, acc, world_size).map_err(fail)?;
    }
    reduction.buf.copy_from_slice(acc);
    Ok(())
}

/// Once every rank has arrived at barrier `op`: a collective frame numbered like it or
/// earlier, still waiting from a peer, belongs to a call this rank never ran (see the
/// module documentation). Looked at, not taken.
pub(crate) fn frames_left_behind(
    barrier: &dyn MemoryBarrier,
    (rank, world_size): (usize, usize),
    op: &OpDesc,
) -> Result<(), Error> {
    match frame_waiting(barrier, (rank, world_size), op)? {
        Some((peer, header)) => {
            same_as_this_call(rank, peer, op, &header)?;
            Err(Error::Protocol {
                rank,
                peer,
                op: *op,
                reason: "it sent a frame in a barrier that sends none".into(),
            })
        }
        None => Ok(()),
    }
}

/// The first peer, in rank order, with a collective frame waiting for this rank that is
/// numbered like call `op` or earlier, and that frame's header. Looked at, not taken.
pub(crate) fn frame_waiting(
    barrier: &dyn MemoryBarrier,
    (rank, world_size): (usize, usize),
    op: &OpDesc,
) -> Result<Option<(usize, FrameHeader)>, Error> {
    let mut raw = [0u8; FRAME_HEADER_LEN];
    for peer in (0..world_size).filter(|&p| p != rank) {
        if barrier.peek(peer, &mut raw) < FRAME_HEADER_LEN {
            continue;
        }
        let header = peer_header(rank, peer, op, &raw)?;
        if header.op.kind != CollectiveKind::SendRecv && header.op.seq <= op.seq {
            return Ok(Some((peer, header)));
        }
    }
    Ok(None)
}
