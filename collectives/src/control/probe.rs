//! What this rank is doing right now: its current call, how that call was numbered, the
//! bytes it has moved with each peer, the peer it waits for and how long it has waited,
//! and how many calls it has started with each peer. The one home of these facts: the
//! control thread reads them to answer peers, the flight recorder reads them into its
//! dumps.
//!
//! One writer at a time: the thread running the group's call, under the runner's lock
//! (the runner numbers the call, the engine describes it and reports its progress).
//! Readers on any thread take no lock. The call's identity and its waits change together
//! under a [`SeqLock`]. Byte counters and
//! the counts of calls only grow during a call, and are relaxed atomics, each updated by
//! a plain load and store (one writer, so no read-modify-write instruction).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;

use crate::seqlock::SeqLock;
use crate::wire::Algorithm;
use crate::{CallDesc, CollectiveKind, DType, OpDesc, ReduceOp, Sequence};

/// How many peers of one call get byte counts of their own; the bytes exchanged with
/// any further peer are summed together.
pub const PEER_SLOTS: usize = 8;

const NOBODY: usize = usize::MAX;
/// In `root`: none.
const NO_ROOT: u64 = u64::MAX;
/// How often a reader retries before it gives up on a writer that keeps changing the call.
const READ_ATTEMPTS: usize = 100_000;

/// How many calls one rank has *started* that involve one peer, counted the way the
/// runner numbers them (a call counts from the moment it is numbered, before any byte
/// moves). Counters only grow, so a count seen once is a lower bound forever after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairCounts {
    /// The peer these counts are about.
    pub peer: usize,
    /// Collectives started in the group (the group's sequence number of the latest).
    pub collectives: u64,
    /// Point-to-point messages started to `peer`.
    pub sent: u64,
    /// Point-to-point receives started from `peer`.
    pub received: u64,
}

/// What this rank is doing, as sent to a peer that asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The op running now, and the schedule it runs.
    pub current: Option<(OpDesc, Algorithm)>,
    /// The peer the running op last waited for (it may be waiting now).
    pub blocked_on: Option<usize>,
    /// How the running op was numbered: by the group, or per direction of one pair (which
    /// says whether a point-to-point op sends or receives, and with whom). `None` when
    /// unknown.
    pub sequence: Option<Sequence>,
    /// How many times the running op has had to wait (each wait follows an attempt to
    /// move bytes that moved none).
    pub waits: u64,
    /// The value of `waits` at which the running op's unbroken run of waits on
    /// `blocked_on` began: every wait numbered from there to `waits` was on that peer.
    pub waiting_on_since: u64,
    /// The value of `waits` since which the running op has moved no byte: between wait
    /// number `stalled_since` and wait number `waits`, nothing was sent or received.
    pub stalled_since: u64,
    /// This rank's counts with the peer the snapshot is for.
    pub counts: Option<PairCounts>,
}

impl Snapshot {
    /// The call the snapshot shows running, when its description and numbering agree.
    ///
    /// ```
    /// use ringccl_collectives::control::Snapshot;
    /// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, Sequence};
    ///
    /// let snapshot = Snapshot {
    ///     current: Some((OpDesc::send_recv(3, DType::F32, 8, 0), Algorithm::Direct)),
    ///     sequence: Some(Sequence::ReceivedFrom(1)),
    ///     ..Snapshot::default()
    /// };
    /// let call = snapshot.running_call().unwrap();
    /// assert_eq!(call.to_string(), "recv(from rank 1, msg #3, tag=0, 8 x f32)");
    /// ```
    pub fn running_call(&self) -> Option<CallDesc> {
        let (op, _) = self.current?;
        let sequence = self.sequence?;
        let point_to_point = op.kind == CollectiveKind::SendRecv;
        let consistent = match sequence {
            Sequence::Collective => !point_to_point,
            Sequence::SentTo(_) | Sequence::ReceivedFrom(_) => point_to_point,
        };
        consistent.then_some(CallDesc { op, sequence })
    }
}

/// Bytes one call exchanged with one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerMoved {
    /// The peer.
    pub peer: usize,
    /// Bytes sent to it.
    pub sent: u64,
    /// Bytes received from it.
    pub received: u64,
}

/// The bytes one call exchanged, per peer: [`PEER_SLOTS`] inline slots, in the order the
/// call first moved bytes with each peer, and a total for the rest. Two are equal when
/// their slots in use and their totals are.
#[derive(Clone, Copy, Debug, Default)]
pub struct MovedBytes {
    /// The first peers' counts; only the first `used` are meaningful.
    pub slots: [PeerMoved; PEER_SLOTS],
    /// How many of `slots` are in use.
    pub used: usize,
    /// Bytes with peers beyond the slots: `(sent, received)`, when there were any.
    pub others: Option<(u64, u64)>,
}

impl PartialEq for MovedBytes {
    fn eq(&self, other: &MovedBytes) -> bool {
        (self.used(), self.others) == (other.used(), other.others)
    }
}

impl Eq for MovedBytes {}

impl MovedBytes {
    /// The slots in use.
    ///
    /// ```
    /// use ringccl_collectives::control::MovedBytes;
    /// assert!(MovedBytes::default().used().is_empty());
    /// ```
    pub fn used(&self) -> &[PeerMoved] {
        self.slots.get(..self.used).unwrap_or(&self.slots)
    }
}

/// The latest call the runner numbered, running or ended, read in one piece (its bytes
/// are read beside it, by [`Probe::last_call`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LastCall {
    /// How it was numbered, and its number.
    pub sequence: Sequence,
    /// Its number in its sequence.
    pub seq: u64,
    /// What the engine runs, once it said.
    pub described: Option<(OpDesc, Algorithm)>,
    /// Whether it is running now.
    pub running: bool,
    /// The peer it last waited for.
    pub blocked_on: Option<usize>,
}

#[derive(Debug, Default)]
struct PeerCell {
    /// The peer's rank + 1; 0 while the cell is free.
    key: AtomicUsize,
    sent: AtomicU64,
    received: AtomicU64,
}

/// Calls started with one peer, per direction.
#[derive(Debug, Default)]
struct PairCell {
    sent: AtomicU64,
    received: AtomicU64,
}

/// See the module documentation.
///
/// ```
/// use ringccl_collectives::control::{MovedBytes, Probe};
/// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, Sequence};
///
/// let probe = Probe::default();
/// probe.size_for(4);
/// probe.numbered(Sequence::ReceivedFrom(1), 3);
/// probe.begin(OpDesc::send_recv(3, DType::F32, 8, 0), Algorithm::Direct);
/// probe.received(1, 16);
/// probe.blocked_on(1, 16);
/// let now = probe.snapshot();
/// assert_eq!(now.current.map(|(op, _)| op.seq), Some(3));
/// assert_eq!(now.sequence, Some(Sequence::ReceivedFrom(1)));
/// assert_eq!((now.blocked_on, now.waits), (Some(1), 1));
/// assert_eq!(now.counts.map(|c| (c.peer, c.received)), Some((1, 3)));
/// probe.end();
/// assert_eq!(probe.snapshot().current, None);
/// let mut moved = MovedBytes::default();
/// assert_eq!(probe.last_call(&mut moved).map(|c| c.seq), Some(3));
/// assert_eq!(moved.used()[0].received, 16);
/// ```
#[derive(Debug)]
pub struct Probe {
    /// Guards the fields up to `moved`.
    lock: SeqLock,
    /// The latest call's [`Sequence`], encoded (0: none numbered yet).
    sequence: AtomicU64,
    seq: AtomicU64,
    /// Kind, element type, operator and algorithm codes, each plus one (0: none); 0 as a
    /// whole: not described yet.
    codes: AtomicU64,
    count: AtomicU64,
    root: AtomicU64,
    running: AtomicBool,
    blocked_on: AtomicUsize,
    waits: AtomicU64,
    waiting_on_since: AtomicU64,
    stalled_since: AtomicU64,
    /// Bytes the running op had moved at its latest wait.
    moved: AtomicU64,
    cells: [PeerCell; PEER_SLOTS],
    others_sent: AtomicU64,
    others_received: AtomicU64,
    /// Collectives started.
    collectives: AtomicU64,
    /// Point-to-point calls started, per peer (sized once, for the group).
    pairs: OnceLock<Box<[PairCell]>>,
}

impl Default for Probe {
    fn default() -> Probe {
        Probe {
            lock: SeqLock::default(),
            sequence: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            codes: AtomicU64::new(0),
            count: AtomicU64::new(0),
            root: AtomicU64::new(NO_ROOT),
            running: AtomicBool::new(false),
            blocked_on: AtomicUsize::new(NOBODY),
            waits: AtomicU64::new(0),
            waiting_on_since: AtomicU64::new(0),
            stalled_since: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            cells: Default::default(),
            others_sent: AtomicU64::new(0),
            others_received: AtomicU64::new(0),
            collectives: AtomicU64::new(0),
            pairs: OnceLock::new(),
        }
    }
}

fn encode_sequence(sequence: Sequence) -> u64 {
    match sequence {
        Sequence::Collective => 1,
        Sequence::SentTo(peer) => 2 + 2 * peer as u64,
        Sequence::ReceivedFrom(peer) => 3 + 2 * peer as u64,
    }
}

fn decode_sequence(code: u64) -> Option<Sequence> {
    let peer = || usize::try_from((code - 2) / 2).ok();
    match code {
        0 => None,
        1 => Some(Sequence::Collective),
        even if even % 2 == 0 => peer().map(Sequence::SentTo),
        _ => peer().map(Sequence::ReceivedFrom),
    }
}

fn code_or_zero(code: Option<u8>) -> u64 {
    code.map_or(0, |c| u64::from(c) + 1)
}

fn code_of(codes: u64, shift: u32) -> Option<u8> {
    let code = u8::try_from((codes >> shift) & 0xff).ok()?;
    code.checked_sub(1)
}

/// The description of `op` and `algorithm` as `codes`, `count` and `root` words.
#[inline]
fn encode(op: &OpDesc, algorithm: Algorithm) -> (u64, u64, u64) {
    let codes = code_or_zero(Some(op.kind.code()))
        | code_or_zero(op.dtype.map(DType::code)) << 8
        | code_or_zero(op.op.map(ReduceOp::code)) << 16
        | code_or_zero(Some(algorithm.code())) << 24;
    (codes, op.count, op.root.map_or(NO_ROOT, u64::from))
}

/// The description [`encode`] wrote for call number `seq`; `None` if there was none.
fn decode(seq: u64, codes: u64, count: u64, root: u64) -> Option<(OpDesc, Algorithm)> {
    let kind = CollectiveKind::from_code(code_of(codes, 0)?)?;
    let algorithm = Algorithm::from_code(code_of(codes, 24)?)?;
    let op = OpDesc {
        seq,
        kind,
        dtype: code_of(codes, 8).and_then(DType::from_code),
        count,
        op: code_of(codes, 16).and_then(ReduceOp::from_code),
        root: u32::try_from(root).ok(),
    };
    Some((op, algorithm))
}

#[inline]
fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(n), Relaxed);
}

#[inline]
fn raise(counter: &AtomicU64, to: u64) {
    if counter.load(Relaxed) < to {
        counter.store(to, Relaxed);
    }
}

/// The fields the sequence lock guards, read in one piece.
struct Fields {
    sequence: Option<Sequence>,
    seq: u64,
    described: Option<(OpDesc, Algorithm)>,
    running: bool,
    blocked_on: Option<usize>,
    waits: u64,
    waiting_on_since: u64,
    stalled_since: u64,
}

impl Probe {
    /// Keeps counts of point-to-point calls for each peer of a group of `world_size`
    /// (done once, before the group's first call; the counts of a probe never sized stay
    /// zero).
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    /// use ringccl_collectives::Sequence;
    ///
    /// let probe = Probe::default();
    /// probe.size_for(4);
    /// probe.numbered(Sequence::SentTo(3), 2);
    /// assert_eq!(probe.snapshot_for(3).counts.map(|c| c.sent), Some(2));
    /// assert_eq!(probe.snapshot_for(1).counts.map(|c| c.sent), Some(0));
    /// ```
    pub fn size_for(&self, world_size: usize) {
        let _ = self
            .pairs
            .get_or_init(|| (0..world_size).map(|_| PairCell::default()).collect());
    }

    /// The runner numbered a call `seq` on `sequence`'s counter: it is this rank's
    /// latest call, not described yet, nothing moved.
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    /// use ringccl_collectives::Sequence;
    ///
    /// let probe = Probe::default();
    /// probe.numbered(Sequence::Collective, 7);
    /// assert_eq!(probe.snapshot_for(2).counts.map(|c| c.collectives), Some(7));
    /// ```
    pub fn numbered(&self, sequence: Sequence, seq: u64) {
        match sequence {
            Sequence::Collective => raise(&self.collectives, seq),
            Sequence::SentTo(peer) | Sequence::ReceivedFrom(peer) => {
                if let Some(pair) = self.pairs.get().and_then(|pairs| pairs.get(peer)) {
                    let counter = match sequence {
                        Sequence::SentTo(_) => &pair.sent,
                        _ => &pair.received,
                    };
                    raise(counter, seq);
                }
            }
        }
        self.lock.write(|| {
            self.running.store(false, Relaxed);
            self.sequence.store(encode_sequence(sequence), Relaxed);
            self.seq.store(seq, Relaxed);
            self.codes.store(0, Relaxed);
            self.reset_progress();
            for cell in &self.cells {
                if cell.key.load(Relaxed) == 0 {
                    break;
                }
                cell.key.store(0, Relaxed);
                cell.sent.store(0, Relaxed);
                cell.received.store(0, Relaxed);
            }
            self.others_sent.store(0, Relaxed);
            self.others_received.store(0, Relaxed);
        });
    }

    fn reset_progress(&self) {
        self.blocked_on.store(NOBODY, Relaxed);
        self.waits.store(0, Relaxed);
        self.waiting_on_since.store(0, Relaxed);
        self.stalled_since.store(0, Relaxed);
        self.moved.store(0, Relaxed);
    }

    /// `op` starts (or goes on), running `algorithm`.
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    /// use ringccl_collectives::{wire::Algorithm, OpDesc};
    ///
    /// let probe = Probe::default();
    /// probe.begin(OpDesc::barrier(1), Algorithm::Dissemination);
    /// assert!(probe.snapshot().current.is_some());
    /// ```
    pub fn begin(&self, op: OpDesc, algorithm: Algorithm) {
        let (codes, count, root) = encode(&op, algorithm);
        self.lock.write(|| {
            self.seq.store(op.seq, Relaxed);
            self.count.store(count, Relaxed);
            self.root.store(root, Relaxed);
            self.codes.store(codes, Relaxed);
            self.reset_progress();
            self.running.store(true, Relaxed);
        });
    }

    /// The cell of `peer`, taking a free one on first use; `None` once all are taken.
    #[inline]
    fn cell(&self, peer: usize) -> Option<&PeerCell> {
        let key = peer.wrapping_add(1);
        for cell in &self.cells {
            match cell.key.load(Relaxed) {
                k if k == key => return Some(cell),
                0 => {
                    cell.key.store(key, Relaxed);
                    return Some(cell);
                }
                _ => {}
            }
        }
        None
    }

    /// `n` more bytes of the running call went to `peer`.
    ///
    /// ```
    /// use ringccl_collectives::control::{MovedBytes, Probe};
    /// use ringccl_collectives::Sequence;
    ///
    /// let probe = Probe::default();
    /// probe.numbered(Sequence::Collective, 1);
    /// probe.sent(2, 64);
    /// probe.received(2, 32);
    /// let mut moved = MovedBytes::default();
    /// probe.last_call(&mut moved);
    /// assert_eq!((moved.used()[0].sent, moved.used()[0].received), (64, 32));
    /// ```
    #[inline]
    pub fn sent(&self, peer: usize, n: usize) {
        match self.cell(peer) {
            Some(cell) => add(&cell.sent, n as u64),
            None => add(&self.others_sent, n as u64),
        }
    }

    /// `n` more bytes of the running call came from `peer` (see [`Probe::sent`]).
    #[inline]
    pub fn received(&self, peer: usize, n: usize) {
        match self.cell(peer) {
            Some(cell) => add(&cell.received, n as u64),
            None => add(&self.others_received, n as u64),
        }
    }

    /// The running op is about to sleep until `peer` is ready: it tried to move bytes
    /// and moved none. `moved`: the bytes it has sent and received so far.
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    /// use ringccl_collectives::{wire::Algorithm, OpDesc};
    ///
    /// let probe = Probe::default();
    /// probe.begin(OpDesc::barrier(1), Algorithm::Dissemination);
    /// probe.blocked_on(2, 0);
    /// probe.blocked_on(1, 32);
    /// probe.blocked_on(1, 32);
    /// let now = probe.snapshot();
    /// assert_eq!((now.blocked_on, now.waits, now.waiting_on_since), (Some(1), 3, 2));
    /// assert_eq!(now.stalled_since, 2);
    /// ```
    pub fn blocked_on(&self, peer: usize, moved: u64) {
        self.lock.write(|| {
            let waits = self.waits.load(Relaxed).saturating_add(1);
            self.waits.store(waits, Relaxed);
            if self.blocked_on.load(Relaxed) != peer {
                self.waiting_on_since.store(waits, Relaxed);
                self.blocked_on.store(peer, Relaxed);
            }
            let stalled_since = self.stalled_since.load(Relaxed);
            if self.moved.load(Relaxed) != moved || stalled_since == 0 {
                self.stalled_since.store(waits, Relaxed);
                self.moved.store(moved, Relaxed);
            }
        });
    }

    /// The running op has ended (either way); what it did stays readable
    /// ([`Probe::last_call`]) until the next call is numbered.
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    /// use ringccl_collectives::{wire::Algorithm, OpDesc};
    ///
    /// let probe = Probe::default();
    /// probe.begin(OpDesc::barrier(1), Algorithm::Dissemination);
    /// probe.end();
    /// assert_eq!(probe.snapshot().current, None);
    /// ```
    pub fn end(&self) {
        self.lock.write(|| self.running.store(false, Relaxed));
    }

    /// Reads the sequence-locked fields with `more` in one piece; `None` when the writer
    /// kept changing them for [`READ_ATTEMPTS`] reads.
    fn read<R>(&self, mut more: impl FnMut() -> R) -> Option<(Fields, R)> {
        self.lock.read(READ_ATTEMPTS, || {
            let seq = self.seq.load(Relaxed);
            let blocked_on = self.blocked_on.load(Relaxed);
            let fields = Fields {
                sequence: decode_sequence(self.sequence.load(Relaxed)),
                seq,
                described: decode(
                    seq,
                    self.codes.load(Relaxed),
                    self.count.load(Relaxed),
                    self.root.load(Relaxed),
                ),
                running: self.running.load(Relaxed),
                blocked_on: (blocked_on != NOBODY).then_some(blocked_on),
                waits: self.waits.load(Relaxed),
                waiting_on_since: self.waiting_on_since.load(Relaxed),
                stalled_since: self.stalled_since.load(Relaxed),
            };
            (fields, more())
        })
    }

    /// What this rank is doing now, with its counts for the peer it is blocked on (the
    /// one it would ask).
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    ///
    /// assert_eq!(Probe::default().snapshot().counts, None);
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot_about(None)
    }

    /// What this rank is doing now, with its counts for `peer` (the one it answers).
    ///
    /// ```
    /// use ringccl_collectives::control::Probe;
    /// use ringccl_collectives::Sequence;
    ///
    /// let probe = Probe::default();
    /// probe.size_for(2);
    /// probe.numbered(Sequence::ReceivedFrom(1), 4);
    /// assert_eq!(probe.snapshot_for(1).counts.map(|c| c.received), Some(4));
    /// ```
    pub fn snapshot_for(&self, peer: usize) -> Snapshot {
        self.snapshot_about(Some(peer))
    }

    fn snapshot_about(&self, peer: Option<usize>) -> Snapshot {
        let Some((fields, ())) = self.read(|| ()) else {
            return Snapshot::default();
        };
        if !fields.running {
            return Snapshot {
                counts: peer.map(|peer| self.counts(peer)),
                ..Snapshot::default()
            };
        }
        let about = peer.or(fields.blocked_on);
        Snapshot {
            current: fields.described,
            blocked_on: fields.blocked_on,
            sequence: fields.sequence,
            waits: fields.waits,
            waiting_on_since: fields.waiting_on_since,
            stalled_since: fields.stalled_since,
            counts: about.map(|peer| self.counts(peer)),
        }
    }

    fn counts(&self, peer: usize) -> PairCounts {
        let pair = self.pairs.get().and_then(|pairs| pairs.get(peer));
        PairCounts {
            peer,
            collectives: self.collectives.load(Relaxed),
            sent: pair.map_or(0, |p| p.sent.load(Relaxed)),
            received: pair.map_or(0, |p| p.received.load(Relaxed)),
        }
    }

    /// The latest call numbered, running or ended, with the bytes it moved written into
    /// `moved` (in place: the counts are a few hundred bytes); `None` before the first.
    ///
    /// ```
    /// use ringccl_collectives::control::{MovedBytes, Probe};
    /// use ringccl_collectives::{wire::Algorithm, OpDesc, Sequence};
    ///
    /// let probe = Probe::default();
    /// let mut moved = MovedBytes::default();
    /// assert!(probe.last_call(&mut moved).is_none());
    /// probe.numbered(Sequence::Collective, 9);
    /// probe.begin(OpDesc::barrier(9), Algorithm::Dissemination);
    /// probe.end();
    /// let last = probe.last_call(&mut moved).unwrap();
    /// assert_eq!((last.seq, last.running), (9, false));
    /// ```
    pub fn last_call(&self, moved: &mut MovedBytes) -> Option<LastCall> {
        let (fields, ()) = self.read(|| self.moved_into(moved))?;
        Some(LastCall {
            sequence: fields.sequence?,
            seq: fields.seq,
            described: fields.described,
            running: fields.running,
            blocked_on: fields.blocked_on,
        })
    }

    fn moved_into(&self, bytes: &mut MovedBytes) {
        bytes.used = 0;
        for (cell, slot) in self.cells.iter().zip(bytes.slots.iter_mut()) {
            let key = cell.key.load(Relaxed);
            if key == 0 {
                break;
            }
            *slot = PeerMoved {
                peer: key - 1,
                sent: cell.sent.load(Relaxed),
                received: cell.received.load(Relaxed),
            };
            bytes.used += 1;
        }
        let others = (
            self.others_sent.load(Relaxed),
            self.others_received.load(Relaxed),
        );
        bytes.others = (others != (0, 0)).then_some(others);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets its flag when dropped: a writer that fails still stops the reader.
    struct StopOnDrop<'a>(&'a AtomicBool);

    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Relaxed);
        }
    }

    #[test]
    fn a_reader_never_sees_one_call_mixed_with_another() {
        let probe = Probe::default();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut seen = 0u64;
                while !stop.load(Relaxed) {
                    let now = probe.snapshot();
                    if let Some((op, _)) = now.current {
                        // The writer describes call `c` with `2c` elements, and waits
                        // `c % 5` times on peer `c % 3`.
                        assert_eq!(op.count, 2 * op.seq, "{now:?}");
                        assert_eq!(now.sequence, Some(Sequence::Collective), "{now:?}");
                        if now.waits > 0 {
                            assert_eq!(now.blocked_on, Some((op.seq % 3) as usize), "{now:?}");
                        }
                        assert!(now.waits <= op.seq % 5, "{now:?}");
                        seen += 1;
                    }
                }
                seen
            });
            let stopping = StopOnDrop(&stop);
            for call in 1..200_000u64 {
                probe.numbered(Sequence::Collective, call);
                let op = OpDesc::all_reduce(call, DType::F32, 2 * call as usize, ReduceOp::Sum);
                probe.begin(op, Algorithm::Ring);
                probe.sent(1, 8);
                for _ in 0..call % 5 {
                    probe.blocked_on((call % 3) as usize, 8);
                }
                probe.end();
                let mut moved = MovedBytes::default();
                let last = probe.last_call(&mut moved).unwrap();
                assert_eq!(
                    (last.seq, last.described.map(|(op, _)| op)),
                    (call, Some(op))
                );
                assert_eq!(moved.used()[0].sent, 8);
            }
            drop(stopping);
            let seen = reader.join().unwrap();
            eprintln!("the reader saw {seen} running calls");
        });
    }

    #[test]
    fn bytes_are_counted_per_peer_and_beyond_the_slots_together() {
        let probe = Probe::default();
        probe.numbered(Sequence::Collective, 1);
        probe.sent(3, 100);
        probe.received(1, 40);
        probe.sent(3, 28);
        for peer in 10..10 + PEER_SLOTS {
            probe.received(peer, 1);
        }
        let mut moved = MovedBytes::default();
        probe.last_call(&mut moved).unwrap();
        assert_eq!(moved.used, PEER_SLOTS);
        assert_eq!(
            moved.used()[..2],
            [
                PeerMoved {
                    peer: 3,
                    sent: 128,
                    received: 0
                },
                PeerMoved {
                    peer: 1,
                    sent: 0,
                    received: 40
                }
            ]
        );
        assert_eq!(moved.others, Some((0, 2)), "two peers had no slot left");
        probe.numbered(Sequence::Collective, 2);
        probe.last_call(&mut moved).unwrap();
        assert_eq!(moved, MovedBytes::default());
    }

    #[test]
    fn sequences_survive_their_encoding() {
        for sequence in [
            Sequence::Collective,
            Sequence::SentTo(0),
            Sequence::ReceivedFrom(0),
            Sequence::SentTo(1023),
            Sequence::ReceivedFrom(7),
        ] {
            assert_eq!(decode_sequence(encode_sequence(sequence)), Some(sequence));
        }
        assert_eq!(decode_sequence(0), None);
    }
}
