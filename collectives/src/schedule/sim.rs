//! A lock-step simulator that runs every rank's schedule against in-memory queues.
//! Used by the schedule tests to prove correctness and freedom from deadlock without
//! sockets.

use std::collections::VecDeque;

use super::{RecvAction, Schedule};

#[derive(Clone, Copy, Debug)]
pub(super) enum Collective {
    AllReduce,
    Broadcast(usize),
    Barrier,
}

fn input(rank: usize, i: usize) -> f64 {
    ((rank + 1) * 1000 + i % 977) as f64
}

struct Outcome {
    buffers: Vec<Vec<f64>>,
    finished: Vec<bool>,
    final_reductions: Vec<usize>,
}

/// Runs the schedules with at most `capacity` messages queued per ordered pair of ranks,
/// leaving out the ranks in `absent` (they never start). Stops when nothing can move.
fn run(
    n: usize,
    count: usize,
    schedules: &[Schedule],
    capacity: usize,
    absent: Option<usize>,
) -> Outcome {
    let mut buffers: Vec<Vec<f64>> = (0..n)
        .map(|r| (0..count).map(|i| input(r, i)).collect())
        .collect();
    let mut queues: Vec<VecDeque<Vec<f64>>> = vec![VecDeque::new(); n * n];
    let mut send_at = vec![0usize; n];
    let mut recv_at = vec![0usize; n];
    let mut final_reductions = vec![0usize; count];
    loop {
        let mut progressed = false;
        for r in (0..n).filter(|&r| Some(r) != absent) {
            let s = &schedules[r];
            if let Some(step) = s.sends.get(send_at[r]) {
                let ready = step.after_recv.is_none_or(|dep| dep < recv_at[r]);
                let queue = &mut queues[r * n + step.peer];
                if ready && queue.len() < capacity {
                    assert_ne!(step.peer, r, "rank {r} sends to itself");
                    queue.push_back(buffers[r][step.range.clone()].to_vec());
                    send_at[r] += 1;
                    progressed = true;
                }
            }
            if let Some(step) = s.recvs.get(recv_at[r]) {
                if let Some(data) = queues[step.peer * n + r].pop_front() {
                    assert_eq!(data.len(), step.range.len(), "rank {r} step {}", recv_at[r]);
                    let dst = &mut buffers[r][step.range.clone()];
                    match step.action {
                        RecvAction::Store => dst.copy_from_slice(&data),
                        RecvAction::Reduce { last } => {
                            for (d, x) in dst.iter_mut().zip(&data) {
                                *d += x;
                            }
                            if last {
                                for i in step.range.clone() {
                                    final_reductions[i] += 1;
                                }
                            }
                        }
                    }
                    recv_at[r] += 1;
                    progressed = true;
                }
            }
        }
        if !progressed {
            break;
        }
    }
    assert!(queues.iter().all(VecDeque::is_empty) || absent.is_some());
    let finished = (0..n)
        .map(|r| send_at[r] == schedules[r].sends.len() && recv_at[r] == schedules[r].recvs.len())
        .collect();
    Outcome {
        buffers,
        finished,
        final_reductions,
    }
}

/// Checks that the schedules complete (with unbounded and with one-message queues) and
/// compute `collective` correctly; for barriers, also that no rank gets through while
/// any one rank is missing.
pub(super) fn simulate(
    n: usize,
    count: usize,
    collective: Collective,
    schedule_of: impl Fn(usize) -> Schedule,
) {
    let schedules: Vec<Schedule> = (0..n).map(&schedule_of).collect();
    for capacity in [usize::MAX, 1] {
        let out = run(n, count, &schedules, capacity, None);
        assert!(
            out.finished.iter().all(|&f| f),
            "deadlock: n={n} count={count} {collective:?} capacity={capacity}"
        );
        for (r, buf) in out.buffers.iter().enumerate() {
            for (i, &got) in buf.iter().enumerate() {
                let want = match collective {
                    Collective::AllReduce => (0..n).map(|q| input(q, i)).sum(),
                    Collective::Broadcast(root) => input(root, i),
                    Collective::Barrier => input(r, i),
                };
                assert_eq!(got, want, "rank {r} element {i}: n={n} {collective:?}");
            }
        }
        if matches!(collective, Collective::AllReduce) && n > 1 {
            assert!(
                out.final_reductions.iter().all(|&c| c == 1),
                "every element must be finalized exactly once: {:?}",
                out.final_reductions
            );
        }
    }
    if matches!(collective, Collective::Barrier) && n > 1 {
        for missing in 0..n {
            let out = run(n, count, &schedules, usize::MAX, Some(missing));
            for r in (0..n).filter(|&r| r != missing) {
                assert!(
                    !out.finished[r],
                    "rank {r} left the barrier while rank {missing} never arrived (n={n})"
                );
            }
        }
    }
}
