//! What both control-thread drivers do around their I/O: keep the [`Sentinel`] in step
//! with this rank's [`GroupControl`] (aborts, fingerprints, the tick), act on what it
//! concludes, and hand it the messages that arrive. The TCP driver
//! (`ringccl_transports::ControlLink`) and the in-process one
//! ([`MemoryControlLink`](super::MemoryControlLink)) only move the messages.

use std::sync::Arc;
use std::time::Instant;

use super::{ControlMessage, GroupControl, Sentinel, Verdict, TICK};

/// A rank's sentinel, bound to its control state.
pub struct SentinelDriver {
    rank: usize,
    control: Arc<GroupControl>,
    sentinel: Sentinel,
    next_tick: Instant,
}

impl std::fmt::Debug for SentinelDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelDriver")
            .field("rank", &self.rank)
            .field("aborted", &self.sentinel.is_aborted())
            .finish_non_exhaustive()
    }
}

impl SentinelDriver {
    /// The sentinel of rank `rank` of `world_size`, driving `control`.
    ///
    /// ```
    /// use ringccl_collectives::control::{GroupControl, SentinelDriver};
    /// let driver = SentinelDriver::new(0, 2, GroupControl::new(0));
    /// assert!(!driver.is_aborted());
    /// ```
    pub fn new(rank: usize, world_size: usize, control: Arc<GroupControl>) -> SentinelDriver {
        SentinelDriver {
            rank,
            control,
            sentinel: Sentinel::new(rank, world_size),
            next_tick: Instant::now() + TICK,
        }
    }

    /// One turn before the driver's I/O, at `now`: an abort recorded on this rank (by
    /// the runner) becomes the sentinel's; with `stopping`, the sentinel says goodbye
    /// and the turn ends there; otherwise fingerprints posted meanwhile are passed on,
    /// the tick runs when due, and every conclusion is acted on. Then send
    /// [`SentinelDriver::poll_transmit`]'s messages.
    ///
    /// ```
    /// use ringccl_collectives::control::{GroupControl, SentinelDriver};
    /// let control = GroupControl::new(0);
    /// let mut driver = SentinelDriver::new(0, 2, control.clone());
    /// control.abort(0, "giving up".into(), None);
    /// driver.turn(std::time::Instant::now(), false);
    /// assert!(driver.is_aborted());
    /// assert!(driver.poll_transmit().is_some(), "the notice for rank 1");
    /// ```
    pub fn turn(&mut self, now: Instant, stopping: bool) {
        if !self.sentinel.is_aborted() {
            if let Some(record) = self.control.aborted() {
                self.sentinel
                    .abort_caused(record.origin, record.reason, record.cause);
            }
        }
        if stopping {
            self.sentinel.leave();
            return;
        }
        for op in self.control.take_fingerprints() {
            self.sentinel.fingerprint(op);
        }
        if now >= self.next_tick {
            let mine = self.control.probe().snapshot();
            self.sentinel.handle_timeout(now, &mine);
            self.next_tick = now + TICK;
        }
        self.conclude();
    }

    /// When the next tick is due: the longest the driver may sleep.
    pub fn next_tick(&self) -> Instant {
        self.next_tick
    }

    /// Hands the sentinel a message from `from`, answered with what this rank is doing,
    /// and acts on what it concludes. What a peer says it is doing (in a question or an
    /// answer) is kept, for the blame of a timeout ([`GroupControl::blame`]).
    pub fn handle_message(&mut self, now: Instant, from: usize, message: ControlMessage) {
        let mine = self.control.probe().snapshot_for(from);
        if let ControlMessage::Ask { snapshot, .. } | ControlMessage::Status { snapshot, .. } =
            &message
        {
            self.control
                .note_peer(from, *snapshot, mine.current.map(|(op, _)| op));
        }
        self.sentinel.handle_message(now, from, message, &mine);
        self.conclude();
    }

    /// The next message to send, and to whom.
    pub fn poll_transmit(&mut self) -> Option<(usize, ControlMessage)> {
        self.sentinel.poll_transmit()
    }

    /// Whether the group is aborted (the notices are then to be sent, and the
    /// connections closed: [`GroupControl::close_connections`]).
    pub fn is_aborted(&self) -> bool {
        self.sentinel.is_aborted()
    }

    /// This rank's control state.
    pub fn control(&self) -> &GroupControl {
        &self.control
    }

    /// Acts on what the sentinel concluded.
    fn conclude(&mut self) {
        while let Some(verdict) = self.sentinel.poll_verdict() {
            match verdict {
                Verdict::Broken(error) => {
                    let reason = error.to_string();
                    let cause = error.likely_cause();
                    if self
                        .control
                        .abort_caused(self.rank, reason.clone(), cause, Some(error))
                    {
                        self.sentinel.abort_caused(self.rank, reason, cause);
                    }
                }
                Verdict::Aborted {
                    origin,
                    reason,
                    cause,
                } => {
                    self.control.abort_caused(origin, reason, cause, None);
                }
                Verdict::Fingerprint { from, op } => self.control.record_fingerprint(from, op),
            }
        }
    }
}
