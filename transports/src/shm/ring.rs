//! The shared-memory layout: every rank's inbox holds a doorbell word and, for every
//! other rank, a single-producer/single-consumer byte ring that rank writes into.

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::mapping::{futex_wake, Mapping};

/// Capacity of each ring (one per ordered pair of ranks).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;
/// Room for counters ahead of the data (one page keeps them on their own cache lines).
const HEADER: usize = 4096;
const BELL: usize = 0;
const HEAD: usize = 0;
const TAIL: usize = 64;

/// Bytes of one rank's inbox.
pub(super) fn inbox_len(world_size: usize, ring_bytes: usize) -> usize {
    HEADER + world_size * (HEADER + ring_bytes)
}

fn ring_offset(sender: usize, ring_bytes: usize) -> usize {
    HEADER + sender * (HEADER + ring_bytes)
}

/// Every rank's inbox, mapped by this rank.
pub(super) struct Rings {
    pub(super) ring_bytes: usize,
    /// `inboxes[r]`: rank r's inbox (this rank's own included).
    pub(super) inboxes: Vec<Mapping>,
}

impl Rings {
    /// `rank`'s doorbell: bumped (and woken) whenever its rings change.
    pub(super) fn bell(&self, rank: usize) -> &AtomicU32 {
        self.inboxes[rank].atomic_u32(BELL)
    }

    fn ring_bell(&self, rank: usize) {
        let bell = self.bell(rank);
        bell.fetch_add(1, Ordering::Release);
        futex_wake(bell);
    }

    /// (head, tail) of the ring `sender → receiver`.
    fn counters(&self, sender: usize, receiver: usize) -> (&AtomicU64, &AtomicU64) {
        let inbox = &self.inboxes[receiver];
        let ring = ring_offset(sender, self.ring_bytes);
        (inbox.atomic_u64(ring + HEAD), inbox.atomic_u64(ring + TAIL))
    }

    /// Bytes waiting in the ring `sender → receiver`.
    pub(super) fn used(&self, sender: usize, receiver: usize) -> usize {
        let (head, tail) = self.counters(sender, receiver);
        let used = head
            .load(Ordering::Acquire)
            .wrapping_sub(tail.load(Ordering::Acquire));
        (used as usize).min(self.ring_bytes)
    }

    /// Copies a prefix of `bufs` into the ring `me → peer` (at most its free space),
    /// publishes it and rings the peer's bell. Returns the bytes taken.
    pub(super) fn write(&self, me: usize, peer: usize, bufs: &[IoSlice<'_>]) -> usize {
        let cap = self.ring_bytes;
        let free = cap - self.used(me, peer);
        if free == 0 {
            return 0;
        }
        let (head, _) = self.counters(me, peer);
        let start = head.load(Ordering::Relaxed);
        let data = ring_offset(me, cap) + HEADER;
        let inbox = &self.inboxes[peer];
        let mut written = 0usize;
        for buf in bufs {
            let mut src: &[u8] = buf;
            while !src.is_empty() && written < free {
                let at = (start as usize + written) % cap;
                let n = src.len().min(free - written).min(cap - at);
                inbox.write(data + at, &src[..n]);
                src = &src[n..];
                written += n;
            }
        }
        head.store(start.wrapping_add(written as u64), Ordering::Release);
        self.ring_bell(peer);
        written
    }

    /// Copies what waits in the ring `peer → me` into `bufs` (as much as fits), frees
    /// that space and rings the peer's bell. Returns the bytes read.
    pub(super) fn read(&self, me: usize, peer: usize, bufs: &mut [IoSliceMut<'_>]) -> usize {
        let cap = self.ring_bytes;
        let available = self.used(peer, me);
        if available == 0 {
            return 0;
        }
        let (_, tail) = self.counters(peer, me);
        let start = tail.load(Ordering::Relaxed);
        let data = ring_offset(peer, cap) + HEADER;
        let inbox = &self.inboxes[me];
        let mut read = 0usize;
        for buf in bufs.iter_mut() {
            let mut dst: &mut [u8] = buf;
            while !dst.is_empty() && read < available {
                let at = (start as usize + read) % cap;
                let n = dst.len().min(available - read).min(cap - at);
                let (now, rest) = dst.split_at_mut(n);
                inbox.read(data + at, now);
                dst = rest;
                read += n;
            }
        }
        tail.store(start.wrapping_add(read as u64), Ordering::Release);
        self.ring_bell(peer);
        read
    }
}
