//! The shared-memory layout: every rank's inbox holds a doorbell word, a "sleeping"
//! flag and, for every rank of its host (its *local* ranks, itself included), a
//! single-producer/single-consumer byte ring that rank writes into. A local rank's ring
//! sits at the same place in every inbox of the host: its position among the local
//! ranks, which every one of them knows alike.
//!
//! # Waking without a syscall when nobody sleeps
//!
//! Only an inbox's owner ever sleeps on its bell. Before it sleeps it raises its
//! `SLEEPING` flag; a writer (or a reader that freed space) bumps the bell and calls
//! `FUTEX_WAKE` only when it sees the flag up. Why no wake-up is lost:
//!
//! - Sleeper, in [`Rings::sleep`]: `seen = bell` (before it last checked its rings),
//!   `SLEEPING = 1`, SeqCst fence, check the rings again, `FUTEX_WAIT(bell, seen)`.
//! - Waker, in `ring_bell`: publish the head or tail, SeqCst fence, read `SLEEPING`; if
//!   up, bump the bell and `FUTEX_WAKE`.
//!
//! The two fences order the sleeper's flag store against the waker's flag load and the
//! waker's counter store against the sleeper's re-check (the store-buffering pattern,
//! which SeqCst fences forbid from failing both ways). So either the sleeper's re-check
//! sees the new counter and it does not sleep, or the waker sees the flag and bumps the
//! bell. The bump comes after the sleeper loaded `seen` (if `seen` already held it, the
//! counter it publishes was visible to the re-check, which then returned): the bell no
//! longer equals `seen`, so `FUTEX_WAIT` returns at once if it has not started, and the
//! wake reaches it if it has. The flag goes down after every sleep; a wake that finds it
//! up after the sleeper woke costs one spare syscall, never a missed message.
//!
//! # Sleeping in `poll(2)` instead
//!
//! A rank that waits for a local peer and a peer on another host at once cannot sleep
//! on its bell: it sleeps in `poll(2)` on its connections, with the flag saying which
//! local peer it waits for ([`in_poll_for`]). The same protocol then tells that peer,
//! and only that one, to ring by a byte on its connection to the sleeper instead (the
//! caller of [`Rings::write`] or [`Rings::read`] sends it, see [`Ring::ByteNeeded`]);
//! the sleeper's `poll` includes that connection and drains it when it wakes.

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ringccl_collectives::memory_barrier::SLOT_DATA;
use ringccl_collectives::wire::FRAME_HEADER_LEN;

use super::mapping::{futex_wait, futex_wake, read_process, Mapping};

/// Capacity of each ring (one per ordered pair of ranks).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;
/// Room for counters ahead of the data (one page keeps them on their own cache lines).
const HEADER: usize = 4096;
const BELL: usize = 0;
/// Non-zero while the inbox's owner sleeps (or is about to): [`SLEEPING_ON_BELL`], or
/// [`in_poll_for`] a peer.
const SLEEPING: usize = 64;
/// In the `SLEEPING` word: asleep on the bell (a futex).
pub(super) const SLEEPING_ON_BELL: u32 = 1;
/// The number of the latest barrier the inbox's owner has arrived at (the barrier in
/// memory): written by the owner only, read by every local rank.
const ARRIVED: usize = 128;
/// Where the inbox starts in its owner's address space, written by the owner at set-up:
/// a peer that reads this word through the kernel, at that address, proves it can read
/// the owner's memory.
const OWN_ADDRESS: usize = 192;
/// Two slots, each the number of the owner's latest call posted in it, that call's
/// header and its data: the owner writes header and data, then the number, and never
/// rewrites a slot a peer may still read (calls in memory alternate between the two, and
/// a rank starts call `m + 2` only after every rank arrived at call `m + 1`, which each
/// did after reading call `m`). Number, header and the first 24 data bytes share a cache
/// line, so a peer waiting for a small call gets all of it in one transfer (OpenMPI's
/// "fast boxes").
const SLOTS: usize = 1024;
/// Where a slot's header starts, after its number.
const SLOT_HEADER: usize = 8;
/// One slot: its number, a frame header, then up to [`SLOT_DATA`] bytes, in whole cache
/// lines.
const SLOT_LEN: usize = (SLOT_HEADER + FRAME_HEADER_LEN + SLOT_DATA).div_ceil(64) * 64;
const _: () = assert!(
    SLOTS + 2 * SLOT_LEN <= HEADER,
    "the slots fit the inbox header"
);

/// Where slot `slot` (0 or 1) starts in an inbox: its call number, then its header.
fn slot_offset(slot: usize) -> usize {
    SLOTS + (slot % 2) * SLOT_LEN
}

/// In the `SLEEPING` word: asleep in `poll(2)` until local rank `peer` writes or reads,
/// woken by a byte on the connection from `peer`.
pub(super) fn in_poll_for(peer: usize) -> u32 {
    u32::try_from(peer).map_or(u32::MAX, |p| p.saturating_add(2))
}

/// What a rank that has just changed a ring must still do to wake its reader or writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(super) enum Ring {
    /// Nothing: it was awake, or its bell was rung.
    Done,
    /// It sleeps in `poll(2)`: send it a byte on the connection to it.
    ByteNeeded,
}
const HEAD: usize = 0;
const TAIL: usize = 64;

/// Bytes of one rank's inbox on a host of `local_ranks` ranks.
pub(super) fn inbox_len(local_ranks: usize, ring_bytes: usize) -> usize {
    HEADER + local_ranks * (HEADER + ring_bytes)
}

/// Where the ring of the local rank at position `slot` starts in an inbox.
fn ring_offset(slot: usize, ring_bytes: usize) -> usize {
    HEADER + slot * (HEADER + ring_bytes)
}

/// Writes where `own` (this rank's inbox) starts in this process, for the peers that
/// check they can read this process's memory ([`can_read_owner`]).
pub(super) fn publish_own_address(own: &Mapping) {
    own.atomic_u64(OWN_ADDRESS)
        .store(own.address(), Ordering::Release);
}

/// Whether this process can read the memory of process `pid`, the owner of the inbox
/// `theirs` (mapped here): reading, through the kernel, the word where the owner wrote
/// its inbox's address must give what this mapping shows. `Err` says why not.
pub(super) fn can_read_owner(theirs: &Mapping, pid: u32) -> Result<(), String> {
    let address = theirs.atomic_u64(OWN_ADDRESS).load(Ordering::Acquire);
    if address == 0 {
        return Err("it published no address to read".into());
    }
    let mut word = [0u8; 8];
    read_process(pid, address + OWN_ADDRESS as u64, &mut word)
        .map_err(|e| format!("reading process {pid}'s memory: {e}"))?;
    match u64::from_ne_bytes(word) {
        read if read == address => Ok(()),
        read => Err(format!(
            "process {pid}'s memory at {address:#x} reads {read:#x}, not its inbox's address"
        )),
    }
}

/// The inboxes of the ranks this rank shares memory with, mapped by this rank.
pub(super) struct Rings {
    pub(super) ring_bytes: usize,
    /// `inboxes[r]`: rank r's inbox (this rank's own included), for the ranks this rank
    /// shares memory with; `None` for the others.
    pub(super) inboxes: Vec<Option<Arc<Mapping>>>,
    /// `slots[r]`: local rank r's position among the host's local ranks, where its ring
    /// sits in every inbox of the host.
    pub(super) slots: Vec<Option<usize>>,
    /// `tails_seen[p]`: the tail of the ring this rank writes into `p`'s inbox, as last
    /// loaded. The tail only grows, so the space it shows is never more than there is:
    /// a write loads the peer's tail again only when that space is too short. This
    /// keeps the peer's tail line, which the peer writes on every read, from crossing
    /// between cores on every message (in a ping-pong it would be on the critical path).
    pub(super) tails_seen: Vec<AtomicU64>,
}

impl Rings {
    /// Whether this rank shares memory with `rank` (itself included).
    pub(super) fn has(&self, rank: usize) -> bool {
        matches!(self.inboxes.get(rank), Some(Some(_)))
    }

    fn inbox(&self, rank: usize) -> Option<&Mapping> {
        self.inboxes.get(rank)?.as_deref()
    }

    /// `rank`'s doorbell: bumped (and woken) whenever its rings change; `None` for a
    /// rank this one shares no memory with.
    pub(super) fn bell(&self, rank: usize) -> Option<&AtomicU32> {
        Some(self.inbox(rank)?.atomic_u32(BELL))
    }

    /// Wakes `rank` if it sleeps (or is about to) on its bell; `me` has just published
    /// a counter `rank` waits on. No syscall when `rank` is awake. If it sleeps in
    /// `poll(2)` waiting for `me`, says so: the caller sends it a byte.
    fn ring_bell(&self, me: usize, rank: usize) -> Ring {
        fence(Ordering::SeqCst);
        self.wake_if_sleeping(me, rank)
    }

    /// [`Rings::ring_bell`] once the caller has published its change and fenced.
    fn wake_if_sleeping(&self, me: usize, rank: usize) -> Ring {
        let Some(inbox) = self.inbox(rank) else {
            return Ring::Done;
        };
        match inbox.atomic_u32(SLEEPING).load(Ordering::Relaxed) {
            0 => Ring::Done,
            SLEEPING_ON_BELL => {
                let bell = inbox.atomic_u32(BELL);
                bell.fetch_add(1, Ordering::Release);
                futex_wake(bell);
                Ring::Done
            }
            how if how == in_poll_for(me) => Ring::ByteNeeded,
            // In `poll(2)` for another peer: this change is not what it waits for.
            _ => Ring::Done,
        }
    }

    /// Writes `header` and `data` (at most [`SLOT_DATA`] bytes, the rest dropped) into
    /// `me`'s slot `slot` (0 or 1), then publishes that `me` has arrived at call `seq`
    /// and rings the bell of every rank it shares memory with (one fence for all; no
    /// syscall for a rank that is awake), calling `byte_needed` for each that sleeps in
    /// `poll(2)` waiting for `me`.
    pub(super) fn arrive(
        &self,
        me: usize,
        seq: u64,
        (slot, header, data): (usize, &[u8; FRAME_HEADER_LEN], &[u8]),
        byte_needed: impl FnMut(usize),
    ) {
        if let Some(inbox) = self.inbox(me) {
            let at = slot_offset(slot);
            inbox.write(at + SLOT_HEADER, header);
            inbox.write(
                at + SLOT_HEADER + FRAME_HEADER_LEN,
                &data[..data.len().min(SLOT_DATA)],
            );
            inbox.atomic_u64(at).store(seq, Ordering::Release);
        }
        self.advance(me, seq, byte_needed);
    }

    /// Whether `rank` has posted call `seq` (or a later one) in its slot `slot` (a rank
    /// this one shares no memory with never has).
    pub(super) fn posted(&self, rank: usize, seq: u64, slot: usize) -> bool {
        self.inbox(rank).is_some_and(|inbox| {
            let at = slot_offset(slot);
            inbox.atomic_u64(at).load(Ordering::Acquire) >= seq
        })
    }

    /// The first rank other than `me`, in rank order, that has not posted call `seq` in
    /// slot `slot`; `None` once all have.
    pub(super) fn first_unposted(&self, me: usize, seq: u64, slot: usize) -> Option<usize> {
        (0..self.inboxes.len()).find(|&p| p != me && !self.posted(p, seq, slot))
    }

    /// Publishes that rank `me` has arrived at `seq`, its slots unchanged, and wakes the
    /// local ranks that sleep (calling `byte_needed` for those asleep in `poll(2)`).
    pub(super) fn advance(&self, me: usize, seq: u64, mut byte_needed: impl FnMut(usize)) {
        if let Some(inbox) = self.inbox(me) {
            inbox.atomic_u64(ARRIVED).store(seq, Ordering::Release);
        }
        fence(Ordering::SeqCst);
        for peer in (0..self.inboxes.len()).filter(|&p| p != me) {
            if self.wake_if_sleeping(me, peer) == Ring::ByteNeeded {
                byte_needed(peer);
            }
        }
    }

    /// Copies `rank`'s slot `slot`: its header into `header` and its first `data.len()`
    /// (at most [`SLOT_DATA`]) data bytes into `data`. `false` for a rank this one
    /// shares no memory with.
    pub(super) fn read_slot(
        &self,
        rank: usize,
        slot: usize,
        header: &mut [u8; FRAME_HEADER_LEN],
        data: &mut [u8],
    ) -> bool {
        let Some(inbox) = self.inbox(rank) else {
            return false;
        };
        let at = slot_offset(slot) + SLOT_HEADER;
        inbox.read(at, header);
        let len = data.len().min(SLOT_DATA);
        inbox.read(at + FRAME_HEADER_LEN, &mut data[..len]);
        true
    }

    /// Whether `rank` has arrived at barrier `seq` (a rank this one shares no memory
    /// with never has).
    pub(super) fn arrived(&self, rank: usize, seq: u64) -> bool {
        self.inbox(rank)
            .is_some_and(|inbox| inbox.atomic_u64(ARRIVED).load(Ordering::Acquire) >= seq)
    }

    /// The first rank other than `me`, in rank order, that has not arrived at barrier
    /// `seq`; `None` once all have.
    pub(super) fn first_missing(&self, me: usize, seq: u64) -> Option<usize> {
        (0..self.inboxes.len()).find(|&p| p != me && !self.arrived(p, seq))
    }

    /// Copies the first bytes waiting in the ring `peer → me` into `buf` without taking
    /// them (the tail stays); returns how many.
    pub(super) fn peek(&self, me: usize, peer: usize, buf: &mut [u8]) -> usize {
        let cap = self.ring_bytes;
        let available = self.used(peer, me).min(buf.len());
        let Some(((_, tail), (inbox, ring))) = self.counters(peer, me).zip(self.ring(peer, me))
        else {
            return 0;
        };
        let start = tail.load(Ordering::Relaxed) as usize;
        let mut copied = 0;
        while copied < available {
            let at = (start + copied) % cap;
            let n = (available - copied).min(cap - at);
            inbox.read(ring + HEADER + at, &mut buf[copied..copied + n]);
            copied += n;
        }
        copied
    }

    /// Raises `me`'s flag (`how`: [`SLEEPING_ON_BELL`] or [`in_poll_for`]) and
    /// returns whether `ready()` holds after it, which the caller must check before it
    /// sleeps; see the module documentation. [`Rings::lower_flag`] undoes it.
    pub(super) fn raise_flag(&self, me: usize, how: u32, ready: impl Fn() -> bool) -> bool {
        if let Some(inbox) = self.inbox(me) {
            inbox.atomic_u32(SLEEPING).store(how, Ordering::Relaxed);
        }
        fence(Ordering::SeqCst);
        ready()
    }

    /// `me` is awake again.
    pub(super) fn lower_flag(&self, me: usize) {
        if let Some(inbox) = self.inbox(me) {
            inbox.atomic_u32(SLEEPING).store(0, Ordering::Relaxed);
        }
    }

    /// Sleeps on `me`'s bell for at most `timeout`, unless `ready()` (which looks at
    /// the rings `me` waits on) holds once the flag is up or the bell has moved past
    /// `seen` (loaded before the caller's last look at the rings). Returns whether it
    /// found `ready()`. The module documentation proves that no wake-up is lost.
    pub(super) fn sleep(
        &self,
        me: usize,
        seen: u32,
        timeout: Duration,
        ready: impl Fn() -> bool,
    ) -> bool {
        let ready_now = self.raise_flag(me, SLEEPING_ON_BELL, ready);
        if !ready_now {
            if let Some(bell) = self.bell(me) {
                futex_wait(bell, seen, timeout);
            }
        }
        self.lower_flag(me);
        ready_now
    }

    /// The inbox of `receiver` and where the ring `sender → receiver` starts in it, if
    /// both share memory with this rank.
    fn ring(&self, sender: usize, receiver: usize) -> Option<(&Mapping, usize)> {
        let slot = (*self.slots.get(sender)?)?;
        Some((self.inbox(receiver)?, ring_offset(slot, self.ring_bytes)))
    }

    /// (head, tail) of the ring `sender → receiver`.
    fn counters(&self, sender: usize, receiver: usize) -> Option<(&AtomicU64, &AtomicU64)> {
        let (inbox, ring) = self.ring(sender, receiver)?;
        Some((inbox.atomic_u64(ring + HEAD), inbox.atomic_u64(ring + TAIL)))
    }

    /// Bytes waiting in the ring `sender → receiver` (0 if there is none).
    pub(super) fn used(&self, sender: usize, receiver: usize) -> usize {
        let Some((head, tail)) = self.counters(sender, receiver) else {
            return 0;
        };
        let used = head
            .load(Ordering::Acquire)
            .wrapping_sub(tail.load(Ordering::Acquire));
        (used as usize).min(self.ring_bytes)
    }

    /// Copies a prefix of `bufs` into the ring `me → peer` (at most its free space),
    /// publishes it and rings the peer's bell. Returns the bytes taken (0 if there is no
    /// such ring), and what is left to do to wake the peer.
    pub(super) fn write(&self, me: usize, peer: usize, bufs: &[IoSlice<'_>]) -> (usize, Ring) {
        let cap = self.ring_bytes;
        let Some(((head, tail), (inbox, ring))) = self.counters(me, peer).zip(self.ring(me, peer))
        else {
            return (0, Ring::Done);
        };
        // Only this rank moves the head.
        let start = head.load(Ordering::Relaxed);
        let free = match self.tails_seen.get(peer) {
            Some(seen) => {
                let wanted: usize = bufs.iter().map(|b| b.len()).sum();
                let free_by = |tail: u64| cap - (start.wrapping_sub(tail) as usize).min(cap);
                match free_by(seen.load(Ordering::Relaxed)) {
                    enough if enough >= wanted.min(cap) => enough,
                    _ => {
                        let now = tail.load(Ordering::Acquire);
                        seen.store(now, Ordering::Relaxed);
                        free_by(now)
                    }
                }
            }
            None => cap - self.used(me, peer),
        };
        if free == 0 {
            return (0, Ring::Done);
        }
        let data = ring + HEADER;
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
        (written, self.ring_bell(me, peer))
    }

    /// Copies what waits in the ring `peer → me` into `bufs` (as much as fits), frees
    /// that space and rings the peer's bell. Returns the bytes read (0 if there is no
    /// such ring), and what is left to do to wake the peer.
    pub(super) fn read(
        &self,
        me: usize,
        peer: usize,
        bufs: &mut [IoSliceMut<'_>],
    ) -> (usize, Ring) {
        let cap = self.ring_bytes;
        let available = self.used(peer, me);
        let Some(((_, tail), (inbox, ring))) = self.counters(peer, me).zip(self.ring(peer, me))
        else {
            return (0, Ring::Done);
        };
        if available == 0 {
            return (0, Ring::Done);
        }
        let start = tail.load(Ordering::Relaxed);
        let data = ring + HEADER;
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
        (read, self.ring_bell(me, peer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::inbox::OwnInbox;
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    const RING: usize = 4096;

    /// Two ranks' inboxes in one process, standing in for two processes' mappings.
    fn two_rings() -> Option<Rings> {
        let len = inbox_len(2, RING);
        let mut inboxes = Vec::new();
        for _ in 0..2 {
            match OwnInbox::create(len, 2) {
                Ok(inbox) => inboxes.push(inbox.into_mapping()),
                Err(e) => {
                    eprintln!("skipped: cannot create an inbox here: {e}");
                    return None;
                }
            }
        }
        Some(Rings {
            ring_bytes: RING,
            inboxes: inboxes.into_iter().map(|m| Some(Arc::new(m))).collect(),
            slots: vec![Some(0), Some(1)],
            tails_seen: (0..2).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    /// Waits, with no spinning, until `peer → me` has a byte, and reads it. Returns
    /// the longest single sleep.
    fn receive(rings: &Rings, me: usize, peer: usize, sleep: Duration) -> Duration {
        let mut longest = Duration::ZERO;
        let mut byte = [0u8; 1];
        loop {
            let seen = rings.bell(me).map_or(0, |b| b.load(Ordering::Acquire));
            if rings.read(me, peer, &mut [IoSliceMut::new(&mut byte)]).0 == 1 {
                return longest;
            }
            let started = Instant::now();
            rings.sleep(me, seen, sleep, || rings.used(peer, me) > 0);
            longest = longest.max(started.elapsed());
        }
    }

    /// Ping-pong of one byte, both sides sleeping on every message: the writer skips
    /// the wake whenever it sees nobody sleeping, so a flaw in the flag protocol shows
    /// as a sleep that lasts its whole (long) timeout.
    #[test]
    fn no_wake_up_is_lost_between_a_sleeper_and_a_writer() {
        let Some(rings) = two_rings() else { return };
        const ROUNDS: usize = 20_000;
        // A lost wake-up sleeps this long; a delivered one returns in microseconds
        // (milliseconds on a loaded machine).
        let lost = Duration::from_secs(5);
        let started = Instant::now();
        let stop = AtomicBool::new(false);
        let longest = std::thread::scope(|s| {
            let rings = &rings;
            let stop = &stop;
            let echo = s.spawn(move || {
                let mut longest = Duration::ZERO;
                for _ in 0..ROUNDS {
                    longest = longest.max(receive(rings, 1, 0, lost));
                    assert_eq!(rings.write(1, 0, &[IoSlice::new(b"y")]).0, 1);
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                longest
            });
            let mut longest = Duration::ZERO;
            for _ in 0..ROUNDS {
                assert_eq!(rings.write(0, 1, &[IoSlice::new(b"x")]).0, 1);
                longest = longest.max(receive(rings, 0, 1, lost));
                if started.elapsed() > Duration::from_secs(60) {
                    stop.store(true, Ordering::Relaxed);
                    break;
                }
            }
            longest.max(echo.join().unwrap())
        });
        let elapsed = started.elapsed();
        assert!(
            longest < Duration::from_secs(2),
            "a sleep lasted {longest:?}: a wake-up was lost"
        );
        assert!(elapsed < Duration::from_secs(90), "took {elapsed:?}");
        eprintln!("{ROUNDS} round trips, all sleeping, in {elapsed:?}; longest sleep {longest:?}");
    }

    /// Barriers in memory, both ranks sleeping whenever the other has not arrived: every
    /// arrival wakes the sleeper (the same flag protocol as a write), and a rank sees
    /// the other's number only once it has been published.
    #[test]
    fn no_arrival_is_missed_by_a_sleeping_rank() {
        let Some(rings) = two_rings() else { return };
        const BARRIERS: u64 = 5_000;
        let lost = Duration::from_secs(5);
        let give_up = Instant::now() + Duration::from_secs(120);
        let wait = |me: usize, seq: u64| {
            let mut longest = Duration::ZERO;
            loop {
                let seen = rings.bell(me).map_or(0, |b| b.load(Ordering::Acquire));
                if rings.first_missing(me, seq).is_none() {
                    return longest;
                }
                assert!(
                    Instant::now() < give_up,
                    "rank {me} never saw barrier {seq} end"
                );
                let started = Instant::now();
                rings.sleep(me, seen, lost, || rings.first_missing(me, seq).is_none());
                longest = longest.max(started.elapsed());
            }
        };
        assert_eq!(rings.first_missing(0, 1), Some(1));
        assert_eq!(rings.peek(0, 1, &mut [0u8; 4]), 0);
        let longest = std::thread::scope(|s| {
            let other = s.spawn(|| {
                let mut longest = Duration::ZERO;
                for seq in 1..=BARRIERS {
                    rings.arrive(1, seq, (0, &[0; FRAME_HEADER_LEN], &[]), |_| {
                        panic!("nobody sleeps in poll")
                    });
                    longest = longest.max(wait(1, seq));
                    // Rank 0 may have gone on to the next barrier, not beyond.
                    assert!(!rings.arrived(0, seq + 2));
                }
                longest
            });
            let mut longest = Duration::ZERO;
            for seq in 1..=BARRIERS {
                rings.arrive(0, seq, (0, &[0; FRAME_HEADER_LEN], &[]), |_| {
                    panic!("nobody sleeps in poll")
                });
                longest = longest.max(wait(0, seq));
                assert!(!rings.arrived(1, seq + 2));
            }
            longest.max(other.join().unwrap())
        });
        assert!(
            longest < Duration::from_secs(2),
            "a sleep lasted {longest:?}: an arrival was missed"
        );
        // Bytes waiting for rank 0 can be looked at without taking them.
        assert_eq!(rings.write(1, 0, &[IoSlice::new(b"zw")]).0, 2);
        let mut seen = [0u8; 4];
        assert_eq!(rings.peek(0, 1, &mut seen), 2);
        assert_eq!(&seen[..2], b"zw");
        assert_eq!(rings.used(1, 0), 2, "a look takes nothing");
    }

    /// The writer works from the tail it last loaded, and loads it again only when the
    /// space that shows is too short: it never overwrites unread bytes, and finds the
    /// space a read freed.
    #[test]
    fn a_writer_never_overruns_the_reader_and_finds_the_space_it_freed() {
        let Some(rings) = two_rings() else { return };
        let pattern = |at: usize| (at % 251) as u8;
        let (mut sent, mut received) = (0usize, 0usize);
        let mut write = |len: usize| {
            let bytes: Vec<u8> = (sent..sent + len).map(pattern).collect();
            let n = rings.write(0, 1, &[IoSlice::new(&bytes)]).0;
            sent += n;
            n
        };
        assert_eq!(write(4000), 4000);
        assert_eq!(write(200), RING - 4000, "only the space left");
        assert_eq!(write(10), 0, "full");
        let mut read = |len: usize| {
            let mut bytes = vec![0u8; len];
            let n = rings.read(1, 0, &mut [IoSliceMut::new(&mut bytes)]).0;
            for (i, byte) in bytes[..n].iter().enumerate() {
                assert_eq!(*byte, pattern(received + i), "byte {}", received + i);
            }
            received += n;
            n
        };
        assert_eq!(read(3000), 3000);
        assert_eq!(
            write(500),
            500,
            "the freed space, found by loading the tail again"
        );
        assert_eq!(write(5000), 2500, "and all of it, across the ring's end");
        assert_eq!(read(RING), RING);
        for round in 0..50 {
            let n = write(1 + round * 97 % 3000);
            assert_eq!(read(n), n);
        }
        assert_eq!(sent, received);
    }

    #[test]
    fn a_write_to_an_awake_rank_makes_no_wake_up() {
        let Some(rings) = two_rings() else { return };
        let bell = rings.bell(1).map_or(0, |b| b.load(Ordering::Acquire));
        assert_eq!(rings.write(0, 1, &[IoSlice::new(b"abc")]).0, 3);
        assert_eq!(
            rings.bell(1).map_or(0, |b| b.load(Ordering::Acquire)),
            bell,
            "rang an awake rank"
        );
        // A rank that found its data while raising its flag does not sleep.
        let started = Instant::now();
        assert!(rings.sleep(1, bell, Duration::from_secs(5), || rings.used(0, 1) > 0));
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(
            rings.inboxes[1]
                .as_ref()
                .map(|inbox| inbox.atomic_u32(SLEEPING).load(Ordering::Relaxed)),
            Some(0)
        );
    }
}
