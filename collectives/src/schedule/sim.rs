//! A lock-step simulator that runs every rank's schedule against in-memory queues.
//!
//! Values are symbolic: each element carries its exact sum *and* the expression that
//! produced it (`((a+b)+c)`), so the tests check not only correctness and freedom from
//! deadlock but that every rank ends with the same expression — the same operands
//! combined in the same order — which is what makes floating-point results
//! bit-identical. Each element also counts how often it was finalised (a mean divides
//! once, never twice or zero times).

use std::collections::VecDeque;
use std::rc::Rc;

use super::{segment, RecvAction, Schedule};

#[derive(Clone, Copy, Debug)]
pub(super) enum Collective {
    AllReduce,
    Broadcast(usize),
    Barrier,
    ReduceScatter,
    AllGather,
    Reduce(usize),
    AllToAll,
}

#[derive(Clone, Debug)]
struct Val {
    sum: f64,
    expr: Rc<str>,
    finalized: u32,
}

fn input(rank: usize, i: usize) -> f64 {
    ((rank + 1) * 1000 + i % 977) as f64
}

fn leaf(rank: usize, i: usize) -> Val {
    Val {
        sum: input(rank, i),
        expr: Rc::from(format!("x{rank}")),
        finalized: 0,
    }
}

struct Outcome {
    buffers: Vec<Vec<Val>>,
    finished: Vec<bool>,
}

/// Runs the schedules with at most `capacity` messages queued per ordered pair of ranks,
/// leaving out the rank `absent` (it never starts). Stops when nothing can move.
fn run(
    n: usize,
    count: usize,
    collective: Collective,
    schedules: &[Schedule],
    capacity: usize,
    absent: Option<usize>,
) -> Outcome {
    let inputs: Vec<Vec<Val>> = (0..n)
        .map(|r| (0..count).map(|i| leaf(r, i)).collect())
        .collect();
    let mut buffers = inputs.clone();
    let mut queues: Vec<VecDeque<Vec<Val>>> = vec![VecDeque::new(); n * n];
    let mut send_at = vec![0usize; n];
    let mut recv_at = vec![0usize; n];
    loop {
        let mut progressed = false;
        for r in (0..n).filter(|&r| Some(r) != absent) {
            let s = &schedules[r];
            if let Some(step) = s.sends.get(send_at[r]) {
                let ready = step.after_recv.is_none_or(|dep| dep < recv_at[r]);
                let queue = &mut queues[r * n + step.peer];
                if ready && queue.len() < capacity {
                    assert_ne!(step.peer, r, "rank {r} sends to itself");
                    let source = match collective {
                        Collective::AllToAll => &inputs[r],
                        _ => &buffers[r],
                    };
                    queue.push_back(source[step.range.clone()].to_vec());
                    send_at[r] += 1;
                    progressed = true;
                }
            }
            if let Some(step) = s.recvs.get(recv_at[r]) {
                let allowed = step.after_send.is_none_or(|dep| dep < send_at[r]);
                if let Some(data) = allowed
                    .then(|| queues[step.peer * n + r].pop_front())
                    .flatten()
                {
                    assert_eq!(data.len(), step.range.len(), "rank {r} step {}", recv_at[r]);
                    let dst = &mut buffers[r][step.range.clone()];
                    match step.action {
                        RecvAction::Store => dst.clone_from_slice(&data),
                        RecvAction::Reduce {
                            last,
                            incoming_first,
                        } => {
                            for (d, x) in dst.iter_mut().zip(&data) {
                                let (a, b) = if incoming_first { (x, &*d) } else { (&*d, x) };
                                let mut v = Val {
                                    sum: a.sum + b.sum,
                                    expr: Rc::from(format!("({}+{})", a.expr, b.expr)),
                                    finalized: a.finalized + b.finalized,
                                };
                                if last {
                                    v.finalized += 1;
                                }
                                *d = v;
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
    assert!(
        queues.iter().all(VecDeque::is_empty) || absent.is_some(),
        "unreceived messages"
    );
    let finished = (0..n)
        .map(|r| send_at[r] == schedules[r].sends.len() && recv_at[r] == schedules[r].recvs.len())
        .collect();
    Outcome { buffers, finished }
}

fn check_reduced(n: usize, rank: usize, i: usize, got: &Val, what: &str) {
    let want: f64 = (0..n).map(|q| input(q, i)).sum();
    assert_eq!(got.sum, want, "{what}: rank {rank} element {i}");
    if n > 1 {
        assert_eq!(
            got.finalized, 1,
            "{what}: rank {rank} element {i} finalised {} times",
            got.finalized
        );
    }
}

/// Checks that the schedules complete (with unbounded and with one-message queues) and
/// compute `collective` correctly, with identical expressions on every rank where the
/// result is replicated; for barriers, also that no rank gets through while any one
/// rank is missing.
pub(super) fn simulate(
    n: usize,
    count: usize,
    collective: Collective,
    schedule_of: impl Fn(usize) -> Schedule,
) {
    let schedules: Vec<Schedule> = (0..n).map(&schedule_of).collect();
    let what = format!("n={n} count={count} {collective:?}");
    for capacity in [usize::MAX, 1] {
        let out = run(n, count, collective, &schedules, capacity, None);
        assert!(
            out.finished.iter().all(|&f| f),
            "deadlock: {what} capacity={capacity}"
        );
        let block = |q: usize| segment(count, n, q);
        for (r, buf) in out.buffers.iter().enumerate() {
            for (i, got) in buf.iter().enumerate() {
                match collective {
                    Collective::AllReduce => {
                        check_reduced(n, r, i, got, &what);
                        assert_eq!(
                            got.expr, out.buffers[0][i].expr,
                            "{what}: rank {r} element {i} reduced in another order"
                        );
                    }
                    Collective::Broadcast(root) => {
                        assert_eq!(got.sum, input(root, i), "{what}: rank {r}")
                    }
                    Collective::Barrier => {}
                    Collective::ReduceScatter if block(r).contains(&i) => {
                        check_reduced(n, r, i, got, &what)
                    }
                    Collective::ReduceScatter => {}
                    Collective::AllGather => {
                        let owner = (0..n).find(|&q| block(q).contains(&i)).unwrap();
                        assert_eq!(got.sum, input(owner, i), "{what}: rank {r} element {i}");
                    }
                    Collective::Reduce(root) if r == root => check_reduced(n, r, i, got, &what),
                    Collective::Reduce(_) => {}
                    Collective::AllToAll => {
                        // Output block q of rank r is input block r of rank q.
                        let q = (0..n).find(|&q| block(q).contains(&i)).unwrap();
                        let offset = i - block(q).start;
                        let want = input(q, block(r).start + offset);
                        assert_eq!(got.sum, want, "{what}: rank {r} element {i}");
                    }
                }
            }
        }
    }
    if matches!(collective, Collective::Barrier) && n > 1 {
        for missing in 0..n {
            let out = run(n, count, collective, &schedules, usize::MAX, Some(missing));
            for r in (0..n).filter(|&r| r != missing) {
                assert!(
                    !out.finished[r],
                    "rank {r} left the barrier while rank {missing} never arrived (n={n})"
                );
            }
        }
    }
}
