//! Rabenseifner's all-reduce: a reduce-scatter by recursive halving, then an all-gather
//! by recursive doubling, over the largest power-of-two core of the group (the ranks
//! beyond it hand their buffer to a partner first and get the result back last, as in
//! recursive doubling).
//!
//! Each rank sends and receives 2·(p−1)/p of the buffer, like the ring, but in 2·log2 p
//! steps instead of 2·(N−1): the mid sizes, too large for recursive doubling (which moves
//! the whole buffer log2 p times) and too small for the ring's many steps to pay.
//! Every element is reduced on one rank and copied to the others, so every rank holds
//! the same bits.

use std::ops::Range;

use super::power_of_two_core::PowerOfTwoCore;
use super::{
    chunks, latest_recv_writing, overlap, segment, RecvAction, RecvStep, Schedule, SendStep,
};

/// Rank `rank`'s schedule for a halving-doubling all-reduce.
pub fn halving_doubling_all_reduce(
    rank: usize,
    world_size: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let n = world_size;
    let mut plan = Plan {
        schedule: Schedule::default(),
        elem_size,
        max_chunk_bytes,
    };
    if n <= 1 {
        return plan.schedule;
    }
    let core = PowerOfTwoCore::of(n);
    let (p, real) = (core.p, |v: usize| core.real(v));
    let everything = 0..count;

    let Some(v) = core.virtual_rank(rank) else {
        // Sit out: hand the buffer to rank+1, get the result back.
        plan.send(rank + 1, everything.clone());
        plan.recv(rank + 1, everything, RecvAction::Store);
        return plan.schedule;
    };
    if core.folds_in(rank) {
        let fold = RecvAction::Reduce {
            last: false,
            incoming_first: true,
        };
        plan.recv(rank - 1, everything.clone(), fold);
    }
    // The elements of blocks `blocks` (block b: the b-th of p nearly equal pieces).
    let elements = |blocks: Range<usize>| -> Range<usize> {
        if blocks.is_empty() {
            return 0..0;
        }
        segment(count, p, blocks.start).start..segment(count, p, blocks.end - 1).end
    };

    // Reduce-scatter: halve the blocks this rank is responsible for at every step, until
    // it holds block `v`, fully reduced.
    let mut mine = 0..p;
    let mut mask = p / 2;
    while mask >= 1 {
        let partner_v = v ^ mask;
        let mid = mine.start + mine.len() / 2;
        let (keep, give) = if v & mask == 0 {
            (mine.start..mid, mid..mine.end)
        } else {
            (mid..mine.end, mine.start..mid)
        };
        plan.send(real(partner_v), elements(give));
        let reduce = RecvAction::Reduce {
            last: mask == 1,
            incoming_first: partner_v < v,
        };
        plan.recv(real(partner_v), elements(keep.clone()), reduce);
        mine = keep;
        mask /= 2;
    }

    // All-gather: double the blocks held at every step.
    let mut mask = 1;
    while mask < p {
        let partner_v = v ^ mask;
        let theirs = if v & mask == 0 {
            mine.end..mine.end + mine.len()
        } else {
            mine.start - mine.len()..mine.start
        };
        plan.send(real(partner_v), elements(mine.clone()));
        plan.recv(real(partner_v), elements(theirs.clone()), RecvAction::Store);
        mine = mine.start.min(theirs.start)..mine.end.max(theirs.end);
        mask *= 2;
    }

    if core.folds_in(rank) {
        plan.send(rank - 1, 0..count);
    }
    plan.schedule
}

/// A schedule being built, chunk by chunk, with each step ordered after the steps it
/// depends on.
struct Plan {
    schedule: Schedule,
    elem_size: usize,
    max_chunk_bytes: usize,
}

impl Plan {
    /// Sends `range` to `peer`; each chunk waits for the latest receive that wrote any of
    /// its elements (receives complete in order, so the earlier ones are done too).
    fn send(&mut self, peer: usize, range: Range<usize>) {
        for piece in chunks(range, self.elem_size, self.max_chunk_bytes) {
            let after_recv = latest_recv_writing(&self.schedule.recvs, 0, &piece);
            self.schedule.sends.push(SendStep {
                peer,
                range: piece,
                after_recv,
            });
        }
    }

    /// Receives `range` from `peer`; each chunk lands only after the latest send that
    /// reads any of its elements has left (sends complete in order).
    fn recv(&mut self, peer: usize, range: Range<usize>, action: RecvAction) {
        for piece in chunks(range, self.elem_size, self.max_chunk_bytes) {
            let after_send = self
                .schedule
                .sends
                .iter()
                .rposition(|s| overlap(&s.range, &piece));
            self.schedule.recvs.push(RecvStep {
                peer,
                range: piece,
                action,
                after_send,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::CollectiveKind;

    #[test]
    fn correct_and_deadlock_free_for_every_shape() {
        for n in 1usize..=17 {
            for count in [0, 1, 2, 3, 7, 100, 1001] {
                for chunk in [4, 40, 1 << 20] {
                    simulate(n, count, CollectiveKind::AllReduce, None, |rank| {
                        halving_doubling_all_reduce(rank, n, count, 4, chunk)
                    });
                }
            }
        }
    }

    #[test]
    fn each_core_rank_moves_two_p_minus_one_over_p_of_the_buffer_in_two_log_p_steps() {
        for (n, p, steps) in [(2, 2, 2), (4, 4, 4), (8, 8, 6), (6, 4, 4), (5, 4, 4)] {
            let count = 1 << 12;
            let s = halving_doubling_all_reduce(n - 1, n, count, 4, usize::MAX);
            let sent: usize = s.sends.iter().map(|s| s.range.len()).sum();
            let received: usize = s.recvs.iter().map(|r| r.range.len()).sum();
            // The last rank is always in the core and never folds a partner in.
            let core = 2 * (p - 1) * count / p;
            assert_eq!(s.sends.len(), steps, "n={n}");
            assert_eq!((sent, received), (core, core), "n={n}");
        }
        // A rank that folds its partner in first receives the whole buffer once more,
        // and sends it back at the end.
        let s = halving_doubling_all_reduce(1, 6, 1 << 12, 4, usize::MAX);
        let sent: usize = s.sends.iter().map(|s| s.range.len()).sum();
        assert_eq!(
            (s.sends.len(), sent),
            (5, 2 * 3 * (1 << 12) / 4 + (1 << 12))
        );
    }
}
