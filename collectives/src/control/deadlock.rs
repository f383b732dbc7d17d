//! When two ranks' current calls provably wait on each other: a point-to-point message
//! against a collective, two receives that wait for each other's future sends, or two
//! sends that have filled the connection both ways. Pure functions of two
//! [`Snapshot`]s; the [`Sentinel`](super::Sentinel) decides when to apply them.
//!
//! Each rule proves a deadlock; none fires on a peer that is only slower. The facts they
//! stand on:
//!
//! - a rank runs one call at a time, in issue order: a call it has not started starts
//!   only after its current call finishes;
//! - a snapshot's counts ([`PairCounts`]) count calls from the moment they are numbered,
//!   before any byte moves, and only grow: "rank b had started fewer than k sends to a"
//!   stays true of every earlier moment;
//! - the bytes of one direction of one pair are read in the order they were written, and
//!   a rank reads a frame only in the call it belongs to (any other frame is a mismatch,
//!   an error, never a hang).
//!
//! **Rule 1: each call needs a call the other rank has not started.** Rank a is in call
//! X, rank b in call Y (at possibly different moments). If X cannot finish before b
//! starts a call that b had not started when it was in Y, and Y cannot finish before a
//! starts a call a had not started when it was in X, then the later of the two to
//! finish would have needed the other to finish first: neither finishes. "X needs a
//! call b has not started" is one of:
//! - X is `recv` of a's message #k from b, and b had started fewer than k sends to a
//!   (message #k is written only by b's k-th send);
//! - X is collective #s, b had started fewer than s collectives, and X's result cannot
//!   exist without b's part: barrier, all-reduce, all-gather, reduce-scatter, all-to-all
//!   (with elements), reduce on its root, broadcast from b.
//!
//! Sends never satisfy rule 1: a send may finish into the transport's buffer alone.
//!
//! **Rule 2: two sends that filled the connection both ways.** Both calls only send
//! (a `send`, or a broadcast from its own root) and each is blocked writing to the other.
//! Neither reads from the other while in its call, so once the bytes from a to b fill the
//! connection while b is in Y, and those from b to a fill it while a is in X, neither call
//! ever finishes. A write that moved nothing shows a full connection; the
//! [`Sentinel`](super::Sentinel) makes sure both were seen after a moment at which both
//! ranks were already in these calls (see [`stalled_on`]).

use super::{PairCounts, Snapshot};
use crate::Sequence;
use crate::{CallDesc, CollectiveKind, Error, OpDesc};

/// Whether rank `rank`'s part of collective `op` cannot finish before rank `other` has
/// started it: its result (or, for a barrier, its meaning) depends on `other`.
fn depends_on(op: &OpDesc, rank: usize, other: usize) -> bool {
    let root = op.root.map(|r| r as usize);
    let has_data = op.count > 0;
    match op.kind {
        CollectiveKind::Barrier => true,
        CollectiveKind::AllReduce
        | CollectiveKind::AllGather
        | CollectiveKind::ReduceScatter
        | CollectiveKind::AllToAll => has_data,
        CollectiveKind::Reduce => has_data && root == Some(rank),
        CollectiveKind::Broadcast => has_data && root == Some(other) && other != rank,
        CollectiveKind::SendRecv => false,
    }
}

/// Why rank `rank`'s `call` cannot finish before rank `other` starts a call it had not
/// started when it reported `other_counts` (its counts with `rank`), if it cannot.
fn needs_unstarted_call(
    rank: usize,
    call: &CallDesc,
    other: usize,
    other_counts: &PairCounts,
) -> Option<String> {
    match call.sequence {
        Sequence::ReceivedFrom(from) if from == other && other_counts.sent < call.op.seq => {
            Some(format!(
                "rank {rank}'s recv needs rank {other}'s message #{}, and rank {other} has started only {} send(s) to rank {rank}",
                call.op.seq, other_counts.sent
            ))
        }
        Sequence::Collective
            if other_counts.collectives < call.op.seq && depends_on(&call.op, rank, other) =>
        {
            Some(format!(
                "rank {rank}'s op #{} cannot finish without rank {other}, which has not entered it",
                call.op.seq
            ))
        }
        _ => None,
    }
}

fn deadlock(rank: usize, mine: CallDesc, peer: usize, theirs: CallDesc, why: String) -> Error {
    Error::Deadlock {
        rank,
        mine: Box::new(mine),
        peer,
        theirs: Box::new(theirs),
        why,
    }
}

/// Rule 1 (see the module documentation): `mine` is this rank's snapshot with its counts
/// for `peer`, `theirs` the peer's with its counts for this rank; both blocked on each
/// other. `None` unless it is a proof.
///
/// ```
/// use ringccl_collectives::control::{deadlock, PairCounts, Snapshot};
/// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, ReduceOp, Sequence};
///
/// // Rank 0 waits for rank 1's first message; rank 1 is in all_reduce #1, which rank 0
/// // has not entered, and has sent nothing to rank 0.
/// let recv = Snapshot {
///     current: Some((OpDesc::send_recv(1, DType::F32, 8, 0), Algorithm::Direct)),
///     sequence: Some(Sequence::ReceivedFrom(1)),
///     blocked_on: Some(1),
///     counts: Some(PairCounts { peer: 1, collectives: 0, sent: 0, received: 1 }),
///     ..Snapshot::default()
/// };
/// let all_reduce = Snapshot {
///     current: Some((OpDesc::all_reduce(1, DType::F32, 8, ReduceOp::Sum), Algorithm::Ring)),
///     sequence: Some(Sequence::Collective),
///     blocked_on: Some(0),
///     counts: Some(PairCounts { peer: 0, collectives: 1, sent: 0, received: 0 }),
///     ..Snapshot::default()
/// };
/// let error = deadlock::wait_on_each_other(0, 1, &recv, &all_reduce).unwrap();
/// assert!(error.to_string().starts_with(
///     "rank 0 is in recv(from rank 1, msg #1, tag=0, 8 x f32) while rank 1 is in op #1 all_reduce"
/// ));
/// ```
pub fn wait_on_each_other(
    rank: usize,
    peer: usize,
    mine: &Snapshot,
    theirs: &Snapshot,
) -> Option<Error> {
    if mine.blocked_on != Some(peer) || theirs.blocked_on != Some(rank) {
        return None;
    }
    let (my_call, their_call) = (mine.running_call()?, theirs.running_call()?);
    let my_counts = mine.counts.filter(|c| c.peer == peer)?;
    let their_counts = theirs.counts.filter(|c| c.peer == rank)?;
    let mine_needs = needs_unstarted_call(rank, &my_call, peer, &their_counts)?;
    let theirs_needs = needs_unstarted_call(peer, &their_call, rank, &my_counts)?;
    Some(deadlock(
        rank,
        my_call,
        peer,
        their_call,
        format!("{mine_needs}; {theirs_needs}"),
    ))
}

/// Whether `call`, run by `rank`, only writes: it reads from nobody.
fn only_sends(rank: usize, call: &CallDesc) -> bool {
    match call.sequence {
        Sequence::SentTo(_) => true,
        Sequence::Collective => {
            call.op.kind == CollectiveKind::Broadcast
                && call.op.root.map(|r| r as usize) == Some(rank)
        }
        Sequence::ReceivedFrom(_) => false,
    }
}

/// Rule 2's shape (see the module documentation): both calls only send and each is
/// blocked on the other. Returns the two calls; the proof also needs [`stalled_on`] on
/// both sides, after a moment when both were in these calls.
///
/// ```
/// use ringccl_collectives::control::{deadlock, Snapshot};
/// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, Sequence};
///
/// let send = Snapshot {
///     current: Some((OpDesc::send_recv(1, DType::F32, 1 << 24, 0), Algorithm::Direct)),
///     sequence: Some(Sequence::SentTo(1)),
///     blocked_on: Some(1),
///     ..Snapshot::default()
/// };
/// let broadcast = Snapshot {
///     current: Some((OpDesc::broadcast(1, DType::F32, 1 << 24, 1), Algorithm::Chain)),
///     sequence: Some(Sequence::Collective),
///     blocked_on: Some(0),
///     ..Snapshot::default()
/// };
/// assert!(deadlock::both_only_send(0, 1, &send, &broadcast).is_some());
/// ```
pub fn both_only_send(
    rank: usize,
    peer: usize,
    mine: &Snapshot,
    theirs: &Snapshot,
) -> Option<(CallDesc, CallDesc)> {
    if mine.blocked_on != Some(peer) || theirs.blocked_on != Some(rank) {
        return None;
    }
    let (my_call, their_call) = (mine.running_call()?, theirs.running_call()?);
    (only_sends(rank, &my_call) && only_sends(peer, &their_call)).then_some((my_call, their_call))
}

/// Whether `snapshot` shows its call stalled on `peer`: every wait from number `since`
/// on was on `peer` and moved no byte in between, and at least two waits came after
/// number `after` (so an attempt to write, which moved nothing, was made after the
/// moment the count was `after`).
///
/// ```
/// use ringccl_collectives::control::{deadlock, Snapshot};
///
/// let stalled = Snapshot {
///     blocked_on: Some(1),
///     waits: 9,
///     waiting_on_since: 2,
///     stalled_since: 3,
///     ..Snapshot::default()
/// };
/// assert!(deadlock::stalled_on(&stalled, 1, 4, 7));
/// assert!(!deadlock::stalled_on(&stalled, 1, 4, 8), "one fresh wait is not enough");
/// assert!(!deadlock::stalled_on(&stalled, 1, 2, 7), "bytes moved after wait #2");
/// ```
pub fn stalled_on(snapshot: &Snapshot, peer: usize, since: u64, after: u64) -> bool {
    snapshot.blocked_on == Some(peer)
        && snapshot.waiting_on_since <= since
        && snapshot.stalled_since <= since
        && snapshot.waits >= after.saturating_add(2)
}

/// Rule 2's error: both calls only send to each other and both directions are full.
///
/// ```
/// use ringccl_collectives::control::{deadlock, CallDesc};
/// use ringccl_collectives::{DType, OpDesc, Sequence};
///
/// let send = |to| CallDesc {
///     op: OpDesc::send_recv(1, DType::U8, 1 << 26, 0),
///     sequence: Sequence::SentTo(to),
/// };
/// let error = deadlock::both_full(0, send(1), 1, send(0));
/// assert!(error.to_string().contains("full both ways"));
/// ```
pub fn both_full(rank: usize, mine: CallDesc, peer: usize, theirs: CallDesc) -> Error {
    deadlock(
        rank,
        mine,
        peer,
        theirs,
        format!(
            "both calls only send, each to the other, and neither rank reads before its call is done: the connection between rank {rank} and rank {peer} is full both ways"
        ),
    )
}
