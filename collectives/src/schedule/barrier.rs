//! Two barriers.
//!
//! - **Dissemination**: `⌈log2 N⌉` rounds; in round `k` rank `r` signals `r+2^k` and
//!   waits for `r−2^k`. After the last round every rank has heard, directly or through
//!   others, from every rank, so nobody leaves before everybody has arrived.
//! - **Gather-release**: every rank signals rank 0, which answers them all once it has
//!   heard from everyone. Two hops whatever `N`, and each rank but the first sends and
//!   waits once: where the ranks of one machine take turns on its cores, or pay a
//!   system call per message (TCP), fewer messages and no forwarding chain beat
//!   dissemination's rounds (measured in `docs/benchmarks.md`).

use super::{RecvAction, RecvStep, Schedule, SendStep};

/// Rank `rank`'s schedule for a barrier of `world_size` ranks. Messages carry no payload:
/// the frame header alone is the signal.
pub fn dissemination_barrier(rank: usize, world_size: usize) -> Schedule {
    let members: Vec<usize> = (0..world_size).collect();
    let mut schedule = Schedule::default();
    dissemination_over(&mut schedule, &members, rank, None);
    schedule
}

/// Rank `rank`'s schedule for a gather-release barrier of `world_size` ranks: rank 0
/// receives a signal from every other rank, then releases each; the others signal rank 0
/// and wait for its release. Messages carry no payload.
///
/// ```
/// use ringccl_collectives::schedule::gather_release_barrier;
/// let root = gather_release_barrier(0, 4);
/// assert_eq!((root.recvs.len(), root.sends.len()), (3, 3));
/// // Every release waits for the last arrival.
/// assert!(root.sends.iter().all(|s| s.after_recv == Some(2)));
/// let other = gather_release_barrier(2, 4);
/// assert_eq!((other.sends[0].peer, other.recvs[0].peer), (0, 0));
/// ```
pub fn gather_release_barrier(rank: usize, world_size: usize) -> Schedule {
    let signal = |peer| (peer, 0..0);
    let mut schedule = Schedule::default();
    if world_size < 2 {
        return schedule;
    }
    if rank == 0 {
        for peer in 1..world_size {
            let (peer, range) = signal(peer);
            schedule.recvs.push(RecvStep {
                peer,
                range,
                action: RecvAction::Store,
                after_send: None,
            });
        }
        let last_arrival = Some(world_size - 2);
        for peer in 1..world_size {
            let (peer, range) = signal(peer);
            schedule.sends.push(SendStep {
                peer,
                range,
                after_recv: last_arrival,
            });
        }
    } else {
        let (peer, range) = signal(0);
        schedule.sends.push(SendStep {
            peer,
            range: range.clone(),
            after_recv: None,
        });
        schedule.recvs.push(RecvStep {
            peer,
            range,
            action: RecvAction::Store,
            after_send: None,
        });
    }
    schedule
}

/// Appends to `schedule` this rank's part of a dissemination barrier among `members`
/// (this rank at position `me`), whose first signal waits for receive `after`, if given.
pub(super) fn dissemination_over(
    schedule: &mut Schedule,
    members: &[usize],
    me: usize,
    after: Option<usize>,
) {
    let n = members.len();
    let mut distance = 1;
    let mut previous = after;
    while distance < n {
        schedule.sends.push(SendStep {
            peer: members[(me + distance) % n],
            range: 0..0,
            after_recv: previous,
        });
        previous = Some(schedule.recvs.len());
        schedule.recvs.push(RecvStep {
            peer: members[(me + n - distance) % n],
            range: 0..0,
            action: RecvAction::Store,
            after_send: None,
        });
        distance *= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::simulate;
    use crate::CollectiveKind;

    #[test]
    fn rounds_are_logarithmic_and_everyone_hears_from_everyone() {
        for n in 1..=17 {
            let schedules: Vec<_> = (0..n).map(|r| dissemination_barrier(r, n)).collect();
            let rounds = schedules[0].sends.len();
            assert_eq!(rounds, (n as f64).log2().ceil() as usize, "n={n}");
            simulate(n, 0, CollectiveKind::Barrier, None, |r| {
                dissemination_barrier(r, n)
            });
            // Knowledge propagation: after all rounds, rank r knows of every rank.
            let mut knows: Vec<u64> = (0..n).map(|r| 1u64 << r).collect();
            for k in 0..rounds {
                let before = knows.clone();
                for r in 0..n {
                    let from = schedules[r].recvs[k].peer;
                    knows[r] |= before[from];
                }
            }
            assert!(knows.iter().all(|&k| k == (1u64 << n) - 1), "n={n}");
        }
    }

    #[test]
    fn gather_release_holds_everyone_until_the_last_arrival_in_two_hops() {
        for n in 1..=17 {
            // The simulator also checks that no rank leaves while one is missing.
            simulate(n, 0, CollectiveKind::Barrier, None, |r| {
                gather_release_barrier(r, n)
            });
            let schedules: Vec<_> = (0..n).map(|r| gather_release_barrier(r, n)).collect();
            let messages: usize = schedules.iter().map(|s| s.sends.len()).sum();
            assert_eq!(messages, 2 * n.saturating_sub(1), "n={n}");
            for (r, s) in schedules.iter().enumerate().skip(1) {
                assert_eq!(s.sends.len() + s.recvs.len(), 2, "n={n} rank {r}");
            }
        }
    }
}
