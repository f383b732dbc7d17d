//! What this rank is doing right now: its current op, how that op was numbered, the peer
//! it is blocked on, and how many calls it has started with each peer. Written by the
//! thread running the op (and the runner, which numbers it), read by the control thread.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::wire::Algorithm;
use crate::OpDesc;
use crate::{CallDesc, CollectiveKind, Sequence};

/// How many calls one rank has *started* that involve one peer, counted the way the
/// runner numbers them (a call counts from the moment it is numbered, before any byte
/// moves). Counters only grow, so a count seen once is a lower bound forever after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairCounts {
    /// The peer these counts are about.
    pub peer: usize,
    /// Collectives started in the group (the group's sequence number of the latest).
    pub collectives: u64,
    /// Point-to-point messages started to `peer`.
    pub sent: u64,
    /// Point-to-point receives started from `peer`.
    pub received: u64,
}

/// A copy of [`Activity`] at one moment, as sent to a peer that asks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The op running now, and the schedule it runs.
    pub current: Option<(OpDesc, Algorithm)>,
    /// The peer the running op last waited for (it may be waiting now).
    pub blocked_on: Option<usize>,
    /// How the running op was numbered: by the group, or per direction of one pair (which
    /// says whether a point-to-point op sends or receives, and with whom). `None` when
    /// unknown.
    pub sequence: Option<Sequence>,
    /// How many times the running op has had to wait (each wait follows an attempt to
    /// move bytes that moved none).
    pub waits: u64,
    /// The value of `waits` at which the running op's unbroken run of waits on
    /// `blocked_on` began: every wait numbered from there to `waits` was on that peer.
    pub waiting_on_since: u64,
    /// The value of `waits` since which the running op has moved no byte: between wait
    /// number `stalled_since` and wait number `waits`, nothing was sent or received.
    pub stalled_since: u64,
    /// This rank's counts with the peer the snapshot is for.
    pub counts: Option<PairCounts>,
}

impl Snapshot {
    /// The call the snapshot shows running, when its description and numbering agree.
    ///
    /// ```
    /// use ringccl_collectives::control::Snapshot;
    /// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, Sequence};
    ///
    /// let snapshot = Snapshot {
    ///     current: Some((OpDesc::send_recv(3, DType::F32, 8, 0), Algorithm::Direct)),
    ///     sequence: Some(Sequence::ReceivedFrom(1)),
    ///     ..Snapshot::default()
    /// };
    /// let call = snapshot.running_call().unwrap();
    /// assert_eq!(call.to_string(), "recv(from rank 1, msg #3, tag=0, 8 x f32)");
    /// ```
    pub fn running_call(&self) -> Option<CallDesc> {
        let (op, _) = self.current?;
        let sequence = self.sequence?;
        let point_to_point = op.kind == CollectiveKind::SendRecv;
        let consistent = match sequence {
            Sequence::Collective => !point_to_point,
            Sequence::SentTo(_) | Sequence::ReceivedFrom(_) => point_to_point,
        };
        consistent.then_some(CallDesc { op, sequence })
    }
}

#[derive(Debug, Default)]
struct State {
    current: Option<(OpDesc, Algorithm)>,
    sequence: Option<Sequence>,
    /// What the runner numbered last, for the op that begins next.
    numbered: Option<Sequence>,
    blocked_on: Option<usize>,
    waits: u64,
    waiting_on_since: u64,
    stalled_since: u64,
    /// Bytes the running op had moved at its latest wait.
    moved: u64,
    collectives: u64,
    /// Per peer: (messages started to it, receives started from it).
    pairs: BTreeMap<usize, (u64, u64)>,
}

/// What this rank is doing: cheap to update (an uncontended lock per op and per wait,
/// which precedes a sleep anyway), safe to read from another thread.
///
/// ```
/// use ringccl_collectives::control::Activity;
/// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, Sequence};
///
/// let activity = Activity::default();
/// activity.numbered(Sequence::ReceivedFrom(1), 3);
/// activity.begin(OpDesc::send_recv(3, DType::F32, 8, 0), Algorithm::Direct);
/// activity.blocked_on(1, 0);
/// let now = activity.snapshot();
/// assert_eq!(now.current.map(|(op, _)| op.seq), Some(3));
/// assert_eq!(now.sequence, Some(Sequence::ReceivedFrom(1)));
/// assert_eq!((now.blocked_on, now.waits), (Some(1), 1));
/// assert_eq!(now.counts.map(|c| (c.peer, c.received)), Some((1, 3)));
/// activity.end();
/// assert_eq!(activity.snapshot().current, None);
/// ```
#[derive(Debug, Default)]
pub struct Activity {
    state: Mutex<State>,
}

impl Activity {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves plain values behind: a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The runner numbered the next call `seq` on `sequence`'s counter.
    ///
    /// ```
    /// use ringccl_collectives::control::Activity;
    /// use ringccl_collectives::Sequence;
    ///
    /// let activity = Activity::default();
    /// activity.numbered(Sequence::Collective, 7);
    /// assert_eq!(activity.snapshot_for(2).counts.map(|c| c.collectives), Some(7));
    /// ```
    pub fn numbered(&self, sequence: Sequence, seq: u64) {
        let mut state = self.lock();
        match sequence {
            Sequence::Collective => state.collectives = state.collectives.max(seq),
            Sequence::SentTo(peer) => {
                let sent = &mut state.pairs.entry(peer).or_default().0;
                *sent = (*sent).max(seq);
            }
            Sequence::ReceivedFrom(peer) => {
                let received = &mut state.pairs.entry(peer).or_default().1;
                *received = (*received).max(seq);
            }
        }
        state.numbered = Some(sequence);
    }

    /// `op` starts, running `algorithm`.
    ///
    /// ```
    /// use ringccl_collectives::control::Activity;
    /// use ringccl_collectives::{wire::Algorithm, OpDesc};
    ///
    /// let activity = Activity::default();
    /// activity.begin(OpDesc::barrier(1), Algorithm::Dissemination);
    /// assert!(activity.snapshot().current.is_some());
    /// ```
    pub fn begin(&self, op: OpDesc, algorithm: Algorithm) {
        let mut state = self.lock();
        state.current = Some((op, algorithm));
        state.sequence = state.numbered.take();
        state.blocked_on = None;
        state.waits = 0;
        state.waiting_on_since = 0;
        state.stalled_since = 0;
        state.moved = 0;
    }

    /// The running op is about to sleep until `peer` is ready: it tried to move bytes
    /// and moved none. `moved`: the bytes it has sent and received so far.
    ///
    /// ```
    /// use ringccl_collectives::control::Activity;
    /// use ringccl_collectives::{wire::Algorithm, OpDesc};
    ///
    /// let activity = Activity::default();
    /// activity.begin(OpDesc::barrier(1), Algorithm::Dissemination);
    /// activity.blocked_on(2, 0);
    /// activity.blocked_on(1, 32);
    /// activity.blocked_on(1, 32);
    /// let now = activity.snapshot();
    /// assert_eq!((now.blocked_on, now.waits, now.waiting_on_since), (Some(1), 3, 2));
    /// assert_eq!(now.stalled_since, 2);
    /// ```
    pub fn blocked_on(&self, peer: usize, moved: u64) {
        let mut state = self.lock();
        state.waits = state.waits.saturating_add(1);
        if state.blocked_on != Some(peer) {
            state.waiting_on_since = state.waits;
            state.blocked_on = Some(peer);
        }
        if state.moved != moved || state.stalled_since == 0 {
            state.stalled_since = state.waits;
            state.moved = moved;
        }
    }

    /// The running op has ended (either way).
    ///
    /// ```
    /// use ringccl_collectives::control::Activity;
    /// use ringccl_collectives::{wire::Algorithm, OpDesc};
    ///
    /// let activity = Activity::default();
    /// activity.begin(OpDesc::barrier(1), Algorithm::Dissemination);
    /// activity.end();
    /// assert_eq!(activity.snapshot().current, None);
    /// ```
    pub fn end(&self) {
        let mut state = self.lock();
        state.current = None;
        state.sequence = None;
        state.blocked_on = None;
    }

    /// What this rank is doing now, with its counts for the peer it is blocked on (the
    /// one it would ask).
    ///
    /// ```
    /// use ringccl_collectives::control::Activity;
    ///
    /// assert_eq!(Activity::default().snapshot().counts, None);
    /// ```
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        let about = state.current.and(state.blocked_on);
        Self::copy(&state, about)
    }

    /// What this rank is doing now, with its counts for `peer` (the one it answers).
    ///
    /// ```
    /// use ringccl_collectives::control::Activity;
    /// use ringccl_collectives::Sequence;
    ///
    /// let activity = Activity::default();
    /// activity.numbered(Sequence::SentTo(3), 2);
    /// assert_eq!(activity.snapshot_for(3).counts.map(|c| c.sent), Some(2));
    /// assert_eq!(activity.snapshot_for(1).counts.map(|c| c.sent), Some(0));
    /// ```
    pub fn snapshot_for(&self, peer: usize) -> Snapshot {
        Self::copy(&self.lock(), Some(peer))
    }

    fn copy(state: &State, about: Option<usize>) -> Snapshot {
        let running = state.current.is_some();
        Snapshot {
            current: state.current,
            blocked_on: state.blocked_on.filter(|_| running),
            sequence: state.sequence.filter(|_| running),
            waits: if running { state.waits } else { 0 },
            waiting_on_since: if running { state.waiting_on_since } else { 0 },
            stalled_since: if running { state.stalled_since } else { 0 },
            counts: about.map(|peer| {
                let (sent, received) = state.pairs.get(&peer).copied().unwrap_or_default();
                PairCounts {
                    peer,
                    collectives: state.collectives,
                    sent,
                    received,
                }
            }),
        }
    }
}
