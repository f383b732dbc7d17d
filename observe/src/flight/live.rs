//! The running call, as the runner and the executor see it: which call it is, its
//! number and description, the bytes moved with each peer so far and the peer it waits
//! for. Written by the one thread that runs the group's calls, without a lock; read at
//! any moment by a dump.
//!
//! The byte counters are relaxed atomics, each updated by a plain load and store (one
//! writer, so no read-modify-write instruction is needed). The call's identity and
//! description change together, under a sequence lock: the writer makes `generation` odd,
//! writes, and makes it even again; a reader retries while it saw an odd or a changed
//! generation. On x86 both sides are plain loads and stores.

use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering, Ordering::Relaxed};

use super::ring::{PeerCount, PeerCounts, PEER_SLOTS};
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::{CollectiveKind, DType, OpDesc, ReduceOp};

const NOBODY: usize = usize::MAX;
/// In `root`: none.
const NO_ROOT: u64 = u64::MAX;
/// How often a reader retries before it gives up on a writer that keeps changing the call.
const READ_ATTEMPTS: usize = 1000;

/// The running call, read in one piece.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct LiveRecord {
    /// The recorder's number of the call.
    pub(crate) call: u64,
    /// Its number in its sequence.
    pub(crate) seq: u64,
    /// When it started (Unix microseconds); `None`: when it was issued.
    pub(crate) started_us: Option<u64>,
    /// For a point-to-point call, the peer.
    pub(crate) peer: Option<usize>,
    /// What the engine runs, once it said.
    pub(crate) op: Option<OpDesc>,
    pub(crate) algorithm: Option<Algorithm>,
}

#[derive(Debug, Default)]
struct PeerCell {
    /// The peer's rank + 1; 0 while the cell is free.
    key: AtomicUsize,
    sent: AtomicU64,
    received: AtomicU64,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct LiveCall {
    /// Odd while the writer changes the fields below it.
    generation: AtomicU64,
    /// The call running now (0: none), and what [`LiveRecord`] says of it.
    call: AtomicU64,
    seq: AtomicU64,
    /// 0: when it was issued.
    started_us: AtomicU64,
    peer: AtomicUsize,
    /// Kind, element type, operator and algorithm codes, each plus one (0: none); 0
    /// as a whole: not described yet.
    codes: AtomicU64,
    count: AtomicU64,
    root: AtomicU64,
    cells: [PeerCell; PEER_SLOTS],
    others_sent: AtomicU64,
    others_received: AtomicU64,
    blocked_on: AtomicUsize,
}

impl Default for LiveCall {
    fn default() -> LiveCall {
        LiveCall {
            generation: AtomicU64::new(0),
            call: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            started_us: AtomicU64::new(0),
            peer: AtomicUsize::new(NOBODY),
            codes: AtomicU64::new(0),
            count: AtomicU64::new(0),
            root: AtomicU64::new(NO_ROOT),
            cells: Default::default(),
            others_sent: AtomicU64::new(0),
            others_received: AtomicU64::new(0),
            blocked_on: AtomicUsize::new(NOBODY),
        }
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
fn add(counter: &AtomicU64, n: usize) {
    counter.store(counter.load(Relaxed).wrapping_add(n as u64), Relaxed);
}

impl LiveCall {
    /// Runs `write` as the writer of the sequence-locked fields.
    #[inline]
    fn write(&self, write: impl FnOnce()) {
        let generation = self.generation.load(Relaxed);
        self.generation.store(generation.wrapping_add(1), Relaxed);
        fence(Ordering::Release);
        write();
        self.generation
            .store(generation.wrapping_add(2), Ordering::Release);
    }

    /// Call `call` starts as number `seq` of its sequence, at `started_us` (`None`: when
    /// it was issued), with `peer` for a point-to-point call: nothing moved yet, waiting
    /// for nobody, not described yet.
    #[inline]
    pub(crate) fn begin(&self, call: u64, seq: u64, started_us: Option<u64>, peer: Option<usize>) {
        self.write(|| {
            self.reset();
            self.seq.store(seq, Relaxed);
            self.started_us.store(started_us.unwrap_or(0), Relaxed);
            self.peer.store(peer.unwrap_or(NOBODY), Relaxed);
            self.codes.store(0, Relaxed);
            self.call.store(call, Relaxed);
        });
    }

    /// The engine runs the current call as `op` with `algorithm`.
    #[inline]
    pub(crate) fn describe(&self, op: &OpDesc, algorithm: Algorithm) {
        let (codes, count, root) = encode(op, algorithm);
        self.write(|| {
            self.count.store(count, Relaxed);
            self.root.store(root, Relaxed);
            self.codes.store(codes, Relaxed);
        });
    }

    /// The running call's number, if one runs. Only the writer calls this.
    #[inline]
    pub(crate) fn call(&self) -> Option<u64> {
        Some(self.call.load(Relaxed)).filter(|&call| call != 0)
    }

    /// The current call ends: returns what was recorded of it, if one was running, and
    /// writes its byte counts into `counts`. Only the writer calls this.
    #[inline]
    pub(crate) fn end(&self, counts: &mut PeerCounts) -> Option<LiveRecord> {
        let record = self.read_fields()?;
        self.copy_into(counts);
        self.write(|| self.call.store(0, Relaxed));
        Some(record)
    }

    /// The running call, its byte counts and the peer it waits for, read in one piece;
    /// `None` if none runs (or the writer kept changing it for [`READ_ATTEMPTS`] reads).
    pub(crate) fn read(&self) -> Option<(LiveRecord, PeerCounts, Option<usize>)> {
        for _ in 0..READ_ATTEMPTS {
            let before = self.generation.load(Ordering::Acquire);
            if before % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let record = self.read_fields();
            let counts = self.counts();
            let waiting = self.waiting_for();
            fence(Ordering::Acquire);
            if self.generation.load(Relaxed) == before {
                return record.map(|record| (record, counts, waiting));
            }
        }
        None
    }

    #[inline]
    fn read_fields(&self) -> Option<LiveRecord> {
        let call = self.call.load(Relaxed);
        if call == 0 {
            return None;
        }
        let seq = self.seq.load(Relaxed);
        let started_us = self.started_us.load(Relaxed);
        let peer = self.peer.load(Relaxed);
        let described = decode(
            seq,
            self.codes.load(Relaxed),
            self.count.load(Relaxed),
            self.root.load(Relaxed),
        );
        Some(LiveRecord {
            call,
            seq,
            started_us: (started_us != 0).then_some(started_us),
            peer: (peer != NOBODY).then_some(peer),
            op: described.map(|(op, _)| op),
            algorithm: described.map(|(_, algorithm)| algorithm),
        })
    }

    /// A new call starts: nothing moved, waiting for nobody.
    fn reset(&self) {
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
        self.blocked_on.store(NOBODY, Relaxed);
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

    /// `n` more bytes went to `peer`.
    #[inline]
    pub(crate) fn sent(&self, peer: usize, n: usize) {
        match self.cell(peer) {
            Some(cell) => add(&cell.sent, n),
            None => add(&self.others_sent, n),
        }
    }

    /// `n` more bytes came from `peer`.
    #[inline]
    pub(crate) fn received(&self, peer: usize, n: usize) {
        match self.cell(peer) {
            Some(cell) => add(&cell.received, n),
            None => add(&self.others_received, n),
        }
    }

    /// The call is about to sleep until `peer` is ready.
    #[inline]
    pub(crate) fn blocked_on(&self, peer: usize) {
        self.blocked_on.store(peer, Relaxed);
    }

    /// The peer the call last waited for.
    pub(crate) fn waiting_for(&self) -> Option<usize> {
        Some(self.blocked_on.load(Relaxed)).filter(|&p| p != NOBODY)
    }

    /// The counts so far.
    pub(crate) fn counts(&self) -> PeerCounts {
        let mut counts = PeerCounts::default();
        self.copy_into(&mut counts);
        counts
    }

    /// Writes the counts so far into `counts` (only the slots in use).
    pub(crate) fn copy_into(&self, counts: &mut PeerCounts) {
        counts.used = 0;
        for (cell, slot) in self.cells.iter().zip(counts.slots.iter_mut()) {
            let key = cell.key.load(Relaxed);
            if key == 0 {
                break;
            }
            *slot = PeerCount {
                peer: key - 1,
                sent: cell.sent.load(Relaxed),
                received: cell.received.load(Relaxed),
            };
            counts.used += 1;
        }
        let others = (
            self.others_sent.load(Relaxed),
            self.others_received.load(Relaxed),
        );
        counts.others = (others != (0, 0)).then_some(others);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_never_sees_one_call_mixed_with_another() {
        let live = LiveCall::default();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let reader = s.spawn(|| {
                let mut seen = 0u64;
                while !stop.load(Relaxed) {
                    if let Some((record, _, _)) = live.read() {
                        // The writer numbers call `c` as seq `c + 7`, started at `3c`,
                        // described with `2c` elements.
                        assert_eq!(record.seq, record.call + 7, "{record:?}");
                        assert_eq!(record.started_us, Some(3 * record.call), "{record:?}");
                        if let Some(op) = record.op {
                            assert_eq!((op.seq, op.count), (record.seq, 2 * record.call));
                            seen += 1;
                        }
                    }
                }
                seen
            });
            let mut counts = PeerCounts::default();
            for call in 1..200_000u64 {
                live.begin(call, call + 7, Some(3 * call), None);
                let op = OpDesc::all_reduce(call + 7, DType::F32, 2 * call as usize, ReduceOp::Sum);
                live.describe(&op, Algorithm::Ring);
                live.sent(1, 8);
                let ended = live.end(&mut counts);
                assert_eq!(ended.map(|r| (r.call, r.op)), Some((call, Some(op))));
                assert_eq!(counts.used()[0].sent, 8);
            }
            stop.store(true, Relaxed);
            let seen = reader.join().unwrap();
            eprintln!("the reader saw {seen} described calls");
        });
        assert_eq!(live.call(), None);
    }

    #[test]
    fn bytes_are_counted_per_peer_and_beyond_the_slots_together() {
        let live = LiveCall::default();
        live.sent(3, 100);
        live.received(1, 40);
        live.sent(3, 28);
        for peer in 10..10 + PEER_SLOTS {
            live.received(peer, 1);
        }
        let counts = live.counts();
        assert_eq!(counts.used, PEER_SLOTS);
        assert_eq!(
            counts.used()[..2],
            [
                PeerCount {
                    peer: 3,
                    sent: 128,
                    received: 0
                },
                PeerCount {
                    peer: 1,
                    sent: 0,
                    received: 40
                }
            ]
        );
        assert_eq!(
            counts.others,
            Some((0, 2)),
            "peers 16 and 17 had no slot left"
        );
        live.blocked_on(4);
        assert_eq!(live.waiting_for(), Some(4));
        live.reset();
        assert_eq!(live.counts(), PeerCounts::default());
        assert_eq!(live.waiting_for(), None);
    }
}
