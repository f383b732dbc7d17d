//! Ranks in separate processes of one host read each other's buffers: the one-copy
//! all-reduce. Where rings move every byte twice (into the peer's ring, out of it), each
//! byte here crosses between processes once, copied by the kernel straight out of the
//! peer's buffer (cross-memory attach, [`MemoryBarrier::read_peer`]).
//!
//! The transport offers it through its [`MemoryBarrier`] when it shares memory with every
//! rank of the group and every rank could read every other's memory at set-up
//! ([`MemoryBarrier::reads_peer_memory`], the same answer on every rank). The steps of
//! call `seq` are arrivals at the barrier ([`arrival`]`(seq, step)`):
//!
//! 1. **post**: every rank writes its call's header and its buffer's address and length
//!    in its slot and arrives at step 1; once every rank has, each checks every peer's
//!    header against its own call (a peer in another call is named, as for a barrier).
//! 2. **reduce**: rank `r` folds segment `r` of every other rank's buffer into its own,
//!    in place: `((own op b_a) op b_b) ...` over the other ranks in increasing rank
//!    order, a chunk at a time (each peer's chunk is read into a scratch chunk that stays
//!    in cache); then arrives at step 2.
//! 3. **gather**: once every rank has arrived at step 2, rank `r` reads segment `q` of
//!    rank `q`'s buffer into its own, for every other `q`; then arrives at step 3.
//! 4. **leave** once every rank has arrived at step 3: nobody reads this buffer any more.
//!
//! Every segment is reduced once, by one rank, in one order, and copied to the others:
//! results are bit-identical on every rank.
//!
//! Every wait is bounded by the call's deadline, and names the rank it gave up on, as
//! the barrier's do. A rank may leave at any step without harm to the others: they read
//! its memory through the kernel, which fails (a dead process) or copies whatever is
//! there (a process that went on), and never faults. Such a rank returns an error and
//! breaks the group, and no peer returns success, since that needs this rank's arrival
//! at step 3.

use std::io;
use std::time::{Duration, Instant};

use crate::hooks::ProgressSink;
use crate::kernels::{finalize_avg, reduce_bytes, Order};
use crate::memory_barrier::{
    arrival, await_all, check_slot_header, frames_left_behind, shared_barrier, MemoryBarrier,
    OffersMemoryBarrier,
};
use crate::schedule::byte_segment;
use crate::transport::Transport;
use crate::wire::{Algorithm, FrameHeader, FRAME_HEADER_LEN};
use crate::{DType, Error, OpDesc, ReduceOp};

/// Bytes folded at a time: a peer's chunk is read into scratch of this size, small
/// enough to stay in cache while it is folded in.
const CHUNK_BYTES: usize = 256 * 1024;

/// What a rank posts in its slot: its buffer's address and length, little-endian.
const POSTED_LEN: usize = 16;

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
    posted[8..].copy_from_slice(&(buf.len() as u64).to_le_bytes());
    let times = (deadline, timeout);

    // 1. Post, and learn where every peer's buffer is.
    shared_barrier(transport, rank, op)?.arrive(arrival(op.seq, 1), slot, &header, &posted);
    await_all(transport, op, arrival(op.seq, 1), times, progress)?;
    let addresses = {
        let barrier = shared_barrier(transport, rank, op)?;
        frames_left_behind(barrier, (rank, n), op)?;
        posted_addresses(barrier, (rank, n), op, slot, buf.len())?
    };

    // 2. Reduce this rank's segment.
    let es = dtype.size().max(1);
    let count = buf.len() / es;
    let segment = |r: usize| byte_segment(count, n, r, es);
    let chunk = (CHUNK_BYTES / es).max(1) * es;
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
            for (peer, &address) in addresses.iter().enumerate().filter(|&(p, _)| p != rank) {
                let theirs = &mut scratch[..len];
                barrier
                    .read_peer(peer, address + at as u64, theirs)
                    .map_err(|e| read_failed(peer, e))?;
                reduce_bytes(dtype, reduce, acc, theirs, Order::LocalFirst)
                    .map_err(kernel_failed)?;
            }
            if reduce == ReduceOp::Avg {
                finalize_avg(dtype, acc, n).map_err(kernel_failed)?;
            }
            at += len;
        }
        barrier.advance(arrival(op.seq, 2));
    }
    await_all(transport, op, arrival(op.seq, 2), times, progress)?;

    // 3. Gather every other rank's segment.
    {
        let barrier = shared_barrier(transport, rank, op)?;
        for (peer, &address) in addresses.iter().enumerate().filter(|&(p, _)| p != rank) {
            let range = segment(peer);
            let start = range.start as u64;
            barrier
                .read_peer(peer, address + start, &mut buf[range])
                .map_err(|e| read_failed(peer, e))?;
        }
        barrier.advance(arrival(op.seq, 3));
    }
    // 4. Leave once nobody reads this buffer any more.
    await_all(transport, op, arrival(op.seq, 3), times, progress)
}

/// Every rank's posted buffer address (this rank's own entry unused), once each peer's
/// header was checked against this call and its length against `len`.
fn posted_addresses(
    barrier: &dyn MemoryBarrier,
    (rank, n): (usize, usize),
    op: &OpDesc,
    slot: usize,
    len: usize,
) -> Result<Vec<u64>, Error> {
    let mut addresses = vec![0u64; n];
    let mut raw = [0u8; FRAME_HEADER_LEN];
    let mut posted = [0u8; POSTED_LEN];
    for peer in (0..n).filter(|&p| p != rank) {
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
        addresses[peer] = word(0);
    }
    Ok(addresses)
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
