//! The group runner: the one place that numbers calls, checks their arguments, reacts
//! to the group's abort and diagnoses failures, for every backend.

use std::any::Any;
use std::borrow::Cow;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::{Engine, Request};
use crate::control::{AbortRecord, GroupControl};
use crate::hooks::{Broke, CallHooks, Deferred, NoHooks};
use crate::{Backend, BufferMut, BufferRef, Cause, Error, OpDesc, ReduceOp};
use crate::{Deadline, Sequence};

/// After a peer failure, how long to wait for other failing connections to show, so the
/// error can name the rank really at fault when this one was only blocked behind
/// another. Device engines also use it to tell a peer that exited from one that is
/// merely finishing.
pub const PEER_FAILURE_GRACE: Duration = Duration::from_secs(2);

/// After a connection fails, how long to wait for an abort notice that may explain it: a
/// rank that aborts sends its notice on the control connection, then closes its data
/// connections, and the two may arrive in either order.
pub const ABORT_NOTICE_GRACE: Duration = Duration::from_millis(500);

struct RunState<E> {
    engine: E,
    /// The group's collective counter.
    seq: u64,
    /// Point-to-point message counters, per peer, for each direction.
    sent_to: Vec<u64>,
    received_from: Vec<u64>,
    /// The engine was released and the hooks told after the group was aborted (whether
    /// it was, by whom and why, is the [`GroupControl`]'s to say).
    released: bool,
}

impl<E> RunState<E> {
    /// The counter that numbers calls in `sequence`, if it names a rank of the group.
    fn counter(&mut self, sequence: Sequence) -> Option<&mut u64> {
        match sequence {
            Sequence::Collective => Some(&mut self.seq),
            Sequence::SentTo(peer) => self.sent_to.get_mut(peer),
            Sequence::ReceivedFrom(peer) => self.received_from.get_mut(peer),
        }
    }
}

/// A [`Backend`] made of an [`Engine`] and the rules every backend shares: calls run one
/// at a time in issue order, each numbered (collectives by one counter, point-to-point
/// messages per direction of each pair), each checked with the same message for the same
/// misuse, each bounded by the deadline it was issued with. An error that leaves the
/// connections in an unknown state breaks the group: the engine is aborted and every
/// later call fails at once with [`Error::GroupBroken`].
///
/// The runner excludes: one call at a time holds the engine, and calls are numbered in
/// the order they enter. It does not order calls issued from several threads; issue
/// order is the caller's (the facade's sequencer hands out turns). Whether the group is
/// broken is not the runner's to store either: it is [`GroupControl`]'s abort record,
/// which the sequencer, the control thread and the runner all read.
///
/// Breaking the group also *aborts* it through the group's [`GroupControl`]: with a
/// control link attached ([`GroupRunner::keep_control_link`]) every peer is told why and
/// fails within about a second with [`Error::GroupAborted`], instead of waiting for its
/// own deadline.
pub struct GroupRunner<E> {
    name: Cow<'static, str>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
    control: Arc<GroupControl>,
    state: Mutex<RunState<E>>,
    /// The control thread's handle, dropped with the group (it then says goodbye).
    control_link: Option<Box<dyn Any + Send + Sync>>,
    /// Whoever watches the group (its flight recorder, its timeline).
    hooks: Arc<dyn CallHooks>,
}

impl<E: Engine> GroupRunner<E> {
    /// Wraps `engine`, rank `rank` of `world_size`, whose calls default to `timeout`.
    pub fn with_engine(
        name: impl Into<Cow<'static, str>>,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        mut engine: E,
    ) -> GroupRunner<E> {
        let control = GroupControl::new(rank);
        control.probe().size_for(world_size);
        engine.attach(&control);
        GroupRunner {
            name: name.into(),
            rank,
            world_size,
            timeout,
            control,
            control_link: None,
            hooks: Arc::new(NoHooks),
            state: Mutex::new(RunState {
                engine,
                seq: 0,
                sent_to: vec![0; world_size],
                received_from: vec![0; world_size],
                released: false,
            }),
        }
    }

    /// The state this group's runner, engine and control thread share.
    pub fn control(&self) -> &Arc<GroupControl> {
        &self.control
    }

    /// Attaches `hooks`, which the runner and its engine then tell what the group
    /// does (replacing any attached before); call it before the group runs anything.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::time::Duration;
    /// use ringccl_collectives::hooks::CallHooks;
    /// use ringccl_collectives::{Backend, Deadline, HostBackend, HostConfig, Sequence};
    /// # use ringccl_collectives::{MemoryConfig, MemoryTransport};
    ///
    /// /// Counts the calls that start.
    /// #[derive(Debug, Default)]
    /// struct Started(AtomicU64);
    ///
    /// impl CallHooks for Started {
    ///     fn started(&self, _: Sequence, _: u64) {
    ///         self.0.fetch_add(1, Ordering::Relaxed);
    ///     }
    /// }
    ///
    /// # let transport = MemoryTransport::mesh(1, MemoryConfig::default()).remove(0);
    /// // `transport`: any connected `HostTransport`.
    /// let mut backend = HostBackend::new("gloo", transport, HostConfig::default());
    /// let started = Arc::new(Started::default());
    /// backend.attach_hooks(started.clone());
    /// backend.barrier(Deadline::after(Duration::from_secs(5)))?;
    /// assert_eq!(started.0.load(Ordering::Relaxed), 1);
    /// # Ok::<(), ringccl_collectives::Error>(())
    /// ```
    pub fn attach_hooks(&mut self, hooks: Arc<dyn CallHooks>) {
        hooks.attached(&self.control);
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        state.engine.attach_hooks(&hooks);
        self.hooks = hooks;
    }

    /// Keeps the control thread's handle for the life of the group.
    pub fn keep_control_link(&mut self, link: Box<dyn Any + Send + Sync>) {
        self.control_link = Some(link);
    }

    fn lock(&self) -> Result<MutexGuard<'_, RunState<E>>, Error> {
        self.state.lock().map_err(|_| Error::GroupBroken {
            rank: self.rank,
            cause: "a thread panicked while running a collective on this group".into(),
        })
    }

    /// Runs one call: takes its number from `sequence`'s counter and hands it, with the
    /// engine, to `body`. The escape hatch for calls that are not a [`Request`] (an
    /// engine's own buffer types, such as device memory); everything else goes through
    /// [`Backend`]'s methods.
    pub fn run<R>(
        &self,
        sequence: Sequence,
        deadline: Deadline,
        body: impl FnOnce(&mut E, u64) -> Result<R, Error>,
    ) -> Result<R, Error> {
        self.run_described(sequence, None, deadline, body)
    }

    /// Runs `body` on the engine between calls, without a number: an engine's watch over
    /// work it handed to its device without waiting (NCCL's stream-ordered calls). A
    /// broken or aborted group refuses, as for a call; an error is diagnosed and breaks
    /// the group as a call's would (a peer's abort is returned as that abort), and is
    /// returned.
    pub fn tend<R>(&self, body: impl FnOnce(&mut E) -> Result<R, Error>) -> Result<R, Error> {
        let mut state = self.lock()?;
        if let Some(record) = self.control.aborted() {
            let error = self.refusal(&state, record);
            let deferred = self.break_group(&mut state, &error);
            drop(state);
            after_unlock(deferred);
            return Err(error);
        }
        let result = body(&mut state.engine)
            .map_err(|e| self.diagnose(&mut state, e, Deadline::after(PEER_FAILURE_GRACE)));
        let deferred = match &result {
            Err(e) if e.breaks_group() => self.break_group(&mut state, e),
            _ => None,
        };
        drop(state);
        after_unlock(deferred);
        result
    }

    /// [`GroupRunner::tend`] for a background thread that has nobody to give an error
    /// to: an error that breaks the group aborts it at once (the engine is released,
    /// the peers are told) and is kept for this rank's next call, which returns it.
    /// Once the group is aborted, by this rank or a peer, the engine is released at
    /// once too, so that nothing on the device waits on the dead group until a next
    /// call comes (which returns the abort). Returns `body`'s value, or `None` when the
    /// group is broken or aborted.
    pub fn tend_unattended<R>(&self, body: impl FnOnce(&mut E) -> Result<R, Error>) -> Option<R> {
        let mut state = self.state.lock().ok()?;
        if self.control.is_aborted() {
            state.engine.abort();
            return None;
        }
        match body(&mut state.engine) {
            Ok(value) => Some(value),
            Err(error) if error.breaks_group() => {
                state.engine.abort();
                let deferred = self.hooks.broke(Broke::By(&error));
                let cause = error.likely_cause();
                self.control
                    .abort_caused(self.rank, error.to_string(), cause, Some(error));
                drop(state);
                after_unlock(deferred);
                None
            }
            Err(_) if self.control.is_aborted() => {
                state.engine.abort();
                None
            }
            Err(error) => {
                tracing::warn!(rank = self.rank, %error, "{}: watching work in flight", self.name);
                None
            }
        }
    }

    /// [`GroupRunner::run`] for a call described by `op` (its `seq` aside): a call
    /// refused because the group was aborted is recorded as the op it would have been.
    fn run_described<R>(
        &self,
        sequence: Sequence,
        op: Option<OpDesc>,
        deadline: Deadline,
        body: impl FnOnce(&mut E, u64) -> Result<R, Error>,
    ) -> Result<R, Error> {
        let mut state = self
            .lock()
            .inspect_err(|e| self.hooks.refused(sequence, None, e))?;
        if let Some(record) = self.control.aborted() {
            let error = self.refusal(&state, record);
            // The hooks see this rank as the break found it; the call is refused after,
            // as the op it would have been.
            let deferred = self.break_group(&mut state, &error);
            match state.counter(sequence).map(|counter| *counter + 1) {
                Some(seq) => {
                    let op = op.map(|op| OpDesc { seq, ..op });
                    self.hooks.refused(sequence, Some((seq, op)), &error);
                }
                None => self.hooks.refused(sequence, None, &error),
            }
            drop(state);
            after_unlock(deferred);
            return Err(error);
        }
        let Some(counter) = state.counter(sequence) else {
            let error = Error::InvalidArgument(format!(
                "rank {}: {sequence:?} names no rank of a group of {}",
                self.rank, self.world_size
            ));
            self.hooks.refused(sequence, None, &error);
            return Err(error);
        };
        *counter += 1;
        let seq = *counter;
        self.control.probe().numbered(sequence, seq);
        self.hooks.started(sequence, seq);
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| body(&mut state.engine, seq)));
        let result = match outcome {
            Ok(result) => result,
            Err(payload) => {
                let what = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "no message".into());
                let error = Error::GroupBroken {
                    rank: self.rank,
                    cause: format!("a panic inside call #{seq} ({sequence:?}): {what}"),
                };
                let deferred = self.break_group(&mut state, &error);
                self.hooks.finished(Some(&error));
                drop(state);
                after_unlock(deferred);
                panic::resume_unwind(payload);
            }
        };
        let result = result.map_err(|e| self.diagnose(&mut state, e, deadline));
        let deferred = match &result {
            Err(e) if e.breaks_group() => self.break_group(&mut state, e),
            _ => None,
        };
        self.hooks.finished(result.as_ref().err());
        drop(state);
        after_unlock(deferred);
        result
    }

    /// Aborts the group for `error` (the peers are told, unless the abort came from one
    /// of them; an earlier abort stands), releases the engine, and tells the hooks while
    /// the failed call still shows as running; once. Returns what the hooks left for
    /// the caller to do once it has released the group's lock.
    fn break_group(&self, state: &mut RunState<E>, error: &Error) -> Option<Deferred> {
        if state.released {
            return None;
        }
        let cause = match error {
            Error::GroupBroken { cause, .. } => cause.clone(),
            other => other.to_string(),
        };
        state.released = true;
        state.engine.abort();
        self.control
            .abort_caused(self.rank, cause, error.likely_cause(), None);
        self.hooks.broke(Broke::By(error))
    }

    /// The error a call gets once the group has been aborted: the first one after the
    /// abort gets the abort itself ([`Error::GroupAborted`] for a peer's, this rank's
    /// own error for its own); once this rank has reacted, every later one gets
    /// [`Error::GroupBroken`] quoting it.
    fn refusal(&self, state: &RunState<E>, record: AbortRecord) -> Error {
        if !state.released {
            return self.abort_error(record);
        }
        let cause = if record.origin == self.rank {
            record.reason
        } else {
            self.abort_error(record).to_string()
        };
        Error::GroupBroken {
            rank: self.rank,
            cause,
        }
    }

    /// The error the abort `record` stands for on this rank.
    fn abort_error(&self, record: AbortRecord) -> Error {
        if record.origin != self.rank {
            return Error::GroupAborted {
                rank: self.rank,
                by: record.origin,
                reason: record.reason,
                cause: record.cause.map(|rank| Box::new(Cause::rank(rank))),
            };
        }
        self.control
            .take_local_error()
            .unwrap_or(Error::GroupBroken {
                rank: self.rank,
                cause: record.reason,
            })
    }

    /// Runs a [`Request`]: checks it, numbers it, executes it.
    fn submit(&self, request: Request<'_>, deadline: Deadline) -> Result<(), Error> {
        request
            .validate(self.rank, self.world_size)
            .inspect_err(|e| self.hooks.refused(request.sequence(), None, e))?;
        // Described once: the number is the runner's to give.
        let described = request.describe(0);
        self.run_described(
            request.sequence(),
            Some(described),
            deadline,
            |engine, seq| {
                let op = OpDesc { seq, ..described };
                if !tracing::enabled!(tracing::Level::DEBUG) {
                    return engine.execute(&op, request, deadline);
                }
                let started = std::time::Instant::now();
                let result = engine.execute(&op, request, deadline);
                tracing::debug!(
                    rank = self.rank,
                    op = %op,
                    took = ?started.elapsed(),
                    ok = result.is_ok(),
                    "{} call done",
                    self.name
                );
                result
            },
        )
    }

    /// Says who is to blame for `error`. A timeout names the rank at the root of it when
    /// the peers' reports show one ([`GroupControl::blame`]). Then, for a timeout or a
    /// lost peer, it names every other rank whose connection is gone: when this rank was
    /// only blocked behind a healthy peer, that is where the failure really is. A rank
    /// whose connections closed because it aborted (its notice arrives within
    /// [`ABORT_NOTICE_GRACE`] of the closure) is not one: it only reacted, and the cause
    /// its notice names is taken instead, so that every survivor names the same rank.
    fn diagnose(&self, state: &mut RunState<E>, mut error: Error, deadline: Deadline) -> Error {
        // A failed connection may be a peer's abort on its way (or this rank's own,
        // which closed the connections under the call): then its reason is the error.
        let record = match error {
            Error::PeerLost { .. } | Error::Io { .. } => self
                .control
                .wait_for_abort(ABORT_NOTICE_GRACE.min(deadline.remaining())),
            // This rank saw the real cause itself: report it, whatever arrived meanwhile.
            Error::CollectiveMismatch { .. } | Error::Protocol { .. } => None,
            _ => self.control.aborted(),
        };
        if let Some(record) = record {
            return self.abort_error(record);
        }
        if let Error::Timeout {
            peer,
            op,
            cause: cause @ None,
            ..
        } = &mut error
        {
            *cause = self
                .control
                .blame(op, *peer)
                .map(|(rank, why)| Box::new(Cause::rank(rank).because(why)));
        }
        let named = match &error {
            Error::Timeout { peer, .. } => *peer,
            Error::PeerLost { rank, .. } => *rank,
            _ => return error,
        };
        // Other failures may be seconds behind (a cut link is noticed by keepalive):
        // give them a moment to show. A closed connection may be a peer's abort whose
        // notice is still on its way: give that a moment too.
        let until = Instant::now() + PEER_FAILURE_GRACE.min(deadline.timeout());
        let mut closed_at = None;
        loop {
            if let Some(record) = self.control.aborted() {
                // This rank's own abort, or the lost peer's notice (it aborted, and its
                // connections closed after): the abort is the error. Any other notice
                // came after this rank's own failure, seen first-hand (a timeout, or a
                // peer lost before): a consequence, which only tells who reacted.
                let lost_to_its_abort =
                    matches!(error, Error::PeerLost { .. }) && record.origin == named;
                if record.origin == self.rank || lost_to_its_abort {
                    return self.abort_error(record);
                }
                return heard_of(error, &record);
            }
            let others: Vec<usize> = state
                .engine
                .failed_peers()
                .into_iter()
                .filter(|&p| p != named && p != self.rank)
                .collect();
            let now = Instant::now();
            if others.is_empty() {
                if now >= until {
                    return error;
                }
            } else if now >= *closed_at.get_or_insert(now) + ABORT_NOTICE_GRACE {
                if let Error::Timeout { gone, .. } | Error::PeerLost { gone, .. } = &mut error {
                    for rank in others {
                        if !gone.contains(&rank) {
                            gone.push(rank);
                        }
                    }
                }
                return error;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs what the hooks left for after the group's lock is released.
fn after_unlock(deferred: Option<Deferred>) {
    if let Some(deferred) = deferred {
        deferred();
    }
}

/// This rank's timeout or lost peer `error`, once the abort notice `record` of another
/// rank has arrived: the ranks whose connections closed aborted in reaction (they are no
/// root cause, and no longer listed as gone). For a timeout, when this rank knew no
/// cause, or blamed the rank that aborted, the notice's cause is taken (unless it names
/// this rank, which was waiting itself).
fn heard_of(mut error: Error, record: &AbortRecord) -> Error {
    if let Error::PeerLost { gone, .. } = &mut error {
        gone.clear();
    }
    if let Error::Timeout {
        rank, gone, cause, ..
    } = &mut error
    {
        gone.clear();
        let origin = record.origin;
        let mine = cause.as_ref().map(|c| c.rank);
        let Some(named) = record.cause.filter(|named| named != rank) else {
            if mine == Some(origin) {
                *cause = None;
            }
            return error;
        };
        match cause.as_deref_mut() {
            Some(mine) if mine.rank == named && !mine.evidence.is_empty() => {
                mine.evidence.push_str(&format!(
                    ", and rank {origin} named it too when it aborted the group"
                ));
            }
            // What this rank saw points elsewhere, and not at the rank that aborted.
            Some(mine) if mine.rank != named && mine.rank != origin => {}
            _ => {
                *cause = Some(Box::new(
                    Cause::rank(named)
                        .because(format!("rank {origin} named it when it aborted the group")),
                ));
            }
        }
    }
    error
}

impl<E: Engine> Backend for GroupRunner<E> {
    fn name(&self) -> &str {
        &self.name
    }

    fn abort(&self, cause: &str) {
        self.control.abort(self.rank, cause.to_string(), None);
        after_unlock(self.hooks.broke(Broke::Aborted(cause)));
    }

    fn control(&self) -> Option<&Arc<GroupControl>> {
        Some(&self.control)
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn all_reduce(
        &self,
        buf: BufferMut<'_>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::AllReduce { buf, op }, deadline)
    }

    fn broadcast(&self, buf: BufferMut<'_>, root: usize, deadline: Deadline) -> Result<(), Error> {
        self.submit(Request::Broadcast { buf, root }, deadline)
    }

    fn barrier(&self, deadline: Deadline) -> Result<(), Error> {
        self.submit(Request::Barrier, deadline)
    }

    fn reduce(
        &self,
        buf: BufferMut<'_>,
        op: ReduceOp,
        root: usize,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::Reduce { buf, op, root }, deadline)
    }

    fn all_gather(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::AllGather { input, output }, deadline)
    }

    fn reduce_scatter(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        op: ReduceOp,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::ReduceScatter { input, output, op }, deadline)
    }

    fn all_to_all(
        &self,
        input: BufferRef<'_>,
        output: BufferMut<'_>,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(Request::AllToAll { input, output }, deadline)
    }

    fn send(
        &self,
        buf: BufferRef<'_>,
        dst: usize,
        tag: u32,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(
            Request::Send {
                buf,
                peer: dst,
                tag,
            },
            deadline,
        )
    }

    fn recv(
        &self,
        buf: BufferMut<'_>,
        src: usize,
        tag: u32,
        deadline: Deadline,
    ) -> Result<(), Error> {
        self.submit(
            Request::Recv {
                buf,
                peer: src,
                tag,
            },
            deadline,
        )
    }
}

impl<E: fmt::Debug> fmt::Debug for GroupRunner<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("GroupRunner");
        s.field("name", &self.name)
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("timeout", &self.timeout);
        match self.state.try_lock() {
            Ok(state) => s.field("engine", &state.engine),
            Err(_) => s.field("engine", &"<running a call>"),
        };
        s.finish_non_exhaustive()
    }
}

#[cfg(test)]
mod blame_tests {
    use super::*;
    use crate::{DType, OpDesc};

    fn timed_out(cause: Option<usize>, evidence: &str, gone: Vec<usize>) -> Error {
        let cause = cause.map(|rank| Box::new(Cause::rank(rank).because(evidence)));
        Error::Timeout {
            rank: 1,
            peer: 0,
            op: OpDesc::all_reduce(3, DType::F32, 8, ReduceOp::Sum),
            moved: 0,
            expected: 0,
            timeout: Duration::from_secs(3),
            gone,
            cause,
        }
    }

    fn notice(origin: usize, cause: Option<usize>) -> AbortRecord {
        AbortRecord {
            origin,
            reason: format!("rank {origin} timed out"),
            cause,
        }
    }

    fn blame(error: &Error) -> (Option<usize>, String, Vec<usize>) {
        match error {
            Error::Timeout { cause, gone, .. } => (
                cause.as_ref().map(|c| c.rank),
                cause
                    .as_ref()
                    .map(|c| c.evidence.clone())
                    .unwrap_or_default(),
                gone.clone(),
            ),
            other => panic!("{other:?}"),
        }
    }

    /// Rank 1 timed out waiting for rank 0; rank 0's notice names rank 2. Rank 0 only
    /// aborted: it is never listed as gone, and never the cause; rank 2 is.
    #[test]
    fn an_abort_notice_explains_closed_connections_and_names_the_cause() {
        // This rank knew nothing more: the notice's cause is taken.
        let (cause, why, gone) =
            blame(&heard_of(timed_out(None, "", vec![0]), &notice(0, Some(2))));
        assert_eq!((cause, gone), (Some(2), vec![]));
        assert_eq!(why, "rank 0 named it when it aborted the group");
        // It found the same cause: the notice adds to the evidence.
        let mine = "rank 0 was itself waiting for rank 2";
        let (cause, why, _) = blame(&heard_of(
            timed_out(Some(2), mine, vec![]),
            &notice(0, Some(2)),
        ));
        assert_eq!(cause, Some(2));
        assert_eq!(
            why,
            "rank 0 was itself waiting for rank 2, and rank 0 named it too when it aborted the group"
        );
        // It blamed the rank that aborted: the notice knows better.
        let (cause, _, _) = blame(&heard_of(
            timed_out(Some(0), "x", vec![]),
            &notice(0, Some(2)),
        ));
        assert_eq!(cause, Some(2));
        // A notice with no cause clears a blame of its sender, and keeps another.
        let (cause, why, _) = blame(&heard_of(timed_out(Some(0), "x", vec![]), &notice(0, None)));
        assert_eq!((cause, why.as_str()), (None, ""));
        let (cause, _, _) = blame(&heard_of(timed_out(Some(3), "x", vec![]), &notice(0, None)));
        assert_eq!(cause, Some(3));
        // A notice naming this rank (itself waiting) is not taken.
        let (cause, _, _) = blame(&heard_of(timed_out(None, "", vec![]), &notice(0, Some(1))));
        assert_eq!(cause, None);
    }
}
