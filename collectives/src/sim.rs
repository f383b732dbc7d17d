//! A lock-step simulator that runs every rank's schedule against in-memory queues.
//!
//! It drives the same [`Progress`] rules as the executor, one whole frame at a time, so
//! what it proves holds for the executor's reading of the schedule: a send moves only
//! when [`Progress::next_send`] allows it, a received frame goes where
//! [`Progress::next_recv`] says (a store straight into the buffer, a reduction into
//! scratch) and is applied only when [`Progress::may_apply`] allows it.
//!
//! Values are symbolic: each element carries its exact sum *and* the expression that
//! produced it (`((a+b)+c)`), so the tests check not only correctness and freedom from
//! deadlock but that every rank ends with the same expression — the same operands
//! combined in the same order — which is what makes floating-point results
//! bit-identical. Each element also counts how often it was finalised (a mean divides
//! once, never twice or zero times). Whenever received data lands in a rank's buffer, the
//! simulator also checks that the send the executor may be partway through does not
//! read the same elements (it would put a mix of old and new values on the wire).

use std::collections::VecDeque;
use std::ops::Range;
use std::rc::Rc;

use crate::progress::{Destination, Progress};
use crate::schedule::{overlap, segment, RecvAction, Schedule};
use crate::CollectiveKind;

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

/// Panics when received data is about to land on elements that the send the executor may
/// be partway through (the one [`Progress::next_send`] allows) reads from the buffer.
fn check_no_torn_send(p: &Progress<'_>, rank: usize, target: &Range<usize>, reads_buffer: bool) {
    if let Some(send) = p.next_send().filter(|_| reads_buffer) {
        assert!(
            !overlap(&send.payload, target),
            "rank {rank}: received data lands on {target:?} while send {} of {:?} may be in flight",
            send.index,
            send.payload
        );
    }
}

/// Runs the schedules with at most `capacity` messages queued per ordered pair of ranks,
/// leaving out the rank `absent` (it never starts). Stops when nothing can move.
fn run(
    n: usize,
    count: usize,
    kind: CollectiveKind,
    schedules: &[Schedule],
    capacity: usize,
    absent: Option<usize>,
) -> Outcome {
    let inputs: Vec<Vec<Val>> = (0..n)
        .map(|r| (0..count).map(|i| leaf(r, i)).collect())
        .collect();
    let mut buffers = inputs.clone();
    // Sends of all-to-all read the input, not the buffer being written.
    let reads_buffer = kind != CollectiveKind::AllToAll;
    let mut queues: Vec<VecDeque<Vec<Val>>> = vec![VecDeque::new(); n * n];
    // Elements are one "byte" each: payload ranges are element ranges.
    let mut progress: Vec<Progress<'_>> = schedules.iter().map(|s| Progress::new(s, 1)).collect();
    // Each rank's scratch: a received reduction operand waiting to be applied.
    let mut scratch: Vec<Vec<Val>> = vec![Vec::new(); n];
    loop {
        let mut progressed = false;
        for r in (0..n).filter(|&r| Some(r) != absent) {
            let p = &mut progress[r];
            if let Some(send) = p.next_send() {
                let queue = &mut queues[r * n + send.peer];
                if queue.len() < capacity {
                    assert_ne!(send.peer, r, "rank {r} sends to itself");
                    let source = if reads_buffer {
                        &buffers[r]
                    } else {
                        &inputs[r]
                    };
                    queue.push_back(source[send.payload.clone()].to_vec());
                    p.sent(send.frame_len() - send.done);
                    progressed = true;
                }
            }
            if let Some(recv) = p.next_recv() {
                if let Some(data) = queues[recv.peer * n + r].pop_front() {
                    // The frame header's length check.
                    assert_eq!(
                        data.len(),
                        recv.payload.len(),
                        "rank {r} receive {}",
                        recv.index
                    );
                    p.received(recv.frame_len() - recv.done);
                    assert!(p.header_unchecked());
                    p.header_checked();
                    match recv.into {
                        Destination::Buffer => {
                            check_no_torn_send(p, r, &recv.payload, reads_buffer);
                            buffers[r][recv.payload.clone()].clone_from_slice(&data);
                        }
                        Destination::Scratch => scratch[r] = data,
                    }
                    progressed = true;
                }
            }
            if let Some(apply) = p.may_apply() {
                if let RecvAction::Reduce {
                    last,
                    incoming_first,
                } = apply.action
                {
                    check_no_torn_send(p, r, &apply.payload, reads_buffer);
                    let incoming = std::mem::take(&mut scratch[r]);
                    assert_eq!(incoming.len(), apply.payload.len(), "rank {r} scratch");
                    let dst = &mut buffers[r][apply.payload.clone()];
                    for (d, x) in dst.iter_mut().zip(&incoming) {
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
                p.applied();
                progressed = true;
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
    let finished = progress.iter().map(Progress::is_done).collect();
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
/// compute the collective `kind` (from `root`, for broadcast and reduce) correctly, with
/// identical expressions on every rank where the result is replicated; for barriers, also
/// that no rank gets through while any one rank is missing.
pub(super) fn simulate(
    n: usize,
    count: usize,
    kind: CollectiveKind,
    root: Option<usize>,
    schedule_of: impl Fn(usize) -> Schedule,
) {
    let schedules: Vec<Schedule> = (0..n).map(&schedule_of).collect();
    let what = format!("n={n} count={count} {} root={root:?}", kind.name());
    for capacity in [usize::MAX, 1] {
        let out = run(n, count, kind, &schedules, capacity, None);
        assert!(
            out.finished.iter().all(|&f| f),
            "deadlock: {what} capacity={capacity}"
        );
        let block = |q: usize| segment(count, n, q);
        for (r, buf) in out.buffers.iter().enumerate() {
            for (i, got) in buf.iter().enumerate() {
                match (kind, root) {
                    (CollectiveKind::AllReduce, None) => {
                        check_reduced(n, r, i, got, &what);
                        assert_eq!(
                            got.expr, out.buffers[0][i].expr,
                            "{what}: rank {r} element {i} reduced in another order"
                        );
                    }
                    (CollectiveKind::Broadcast, Some(root)) => {
                        assert_eq!(got.sum, input(root, i), "{what}: rank {r}")
                    }
                    (CollectiveKind::Barrier, None) => {}
                    (CollectiveKind::ReduceScatter, None) if block(r).contains(&i) => {
                        check_reduced(n, r, i, got, &what)
                    }
                    (CollectiveKind::ReduceScatter, None) => {}
                    (CollectiveKind::AllGather, None) => {
                        let owner = (0..n).find(|&q| block(q).contains(&i)).unwrap();
                        assert_eq!(got.sum, input(owner, i), "{what}: rank {r} element {i}");
                    }
                    (CollectiveKind::Reduce, Some(root)) if r == root => {
                        check_reduced(n, r, i, got, &what)
                    }
                    (CollectiveKind::Reduce, Some(_)) => {}
                    (CollectiveKind::AllToAll, None) => {
                        // Output block q of rank r is input block r of rank q.
                        let q = (0..n).find(|&q| block(q).contains(&i)).unwrap();
                        let offset = i - block(q).start;
                        let want = input(q, block(r).start + offset);
                        assert_eq!(got.sum, want, "{what}: rank {r} element {i}");
                    }
                    _ => panic!("{what}: not a collective the simulator checks"),
                }
            }
        }
    }
    if kind == CollectiveKind::Barrier && n > 1 {
        for missing in 0..n {
            let out = run(n, count, kind, &schedules, usize::MAX, Some(missing));
            for r in (0..n).filter(|&r| r != missing) {
                assert!(
                    !out.finished[r],
                    "rank {r} left the barrier while rank {missing} never arrived (n={n})"
                );
            }
        }
    }
}
