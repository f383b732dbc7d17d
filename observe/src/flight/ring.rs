//! The recorder's memory: a fixed-size ring of the last calls, allocated once, where a
//! new call overwrites the oldest. Plain data under the recorder's lock; nothing here
//! allocates after [`Ring::new`] (a failed call's error message is the one exception).

use std::time::Instant;

use crate::flight::dump::CallState;
use ringccl_collectives::control::{MovedBytes, PeerMoved, PEER_SLOTS};
use ringccl_collectives::wire::Algorithm;
use ringccl_collectives::OpDesc;

/// In [`Slot::started_us`]: the call started when it was issued.
pub(crate) const AT_ISSUE: u64 = 0;

/// One recorded call.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Slot {
    /// The call's number among every call recorded on this group, from 1 (0: unused).
    pub(crate) call: u64,
    /// What was issued (`"all_reduce"`), until the engine describes it.
    pub(crate) kind: &'static str,
    /// The call's sequence number and, once an engine started it, its description.
    pub(crate) seq: Option<u64>,
    pub(crate) op: Option<OpDesc>,
    /// For a point-to-point call, the peer.
    pub(crate) peer: Option<usize>,
    pub(crate) algorithm: Option<Algorithm>,
    pub(crate) state: CallState,
    /// When it was issued, as the issuer read it (turned into Unix time by a dump).
    pub(crate) issued: Option<Instant>,
    /// When it started, in Unix microseconds; `Some(`[`AT_ISSUE`]`)`: when it was issued.
    pub(crate) started_us: Option<u64>,
    pub(crate) ended_us: Option<u64>,
    /// Final byte counts (a running call's live counts are elsewhere).
    pub(crate) peers: MovedBytes,
    pub(crate) error: Option<String>,
}

impl Slot {
    const UNUSED: Slot = Slot {
        call: 0,
        kind: "",
        seq: None,
        op: None,
        peer: None,
        algorithm: None,
        state: CallState::Queued,
        issued: None,
        started_us: None,
        ended_us: None,
        peers: MovedBytes {
            slots: [PeerMoved {
                peer: 0,
                sent: 0,
                received: 0,
            }; PEER_SLOTS],
            used: 0,
            others: None,
        },
        error: None,
    };
}

/// The last `capacity` calls, oldest overwritten first.
#[derive(Debug)]
pub(crate) struct Ring {
    slots: Vec<Slot>,
    /// Calls recorded so far; call `n` lives in slot `(n - 1) % capacity`.
    recorded: u64,
}

impl Ring {
    /// A ring of `capacity` calls (at least one), allocated now.
    pub(crate) fn new(capacity: usize) -> Ring {
        Ring {
            slots: vec![Slot::UNUSED; capacity.max(1)],
            recorded: 0,
        }
    }

    /// How many calls it holds at most.
    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// How many calls were ever recorded.
    pub(crate) fn recorded(&self) -> u64 {
        self.recorded
    }

    fn index(&self, call: u64) -> Option<usize> {
        let capacity = self.slots.len() as u64;
        usize::try_from(call.checked_sub(1)? % capacity).ok()
    }

    /// Records a new call of `kind`, queued since `issued`, over the oldest one; returns
    /// its number.
    pub(crate) fn push(&mut self, kind: &'static str, issued: Instant) -> u64 {
        self.recorded += 1;
        let call = self.recorded;
        if let Some(slot) = self.index(call).and_then(|i| self.slots.get_mut(i)) {
            // Field by field: the byte counts of unused peer slots are never read, so
            // they are left as they are (cheaper than rewriting the whole slot).
            slot.call = call;
            slot.kind = kind;
            slot.seq = None;
            slot.op = None;
            slot.peer = None;
            slot.algorithm = None;
            slot.state = CallState::Queued;
            slot.issued = Some(issued);
            slot.started_us = None;
            slot.ended_us = None;
            slot.peers.used = 0;
            slot.peers.others = None;
            slot.error = None;
        }
        call
    }

    /// Call `call`, unless it was never recorded or has been overwritten since.
    pub(crate) fn get_mut(&mut self, call: u64) -> Option<&mut Slot> {
        let index = self.index(call)?;
        self.slots.get_mut(index).filter(|slot| slot.call == call)
    }

    /// The calls held, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot> {
        let split = self.index(self.recorded + 1).unwrap_or(0);
        let (newer, older) = self.slots.split_at(split);
        older.iter().chain(newer).filter(|slot| slot.call != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calls(ring: &Ring) -> Vec<u64> {
        ring.iter().map(|s| s.call).collect()
    }

    #[test]
    fn a_ring_keeps_the_last_calls_in_order_as_it_wraps_around() {
        let mut ring = Ring::new(3);
        assert_eq!(calls(&ring), Vec::<u64>::new());
        assert_eq!(ring.push("barrier", Instant::now()), 1);
        assert_eq!(ring.push("all_reduce", Instant::now()), 2);
        assert_eq!(calls(&ring), [1, 2]);
        assert_eq!(ring.push("broadcast", Instant::now()), 3);
        assert_eq!(calls(&ring), [1, 2, 3]);
        assert_eq!(ring.push("barrier", Instant::now()), 4);
        assert_eq!(calls(&ring), [2, 3, 4], "the oldest is overwritten");
        for _ in 0..7 {
            ring.push("barrier", Instant::now());
        }
        assert_eq!(calls(&ring), [9, 10, 11]);
        assert_eq!(ring.recorded(), 11);
        assert_eq!(ring.capacity(), 3);
    }

    #[test]
    fn an_overwritten_call_is_gone_and_a_new_one_starts_clean() {
        let mut ring = Ring::new(2);
        let first = ring.push("all_reduce", Instant::now());
        if let Some(slot) = ring.get_mut(first) {
            slot.state = CallState::Failed;
            slot.error = Some("timed out".into());
            slot.seq = Some(7);
        }
        ring.push("barrier", Instant::now());
        let third = ring.push("broadcast", Instant::now());
        assert!(
            ring.get_mut(first).is_none(),
            "call 1 was overwritten by call 3"
        );
        assert!(ring.get_mut(0).is_none() && ring.get_mut(4).is_none());
        let slot = ring.get_mut(third).map(|s| s.clone());
        let slot = slot.as_ref();
        assert_eq!(
            slot.map(|s| (s.kind, s.state)),
            Some(("broadcast", CallState::Queued))
        );
        assert_eq!(slot.map(|s| (s.seq, s.error.is_none())), Some((None, true)));
    }

    #[test]
    fn a_ring_of_zero_holds_one_call() {
        let mut ring = Ring::new(0);
        ring.push("a", Instant::now());
        ring.push("b", Instant::now());
        assert_eq!(ring.capacity(), 1);
        assert_eq!(calls(&ring), [2]);
    }
}
