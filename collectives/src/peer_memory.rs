//! Ranks that are threads of one process read each other's buffers directly: the
//! peer-memory all-reduce. Each rank folds its segment of every other rank's buffer into
//! its own, in place, then copies every other rank's segment out of that rank's buffer. Nothing goes through rings: each byte is read once or twice and written once
//! or twice, where a schedule over a transport copies it into a ring and out again.
//!
//! A transport whose ranks are threads of one process offers the shared state
//! ([`OffersPeerMemory`]); that trait is declared here, beside the protocol, so that the
//! [`Transport`](crate::Transport) contract stays byte movement and imports nothing
//! from here.
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
//!    ranks' same segment, in increasing rank order (a failure is published in its slot);
//!    phase `3g+2`;
//! 4. **gathers**, once every rank has reached `3g+2`: copies each other rank's segment
//!    from that rank's buffer into its own; phase `3g+3`;
//! 5. **returns** once every rank has reached `3g+3`: nobody reads its buffer any more.
//!
//! Every segment is reduced once, by one rank, in one order, and copied to the others:
//! results are bit-identical on every rank.
//!
//! Once it has posted, a rank leaves only through a guard: before commit the guard aborts
//! the call, after commit it finishes steps 3–5 (on an error or a panic too), since
//! peers may be reading the buffer. What is left after commit is bounded memory work on
//! threads that are running, so those waits have no deadline, and neither a close nor an
//! abort interrupts them: a rank's thread stopped mid-call (a debugger, `SIGSTOP`) holds
//! the others until it runs again.
//!
//! The call number `g` is implicit: every rank counts its peer-memory calls. That holds
//! because the runner breaks the group on every error these calls return, so no rank
//! goes on after a call the others did not finish.

// Raw pointers into other ranks' buffers, shared between threads under the protocol
// above; every dereference says why it is sound.
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::doorbell::Doorbell;
use crate::kernels::{finalize_avg, reduce_bytes, Order};
use crate::schedule::byte_segment;
use crate::spin::Spin;
use crate::{DType, Error, OpDesc, ReduceOp};

/// Bytes folded at a time, small enough to stay in cache between the peers' reads.
const CHUNK_BYTES: usize = 64 * 1024;
/// Longest sleep between two looks at the phases (a ring wakes a sleeper at once; this
/// bounds the look at the flags and the deadline).
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
/// reduce them together. Made by the in-process transport, which offers it through
/// [`OffersPeerMemory`]; one per group.
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
    /// The rank whose abort of the current call took effect, plus one (0: none).
    aborted_by: AtomicUsize,
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

/// What [`OffersPeerMemory::peer_memory`] gives: the shared state, and the transport's
/// spin window for the waits.
///
/// ```
/// use ringccl_collectives::peer_memory::{PeerAccess, PeerMemory};
/// use ringccl_collectives::spin::Spin;
///
/// let memory = PeerMemory::new(2);
/// let access = PeerAccess { memory: &memory, spin: Spin::NONE };
/// assert_eq!(access.memory.world_size(), 2);
/// ```
#[derive(Clone, Copy, Debug)]
pub struct PeerAccess<'a> {
    /// The group's shared buffers.
    pub memory: &'a PeerMemory,
    /// How a wait spins before it sleeps.
    pub spin: Spin,
}

/// How a transport offers [`PeerMemory`], a capability the host engine asks for beside
/// [`Transport`](crate::Transport). A transport whose ranks live in separate processes
/// implements it empty: the default offers none.
///
/// ```
/// use ringccl_collectives::peer_memory::OffersPeerMemory;
///
/// /// A transport between processes.
/// struct Sockets;
/// impl OffersPeerMemory for Sockets {}
///
/// assert!(Sockets.peer_memory().is_none());
/// ```
pub trait OffersPeerMemory {
    /// The buffers of the group's ranks, when they all live in this process and may read
    /// each other's, with how its waits spin. `None` (the default) for ranks in separate
    /// processes.
    fn peer_memory(&self) -> Option<PeerAccess<'_>> {
        None
    }
}

#[derive(Default)]
struct Slot {
    /// `3g+1` posted, `3g+2` reduced, `3g+3` gathered, in call `g`; only its rank
    /// raises it.
    phase: AtomicU64,
    /// The last call this rank joined the commit of, plus one.
    joined: AtomicU64,
    /// Its reduction of call `failed - 1` failed (0: none); read after `3g+2`.
    failed: AtomicU64,
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
            aborted_by: AtomicUsize::new(0),
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

    /// A closed rank: `me` if it is, else the first other one.
    fn closed_rank(&self, me: usize) -> Option<usize> {
        if self.is_closed(me) {
            return Some(me);
        }
        (0..self.closed.len()).find(|&r| self.is_closed(r))
    }

    /// The first rank that has not joined call `call`'s commit.
    fn not_joined(&self, call: u64) -> Option<usize> {
        (0..self.slots.len()).find(|&r| self.slots[r].joined.load(Ordering::SeqCst) < call + 1)
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
                return done().unwrap_or_else(late);
            }
            let until = deadline.map_or(now + SLEEP_SLICE, |d| d.min(now + SLEEP_SLICE));
            if self
                .bell
                .sleep_until_rung(until, || Ok(done().is_some()))
                .is_err()
            {
                // The bell's lock is poisoned (a thread panicked holding it): poll.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Before commit: waits until every rank's phase is at least `phase`, telling
    /// `blocked` which rank it waits for (so that the control thread can ask it).
    fn await_posted(
        &self,
        (me, call): (usize, u64),
        phase: u64,
        spin: Spin,
        deadline: Instant,
        blocked: &dyn Fn(usize),
    ) -> Result<(), Stop> {
        if let Some(peer) = self.behind(phase) {
            blocked(peer);
        }
        let done = || {
            if let Some(rank) = self.closed_rank(me) {
                return Some(Err(Stop::Closed(rank)));
            }
            if self.committed(call) == Some(false) {
                return Some(Err(Stop::Aborted));
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

    /// Aborts call `call` for rank `me` unless it is committed; returns whether it is
    /// committed (then the caller must go on with it).
    fn abort(&self, me: usize, call: u64) -> bool {
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
                    // Read only by ranks that saw the abort, to name who gave up.
                    self.aborted_by.store(me + 1, Ordering::SeqCst);
                    self.bell.ring();
                    return false;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Joins call `call`'s commit for rank `me`; false if it was aborted.
    fn join(&self, me: usize, call: u64) -> bool {
        if let Some(slot) = self.slots.get(me) {
            slot.joined.store(call + 1, Ordering::SeqCst);
        }
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
        // A slice's pointer is never null (an empty one dangles, and is never read).
        let base = NonNull::from(&mut *buf).cast::<u8>();
        // A call aborted before commit leaves the phase at `3g+1`: the next starts at g+1.
        let call = slot.phase.load(Ordering::Acquire).div_ceil(3);
        let first = 3 * call;
        let posted = Posted {
            op: *op,
            base: BufferAddress(base),
            len: buf.len(),
        };
        *slot.posted.lock().unwrap_or_else(PoisonError::into_inner) = Some(posted);
        // From here on, every way out goes through the guard: abort before commit,
        // finish after it.
        let guard = Leave {
            memory: self,
            me,
            call,
            spin,
        };
        self.raise(me, first + 1);

        let gone = |named: usize| {
            (0..n)
                .filter(|&r| r != me && r != named && self.is_closed(r))
                .collect()
        };
        let timed_out = |peer: usize| Error::Timeout {
            rank: me,
            peer,
            op: *op,
            moved: 0,
            expected: posted.len as u64,
            timeout,
            gone: gone(peer),
            cause: None,
        };
        let stopped = |stop: Stop| -> Error {
            self.abort(me, call);
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
                    gone: gone(rank),
                },
                Stop::Late(peer) => timed_out(peer),
                Stop::Aborted => match self.aborted_by.load(Ordering::SeqCst) {
                    by @ 1.. if by - 1 != me => Error::GroupAborted {
                        rank: me,
                        by: by - 1,
                        reason: format!(
                            "it gave up on {op} before every rank had joined (its deadline \
                             passed, a peer left, or the calls differ)"
                        ),
                        cause: None,
                    },
                    _ => timed_out(self.not_joined(call).unwrap_or((me + 1) % n)),
                },
            }
        };
        self.await_posted((me, call), first + 1, spin, deadline, blocked)
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
                    self.abort(me, call);
                    return Err(Error::CollectiveMismatch {
                        rank: me,
                        mine: *op,
                        peer: rank,
                        theirs: other.map_or(*op, |p| p.op),
                    });
                }
            }
        }
        if !self.join(me, call) {
            return Err(stopped(Stop::Aborted));
        }
        let committed = self.wait(
            spin,
            Some(deadline),
            || match self.committed(call) {
                // A rank that left will never join: give up now, unless it is too late.
                None if self.closed_rank(me).is_some() => Some(self.abort(me, call)),
                answer => answer,
            },
            || self.abort(me, call),
        );
        if !committed {
            return Err(stopped(match self.closed_rank(me) {
                Some(rank) => Stop::Closed(rank),
                None => Stop::Aborted,
            }));
        }

        // 3–5. Committed: peers may read this buffer until every rank has gathered.
        let count = posted.len / dtype.size().max(1);
        let es = dtype.size();
        let segment = |rank: usize| byte_segment(count, n, rank, es);
        let reduced = self.reduce_segment(&bases, segment(me), me, (dtype, reduce));
        if reduced.is_err() {
            slot.failed.store(call + 1, Ordering::SeqCst);
        }
        self.raise(me, first + 2);
        self.await_all(first + 2, spin);
        if let Err(e) = reduced {
            return Err(Error::Protocol {
                rank: me,
                peer: me,
                op: *op,
                reason: format!("reducing its segment failed: {}", e.0),
            });
        }
        if let Some(rank) =
            (0..n).find(|&r| self.slots[r].failed.load(Ordering::SeqCst) == call + 1)
        {
            return Err(Error::Protocol {
                rank: me,
                peer: rank,
                op: *op,
                reason: "that rank could not reduce its segment (its error says why)".into(),
            });
        }
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
        drop(guard);
        Ok(())
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

/// Every way out of a call once this rank has posted (a return, an error, a panic):
/// before commit it aborts the call, so nobody reads this buffer; after commit it
/// finishes steps 3–5, so this rank does not leave while peers may still read it.
struct Leave<'a> {
    memory: &'a PeerMemory,
    me: usize,
    call: u64,
    spin: Spin,
}

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        let (memory, me, call, spin) = (self.memory, self.me, self.call, self.spin);
        if !memory.abort(me, call) {
            return;
        }
        let first = 3 * call;
        memory.raise(me, first + 2);
        memory.await_all(first + 2, spin);
        memory.raise(me, first + 3);
        memory.await_all(first + 3, spin);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// Runs one all-reduce of `values` per rank on `memory`, each rank on its own thread
    /// with its own deadline; every rank then overwrites its buffer with NaN, so that a
    /// peer still reading it would get a wrong result.
    fn round(
        memory: &PeerMemory,
        seq: u64,
        values: &[Vec<f32>],
        deadlines: &[Duration],
        spin: Spin,
    ) -> Vec<Result<Vec<f32>, Error>> {
        thread::scope(|s| {
            let handles: Vec<_> = values
                .iter()
                .zip(deadlines)
                .enumerate()
                .map(|(me, (v, &after))| {
                    s.spawn(move || {
                        let mut buf = v.clone();
                        let op = OpDesc::all_reduce(seq, DType::F32, buf.len(), ReduceOp::Sum);
                        let bytes = bytemuck::cast_slice_mut::<f32, u8>(&mut buf);
                        let deadline = Instant::now() + after;
                        let result = memory.all_reduce(
                            me,
                            &op,
                            bytes,
                            (DType::F32, ReduceOp::Sum),
                            spin,
                            (deadline, after),
                            &|_| {},
                        );
                        let out = result.map(|()| buf.clone());
                        buf.fill(f32::NAN);
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Deadlines that race the commit: every rank agrees on success or failure, a
    /// success is exact, and no rank reads a buffer its owner has left.
    #[test]
    fn ranks_agree_and_read_no_left_buffer_when_deadlines_race_the_commit() {
        let n = 3;
        let values: Vec<Vec<f32>> = (0..n)
            .map(|r| (0..1001).map(|i| (r * 1001 + i) as f32).collect())
            .collect();
        let expected: Vec<f32> = (0..1001)
            .map(|i| (0..n).map(|r| (r * 1001 + i) as f32).sum())
            .collect();
        let (mut ok, mut failed) = (0, 0);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for trial in 0..300 {
            // A fresh group per trial: a failed call breaks its group.
            let memory = PeerMemory::new(n);
            let deadlines: Vec<Duration> = (0..n)
                .map(|_| Duration::from_micros(next() % 300))
                .collect();
            let spin = Spin {
                window: Duration::from_micros(next() % 30),
                yields: next() % 2 == 0,
            };
            let results = round(&memory, 1, &values, &deadlines, spin);
            let successes = results.iter().filter(|r| r.is_ok()).count();
            assert!(
                successes == 0 || successes == n,
                "trial {trial}: ranks disagree: {results:?}"
            );
            for result in results {
                match result {
                    Ok(got) => {
                        assert_eq!(got, expected, "trial {trial}");
                        ok += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
        }
        eprintln!("{ok} rank-calls succeeded, {failed} failed");
    }

    /// A rank that leaves (its group closed) while the others wait for it releases them
    /// at once, naming it, instead of at their deadline.
    #[test]
    fn a_rank_that_leaves_releases_the_waiting_others_at_once() {
        let memory = PeerMemory::new(3);
        let started = Instant::now();
        let results: Vec<Result<(), Error>> = thread::scope(|s| {
            let waiting: Vec<_> = (0..2)
                .map(|me| {
                    let memory = &memory;
                    s.spawn(move || {
                        let mut buf = vec![1.0f32; 64];
                        let op = OpDesc::all_reduce(7, DType::F32, buf.len(), ReduceOp::Sum);
                        let after = Duration::from_secs(60);
                        memory.all_reduce(
                            me,
                            &op,
                            bytemuck::cast_slice_mut::<f32, u8>(&mut buf),
                            (DType::F32, ReduceOp::Sum),
                            Spin::NONE,
                            (Instant::now() + after, after),
                            &|_| {},
                        )
                    })
                })
                .collect();
            // Rank 2 never calls; its group is closed a moment later.
            thread::sleep(Duration::from_millis(100));
            memory.close(2);
            waiting.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        for (rank, result) in results.iter().enumerate() {
            let text = result.as_ref().expect_err("rank 2 left").to_string();
            assert!(text.contains("rank 2"), "rank {rank}: {text}");
        }
    }
}
