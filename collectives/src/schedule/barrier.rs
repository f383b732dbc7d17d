//! Dissemination barrier: `⌈log2 N⌉` rounds; in round `k` rank `r` signals `r+2^k` and
//! waits for `r−2^k`. After the last round every rank has heard, directly or through
//! others, from every rank, so nobody leaves before everybody has arrived.

use super::{RecvAction, RecvStep, Schedule, SendStep};

/// Rank `rank`'s schedule for a barrier of `world_size` ranks. Messages carry no payload:
/// the frame header alone is the signal.
pub fn dissemination_barrier(rank: usize, world_size: usize) -> Schedule {
    let members: Vec<usize> = (0..world_size).collect();
    let mut schedule = Schedule::default();
    dissemination_over(&mut schedule, &members, rank, None);
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
    use super::super::sim::simulate;
    use super::*;
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
}
