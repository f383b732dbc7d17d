//! Ring all-reduce: reduce-scatter, then all-gather, around the ring
//! `rank → rank+1 → … → rank−1 → rank`.
//!
//! The buffer is cut into `world_size` segments. In reduce-scatter step `k` rank `r` sends
//! segment `r−k` to `r+1` and receives segment `r−k−1` from `r−1`, reducing it into its
//! own copy; after `N−1` steps rank `r` holds the complete result of segment `r+1`, which
//! was reduced in one fixed order (starting at rank `s` for segment `s` and going around
//! the ring). The all-gather then copies those bytes around the ring, so every rank ends
//! with bit-identical results no matter how the floating-point operations round.
//!
//! Segments are cut into chunks, and the send of a chunk at step `k+1` waits only for the
//! receive of the same chunk at step `k`: the ring is pipelined chunk by chunk, with
//! sending, receiving and reducing overlapping.

use super::{chunks, segment, RecvAction, RecvStep, Schedule, SendStep};

/// Segments smaller than this are not worth cutting into more than one chunk.
pub const RING_MIN_CHUNKS_BYTES: usize = 64 * 1024;

/// Rank `rank`'s schedule for a ring all-reduce of `count` elements of `elem_size` bytes
/// over `world_size` ranks, with chunks of at most `max_chunk_bytes`.
pub fn ring_all_reduce(
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
    let next = (rank + 1) % n;
    let prev = (rank + n - 1) % n;
    // `r − k` modulo n, for any k.
    let back = |k: usize| (rank + n - k % n) % n;
    let mut prev_step_recvs: Vec<usize> = Vec::new();
    for step in 0..2 * (n - 1) {
        let (send_seg, recv_seg, action) = if step < n - 1 {
            (
                back(step),
                back(step + 1),
                RecvAction::Reduce {
                    last: step == n - 2,
                },
            )
        } else {
            let k = step - (n - 1);
            ((back(k) + 1) % n, back(k), RecvAction::Store)
        };
        let send_range = segment(count, n, send_seg);
        for (j, range) in chunks(send_range, elem_size, max_chunk_bytes).enumerate() {
            schedule.sends.push(SendStep {
                peer: next,
                range,
                // What is sent at step k+1 is what was received (and reduced) at step k.
                after_recv: (step > 0).then(|| prev_step_recvs[j]),
            });
        }
        prev_step_recvs.clear();
        for range in chunks(segment(count, n, recv_seg), elem_size, max_chunk_bytes) {
            prev_step_recvs.push(schedule.recvs.len());
            schedule.recvs.push(RecvStep {
                peer: prev,
                range,
                action,
            });
        }
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::super::sim::{simulate, Collective};
    use super::*;

    #[test]
    fn ring_all_reduce_is_correct_and_deadlock_free_for_every_shape() {
        for n in 1usize..=9 {
            for count in [0, 1, 2, n.saturating_sub(1), n, n + 1, 7, 64, 1001] {
                for chunk_bytes in [4, 12, 64, 1 << 20] {
                    simulate(n, count, Collective::AllReduce, |rank| {
                        ring_all_reduce(rank, n, count, 4, chunk_bytes)
                    });
                }
            }
        }
    }

    #[test]
    fn each_range_is_reduced_once_finally_and_received_once_per_step() {
        let (n, count) = (4, 10);
        let s = ring_all_reduce(1, n, count, 4, 1 << 20);
        assert_eq!(s.sends.len(), 2 * (n - 1));
        assert_eq!(s.recvs.len(), 2 * (n - 1));
        assert!(s.sends.iter().all(|x| x.peer == 2));
        assert!(s.recvs.iter().all(|x| x.peer == 0));
        let finals: Vec<_> = s
            .recvs
            .iter()
            .filter(|r| r.action == RecvAction::Reduce { last: true })
            .collect();
        // Rank 1 completes segment 2 (elements 6..8 of 10 split 3,3,2,2).
        assert_eq!(finals.len(), 1);
        assert_eq!(finals[0].range, 6..8);
        assert_eq!(s.sends[0].range, 3..6);
        assert_eq!(s.sends[0].after_recv, None);
        assert_eq!(s.sends[1].after_recv, Some(0));
    }

    #[test]
    fn large_segments_are_chunked() {
        let s = ring_all_reduce(0, 2, 1 << 20, 4, 1 << 20);
        // Each 2 MiB segment becomes two 1 MiB chunks, for one RS and one AG step.
        assert_eq!(s.sends.len(), 4);
        assert!(s.sends.iter().all(|x| x.range.len() == 1 << 18));
        assert_eq!(s.max_reduce_len(), 1 << 18);
    }
}
