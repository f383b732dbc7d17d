use std::time::{Duration, Instant};

use super::*;
use crate::control::PairCounts;
use crate::wire::Algorithm;
use crate::CollectiveKind;
use crate::Sequence;
use crate::{DType, OpDesc, ReduceOp};

fn all_reduce(seq: u64) -> (OpDesc, Algorithm) {
    (
        OpDesc::all_reduce(seq, DType::F32, 1024, ReduceOp::Sum),
        Algorithm::Ring,
    )
}

fn broadcast(seq: u64) -> (OpDesc, Algorithm) {
    (
        OpDesc::broadcast(seq, DType::F32, 1024, 0),
        Algorithm::BinomialTree,
    )
}

fn blocked(op: (OpDesc, Algorithm), on: usize) -> Snapshot {
    let sequence = if op.0.kind == CollectiveKind::SendRecv {
        Sequence::ReceivedFrom(on)
    } else {
        Sequence::Collective
    };
    Snapshot {
        current: Some(op),
        blocked_on: Some(on),
        sequence: Some(sequence),
        ..Snapshot::default()
    }
}

fn drain(s: &mut Sentinel) -> Vec<(usize, ControlMessage)> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

/// Runs two machines against each other in memory until neither has anything to send.
fn exchange(a: (&mut Sentinel, usize, &Snapshot), b: (&mut Sentinel, usize, &Snapshot)) {
    let now = Instant::now();
    loop {
        let from_a = drain(a.0);
        let from_b = drain(b.0);
        if from_a.is_empty() && from_b.is_empty() {
            return;
        }
        for (to, m) in from_a {
            assert_eq!(to, b.1);
            b.0.handle_message(now, a.1, m, b.2);
        }
        for (to, m) in from_b {
            assert_eq!(to, a.1);
            a.0.handle_message(now, b.1, m, a.2);
        }
    }
}

#[test]
fn a_rank_asks_only_after_it_has_been_blocked_for_a_while() {
    let mut s = Sentinel::new(2, 3);
    let t0 = Instant::now();
    let mine = blocked(broadcast(1), 0);
    s.handle_timeout(t0, &mine);
    s.handle_timeout(t0 + ASK_AFTER / 2, &mine);
    assert!(drain(&mut s).is_empty(), "asked too early");
    s.handle_timeout(t0 + ASK_AFTER, &mine);
    let sent = drain(&mut s);
    assert!(
        matches!(sent.as_slice(), [(0, ControlMessage::Ask { .. })]),
        "{sent:?}"
    );
    // Not again until ASK_EVERY has passed.
    s.handle_timeout(t0 + ASK_AFTER + TICK, &mine);
    assert!(drain(&mut s).is_empty());
    s.handle_timeout(t0 + ASK_AFTER + ASK_EVERY, &mine);
    assert_eq!(drain(&mut s).len(), 1);
}

#[test]
fn an_idle_or_unblocked_rank_asks_nobody() {
    let mut s = Sentinel::new(0, 2);
    let t0 = Instant::now();
    let running = Snapshot {
        current: Some(all_reduce(1)),
        ..Snapshot::default()
    };
    for i in 0..20 {
        s.handle_timeout(t0 + TICK * i, &Snapshot::default());
        s.handle_timeout(t0 + TICK * i, &running);
    }
    assert!(drain(&mut s).is_empty());
}

#[test]
fn a_mismatch_no_frame_shows_is_found_by_both_sides() {
    // N=3, rank 2 in broadcast(root=0) while rank 0 is in all_reduce, both op #1.
    let (mine2, mine0) = (blocked(broadcast(1), 0), blocked(all_reduce(1), 1));
    let mut r2 = Sentinel::new(2, 3);
    let mut r0 = Sentinel::new(0, 3);
    let t0 = Instant::now();
    r2.handle_timeout(t0, &mine2);
    r2.handle_timeout(t0 + ASK_AFTER, &mine2);
    exchange((&mut r2, 2, &mine2), (&mut r0, 0, &mine0));
    for (s, me, peer) in [(&mut r2, 2, 0), (&mut r0, 0, 2)] {
        match s.poll_verdict() {
            Some(Verdict::Broken(Error::CollectiveMismatch {
                rank,
                peer: p,
                mine,
                theirs,
            })) => {
                assert_eq!((rank, p), (me, peer));
                assert_ne!(mine, theirs);
                assert_eq!((mine.seq, theirs.seq), (1, 1));
            }
            other => panic!("rank {me}: expected a mismatch, got {other:?}"),
        }
    }
}

#[test]
fn a_slow_peer_is_not_a_mismatch() {
    let t0 = Instant::now();
    // The peer is idle, in an earlier op, in the same op, or in a point-to-point message.
    for theirs in [
        Snapshot::default(),
        blocked(broadcast(4), 1),
        blocked(all_reduce(5), 1),
        Snapshot {
            current: Some((OpDesc::send_recv(5, DType::F32, 1024, 9), Algorithm::Direct)),
            blocked_on: Some(1),
            ..Snapshot::default()
        },
    ] {
        let mine = blocked(all_reduce(5), 0);
        let mut me = Sentinel::new(1, 2);
        let mut peer = Sentinel::new(0, 2);
        me.handle_timeout(t0, &mine);
        me.handle_timeout(t0 + ASK_AFTER, &mine);
        exchange((&mut me, 1, &mine), (&mut peer, 0, &theirs));
        assert!(me.poll_verdict().is_none(), "{theirs:?}");
        assert!(peer.poll_verdict().is_none(), "{theirs:?}");
    }
}

#[test]
fn different_algorithms_for_the_same_op_are_named() {
    let t0 = Instant::now();
    let mine = blocked(all_reduce(3), 0);
    let theirs = blocked((all_reduce(3).0, Algorithm::RecursiveDoubling), 1);
    let mut me = Sentinel::new(1, 2);
    let mut peer = Sentinel::new(0, 2);
    me.handle_timeout(t0, &mine);
    me.handle_timeout(t0 + ASK_AFTER, &mine);
    exchange((&mut me, 1, &mine), (&mut peer, 0, &theirs));
    match me.poll_verdict() {
        Some(Verdict::Broken(Error::Protocol { reason, .. })) => {
            assert!(reason.contains("recursive doubling"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_abort_reaches_everyone_once_and_is_passed_on() {
    let now = Instant::now();
    let n = 4;
    let mut ranks: Vec<Sentinel> = (0..n).map(|r| Sentinel::new(r, n)).collect();
    ranks[2].abort_caused(2, "op #17 all_reduce: timed out".into(), Some(1));
    // Rank 2 "dies" after telling only rank 0.
    let first = drain(&mut ranks[2]);
    assert_eq!(first.len(), n - 1);
    let (to, notice) = first.into_iter().find(|(to, _)| *to == 0).unwrap();
    ranks[to].handle_message(now, 2, notice, &Snapshot::default());
    // Rank 0 passes it on to 1 and 3 (not back to 2); they conclude, and pass on nothing
    // more than once.
    let mut queue: Vec<(usize, usize, ControlMessage)> = drain(&mut ranks[0])
        .into_iter()
        .map(|(to, m)| (0, to, m))
        .collect();
    assert_eq!(
        queue.iter().map(|(_, to, _)| *to).collect::<Vec<_>>(),
        [1, 3]
    );
    while let Some((from, to, m)) = queue.pop() {
        ranks[to].handle_message(now, from, m, &Snapshot::default());
        queue.extend(drain(&mut ranks[to]).into_iter().map(|(t, m)| (to, t, m)));
    }
    for r in [0, 1, 3] {
        match ranks[r].poll_verdict() {
            // The cause travels with the notice, however far it is passed on.
            Some(Verdict::Aborted {
                origin: 2,
                reason,
                cause: Some(1),
            }) => assert!(reason.contains("op #17")),
            other => panic!("rank {r}: {other:?}"),
        }
        assert!(
            ranks[r].poll_verdict().is_none(),
            "rank {r} concluded twice"
        );
        assert!(ranks[r].is_aborted());
    }
}

#[test]
fn an_aborted_rank_stops_asking_and_leaving_is_remembered() {
    let mut s = Sentinel::new(0, 2);
    s.abort(0, "bye".into());
    drain(&mut s);
    let t0 = Instant::now();
    let mine = blocked(all_reduce(1), 1);
    s.handle_timeout(t0, &mine);
    s.handle_timeout(t0 + Duration::from_secs(5), &mine);
    assert!(drain(&mut s).is_empty());
    let mut peer = Sentinel::new(1, 2);
    peer.handle_message(t0, 0, ControlMessage::Leaving, &Snapshot::default());
    assert!(peer.has_left(0) && !peer.has_left(1));
}

// ---- Deadlocks between point-to-point messages and collectives (rule 1) ----

fn recv(from: usize, msg: u64) -> ((OpDesc, Algorithm), Sequence) {
    (
        (OpDesc::send_recv(msg, DType::F32, 8, 0), Algorithm::Direct),
        Sequence::ReceivedFrom(from),
    )
}

fn send(to: usize, msg: u64) -> ((OpDesc, Algorithm), Sequence) {
    (
        (
            OpDesc::send_recv(msg, DType::F32, 1 << 24, 0),
            Algorithm::Direct,
        ),
        Sequence::SentTo(to),
    )
}

fn collective(op: (OpDesc, Algorithm)) -> ((OpDesc, Algorithm), Sequence) {
    (op, Sequence::Collective)
}

/// A rank in `call`, blocked on `on`, having started `collectives` collectives and `sent`
/// / `received` messages to / from `on`.
fn doing(
    (op, sequence): ((OpDesc, Algorithm), Sequence),
    on: usize,
    (collectives, sent, received): (u64, u64, u64),
) -> Snapshot {
    Snapshot {
        current: Some(op),
        blocked_on: Some(on),
        sequence: Some(sequence),
        waits: 1,
        waiting_on_since: 1,
        stalled_since: 1,
        counts: Some(PairCounts {
            peer: on,
            collectives,
            sent,
            received,
        }),
    }
}

/// Rank 0 (`mine0`) and rank 1 (`mine1`) of a group of `n`: rank 0 asks, the two
/// machines talk, and each says what it concluded.
fn ask_and_judge(n: usize, mine0: &Snapshot, mine1: &Snapshot) -> [Option<Verdict>; 2] {
    let mut r0 = Sentinel::new(0, n);
    let mut r1 = Sentinel::new(1, n);
    let t0 = Instant::now();
    r0.handle_timeout(t0, mine0);
    r0.handle_timeout(t0 + ASK_AFTER, mine0);
    exchange((&mut r0, 0, mine0), (&mut r1, 1, mine1));
    [r0.poll_verdict(), r1.poll_verdict()]
}

fn deadlock_text(verdict: Option<Verdict>, rank: usize, peer: usize) -> String {
    match verdict {
        Some(Verdict::Broken(
            error @ Error::Deadlock {
                rank: r, peer: p, ..
            },
        )) => {
            assert_eq!((r, p), (rank, peer));
            error.to_string()
        }
        other => panic!("rank {rank}: expected a deadlock, got {other:?}"),
    }
}

#[test]
fn a_recv_against_a_collective_is_a_deadlock_both_sides_name() {
    // Rank 0 waits for rank 1's first message; rank 1 is in all_reduce #1, which rank 0
    // has not entered, and has sent rank 0 nothing.
    let mine0 = doing(recv(1, 1), 1, (0, 0, 1));
    let mine1 = doing(collective(all_reduce(1)), 0, (1, 0, 0));
    let [v0, v1] = ask_and_judge(3, &mine0, &mine1);
    let text0 = deadlock_text(v0, 0, 1);
    assert!(
        text0.starts_with(
            "rank 0 is in recv(from rank 1, msg #1, tag=0, 8 x f32) while rank 1 is in op #1 all_reduce(sum, 1024 x f32), waiting for rank 0: the two calls wait on each other"
        ),
        "{text0}"
    );
    assert!(
        text0.contains("rank 1 has started only 0 send(s) to rank 0"),
        "{text0}"
    );
    let text1 = deadlock_text(v1, 1, 0);
    assert!(
        text1.starts_with("rank 1 is in op #1 all_reduce(sum, 1024 x f32) while rank 0 is in recv(from rank 1, msg #1"),
        "{text1}"
    );
}

#[test]
fn every_collective_that_needs_the_receiver_is_a_deadlock() {
    let needs_rank0 = [
        OpDesc::barrier(4),
        OpDesc::all_reduce(4, DType::F32, 8, ReduceOp::Max),
        OpDesc::broadcast(4, DType::F32, 8, 0),
        OpDesc::new(
            4,
            CollectiveKind::Reduce,
            DType::F32,
            8,
            Some(ReduceOp::Sum),
            Some(1),
        ),
        OpDesc::new(4, CollectiveKind::AllGather, DType::F32, 8, None, None),
        OpDesc::new(
            4,
            CollectiveKind::ReduceScatter,
            DType::F32,
            8,
            Some(ReduceOp::Sum),
            None,
        ),
        OpDesc::new(4, CollectiveKind::AllToAll, DType::F32, 8, None, None),
    ];
    for op in needs_rank0 {
        // Rank 0 has finished three collectives and waits for rank 1's message #2; rank 1
        // sent #1 long ago and is in op #4.
        let mine0 = doing(recv(1, 2), 1, (3, 0, 2));
        let mine1 = doing(collective((op, Algorithm::Ring)), 0, (4, 1, 0));
        let [v0, v1] = ask_and_judge(2, &mine0, &mine1);
        let text = deadlock_text(v0, 0, 1);
        assert!(text.contains(&op.to_string()), "{text}");
        deadlock_text(v1, 1, 0);
    }
}

#[test]
fn two_receives_waiting_for_each_other_are_a_deadlock() {
    let mine0 = doing(recv(1, 1), 1, (0, 0, 1));
    let mine1 = doing(recv(0, 1), 0, (0, 0, 1));
    let [v0, v1] = ask_and_judge(2, &mine0, &mine1);
    let text = deadlock_text(v0, 0, 1);
    assert!(
        text.contains("while rank 1 is in recv(from rank 0, msg #1"),
        "{text}"
    );
    deadlock_text(v1, 1, 0);
}

#[test]
fn slower_peers_are_never_blamed() {
    let cases: Vec<(&str, Snapshot, Snapshot)> = vec![
        (
            "rank 1 sent message #1 before it entered the all-reduce: it is on its way",
            doing(recv(1, 1), 1, (0, 0, 1)),
            doing(collective(all_reduce(1)), 0, (1, 1, 0)),
        ),
        (
            "rank 0 already ran all-reduce #1: its part is on its way to rank 1",
            doing(recv(1, 1), 1, (1, 0, 1)),
            doing(collective(all_reduce(1)), 0, (1, 0, 0)),
        ),
        (
            "rank 1 is sending message #1 now",
            doing(recv(1, 1), 1, (0, 0, 1)),
            doing(send(0, 1), 0, (0, 1, 0)),
        ),
        (
            "rank 1 waits for rank 2, not for rank 0",
            doing(recv(1, 1), 1, (0, 0, 1)),
            doing(collective(all_reduce(1)), 2, (1, 0, 0)),
        ),
        (
            "a broadcast from rank 2 does not need rank 0",
            doing(recv(1, 1), 1, (0, 0, 1)),
            doing(
                collective((OpDesc::broadcast(1, DType::F32, 8, 2), Algorithm::Chain)),
                0,
                (1, 0, 0),
            ),
        ),
        (
            "a reduce to rank 2 may finish on rank 1 without rank 0",
            doing(recv(1, 1), 1, (0, 0, 1)),
            doing(
                collective((
                    OpDesc::new(
                        1,
                        CollectiveKind::Reduce,
                        DType::F32,
                        8,
                        Some(ReduceOp::Sum),
                        Some(2),
                    ),
                    Algorithm::Ring,
                )),
                0,
                (1, 0, 0),
            ),
        ),
        (
            "an all-reduce of nothing needs nobody",
            doing(recv(1, 1), 1, (0, 0, 1)),
            doing(
                collective((
                    OpDesc::all_reduce(1, DType::F32, 0, ReduceOp::Sum),
                    Algorithm::Ring,
                )),
                0,
                (1, 0, 0),
            ),
        ),
        (
            "rank 1's receive of message #1 is satisfied: rank 0 sent it",
            doing(recv(1, 1), 1, (0, 1, 1)),
            doing(recv(0, 1), 0, (0, 0, 1)),
        ),
        (
            "rank 1 is behind in collectives (op #4 while rank 0 is in op #5)",
            doing(collective(all_reduce(5)), 1, (5, 0, 0)),
            doing(collective(all_reduce(4)), 0, (4, 0, 0)),
        ),
        (
            "rank 0 is sending: a send may finish into the transport's buffer",
            doing(send(1, 1), 1, (0, 1, 0)),
            doing(collective(all_reduce(1)), 0, (1, 0, 0)),
        ),
        (
            "rank 1 said nothing about its counts",
            doing(recv(1, 1), 1, (0, 0, 1)),
            Snapshot {
                counts: None,
                ..doing(collective(all_reduce(1)), 0, (1, 0, 0))
            },
        ),
        (
            "rank 1's counts are about another rank",
            doing(recv(1, 1), 1, (0, 0, 1)),
            Snapshot {
                counts: Some(PairCounts {
                    peer: 2,
                    ..PairCounts::default()
                }),
                ..doing(collective(all_reduce(1)), 0, (1, 0, 0))
            },
        ),
        (
            "rank 1 did not say how its call was numbered",
            doing(recv(1, 1), 1, (0, 0, 1)),
            Snapshot {
                sequence: None,
                ..doing(recv(0, 1), 0, (0, 0, 1))
            },
        ),
        (
            "rank 1 is idle",
            doing(recv(1, 1), 1, (0, 0, 1)),
            Snapshot::default(),
        ),
    ];
    for (why, mine0, mine1) in cases {
        let [v0, v1] = ask_and_judge(3, &mine0, &mine1);
        assert!(v0.is_none() && v1.is_none(), "{why}: {v0:?} / {v1:?}");
    }
}

#[test]
fn a_stale_answer_still_proves_a_deadlock_because_counts_only_grow() {
    // The answer was taken before rank 0's current recv began: rank 1 was already in
    // all-reduce #1 with nothing sent. Rank 1 cannot have sent message #1 since without
    // finishing all-reduce #1, which needs rank 0.
    let mine0 = doing(recv(1, 1), 1, (0, 0, 1));
    let earlier1 = doing(collective(all_reduce(1)), 0, (1, 0, 0));
    let mut r0 = Sentinel::new(0, 2);
    r0.handle_message(
        Instant::now(),
        1,
        ControlMessage::Ask {
            nonce: 1,
            snapshot: earlier1,
        },
        &mine0,
    );
    deadlock_text(r0.poll_verdict(), 0, 1);
}

// ---- Two sends that filled the connection both ways (rule 2) ----

fn broadcast_from(root: usize) -> ((OpDesc, Algorithm), Sequence) {
    collective((
        OpDesc::broadcast(1, DType::F32, 1 << 24, root),
        Algorithm::Chain,
    ))
}

/// A rank stalled in `call` on `on`: `waits` waits, none of which moved a byte since
/// wait number `since`.
fn stalled(call: ((OpDesc, Algorithm), Sequence), on: usize, waits: u64, since: u64) -> Snapshot {
    Snapshot {
        waits,
        waiting_on_since: since,
        stalled_since: since,
        ..doing(call, on, (0, 0, 0))
    }
}

/// Rank 0 asks rank 1 at `t0 + ASK_AFTER`, then again as soon as it asks (after
/// [`FOLLOW_UP`] when the first answer showed two calls that only send, else after
/// [`ASK_EVERY`]); the snapshots of both ranks are `first` at the first question and
/// `second` at the second. Returns what rank 0 concluded after each answer.
fn ask_twice(first: [&Snapshot; 2], second: [&Snapshot; 2]) -> (Option<Verdict>, Option<Verdict>) {
    let mut r0 = Sentinel::new(0, 2);
    let mut r1 = Sentinel::new(1, 2);
    let t0 = Instant::now();
    r0.handle_timeout(t0, first[0]);
    r0.handle_timeout(t0 + ASK_AFTER, first[0]);
    exchange((&mut r0, 0, first[0]), (&mut r1, 1, first[1]));
    let after_first = r0.poll_verdict();
    let following_up = r0.both_sending.is_some();
    r0.handle_timeout(t0 + ASK_AFTER + FOLLOW_UP - TICK, second[0]);
    assert!(drain(&mut r0).is_empty(), "asked again too early");
    let again = t0 + ASK_AFTER + if following_up { FOLLOW_UP } else { ASK_EVERY };
    r0.handle_timeout(again, second[0]);
    let asked = drain(&mut r0);
    assert!(
        matches!(asked.as_slice(), [(1, ControlMessage::Ask { .. })]),
        "following up: {following_up}, {asked:?}"
    );
    for (_, m) in asked {
        r1.handle_message(t0, 0, m, second[1]);
    }
    for (_, m) in drain(&mut r1) {
        r0.handle_message(t0, 1, m, second[0]);
    }
    (after_first, r0.poll_verdict())
}

#[test]
fn two_sends_that_filled_the_connection_are_named_on_the_second_answer() {
    // Rank 0 sends 64 MiB to rank 1 while rank 1 broadcasts 64 MiB from itself: both
    // only write, each to the other, and between the two answers both kept trying.
    let first = [
        &stalled(send(1, 1), 1, 3, 1),
        &stalled(broadcast_from(1), 0, 5, 2),
    ];
    let second = [
        &stalled(send(1, 1), 1, 5, 1),
        &stalled(broadcast_from(1), 0, 7, 2),
    ];
    let (after_first, after_second) = ask_twice(first, second);
    assert!(
        after_first.is_none(),
        "one answer proves nothing: {after_first:?}"
    );
    let text = deadlock_text(after_second, 0, 1);
    assert!(
        text.starts_with(
            "rank 0 is in send(to rank 1, msg #1, tag=0, 16777216 x f32) while rank 1 is in op #1 broadcast(root=1, 16777216 x f32), waiting for rank 0"
        ) && text.contains("full both ways"),
        "{text}"
    );
}

#[test]
fn two_sends_are_not_blamed_without_fresh_stalls_on_both_sides() {
    let me = |waits, since| stalled(send(1, 1), 1, waits, since);
    let them = |waits, since| stalled(broadcast_from(1), 0, waits, since);
    let first = [&me(3, 1), &them(5, 2)];
    let cases = [
        ("the peer tried only once more", me(5, 1), them(6, 2)),
        (
            "the peer moved bytes since its first answer",
            me(5, 1),
            them(7, 6),
        ),
        ("this rank tried only once more", me(4, 1), them(7, 2)),
        ("this rank moved bytes since it asked", me(5, 4), them(7, 2)),
        (
            "the peer finished its broadcast and now receives",
            me(5, 1),
            doing(recv(0, 1), 0, (1, 0, 1)),
        ),
        (
            "the peer is in another call",
            me(5, 1),
            stalled(send(0, 1), 0, 7, 2),
        ),
    ];
    for (why, mine, theirs) in cases {
        let (after_first, after_second) = ask_twice(first, [&mine, &theirs]);
        assert!(
            after_first.is_none() && after_second.is_none(),
            "{why}: {after_second:?}"
        );
    }
    // A reader is never part of rule 2: rank 1 receiving from rank 0 drains rank 0's
    // sends (its frames, or a mismatch).
    let reader = doing(recv(0, 1), 0, (0, 0, 1));
    let (a, b) = ask_twice([&me(3, 1), &reader], [&me(9, 1), &reader]);
    assert!(a.is_none() && b.is_none(), "{a:?} {b:?}");
}

#[test]
fn two_sends_need_this_rank_in_its_call_since_it_asked() {
    // Rank 0 asked while still in an earlier call: the answer may predate its send.
    let mut r0 = Sentinel::new(0, 2);
    let mut r1 = Sentinel::new(1, 2);
    let t0 = Instant::now();
    let earlier = doing(recv(1, 1), 1, (0, 0, 1));
    r0.handle_timeout(t0, &earlier);
    r0.handle_timeout(t0 + ASK_AFTER, &earlier);
    let sending = stalled(send(1, 1), 1, 3, 1);
    let theirs = stalled(broadcast_from(1), 0, 5, 2);
    for (_, m) in drain(&mut r0) {
        r1.handle_message(t0, 0, m, &theirs);
    }
    for (_, m) in drain(&mut r1) {
        r0.handle_message(t0, 1, m, &sending);
    }
    assert!(r0.both_sending.is_none(), "{:?}", r0.both_sending);
    assert!(r0.poll_verdict().is_none());
}
