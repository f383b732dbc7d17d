//! Recursive-doubling all-reduce: ⌈log2 N⌉ exchanges of the whole buffer, the
//! latency-optimal choice for small messages.
//!
//! With `p` the largest power of two ≤ N and `e = N − p`, the first `2e` ranks pair up:
//! each even rank sends its buffer to the odd rank above it and sits out
//! (`power_of_two_core.rs`). The `p` remaining ranks (virtual ranks `0..p`) run
//! recursive doubling: in round `k` virtual rank `v` exchanges its buffer with `v ^ 2^k`
//! and both compute `lower_half (op) upper_half` — the operand from the lower virtual
//! ranks always first, so both partners compute the same bits. Finally each odd rank of
//! the first `2e` sends the result back to the even rank that sat out. Every rank reduces the same values in
//! the same order, so every rank ends with bit-identical results.

use super::power_of_two_core::PowerOfTwoCore;
use super::{chunks, RecvAction, RecvStep, Schedule, SendStep};

/// Rank `rank`'s schedule for a recursive-doubling all-reduce.
pub fn recursive_doubling_all_reduce(
    rank: usize,
    world_size: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let n = world_size;
    let mut schedule = Schedule::default();
    if n <= 1 {
        return schedule;
    }
    let core = PowerOfTwoCore::of(n);
    let (p, real) = (core.p, |v: usize| core.real(v));
    let pieces: Vec<_> = chunks(0..count, elem_size, max_chunk_bytes).collect();

    let Some(v) = core.virtual_rank(rank) else {
        // Sit out: hand the buffer to rank+1, get the result back.
        for range in &pieces {
            schedule.sends.push(SendStep {
                peer: rank + 1,
                range: range.clone(),
                after_recv: None,
            });
        }
        for range in &pieces {
            schedule.recvs.push(RecvStep {
                peer: rank + 1,
                range: range.clone(),
                action: RecvAction::Store,
                after_send: None,
            });
        }
        return schedule;
    };
    // Receive index of each chunk in the latest round, for the next sends to wait on.
    let mut prev: Option<Vec<usize>> = None;
    if core.folds_in(rank) {
        let mut got = Vec::new();
        for range in &pieces {
            got.push(schedule.recvs.len());
            schedule.recvs.push(RecvStep {
                peer: rank - 1,
                range: range.clone(),
                action: RecvAction::Reduce {
                    last: false,
                    incoming_first: true,
                },
                after_send: None,
            });
        }
        prev = Some(got);
    }
    let mut mask = 1;
    while mask < p {
        let partner_v = v ^ mask;
        let partner = real(partner_v);
        let first_send = schedule.sends.len();
        for (j, range) in pieces.iter().enumerate() {
            schedule.sends.push(SendStep {
                peer: partner,
                range: range.clone(),
                after_recv: prev.as_ref().map(|g| g[j]),
            });
        }
        let mut got = Vec::new();
        for (j, range) in pieces.iter().enumerate() {
            got.push(schedule.recvs.len());
            schedule.recvs.push(RecvStep {
                peer: partner,
                range: range.clone(),
                action: RecvAction::Reduce {
                    last: mask * 2 >= p,
                    incoming_first: partner_v < v,
                },
                // Both partners send and receive the same chunk: do not fold the
                // partner's chunk in before ours has left.
                after_send: Some(first_send + j),
            });
        }
        prev = Some(got);
        mask *= 2;
    }
    if core.folds_in(rank) {
        for (j, range) in pieces.iter().enumerate() {
            schedule.sends.push(SendStep {
                peer: rank - 1,
                range: range.clone(),
                after_recv: prev.as_ref().map(|g| g[j]),
            });
        }
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::CollectiveKind;

    #[test]
    fn correct_and_deadlock_free_for_every_shape() {
        for n in 1usize..=17 {
            for count in [0, 1, 2, 7, 100] {
                for chunk in [4, 40, 1 << 20] {
                    simulate(n, count, CollectiveKind::AllReduce, None, |rank| {
                        recursive_doubling_all_reduce(rank, n, count, 4, chunk)
                    });
                }
            }
        }
    }

    #[test]
    fn rounds_are_logarithmic() {
        for (n, rounds) in [(2, 1), (4, 2), (8, 3), (5, 2), (6, 2)] {
            // A rank that takes part in every round of a power-of-two core.
            let s = recursive_doubling_all_reduce(n - 1, n, 1, 4, 64);
            assert_eq!(s.sends.len(), rounds, "n={n}");
        }
        // Ranks that sit out send once and receive once.
        let s = recursive_doubling_all_reduce(0, 5, 1, 4, 64);
        assert_eq!((s.sends.len(), s.recvs.len()), (1, 1));
    }
}
