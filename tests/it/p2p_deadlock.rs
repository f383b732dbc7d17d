//! Issue 12, point 1b: a deadlock between a point-to-point call and a collective (or
//! between two point-to-point calls) is named within about a second instead of waiting
//! for the deadline. Ranks are threads of this process, over TCP and shared memory.

use crate::common;

use std::time::{Duration, Instant};

use common::{heavy_lock, run_threads_with};
use ringccl::{Error, ProcessGroup, ReduceOp, TransportKind};

/// The group deadline: long, so that only the deadlock check can explain a fast failure.
const DEADLINE: Duration = Duration::from_secs(30);
/// How soon every rank must fail. Measured: 0.4 s (a receive against a collective, two
/// receives) and 0.7 s (two sends); the slack is for a loaded 2-core machine.
const NAMED_WITHIN: Duration = Duration::from_secs(3);

/// Runs `body` on `n` ranks over `transport` and returns each rank's time and outcome.
fn run(
    n: usize,
    transport: TransportKind,
    body: impl Fn(&ProcessGroup) -> Result<(), Error> + Sync,
) -> Vec<(Duration, Result<(), Error>)> {
    let _guard = heavy_lock();
    run_threads_with(
        n,
        DEADLINE,
        |opts| opts.transport(transport),
        |pg| {
            let started = Instant::now();
            let outcome = body(&pg);
            (started.elapsed(), outcome)
        },
    )
}

/// Every rank failed within [`NAMED_WITHIN`] with a message naming the deadlock and
/// containing every one of `names` (itself, or quoting the abort notice of the rank that
/// found it), and at least one rank found it itself.
fn assert_named(case: &str, outcomes: &[(Duration, Result<(), Error>)], names: &[&str]) {
    eprintln!("{case}:");
    for (rank, (took, outcome)) in outcomes.iter().enumerate() {
        let text = match outcome {
            Ok(()) => panic!("{case}: rank {rank} finished, but its call cannot"),
            Err(e) => e.to_string(),
        };
        eprintln!("  rank {rank} failed after {took:?}: {text}");
        assert!(
            text.contains("the two calls wait on each other") && !text.contains("timed out"),
            "{case}: rank {rank} must name the deadlock, not a timeout: {text}"
        );
        for name in names {
            assert!(
                text.contains(name),
                "{case}: rank {rank} must name {name:?}: {text}"
            );
        }
        assert!(
            *took < NAMED_WITHIN,
            "{case}: rank {rank} took {took:?} to fail (the deadline is {DEADLINE:?})"
        );
    }
    let named_here = outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Err(Error::Deadlock { .. })))
        .count();
    assert!(
        named_here >= 1,
        "{case}: at least one rank names the deadlock itself"
    );
}

/// Case 1: rank 0 receives from rank 1 while ranks 1 and 2 call all_reduce (N=3: no
/// frame of rank 1's reaches rank 0, so no header shows the mismatch).
fn recv_against_all_reduce(transport: TransportKind) {
    let outcomes = run(3, transport, |pg| {
        let mut buf = vec![1.0f32; 8];
        if pg.rank() == 0 {
            pg.recv(&mut buf, 1, 0)
        } else {
            pg.all_reduce(&mut buf, ReduceOp::Sum)
        }
    });
    assert_named(
        &format!("recv against all_reduce over {transport:?}"),
        &outcomes,
        &[
            "recv(from rank 1, msg #1, tag=0, 8 x f32)",
            "op #1 all_reduce(sum, 8 x f32)",
        ],
    );
}

#[test]
fn a_recv_against_an_all_reduce_is_named_over_tcp() {
    recv_against_all_reduce(TransportKind::Tcp);
}

#[test]
fn a_recv_against_an_all_reduce_is_named_over_shared_memory() {
    recv_against_all_reduce(TransportKind::SharedMemory);
}

#[test]
fn a_recv_against_a_barrier_is_named_over_tcp() {
    // Rank 1 waits for a message from rank 0, the barrier's root on one machine
    // (gather-release): rank 0 waits for rank 1's arrival first and sends nothing before
    // everyone has arrived, so the two wait on each other. (A barrier rank that sent
    // rank 1 a signal first would be named at once instead, as a frame from another call.)
    let outcomes = run(3, TransportKind::Tcp, |pg| {
        let mut buf = vec![0u8; 4];
        if pg.rank() == 1 {
            pg.recv(&mut buf, 0, 7)
        } else {
            pg.barrier()
        }
    });
    assert_named(
        "recv against barrier over Tcp",
        &outcomes,
        &["recv(from rank 0, msg #1, tag=7, 4 x u8)", "op #1 barrier"],
    );
}

/// Case 2: both ranks receive, nobody sends.
fn two_receives(transport: TransportKind) {
    let outcomes = run(2, transport, |pg| {
        let mut buf = vec![0i32; 16];
        pg.recv(&mut buf, 1 - pg.rank(), 0)
    });
    assert_named(
        &format!("two receives over {transport:?}"),
        &outcomes,
        &[
            "recv(from rank 1, msg #1, tag=0, 16 x i32)",
            "recv(from rank 0, msg #1, tag=0, 16 x i32)",
        ],
    );
}

#[test]
fn two_receives_waiting_for_each_other_are_named_over_tcp() {
    two_receives(TransportKind::Tcp);
}

#[test]
fn two_receives_waiting_for_each_other_are_named_over_shared_memory() {
    two_receives(TransportKind::SharedMemory);
}

/// Case 3: rank 0 sends 32 MiB to rank 1 (more than the connection buffers) while rank 1
/// broadcasts 32 MiB from itself: both only write, nobody reads.
fn send_against_broadcast(transport: TransportKind) {
    let outcomes = run(2, transport, |pg| {
        let mut buf = vec![1.0f32; 8 << 20];
        if pg.rank() == 0 {
            pg.send(&buf, 1, 0)
        } else {
            pg.broadcast(&mut buf, 1)
        }
    });
    assert_named(
        &format!("send against broadcast over {transport:?}"),
        &outcomes,
        &[
            "send(to rank 1, msg #1, tag=0, 8388608 x f32)",
            "op #1 broadcast(root=1, 8388608 x f32)",
            "full both ways",
        ],
    );
}

#[test]
fn a_large_send_against_a_broadcast_is_named_over_tcp() {
    send_against_broadcast(TransportKind::Tcp);
}

#[test]
fn a_large_send_against_a_broadcast_is_named_over_shared_memory() {
    send_against_broadcast(TransportKind::SharedMemory);
}

/// Programs whose calls wait on each other for more than a second but all finish: the
/// check must not blame the slower rank.
fn slow_but_correct(transport: TransportKind) {
    // A receive posted a second before its send, while the sender waits in a later
    // collective: the message left before the collective began.
    let outcomes = run(2, transport, |pg| {
        let mut msg = vec![0.0f32; 1024];
        let mut sum = vec![1.0f32; 8];
        if pg.rank() == 0 {
            std::thread::sleep(Duration::from_secs(1));
            pg.recv(&mut msg, 1, 0)?;
            pg.all_reduce(&mut sum, ReduceOp::Sum)
        } else {
            pg.send(&msg, 0, 0)?;
            pg.all_reduce(&mut sum, ReduceOp::Sum)
        }
    });
    for (rank, (_, outcome)) in outcomes.iter().enumerate() {
        assert!(outcome.is_ok(), "late receiver, rank {rank}: {outcome:?}");
    }
    // Rank 0's receive waits on rank 1, which waits on rank 2 for a second: rank 1 is
    // busy, not deadlocked with rank 0.
    let outcomes = run(3, transport, |pg| {
        let big = vec![1u8; 32 << 20];
        let mut got = vec![0u8; 32 << 20];
        let mut small = vec![0u8; 4];
        match pg.rank() {
            0 => pg.recv(&mut small, 1, 0),
            1 => pg.send(&big, 2, 0).and_then(|()| pg.send(&small, 0, 0)),
            _ => {
                std::thread::sleep(Duration::from_secs(1));
                pg.recv(&mut got, 1, 0)
            }
        }
    });
    for (rank, (_, outcome)) in outcomes.iter().enumerate() {
        assert!(outcome.is_ok(), "chain, rank {rank}: {outcome:?}");
    }
    // Rank 0's 32 MiB send fills the connection for a second while rank 1 is elsewhere;
    // rank 1 then broadcasts a few bytes (they fit) and receives the message.
    let outcomes = run(2, transport, |pg| {
        let mut big = vec![1u8; 32 << 20];
        let mut few = vec![1u8; 4096];
        if pg.rank() == 0 {
            pg.send(&big, 1, 0)?;
            pg.broadcast(&mut few, 1)
        } else {
            std::thread::sleep(Duration::from_secs(1));
            pg.broadcast(&mut few, 1)?;
            pg.recv(&mut big, 0, 0)
        }
    });
    for (rank, (_, outcome)) in outcomes.iter().enumerate() {
        assert!(
            outcome.is_ok(),
            "send then small broadcast, rank {rank}: {outcome:?}"
        );
    }
}

#[test]
fn slow_but_correct_programs_are_not_blamed_over_tcp() {
    slow_but_correct(TransportKind::Tcp);
}

#[test]
fn slow_but_correct_programs_are_not_blamed_over_shared_memory() {
    slow_but_correct(TransportKind::SharedMemory);
}
