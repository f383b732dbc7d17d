//! Pairwise-exchange all-to-all: in step `k` (1 ≤ k < N) rank `r` sends its block for
//! `r+k` and receives the block from `r−k`. Every link carries exactly one block.

use super::{chunks, segment, RecvAction, RecvStep, Schedule, SendStep};

/// Rank `rank`'s schedule over an output buffer of `world_size` equal blocks of `count`
/// elements in total. The sends read from a second buffer (the input) with the same
/// layout: `SendStep::range` indexes the input, `RecvStep::range` the output.
pub fn pairwise_all_to_all(
    rank: usize,
    world_size: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let n = world_size;
    let mut schedule = Schedule::default();
    for k in 1..n {
        let to = (rank + k) % n;
        let from = (rank + n - k) % n;
        for range in chunks(segment(count, n, to), elem_size, max_chunk_bytes) {
            schedule.sends.push(SendStep {
                peer: to,
                range,
                after_recv: None,
            });
        }
        for range in chunks(segment(count, n, from), elem_size, max_chunk_bytes) {
            schedule.recvs.push(RecvStep {
                peer: from,
                range,
                action: RecvAction::Store,
                after_send: None,
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
    fn every_block_reaches_its_rank() {
        for n in 1usize..=9 {
            for per_rank in [0, 1, 3, 50] {
                for chunk in [4, 40, 1 << 20] {
                    let count = per_rank * n;
                    simulate(n, count, CollectiveKind::AllToAll, None, |rank| {
                        pairwise_all_to_all(rank, n, count, 4, chunk)
                    });
                }
            }
        }
    }
}
