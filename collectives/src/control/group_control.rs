//! The state the group runner, the executor and the control thread share: what this
//! rank is doing, whether the group was aborted (by whom, why), and how to close the
//! data connections so whatever waits on them wakes.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::Activity;
use crate::transport::Closer;
use crate::{Deadline, Error, OpDesc};

/// Who aborted the group, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbortRecord {
    /// The rank that aborted (this one, or the peer whose notice arrived first).
    pub origin: usize,
    /// Its reason.
    pub reason: String,
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
    activity: Activity,
    aborted: AtomicBool,
    state: Mutex<AbortState>,
    changed: Condvar,
}

impl GroupControl {
    /// The shared state of rank `rank`'s group.
    pub fn new(rank: usize) -> Arc<GroupControl> {
        Arc::new(GroupControl {
            rank,
            activity: Activity::default(),
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
    pub fn activity(&self) -> &Activity {
        &self.activity
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
        let mut state = self.lock();
        if state.record.is_some() {
            return false;
        }
        tracing::warn!(rank = self.rank, origin, %reason, "the process group is aborted");
        state.record = Some(AbortRecord { origin, reason });
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
}
