//! The hierarchical all-reduce, for groups that span hosts with several ranks on a host
//! (as NCCL and Horovod run it):
//!
//! 1. a ring reduce-scatter inside each host (over shared memory);
//! 2. a ring all-reduce of each shard across the hosts, every local rank driving its own
//!    shard at once (over the network);
//! 3. a ring all-gather inside each host.
//!
//! A host's link then carries about 2(M−1)/M of the buffer for M hosts, where a flat
//! ring over all N ranks sends 2(N−1)/N of it through each host's link.
//!
//! The buffer is cut into `G` segments, `G` the most ranks any host has. On a host of `L`
//! ranks, local rank `j` owns the segments `g` with `g mod L = j` (all of them on a host
//! of one). Step 1 reduces each segment onto its owner (the host's ranks around their
//! ring, in one fixed order); step 2 runs, for each segment, a ring all-reduce among its
//! owners on every host, in host order, whose reduce-scatter makes the final reduction;
//! step 3 copies the results around each host. Every element is therefore reduced in one
//! fixed order on one rank and copied everywhere else: bit-identical on every rank,
//! whatever the hosts' sizes. Uneven hosts are fine: a rank owning several segments takes
//! part in one cross-host ring per segment, in segment order on every rank.

use std::ops::Range;

use super::barrier::dissemination_over;
use super::broadcast::{chain_over, tree_over};
use super::ring::{Phase, RingOver};
use super::{
    binomial_tree_broadcast, chain_broadcast, chunks, dissemination_barrier, latest_recv_writing,
    ring_all_reduce, segment, RecvAction, RecvStep, Schedule, SendStep,
};
use crate::transport::spans_hosts;

/// For each range of the segment `ring` sends first in `phase`, the receive among
/// `recvs[from..]` it must wait for ([`latest_recv_writing`]). `None` when some range has
/// no such receive (nothing before it to wait for).
fn waits_for(
    ring: &RingOver<'_>,
    phase: Phase,
    recvs: &[RecvStep],
    from: usize,
) -> Option<Vec<usize>> {
    ring.pieces[ring.first_sent(phase)]
        .iter()
        .map(|range| latest_recv_writing(recvs, from, range))
        .collect()
}

/// Rank `rank`'s part of a hierarchical all-reduce of `count` elements of `elem_size`
/// bytes, in chunks of at most `max_chunk_bytes`, for ranks on the hosts `host_of` gives
/// (`host_of[r]`: any label of rank r's host, the same for every rank of it). With one
/// host, or one rank on every host, it is the flat ring.
///
/// ```
/// use ringccl_collectives::schedule::hierarchical_all_reduce;
///
/// // Two hosts of two ranks: rank 0 reduces with rank 1 (its host), then with rank 2.
/// let s = hierarchical_all_reduce(0, &[0, 0, 1, 1], 1000, 4, 1 << 20);
/// let peers: Vec<usize> = s.sends.iter().map(|send| send.peer).collect();
/// assert_eq!(peers, [1, 2, 2, 1]);
/// ```
pub fn hierarchical_all_reduce(
    rank: usize,
    host_of: &[usize],
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
) -> Schedule {
    let n = host_of.len();
    let Some(topology) = Topology::spanning(host_of) else {
        return ring_all_reduce(rank, n, count, elem_size, max_chunk_bytes);
    };
    let Some((host, local_index)) = topology.place(rank) else {
        return Schedule::default();
    };
    let local = &topology.hosts[host];
    let segments = topology.widest;
    let cut = |range: Range<usize>| -> Vec<Range<usize>> {
        chunks(range, elem_size, max_chunk_bytes).collect()
    };
    // The host's ring works on "virtual segments": local rank v's, the segments it owns.
    let owned_by = |v: usize| (0..segments).filter(move |g| g % local.len() == v);
    let local_pieces: Vec<Vec<Range<usize>>> = (0..local.len())
        .map(|v| {
            owned_by(v)
                .flat_map(|g| cut(segment(count, segments, g)))
                .collect()
        })
        .collect();
    let inside = RingOver {
        members: local,
        me: local_index,
        pieces: &local_pieces,
        shift: 0,
    };
    let mut schedule = Schedule::default();
    // 1. Reduce-scatter inside the host: this rank ends with its segments' host sums.
    inside.push_phase(&mut schedule, Phase::ReduceScatter { last: false }, None);
    let crossing_starts = schedule.recvs.len();
    // 2. Each owned segment, all-reduced with its owners on the other hosts.
    for g in owned_by(local_index) {
        let members: Vec<usize> = topology
            .hosts
            .iter()
            .map(|ranks| ranks[g % ranks.len()])
            .collect();
        let range = segment(count, segments, g);
        let pieces: Vec<Vec<Range<usize>>> = (0..members.len())
            .map(|v| {
                let part = segment(range.len(), members.len(), v);
                cut(range.start + part.start..range.start + part.end)
            })
            .collect();
        let across = RingOver {
            members: &members,
            me: host,
            pieces: &pieces,
            shift: 1,
        };
        // Each chunk it sends first waits for the host's sum of its elements (step 1's
        // receive that completes them), so the crossing starts with the first chunk.
        let reduce = Phase::ReduceScatter { last: true };
        let host_sums = waits_for(&across, reduce, &schedule.recvs, 0);
        let owned = across.push_phase(&mut schedule, reduce, host_sums);
        across.push_phase(&mut schedule, Phase::AllGather, Some(owned));
    }
    // 3. All-gather inside the host: each chunk of this rank's segments goes round once
    // step 2 has completed its elements.
    let complete = waits_for(&inside, Phase::AllGather, &schedule.recvs, crossing_starts);
    inside.push_phase(&mut schedule, Phase::AllGather, complete);
    schedule
}

/// Rank `rank`'s part of a broadcast from `root` for ranks on the hosts `host_of` gives:
/// the buffer crosses to each other host once, then fans out inside it. Pipelined
/// (`pipelined`, for large buffers): one chain through the root's host, then host after
/// host. Otherwise a binomial tree among one leader per host (the root on its own host,
/// the lowest rank on the others), then a binomial tree inside each host. With one host,
/// or one rank on every host, the flat chain or tree.
///
/// ```
/// use ringccl_collectives::schedule::hierarchical_broadcast;
///
/// // Two hosts of two ranks, root 1: rank 1 sends to rank 0 (its host) and rank 2.
/// let s = hierarchical_broadcast(1, &[0, 0, 1, 1], 1, 100, 4, 1 << 20, false);
/// let peers: Vec<usize> = s.sends.iter().map(|send| send.peer).collect();
/// assert_eq!(peers, [2, 0]);
/// ```
pub fn hierarchical_broadcast(
    rank: usize,
    host_of: &[usize],
    root: usize,
    count: usize,
    elem_size: usize,
    max_chunk_bytes: usize,
    pipelined: bool,
) -> Schedule {
    let n = host_of.len();
    let flat = || match pipelined {
        true => chain_broadcast(rank, n, root, count, elem_size, max_chunk_bytes),
        false => binomial_tree_broadcast(rank, n, root, count, elem_size, max_chunk_bytes),
    };
    let Some(topology) = Topology::spanning(host_of) else {
        return flat();
    };
    let (Some((root_host, _)), Some((host, _))) = (topology.place(root), topology.place(rank))
    else {
        return Schedule::default();
    };
    let hosts = topology.hosts.len();
    // Hosts from the root's on, each with its leader first.
    let order: Vec<usize> = (0..hosts).map(|k| (root_host + k) % hosts).collect();
    let leader_first = |h: usize| -> Vec<usize> {
        let mut ranks = topology.hosts[h].clone();
        if h == root_host {
            ranks.retain(|&r| r != root);
            ranks.insert(0, root);
        }
        ranks
    };
    let pieces: Vec<Range<usize>> = chunks(0..count, elem_size, max_chunk_bytes).collect();
    let mut schedule = Schedule::default();
    let position = |members: &[usize]| members.iter().position(|&r| r == rank);
    if pipelined {
        let members: Vec<usize> = order.iter().flat_map(|&h| leader_first(h)).collect();
        if let Some(me) = position(&members) {
            chain_over(&mut schedule, &members, me, &pieces);
        }
    } else {
        let leaders: Vec<usize> = order.iter().map(|&h| leader_first(h)[0]).collect();
        let received =
            position(&leaders).and_then(|me| tree_over(&mut schedule, &leaders, me, &pieces, None));
        let local = leader_first(host);
        if let Some(me) = position(&local) {
            tree_over(&mut schedule, &local, me, &pieces, received.as_deref());
        }
    }
    schedule
}

/// Rank `rank`'s part of a barrier for ranks on the hosts `host_of` gives: each host's
/// ranks signal its leader (the lowest rank there), the leaders run a dissemination
/// barrier among themselves, then each leader releases its ranks. One crossing per host
/// and round, where a flat dissemination barrier crosses hosts in every round. With one
/// host, or one rank on every host, the flat dissemination barrier.
///
/// ```
/// use ringccl_collectives::schedule::hierarchical_barrier;
///
/// // Rank 1 signals its leader, rank 0, and waits for its release.
/// let s = hierarchical_barrier(1, &[0, 0, 1, 1]);
/// assert_eq!((s.sends[0].peer, s.recvs[0].peer), (0, 0));
/// ```
pub fn hierarchical_barrier(rank: usize, host_of: &[usize]) -> Schedule {
    let Some(topology) = Topology::spanning(host_of) else {
        return dissemination_barrier(rank, host_of.len());
    };
    let Some((host, index)) = topology.place(rank) else {
        return Schedule::default();
    };
    let local = &topology.hosts[host];
    let mut schedule = Schedule::default();
    let signal = |peer: usize, after_recv: Option<usize>| SendStep {
        peer,
        range: 0..0,
        after_recv,
    };
    let hear = |peer: usize| RecvStep {
        peer,
        range: 0..0,
        action: RecvAction::Store,
        after_send: None,
    };
    if index != 0 {
        schedule.sends.push(signal(local[0], None));
        schedule.recvs.push(hear(local[0]));
        return schedule;
    }
    for &r in &local[1..] {
        schedule.recvs.push(hear(r));
    }
    let arrived = schedule.recvs.len().checked_sub(1);
    let leaders: Vec<usize> = topology.hosts.iter().map(|ranks| ranks[0]).collect();
    dissemination_over(&mut schedule, &leaders, host, arrived);
    let everyone = schedule.recvs.len().checked_sub(1);
    for &r in &local[1..] {
        schedule.sends.push(signal(r, everyone));
    }
    schedule
}

/// The ranks of each host, hosts in the order of their lowest rank, ranks in order.
struct Topology {
    hosts: Vec<Vec<usize>>,
    /// The most ranks on one host.
    widest: usize,
}

impl Topology {
    fn new(host_of: &[usize]) -> Option<Topology> {
        let mut hosts: Vec<(usize, Vec<usize>)> = Vec::new();
        for (rank, &label) in host_of.iter().enumerate() {
            match hosts.iter_mut().find(|(l, _)| *l == label) {
                Some((_, ranks)) => ranks.push(rank),
                None => hosts.push((label, vec![rank])),
            }
        }
        let hosts: Vec<Vec<usize>> = hosts.into_iter().map(|(_, ranks)| ranks).collect();
        let widest = hosts.iter().map(Vec::len).max()?;
        Some(Topology { hosts, widest })
    }

    /// The topology of `host_of` when it spans several hosts with several ranks on at
    /// least one ([`spans_hosts`]): where the hierarchical schedules differ from the flat
    /// ones.
    fn spanning(host_of: &[usize]) -> Option<Topology> {
        spans_hosts(host_of)
            .then(|| Topology::new(host_of))
            .flatten()
    }

    /// `rank`'s host and its position among the host's ranks.
    fn place(&self, rank: usize) -> Option<(usize, usize)> {
        self.hosts.iter().enumerate().find_map(|(host, ranks)| {
            let index = ranks.iter().position(|&r| r == rank)?;
            Some((host, index))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::RecvAction;
    use crate::sim::simulate;
    use crate::CollectiveKind;

    /// Hosts of every shape the tests prove: even, uneven, interleaved ranks.
    const LAYOUTS: &[&[usize]] = &[
        &[0, 0, 1, 1],
        &[0, 0, 1],
        &[0, 1, 1],
        &[0, 0, 1, 2],
        &[0, 0, 0, 1, 1],
        &[0, 1, 0, 1],
        &[5, 5, 5, 5, 9, 9, 9, 9],
        &[0, 0, 1, 1, 2, 2],
        &[0, 0, 0, 1],
        &[2, 0, 1, 0, 2, 2, 1],
        &[0, 0],
        &[0, 1, 2],
    ];

    #[test]
    fn every_layout_and_size_reduces_once_in_one_order_without_deadlock() {
        for &host_of in LAYOUTS {
            let n = host_of.len();
            for count in [0, 1, 2, 3, 5, 7, 64, 1001] {
                for chunk in [4, 12, 64, 1 << 20] {
                    simulate(n, count, CollectiveKind::AllReduce, None, |rank| {
                        hierarchical_all_reduce(rank, host_of, count, 4, chunk)
                    });
                }
            }
        }
    }

    #[test]
    fn only_the_owners_cross_hosts_and_each_crossing_carries_a_shard() {
        // 2 hosts x 2 ranks, 1000 elements: rank 0 owns segment 0 (elements 0..500),
        // sends its first half to rank 2 and finishes the second half, whose final sum
        // comes from rank 2; then it sends that half back and gets the first.
        let s = hierarchical_all_reduce(0, &[0, 0, 1, 1], 1000, 4, 1 << 20);
        let to = |peer: usize| -> usize {
            s.sends
                .iter()
                .filter(|x| x.peer == peer)
                .map(|x| x.range.len())
                .sum()
        };
        assert_eq!((to(1), to(2), to(3)), (500 + 500, 250 + 250, 0));
        let finals: Vec<_> = s
            .recvs
            .iter()
            .filter(|r| matches!(r.action, RecvAction::Reduce { last: true, .. }))
            .map(|r| (r.peer, r.range.clone()))
            .collect();
        assert_eq!(finals, [(2, 250..500)], "the final sums come across hosts");
    }

    #[test]
    fn broadcasts_from_every_root_and_barriers_are_correct_on_every_layout() {
        for &host_of in LAYOUTS {
            let n = host_of.len();
            for root in 0..n {
                for count in [0, 1, 7, 64, 1001] {
                    for (chunk, pipelined) in [(4, true), (64, true), (1 << 20, false), (64, false)]
                    {
                        simulate(n, count, CollectiveKind::Broadcast, Some(root), |rank| {
                            hierarchical_broadcast(rank, host_of, root, count, 4, chunk, pipelined)
                        });
                    }
                }
            }
            simulate(n, 0, CollectiveKind::Barrier, None, |rank| {
                hierarchical_barrier(rank, host_of)
            });
        }
    }

    #[test]
    fn a_broadcast_crosses_to_each_host_once_and_a_barrier_once_per_round() {
        let host_of = [0, 0, 1, 1, 2, 2];
        let crossing = |rank: usize, s: &Schedule| {
            s.sends
                .iter()
                .filter(|send| host_of[send.peer] != host_of[rank])
                .count()
        };
        for pipelined in [false, true] {
            for root in 0..6 {
                let crossings: usize = (0..6)
                    .map(|r| {
                        let s =
                            hierarchical_broadcast(r, &host_of, root, 100, 4, 1 << 20, pipelined);
                        crossing(r, &s)
                    })
                    .sum();
                assert_eq!(crossings, 2, "root {root}, pipelined {pipelined}");
            }
        }
        // Three leaders, two dissemination rounds: six crossings, against a flat
        // dissemination barrier's fifteen (three rounds; all but three signals cross).
        let barrier: usize = (0..6)
            .map(|r| crossing(r, &hierarchical_barrier(r, &host_of)))
            .sum();
        let flat: usize = (0..6)
            .map(|r| crossing(r, &dissemination_barrier(r, 6)))
            .sum();
        assert_eq!((barrier, flat), (6, 15));
    }

    #[test]
    fn one_host_or_one_rank_per_host_is_the_flat_ring() {
        for host_of in [&[0, 0, 0][..], &[0, 1, 2]] {
            for rank in 0..3 {
                assert_eq!(
                    hierarchical_all_reduce(rank, host_of, 100, 4, 64),
                    ring_all_reduce(rank, 3, 100, 4, 64)
                );
            }
        }
    }
}
