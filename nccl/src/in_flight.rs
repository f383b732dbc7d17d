//! Calls handed to the GPU that no caller waits for. A stream-ordered call returns as soon
//! as NCCL has it on its stream; the engine then watches it here, as PyTorch's watchdog
//! does, except that each call keeps the deadline it was issued with and an overdue one
//! is named. A call is settled when its completion event has fired and, in a group, the
//! predecessor's fingerprint has agreed with it.
//!
//! A state machine in quinn's manner: it holds no stream and reads no clock. The engine
//! hands it `now` and two questions (has this call's event fired? has the predecessor's
//! fingerprint for this op arrived and agreed?) and acts on the answer.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use ringccl_collectives::{Deadline, OpDesc};

/// How often calls in flight are looked at while none is due sooner: short beside any
/// useful deadline, long beside the cost of a look (an event query and a lock).
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(10);

/// One call in flight.
#[derive(Debug)]
struct Enqueued<C> {
    op: OpDesc,
    deadline: Deadline,
    /// What tells whether the GPU has finished it (a CUDA event).
    completion: C,
    finished: bool,
    /// Whether the predecessor's fingerprint is still to be compared with `op`.
    unconfirmed: bool,
}

/// What the calls in flight need next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watch {
    /// None is left.
    Idle,
    /// Look again by then.
    Again(Instant),
    /// `op`'s deadline has passed; `stage` says what it still waited for.
    Overdue {
        op: OpDesc,
        deadline: Deadline,
        stage: Stage,
    },
}

/// What an overdue call still waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// The GPU had not finished it.
    Running,
    /// The GPU had, but the predecessor's fingerprint never came.
    Unconfirmed,
}

/// The calls in flight, oldest first (the order they were enqueued on the one stream).
#[derive(Debug)]
pub(crate) struct InFlight<C> {
    calls: VecDeque<Enqueued<C>>,
}

impl<C> Default for InFlight<C> {
    fn default() -> Self {
        InFlight {
            calls: VecDeque::new(),
        }
    }
}

impl<C> InFlight<C> {
    /// Adds a call just enqueued, due by `deadline`; `confirm`: its fingerprint is to be
    /// compared with the predecessor's.
    pub(crate) fn push(&mut self, op: OpDesc, deadline: Deadline, completion: C, confirm: bool) {
        self.calls.push_back(Enqueued {
            op,
            deadline,
            completion,
            finished: false,
            unconfirmed: confirm,
        });
    }

    pub(crate) fn len(&self) -> usize {
        self.calls.len()
    }

    /// The completions of the calls in flight, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &C> {
        self.calls.iter().map(|c| &c.completion)
    }

    /// The oldest call in flight.
    pub(crate) fn oldest(&self) -> Option<(OpDesc, Deadline, &C)> {
        self.calls
            .front()
            .map(|c| (c.op, c.deadline, &c.completion))
    }

    /// Hands the settled calls at the front to `settled`, oldest first, and forgets them.
    /// Completions and fingerprints both come in order, so a settled call behind an
    /// unsettled one is left for a later look, and each look costs only what it settles.
    fn forget_settled(&mut self, mut settled: impl FnMut(C)) {
        while self
            .calls
            .front()
            .is_some_and(|c| c.finished && !c.unconfirmed)
        {
            if let Some(call) = self.calls.pop_front() {
                settled(call.completion);
            }
        }
    }

    /// Looks at every call at `now`: asks `finished` about each whose completion is
    /// unknown, oldest first, stopping at the first that has not (a stream finishes in
    /// order); asks `agreed` about each unconfirmed fingerprint, oldest first, stopping
    /// at the first that has not arrived (fingerprints arrive in order). Settled calls
    /// go to `settled` and are forgotten. Errors of the two questions end the look and
    /// are returned.
    pub(crate) fn poll<E>(
        &mut self,
        now: Instant,
        mut finished: impl FnMut(&C) -> Result<bool, E>,
        mut agreed: impl FnMut(&OpDesc) -> Result<bool, E>,
        settled: impl FnMut(C),
    ) -> Result<Watch, E> {
        for call in self.calls.iter_mut().filter(|c| c.unconfirmed) {
            if !agreed(&call.op)? {
                break;
            }
            call.unconfirmed = false;
        }
        for call in self.calls.iter_mut().filter(|c| !c.finished) {
            if !finished(&call.completion)? {
                break;
            }
            call.finished = true;
        }
        self.forget_settled(settled);
        if let Some(late) = self.calls.iter().find(|c| c.deadline.at() <= now) {
            return Ok(Watch::Overdue {
                op: late.op,
                deadline: late.deadline,
                stage: if late.finished {
                    Stage::Unconfirmed
                } else {
                    Stage::Running
                },
            });
        }
        Ok(match self.calls.iter().map(|c| c.deadline.at()).min() {
            None => Watch::Idle,
            Some(due) => Watch::Again(due.min(now + WATCH_EVERY)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringccl_collectives::{DType, ReduceOp};
    use std::cell::Cell;

    fn op(seq: u64) -> OpDesc {
        OpDesc::all_reduce(seq, DType::F32, 1024, ReduceOp::Sum)
    }

    /// A completion the test flips by hand: the GPU, in memory.
    type Flag = std::rc::Rc<Cell<bool>>;

    fn flag() -> Flag {
        Flag::default()
    }

    fn never_agreed(_: &OpDesc) -> Result<bool, ()> {
        Ok(false)
    }

    fn fired(f: &Flag) -> Result<bool, ()> {
        Ok(f.get())
    }

    fn ignore(_: Flag) {}

    #[test]
    fn calls_are_settled_in_stream_order_and_then_forgotten() {
        let mut calls = InFlight::default();
        let (a, b) = (flag(), flag());
        let deadline = Deadline::after(Duration::from_secs(60));
        calls.push(op(1), deadline, a.clone(), false);
        calls.push(op(2), deadline, b.clone(), false);
        let now = Instant::now();
        // The second event alone cannot have fired first on one stream: it is not asked.
        b.set(true);
        let mut asked = Vec::new();
        let watch = calls
            .poll(
                now,
                |f: &Flag| {
                    asked.push(f.get());
                    Ok::<_, ()>(f.get())
                },
                never_agreed,
                ignore,
            )
            .unwrap();
        assert_eq!(asked, vec![false], "stops at the first unfinished call");
        assert_eq!(watch, Watch::Again(now + WATCH_EVERY));
        assert_eq!(calls.len(), 2);
        a.set(true);
        let mut settled = Vec::new();
        let watch = calls.poll(now, fired, never_agreed, |f: Flag| settled.push(f));
        assert_eq!(watch.unwrap(), Watch::Idle);
        assert_eq!(calls.len(), 0);
        assert!(
            settled.len() == 2 && std::rc::Rc::ptr_eq(&settled[0], &a),
            "oldest first"
        );
    }

    #[test]
    fn a_call_past_its_deadline_is_named_with_what_it_waited_for() {
        let mut calls = InFlight::default();
        let (a, b) = (flag(), flag());
        calls.push(op(7), Deadline::after(Duration::from_secs(1)), a, false);
        calls.push(op(8), Deadline::after(Duration::from_secs(9)), b, false);
        let early = Instant::now();
        match calls.poll(early, fired, never_agreed, ignore).unwrap() {
            Watch::Again(at) => assert!(at <= early + WATCH_EVERY),
            other => panic!("nothing is due yet: {other:?}"),
        }
        let later = Instant::now() + Duration::from_secs(2);
        match calls.poll(later, fired, never_agreed, ignore).unwrap() {
            Watch::Overdue {
                op,
                stage,
                deadline,
            } => {
                assert_eq!(op.seq, 7, "the overdue call, not the newest");
                assert_eq!(stage, Stage::Running);
                assert_eq!(deadline.timeout(), Duration::from_secs(1));
            }
            other => panic!("op 7 is overdue: {other:?}"),
        }
    }

    #[test]
    fn the_next_look_comes_no_later_than_the_first_deadline() {
        let mut calls = InFlight::default();
        let deadline = Deadline::after(Duration::from_millis(3));
        calls.push(op(1), deadline, flag(), false);
        let now = Instant::now();
        match calls.poll(now, fired, never_agreed, ignore).unwrap() {
            Watch::Again(at) => assert!(at <= deadline.at(), "looks again at the deadline"),
            Watch::Overdue { .. } => {} // a slow machine got there first
            Watch::Idle => panic!("a call is in flight"),
        }
    }

    #[test]
    fn a_finished_call_waits_for_its_fingerprint_and_fails_without_it() {
        let mut calls = InFlight::default();
        let done = flag();
        done.set(true);
        calls.push(op(3), Deadline::after(Duration::from_secs(1)), done, true);
        let now = Instant::now();
        assert!(matches!(
            calls.poll(now, fired, never_agreed, ignore).unwrap(),
            Watch::Again(_)
        ));
        assert_eq!(
            calls.len(),
            1,
            "kept until the predecessor's fingerprint agrees"
        );
        let late = now + Duration::from_secs(2);
        assert!(matches!(
            calls.poll(late, fired, never_agreed, ignore).unwrap(),
            Watch::Overdue {
                stage: Stage::Unconfirmed,
                ..
            }
        ));
        let agreed = |_: &OpDesc| Ok::<_, ()>(true);
        assert_eq!(calls.poll(now, fired, agreed, ignore).unwrap(), Watch::Idle);
    }

    #[test]
    fn fingerprints_are_compared_oldest_first_and_errors_end_the_look() {
        let mut calls = InFlight::default();
        let deadline = Deadline::after(Duration::from_secs(60));
        calls.push(op(1), deadline, flag(), true);
        calls.push(op(2), deadline, flag(), true);
        let mut compared = Vec::new();
        let unfinished = |_: &Flag| Ok::<_, &str>(false);
        let agreed = |op: &OpDesc| {
            compared.push(op.seq);
            if op.seq == 2 {
                Err("mismatch at 2")
            } else {
                Ok(true)
            }
        };
        let watch = calls.poll(Instant::now(), unfinished, agreed, ignore);
        assert_eq!(watch, Err("mismatch at 2"));
        assert_eq!(compared, vec![1, 2]);
    }
}
