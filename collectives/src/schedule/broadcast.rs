//! Broadcast schedules: a binomial tree for latency, a pipelined chain for bandwidth.

use super::{chunks, RecvAction, RecvStep, Schedule, SendStep};

/// Broadcast along the chain `root → root+1 → … → root−1`, chunk by chunk: each rank
/// forwards a chunk as soon as it has it, so a large buffer crosses the chain in about one
/// buffer time plus one chunk time per hop.
pub fn chain_broadcast(
    rank: usize,
    world_size: usize,
    root: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let n = world_size;
    let mut schedule = Schedule::default();
    if n <= 1 {
        return schedule;
    }
    let position = (rank + n - root) % n;
    let pieces: Vec<_> = chunks(0..count, elem_size, max_chunk_bytes).collect();
    if position != 0 {
        for range in &pieces {
            schedule.recvs.push(RecvStep {
                peer: (rank + n - 1) % n,
                range: range.clone(),
                action: RecvAction::Store,
                after_send: None,
            });
        }
    }
    if position != n - 1 {
        for (j, range) in pieces.into_iter().enumerate() {
            schedule.sends.push(SendStep {
                peer: (rank + 1) % n,
                range,
                after_recv: (position != 0).then_some(j),
            });
        }
    }
    schedule
}

/// Broadcast down a binomial tree rooted at `root`: `⌈log2 N⌉` hops, the latency-optimal
/// choice for small buffers. Each rank receives from its parent and forwards to its
/// children, largest subtree first; chunks are pipelined the same way.
pub fn binomial_tree_broadcast(
    rank: usize,
    world_size: usize,
    root: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let n = world_size;
    let mut schedule = Schedule::default();
    if n <= 1 {
        return schedule;
    }
    let relative = (rank + n - root) % n;
    let absolute = |v: usize| (v + root) % n;
    // The lowest set bit of `relative` bounds this rank's subtree; the root's spans all.
    let span = if relative == 0 {
        n.next_power_of_two()
    } else {
        relative & relative.wrapping_neg()
    };
    let mut children = Vec::new();
    let mut mask = span >> 1;
    while mask > 0 {
        if relative + mask < n {
            children.push(absolute(relative + mask));
        }
        mask >>= 1;
    }
    let pieces: Vec<_> = chunks(0..count, elem_size, max_chunk_bytes).collect();
    if relative != 0 {
        let parent = absolute(relative - span);
        for range in &pieces {
            schedule.recvs.push(RecvStep {
                peer: parent,
                range: range.clone(),
                action: RecvAction::Store,
                after_send: None,
            });
        }
    }
    for (j, range) in pieces.iter().enumerate() {
        for &child in &children {
            schedule.sends.push(SendStep {
                peer: child,
                range: range.clone(),
                after_recv: (relative != 0).then_some(j),
            });
        }
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::super::sim::simulate;
    use super::*;
    use crate::CollectiveKind;

    #[test]
    fn chain_and_tree_deliver_the_root_buffer_everywhere() {
        for n in 1..=9 {
            for root in 0..n {
                for count in [0, 1, 5, 100] {
                    for chunk_bytes in [4, 40, 1 << 20] {
                        simulate(n, count, CollectiveKind::Broadcast, Some(root), |rank| {
                            chain_broadcast(rank, n, root, count, 4, chunk_bytes)
                        });
                        simulate(n, count, CollectiveKind::Broadcast, Some(root), |rank| {
                            binomial_tree_broadcast(rank, n, root, count, 4, chunk_bytes)
                        });
                    }
                }
            }
        }
    }

    #[test]
    fn tree_depth_is_logarithmic() {
        // In a binomial tree every rank's parent has a smaller relative rank, and the
        // number of hops from the root is the number of set bits of the relative rank.
        let n = 8;
        for rank in 1..n {
            let s = binomial_tree_broadcast(rank, n, 0, 1, 4, 64);
            let parent = s.recvs[0].peer;
            assert!(parent < rank);
            assert_eq!(parent, rank & (rank - 1));
        }
        let root = binomial_tree_broadcast(0, n, 0, 1, 4, 64);
        let kids: Vec<_> = root.sends.iter().map(|s| s.peer).collect();
        assert_eq!(kids, vec![4, 2, 1]);
    }
}
