use std::time::{Duration, Instant};

use super::*;
use crate::wire::Algorithm;
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
    Snapshot {
        current: Some(op),
        blocked_on: Some(on),
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
        blocked_on: None,
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
    ranks[2].abort(2, "op #17 all_reduce: mismatch".into());
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
            Some(Verdict::Aborted { origin: 2, reason }) => assert!(reason.contains("op #17")),
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
