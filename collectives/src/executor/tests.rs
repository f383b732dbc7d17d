//! The executor over [`MemoryTransport`]: every schedule kind on 1..=6 ranks as threads,
//! with pipes so small that headers and payloads arrive in pieces and with large ones,
//! and the failure paths (mismatch, timeout, lost peer, protocol violations).

use std::io::{ErrorKind, IoSlice};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::*;
use crate::control::Probe;
use crate::hooks::NoHooks;
use crate::schedule::{
    binomial_tree_broadcast, chain_broadcast, dissemination_barrier, gather_release_barrier,
    halving_doubling_all_reduce, pairwise_all_to_all, recursive_doubling_all_reduce, recv_from,
    ring_all_gather, ring_all_reduce, ring_reduce, ring_reduce_scatter, segment, send_to, SendStep,
};
use crate::{CollectiveKind, MemoryConfig, MemoryTransport};

/// Deadline of calls that must not time out.
const LONG: Duration = Duration::from_secs(30);
/// Deadline of calls whose timeout is the point.
const SHORT: Duration = Duration::from_millis(150);

/// One rank's side of a test: its transport, sequence counter and scratch.
struct Rank {
    rank: usize,
    n: usize,
    chunk: usize,
    transport: MemoryTransport,
    seq: u64,
    scratch: Vec<u64>,
}

impl Rank {
    fn next_op(
        &mut self,
        kind: CollectiveKind,
        count: usize,
        op: Option<ReduceOp>,
        root: Option<usize>,
    ) -> OpDesc {
        self.seq += 1;
        OpDesc::new(self.seq, kind, DType::F32, count, op, root)
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        op: OpDesc,
        algorithm: Algorithm,
        schedule: &Schedule,
        buf: &mut [f32],
        send_from: Option<&[f32]>,
        timeout: Duration,
    ) -> Result<(), Error> {
        let call = Call {
            rank: self.rank,
            world_size: self.n,
            op,
            algorithm,
            elem_size: op.dtype.map_or(1, DType::size),
            reduce: op.op.map(|o| (DType::F32, o)),
            deadline: Instant::now() + timeout,
            timeout,
            report: ProgressSink {
                probe: None,
                hooks: &NoHooks,
            },
        };
        execute(
            &mut self.transport,
            schedule,
            &call,
            bytemuck::cast_slice_mut(buf),
            send_from.map(bytemuck::cast_slice),
            &mut self.scratch,
        )
    }
}

/// Runs `body` for every rank of a fresh mesh, each on its own thread. Endpoints stay
/// open until every rank's body has returned.
fn run_group<R: Send>(
    n: usize,
    config: MemoryConfig,
    chunk: usize,
    body: impl Fn(&mut Rank) -> R + Sync,
) -> Vec<R> {
    let all_done = Barrier::new(n);
    let (body, all_done) = (&body, &all_done);
    std::thread::scope(|s| {
        let threads: Vec<_> = MemoryTransport::mesh(n, config)
            .into_iter()
            .enumerate()
            .map(|(rank, transport)| {
                s.spawn(move || {
                    let mut me = Rank {
                        rank,
                        n,
                        chunk,
                        transport,
                        seq: 0,
                        scratch: Vec::new(),
                    };
                    let out = body(&mut me);
                    all_done.wait();
                    out
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("rank thread panicked"))
            .collect()
    })
}

/// Small integers: every sum is exact in f32, whatever the order.
fn exact(rank: usize, i: usize) -> f32 {
    ((rank * 31 + i * 7) % 23) as f32 - 11.0
}

/// Values whose f32 sum depends on the order of the additions.
fn noisy(rank: usize, i: usize) -> f32 {
    let scale = [1.0e7, -1.0e7, 0.3, 3.0e-3][(rank + i) % 4];
    scale * (1.0 + rank as f32 * 0.013) + i as f32 * 1.0e-3
}

fn inputs(rank: usize, count: usize, value: fn(usize, usize) -> f32) -> Vec<f32> {
    (0..count).map(|i| value(rank, i)).collect()
}

fn exact_sum(n: usize, i: usize) -> f32 {
    (0..n).map(|q| exact(q, i)).sum()
}

fn owner(count: usize, n: usize, i: usize) -> usize {
    (0..n)
        .find(|&q| segment(count, n, q).contains(&i))
        .expect("every element has an owner")
}

const UNSET: f32 = -999.0;

/// Every rank's buffer after each collective of [`every_collective`], by name.
type Results = Vec<(&'static str, Vec<f32>)>;

/// Runs every schedule kind once, in the same order on every rank, and returns the
/// buffers. Panics on any error.
fn every_collective(me: &mut Rank, count: usize) -> Results {
    let (rank, n, chunk) = (me.rank, me.n, me.chunk);
    let mut out = Vec::new();
    let all_reduce = |me: &mut Rank, name, algorithm, value, op| {
        let schedule = match algorithm {
            Algorithm::Ring => ring_all_reduce(rank, n, count, 4, chunk),
            Algorithm::HalvingDoubling => halving_doubling_all_reduce(rank, n, count, 4, chunk),
            _ => recursive_doubling_all_reduce(rank, n, count, 4, chunk),
        };
        let mut buf = inputs(rank, count, value);
        let desc = me.next_op(CollectiveKind::AllReduce, count, Some(op), None);
        me.run(desc, algorithm, &schedule, &mut buf, None, LONG)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        (name, buf)
    };
    out.push(all_reduce(
        me,
        "ring sum",
        Algorithm::Ring,
        exact,
        ReduceOp::Sum,
    ));
    out.push(all_reduce(
        me,
        "ring avg",
        Algorithm::Ring,
        exact,
        ReduceOp::Avg,
    ));
    out.push(all_reduce(
        me,
        "ring noisy",
        Algorithm::Ring,
        noisy,
        ReduceOp::Sum,
    ));
    let rd = Algorithm::RecursiveDoubling;
    out.push(all_reduce(me, "rd sum", rd, exact, ReduceOp::Sum));
    out.push(all_reduce(me, "rd noisy", rd, noisy, ReduceOp::Sum));
    let hd = Algorithm::HalvingDoubling;
    out.push(all_reduce(me, "hd sum", hd, exact, ReduceOp::Sum));
    out.push(all_reduce(me, "hd avg", hd, exact, ReduceOp::Avg));
    out.push(all_reduce(me, "hd noisy", hd, noisy, ReduceOp::Sum));

    let root = n / 2;
    for (name, algorithm, schedule) in [
        (
            "tree broadcast",
            Algorithm::BinomialTree,
            binomial_tree_broadcast(rank, n, root, count, 4, chunk),
        ),
        (
            "chain broadcast",
            Algorithm::Chain,
            chain_broadcast(rank, n, root, count, 4, chunk),
        ),
    ] {
        let mut buf = inputs(rank, count, exact);
        let desc = me.next_op(CollectiveKind::Broadcast, count, None, Some(root));
        me.run(desc, algorithm, &schedule, &mut buf, None, LONG)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, buf));
    }

    me.seq += 1;
    let barrier = OpDesc::barrier(me.seq);
    let schedule = dissemination_barrier(rank, n);
    me.run(
        barrier,
        Algorithm::Dissemination,
        &schedule,
        &mut [],
        None,
        LONG,
    )
    .unwrap_or_else(|e| panic!("barrier: {e}"));

    me.seq += 1;
    let schedule = gather_release_barrier(rank, n);
    me.run(
        OpDesc::barrier(me.seq),
        Algorithm::GatherRelease,
        &schedule,
        &mut [],
        None,
        LONG,
    )
    .unwrap_or_else(|e| panic!("gather-release barrier: {e}"));

    let mut buf = inputs(rank, count, exact);
    let desc = me.next_op(
        CollectiveKind::Reduce,
        count,
        Some(ReduceOp::Sum),
        Some(root),
    );
    let schedule = ring_reduce(rank, n, root, count, 4, chunk);
    me.run(desc, Algorithm::Ring, &schedule, &mut buf, None, LONG)
        .unwrap_or_else(|e| panic!("reduce: {e}"));
    out.push(("reduce", buf));

    let mut buf = inputs(rank, count, exact);
    let desc = me.next_op(
        CollectiveKind::ReduceScatter,
        count,
        Some(ReduceOp::Sum),
        None,
    );
    let schedule = ring_reduce_scatter(rank, n, count, 4, chunk);
    me.run(desc, Algorithm::Ring, &schedule, &mut buf, None, LONG)
        .unwrap_or_else(|e| panic!("reduce-scatter: {e}"));
    out.push(("reduce-scatter", buf));

    let own = segment(count, n, rank);
    let mut buf = vec![UNSET; count];
    for i in own.clone() {
        buf[i] = exact(rank, i);
    }
    let desc = me.next_op(CollectiveKind::AllGather, count, None, None);
    let schedule = ring_all_gather(rank, n, count, 4, chunk);
    me.run(desc, Algorithm::Ring, &schedule, &mut buf, None, LONG)
        .unwrap_or_else(|e| panic!("all-gather: {e}"));
    out.push(("all-gather", buf));

    let a2a = n * count.min(20);
    let input = inputs(rank, a2a, exact);
    let own = segment(a2a, n, rank);
    let mut buf = vec![UNSET; a2a];
    buf[own.clone()].copy_from_slice(&input[own]);
    let desc = me.next_op(CollectiveKind::AllToAll, a2a, None, None);
    let schedule = pairwise_all_to_all(rank, n, a2a, 4, chunk);
    me.run(
        desc,
        Algorithm::Pairwise,
        &schedule,
        &mut buf,
        Some(&input),
        LONG,
    )
    .unwrap_or_else(|e| panic!("all-to-all: {e}"));
    out.push(("all-to-all", buf));

    if n > 1 {
        // Around the ring; even ranks send first, odd ones receive first.
        let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
        let message = OpDesc::send_recv(1, DType::F32, count, 7);
        let outgoing = inputs(rank, count, exact);
        let mut incoming = vec![UNSET; count];
        let send = |me: &mut Rank| {
            let schedule = send_to(next, count, 4, chunk);
            let (op, algo) = (message, Algorithm::Direct);
            me.run(op, algo, &schedule, &mut [], Some(&outgoing), LONG)
                .unwrap_or_else(|e| panic!("send: {e}"));
        };
        let mut recv = |me: &mut Rank| {
            let schedule = recv_from(prev, count, 4, chunk);
            let (op, algo) = (message, Algorithm::Direct);
            me.run(op, algo, &schedule, &mut incoming, None, LONG)
                .unwrap_or_else(|e| panic!("recv: {e}"));
        };
        if rank % 2 == 0 {
            send(me);
            recv(me);
        } else {
            recv(me);
            send(me);
        }
        out.push(("send/recv", incoming));
    }
    out
}

/// Checks every rank's results of [`every_collective`].
fn check(n: usize, count: usize, results: &[Results], what: &str) {
    let root = n / 2;
    for (rank, list) in results.iter().enumerate() {
        for (name, buf) in list {
            let at = |i: usize| format!("{what}: {name}: rank {rank} element {i}");
            let replicated = |i: usize| &results[0].iter().find(|(m, _)| m == name).unwrap().1[i];
            for (i, &got) in buf.iter().enumerate() {
                match *name {
                    "ring sum" | "rd sum" | "hd sum" => {
                        assert_eq!(got, exact_sum(n, i), "{}", at(i))
                    }
                    "ring avg" | "hd avg" => {
                        assert_eq!(got, exact_sum(n, i) / n as f32, "{}", at(i))
                    }
                    "ring noisy" | "rd noisy" | "hd noisy" => {
                        let want: f64 = (0..n).map(|q| f64::from(noisy(q, i))).sum();
                        assert!((f64::from(got) - want).abs() < 64.0, "{}: {got}", at(i));
                        let first = replicated(i);
                        assert_eq!(
                            got.to_bits(),
                            first.to_bits(),
                            "{}: not bit-identical",
                            at(i)
                        );
                    }
                    "tree broadcast" | "chain broadcast" => {
                        assert_eq!(got, exact(root, i), "{}", at(i))
                    }
                    "reduce" if rank == root => assert_eq!(got, exact_sum(n, i), "{}", at(i)),
                    "reduce-scatter" if segment(count, n, rank).contains(&i) => {
                        assert_eq!(got, exact_sum(n, i), "{}", at(i))
                    }
                    "reduce" | "reduce-scatter" => {}
                    "all-gather" => assert_eq!(got, exact(owner(count, n, i), i), "{}", at(i)),
                    "all-to-all" => {
                        let a2a = buf.len();
                        let q = owner(a2a, n, i);
                        let from = segment(a2a, n, rank).start + i - segment(a2a, n, q).start;
                        assert_eq!(got, exact(q, from), "{}", at(i));
                    }
                    "send/recv" => assert_eq!(got, exact((rank + n - 1) % n, i), "{}", at(i)),
                    other => panic!("unchecked collective {other}"),
                }
            }
        }
    }
}

fn config(capacity: usize, max_io: usize) -> MemoryConfig {
    MemoryConfig { capacity, max_io }
}

#[test]
fn every_schedule_is_exact_and_bit_identical_through_tiny_pipes() {
    // Pipes of a few bytes, moved 1, 3 or 7 bytes at a time: headers and payloads arrive
    // in pieces, and every send blocks on a full pipe.
    for (capacity, max_io) in [(1, 1), (5, 3), (40, 7)] {
        for n in 1..=6 {
            for (count, chunk) in [(0, 1 << 20), (5, 4), (13, 12)] {
                let what = format!("n={n} count={count} chunk={chunk} pipe={capacity}/{max_io}");
                let results = run_group(n, config(capacity, max_io), chunk, |me| {
                    every_collective(me, count)
                });
                check(n, count, &results, &what);
            }
        }
    }
}

#[test]
fn every_schedule_is_exact_and_bit_identical_through_large_pipes() {
    for n in 1..=6 {
        for (count, chunk) in [(1, 4), (7, 4), (1000, 64), (3001, 1 << 20)] {
            let what = format!("n={n} count={count} chunk={chunk}");
            let results = run_group(n, MemoryConfig::default(), chunk, |me| {
                every_collective(me, count)
            });
            check(n, count, &results, &what);
        }
    }
}

#[test]
fn a_rank_in_another_collective_is_a_mismatch_naming_both() {
    let results = run_group(2, config(64, 7), 1 << 20, |me| {
        let mut buf = inputs(me.rank, 8, exact);
        if me.rank == 0 {
            let op = me.next_op(CollectiveKind::AllReduce, 8, Some(ReduceOp::Sum), None);
            let schedule = ring_all_reduce(0, 2, 8, 4, 1 << 20);
            me.run(op, Algorithm::Ring, &schedule, &mut buf, None, LONG)
        } else {
            let op = me.next_op(CollectiveKind::Broadcast, 8, None, Some(1));
            let schedule = binomial_tree_broadcast(1, 2, 1, 8, 4, 1 << 20);
            me.run(op, Algorithm::BinomialTree, &schedule, &mut buf, None, LONG)
        }
    });
    assert!(results[1].is_ok(), "the broadcast root only sends");
    match &results[0] {
        Err(
            e @ Error::CollectiveMismatch {
                rank: 0,
                mine,
                peer: 1,
                theirs,
            },
        ) => {
            assert_eq!(mine.kind, CollectiveKind::AllReduce);
            assert_eq!(theirs.kind, CollectiveKind::Broadcast);
            let message = e.to_string();
            assert!(
                message.contains("all_reduce") && message.contains("broadcast"),
                "{message}"
            );
        }
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

#[test]
fn a_rank_that_never_runs_is_a_timeout_naming_it_with_the_bytes_moved() {
    let (n, count) = (3, 6);
    let start = Instant::now();
    let results = run_group(n, MemoryConfig::default(), 1 << 20, |me| {
        if me.rank == 2 {
            return None;
        }
        let mut buf = inputs(me.rank, count, exact);
        let op = me.next_op(CollectiveKind::AllReduce, count, Some(ReduceOp::Sum), None);
        let schedule = ring_all_reduce(me.rank, n, count, 4, 1 << 20);
        Some(me.run(op, Algorithm::Ring, &schedule, &mut buf, None, SHORT))
    });
    assert!(start.elapsed() < LONG);
    // Rank 0 receives from rank 2: four frames of a 2-element segment, none arrived.
    match &results[0] {
        Some(Err(Error::Timeout {
            rank: 0,
            peer: 2,
            moved: 0,
            expected,
            timeout,
            ..
        })) => {
            assert_eq!(*expected, 4 * (FRAME_HEADER_LEN as u64 + 8));
            assert_eq!(*timeout, SHORT);
        }
        other => panic!("rank 0: expected a timeout naming rank 2, got {other:?}"),
    }
    // Rank 1 got rank 0's first frame, then waited for the next one.
    match &results[1] {
        Some(Err(Error::Timeout {
            rank: 1,
            peer: 0,
            moved,
            expected,
            ..
        })) => {
            assert_eq!(*moved, FRAME_HEADER_LEN as u64 + 8);
            assert_eq!(*expected, 4 * (FRAME_HEADER_LEN as u64 + 8));
        }
        other => panic!("rank 1: expected a timeout naming rank 0, got {other:?}"),
    }
}

/// Writes all of `bytes` to `peer`, waiting when the pipe is full.
#[test]
fn a_mismatched_frame_never_lands_in_the_callers_buffer() {
    // Rank 0 is the root of a broadcast (it only sends); rank 1 is in an all-gather, which
    // stores what it receives straight into the caller's buffer.
    let results = run_group(2, config(1 << 16, 1 << 16), 1 << 20, |me| {
        if me.rank == 0 {
            let mut buf = inputs(0, 8, exact);
            let op = me.next_op(CollectiveKind::Broadcast, 8, None, Some(0));
            let schedule = binomial_tree_broadcast(0, 2, 0, 8, 4, 1 << 20);
            let outcome = me.run(op, Algorithm::BinomialTree, &schedule, &mut buf, None, LONG);
            (outcome, buf)
        } else {
            let mut buf = vec![UNSET; 8];
            buf[4..].copy_from_slice(&[1.0; 4]); // rank 1's own block
            let op = me.next_op(CollectiveKind::AllGather, 8, None, None);
            let schedule = ring_all_gather(1, 2, 8, 4, 1 << 20);
            let outcome = me.run(op, Algorithm::Ring, &schedule, &mut buf, None, LONG);
            (outcome, buf)
        }
    });
    let (outcome, buf) = &results[1];
    assert!(
        matches!(
            outcome,
            Err(Error::CollectiveMismatch {
                rank: 1,
                peer: 0,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert_eq!(
        buf[..4],
        [UNSET; 4],
        "the broadcast's bytes must not land in the all-gather's buffer"
    );
}

fn write_all(transport: &mut MemoryTransport, peer: usize, mut bytes: &[u8]) {
    let deadline = Instant::now() + LONG;
    while !bytes.is_empty() {
        match transport.write_some(peer, &[IoSlice::new(bytes)]) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let ready = transport.wait(Some(peer), None, deadline).unwrap();
                assert_eq!(ready, Readiness::Ready);
            }
            Err(e) => panic!("write to rank {peer}: {e}"),
        }
    }
}

/// Rank 0 receives 4 elements from rank 1 with `recv_from`; rank 1 runs `sender`.
fn receive_from_impostor(sender: impl Fn(&mut MemoryTransport) + Sync) -> Result<(), Error> {
    let message = OpDesc::send_recv(1, DType::F32, 4, 0);
    let mut results = run_group(2, config(16, 5), 1 << 20, |me| {
        if me.rank == 1 {
            sender(&mut me.transport);
            return Ok(());
        }
        let schedule = recv_from(1, 4, 4, 1 << 20);
        let mut buf = vec![0.0f32; 4];
        me.run(message, Algorithm::Direct, &schedule, &mut buf, None, LONG)
    });
    results.swap_remove(0)
}

fn header(algorithm: Algorithm, payload_len: u32) -> [u8; FRAME_HEADER_LEN] {
    FrameHeader {
        op: OpDesc::send_recv(1, DType::F32, 4, 0),
        algorithm,
        payload_len,
    }
    .encode()
}

#[test]
fn a_wrong_payload_length_is_a_protocol_error() {
    let result = receive_from_impostor(|t| write_all(t, 0, &header(Algorithm::Direct, 12)));
    assert_protocol_error_from_rank_1(result, "expected a 16-byte chunk");
}

/// Asserts that rank 0 got a protocol error from rank 1 whose reason mentions `needle`.
fn assert_protocol_error_from_rank_1(result: Result<(), Error>, needle: &str) {
    match result {
        Err(Error::Protocol {
            rank: 0,
            peer: 1,
            reason,
            ..
        }) => assert!(reason.contains(needle), "{reason}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn a_wrong_algorithm_is_a_protocol_error() {
    let result = receive_from_impostor(|t| {
        write_all(t, 0, &header(Algorithm::Chain, 16));
        write_all(t, 0, &[0; 16]);
    });
    assert_protocol_error_from_rank_1(result, "chain algorithm");
}

#[test]
fn garbage_is_a_protocol_error() {
    let result = receive_from_impostor(|t| write_all(t, 0, &[b'G'; FRAME_HEADER_LEN + 16]));
    match result {
        Err(Error::Protocol { reason, .. }) => assert!(reason.contains("magic"), "{reason}"),
        other => panic!("expected a protocol error, got {other:?}"),
    }
}

#[test]
fn a_peer_that_closes_mid_frame_is_lost() {
    let mut ranks = MemoryTransport::mesh(2, config(16, 5));
    let mut impostor = ranks.pop().unwrap();
    let mut me = Rank {
        rank: 0,
        n: 2,
        chunk: 1 << 20,
        transport: ranks.pop().unwrap(),
        seq: 0,
        scratch: Vec::new(),
    };
    let result = std::thread::scope(|s| {
        s.spawn(move || {
            // Half a header, then the endpoint closes: rank 0 reads the 10 bytes, then
            // end-of-stream.
            write_all(&mut impostor, 0, &header(Algorithm::Direct, 16)[..10]);
        });
        let schedule = recv_from(1, 4, 4, me.chunk);
        let op = OpDesc::send_recv(1, DType::F32, 4, 0);
        let mut buf = vec![0.0f32; 4];
        me.run(op, Algorithm::Direct, &schedule, &mut buf, None, LONG)
    });
    match result {
        Err(Error::PeerLost {
            rank: 1,
            observer: 0,
            reason,
            ..
        }) => assert!(reason.contains("closed"), "{reason}"),
        other => panic!("expected a lost peer, got {other:?}"),
    }
}

#[test]
fn sending_to_a_dropped_endpoint_is_a_lost_peer() {
    let mut ranks = MemoryTransport::mesh(2, config(8, 3));
    drop(ranks.pop());
    let mut me = Rank {
        rank: 0,
        n: 2,
        chunk: 1 << 20,
        transport: ranks.pop().unwrap(),
        seq: 0,
        scratch: Vec::new(),
    };
    let outgoing = inputs(0, 4, exact);
    let op = OpDesc::send_recv(1, DType::F32, 4, 0);
    let schedule = send_to(1, 4, 4, me.chunk);
    match me.run(
        op,
        Algorithm::Direct,
        &schedule,
        &mut [],
        Some(&outgoing),
        LONG,
    ) {
        Err(Error::PeerLost {
            rank: 1,
            observer: 0,
            ..
        }) => {}
        other => panic!("expected a lost peer, got {other:?}"),
    }
}

#[test]
fn a_schedule_that_cannot_progress_is_an_invalid_argument() {
    let mut ranks = MemoryTransport::mesh(2, MemoryConfig::default());
    let mut me = Rank {
        rank: 0,
        n: 2,
        chunk: 1 << 20,
        transport: ranks.swap_remove(0),
        seq: 0,
        scratch: Vec::new(),
    };
    let schedule = Schedule {
        sends: vec![SendStep {
            peer: 1,
            range: 0..1,
            after_recv: Some(0),
        }],
        recvs: vec![],
    };
    let op = me.next_op(CollectiveKind::Broadcast, 1, None, Some(0));
    let mut buf = [1.0f32];
    match me.run(op, Algorithm::Chain, &schedule, &mut buf, None, LONG) {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains("cannot make progress"), "{message}")
        }
        other => panic!("expected an invalid argument, got {other:?}"),
    }
}

#[test]
fn a_stalled_send_tries_again_and_publishes_each_attempt() {
    // Rank 1 never reads: rank 0's send fills the 64-byte pipe and stalls. Nothing wakes
    // it, yet it must try again every RETRY_EVERY, so a peer that asks sees fresh waits,
    // all on rank 1, none of which moved a byte.
    let mut ranks = MemoryTransport::mesh(2, config(64, 64));
    let _reader = ranks.pop();
    let mut transport = ranks.pop().unwrap();
    let activity = Probe::default();
    let op = OpDesc::send_recv(1, DType::F32, 1024, 0);
    activity.begin(op, Algorithm::Direct);
    let timeout = RETRY_EVERY * 6;
    let started = Instant::now();
    let call = Call {
        rank: 0,
        world_size: 2,
        op,
        algorithm: Algorithm::Direct,
        elem_size: 4,
        reduce: None,
        deadline: started + timeout,
        timeout,
        report: ProgressSink {
            probe: Some(&activity),
            hooks: &NoHooks,
        },
    };
    let outgoing = vec![1.0f32; 1024];
    let result = execute(
        &mut transport,
        &send_to(1, 1024, 4, 1 << 20),
        &call,
        &mut [],
        Some(bytemuck::cast_slice(&outgoing)),
        &mut Vec::new(),
    );
    let took = started.elapsed();
    assert!(
        matches!(
            result,
            Err(Error::Timeout {
                peer: 1,
                moved: 64,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(took >= timeout && took < LONG, "{took:?}");
    let seen = activity.snapshot();
    assert_eq!(seen.blocked_on, Some(1));
    assert!(seen.waits >= 3, "tried again only {} times", seen.waits);
    assert_eq!((seen.waiting_on_since, seen.stalled_since), (1, 1));
}
