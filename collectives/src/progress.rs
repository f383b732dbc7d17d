//! The progress rules of one rank's [`Schedule`], as a pure state machine: which send may
//! move now, which receive may take bytes now and where they go, when a received frame
//! may be applied to the caller's buffer, and what to wait for when nothing can move.
//!
//! [`Progress`] does no I/O and touches no buffers; it only owns the cursors. Two drivers
//! run the same rules through it: the executor (byte-granular: frames arrive and leave in
//! arbitrary pieces) and the schedule simulator (message-granular: one whole frame per
//! call), so the simulator's deadlock and bit-identity proofs are proofs about the rules
//! the executor runs.
//!
//! Every message is a frame of [`FRAME_HEADER_LEN`] header bytes followed by the payload;
//! offsets handed out here count frame bytes, header included.

use std::ops::Range;

use crate::schedule::{RecvAction, Schedule};
use crate::wire::FRAME_HEADER_LEN;

/// Where the current step of one direction stands.
#[derive(Clone, Copy, Debug, Default)]
struct Cursor {
    /// Index of the current step.
    index: usize,
    /// Frame bytes of the current step already moved.
    done: usize,
}

/// The cursors of one rank's schedule and the rules that move them.
#[derive(Debug)]
pub(crate) struct Progress<'s> {
    schedule: &'s Schedule,
    elem_size: usize,
    send: Cursor,
    recv: Cursor,
    /// Whether the current receive's frame header has been checked by the driver.
    header_checked: bool,
}

/// A send that may start or continue now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SendNow {
    /// Index into [`Schedule::sends`].
    pub(crate) index: usize,
    /// Destination rank.
    pub(crate) peer: usize,
    /// Payload bytes in the source buffer.
    pub(crate) payload: Range<usize>,
    /// Frame bytes (header included) already written.
    pub(crate) done: usize,
}

impl SendNow {
    /// Length of the whole frame, header included (for message-granular drivers).
    #[cfg(test)]
    pub(crate) fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + self.payload.len()
    }
}

/// Where the payload of a receive goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Destination {
    /// Straight into place in the caller's buffer (a [`RecvAction::Store`] whose
    /// `after_send` has completed).
    Buffer,
    /// Into scratch space (a [`RecvAction::Reduce`]), to be combined into the buffer
    /// once [`Progress::may_apply`] says so.
    Scratch,
}

/// A receive that may take bytes now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RecvNow {
    /// Index into [`Schedule::recvs`].
    pub(crate) index: usize,
    /// Source rank.
    pub(crate) peer: usize,
    /// Bytes of the caller's buffer the payload is for.
    pub(crate) payload: Range<usize>,
    /// Where the payload bytes go.
    pub(crate) into: Destination,
    /// Frame bytes (header included) already read.
    pub(crate) done: usize,
}

impl RecvNow {
    /// Length of the whole frame, header included.
    pub(crate) fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + self.payload.len()
    }
}

/// A fully received frame that may now be applied to the caller's buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Apply {
    /// Bytes of the caller's buffer it applies to.
    pub(crate) payload: Range<usize>,
    /// What to do: nothing more for a store (it is already in place), run the kernel
    /// from scratch for a reduction.
    pub(crate) action: RecvAction,
}

/// What a driver with nothing left to do right now waits for. At least one is set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocked {
    /// The peer the current send writes to, when that send may move.
    pub(crate) writable: Option<usize>,
    /// The peer the current receive reads from, when that receive may take bytes.
    pub(crate) readable: Option<usize>,
}

impl Blocked {
    /// The peer to name when the wait times out: the one we read from, else the one we
    /// write to.
    #[inline]
    pub(crate) fn blamed(&self) -> usize {
        // `Progress::blocked_on` never returns both unset.
        self.readable.or(self.writable).unwrap_or_default()
    }
}

/// Neither direction can ever move again: a send waits for a receive that does not exist
/// (or the schedule is otherwise inconsistent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stuck;

/// Frame bytes exchanged with one peer in this schedule, both directions together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Exchanged {
    /// Bytes sent to or received from the peer so far.
    pub(crate) moved: u64,
    /// Bytes the whole schedule exchanges with the peer.
    pub(crate) expected: u64,
}

impl<'s> Progress<'s> {
    /// The start of `schedule`, whose element ranges hold elements of `elem_size` bytes.
    pub(crate) fn new(schedule: &'s Schedule, elem_size: usize) -> Progress<'s> {
        Progress {
            schedule,
            elem_size,
            send: Cursor::default(),
            recv: Cursor::default(),
            header_checked: false,
        }
    }

    #[inline]
    fn bytes(&self, elems: &Range<usize>) -> Range<usize> {
        elems.start * self.elem_size..elems.end * self.elem_size
    }

    /// The send that may start or continue now: the current one, unless it waits for a
    /// receive (`after_recv`) that has not been applied yet.
    #[inline]
    pub(crate) fn next_send(&self) -> Option<SendNow> {
        let step = self.schedule.sends.get(self.send.index)?;
        if step.after_recv.is_some_and(|dep| dep >= self.recv.index) {
            return None;
        }
        Some(SendNow {
            index: self.send.index,
            peer: step.peer,
            payload: self.bytes(&step.range),
            done: self.send.done,
        })
    }

    /// Records that `n` more bytes of the frame of [`Progress::next_send`] were written;
    /// a finished frame moves on to the next send.
    #[inline]
    pub(crate) fn sent(&mut self, n: usize) {
        let Some(step) = self.schedule.sends.get(self.send.index) else {
            debug_assert!(n == 0, "sent {n} bytes after the last send");
            return;
        };
        let frame = FRAME_HEADER_LEN + step.range.len() * self.elem_size;
        self.send.done += n;
        debug_assert!(self.send.done <= frame, "sent past the end of a frame");
        if self.send.done >= frame {
            self.send = Cursor {
                index: self.send.index + 1,
                done: 0,
            };
        }
    }

    /// Whether the `after_send` dependency of receive `step` has completed.
    #[inline]
    fn send_done_for(&self, after_send: Option<usize>) -> bool {
        after_send.is_none_or(|dep| dep < self.send.index)
    }

    /// The receive that may take bytes now, and where they go. None when the current
    /// frame is complete (it waits for [`Progress::applied`]) or when it is a store whose
    /// `after_send` has not completed (the caller's bytes are still to be sent).
    #[inline]
    pub(crate) fn next_recv(&self) -> Option<RecvNow> {
        let step = self.schedule.recvs.get(self.recv.index)?;
        let payload = self.bytes(&step.range);
        if self.recv.done >= FRAME_HEADER_LEN + payload.len() {
            return None;
        }
        let into = match step.action {
            RecvAction::Store if !self.send_done_for(step.after_send) => return None,
            RecvAction::Store => Destination::Buffer,
            RecvAction::Reduce { .. } => Destination::Scratch,
        };
        Some(RecvNow {
            index: self.recv.index,
            peer: step.peer,
            payload,
            into,
            done: self.recv.done,
        })
    }

    /// Records that `n` more bytes of the frame of [`Progress::next_recv`] arrived. Once
    /// the header is complete the driver checks it, then calls
    /// [`Progress::header_checked`].
    #[inline]
    pub(crate) fn received(&mut self, n: usize) {
        self.recv.done += n;
        debug_assert!(
            self.schedule.recvs.get(self.recv.index).is_some_and(
                |s| self.recv.done <= FRAME_HEADER_LEN + s.range.len() * self.elem_size
            ) || n == 0,
            "received past the end of a frame"
        );
    }

    /// Whether the current receive's header has fully arrived but is not checked yet.
    #[inline]
    pub(crate) fn header_unchecked(&self) -> bool {
        !self.header_checked && self.recv.done >= FRAME_HEADER_LEN
    }

    /// Records that the driver found the current receive's header good.
    #[inline]
    pub(crate) fn header_checked(&mut self) {
        debug_assert!(
            self.recv.done >= FRAME_HEADER_LEN,
            "header checked before it arrived"
        );
        self.header_checked = true;
    }

    /// The current receive, when its frame is complete, its header checked and its
    /// `after_send` done: the driver applies it (runs the kernel for a reduction), then
    /// calls [`Progress::applied`].
    #[inline]
    pub(crate) fn may_apply(&self) -> Option<Apply> {
        let step = self.schedule.recvs.get(self.recv.index)?;
        let payload = self.bytes(&step.range);
        let complete = self.recv.done >= FRAME_HEADER_LEN + payload.len();
        (complete && self.header_checked && self.send_done_for(step.after_send)).then_some(Apply {
            payload,
            action: step.action,
        })
    }

    /// Records that the frame of [`Progress::may_apply`] was applied; moves on to the next
    /// receive (which may release a send waiting for this one).
    #[inline]
    pub(crate) fn applied(&mut self) {
        debug_assert!(
            self.may_apply().is_some(),
            "applied a frame that may not be"
        );
        self.recv = Cursor {
            index: self.recv.index + 1,
            done: 0,
        };
        self.header_checked = false;
    }

    /// Whether every send and every receive has completed.
    #[inline]
    pub(crate) fn is_done(&self) -> bool {
        self.send.index >= self.schedule.sends.len() && self.recv.index >= self.schedule.recvs.len()
    }

    /// What to wait for when the driver could move nothing: the peer the current send
    /// may write to and the peer the current receive may read from. [`Stuck`] when
    /// neither may move, which no amount of waiting changes. Call it only when the
    /// schedule is not done and nothing may be applied.
    pub(crate) fn blocked_on(&self) -> Result<Blocked, Stuck> {
        let blocked = Blocked {
            writable: self.next_send().map(|s| s.peer),
            readable: self.next_recv().map(|r| r.peer),
        };
        if blocked.writable.is_none() && blocked.readable.is_none() {
            return Err(Stuck);
        }
        Ok(blocked)
    }

    /// Frame bytes exchanged with `peer` so far and in the whole schedule, both
    /// directions together (for the diagnosis of a timeout; walks the whole schedule).
    pub(crate) fn exchanged_with(&self, peer: usize) -> Exchanged {
        let frame = |r: &Range<usize>| (FRAME_HEADER_LEN + r.len() * self.elem_size) as u64;
        let moved = |i: usize, cursor: Cursor, frame: u64| match i.cmp(&cursor.index) {
            std::cmp::Ordering::Less => frame,
            std::cmp::Ordering::Equal => cursor.done as u64,
            std::cmp::Ordering::Greater => 0,
        };
        let mut total = Exchanged::default();
        let sends = self.schedule.sends.iter().map(|s| (s.peer, &s.range));
        for (i, (_, range)) in sends.enumerate().filter(|(_, (p, _))| *p == peer) {
            total.expected += frame(range);
            total.moved += moved(i, self.send, frame(range));
        }
        let recvs = self.schedule.recvs.iter().map(|r| (r.peer, &r.range));
        for (i, (_, range)) in recvs.enumerate().filter(|(_, (p, _))| *p == peer) {
            total.expected += frame(range);
            total.moved += moved(i, self.recv, frame(range));
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::{RecvStep, SendStep};

    const H: usize = FRAME_HEADER_LEN;

    fn send(peer: usize, range: Range<usize>, after_recv: Option<usize>) -> SendStep {
        SendStep {
            peer,
            range,
            after_recv,
        }
    }

    fn recv(
        peer: usize,
        range: Range<usize>,
        action: RecvAction,
        after_send: Option<usize>,
    ) -> RecvStep {
        RecvStep {
            peer,
            range,
            action,
            after_send,
        }
    }

    const REDUCE: RecvAction = RecvAction::Reduce {
        last: true,
        incoming_first: false,
    };

    /// Receives the whole current frame and checks its header.
    fn receive_frame(p: &mut Progress<'_>) {
        let r = p.next_recv().expect("a receive may move");
        p.received(r.frame_len() - r.done);
        assert!(p.header_unchecked());
        p.header_checked();
    }

    #[test]
    fn an_empty_schedule_is_done_at_once() {
        let s = Schedule::default();
        let p = Progress::new(&s, 4);
        assert!(p.is_done());
        assert_eq!(p.next_send(), None);
        assert_eq!(p.next_recv(), None);
        assert_eq!(p.may_apply(), None);
    }

    #[test]
    fn partial_writes_finish_a_frame_then_move_on() {
        let s = Schedule {
            sends: vec![send(1, 2..4, None), send(2, 0..0, None)],
            recvs: vec![],
        };
        let mut p = Progress::new(&s, 4);
        let first = p.next_send().unwrap();
        assert_eq!(
            (first.index, first.peer, first.payload.clone()),
            (0, 1, 8..16)
        );
        assert_eq!(first.frame_len(), H + 8);
        p.sent(3);
        assert_eq!(p.next_send().unwrap().done, 3);
        p.sent(H + 8 - 3);
        let second = p.next_send().unwrap();
        assert_eq!((second.index, second.peer, second.done), (1, 2, 0));
        assert_eq!(second.frame_len(), H, "an empty payload is a header alone");
        assert!(!p.is_done());
        p.sent(H);
        assert!(p.is_done());
    }

    #[test]
    fn a_send_waits_until_its_receive_is_applied() {
        let s = Schedule {
            sends: vec![send(1, 0..1, Some(0))],
            recvs: vec![recv(2, 0..1, RecvAction::Store, None)],
        };
        let mut p = Progress::new(&s, 4);
        assert_eq!(p.next_send(), None);
        receive_frame(&mut p);
        assert_eq!(p.next_send(), None, "received but not applied yet");
        assert!(p.may_apply().is_some());
        p.applied();
        assert_eq!(p.next_send().unwrap().peer, 1);
    }

    #[test]
    fn a_store_does_not_start_before_its_send_but_a_reduction_does() {
        let s = Schedule {
            sends: vec![send(1, 0..2, None)],
            recvs: vec![
                recv(1, 0..2, REDUCE, Some(0)),
                recv(1, 0..2, RecvAction::Store, Some(0)),
            ],
        };
        let mut p = Progress::new(&s, 2);
        let r = p.next_recv().unwrap();
        assert_eq!((r.into, r.payload.clone()), (Destination::Scratch, 0..4));
        receive_frame(&mut p);
        assert_eq!(p.next_recv(), None, "the frame is complete");
        assert_eq!(p.may_apply(), None, "the range has not been sent yet");
        assert_eq!(
            p.blocked_on(),
            Ok(Blocked {
                writable: Some(1),
                readable: None
            })
        );
        p.sent(H + 4);
        assert_eq!(
            p.may_apply(),
            Some(Apply {
                payload: 0..4,
                action: REDUCE
            })
        );
        p.applied();
        assert_eq!(p.next_recv().unwrap().into, Destination::Buffer);
    }

    #[test]
    fn a_store_waiting_for_its_send_is_not_readable() {
        let s = Schedule {
            sends: vec![send(1, 0..1, Some(0))],
            recvs: vec![recv(1, 0..1, RecvAction::Store, Some(0))],
        };
        let p = Progress::new(&s, 1);
        assert_eq!(p.next_recv(), None);
        assert_eq!(p.blocked_on(), Err(Stuck), "each waits for the other");
    }

    #[test]
    fn a_frame_is_applied_only_after_its_header_is_checked() {
        let s = Schedule {
            sends: vec![],
            recvs: vec![recv(3, 0..1, RecvAction::Store, None)],
        };
        let mut p = Progress::new(&s, 8);
        p.received(H - 1);
        assert!(!p.header_unchecked());
        assert_eq!(p.next_recv().unwrap().done, H - 1);
        p.received(1 + 8);
        assert!(p.header_unchecked());
        assert_eq!(p.may_apply(), None);
        assert_eq!(p.next_recv(), None);
        p.header_checked();
        assert!(!p.header_unchecked());
        assert!(p.may_apply().is_some());
        p.applied();
        assert!(p.is_done());
    }

    #[test]
    fn blocked_on_names_both_directions_and_blames_the_reader() {
        let s = Schedule {
            sends: vec![send(2, 0..1, None)],
            recvs: vec![recv(1, 0..1, RecvAction::Store, None)],
        };
        let p = Progress::new(&s, 1);
        let b = p.blocked_on().unwrap();
        assert_eq!((b.writable, b.readable), (Some(2), Some(1)));
        assert_eq!(b.blamed(), 1);
        let only_send = Blocked {
            writable: Some(2),
            readable: None,
        };
        assert_eq!(only_send.blamed(), 2);
    }

    #[test]
    fn a_send_after_a_missing_receive_is_stuck() {
        let s = Schedule {
            sends: vec![send(1, 0..1, Some(0))],
            recvs: vec![],
        };
        assert_eq!(Progress::new(&s, 1).blocked_on(), Err(Stuck));
    }

    #[test]
    fn exchanged_counts_frames_per_peer_in_both_directions() {
        let s = Schedule {
            sends: vec![
                send(1, 0..2, None),
                send(2, 0..2, None),
                send(1, 2..3, None),
            ],
            recvs: vec![
                recv(1, 0..1, RecvAction::Store, None),
                recv(1, 1..3, RecvAction::Store, None),
            ],
        };
        let mut p = Progress::new(&s, 4);
        let expected = (H + 8) + (H + 4) + (H + 4) + (H + 8);
        assert_eq!(
            p.exchanged_with(1),
            Exchanged {
                moved: 0,
                expected: expected as u64
            }
        );
        p.sent(H + 8);
        p.sent(5);
        receive_frame(&mut p);
        p.applied();
        p.received(7);
        // Send 0 to peer 1 done; send 1 (peer 2, 5 bytes) is not ours; receive 0 done,
        // receive 1 has 7 bytes.
        assert_eq!(p.exchanged_with(1).moved, ((H + 8) + (H + 4) + 7) as u64);
        assert_eq!(p.exchanged_with(2).moved, 5);
        assert_eq!(p.exchanged_with(2).expected, (H + 8) as u64);
        assert_eq!(p.exchanged_with(9), Exchanged::default());
    }
}
