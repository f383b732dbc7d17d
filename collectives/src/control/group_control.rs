//! The state the group runner, the executor and the control thread share: what this
//! rank is doing, whether the group was aborted (by whom, why), and how to close the
//! data connections so whatever waits on them wakes.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Probe, Snapshot};
use crate::transport::Closer;
use crate::{CollectiveKind, Deadline, Error, OpDesc};

/// Who aborted the group, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbortRecord {
    /// The rank that aborted (this one, or the peer whose notice arrived first).
    pub origin: usize,
    /// Its reason.
    pub reason: String,
    /// The rank it named as the root of its failure, when it named one.
    pub cause: Option<usize>,
}

/// What a peer last said it was doing (in a question or an answer on the control
/// connection), and what this rank was doing when it heard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PeerReport {
    theirs: Snapshot,
    /// This rank's op when the report arrived: a report counts for that call only.
    mine: Option<OpDesc>,
}

#[derive(Default)]
struct AbortState {
    record: Option<AbortRecord>,
    /// The error this rank's own abort came from, for the call it interrupts.
    local_error: Option<Error>,
    /// Wakes the control thread, which tells the peers and then closes the connections.
    link: Option<Arc<dyn Fn() + Send + Sync>>,
    closers: Vec<Arc<dyn Closer>>,
    /// This rank's ops for the control thread to fingerprint to the successor.
    outgoing: VecDeque<OpDesc>,
    /// The predecessor's fingerprints not yet checked, oldest first.
    incoming: VecDeque<(usize, OpDesc)>,
    /// What each peer last said it was doing.
    reports: BTreeMap<usize, PeerReport>,
}

/// Shared by everything that runs one rank's group. See the module documentation.
///
/// ```
/// use ringccl_collectives::control::GroupControl;
///
/// let control = GroupControl::new(1);
/// assert!(control.aborted().is_none());
/// assert!(control.abort(1, "op #3 timed out".into(), None));
/// assert!(!control.abort(2, "later news".into(), None), "the first abort wins");
/// assert_eq!(control.aborted().map(|r| r.origin), Some(1));
/// ```
pub struct GroupControl {
    rank: usize,
    probe: Probe,
    aborted: AtomicBool,
    state: Mutex<AbortState>,
    changed: Condvar,
}

impl GroupControl {
    /// The shared state of rank `rank`'s group.
    pub fn new(rank: usize) -> Arc<GroupControl> {
        Arc::new(GroupControl {
            rank,
            probe: Probe::default(),
            aborted: AtomicBool::new(false),
            state: Mutex::new(AbortState::default()),
            changed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, AbortState> {
        // Every update is one assignment: a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// What this rank is doing now.
    pub fn probe(&self) -> &Probe {
        &self.probe
    }

    /// Adds something to close when the group aborts (a transport's connections).
    pub fn add_closer(&self, closer: Arc<dyn Closer>) {
        let mut state = self.lock();
        let aborted = state.record.is_some() && state.link.is_none();
        state.closers.push(Arc::clone(&closer));
        drop(state);
        if aborted {
            closer.close();
        }
    }

    /// Connects the control thread: from now on an abort wakes it (through `wake`), and
    /// it tells the peers before it calls [`GroupControl::close_connections`].
    pub fn attach_link(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        self.lock().link = Some(wake);
    }

    /// Records that rank `origin` aborted the group for `reason` (`local_error`: the
    /// error this rank's own abort came from, returned to the call it interrupts).
    /// Returns whether this was the first abort; later ones change nothing.
    ///
    /// Then, with a control thread attached, wakes it to tell the peers and close the
    /// connections; without one, closes them at once.
    pub fn abort(&self, origin: usize, reason: String, local_error: Option<Error>) -> bool {
        let cause = local_error.as_ref().and_then(Error::likely_cause);
        self.abort_caused(origin, reason, cause, local_error)
    }

    /// [`GroupControl::abort`], naming `cause` as the rank at the root of the failure
    /// (the notice to the peers carries it).
    ///
    /// Only the rank that aborts on its own account logs a warning; a rank that stops
    /// because a peer's notice arrived logs it at `info`, so that the warning names the
    /// one rank where the failure was seen.
    ///
    /// ```
    /// use ringccl_collectives::control::GroupControl;
    ///
    /// let control = GroupControl::new(1);
    /// assert!(control.abort_caused(0, "rank 0 timed out".into(), Some(2), None));
    /// let record = control.aborted().unwrap();
    /// assert_eq!((record.origin, record.cause), (0, Some(2)));
    /// ```
    pub fn abort_caused(
        &self,
        origin: usize,
        reason: String,
        cause: Option<usize>,
        local_error: Option<Error>,
    ) -> bool {
        let mut state = self.lock();
        if state.record.is_some() {
            return false;
        }
        if origin == self.rank {
            tracing::warn!(rank = self.rank, ?cause, %reason, "this rank aborts the process group");
        } else {
            tracing::info!(rank = self.rank, origin, ?cause, %reason,
                "rank {origin} aborted the process group; this rank stops too");
        }
        state.record = Some(AbortRecord {
            origin,
            reason,
            cause,
        });
        state.local_error = local_error;
        self.aborted.store(true, Ordering::Release);
        let link = state.link.clone();
        drop(state);
        self.changed.notify_all();
        match link {
            Some(wake) => wake(),
            None => self.close_connections(),
        }
        true
    }

    /// Closes every registered transport's connections, waking whatever waits on them.
    pub fn close_connections(&self) {
        let closers = self.lock().closers.clone();
        for closer in closers {
            closer.close();
        }
    }

    /// Whether the group was aborted (one atomic load).
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Who aborted the group and why, if it was.
    pub fn aborted(&self) -> Option<AbortRecord> {
        if !self.is_aborted() {
            return None;
        }
        self.lock().record.clone()
    }

    /// Waits up to `within` for an abort to be recorded: a peer that aborts closes its
    /// connections right after its notice, so a failed connection is often the first
    /// sign of a notice on its way.
    pub fn wait_for_abort(&self, within: Duration) -> Option<AbortRecord> {
        let until = Instant::now().checked_add(within);
        let mut state = self.lock();
        loop {
            if let Some(record) = &state.record {
                return Some(record.clone());
            }
            let left = until.map_or(within, |u| u.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return None;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Sends `op` to the successor in rank order (through the control thread), for
    /// [`GroupControl::check_fingerprint`] there.
    pub fn post_fingerprint(&self, op: OpDesc) {
        let mut state = self.lock();
        state.outgoing.push_back(op);
        let link = state.link.clone();
        drop(state);
        if let Some(wake) = link {
            wake();
        }
    }

    /// The ops posted since the last call, for the control thread.
    pub fn take_fingerprints(&self) -> Vec<OpDesc> {
        self.lock().outgoing.drain(..).collect()
    }

    /// Records the predecessor's fingerprint (the control thread calls this).
    pub fn record_fingerprint(&self, from: usize, op: OpDesc) {
        self.lock().incoming.push_back((from, op));
        self.changed.notify_all();
    }

    /// Waits, until `deadline`, for the fingerprint of collective number `mine.seq` from
    /// `predecessor` (the previous rank in rank order) and compares it with `mine`: a
    /// disagreement is [`Error::CollectiveMismatch`]. In a group of one (no control
    /// thread, or this rank its own predecessor) there is nobody to compare with, and it
    /// agrees at once.
    pub fn check_fingerprint(
        &self,
        mine: &OpDesc,
        predecessor: usize,
        deadline: Deadline,
    ) -> Result<(), Error> {
        let mut state = self.lock();
        if state.link.is_none() || predecessor == self.rank {
            return Ok(());
        }
        loop {
            if let Some(verdict) = self.compare_fingerprint(&mut state, mine) {
                return verdict;
            }
            if state.record.is_some() {
                return Err(self.aborted_while_checking());
            }
            let left = deadline.remaining();
            if left.is_zero() {
                return Err(Error::Timeout {
                    rank: self.rank,
                    peer: predecessor,
                    op: *mine,
                    moved: 0,
                    expected: 0,
                    timeout: deadline.timeout(),
                    gone: Vec::new(),
                    cause: None,
                });
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// [`GroupControl::check_fingerprint`] without the wait, for a call whose check is
    /// left for later (one handed to the GPU without waiting): `Ok(false)` while the
    /// predecessor's fingerprint for `mine` has not arrived.
    ///
    /// ```
    /// use ringccl_collectives::control::GroupControl;
    /// use ringccl_collectives::{DType, OpDesc, ReduceOp};
    /// let control = GroupControl::new(0);
    /// let op = OpDesc::all_reduce(1, DType::F32, 8, ReduceOp::Sum);
    /// // No control thread: a group of one, nobody to compare with.
    /// assert!(control.try_fingerprint(&op, 0)?);
    /// # Ok::<(), ringccl_collectives::Error>(())
    /// ```
    pub fn try_fingerprint(&self, mine: &OpDesc, predecessor: usize) -> Result<bool, Error> {
        let mut state = self.lock();
        if state.link.is_none() || predecessor == self.rank {
            return Ok(true);
        }
        match self.compare_fingerprint(&mut state, mine) {
            Some(verdict) => verdict.map(|()| true),
            None if state.record.is_some() => Err(self.aborted_while_checking()),
            None => Ok(false),
        }
    }

    /// Compares the predecessor's fingerprint for `mine.seq` with `mine`, once it has
    /// arrived (older ones are dropped: their calls were checked or failed).
    fn compare_fingerprint(
        &self,
        state: &mut AbortState,
        mine: &OpDesc,
    ) -> Option<Result<(), Error>> {
        while let Some(&(peer, theirs)) = state.incoming.front() {
            if theirs.seq < mine.seq {
                state.incoming.pop_front();
                continue;
            }
            if theirs.seq > mine.seq {
                return None;
            }
            state.incoming.pop_front();
            return Some(if theirs == *mine {
                Ok(())
            } else {
                Err(Error::CollectiveMismatch {
                    rank: self.rank,
                    mine: *mine,
                    peer,
                    theirs,
                })
            });
        }
        None
    }

    fn aborted_while_checking(&self) -> Error {
        Error::GroupBroken {
            rank: self.rank,
            cause: "aborted while checking that every rank runs the same collective".into(),
        }
    }

    /// The error this rank's own abort came from, once.
    pub fn take_local_error(&self) -> Option<Error> {
        self.lock().local_error.take()
    }

    /// Keeps what `peer` said it was doing (`theirs`, from its question or its answer on
    /// the control connection) while this rank was in `mine`, for [`GroupControl::blame`].
    /// The control thread calls this for every question and answer.
    pub fn note_peer(&self, peer: usize, theirs: Snapshot, mine: Option<OpDesc>) {
        if peer != self.rank {
            self.lock()
                .reports
                .insert(peer, PeerReport { theirs, mine });
        }
    }

    /// Who is most likely to blame when this rank's `op` timed out waiting for `peer`,
    /// and why, from what the peers said during `op`: `peer` itself when it answered
    /// that it had not started `op`; the rank it was itself waiting for, followed as far
    /// as the reports go ("rank 1 was itself waiting for rank 2"). `None` when no report
    /// of this call says more than the wait itself, or when the waits close a circle.
    ///
    /// ```
    /// use ringccl_collectives::control::{GroupControl, PairCounts, Snapshot};
    /// use ringccl_collectives::{wire::Algorithm, DType, OpDesc, ReduceOp};
    ///
    /// let op = OpDesc::all_reduce(3, DType::F32, 1024, ReduceOp::Sum);
    /// let control = GroupControl::new(1);
    /// // Rank 0 answered, during op #3, that it was in op #3 waiting for rank 2.
    /// let waiting = Snapshot {
    ///     current: Some((op, Algorithm::Ring)),
    ///     blocked_on: Some(2),
    ///     ..Snapshot::default()
    /// };
    /// control.note_peer(0, waiting, Some(op));
    /// let (cause, why) = control.blame(&op, 0).unwrap();
    /// assert_eq!(cause, 2);
    /// assert_eq!(why, "rank 0 was itself waiting for rank 2");
    /// ```
    pub fn blame(&self, op: &OpDesc, peer: usize) -> Option<(usize, String)> {
        let reports = self.lock().reports.clone();
        // The same call: its number and kind (the rest of the description is the same
        // call's, or a mismatch the sentinel names on its own).
        let of_this_call = |rank: usize| {
            reports
                .get(&rank)
                .filter(|r| r.mine.is_some_and(|m| m.seq == op.seq && m.kind == op.kind))
        };
        let mut path = vec![peer];
        let mut end = None;
        // Every step visits a new rank, so the walk ends within the group's size.
        while let Some(report) = path.last().and_then(|&at| of_this_call(at)) {
            let at = path[path.len() - 1];
            let theirs = &report.theirs;
            match theirs.current {
                None => {
                    let started = theirs.counts.map(|c| c.collectives);
                    end = Some(match started {
                        Some(n) if op.kind != CollectiveKind::SendRecv && n < op.seq => {
                            format!("had not started op #{} when asked", op.seq)
                        }
                        _ => "was in no call when asked".to_string(),
                    });
                    break;
                }
                Some(_) => match theirs.blocked_on {
                    // Waits that close a circle (back to this rank or a rank on the way)
                    // have no single cause.
                    Some(next) if next == self.rank || path.contains(&next) => return None,
                    Some(next) if next != at => path.push(next),
                    _ => break,
                },
            }
        }
        let cause = *path.last()?;
        let mut why = String::new();
        for pair in path.windows(2) {
            if why.is_empty() {
                why = format!("rank {} was itself waiting for rank {}", pair[0], pair[1]);
            } else {
                why.push_str(&format!(", which was waiting for rank {}", pair[1]));
            }
        }
        match (end, why.is_empty()) {
            (None, true) => None,
            (None, false) => Some((cause, why)),
            (Some(end), true) => Some((cause, format!("it {end}"))),
            (Some(end), false) => Some((cause, format!("{why}, which {end}"))),
        }
    }
}

impl fmt::Debug for GroupControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupControl")
            .field("rank", &self.rank)
            .field("aborted", &self.aborted())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// A group of one with a control thread attached (the NCCL backend starts one at
    /// every world size) is its own predecessor: it must not wait for itself. It did,
    /// until the deadline, on the first real GPU (issue 17).
    #[test]
    fn a_group_of_one_does_not_wait_for_its_own_fingerprint() {
        let control = GroupControl::new(0);
        control.attach_link(Arc::new(|| {}));
        let op = OpDesc::all_reduce(1, DType::F32, 1000, crate::ReduceOp::Sum);
        control.post_fingerprint(op);
        let started = Instant::now();
        let deadline = Deadline::after(Duration::from_secs(5));
        control.check_fingerprint(&op, 0, deadline).unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        // Two ranks: rank 1 does wait for rank 0's, and times out without it.
        let control = GroupControl::new(1);
        control.attach_link(Arc::new(|| {}));
        let short = Deadline::after(Duration::from_millis(50));
        let err = control.check_fingerprint(&op, 0, short).unwrap_err();
        assert!(matches!(err, Error::Timeout { peer: 0, .. }), "{err:?}");
    }

    /// The check left for later (a call handed to the GPU without a wait) answers at
    /// once: not yet, agreed, or the mismatch; fingerprints of earlier calls that were
    /// never looked at are passed over.
    #[test]
    fn a_fingerprint_can_be_compared_without_waiting() {
        let control = GroupControl::new(1);
        control.attach_link(Arc::new(|| {}));
        let op = |seq| OpDesc::all_reduce(seq, DType::F32, 1000, crate::ReduceOp::Sum);
        assert!(
            !control.try_fingerprint(&op(2), 0).unwrap(),
            "not arrived yet"
        );
        control.record_fingerprint(0, op(1));
        control.record_fingerprint(0, op(2));
        assert!(
            control.try_fingerprint(&op(2), 0).unwrap(),
            "op 1's is passed over"
        );
        let theirs = OpDesc::all_reduce(3, DType::F32, 1000, crate::ReduceOp::Max);
        control.record_fingerprint(0, theirs);
        match control.try_fingerprint(&op(3), 0) {
            Err(Error::CollectiveMismatch { peer: 0, mine, .. }) => assert_eq!(mine, op(3)),
            other => panic!("a mismatch: {other:?}"),
        }
        control.abort(1, "test".into(), None);
        assert!(matches!(
            control.try_fingerprint(&op(4), 0),
            Err(Error::GroupBroken { .. })
        ));
    }

    /// The blame of a timeout follows what the peers said during the call: to the rank
    /// at the end of a chain of waits, to a rank that had not started the call; reports
    /// of another call name nobody, nor do circles of waits (through this rank or not).
    #[test]
    fn a_timeout_is_blamed_on_the_rank_at_the_end_of_the_waits() {
        use super::super::PairCounts;
        use crate::wire::Algorithm;
        let op = |seq| OpDesc::all_reduce(seq, DType::F32, 1000, crate::ReduceOp::Sum);
        let waiting = |seq, on| Snapshot {
            current: Some((op(seq), Algorithm::Ring)),
            blocked_on: Some(on),
            ..Snapshot::default()
        };
        let idle = |collectives| Snapshot {
            counts: Some(PairCounts {
                peer: 1,
                collectives,
                sent: 0,
                received: 0,
            }),
            ..Snapshot::default()
        };
        let control = GroupControl::new(1);
        assert_eq!(control.blame(&op(3), 0), None, "nothing reported");
        // Reports of an earlier call say nothing about this one.
        control.note_peer(0, waiting(2, 2), Some(op(2)));
        assert_eq!(control.blame(&op(3), 0), None);
        control.note_peer(0, waiting(3, 2), Some(op(3)));
        assert_eq!(
            control.blame(&op(3), 0),
            Some((2, "rank 0 was itself waiting for rank 2".into()))
        );
        control.note_peer(2, waiting(3, 4), Some(op(3)));
        control.note_peer(4, idle(2), Some(op(3)));
        assert_eq!(
            control.blame(&op(3), 0),
            Some((
                4,
                "rank 0 was itself waiting for rank 2, which was waiting for rank 4, which \
                 had not started op #3 when asked"
                    .into()
            ))
        );
        assert_eq!(
            control.blame(&op(3), 4),
            Some((4, "it had not started op #3 when asked".into()))
        );
        // Rank 4 waits for rank 0 again: a circle, with no single cause.
        control.note_peer(4, waiting(3, 0), Some(op(3)));
        assert_eq!(control.blame(&op(3), 0), None);
        // A peer waiting for this rank: a circle through this rank.
        let control = GroupControl::new(1);
        control.note_peer(0, waiting(3, 1), Some(op(3)));
        assert_eq!(control.blame(&op(3), 0), None);
        // A peer in no call, past this one: in no call, not behind.
        control.note_peer(0, idle(5), Some(op(3)));
        assert_eq!(
            control.blame(&op(3), 0),
            Some((0, "it was in no call when asked".into()))
        );
    }

    /// Only the first abort counts, and it keeps the cause it named.
    #[test]
    fn an_abort_keeps_the_cause_it_names() {
        let control = GroupControl::new(1);
        assert!(control.abort_caused(0, "rank 0 timed out".into(), Some(2), None));
        assert!(!control.abort_caused(1, "rank 1 timed out".into(), Some(0), None));
        let record = control.aborted().unwrap();
        assert_eq!((record.origin, record.cause), (0, Some(2)));
    }

    /// The levels of the events logged on this thread while `body` runs.
    fn levels_logged(body: impl FnOnce()) -> Vec<tracing::Level> {
        use std::sync::atomic::{AtomicU64, Ordering};
        struct Levels(Mutex<Vec<tracing::Level>>, AtomicU64);
        impl tracing::Subscriber for Levels {
            fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
                tracing::span::Id::from_u64(self.1.fetch_add(1, Ordering::Relaxed) + 1)
            }
            fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
            fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
            fn event(&self, event: &tracing::Event<'_>) {
                self.0.lock().unwrap().push(*event.metadata().level());
            }
            fn enter(&self, _: &tracing::span::Id) {}
            fn exit(&self, _: &tracing::span::Id) {}
        }
        let levels = Arc::new(Levels(Mutex::new(Vec::new()), AtomicU64::new(0)));
        tracing::subscriber::with_default(Arc::clone(&levels), body);
        let logged = levels.0.lock().unwrap().clone();
        logged
    }

    /// Only the rank that aborts on its own account warns; a rank that stops because a
    /// peer's notice came says so at `info`.
    #[test]
    fn only_the_rank_that_aborts_on_its_own_account_warns() {
        let aborting = GroupControl::new(0);
        let logged = levels_logged(|| {
            aborting.abort_caused(0, "op #3 timed out".into(), Some(2), None);
        });
        assert_eq!(logged, [tracing::Level::WARN]);
        let told = GroupControl::new(1);
        let logged = levels_logged(|| {
            told.abort_caused(0, "op #3 timed out".into(), Some(2), None);
        });
        assert_eq!(logged, [tracing::Level::INFO]);
    }
}
