//! Broadcast schedules: a binomial tree for latency, a pipelined chain for bandwidth.

use std::ops::Range;

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
    let members: Vec<usize> = (0..n).map(|p| (root + p) % n).collect();
    let pieces: Vec<_> = chunks(0..count, elem_size, max_chunk_bytes).collect();
    chain_over(&mut schedule, &members, (rank + n - root) % n, &pieces);
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
    let members: Vec<usize> = (0..n).map(|p| (root + p) % n).collect();
    let pieces: Vec<_> = chunks(0..count, elem_size, max_chunk_bytes).collect();
    tree_over(
        &mut schedule,
        &members,
        (rank + n - root) % n,
        &pieces,
        None,
    );
    schedule
}

/// Appends to `schedule` this rank's part of a chain broadcast of `pieces` along
/// `members` (the root first; this rank at position `me`).
pub(super) fn chain_over(
    schedule: &mut Schedule,
    members: &[usize],
    me: usize,
    pieces: &[Range<usize>],
) {
    let base = schedule.recvs.len();
    if let Some(&from) = me.checked_sub(1).and_then(|p| members.get(p)) {
        for range in pieces {
            schedule.recvs.push(RecvStep {
                peer: from,
                range: range.clone(),
                action: RecvAction::Store,
                after_send: None,
            });
        }
    }
    if let Some(&to) = members.get(me + 1) {
        for (j, range) in pieces.iter().enumerate() {
            schedule.sends.push(SendStep {
                peer: to,
                range: range.clone(),
                after_recv: (me != 0).then_some(base + j),
            });
        }
    }
}

/// Appends to `schedule` this rank's part of a binomial-tree broadcast of `pieces` over
/// `members` (the root first; this rank at position `me`). A root whose pieces arrive
/// earlier in `schedule` passes `after`, the receive of each piece, for its sends to wait
/// on. Returns the receives of the pieces, when this rank is not the root.
pub(super) fn tree_over(
    schedule: &mut Schedule,
    members: &[usize],
    me: usize,
    pieces: &[Range<usize>],
    after: Option<&[usize]>,
) -> Option<Vec<usize>> {
    let n = members.len();
    // The lowest set bit of `me` bounds this rank's subtree; the root's spans all.
    let span = if me == 0 {
        n.next_power_of_two()
    } else {
        me & me.wrapping_neg()
    };
    let mut children = Vec::new();
    let mut mask = span >> 1;
    while mask > 0 {
        if let Some(&child) = members.get(me + mask) {
            children.push(child);
        }
        mask >>= 1;
    }
    let received = match me.checked_sub(span).and_then(|p| members.get(p)) {
        Some(&parent) if me != 0 => {
            let mut indices = Vec::with_capacity(pieces.len());
            for range in pieces {
                indices.push(schedule.recvs.len());
                schedule.recvs.push(RecvStep {
                    peer: parent,
                    range: range.clone(),
                    action: RecvAction::Store,
                    after_send: None,
                });
            }
            Some(indices)
        }
        _ => None,
    };
    let waits = received.as_deref().or(after);
    for (j, range) in pieces.iter().enumerate() {
        for &child in &children {
            schedule.sends.push(SendStep {
                peer: child,
                range: range.clone(),
                after_recv: waits.and_then(|w| w.get(j).copied()),
            });
        }
    }
    received
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
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
