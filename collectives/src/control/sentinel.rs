//! The control protocol as a pure state machine: feed it the time, the messages that
//! arrive and what this rank is doing; it says what to send and what it concluded.
//!
//! Two jobs:
//! - **Abort notices.** When this rank aborts ([`Sentinel::abort`]), every peer is told
//!   why. When a peer's notice arrives, the machine concludes [`Verdict::Aborted`] and
//!   passes the notice on to every other peer, so a rank that dies half-way through
//!   telling the group still reaches everyone.
//! - **Finding mismatches and deadlocks no frame shows.** When this rank's op has been
//!   blocked on one peer for [`ASK_AFTER`], it asks that peer what it is doing (and says
//!   what it is doing itself). Both sides then judge ([`Verdict::Broken`]):
//!   - both in collectives with the same sequence number but different descriptions: a
//!     mismatch ([`disagreement`]);
//!   - each call waits for a call the other rank has not started (a receive against a
//!     collective, two receives): a deadlock ([`deadlock::wait_on_each_other`]);
//!   - on the asking side only, two calls that only send, each blocked writing to the
//!     other: a deadlock once both are seen stalled after a moment at which both were
//!     already in these calls. The first answer sets that moment; the question is asked
//!     again after [`FOLLOW_UP`], and the second answer must show both ranks' writes still
//!     failing since ([`deadlock::stalled_on`]).
//!
//!   Otherwise the peer is only slower and the question is asked again every
//!   [`ASK_EVERY`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::deadlock;
use super::{ControlMessage, Snapshot};
use crate::wire::same_call;
use crate::CallDesc;
use crate::Sequence;
use crate::{CollectiveKind, Error, OpDesc};

/// How often the driver should call [`Sentinel::handle_timeout`].
pub const TICK: Duration = Duration::from_millis(100);
/// How long an op waits on one peer before this rank asks that peer what it is doing.
pub const ASK_AFTER: Duration = Duration::from_millis(250);
/// How often the question is asked again while the op stays blocked.
pub const ASK_EVERY: Duration = Duration::from_secs(1);
/// How soon the question is asked again when the first answer showed two calls that only
/// send, each blocked on the other: the second answer decides.
pub const FOLLOW_UP: Duration = Duration::from_millis(300);
/// A blocked op tries to move bytes again at least this often, even when nothing woke
/// it, so that its snapshot shows fresh attempts (see [`deadlock::stalled_on`]).
pub const RETRY_EVERY: Duration = Duration::from_millis(100);

/// What the machine concluded.
#[derive(Debug)]
pub enum Verdict {
    /// This rank and a peer are in different collectives, or their calls wait on each
    /// other: the group must be aborted with this error.
    Broken(Error),
    /// Rank `origin` aborted the group for `reason`, naming `cause` as the rank at the
    /// root of it when it knew one.
    Aborted {
        /// The rank that aborted.
        origin: usize,
        /// Its reason.
        reason: String,
        /// The rank it blamed.
        cause: Option<usize>,
    },
    /// The predecessor in rank order says it runs `op` (see [`Sentinel::fingerprint`]).
    Fingerprint {
        /// The predecessor.
        from: usize,
        /// Its op.
        op: OpDesc,
    },
}

/// Which call a snapshot shows running: its description and numbering.
type Running = (OpDesc, Option<Sequence>);

fn running(snapshot: &Snapshot) -> Option<Running> {
    snapshot.current.map(|(op, _)| (op, snapshot.sequence))
}

#[derive(Debug, Clone, Copy)]
struct Watch {
    call: Running,
    since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Question {
    peer: usize,
    nonce: u32,
    /// What this rank said it was doing when it asked.
    asked: Snapshot,
    at: Instant,
}

/// Two calls that only send, each blocked on the other, first seen in the answer to a
/// question this rank asked while already in `mine`. The moment the peer answered is the
/// one after which both ranks' writes must be seen failing again.
#[derive(Debug, Clone, Copy)]
struct BothSending {
    peer: usize,
    mine: CallDesc,
    theirs: CallDesc,
    /// This rank's wait count when it asked (every later wait must be on the peer and
    /// move nothing).
    my_waits_asked: u64,
    /// This rank's wait count when the answer arrived.
    my_waits_answered: u64,
    /// The peer's wait count in its answer.
    their_waits: u64,
}

/// One rank's control protocol. See the module documentation.
///
/// ```
/// use std::time::{Duration, Instant};
/// use ringccl_collectives::control::{ControlMessage, Sentinel, Snapshot, Verdict};
///
/// let mut rank0 = Sentinel::new(0, 3);
/// rank0.abort(0, "op #4 timed out".into());
/// let mut told = Vec::new();
/// while let Some((peer, message)) = rank0.poll_transmit() {
///     told.push(peer);
///     // Rank `peer` hears it and concludes the group was aborted by rank 0.
///     let mut them = Sentinel::new(peer, 3);
///     them.handle_message(Instant::now(), 0, message, &Snapshot::default());
///     assert!(matches!(them.poll_verdict(), Some(Verdict::Aborted { origin: 0, .. })));
/// }
/// assert_eq!(told, [1, 2]);
/// ```
#[derive(Debug)]
pub struct Sentinel {
    rank: usize,
    world_size: usize,
    watching: Option<Watch>,
    asked: Option<Question>,
    both_sending: Option<BothSending>,
    next_nonce: u32,
    aborted: bool,
    left: Vec<bool>,
    transmits: VecDeque<(usize, ControlMessage)>,
    verdicts: VecDeque<Verdict>,
}

impl Sentinel {
    /// The machine of rank `rank` in a group of `world_size`.
    pub fn new(rank: usize, world_size: usize) -> Sentinel {
        Sentinel {
            rank,
            world_size,
            watching: None,
            asked: None,
            both_sending: None,
            next_nonce: 1,
            aborted: false,
            left: vec![false; world_size],
            transmits: VecDeque::new(),
            verdicts: VecDeque::new(),
        }
    }

    /// Whether the group has been aborted, here or by a peer.
    pub fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// Whether `peer` said it dropped its group in an orderly way.
    pub fn has_left(&self, peer: usize) -> bool {
        self.left.get(peer).copied().unwrap_or(false)
    }

    /// This rank aborts the group (or passes on rank `origin`'s abort): tell every peer.
    /// Only the first abort is sent.
    pub fn abort(&mut self, origin: usize, reason: String) {
        self.abort_caused(origin, reason, None);
    }

    /// [`Sentinel::abort`], naming `cause` as the rank at the root of the failure (the
    /// rank everyone waited for), so that no peer takes an aborting rank for the culprit.
    pub fn abort_caused(&mut self, origin: usize, reason: String, cause: Option<usize>) {
        if self.aborted {
            return;
        }
        self.aborted = true;
        self.tell_all_but(
            &[origin],
            &ControlMessage::Abort {
                origin,
                reason,
                cause,
            },
        );
    }

    /// This rank runs `op` on an engine that cannot check frames: tell the successor in
    /// rank order, which compares it with its own (a ring of pairwise checks covers the
    /// group: if every neighbour agrees, everyone does).
    pub fn fingerprint(&mut self, op: OpDesc) {
        if self.world_size > 1 && !self.aborted {
            let next = (self.rank + 1) % self.world_size;
            self.transmits
                .push_back((next, ControlMessage::Fingerprint { op }));
        }
    }

    /// This rank is leaving in an orderly way (its group is being dropped).
    pub fn leave(&mut self) {
        if !self.aborted {
            self.tell_all_but(&[], &ControlMessage::Leaving);
        }
    }

    fn tell_all_but(&mut self, skip: &[usize], message: &ControlMessage) {
        for peer in (0..self.world_size).filter(|p| *p != self.rank && !skip.contains(p)) {
            self.transmits.push_back((peer, message.clone()));
        }
    }

    /// Time passes: ask the peer this rank has been blocked on for a while. `mine`
    /// carries this rank's counts with the peer it is blocked on.
    pub fn handle_timeout(&mut self, now: Instant, mine: &Snapshot) {
        let Some(call) = running(mine) else {
            self.watching = None;
            return;
        };
        let since = match self.watching {
            Some(w) if w.call == call => w.since,
            _ => {
                self.watching = Some(Watch { call, since: now });
                now
            }
        };
        let Some(peer) = mine
            .blocked_on
            .filter(|&p| p < self.world_size && p != self.rank)
        else {
            return;
        };
        if self.aborted || now.saturating_duration_since(since) < ASK_AFTER {
            return;
        }
        let following_up = self
            .both_sending
            .is_some_and(|b| b.peer == peer && mine.running_call() == Some(b.mine));
        let due = match self.asked {
            Some(q) => {
                let after = if following_up { FOLLOW_UP } else { ASK_EVERY };
                running(&q.asked) != Some(call)
                    || q.peer != peer
                    || now.saturating_duration_since(q.at) >= after
            }
            None => true,
        };
        if due {
            let nonce = self.next_nonce;
            self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
            self.asked = Some(Question {
                peer,
                nonce,
                asked: *mine,
                at: now,
            });
            self.transmits.push_back((
                peer,
                ControlMessage::Ask {
                    nonce,
                    snapshot: *mine,
                },
            ));
        }
    }

    /// `message` arrived from `from`; `mine` is what this rank is doing now, with its
    /// counts for `from`.
    pub fn handle_message(
        &mut self,
        _now: Instant,
        from: usize,
        message: ControlMessage,
        mine: &Snapshot,
    ) {
        match message {
            ControlMessage::Abort {
                origin,
                reason,
                cause,
            } => {
                if !self.aborted {
                    self.verdicts.push_back(Verdict::Aborted {
                        origin,
                        reason: reason.clone(),
                        cause,
                    });
                    self.aborted = true;
                    self.tell_all_but(
                        &[from, origin],
                        &ControlMessage::Abort {
                            origin,
                            reason,
                            cause,
                        },
                    );
                }
            }
            ControlMessage::Ask { nonce, snapshot } => {
                self.transmits.push_back((
                    from,
                    ControlMessage::Status {
                        nonce,
                        snapshot: *mine,
                    },
                ));
                self.judge(from, mine, &snapshot);
            }
            ControlMessage::Status { nonce, snapshot } => {
                let Some(question) = self.asked.filter(|q| q.nonce == nonce && q.peer == from)
                else {
                    return;
                };
                self.judge(from, mine, &snapshot);
                self.judge_both_sending(from, &question, mine, &snapshot);
            }
            ControlMessage::Leaving => {
                if let Some(left) = self.left.get_mut(from) {
                    *left = true;
                }
            }
            ControlMessage::Fingerprint { op } => {
                self.verdicts.push_back(Verdict::Fingerprint { from, op });
            }
        }
    }

    fn judge(&mut self, peer: usize, mine: &Snapshot, theirs: &Snapshot) {
        if self.aborted {
            return;
        }
        let error = disagreement(self.rank, peer, mine, theirs)
            .or_else(|| deadlock::wait_on_each_other(self.rank, peer, mine, theirs));
        if let Some(error) = error {
            self.conclude(error);
        }
    }

    /// Rule 2 of [`deadlock`]: two calls that only send, each blocked on the other. The
    /// first answer records the moment; a later answer to a later question must show
    /// both sides' writes failing since, with no byte moved, in the same two calls.
    fn judge_both_sending(
        &mut self,
        peer: usize,
        question: &Question,
        mine: &Snapshot,
        theirs: &Snapshot,
    ) {
        let shape = deadlock::both_only_send(self.rank, peer, mine, theirs);
        let Some((my_call, their_call)) = shape.filter(|_| !self.aborted) else {
            self.both_sending = None;
            return;
        };
        // This rank was in `my_call` from the question to the answer, so the peer's
        // answer was taken while this rank was in it.
        if question.asked.running_call() != Some(my_call) {
            self.both_sending = None;
            return;
        }
        match self.both_sending {
            Some(seen)
                if seen.peer == peer && seen.mine == my_call && seen.theirs == their_call =>
            {
                let i_stalled =
                    deadlock::stalled_on(mine, peer, seen.my_waits_asked, seen.my_waits_answered);
                let they_stalled =
                    deadlock::stalled_on(theirs, self.rank, seen.their_waits, seen.their_waits);
                if i_stalled && they_stalled {
                    self.both_sending = None;
                    self.conclude(deadlock::both_full(self.rank, my_call, peer, their_call));
                }
            }
            _ => {
                self.both_sending = Some(BothSending {
                    peer,
                    mine: my_call,
                    theirs: their_call,
                    my_waits_asked: question.asked.waits,
                    my_waits_answered: mine.waits,
                    their_waits: theirs.waits,
                });
            }
        }
    }

    fn conclude(&mut self, error: Error) {
        self.verdicts.push_back(Verdict::Broken(error));
    }

    /// The next message to send, and to whom.
    pub fn poll_transmit(&mut self) -> Option<(usize, ControlMessage)> {
        self.transmits.pop_front()
    }

    /// The next conclusion.
    pub fn poll_verdict(&mut self) -> Option<Verdict> {
        self.verdicts.pop_front()
    }
}

/// Whether two ranks' current ops prove a mismatch: both in a collective (point-to-point
/// messages are numbered per pair, not by the group) with the same sequence number but a
/// different description or schedule. Anything else may just be one rank being slower.
pub fn disagreement(rank: usize, peer: usize, mine: &Snapshot, theirs: &Snapshot) -> Option<Error> {
    let (m, t) = (mine.current?, theirs.current?);
    let collective = |op: &OpDesc| op.kind != CollectiveKind::SendRecv;
    if !collective(&m.0) || !collective(&t.0) || m.0.seq != t.0.seq {
        return None;
    }
    same_call(rank, peer, m, t).err()
}

#[cfg(test)]
mod tests;
