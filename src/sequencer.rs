//! Issue order: every operation of a process group, synchronous or asynchronous, runs in
//! the order it was issued, because every rank must run the same operations in the same
//! order. A call waits for its turn only until its own deadline, and calls from two
//! threads at once are refused rather than left to pair up differently on other ranks.
//!
//! This is the group's one ordering mechanism: the runner below it only excludes. Nor
//! does the sequencer keep a broken state of its own: a refusal that breaks the group
//! aborts it through the backend, into the group's [`GroupControl`], whose abort record
//! the runner then refuses every later call by.

use std::collections::VecDeque;
use std::fmt::Display;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, Thread};
use std::time::Instant;

use ringccl_collectives::control::GroupControl;
use ringccl_collectives::{Backend, Deadline};
use ringccl_observe::flight::FlightRecorder;

use crate::Error;

/// One issued operation that has not finished.
#[derive(Debug)]
struct Pending {
    /// Its name, for messages (`"all_reduce"`).
    op: &'static str,
    /// It holds the turn: it is running.
    started: bool,
    /// Its caller gave up while it was queued: it is passed over when its turn comes.
    abandoned: bool,
    /// Its number in the group's flight recorder (0 without one).
    call: u64,
}

#[derive(Debug, Default)]
struct State {
    /// The ticket of `pending[0]`; every lower ticket has finished or was passed over.
    now_serving: u64,
    /// Every issued operation that has not finished, in ticket order.
    pending: VecDeque<Pending>,
    /// The thread that issued the pending operations (only ever one at a time).
    issuer: Option<Thread>,
    /// Threads waiting for a turn; passing the turn on wakes them only if there are any.
    waiting: usize,
}

impl State {
    fn next_ticket(&self) -> u64 {
        self.now_serving + self.pending.len() as u64
    }

    /// Retires the operation at the front and passes over any abandoned ones behind it.
    fn advance(&mut self) {
        self.pending.pop_front();
        self.now_serving += 1;
        while self.pending.front().is_some_and(|p| p.abandoned) {
            self.pending.pop_front();
            self.now_serving += 1;
        }
    }
}

/// A call the sequencer refused, and the cause to abort the group with when refusing it
/// broke the group ([`Refusal::settle`] aborts it, outside the sequencer's lock).
#[derive(Debug)]
#[must_use = "a refusal that breaks the group must be settled"]
pub(crate) struct Refusal {
    /// Boxed: refusals are rare, and the `Result`s that carry them stay small.
    pub(crate) error: Box<Error>,
    pub(crate) abort: Option<String>,
}

impl Refusal {
    /// Turns the refusal into its error, first aborting the group when the refusal broke
    /// it (the peers are told; a call running on this rank is woken).
    pub(crate) fn settle(self, backend: &dyn Backend) -> Error {
        if let Some(cause) = &self.abort {
            // The control plane logs the abort once (WARN on this rank's own account).
            tracing::debug!(rank = backend.rank(), %cause, "aborting the process group");
            backend.abort(cause);
        }
        *self.error
    }
}

/// A ticket lock with deadlines: `issue` hands out tickets in order, `turn` waits for a
/// ticket's turn until the call's deadline.
#[derive(Debug)]
pub(crate) struct Sequencer {
    rank: usize,
    /// The group's control state: its abort record says whether this rank broke the
    /// group while a call ran.
    control: Arc<GroupControl>,
    /// Where every call's issue, turn and abandonment are recorded.
    flight: Option<Arc<FlightRecorder>>,
    state: Mutex<State>,
    turn_changed: Condvar,
    /// Calls from a thread other than the one with calls pending are queued behind them
    /// (gloo's rule) instead of refused.
    any_thread: AtomicBool,
}

/// Holding this means it is this ticket's turn; [`Turn::finish`] (or dropping it) passes
/// the turn on.
#[derive(Debug)]
pub(crate) struct Turn<'a> {
    sequencer: &'a Sequencer,
    passed: bool,
}

/// When a call with `deadline` was issued: the deadline was fixed then, `timeout` ahead
/// (now, for a deadline too far away to subtract from).
fn issued_at(deadline: Deadline) -> Instant {
    deadline
        .at()
        .checked_sub(deadline.timeout())
        .unwrap_or_else(Instant::now)
}

/// `thread "name" (ThreadId(7))`, or `an unnamed thread (ThreadId(7))`.
fn describe(thread: &Thread) -> String {
    match thread.name() {
        Some(name) => format!("thread {name:?} ({:?})", thread.id()),
        None => format!("an unnamed thread ({:?})", thread.id()),
    }
}

impl Sequencer {
    /// The issue order of the group `control` belongs to, recorded in `flight`.
    pub(crate) fn new(
        control: Arc<GroupControl>,
        flight: Option<Arc<FlightRecorder>>,
    ) -> Sequencer {
        Sequencer {
            rank: control.rank(),
            control,
            flight,
            state: Mutex::default(),
            turn_changed: Condvar::new(),
            any_thread: AtomicBool::new(false),
        }
    }

    /// From now on, orders calls from any thread by issue instead of refusing a call
    /// made while another thread's calls are pending.
    pub(crate) fn accept_any_thread(&self) {
        self.any_thread.store(true, Ordering::Relaxed);
    }

    /// The names of the operations issued but not finished, in issue order.
    pub(crate) fn pending(&self) -> Vec<&'static str> {
        self.lock()
            .pending
            .iter()
            .filter(|p| !p.abandoned)
            .map(|p| p.op)
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update of the state is complete before the lock is released (nothing in
        // between can panic): a poisoned lock still holds consistent values.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the call numbered `call` in the flight recorder will never run.
    fn gave_up(&self, call: u64, error: &dyn Display) {
        if let Some(flight) = &self.flight {
            flight.gave_up(call, error);
        }
    }

    fn broken_error(&self, cause: &str) -> Error {
        Error::GroupBroken {
            rank: self.rank,
            cause: cause.to_string(),
        }
    }

    /// Takes a ticket for `op` issued by the calling thread at `issued_at`, or refuses it
    /// when another thread's calls are still pending (which breaks the group). A call on
    /// a group already broken takes its ticket too: the runner refuses it in its turn,
    /// as the call it would have been.
    fn take_ticket(
        &self,
        state: &mut State,
        op: &'static str,
        issued_at: Instant,
    ) -> Result<u64, Refusal> {
        let me = thread::current();
        match (&state.issuer, state.pending.back()) {
            (Some(issuer), Some(last))
                if issuer.id() != me.id() && !self.any_thread.load(Ordering::Relaxed) =>
            {
                let error = Error::ConcurrentUse {
                    rank: self.rank,
                    op,
                    thread: describe(&me),
                    pending: format!("{} (call #{})", last.op, state.next_ticket()),
                    other_thread: describe(issuer),
                };
                let cause = error.to_string();
                return Err(Refusal {
                    error: Box::new(error),
                    abort: Some(cause),
                });
            }
            (Some(issuer), _) if issuer.id() == me.id() => {}
            _ => state.issuer = Some(me),
        }
        let ticket = state.next_ticket();
        let call = self
            .flight
            .as_ref()
            .map_or(0, |flight| flight.issued_at(op, issued_at));
        state.pending.push_back(Pending {
            op,
            started: false,
            abandoned: false,
            call,
        });
        Ok(ticket)
    }

    /// Takes the next ticket for `op`, whose deadline is `deadline`, and, while no other
    /// ticket can be taken, calls `enqueue` with it (so tickets reach the worker's queue
    /// in ticket order).
    pub(crate) fn issue<R>(
        &self,
        op: &'static str,
        deadline: Deadline,
        enqueue: impl FnOnce(u64) -> R,
    ) -> Result<R, Refusal> {
        let mut state = self.lock();
        let ticket = self.take_ticket(&mut state, op, issued_at(deadline))?;
        Ok(enqueue(ticket))
    }

    /// Issues `op` and waits for its turn until `deadline` (a blocking call).
    pub(crate) fn issue_and_wait(
        &self,
        op: &'static str,
        deadline: Deadline,
    ) -> Result<Turn<'_>, Refusal> {
        let mut state = self.lock();
        let ticket = self.take_ticket(&mut state, op, issued_at(deadline))?;
        self.wait_for(state, ticket, deadline, true)
    }

    /// Waits until every earlier ticket has finished, or until `deadline`: a call still
    /// queued then is abandoned (passed over when its turn comes) and breaks the group.
    pub(crate) fn turn(&self, ticket: u64, deadline: Deadline) -> Result<Turn<'_>, Refusal> {
        self.wait_for(self.lock(), ticket, deadline, false)
    }

    /// `just_issued`: the call was issued under this same lock, so if its turn comes at
    /// once, it starts at the moment it was issued.
    fn wait_for<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        ticket: u64,
        deadline: Deadline,
        just_issued: bool,
    ) -> Result<Turn<'a>, Refusal> {
        let mut waited = !just_issued;
        loop {
            let Some(index) = ticket
                .checked_sub(state.now_serving)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| state.pending.get(i).is_some_and(|p| !p.abandoned))
            else {
                // Given up by its `Work`, which already reported why.
                let cause = self
                    .control
                    .aborted()
                    .map_or_else(|| "the call was abandoned".to_string(), |r| r.reason);
                return Err(Refusal {
                    error: Box::new(self.broken_error(&cause)),
                    abort: None,
                });
            };
            if index == 0 {
                state.pending[0].started = true;
                if let Some(flight) = &self.flight {
                    flight.turn(state.pending[0].call, waited);
                }
                return Ok(Turn {
                    sequencer: self,
                    passed: false,
                });
            }
            if deadline.has_passed() {
                return Err(self.abandon(&mut state, index, ticket, deadline));
            }
            state.waiting += 1;
            let (guard, _) = self
                .turn_changed
                .wait_timeout(state, deadline.remaining())
                .unwrap_or_else(|p| p.into_inner());
            state = guard;
            state.waiting -= 1;
            waited = true;
        }
    }

    /// Gives up the queued call at `index` (ticket `ticket`) whose deadline passed: it
    /// will be passed over, and the group is broken since the peers may run it (an
    /// earlier abort stands: the first cause wins).
    fn abandon(&self, state: &mut State, index: usize, ticket: u64, deadline: Deadline) -> Refusal {
        let front = &state.pending[0];
        let behind = if front.started {
            format!(
                "{} (call #{}), which is still running",
                front.op,
                state.now_serving + 1
            )
        } else {
            format!(
                "earlier calls that have not finished (the next one: {}, call #{})",
                front.op,
                state.now_serving + 1
            )
        };
        let error = Error::QueueTimeout {
            rank: self.rank,
            op: state.pending[index].op,
            call: ticket + 1,
            timeout: deadline.timeout(),
            behind,
        };
        state.pending[index].abandoned = true;
        self.gave_up(state.pending[index].call, &error);
        let abort = Some(error.to_string());
        Refusal {
            error: Box::new(error),
            abort,
        }
    }

    /// At the deadline of an asynchronous call: gives it up if it is still queued
    /// (breaking the group); `None` if it is running or done, when its own result comes.
    pub(crate) fn give_up(&self, ticket: u64, deadline: Deadline) -> Option<Refusal> {
        let mut state = self.lock();
        let index = usize::try_from(ticket.checked_sub(state.now_serving)?).ok()?;
        let pending = state.pending.get(index)?;
        if pending.started || pending.abandoned {
            return None;
        }
        let refusal = self.abandon(&mut state, index, ticket, deadline);
        if index == 0 {
            state.advance();
            self.notify(&state);
        }
        Some(refusal)
    }

    /// Passes over a ticket that will never run (its job could not be queued).
    pub(crate) fn skip(&self, ticket: u64) {
        let mut state = self.lock();
        let Some(index) = ticket
            .checked_sub(state.now_serving)
            .and_then(|i| usize::try_from(i).ok())
        else {
            return;
        };
        if let Some(pending) = state.pending.get_mut(index) {
            pending.abandoned = true;
            let call = pending.call;
            self.gave_up(
                call,
                &"never queued: the group's background worker has stopped",
            );
            if index == 0 {
                state.advance();
                self.notify(&state);
            }
        }
    }

    fn notify(&self, state: &State) {
        if state.waiting > 0 {
            self.turn_changed.notify_all();
        }
    }

    /// Retires the running call; `Err` if this rank has aborted the group (a call
    /// refused or given up meanwhile, or the call itself).
    fn pass_on(&self) -> Result<(), Error> {
        let mut state = self.lock();
        state.advance();
        self.notify(&state);
        drop(state);
        match self.control.aborted() {
            Some(record) if record.origin == self.rank => Err(self.broken_error(&record.reason)),
            _ => Ok(()),
        }
    }
}

impl Turn<'_> {
    /// Passes the turn on. `Err` if this rank aborted the group while the call ran (a
    /// call queued behind it timed out, or another thread issued a call): then its
    /// result cannot be trusted to match the peers' and must not be reported as a success.
    pub(crate) fn finish(mut self) -> Result<(), Error> {
        self.passed = true;
        self.sequencer.pass_on()
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.passed {
            let _ = self.sequencer.pass_on();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    const LONG: Duration = Duration::from_secs(60);

    fn sequencer(rank: usize) -> Sequencer {
        Sequencer::new(GroupControl::new(rank), None)
    }

    /// What [`Refusal::settle`] does through a runner's `Backend::abort`: the abort goes
    /// into the group's control state.
    fn settle(seq: &Sequencer, refusal: Refusal) -> Error {
        if let Some(cause) = refusal.abort {
            seq.control.abort(seq.rank, cause, None);
        }
        *refusal.error
    }

    #[test]
    fn turns_follow_ticket_order_across_threads() {
        let seq = Arc::new(sequencer(0));
        let log = Arc::new(Mutex::new(Vec::new()));
        let tickets: Vec<u64> = (0..8)
            .map(|_| seq.issue("op", Deadline::after(LONG), |t| t).unwrap())
            .collect();
        let handles: Vec<_> = tickets
            .into_iter()
            .rev()
            .map(|t| {
                let (seq, log) = (Arc::clone(&seq), Arc::clone(&log));
                std::thread::spawn(move || {
                    let turn = seq.turn(t, Deadline::after(LONG)).unwrap();
                    log.lock().unwrap().push(t);
                    turn.finish().unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert_eq!(*log.lock().unwrap(), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn a_queued_call_gives_up_at_its_deadline_and_is_passed_over() {
        let seq = sequencer(3);
        let running = seq
            .issue_and_wait("all_reduce", Deadline::after(LONG))
            .unwrap();
        let queued = seq.issue("barrier", Deadline::after(LONG), |t| t).unwrap();
        let later = seq
            .issue("broadcast", Deadline::after(LONG), |t| t)
            .unwrap();
        let started = Instant::now();
        let refusal = seq
            .turn(queued, Deadline::after(Duration::from_millis(50)))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(10));
        let text = refusal.error.to_string();
        assert!(
            matches!(
                *refusal.error,
                Error::QueueTimeout {
                    rank: 3,
                    call: 2,
                    ..
                }
            ),
            "{text}"
        );
        assert!(
            text.contains("all_reduce (call #1), which is still running"),
            "{text}"
        );
        assert_eq!(refusal.abort.as_deref(), Some(text.as_str()));
        settle(&seq, refusal);
        // The running call's success is not reported: the group was aborted meanwhile.
        assert!(matches!(running.finish(), Err(Error::GroupBroken { .. })));
        // The abandoned ticket is skipped; the later one gets its turn, and the group's
        // one abort record (which the runner refuses it by) names the queue timeout.
        let turn = seq.turn(later, Deadline::after(LONG)).unwrap();
        let record = seq.control.aborted().unwrap();
        assert_eq!(record.origin, 3);
        assert_eq!(record.reason, text);
        assert!(matches!(turn.finish(), Err(Error::GroupBroken { cause, .. }) if cause == text));
    }

    #[test]
    fn a_second_thread_issuing_while_calls_are_pending_is_refused_by_name() {
        let seq = Arc::new(sequencer(1));
        let turn = seq
            .issue_and_wait("all_reduce", Deadline::after(LONG))
            .unwrap();
        let other = Arc::clone(&seq);
        let refusal = std::thread::Builder::new()
            .name("loader".into())
            .spawn(move || {
                other
                    .issue("broadcast", Deadline::after(LONG), |t| t)
                    .unwrap_err()
            })
            .unwrap()
            .join()
            .unwrap();
        let text = refusal.error.to_string();
        assert!(
            matches!(*refusal.error, Error::ConcurrentUse { rank: 1, .. }),
            "{text}"
        );
        for needle in [
            "thread \"loader\"",
            "broadcast",
            "all_reduce (call #1)",
            "own process group",
        ] {
            assert!(text.contains(needle), "{needle}: {text}");
        }
        assert!(refusal.abort.is_some());
        settle(&seq, refusal);
        assert!(
            turn.finish().is_err(),
            "the pending call's result is not trusted"
        );
    }

    #[test]
    fn threads_taking_turns_one_after_the_other_are_fine() {
        let seq = Arc::new(sequencer(0));
        for _ in 0..3 {
            let seq = Arc::clone(&seq);
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let turn = seq
                        .issue_and_wait("barrier", Deadline::after(LONG))
                        .unwrap();
                    turn.finish().unwrap();
                }
            })
            .join()
            .unwrap();
        }
        assert_eq!(
            seq.issue("barrier", Deadline::after(LONG), |t| t).unwrap(),
            30
        );
    }

    #[test]
    fn giving_up_an_async_call_at_the_front_lets_the_next_one_run() {
        let seq = sequencer(0);
        let first = seq
            .issue("all_reduce", Deadline::after(LONG), |t| t)
            .unwrap();
        let second = seq.issue("barrier", Deadline::after(LONG), |t| t).unwrap();
        let refusal = seq.give_up(first, Deadline::after(Duration::ZERO)).unwrap();
        assert!(matches!(
            *refusal.error,
            Error::QueueTimeout { call: 1, .. }
        ));
        settle(&seq, refusal);
        assert!(seq.turn(first, Deadline::after(LONG)).is_err());
        // The next call's turn comes at once (the runner refuses it, the group being
        // aborted), and a call that has its turn is no longer given up.
        let started = Instant::now();
        let turn = seq.turn(second, Deadline::after(LONG)).unwrap();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(seq
            .give_up(second, Deadline::after(Duration::ZERO))
            .is_none());
        assert!(turn.finish().is_err());
    }

    #[test]
    fn a_peer_abort_does_not_fail_a_call_that_succeeded() {
        let seq = sequencer(0);
        let turn = seq
            .issue_and_wait("barrier", Deadline::after(LONG))
            .unwrap();
        seq.control.abort(1, "rank 1 timed out".into(), None);
        assert!(turn.finish().is_ok());
    }
}
