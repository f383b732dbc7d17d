//! Ring algorithms around `rank → rank+1 → … → rank−1 → rank`: reduce-scatter,
//! all-gather, their composition all-reduce, and reduce (reduce-scatter, then every
//! segment's owner sends it to the root).
//!
//! The buffer is cut into `world_size` segments. With ownership shift `s`, rank `r` ends
//! the reduce-scatter owning segment `r+s`: in step `k` it sends segment `r+s−1−k` to
//! `r+1` and receives segment `r+s−2−k` from `r−1`, folding the incoming partial result
//! in front of its own value. Every segment is therefore reduced in one fixed order
//! (around the ring, starting after its owner) on exactly one rank; the all-gather then
//! copies those bytes around the ring, so every rank ends with bit-identical results no
//! matter how the floating-point operations round.
//!
//! Segments are cut into chunks, and the send of a chunk at step `k+1` waits only for the
//! receive of the same chunk at step `k`: the ring is pipelined chunk by chunk, with
//! sending, receiving and reducing overlapping.

use std::ops::Range;

use super::{chunks, segment, RecvAction, RecvStep, Schedule, SendStep};

/// What one ring phase does with what it receives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Reduce-scatter: fold it in, as the final reduction at the phase's last step when
    /// `last` (no later phase reduces these elements further).
    ReduceScatter { last: bool },
    /// All-gather: store it.
    AllGather,
}

/// One phase of a ring over `members` (ranks in ring order, this rank at position `me`),
/// whose segment at position `v` is the element ranges `pieces[v]`, already cut into
/// chunks. With ownership shift `shift`, this rank ends the reduce-scatter owning segment
/// `me + shift`: in step `k` it sends segment `me + shift − 1 − k` to the next member and
/// receives segment `me + shift − 2 − k` from the previous one (the all-gather sends
/// `me + shift − k` and receives `me + shift − 1 − k`).
pub(super) struct RingOver<'a> {
    pub(super) members: &'a [usize],
    pub(super) me: usize,
    pub(super) pieces: &'a [Vec<Range<usize>>],
    pub(super) shift: usize,
}

impl RingOver<'_> {
    /// `me + shift − k` modulo the ring's size, for any k.
    fn seg(&self, k: usize) -> usize {
        let n = self.members.len();
        (self.me + self.shift + n - k % n) % n
    }

    /// The segment the phase's first step sends (the one `prev` in
    /// [`RingOver::push_phase`] is about).
    pub(super) fn first_sent(&self, phase: Phase) -> usize {
        match phase {
            Phase::ReduceScatter { .. } => self.seg(1),
            Phase::AllGather => self.seg(0),
        }
    }

    /// Appends the phase (one step fewer than members) to `schedule`. `prev` holds the
    /// receive index each chunk of the segment the first step sends must wait for, if
    /// any. Returns the receive indices of the phase's last step, chunk by chunk.
    pub(super) fn push_phase(
        &self,
        schedule: &mut Schedule,
        phase: Phase,
        mut prev: Option<Vec<usize>>,
    ) -> Vec<usize> {
        let n = self.members.len();
        let mut last = Vec::new();
        if n < 2 {
            return last;
        }
        let next = self.members[(self.me + 1) % n];
        let from = self.members[(self.me + n - 1) % n];
        for step in 0..n - 1 {
            let (send_seg, recv_seg, action) = match phase {
                Phase::ReduceScatter { last } => (
                    self.seg(step + 1),
                    self.seg(step + 2),
                    RecvAction::Reduce {
                        last: last && step == n - 2,
                        incoming_first: true,
                    },
                ),
                Phase::AllGather => (self.seg(step), self.seg(step + 1), RecvAction::Store),
            };
            for (j, range) in self.pieces[send_seg].iter().enumerate() {
                schedule.sends.push(SendStep {
                    peer: next,
                    range: range.clone(),
                    // What is sent at step k+1 is what was received at step k.
                    after_recv: prev.as_ref().and_then(|p| p.get(j).copied()),
                });
            }
            last.clear();
            for range in &self.pieces[recv_seg] {
                last.push(schedule.recvs.len());
                schedule.recvs.push(RecvStep {
                    peer: from,
                    range: range.clone(),
                    action,
                    after_send: None,
                });
            }
            prev = Some(last.clone());
        }
        last
    }
}

/// Rank `rank`'s schedule for a ring all-reduce of `count` elements of `elem_size` bytes
/// over `world_size` ranks, with chunks of at most `max_chunk_bytes`.
pub fn ring_all_reduce(
    rank: usize,
    world_size: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    ring_over(
        RingCollective::AllReduce,
        rank,
        &in_rank_order(world_size),
        count,
        elem_size,
        max_chunk_bytes,
    )
}

/// The ranks `0..world_size`, the plain ring's order.
fn in_rank_order(world_size: usize) -> Vec<usize> {
    (0..world_size).collect()
}

/// The ring order for ranks on the hosts `host_of` gives (`host_of[r]`: a label, equal
/// for ranks of one host): host by host, hosts in the order of their lowest rank, ranks in
/// order within each. A ring in this order enters and leaves each host once, however the
/// launcher placed the ranks; with ranks numbered host by host it is the rank order.
///
/// ```
/// use ringccl_collectives::schedule::ring_order;
/// assert_eq!(ring_order(&[0, 1, 0, 1]), [0, 2, 1, 3]);
/// assert_eq!(ring_order(&[7, 7, 3, 3]), [0, 1, 2, 3]);
/// ```
pub fn ring_order(host_of: &[usize]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..host_of.len()).collect();
    // Each host's position: the lowest rank on it.
    let first = |label: usize| host_of.iter().position(|&h| h == label).unwrap_or(0);
    order.sort_by_key(|&r| (first(host_of[r]), r));
    order
}

/// Which schedule [`ring_over`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingCollective {
    /// Reduce-scatter, then all-gather.
    AllReduce,
    /// Rank `r` ends owning the reduction of block `r`.
    ReduceScatter,
    /// Rank `r` contributes block `r`; every rank ends with all of them.
    AllGather,
}

/// A ring `collective` around `order` (every rank once, e.g. [`ring_order`]); otherwise
/// as [`ring_all_reduce`], [`ring_reduce_scatter`] or [`ring_all_gather`], which are this
/// around the ranks in order.
///
/// ```
/// use ringccl_collectives::schedule::{ring_all_reduce, ring_over, RingCollective};
/// let all_reduce = RingCollective::AllReduce;
/// assert_eq!(ring_over(all_reduce, 1, &[0, 1, 2], 10, 4, 64), ring_all_reduce(1, 3, 10, 4, 64));
/// ```
pub fn ring_over(
    collective: RingCollective,
    rank: usize,
    order: &[usize],
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let single = match collective {
        RingCollective::AllReduce => None,
        RingCollective::ReduceScatter => Some(Phase::ReduceScatter { last: true }),
        RingCollective::AllGather => Some(Phase::AllGather),
    };
    let mut schedule = Schedule::default();
    push_ordered(
        &mut schedule,
        rank,
        order,
        count,
        elem_size,
        max_chunk_bytes,
        single,
    );
    schedule
}

/// Appends to `schedule` a ring around `order`: both phases (an all-reduce) when
/// `single` is `None`, else that one phase, with each rank owning its own block. Returns
/// the receive indices of its last step, chunk by chunk (what completes the block this
/// rank owns after a reduce-scatter).
fn push_ordered(
    schedule: &mut Schedule,
    rank: usize,
    order: &[usize],
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
    single: Option<Phase>,
) -> Vec<usize> {
    let n = order.len();
    let Some(me) = order.iter().position(|&r| r == rank).filter(|_| n > 1) else {
        return Vec::new();
    };
    // The segment at position v is block `order[v]`: its owner's own block.
    let pieces: Vec<Vec<Range<usize>>> = order
        .iter()
        .map(|&owner| chunks(segment(count, n, owner), elem_size, max_chunk_bytes).collect())
        .collect();
    let ring = |shift| RingOver {
        members: order,
        me,
        pieces: &pieces,
        shift,
    };
    match single {
        Some(phase) => ring(0).push_phase(schedule, phase, None),
        None => {
            let owned = ring(1).push_phase(schedule, Phase::ReduceScatter { last: true }, None);
            ring(1).push_phase(schedule, Phase::AllGather, Some(owned))
        }
    }
}

/// Ring reduce-scatter over a buffer of `world_size` equal blocks: afterwards rank `r`'s
/// block `r` holds the reduction of every rank's block `r` (other blocks hold partial
/// results).
pub fn ring_reduce_scatter(
    rank: usize,
    world_size: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    ring_over(
        RingCollective::ReduceScatter,
        rank,
        &in_rank_order(world_size),
        count,
        elem_size,
        max_chunk_bytes,
    )
}

/// Ring all-gather over a buffer of `world_size` blocks where rank `r` starts with its
/// own block `r` in place: afterwards every rank holds every block.
pub fn ring_all_gather(
    rank: usize,
    world_size: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    ring_over(
        RingCollective::AllGather,
        rank,
        &in_rank_order(world_size),
        count,
        elem_size,
        max_chunk_bytes,
    )
}

/// Reduce to `root`: a ring reduce-scatter, then every rank sends the segment it owns to
/// the root. Bandwidth-optimal; only the root's buffer holds the result afterwards (the
/// others hold partial results).
pub fn ring_reduce(
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
    let owned = push_ordered(
        &mut schedule,
        rank,
        &in_rank_order(n),
        count,
        elem_size,
        max_chunk_bytes,
        Some(Phase::ReduceScatter { last: true }),
    );
    if rank != root {
        for (j, range) in chunks(segment(count, n, rank), elem_size, max_chunk_bytes).enumerate() {
            schedule.sends.push(SendStep {
                peer: root,
                range,
                after_recv: Some(owned[j]),
            });
        }
    } else {
        for owner in (0..n).filter(|&q| q != root) {
            for range in chunks(segment(count, n, owner), elem_size, max_chunk_bytes) {
                schedule.recvs.push(RecvStep {
                    peer: owner,
                    range,
                    action: RecvAction::Store,
                    after_send: None,
                });
            }
        }
    }
    schedule
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::CollectiveKind;

    fn shapes() -> impl Iterator<Item = (usize, usize, usize)> {
        (1usize..=9).flat_map(|n| {
            [0, 1, 2, n.saturating_sub(1), n, n + 1, 7, 64, 1001]
                .into_iter()
                .flat_map(move |count| [4, 12, 64, 1 << 20].into_iter().map(move |c| (n, count, c)))
        })
    }

    #[test]
    fn ring_all_reduce_is_correct_and_deadlock_free_for_every_shape() {
        for (n, count, chunk) in shapes() {
            simulate(n, count, CollectiveKind::AllReduce, None, |rank| {
                ring_all_reduce(rank, n, count, 4, chunk)
            });
        }
    }

    #[test]
    fn ring_halves_and_reduce_are_correct_for_every_shape() {
        for (n, count, chunk) in shapes() {
            let blocks = count * n;
            simulate(n, blocks, CollectiveKind::ReduceScatter, None, |rank| {
                ring_reduce_scatter(rank, n, blocks, 4, chunk)
            });
            simulate(n, blocks, CollectiveKind::AllGather, None, |rank| {
                ring_all_gather(rank, n, blocks, 4, chunk)
            });
            for root in [0, n / 2, n - 1] {
                simulate(n, count, CollectiveKind::Reduce, Some(root), |rank| {
                    ring_reduce(rank, n, root, count, 4, chunk)
                });
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
            .filter(|r| matches!(r.action, RecvAction::Reduce { last: true, .. }))
            .collect();
        // Rank 1 completes segment 2 (elements 6..8 of 10 split 3,3,2,2).
        assert_eq!(finals.len(), 1);
        assert_eq!(finals[0].range, 6..8);
        assert_eq!(s.sends[0].range, 3..6);
        assert_eq!(s.sends[0].after_recv, None);
        assert_eq!(s.sends[1].after_recv, Some(0));
    }

    #[test]
    fn rings_in_any_order_are_correct_and_a_host_ordered_ring_crosses_hosts_least() {
        for host_of in [
            &[0, 1, 0, 1][..],
            &[0, 1, 2, 0, 1, 2],
            &[0, 0, 1],
            &[1, 0, 1, 0, 0],
        ] {
            let order = ring_order(host_of);
            let n = host_of.len();
            for count in [0, 1, 5, 64, 1001] {
                for chunk in [4, 64, 1 << 20] {
                    simulate(n, count, CollectiveKind::AllReduce, None, |rank| {
                        ring_over(RingCollective::AllReduce, rank, &order, count, 4, chunk)
                    });
                    let blocks = count * n;
                    simulate(n, blocks, CollectiveKind::ReduceScatter, None, |rank| {
                        ring_over(
                            RingCollective::ReduceScatter,
                            rank,
                            &order,
                            blocks,
                            4,
                            chunk,
                        )
                    });
                    simulate(n, blocks, CollectiveKind::AllGather, None, |rank| {
                        ring_over(RingCollective::AllGather, rank, &order, blocks, 4, chunk)
                    });
                }
            }
        }
        // Interleaved ranks on two hosts: the rank-order ring crosses on every hop, the
        // host-ordered one twice.
        let host_of = [0, 1, 0, 1, 0, 1];
        let crossings = |schedules: Vec<Schedule>| -> usize {
            schedules
                .iter()
                .enumerate()
                .map(|(r, s)| {
                    usize::from(
                        s.sends
                            .first()
                            .is_some_and(|x| host_of[x.peer] != host_of[r]),
                    )
                })
                .sum()
        };
        let order = ring_order(&host_of);
        let plain = (0..6)
            .map(|r| ring_all_reduce(r, 6, 60, 4, 1 << 20))
            .collect();
        let ordered = (0..6)
            .map(|r| ring_over(RingCollective::AllReduce, r, &order, 60, 4, 1 << 20))
            .collect();
        assert_eq!((crossings(plain), crossings(ordered)), (6, 2));
        // Rank-numbered hosts: the same schedule as the plain ring.
        let contiguous = ring_order(&[0, 0, 1, 1]);
        for rank in 0..4 {
            assert_eq!(
                ring_over(RingCollective::AllReduce, rank, &contiguous, 100, 4, 64),
                ring_all_reduce(rank, 4, 100, 4, 64)
            );
        }
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
