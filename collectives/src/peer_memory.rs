//! Ranks that are threads of one process read each other's buffers directly: the
//! peer-memory all-reduce. Each rank folds its segment of every rank's buffer, in rank
//! order, into its own buffer, then copies every other rank's segment out of that rank's
//! buffer. Nothing goes through rings: each byte is read once or twice and written once
//! or twice, where a schedule over a transport copies it into a ring and out again.
//!
//! # Protocol
//!
//! For the group's `g`-th peer-memory call (from 0), every rank:
//!
//! 1. **posts** its buffer's address and its call in its slot, then raises its phase to
//!    `3g+1`, and waits until every rank has (before its deadline);
//! 2. **commits**: checks that every posted call is its own (else a mismatch), then joins
//!    the commit count. The call is committed once all `n` have joined. Until then any
//!    rank may *abort* it (its deadline passed, a peer left, a mismatch), and after an
//!    abort nobody reads another rank's buffer. Before commit, only the slots are read,
//!    so a rank may return at any moment;
//! 3. **reduces** its segment in place: `((own op b_a) op b_b) ...` over the other
//!    ranks' same segment, in rank order; phase `3g+2`;
//! 4. **gathers**, once every rank has reached `3g+2`: copies each other rank's segment
//!    from that rank's buffer into its own; phase `3g+3`;
//! 5. **returns** once every rank has reached `3g+3`: nobody reads its buffer any more.
//!
//! Every segment is reduced once, by one rank, in one order, and copied to the others:
//! results are bit-identical on every rank.
//!
//! After commit a rank neither returns nor unwinds before step 5, since peers may be
//! reading its buffer (a guard finishes the protocol on any exit). What is left is
//! bounded memory work on threads that are running, so those waits have no deadline.

// Raw pointers into other ranks' buffers, shared between threads under the protocol
// above; every dereference says why it is sound.
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::doorbell::Doorbell;
use crate::kernels::{finalize_avg, reduce_bytes, Order};
use crate::spin::Spin;
use crate::{DType, Error, OpDesc, ReduceOp};

/// Bytes folded at a time, small enough to stay in cache between the peers' reads.
const CHUNK_BYTES: usize = 64 * 1024;
/// Longest sleep between two looks at the phases (a ring wakes a sleeper at once; this
/// only bounds a wake-up lost to a poisoned lock).
const SLEEP_SLICE: Duration = Duration::from_millis(50);

/// In the commit word: the call's number (high half), aborted (bit 31), joined ranks.
const ABORTED: u64 = 1 << 31;
const COUNT: u64 = ABORTED - 1;

fn commit_word(call: u64, aborted: bool, joined: u64) -> u64 {
    ((call & 0xffff_ffff) << 32) | if aborted { ABORTED } else { 0 } | (joined & COUNT)
}

fn commit_call(word: u64) -> u64 {
    word >> 32
}

/// The buffers of the ranks of one group that live in one process, and what they need to
/// reduce them together. Made by the in-process transport; one per group.
///
/// ```
/// let memory = ringccl_collectives::peer_memory::PeerMemory::new(4);
/// assert_eq!(memory.world_size(), 4);
/// memory.close(2);
/// assert!(memory.is_closed(2));
/// ```
pub struct PeerMemory {
    slots: Vec<Slot>,
    closed: Vec<AtomicBool>,
    commit: AtomicU64,
    bell: Doorbell,
}

impl std::fmt::Debug for PeerMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerMemory")
            .field("world_size", &self.slots.len())
            .field("commit", &self.commit.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Slot {
    /// `3g+1` posted, `3g+2` reduced, `3g+3` gathered, in call `g`; only its rank
    /// raises it.
    phase: AtomicU64,
    posted: Mutex<Option<Posted>>,
}

#[derive(Clone, Copy)]
struct Posted {
    op: OpDesc,
    base: BufferAddress,
    len: usize,
}

/// The start of a rank's buffer during a call.
#[derive(Clone, Copy)]
struct BufferAddress(NonNull<u8>);

// SAFETY: the address travels to other threads, which dereference it only between
// commit and step 5, while the owning rank is inside the call and keeps the buffer
// alive and untouched except for its own segment (see the module documentation).
unsafe impl Send for BufferAddress {}

/// Why a wait before commit gave up.
enum Stop {
    /// The deadline passed; the first rank still behind.
    Late(usize),
    /// A rank left (its endpoint was closed).
    Closed(usize),
    /// Another rank aborted the call.
    Aborted,
}

impl PeerMemory {
    /// The shared state of `world_size` ranks.
    ///
    /// ```
    /// let memory = ringccl_collectives::peer_memory::PeerMemory::new(2);
    /// assert!(!memory.is_closed(0));
    /// ```
    pub fn new(world_size: usize) -> Arc<PeerMemory> {
        Arc::new(PeerMemory {
            slots: (0..world_size).map(|_| Slot::default()).collect(),
            closed: (0..world_size).map(|_| AtomicBool::new(false)).collect(),
            commit: AtomicU64::new(0),
            bell: Doorbell::default(),
        })
    }

    /// The number of ranks.
    ///
    /// ```
    /// assert_eq!(ringccl_collectives::peer_memory::PeerMemory::new(3).world_size(), 3);
    /// ```
    pub fn world_size(&self) -> usize {
        self.slots.len()
    }

    /// Marks `rank` as gone (its group was dropped or aborted) and wakes every waiter:
    /// calls not yet committed fail at once.
    ///
    /// ```
    /// let memory = ringccl_collectives::peer_memory::PeerMemory::new(2);
    /// memory.close(1);
    /// assert!(memory.is_closed(1));
    /// ```
    pub fn close(&self, rank: usize) {
        if let Some(flag) = self.closed.get(rank) {
            flag.store(true, Ordering::SeqCst);
        }
        self.bell.ring();
    }

    /// Whether `rank` is gone.
    ///
    /// ```
    /// let memory = ringccl_collectives::peer_memory::PeerMemory::new(2);
    /// assert!(!memory.is_closed(1));
    /// ```
    pub fn is_closed(&self, rank: usize) -> bool {
        self.closed
            .get(rank)
            .is_some_and(|f| f.load(Ordering::SeqCst))
    }

    fn phase(&self, rank: usize) -> u64 {
        self.slots
            .get(rank)
            .map_or(0, |s| s.phase.load(Ordering::Acquire))
    }

    fn raise(&self, rank: usize, phase: u64) {
        if let Some(slot) = self.slots.get(rank) {
            slot.phase.fetch_max(phase, Ordering::AcqRel);
        }
        self.bell.ring();
    }

    /// The first rank whose phase is below `phase`.
    fn behind(&self, phase: u64) -> Option<usize> {
        (0..self.slots.len()).find(|&r| self.phase(r) < phase)
    }

    fn first_closed(&self) -> Option<usize> {
        (0..self.closed.len()).find(|&r| self.is_closed(r))
    }

    /// Waits until `done()` gives an answer: spins (or yields) for `spin`'s window, then
    /// sleeps on the bell in slices. With a `deadline`, gives up with `late()` once it
    /// has passed.
    fn wait<R>(
        &self,
        spin: Spin,
        deadline: Option<Instant>,
        done: impl Fn() -> Option<R>,
        late: impl Fn() -> R,
    ) -> R {
        let far = deadline.unwrap_or_else(|| Instant::now() + SLEEP_SLICE);
        if let Ok(true) = spin.look(far, 64, || Ok(done().is_some())) {
            if let Some(answer) = done() {
                return answer;
            }
        }
        loop {
            if let Some(answer) = done() {
                return answer;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return late();
            }
            let until = deadline.map_or(now + SLEEP_SLICE, |d| d.min(now + SLEEP_SLICE));
            // A poisoned lock only costs a slice of polling.
            let _ = self.bell.sleep_until_rung(until, || Ok(done().is_some()));
        }
    }

    /// Before commit: waits until every rank's phase is at least `phase`, telling
    /// `blocked` which rank it waits for (so that the control thread can ask it).
    fn await_posted(
        &self,
        phase: u64,
        spin: Spin,
        deadline: Instant,
        blocked: &dyn Fn(usize),
    ) -> Result<(), Stop> {
        if let Some(peer) = self.behind(phase) {
            blocked(peer);
        }
        let done = || {
            if let Some(rank) = self.first_closed() {
                return Some(Err(Stop::Closed(rank)));
            }
            self.behind(phase).is_none().then_some(Ok(()))
        };
        let late = || Err(Stop::Late(self.behind(phase).unwrap_or(0)));
        self.wait(spin, Some(deadline), done, late)
    }

    /// After commit: waits, without a deadline, until every rank's phase is at least
    /// `phase` (they are all running the rest of the protocol).
    fn await_all(&self, phase: u64, spin: Spin) {
        self.wait(
            spin,
            None,
            || self.behind(phase).is_none().then_some(()),
            || (),
        );
    }

    /// Aborts call `call` unless it is committed; returns whether it is committed (then
    /// the caller must go on with it).
    fn abort(&self, call: u64) -> bool {
        let mut word = self.commit.load(Ordering::SeqCst);
        loop {
            let next = if commit_call(word) == call & 0xffff_ffff {
                if word & ABORTED != 0 {
                    return false;
                }
                if (word & COUNT) as usize >= self.slots.len() {
                    return true;
                }
                word | ABORTED
            } else {
                commit_word(call, true, 0)
            };
            match self
                .commit
                .compare_exchange(word, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    self.bell.ring();
                    return false;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Joins call `call`'s commit; false if it was aborted.
    fn join(&self, call: u64) -> bool {
        let mut word = self.commit.load(Ordering::SeqCst);
        loop {
            let next = if commit_call(word) == call & 0xffff_ffff {
                if word & ABORTED != 0 {
                    return false;
                }
                word + 1
            } else {
                commit_word(call, false, 1)
            };
            match self
                .commit
                .compare_exchange(word, next, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    self.bell.ring();
                    return true;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Whether call `call` is committed (`Some(true)`), aborted (`Some(false)`), or
    /// still open.
    fn committed(&self, call: u64) -> Option<bool> {
        let word = self.commit.load(Ordering::SeqCst);
        if commit_call(word) != call & 0xffff_ffff {
            return None;
        }
        if word & ABORTED != 0 {
            return Some(false);
        }
        ((word & COUNT) as usize >= self.slots.len()).then_some(true)
    }

    /// All-reduces `buf` (`dtype` elements) with the other ranks of this process, as
    /// rank `me`, for the call `op`: see the module documentation. `blocked(peer)` is
    /// told whenever the call waits for a rank that has not yet arrived.
    #[allow(clippy::too_many_arguments)] // one call's whole description, as the executor's
    pub(crate) fn all_reduce(
        &self,
        me: usize,
        op: &OpDesc,
        buf: &mut [u8],
        (dtype, reduce): (DType, ReduceOp),
        spin: Spin,
        (deadline, timeout): (Instant, Duration),
        blocked: &dyn Fn(usize),
    ) -> Result<(), Error> {
        let n = self.slots.len();
        let Some(slot) = self.slots.get(me) else {
            return Err(Error::InvalidArgument(format!(
                "rank {me} is not one of the {n} ranks sharing this process's memory"
            )));
        };
        let Some(base) = NonNull::new(buf.as_mut_ptr()) else {
            return Ok(()); // an empty buffer: nothing to reduce, nothing to wait for
        };
        // A call aborted before commit leaves the phase at `3g+1`: the next starts at g+1.
        let call = slot.phase.load(Ordering::Acquire).div_ceil(3);
        let first = 3 * call;
        let posted = Posted {
            op: *op,
            base: BufferAddress(base),
            len: buf.len(),
        };
        *slot.posted.lock().unwrap_or_else(PoisonError::into_inner) = Some(posted);
        self.raise(me, first + 1);

        let gone = || (0..n).filter(|&r| r != me && self.is_closed(r)).collect();
        let stopped = |stop: Stop| -> Error {
            self.abort(call);
            match stop {
                Stop::Closed(rank) if rank == me => Error::GroupBroken {
                    rank: me,
                    cause: "this rank's group was closed (aborted or dropped)".into(),
                },
                Stop::Closed(rank) => Error::PeerLost {
                    rank,
                    observer: me,
                    op: *op,
                    reason: "its group was dropped or aborted".into(),
                    gone: gone(),
                },
                Stop::Late(peer) => Error::Timeout {
                    rank: me,
                    peer,
                    op: *op,
                    moved: 0,
                    expected: buf_len(posted),
                    timeout,
                    gone: gone(),
                },
                Stop::Aborted => Error::Timeout {
                    rank: me,
                    peer: self.behind(first + 1).unwrap_or((me + 1) % n),
                    op: *op,
                    moved: 0,
                    expected: buf_len(posted),
                    timeout,
                    gone: gone(),
                },
            }
        };
        self.await_posted(first + 1, spin, deadline, blocked)
            .map_err(stopped)?;

        // 2. Every rank has posted: the same call everywhere, or nobody reads.
        let mut bases = Vec::with_capacity(n);
        for (rank, peer) in self.slots.iter().enumerate() {
            let theirs = *peer.posted.lock().unwrap_or_else(PoisonError::into_inner);
            match theirs {
                Some(theirs) if theirs.op == *op && theirs.len == posted.len => {
                    bases.push(theirs.base)
                }
                other => {
                    self.abort(call);
                    return Err(Error::CollectiveMismatch {
                        rank: me,
                        mine: *op,
                        peer: rank,
                        theirs: other.map_or(*op, |p| p.op),
                    });
                }
            }
        }
        if !self.join(call) {
            return Err(stopped(Stop::Aborted));
        }
        let outcome = self.wait(
            spin,
            Some(deadline),
            || self.committed(call),
            || self.abort(call),
        );
        if !outcome {
            return Err(stopped(match self.first_closed() {
                Some(rank) => Stop::Closed(rank),
                None => Stop::Late(self.behind(first + 1).unwrap_or((me + 1) % n)),
            }));
        }

        // 3–5. Committed: peers may read this buffer until every rank has gathered.
        let finish = Finish {
            memory: self,
            me,
            first,
            spin,
        };
        let segment = |rank: usize| {
            let count = posted.len / dtype.size().max(1);
            let at = |r: usize| r * count / n * dtype.size();
            at(rank)..at(rank + 1)
        };
        let reduced = self.reduce_segment(&bases, segment(me), me, (dtype, reduce));
        self.raise(me, first + 2);
        self.await_all(first + 2, spin);
        for (rank, from) in bases.iter().enumerate().filter(|&(r, _)| r != me) {
            let range = segment(rank);
            // SAFETY: `range` lies inside both buffers (every rank posted `posted.len`
            // bytes, checked above). Rank `rank` wrote its segment before raising its
            // phase to `first + 2` (seen above, Acquire), and nobody writes it again
            // before every rank reaches `first + 3`. This rank alone writes its own
            // buffer, outside segment `me`, which no other rank reads in this step.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    from.0.as_ptr().add(range.start),
                    base.as_ptr().add(range.start),
                    range.len(),
                );
            }
        }
        drop(finish);
        reduced.map_err(|e| Error::InvalidArgument(format!("rank {me}: {op}: {}", e.0)))
    }

    /// Step 3: folds byte range `range` (segment `me`) of every other rank's buffer
    /// into this rank's own, in place, `CHUNK_BYTES` at a time so that the chunk stays
    /// in cache across the peers: `((own op b_a) op b_b) ...` over the other ranks in
    /// increasing order. Each segment is folded by one rank only, so every rank ends
    /// with the same bits.
    fn reduce_segment(
        &self,
        bases: &[BufferAddress],
        range: std::ops::Range<usize>,
        me: usize,
        (dtype, reduce): (DType, ReduceOp),
    ) -> Result<(), crate::kernels::KernelError> {
        let es = dtype.size().max(1);
        let chunk = (CHUNK_BYTES / es).max(1) * es;
        let Some(own) = bases.get(me) else {
            return Ok(());
        };
        let mut at = range.start;
        while at < range.end {
            let len = chunk.min(range.end - at);
            // SAFETY: `at..at + len` lies inside segment `me` of this rank's buffer
            // (every posted buffer has the same length, checked before commit). Only
            // this rank touches segment `me` of its own buffer until it raises its phase
            // to `first + 2`; the owner (this rank) keeps the buffer alive.
            let acc = unsafe { std::slice::from_raw_parts_mut(own.0.as_ptr().add(at), len) };
            for (_, from) in bases.iter().enumerate().filter(|&(r, _)| r != me) {
                // SAFETY: the same range of another rank's buffer, which during this
                // step only its owner writes, and only in its own segment (not this
                // one). The owner keeps it alive until every rank has gathered.
                let src = unsafe { std::slice::from_raw_parts(from.0.as_ptr().add(at), len) };
                reduce_bytes(dtype, reduce, acc, src, Order::LocalFirst)?;
            }
            if reduce == ReduceOp::Avg {
                finalize_avg(dtype, acc, bases.len())?;
            }
            at += len;
        }
        Ok(())
    }
}

fn buf_len(posted: Posted) -> u64 {
    posted.len as u64
}

/// Steps 4–5 on every way out after commit (a return, an error, a panic): this rank
/// does not leave while peers may still read its buffer.
struct Finish<'a> {
    memory: &'a PeerMemory,
    me: usize,
    first: u64,
    spin: Spin,
}

impl Drop for Finish<'_> {
    fn drop(&mut self) {
        let (memory, me, first, spin) = (self.memory, self.me, self.first, self.spin);
        memory.raise(me, first + 2);
        memory.await_all(first + 2, spin);
        memory.raise(me, first + 3);
        memory.await_all(first + 3, spin);
    }
}
