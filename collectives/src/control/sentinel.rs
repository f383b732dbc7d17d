//! The control protocol as a pure state machine: feed it the time, the messages that
//! arrive and what this rank is doing; it says what to send and what it concluded.
//!
//! Two jobs:
//! - **Abort notices.** When this rank aborts ([`Sentinel::abort`]), every peer is told
//!   why. When a peer's notice arrives, the machine concludes [`Verdict::Aborted`] and
//!   passes the notice on to every other peer, so a rank that dies half-way through
//!   telling the group still reaches everyone.
//! - **Finding mismatches no frame shows.** When this rank's op has been blocked on one
//!   peer for [`ASK_AFTER`], it asks that peer what it is doing (and says what it is
//!   doing itself). If both are in collectives with the same sequence number but
//!   different descriptions, that is a mismatch, whichever side sees it first
//!   ([`Verdict::Broken`]); otherwise the peer is only slow and the question is asked
//!   again every [`ASK_EVERY`].

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{ControlMessage, Snapshot};
use crate::wire::same_call;
use crate::{CollectiveKind, Error, OpDesc};

/// How often the driver should call [`Sentinel::handle_timeout`].
pub const TICK: Duration = Duration::from_millis(100);
/// How long an op waits on one peer before this rank asks that peer what it is doing.
pub const ASK_AFTER: Duration = Duration::from_millis(250);
/// How often the question is asked again while the op stays blocked.
pub const ASK_EVERY: Duration = Duration::from_secs(1);

/// What the machine concluded.
#[derive(Debug)]
pub enum Verdict {
    /// This rank and a peer are in different collectives: the group must be aborted
    /// with this error.
    Broken(Error),
    /// Rank `origin` aborted the group for `reason`.
    Aborted {
        /// The rank that aborted.
        origin: usize,
        /// Its reason.
        reason: String,
    },
    /// The predecessor in rank order says it runs `op` (see [`Sentinel::fingerprint`]).
    Fingerprint {
        /// The predecessor.
        from: usize,
        /// Its op.
        op: OpDesc,
    },
}

#[derive(Debug, Clone, Copy)]
struct Watch {
    op: OpDesc,
    since: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Question {
    peer: usize,
    nonce: u32,
    op: OpDesc,
    at: Instant,
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
        if self.aborted {
            return;
        }
        self.aborted = true;
        self.tell_all_but(&[origin], &ControlMessage::Abort { origin, reason });
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

    /// Time passes: ask the peer this rank has been blocked on for a while.
    pub fn handle_timeout(&mut self, now: Instant, mine: &Snapshot) {
        let Some((op, _)) = mine.current else {
            self.watching = None;
            return;
        };
        let since = match self.watching {
            Some(w) if w.op == op => w.since,
            _ => {
                self.watching = Some(Watch { op, since: now });
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
        let due = match self.asked {
            Some(q) => {
                q.op != op || q.peer != peer || now.saturating_duration_since(q.at) >= ASK_EVERY
            }
            None => true,
        };
        if due {
            let nonce = self.next_nonce;
            self.next_nonce = self.next_nonce.wrapping_add(1).max(1);
            self.asked = Some(Question {
                peer,
                nonce,
                op,
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

    /// `message` arrived from `from`; `mine` is what this rank is doing now.
    pub fn handle_message(
        &mut self,
        _now: Instant,
        from: usize,
        message: ControlMessage,
        mine: &Snapshot,
    ) {
        match message {
            ControlMessage::Abort { origin, reason } => {
                if !self.aborted {
                    self.verdicts.push_back(Verdict::Aborted {
                        origin,
                        reason: reason.clone(),
                    });
                    self.aborted = true;
                    self.tell_all_but(&[from, origin], &ControlMessage::Abort { origin, reason });
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
                if self
                    .asked
                    .is_some_and(|q| q.nonce == nonce && q.peer == from)
                {
                    self.judge(from, mine, &snapshot);
                }
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
        if let Some(error) = disagreement(self.rank, peer, mine, theirs) {
            self.verdicts.push_back(Verdict::Broken(error));
        }
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
