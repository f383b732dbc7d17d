//! Ranks in separate processes of one host read each other's buffers: the one-copy
//! all-reduce. Where rings move every byte twice (into the peer's ring, out of it), each
//! byte here crosses between processes once, read straight out of the peer's buffer:
//!
//! - **in place**, when the peer's buffer lies in a shared buffer (a file in `/dev/shm`
//!   the peer allocated, [`MemoryBarrier::shared_ticket`]): this rank maps it and reads
//!   it at the speed of memory ([`MemoryBarrier::shared_bytes`]). The engine takes this
//!   path by itself when this rank's buffer is a shared one, so every rank must pass a
//!   shared buffer, or none;
//! - **through the kernel** (cross-memory attach, [`MemoryBarrier::read_peer`]) for any
//!   other buffer, when every rank could read every other's memory at set-up
//!   ([`MemoryBarrier::reads_peer_memory`], the same answer on every rank) and the call
//!   asked for it (`RINGCCL_ALGO=pm`).
//!
//! The steps of call `seq` are arrivals at the barrier ([`arrival`]`(seq, step)`):
//!
//! 1. **post**: every rank writes its call's header, its buffer's address and length,
//!    and its shared buffer's ticket if it has one, in its slot, and arrives at step 1;
//!    once every rank has, each checks every peer's header against its own call (a peer
//!    in another call is named, as for a barrier). A peer that runs the call through the
//!    rings instead sends this rank a frame while it waits, and is named at once.
//! 2. **reduce**: rank `r` folds segment `r` of every other rank's buffer into its own,
//!    in place: `((own op b_a) op b_b) ...` over the other ranks in increasing rank
//!    order, a chunk at a time (a chunk read through the kernel goes through scratch that
//!    stays in cache); then arrives at step 2. When every rank's buffer is a shared one,
//!    it also writes each reduced chunk into segment `r` of every peer's buffer, while
//!    the chunk is still in cache, and the call ends once every rank has arrived at step
//!    2: each rank reads and writes each byte of the buffer once, as a `memcpy` would,
//!    and no segment is touched by two ranks.
//! 3. **gather**: otherwise, once every rank has arrived at step 2, rank `r` reads
//!    segment `q` of rank `q`'s buffer into its own, for every other `q`; then arrives at
//!    step 3.
//! 4. **leave** once every rank has arrived at step 3: nobody reads this buffer any more.
//!
//! Every segment is reduced once, by one rank, in one order, and copied to the others:
//! results are bit-identical on every rank. After a call that failed, a shared buffer's
//! contents are unspecified (a slower peer may still be writing its segment).
//!
//! Every wait is bounded by the call's deadline, and names the rank it gave up on, as
//! the barrier's do. A rank may leave at any step without harm to the others: its
//! shared buffer stays mapped in its peers, and the kernel's reads of its memory fail (a
//! dead process) or copy whatever is there (a process that went on), and never fault.
//! Such a rank returns an error and breaks the group, and no peer returns success, since
//! that needs this rank's arrival at step 3.

use std::io;
use std::time::{Duration, Instant};

use crate::hooks::ProgressSink;
use crate::kernels::{finalize_avg, reduce_bytes, Order};
use crate::memory_barrier::{
    arrival, await_all, await_all_watching, check_slot_header, frame_waiting, frames_left_behind,
    shared_barrier, Awaited, MemoryBarrier, OffersMemoryBarrier, SharedTicket, SHARED_TICKET_LEN,
};
use crate::schedule::byte_segment;
use crate::transport::Transport;
use crate::wire::{Algorithm, FrameHeader, FRAME_HEADER_LEN};
use crate::{DType, Error, OpDesc, ReduceOp};

/// Bytes folded at a time: a peer's chunk is read into scratch of this size, small
/// enough to stay in cache while it is folded in.
const CHUNK_BYTES: usize = 256 * 1024;

/// Bytes reduced at a time when every buffer is shared: the chunk of every rank's
/// buffer read and the result written back into each stay in this core's cache together
/// (four ranks' 64 KiB in a 1 MiB L2), so writing the result into the peers' buffers
/// reads nothing again from memory.
const WRITTEN_CHUNK_BYTES: usize = 64 * 1024;

/// What a rank posts in its slot: its buffer's address and length, little-endian, a
/// byte saying whether a shared buffer's ticket follows, and the ticket.
const POSTED_LEN: usize = 24 + SHARED_TICKET_LEN;

/// Where a peer's buffer is read from.
enum Source {
    /// Its process's memory at this address, through the kernel.
    Process(u64),
    /// Its shared buffer, mapped here.
    Shared(SharedTicket),
}

/// One all-reduce: `buf` (`dtype` elements reduced with `reduce`) across the ranks of
/// `transport`, which reads its peers' memory, as call `op` in slot `slot`; `scratch`
/// holds a peer's chunk. See the module documentation.
pub(crate) fn all_reduce<T: Transport + OffersMemoryBarrier + ?Sized>(
    transport: &mut T,
    op: &OpDesc,
    (buf, dtype, reduce): (&mut [u8], DType, ReduceOp),
    (slot, scratch): (usize, &mut Vec<u64>),
    (deadline, timeout): (Instant, Duration),
    progress: ProgressSink<'_>,
) -> Result<(), Error> {
    let (rank, n) = (transport.rank(), transport.world_size());
    let header = FrameHeader {
        op: *op,
        algorithm: Algorithm::PeerMemory,
        payload_len: POSTED_LEN as u32,
    }
    .encode();
    let mut posted = [0u8; POSTED_LEN];
    posted[..8].copy_from_slice(&(buf.as_ptr() as u64).to_le_bytes());
    posted[8..16].copy_from_slice(&(buf.len() as u64).to_le_bytes());
    let times = (deadline, timeout);

    // 1. Post, and learn where every peer's buffer is.
    {
        let barrier = shared_barrier(transport, rank, op)?;
        if let Some(ticket) = barrier.shared_ticket(buf.as_ptr() as u64, buf.len()) {
            posted[16] = 1;
            posted[24..].copy_from_slice(&ticket);
        }
        barrier.arrive(arrival(op.seq, 1), slot, &header, &posted);
    }
    let in_rings = |barrier: &dyn MemoryBarrier| peer_in_rings(barrier, (rank, n), op);
    let posted_all = Awaited::Posted(arrival(op.seq, 1), slot);
    await_all_watching(transport, op, posted_all, times, progress, in_rings)?;
    let (sources, reads_processes) = {
        let barrier = shared_barrier(transport, rank, op)?;
        frames_left_behind(barrier, (rank, n), op)?;
        let sources = posted_sources(barrier, (rank, n), op, slot, buf.len())?;
        (sources, barrier.reads_peer_memory())
    };
    if let Some(peer) = sources
        .iter()
        .position(|s| matches!(s, Some(Source::Process(_))))
        .filter(|_| !reads_processes)
    {
        return Err(Error::Protocol {
            rank,
            peer,
            op: *op,
            reason: "its buffer is not a shared buffer, and the ranks here cannot read each \
                     other's memory: pass a shared buffer (ProcessGroup::shared_buffer) on \
                     every rank, or on none"
                .into(),
        });
    }

    // Every rank's buffer a shared one (its own posted so, every peer's mapped here):
    // each rank writes its reduced segment into every buffer, and the call ends there.
    let everyone_shared = posted[16] == 1
        && sources
            .iter()
            .all(|s| !matches!(s, Some(Source::Process(_))));

    // 2. Reduce this rank's segment.
    let es = dtype.size().max(1);
    let count = buf.len() / es;
    let segment = |r: usize| byte_segment(count, n, r, es);
    let chunk_bytes = if everyone_shared {
        WRITTEN_CHUNK_BYTES
    } else {
        CHUNK_BYTES
    };
    let chunk = (chunk_bytes / es).max(1) * es;
    let words = chunk.div_ceil(8);
    if scratch.len() < words {
        scratch.resize(words, 0);
    }
    let scratch: &mut [u8] = bytemuck::cast_slice_mut(scratch.as_mut_slice());
    let own = segment(rank);
    let read_failed = |peer: usize, e: io::Error| read_error(rank, peer, op, e);
    let kernel_failed = |e: crate::kernels::KernelError| Error::Protocol {
        rank,
        peer: rank,
        op: *op,
        reason: format!("reducing its segment failed: {}", e.0),
    };
    {
        let barrier = shared_barrier(transport, rank, op)?;
        let mut at = own.start;
        while at < own.end {
            let len = chunk.min(own.end - at);
            let acc = &mut buf[at..at + len];
            for peer in folded_after_own(rank, n) {
                let theirs: &[u8] = match &sources[peer] {
                    None => continue,
                    Some(Source::Shared(ticket)) => barrier
                        .shared_bytes(peer, ticket, (at as u64, len))
                        .map_err(|e| read_failed(peer, e))?,
                    Some(Source::Process(address)) => {
                        let theirs = &mut scratch[..len];
                        barrier
                            .read_peer(peer, address + at as u64, theirs)
                            .map_err(|e| read_failed(peer, e))?;
                        theirs
                    }
                };
                reduce_bytes(dtype, reduce, acc, theirs, Order::LocalFirst)
                    .map_err(kernel_failed)?;
            }
            if reduce == ReduceOp::Avg {
                finalize_avg(dtype, acc, n).map_err(kernel_failed)?;
            }
            if everyone_shared {
                for (peer, source) in sources.iter().enumerate() {
                    if let Some(Source::Shared(ticket)) = source {
                        barrier
                            .shared_bytes_mut(peer, ticket, (at as u64, len))
                            .map_err(|e| read_failed(peer, e))?
                            .copy_from_slice(acc);
                    }
                }
            }
            at += len;
        }
        barrier.advance(arrival(op.seq, 2));
    }
    await_all(
        transport,
        op,
        Awaited::Arrival(arrival(op.seq, 2)),
        times,
        progress,
    )?;
    if everyone_shared {
        // Every rank has written its segment into this buffer and read what it needed
        // of it: nobody touches it any more.
        return Ok(());
    }

    // 3. Gather every other rank's segment.
    {
        let barrier = shared_barrier(transport, rank, op)?;
        for (peer, source) in sources.iter().enumerate() {
            let range = segment(peer);
            let start = range.start as u64;
            match source {
                None => continue,
                Some(Source::Shared(ticket)) => {
                    let theirs = barrier
                        .shared_bytes(peer, ticket, (start, range.len()))
                        .map_err(|e| read_failed(peer, e))?;
                    buf[range].copy_from_slice(theirs);
                }
                Some(Source::Process(address)) => barrier
                    .read_peer(peer, address + start, &mut buf[range])
                    .map_err(|e| read_failed(peer, e))?,
            }
        }
        barrier.advance(arrival(op.seq, 3));
    }
    // 4. Leave once nobody reads this buffer any more.
    await_all(
        transport,
        op,
        Awaited::Arrival(arrival(op.seq, 3)),
        times,
        progress,
    )
}

/// The ranks whose segment rank `rank` folds into its own, in order: every other rank,
/// in increasing rank order (the same order on every rank, for every segment).
fn folded_after_own(rank: usize, n: usize) -> impl Iterator<Item = usize> {
    (0..n).filter(move |&peer| peer != rank)
}

/// While this rank waits at step 1: a frame from a peer for this call or an earlier one
/// means that peer runs it through the rings (its buffer is not a shared one, or it
/// chose otherwise), and will never arrive here.
fn peer_in_rings(
    barrier: &dyn MemoryBarrier,
    (rank, n): (usize, usize),
    op: &OpDesc,
) -> Result<(), Error> {
    match frame_waiting(barrier, (rank, n), op)? {
        Some((peer, header)) => Err(Error::Protocol {
            rank,
            peer,
            op: *op,
            reason: format!(
                "it runs this call by {:?} while this rank reads the peers' buffers in \
                 place (its buffer is a shared buffer): pass a shared buffer \
                 (ProcessGroup::shared_buffer) on every rank, or on none",
                header.algorithm
            ),
        }),
        None => Ok(()),
    }
}

/// Where to read every peer's buffer from (`None` for this rank), once each peer's
/// header was checked against this call and its length against `len`.
fn posted_sources(
    barrier: &dyn MemoryBarrier,
    (rank, n): (usize, usize),
    op: &OpDesc,
    slot: usize,
    len: usize,
) -> Result<Vec<Option<Source>>, Error> {
    let mut sources = Vec::with_capacity(n);
    let mut raw = [0u8; FRAME_HEADER_LEN];
    let mut posted = [0u8; POSTED_LEN];
    for peer in 0..n {
        if peer == rank {
            sources.push(None);
            continue;
        }
        barrier.read_slot(peer, slot, &mut raw, &mut posted);
        check_slot_header(rank, peer, (op, Algorithm::PeerMemory), &raw, POSTED_LEN)?;
        let word = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&posted[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        let theirs = word(8);
        if theirs != len as u64 {
            return Err(Error::Protocol {
                rank,
                peer,
                op: *op,
                reason: format!("it posted a buffer of {theirs} bytes, this rank {len}"),
            });
        }
        sources.push(Some(if posted[16] == 1 {
            let mut ticket = [0u8; SHARED_TICKET_LEN];
            ticket.copy_from_slice(&posted[24..]);
            Source::Shared(ticket)
        } else {
            Source::Process(word(0))
        }));
    }
    Ok(sources)
}

/// A failed read of `peer`'s memory: a process that is gone
/// ([`io::ErrorKind::BrokenPipe`], as the transport reports it) is a lost peer; anything
/// else (refused, an address outside its memory) is a protocol error naming it.
fn read_error(rank: usize, peer: usize, op: &OpDesc, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::BrokenPipe {
        return Error::PeerLost {
            rank: peer,
            observer: rank,
            op: *op,
            reason: format!("its process is gone ({e})"),
            gone: Vec::new(),
        };
    }
    Error::Protocol {
        rank,
        peer,
        op: *op,
        reason: format!("reading its buffer across processes failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The protocol's plan, run symbolically: each rank folds its segment (the segments
    /// `byte_segment` gives) in [`folded_after_own`]'s order, starting from its own
    /// values, and the result lands in every rank's buffer, in place (every buffer
    /// shared) or gathered. Every element of every rank must end as the same expression,
    /// holding every rank's input exactly once.
    #[test]
    fn every_element_is_folded_once_over_every_rank_and_identical_everywhere() {
        for n in 1..=9 {
            for es in [1usize, 2, 4, 8] {
                for count in [0usize, 1, 2, n - 1, n, n + 1, 3 * n + 2, 1000, 1001] {
                    let mut buffers: Vec<Vec<String>> = (0..n)
                        .map(|r| (0..count).map(|_| format!("x{r}")).collect())
                        .collect();
                    let mut reduced: Vec<Vec<String>> = buffers.clone();
                    let mut covered = vec![0u32; count];
                    for (rank, segment) in reduced.iter_mut().enumerate() {
                        let bytes = byte_segment(count, n, rank, es);
                        assert_eq!(bytes.start % es, 0);
                        assert_eq!(bytes.end % es, 0);
                        for i in bytes.start / es..bytes.end / es {
                            covered[i] += 1;
                            let mut acc = buffers[rank][i].clone();
                            for peer in folded_after_own(rank, n) {
                                acc = format!("({acc}+{})", buffers[peer][i]);
                            }
                            segment[i] = acc;
                        }
                    }
                    assert!(
                        covered.iter().all(|&c| c == 1),
                        "n={n} count={count}: {covered:?}"
                    );
                    // Written into (or gathered by) every rank.
                    let owner_of = |i: usize| {
                        (0..n)
                            .find(|&r| byte_segment(count, n, r, es).contains(&(i * es)))
                            .expect("every element has an owner")
                    };
                    for buffer in &mut buffers {
                        for (i, value) in buffer.iter_mut().enumerate() {
                            *value = reduced[owner_of(i)][i].clone();
                        }
                    }
                    for i in 0..count {
                        let first = &buffers[0][i];
                        assert!(
                            buffers.iter().all(|b| &b[i] == first),
                            "n={n} count={count} i={i}"
                        );
                        for r in 0..n {
                            assert_eq!(
                                first.matches(&format!("x{r}")).count(),
                                1,
                                "n={n} count={count} i={i}: {first}"
                            );
                        }
                    }
                }
            }
        }
    }
}
